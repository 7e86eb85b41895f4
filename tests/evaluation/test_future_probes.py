"""Future probes (templm/evaluation/future_probes.py): scores, the degradation into the future and the calibration
entropy on a fixed tiny T5, against an independent computation. Compiled functions are shared through module-scoped
fixtures (one small model, one scorer)."""

import functools
import math

import jax
import numpy as np
import pytest

from templm.data.records import Answer, Query
from templm.errors import DataError
from templm.evaluation.future_probes import (TextScorer, future_as_of, future_calibration, future_degradation,
                                             read_calibration, year_input)
from templm.metrics import qa
from templm.models import t5

CFG = t5.T5Config(vocab_size=400, emb_dim=32, num_heads=2, head_dim=16, mlp_dim=64, num_encoder_layers=1,
                  num_decoder_layers=1, relative_attention_num_buckets=8, relative_attention_max_distance=16)
LENGTHS = {"inputs": 32, "targets": 8}


def q(subject, year, *answers, relation="P54", text="<subject> plays for _X_."):
    return Query(id=f"{subject}_{relation}_{year}", relation=relation, subject_id=subject, year=year,
                 query=text.replace("<subject>", subject), answers=tuple(Answer(a, a) for a in answers))


@pytest.fixture(scope="module")
def model():
    return t5.EncoderDecoderModel(CFG)


@pytest.fixture(scope="module")
def params(model):
    return jax.jit(functools.partial(model.init, input_len=LENGTHS["inputs"],
                                     target_len=LENGTHS["targets"]))(jax.random.PRNGKey(0))


@pytest.fixture(scope="module")
def scorer(model):
    import seqio

    return TextScorer(model, seqio.ByteVocabulary(extra_ids=0), LENGTHS, batch_size=4)


@pytest.fixture(scope="module")
def reference(model, params, scorer):
    """log p(target | input) by hand: the unpadded ids, one forward pass, a float64 log-softmax, a sum."""
    forward = jax.jit(lambda p, enc, dec: model.module.apply({"params": p}, enc, dec))

    @functools.lru_cache(maxsize=None)
    def loglik(inputs: str, target: str) -> float:
        vocab = scorer.vocabulary
        enc = np.array([list(vocab.encode(inputs))[:LENGTHS["inputs"] - 1] + [1]], np.int32)
        tgt = list(vocab.encode(target))[:LENGTHS["targets"] - 1] + [1]
        dec = np.array([[0] + tgt[:-1]], np.int32)
        logits = np.asarray(forward(params, enc, dec), np.float64)[0]
        logp = logits - logits.max(-1, keepdims=True)
        logp = logp - np.log(np.exp(logp).sum(-1, keepdims=True))
        return float(sum(logp[i, t] for i, t in enumerate(tgt)))

    return loglik


def test_text_scorer_matches_an_independent_log_likelihood(params, scorer, reference):
    inputs = ["year: 2016 Kolus Fatar plays for <extra_id_0>.", "In 2019, Ratu attended <extra_id_0>.",
              "a much longer input " * 5]
    targets = ["Kula United", "University of Podipis", "x"]
    got = scorer.score(params, inputs, targets)  # 3 rows in a batch of 4: padding rows are dropped
    np.testing.assert_allclose(got, [reference(i, t) for i, t in zip(inputs, targets)], rtol=1e-4, atol=1e-4)
    batch = scorer.encode(inputs[:1], targets[:1])
    assert batch["decoder_input_tokens"][0, 0] == 0
    np.testing.assert_array_equal(batch["decoder_input_tokens"][0, 1:], batch["decoder_target_tokens"][0, :-1])
    np.testing.assert_array_equal(batch["decoder_loss_weights"], batch["decoder_target_tokens"] > 0)
    assert year_input("temporal", 2019, "X plays for _X_.") == "year: 2019 X plays for <extra_id_0>."
    assert year_input("uniform", 2019, "X plays for _X_.") == "In 2019, X plays for <extra_id_0>."


def test_degradation_glue_against_hand_computed_changes(params, scorer, reference):
    text = "<subject> plays for _X_."
    # Answers are set to what the model predicts at the reference year, so those queries count as answered.
    ref = 2016
    predicted = scorer.predict(params, [year_input("temporal", ref, text.replace("<subject>", s))
                                        for s in ("Ana", "Bo")])
    # Ana's answer changes only after the reference year: the model saw one answer, so Ana is single-answer.
    queries = [q("Ana", 2014, predicted[0]), q("Ana", 2015, predicted[0]), q("Ana", 2016, predicted[0]),
               q("Ana", 2017, "A Later Club"), q("Bo", 2015, "Someone Else"), q("Bo", 2016, predicted[1]),
               q("Cy", 2016, "Never Predicted Answer")]
    out = future_degradation(scorer, params, "temporal", queries, ref, max_gap=2)
    assert out["queries"] == 3 and out["answered"] == 2 and out["gaps"] == [1, 2]

    def delta(subject, answer, gap):
        base = reference(year_input("temporal", ref, f"{subject} plays for _X_."), answer)
        return reference(year_input("temporal", ref + gap, f"{subject} plays for _X_."), answer) - base

    groups = out["groups"]
    assert groups["single"]["count"] == 1 and groups["multiple"]["count"] == 1
    for gap in (1, 2):
        assert groups["single"]["mean"][gap] == pytest.approx(delta("Ana", predicted[0], gap), abs=2e-4)
        assert groups["multiple"]["mean"][gap] == pytest.approx(delta("Bo", predicted[1], gap), abs=2e-4)


def test_as_of_asks_the_future_queries_with_the_last_seen_year(params, scorer):
    text = "<subject> plays for _X_."
    then = scorer.predict(params, [year_input("temporal", 2016, text.replace("<subject>", s)) for s in ("Ana", "Bo")])
    own = scorer.predict(params, [year_input("temporal", 2018, text.replace("<subject>", "Bo"))])
    # Ana's 2017 answer is what the model says as of 2016: F1 100 as of 2016; Bo's 2018 answer is another club.
    queries = [q("Ana", 2016, "Kept"), q("Ana", 2017, then[0]), q("Bo", 2018, "A Later Club")]
    out = future_as_of(scorer, params, queries, 2016)
    assert out["as_of"] == 2016 and out["id"] == ["Ana_P54_2017", "Bo_P54_2018"] and out["year"] == [2017, 2018]
    assert out["prediction_as_of"] == then and out["f1_as_of"][0] == 100.0
    assert out["f1_as_of"][1] == 100.0 * qa.token_f1(then[1], ["A Later Club"])
    assert out["f1_own_year"][1] == 100.0 * qa.token_f1(own[0], ["A Later Club"])


def test_calibration_glue_against_hand_computed_entropy(params, scorer, reference, tmp_path):
    path = tmp_path / "calibration.jsonl"
    path.write_text(
        '{"id": "E1_host_city_2014", "relation": "host_city", "query": "The Foo Games is hosted by _X_.", '
        '"change_class": "frequent", "candidates": ["Aa", "Bbb", "Cc"]}\n'
        '{"id": "E1_host_city_2015", "relation": "host_city", "query": "The Foo Games is hosted by _X_.", '
        '"change_class": "frequent", "candidates": ["Aa", "Bbb", "Cc"]}\n'
        '{"id": "L1_located_in_2014", "relation": "located_in", "query": "Bar Tower is located in _X_.", '
        '"change_class": "never", "candidates": ["Aa", "Dd"]}\n')
    calibration = read_calibration(str(path))
    assert len(calibration) == 2  # one per subject and relation
    out = future_calibration(scorer, params, "uniform", calibration, [2019, 2020])
    assert out["count"] == {"frequent": 1, "never": 1}
    for row in calibration:
        for year in (2019, 2020):
            scores = [reference(year_input("uniform", year, row["query"]), c) for c in row["candidates"]]
            p = np.exp(np.array(scores) - max(scores))
            p /= p.sum()
            h = float(-(p * np.log(p)).sum())
            assert out["entropy"][row["change_class"]][year] == pytest.approx(h, abs=1e-4)
            assert out["normalized_entropy"][row["change_class"]][year] == pytest.approx(
                h / math.log(len(p)), abs=1e-4)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "E1_host_city_2014", "relation": "host_city"}\n')
    with pytest.raises(DataError, match=r"bad\.jsonl:1"):
        read_calibration(str(bad))
