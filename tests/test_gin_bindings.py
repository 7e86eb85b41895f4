"""Every config a gin file can build checks the kind of each of its numeric and boolean bindings before anything uses
it: a quoted number, a fraction where a count is meant, an infinity or a quoted boolean is one ConfigError naming
`templm.CONFIG.FIELD`, never a traceback from deep inside the run and never a value taken as it came. The configs are
read from gin's registry, so a config added later is checked by this test without being listed here."""

import dataclasses
import typing

import gin
import pytest

import templm.evaluation.checkpoint_eval  # noqa: F401  (registers the evaluation's configurables)
import templm.experiments.calm  # noqa: F401  (registers the CALM configs)
import templm.experiments.streaming  # noqa: F401  (registers the stream's configs)
import templm.training.lm_trainer  # noqa: F401  (registers TransformerXLConfig and the corpus configs)
import templm.training.trainer  # noqa: F401  (registers T5Config and the dataset configs)
from templm.cli.data_verbs import world_configurable
from templm.errors import ConfigError, _plain_kind
from templm.experiments.studies import load_study, register_gin
from templm.models.t5 import T5_1_1_CONFIGS
from templm.models.transformer_xl import TXL_CONFIGS
from templm.training.configs import CorpusConfig, DatasetConfig


def _registered_configs():
    """{gin name: class} of every dataclass gin can build under the `templm` module (gin keeps its registry
    private: read here, in a test, only)."""
    world_configurable()
    register_gin()
    found = {}
    for name, configurable in gin.config._REGISTRY.items():
        wrapped = configurable.wrapped
        if name.startswith("templm.") and isinstance(wrapped, type) and dataclasses.is_dataclass(wrapped):
            found[name] = wrapped
    return found


CONFIGS = _registered_configs()
STUDY = load_study("tiny_test")
SAMPLES = {"templm.T5Config": T5_1_1_CONFIGS["tiny"], "templm.TransformerXLConfig": TXL_CONFIGS["tiny"],
           "templm.Study": STUDY.preset, "templm.StreamStudy": STUDY.stream,  # (no defaults for some fields)
           "templm.CorpusConfig": CorpusConfig("news.jsonl", "spm.model", 8),
           "templm.DatasetConfig": DatasetConfig("temporal_mixture", {"inputs": 32, "targets": 8}, 16)}
WRONG = {int: ["3", 2.5, True, float("nan")], float: ["0.1", float("inf"), float("nan"), True],
         bool: ["True", 1]}


def test_the_registry_holds_the_configs_users_bind():
    assert {"templm.WorldConfig", "templm.T5Config", "templm.TransformerXLConfig", "templm.DatasetConfig",
            "templm.CorpusConfig", "templm.OptimizerConfig", "templm.StreamData", "templm.CalmStreamConfig",
            "templm.Study", "templm.StreamStudy"} <= set(CONFIGS)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_every_numeric_and_boolean_binding_of_every_config_is_checked_by_kind(name):
    cls = CONFIGS[name]
    sample = SAMPLES.get(name) or cls()
    hints = typing.get_type_hints(cls)
    checked = 0
    for field in dataclasses.fields(cls):
        kind, _ = _plain_kind(hints.get(field.name))
        for wrong in WRONG.get(kind, []):
            with pytest.raises(ConfigError, match=rf"^{name}\.{field.name}( \(the gin macro [A-Z_]+\))?: expected "):
                dataclasses.replace(sample, **{field.name: wrong})
            checked += 1
    assert checked or not any(_plain_kind(hints.get(f.name))[0] in WRONG for f in dataclasses.fields(cls))


def test_a_mesh_of_no_partitions_is_named():
    """`templm plan` with num_partitions=0 ended in a ZeroDivisionError traceback."""
    from templm.training.partitioning import make_mesh

    from templm_testing import run_templm

    for bad, said in ((0, "must be at least 1, got 0"), (2.5, "expected a whole number, got 2.5")):
        with pytest.raises(ConfigError, match=rf"^templm\.make_mesh\.num_partitions: {said}"):
            make_mesh(bad)
        # `plan --devices N` lays the mesh out from the binding itself (the fault campaign's rerun: a traceback).
        result = run_templm("plan", "--gin_file=gin_configs/temporal.gin", "--gin_file=gin_configs/mesh/gpu_8.gin",
                            f"--gin.templm.make_mesh.num_partitions={bad}", "--devices=8")
        assert result.returncode == 1 and result.stderr.strip().splitlines()[-1] == \
            f"templm plan: error: templm.make_mesh.num_partitions: {said}", result.stderr[-2000:]
