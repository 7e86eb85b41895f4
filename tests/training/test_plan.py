"""`templm plan` (templm/training/plan.py): per-device bytes of a configuration on a mesh, from abstract shapes and a
compiled step, without allocating the model."""

import dataclasses
import os

import jax
import numpy as np
import optax
import pytest

from templm.models.t5 import T5_1_1_CONFIGS, EncoderDecoderModel, count_parameters
from templm.training import partitioning
from templm.training.plan import GIB, describe, layer_extrapolated, plan
from templm_testing import run_templm as templm

LENGTHS = {"inputs": 32, "targets": 8}


def _mesh(shape):
    return partitioning.make_mesh(mesh_shape=shape, devices=jax.devices()[:int(np.prod(shape))])


def test_parameter_and_optimizer_bytes_follow_the_parameter_count_and_the_mesh():
    model = EncoderDecoderModel(T5_1_1_CONFIGS["tiny"])
    count = count_parameters(T5_1_1_CONFIGS["tiny"])
    rules = partitioning.logical_axis_rules()
    replicated = plan(model, optax.adam(1e-3), LENGTHS, 16, _mesh((8, 1)), rules, compile_step=False)
    assert replicated["parameters"] == count
    assert replicated["bytes"]["params"] == 4 * count  # float32, every device holds all of them
    assert replicated["bytes"]["opt_state"] == 2 * 4 * count + 4  # Adam's two moments and its step count
    # 2 rows a device; 3 int32 encoder features of the input length, 5 decoder ones of the target length.
    assert replicated["bytes"]["batch"] == (16 // 8) * 4 * (3 * LENGTHS["inputs"] + 5 * LENGTHS["targets"])
    sharded = plan(model, optax.adam(1e-3), LENGTHS, 16, _mesh((4, 2)), rules)
    assert 4 * count / 2 <= sharded["bytes"]["params"] < 4 * count  # the model axis halves the sharded matrices
    assert sharded["uneven"] == [] and sharded["bytes"]["temp"] > 0
    b = sharded["bytes"]
    assert b["total"] == b["params"] + b["opt_state"] + b["batch"] + b["temp"] and sharded["fits"]
    text = describe(sharded, "tiny")
    assert f"tiny: {count:,} parameters on 8 tpu_v4 devices (data 4 x model 2), 32 GiB each" in text
    assert "fits:" in text
    huge = plan(model, optax.adam(1e-3), LENGTHS, 16, _mesh((4, 2)), rules, device_kind="cpu")
    assert huge["device_memory"] == 16 * GIB


def test_dimensions_the_mesh_cannot_divide_are_reported_not_compiled():
    """T5 v1.1 small's 6 heads over a model axis of 4: its relative-position bias cannot be sharded."""
    config = dataclasses.replace(T5_1_1_CONFIGS["tiny"], num_heads=3)
    result = plan(EncoderDecoderModel(config), optax.adam(1e-3), LENGTHS, 16, _mesh((4, 2)),
                  partitioning.logical_axis_rules())
    assert result["uneven"] and result["fits"] is None and result["bytes"]["temp"] is None
    assert any("size 3 over model of size 2" in line for line in result["uneven"])
    assert "does not shard:" in describe(result)


@pytest.mark.e2e
def test_the_verb_on_the_shipped_configs():
    result = templm("plan", "--gin_file=gin_configs/temporal.gin", "--gin_file=gin_configs/runs/cpu_demo.gin",
                    "--gin.templm.make_mesh.mesh_shape=(2, 2)", "--device_kind=a100_80",
                    env={"XLA_FLAGS": os.environ.get("XLA_FLAGS", "")})
    assert result.returncode == 0, result.stderr[-3000:]
    assert "on 4 a100_80 devices (data 2 x model 2), 80 GiB each" in result.stdout and "fits:" in result.stdout
    assert "tensorflow" not in result.stderr.lower() and "cuda" not in result.stderr.lower()  # start-up lines quiet
    missing = templm("plan", "--gin_file=gin_configs/temporal.gin", "--gin_file=gin_configs/mesh/gpu_8.gin")
    assert missing.returncode == 1 and "give --devices N" in missing.stderr
    empty = templm("plan", "--gin_file=gin_configs/temporal.gin", "--gin_file=gin_configs/runs/cpu_demo.gin",
                   "--gin.templm.make_mesh.mesh_shape=(0, 2)", "--device_kind=a100_80")
    assert empty.returncode == 1 and "Traceback" not in empty.stderr, empty.stderr[-2000:]
    assert "templm.make_mesh.mesh_shape: expected (data, model), two whole numbers of at least 1, got (0, 2)" in \
        empty.stderr


def test_the_transformer_xl_step_is_planned_like_the_t5_one():
    from templm.models.transformer_xl import TXL_CONFIGS
    from templm.training.plan import plan_lm

    config = TXL_CONFIGS["tiny"]
    rules = partitioning.logical_axis_rules()
    result = plan_lm(config, optax.adam(1e-3), 8, _mesh((8, 1)), rules, compile_step=False)
    count = result["parameters"]
    assert result["bytes"]["params"] == 4 * count and result["bytes"]["opt_state"] == 2 * 4 * count + 4
    assert result["bytes"]["batch"] == (8 // 8) * 4 * (2 * config.tgt_len + 1)  # inputs, targets, reset
    odd = dataclasses.replace(config, vocab_size=config.vocab_size + 1)  # 2 cannot split an odd vocabulary
    uneven = plan_lm(odd, optax.adam(1e-3), 8, _mesh((4, 2)), rules)
    assert any("['params']['embedding']: dimension 0" in line for line in uneven["uneven"])


def test_a_configuration_that_does_not_fit_gets_the_first_remedy_that_does():
    """The remedy is planned, not guessed: against a budget between the totals of 2 and 4 microbatches (each
    compiled here), the search tries 2 (does not fit), then 4 (fits) and stops; with no budget any candidate meets
    it names what is left."""
    from templm.training.plan import describe_remedy, find_remedy

    model = EncoderDecoderModel(T5_1_1_CONFIGS["tiny"])
    rules, tx = partitioning.logical_axis_rules(), optax.adam(1e-3)
    tried, compiled = [], {}

    def measured(microbatches, shape):
        tried.append((microbatches, shape))
        if (microbatches, shape) not in compiled:
            compiled[microbatches, shape] = plan(model, tx, LENGTHS, 64, _mesh(shape), rules, microbatches, "cpu")
        return compiled[microbatches, shape]

    totals = {m: measured(m, (8, 1))["bytes"]["total"] for m in (1, 2, 4)}
    assert totals[1] > totals[2] > totals[4]  # the activations are divided
    budget = totals[4] + 1

    def attempt(microbatches, shape):
        result = measured(microbatches, shape)
        return {**result, "fits": result["bytes"]["total"] <= budget}

    tried.clear()
    remedy = find_remedy(attempt, (8, 1), 64, 1)
    assert tried == [(2, (8, 1)), (4, (8, 1))]
    assert remedy["change"] == "microbatches=4" and remedy["result"]["bytes"]["total"] == totals[4]
    start = {**measured(1, (8, 1)), "fits": False}
    assert describe_remedy(start, remedy).startswith("  remedy: microbatches=4 fits (")
    tried.clear()
    none = find_remedy(lambda m, shape: tried.append((m, shape)) or {"uneven": [], "fits": False}, (8, 1), 64, 1)
    assert none is None and tried == [(2, (8, 1)), (4, (8, 1)), (8, (8, 1)), (1, (4, 2)), (1, (2, 4)), (1, (1, 8))]
    assert "no remedy among more microbatches and a larger model axis" in describe_remedy(start, None)


def test_adams_moments_lie_as_their_parameters_on_a_model_axis():
    """The Transformer-XL trainer's state built on 8 devices (data 4 x model 2): the bytes one device holds of
    Adam's moments are twice its parameters' (plus the step count), not four times (moments replicated over the
    model axis, as XLA lays out the zeros tx.init makes), and `templm plan` counts exactly what is held."""
    from templm.models.transformer_xl import TXL_CONFIGS, TransformerXL
    from templm.training import lm_trainer, state
    from templm.training.plan import plan_lm

    config = TXL_CONFIGS["tiny"]
    mesh, rules, tx = _mesh((4, 2)), partitioning.logical_axis_rules(), optax.adam(1e-3)
    with state.mesh_rules(mesh, rules):
        built, _ = lm_trainer.init_state(TransformerXL(config), tx, 8, config.mem_len, 0, mesh, rules)

    def held(tree):
        return sum(leaf.addressable_shards[0].data.nbytes for leaf in jax.tree.leaves(tree))

    params, moments = held(built["params"]), held(built["opt_state"])
    assert params < 4 * sum(leaf.size for leaf in jax.tree.leaves(built["params"]))  # the model axis shards some
    assert moments <= 2 * params + 64
    planned = plan_lm(config, tx, 8, mesh, rules, compile_step=False)["bytes"]
    assert (planned["params"], planned["opt_state"]) == (params, moments)


@pytest.mark.e2e
def test_a_study_is_planned_training_by_training():
    from templm.experiments.reproduce import t5_config
    from templm.experiments.studies import load_study

    study = load_study("tiny_test")
    result = templm("plan", "--gin_file=gin_configs/study/tiny_test.gin",
                    "--gin_file=gin_configs/mesh/cpu_fake8_4x2.gin", "--device_kind=cpu",
                    env={"XLA_FLAGS": os.environ.get("XLA_FLAGS", "")})
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    assert (f"tiny_test study, T5 v1.1 tiny, batch 8: {count_parameters(t5_config(study.preset)):,} parameters on 8 "
            "cpu devices (data 4 x model 2)") in out
    assert "tiny_test study, Transformer-XL 1 layers, batch 8" in out
    names = ["uniform", "temporal", "each yearly expert", "retrain (Temporal from scratch)", "adapt_alpha0.5",
             "adapt_uniform_alpha0.5", "time_stratified (Transformer-XL)", "control (Transformer-XL)"]
    lines = out.split("every training of the tiny_test study on 8 cpu devices:\n")[1].splitlines()
    assert [line.split("  ")[1].strip() for line in lines] == names
    assert all(line.rstrip().endswith("%)") and " fits (" in line for line in lines)


def test_the_optimizer_state_is_counted_as_training_lays_it_out():
    """Adafactor on a model axis: the plan's optimizer bytes per device are those of the state the trainer builds
    (asked of the compiler, state.optimizer_state_shardings), where matching parameters by shape counted half."""
    from templm.training import state
    from templm.training.optimizers import make_optimizer

    mesh, rules = _mesh((4, 2)), partitioning.logical_axis_rules()
    model = EncoderDecoderModel(T5_1_1_CONFIGS["tiny"])
    tx = make_optimizer("adafactor", 1e-2)
    with state.mesh_rules(mesh, rules):
        shardings = partitioning.logical_shardings(model.logical_partition_specs(), mesh, rules)
        params = jax.jit(lambda rng: model.init(rng, LENGTHS["inputs"], LENGTHS["targets"]),
                         out_shardings=shardings)(jax.random.key(0))
        built, _ = state.train_state(params, tx, mesh)
    held = sum(leaf.addressable_shards[0].data.nbytes for leaf in jax.tree.leaves(built["opt_state"]))
    assert plan(model, tx, LENGTHS, 16, mesh, rules, compile_step=False)["bytes"]["opt_state"] == held


def test_the_layer_extrapolation_grows_each_stack_from_one_and_two_layer_compiles():
    """`layer_extrapolated` on a step whose temporaries are linear in each stack (as a real step's are, nearly):
    the model's own figure from the compiles it asks for, and those are of one and two layers only."""
    asked = []

    def compiled(layers):
        asked.append(layers)
        return 1000 + 300 * layers[0] + 500 * layers[1]

    assert layer_extrapolated(compiled, (24, 24), exact=False) == (compiled((24, 24)), "extrapolated")
    assert asked[:2] == [(1, 1), (2, 2)]
    asked.clear()
    assert layer_extrapolated(compiled, (12, 3), exact=False)[0] == 1000 + 300 * 12 + 500 * 3
    assert sorted(asked) == [(1, 1), (1, 2), (2, 1)]
    asked.clear()
    assert layer_extrapolated(compiled, (12, 3), exact=True) == (compiled((12, 3)), "compiled")
    assert layer_extrapolated(compiled, (2, 1), exact=False)[1] == "compiled"  # small enough to compile whole


def test_an_extrapolated_plan_is_near_the_compiled_one():
    """A T5 of 5 encoder and 4 decoder layers: the step's temporaries from its one- and two-layer steps are within
    5 % of the whole step's (BENCHMARKS.md, "Plans", measures T5 v1.1 small and base)."""
    config = dataclasses.replace(T5_1_1_CONFIGS["tiny"], num_encoder_layers=5, num_decoder_layers=4)
    model, rules = EncoderDecoderModel(config), partitioning.logical_axis_rules()
    fast = plan(model, optax.adam(1e-3), LENGTHS, 16, _mesh((4, 2)), rules)
    exact = plan(model, optax.adam(1e-3), LENGTHS, 16, _mesh((4, 2)), rules, exact=True)
    assert (fast["temp_from"], exact["temp_from"]) == ("extrapolated", "compiled")
    assert {k: v for k, v in fast["bytes"].items() if k not in ("temp", "total")} == \
        {k: v for k, v in exact["bytes"].items() if k not in ("temp", "total")}
    assert abs(fast["bytes"]["temp"] / exact["bytes"]["temp"] - 1) < 0.05, (fast["bytes"], exact["bytes"])
    assert "(1-2 layers, extended)" in describe(fast) and "(compiled)" in describe(exact)


def test_a_transformer_xl_plan_is_extrapolated_from_its_one_and_two_layer_steps_too():
    from templm.models.transformer_xl import TXL_CONFIGS
    from templm.training.plan import plan_lm

    config = dataclasses.replace(TXL_CONFIGS["tiny"], n_layer=3)
    rules = partitioning.logical_axis_rules()
    fast = plan_lm(config, optax.adam(1e-3), 8, _mesh((4, 2)), rules)
    exact = plan_lm(config, optax.adam(1e-3), 8, _mesh((4, 2)), rules, exact=True)
    assert (fast["temp_from"], exact["temp_from"]) == ("extrapolated", "compiled")
    assert abs(fast["bytes"]["temp"] / exact["bytes"]["temp"] - 1) < 0.05, (fast["bytes"], exact["bytes"])
