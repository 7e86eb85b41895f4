"""The yearly router (templm/evaluation/routing.py): which expert each year gets, and on a SeqIO task each example
gets exactly its expert's output, with the metrics any model gets."""

import functools

import jax
import pytest

from templm.data.task_data import TaskDataConfig
from templm.data.world import WorldConfig
from templm.evaluation.inference import ModelFns
from templm.evaluation.routing import YearRouter, evaluate_router, make_year_router
from templm.evaluation.task_eval import evaluate_model, with_params
from templm.metrics import qa
from templm.models import t5
from templm.training.checkpoints import Checkpointer

CFG = t5.T5Config(vocab_size=400, emb_dim=32, num_heads=2, head_dim=16, mlp_dim=64, num_encoder_layers=1,
                  num_decoder_layers=1, relative_attention_num_buckets=8, relative_attention_max_distance=16)
LENGTHS = {"inputs": 32, "targets": 8}


def test_router_picks_its_year_the_closest_and_clamps_out_of_range_years():
    router = YearRouter({2016: "b", 2014: "a", 2019: "c"})
    assert router.years == [2014, 2016, 2019]
    assert [router.route(y) for y in (2014, 2016, 2019)] == [2014, 2016, 2019]
    assert router.route(2017) == 2016  # closest
    assert router.route(2018) == 2019  # closest
    assert router.route(2015) == 2016  # a tie goes to the later (more recent) expert
    assert router.route(2003) == 2014 and router.route(2013) == 2014  # before the first: the first
    assert router.route(2020) == 2019 and router.route(2050) == 2019  # past the last: the last
    assert YearRouter({2015: "x"}).route(1990) == 2015
    assert make_year_router(experts={"2015": "x"}).route(2020) == 2015  # gin gives keys as written
    with pytest.raises(ValueError, match="at least one expert"):
        YearRouter({})


@pytest.fixture(scope="module")
def model():
    return t5.EncoderDecoderModel(CFG)


# --------------------------------------------------------------------------------------------------------------------
# The router on a SeqIO task: each example gets exactly its expert's output, metrics as for any model.


@pytest.fixture(scope="module")
def task_data(task_data_for):
    return task_data_for("routing", TaskDataConfig(world=WorldConfig(seed=1, start_year=2014, end_year=2017,
                                                                     subjects_per_relation=4, docs_per_month=2),
                                                   vocab_size=290, future_years=1))


def test_router_evaluation_routes_each_example_to_its_expert(model, task_data, tmp_path):
    init = jax.jit(functools.partial(model.init, input_len=LENGTHS["inputs"], target_len=LENGTHS["targets"]))
    experts = {2014: init(jax.random.PRNGKey(1)), 2016: init(jax.random.PRNGKey(2))}
    saver = Checkpointer(str(tmp_path / "expert_2014" / "checkpoints"), save_period=0)
    saver.save(1, {"params": experts[2014]}, {"step": 1})
    saver.close()
    fns = ModelFns(model, None, batch_size=8, max_decode_length=LENGTHS["targets"])
    router = YearRouter({2014: str(tmp_path / "expert_2014"), 2016: experts[2016]})  # a path is loaded on use
    routed = evaluate_router(router, fns, "templama_uniform", LENGTHS, split="test")
    alone = {year: evaluate_model(with_params(fns, p), "templama_uniform", LENGTHS, split="test")
             for year, p in experts.items()}
    years = {ex["year"] for ex in routed.examples}
    assert years == {2014, 2015, 2016, 2017}
    by_id = {year: {ex["id"]: ex for ex in e.examples} for year, e in alone.items()}
    want_expert = {2014: 2014, 2015: 2016, 2016: 2016, 2017: 2016}
    for ex in routed.examples:
        assert ex["expert"] == want_expert[ex["year"]]
        own = by_id[ex["expert"]][ex["id"]]
        assert ex["prediction"] == own["prediction"]
        assert ex["score"] == pytest.approx(own["score"], abs=1e-4)
    expected = qa.qa_scores([ex["prediction"] for ex in routed.examples], [ex["answers"] for ex in routed.examples],
                            [ex["year"] for ex in routed.examples], [2014, 2015, 2016], [2017])
    for key in ("f1", "em", "count", "seen_f1", "future_f1", "f1_2015", "count_2017"):
        assert routed.metrics[key] == pytest.approx(expected[key])
    assert "ppl" in routed.metrics and "ppl_2017" in routed.metrics
