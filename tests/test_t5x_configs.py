"""gin_configs/t5x/*.gin serve users of upstream T5X. T5X is not installable from the package registry, so the suite
checks what T5X relies on: the configs as text against the macros of T5X's run configs (commit cc342d4), and the
configs parsed by gin with T5X's configurables stood in for by stubs of the same names (a stub t5x package and stub
includes written below), down to T5X's vocabulary check on what they build."""

import json
import os
import re
import subprocess
import sys
import textwrap

import pytest
import seqio

from templm import tasks  # noqa: F401  (the default registry: the embedded world's years)
from templm_testing import with_sentinels

CONFIG_DIR = os.path.join(os.path.dirname(os.path.dirname(__file__)), "gin_configs", "t5x")
REGIMES = ("uniform", "temporal", "yearly")
KINDS = {"": "t5x/configs/runs/finetune.gin", "_eval": "t5x/configs/runs/eval.gin",
         "_infer": "t5x/configs/runs/infer.gin"}
MODEL_GIN = "t5x/examples/t5/t5_1_1/small.gin"
# The macros T5X's run configs and t5_1_1 model configs define, by run config.
MODEL_MACROS = {"DROPOUT_RATE", "VOCABULARY", "MODEL", "OPTIMIZER", "Z_LOSS", "LABEL_SMOOTHING",
                "LOSS_NORMALIZING_FACTOR"}
RUN_MACROS = {
    "": {"MODEL_DIR", "MIXTURE_OR_TASK_NAME", "TASK_FEATURE_LENGTHS", "MIXTURE_OR_TASK_MODULE", "TRAIN_STEPS",
         "INITIAL_CHECKPOINT_PATH", "DROPOUT_RATE", "USE_CACHED_TASKS", "BATCH_SIZE", "EVAL_STEPS", "EVAL_PERIOD",
         "EVALUATOR_USE_MEMORY_CACHE", "EVALUATOR_NUM_EXAMPLES", "JSON_WRITE_N_RESULTS", "USE_HARDWARE_RNG",
         "RANDOM_SEED", "TRAIN_STEPS_RELATIVE"},
    "_eval": {"MIXTURE_OR_TASK_NAME", "CHECKPOINT_PATH", "EVAL_OUTPUT_DIR", "TASK_FEATURE_LENGTHS",
              "MIXTURE_OR_TASK_MODULE"},
    "_infer": {"MIXTURE_OR_TASK_NAME", "TASK_FEATURE_LENGTHS", "CHECKPOINT_PATH", "INFER_OUTPUT_DIR",
               "MIXTURE_OR_TASK_MODULE"},
}


def _lines(name):
    with open(os.path.join(CONFIG_DIR, name)) as f:
        return [line for line in f.read().splitlines() if line.strip() and not line.startswith("#")]


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("regime", REGIMES)
def test_t5x_config_uses_known_macros_and_registered_tasks(regime, kind):
    lines = _lines(f"{regime}{kind}.gin")
    assert "import templm.tasks" in lines and "import tasks" not in lines  # a project's tasks.py cannot shadow it
    includes = {m.group(1) for line in lines for m in [re.match(r"include '(.+)'", line)] if m}
    assert includes == {MODEL_GIN, KINDS[kind]}
    macros = {m.group(1): m.group(2) for line in lines for m in [re.match(r"([A-Z_]+) = (.+)", line)] if m}
    assert set(macros) <= RUN_MACROS[kind] | MODEL_MACROS, set(macros) - RUN_MACROS[kind] - MODEL_MACROS
    name = macros["MIXTURE_OR_TASK_NAME"].strip("'")
    provider = seqio.get_mixture_or_task(name)
    assert name.startswith(regime) or name.startswith(f"templama_{regime}")
    lengths = eval(macros["TASK_FEATURE_LENGTHS"], {})  # a plain dict literal
    assert set(lengths) == set(provider.output_features)
    with open(os.path.join(CONFIG_DIR, f"{regime}{kind}.gin")) as f:
        header = f.read()
    assert "cc342d4" in header and f"gin_configs/t5x/{regime}{kind}.gin" in header  # the commit and the command


# -- gin against stand-ins for T5X ------------------------------------------------------------------------------------

STUBS = {
    "t5x/__init__.py": "",
    "t5x/examples/__init__.py": "",
    "t5x/examples/t5/__init__.py": "",
    "t5x/examples/t5/t5_1_1/__init__.py": "",  # packages, as in T5X: gin resolves includes on the Python path
    "t5x/configs/__init__.py": "",
    "t5x/configs/runs/__init__.py": "",
    "t5x/models.py": """
        class EncoderDecoderModel:
            def __init__(self, module, input_vocabulary, output_vocabulary, **unused):
                self.module, self.input_vocabulary, self.output_vocabulary = module, input_vocabulary, output_vocabulary
    """,
    "t5x/examples/t5/network.py": """
        class T5Config:
            def __init__(self, vocab_size, dropout_rate, **unused):
                self.vocab_size, self.dropout_rate = vocab_size, dropout_rate

        class Transformer:
            def __init__(self, config):
                self.config = config
    """,
    "t5x/utils.py": """
        class DatasetConfig:
            def __init__(self, mixture_or_task_name, task_feature_lengths, split, **unused):
                self.mixture_or_task_name, self.task_feature_lengths = mixture_or_task_name, task_feature_lengths
                self.split = split
    """,
    # What t5_1_1/base.gin (included by small.gin) binds that matters here.
    MODEL_GIN: """
        from __gin__ import dynamic_registration
        import seqio
        from t5x import models
        from t5x.examples.t5 import network

        DROPOUT_RATE = %gin.REQUIRED
        T5_VOCABULARY = "gs://t5-data/vocabs/cc_all.32000.100extra/sentencepiece.model"
        VOCABULARY = @seqio.SentencePieceVocabulary()
        seqio.SentencePieceVocabulary.sentencepiece_model_file = %T5_VOCABULARY
        MODEL = @models.EncoderDecoderModel()
        models.EncoderDecoderModel:
          module = @network.Transformer()
          input_vocabulary = %VOCABULARY
          output_vocabulary = %VOCABULARY
        network.Transformer.config = @network.T5Config()
        network.T5Config:
          vocab_size = 32128
          dropout_rate = %DROPOUT_RATE
    """,
    KINDS[""]: """
        from __gin__ import dynamic_registration
        import __main__ as train_script
        from t5x import utils

        MODEL_DIR = %gin.REQUIRED
        MIXTURE_OR_TASK_NAME = %gin.REQUIRED
        TASK_FEATURE_LENGTHS = %gin.REQUIRED
        TRAIN_STEPS = %gin.REQUIRED
        INITIAL_CHECKPOINT_PATH = %gin.REQUIRED
        BATCH_SIZE = 128
        train_script.train:
          model = %MODEL
          model_dir = %MODEL_DIR
          dataset_cfg = @train/utils.DatasetConfig()
          total_steps = %TRAIN_STEPS
          initial_checkpoint_path = %INITIAL_CHECKPOINT_PATH
        train/utils.DatasetConfig:
          mixture_or_task_name = %MIXTURE_OR_TASK_NAME
          task_feature_lengths = %TASK_FEATURE_LENGTHS
          split = 'train'
          batch_size = %BATCH_SIZE
    """,
    KINDS["_eval"]: """
        from __gin__ import dynamic_registration
        import __main__ as eval_script
        from t5x import utils

        MIXTURE_OR_TASK_NAME = %gin.REQUIRED
        CHECKPOINT_PATH = %gin.REQUIRED
        EVAL_OUTPUT_DIR = %gin.REQUIRED
        TASK_FEATURE_LENGTHS = None
        eval_script.evaluate:
          model = %MODEL
          dataset_cfg = @utils.DatasetConfig()
          output_dir = %EVAL_OUTPUT_DIR
          checkpoint_path = %CHECKPOINT_PATH
        utils.DatasetConfig:
          mixture_or_task_name = %MIXTURE_OR_TASK_NAME
          task_feature_lengths = %TASK_FEATURE_LENGTHS
          split = 'test'
    """,
    KINDS["_infer"]: """
        from __gin__ import dynamic_registration
        import __main__ as infer_script
        from t5x import utils

        MIXTURE_OR_TASK_NAME = %gin.REQUIRED
        TASK_FEATURE_LENGTHS = %gin.REQUIRED
        CHECKPOINT_PATH = %gin.REQUIRED
        INFER_OUTPUT_DIR = %gin.REQUIRED
        infer_script.infer:
          model = %MODEL
          dataset_cfg = @utils.DatasetConfig()
          output_dir = %INFER_OUTPUT_DIR
          checkpoint_path = %CHECKPOINT_PATH
        utils.DatasetConfig:
          mixture_or_task_name = %MIXTURE_OR_TASK_NAME
          task_feature_lengths = %TASK_FEATURE_LENGTHS
          split = 'test'
    """,
}

# Parses every config as `python -m t5x.<verb>` would (the entry point registered from __main__, then the config
# files and the command line's bindings), builds what it binds and applies T5X's vocabulary check.
RUNNER = """
import json, sys
import gin, seqio

def train(model, dataset_cfg, **unused):
    return model, dataset_cfg

def evaluate(model, dataset_cfg, **unused):
    return model, dataset_cfg

def infer(model, dataset_cfg, **unused):
    return model, dataset_cfg

entry = {"": gin.configurable(train), "_eval": gin.configurable(evaluate), "_infer": gin.configurable(infer)}
stubs, config_dir, extra_files, bindings = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), json.loads(sys.argv[4])
gin.add_config_file_search_path(stubs)
for regime in ("uniform", "temporal", "yearly"):
    for kind in ("", "_eval", "_infer"):
        gin.clear_config()
        files = [f"{config_dir}/{regime}{kind}.gin"] + extra_files
        required = {"": ["MODEL_DIR = '/m'"], "_eval": ["CHECKPOINT_PATH = '/c'", "EVAL_OUTPUT_DIR = '/e'"],
                    "_infer": ["CHECKPOINT_PATH = '/c'", "INFER_OUTPUT_DIR = '/i'"]}[kind]
        gin.parse_config_files_and_bindings(files, required + bindings)
        model, cfg = entry[kind]()
        provider = seqio.get_mixture_or_task(cfg.mixture_or_task_name)
        task_vocab = provider.output_features["inputs"].vocabulary
        print(json.dumps({"config": f"{regime}{kind}", "task": cfg.mixture_or_task_name, "split": cfg.split,
                          "vocab_equal": model.input_vocabulary == task_vocab == model.output_vocabulary,
                          "same_object": model.input_vocabulary is task_vocab,
                          "model_vocab_size": model.module.config.vocab_size,
                          "task_vocab_size": task_vocab.vocab_size,
                          "extra_ids": task_vocab.extra_ids}))
"""


@pytest.fixture(scope="module")
def t5x_stubs(tmp_path_factory):
    root = tmp_path_factory.mktemp("t5x_stubs")
    for name, text in STUBS.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip())
    return str(root)


@pytest.fixture(scope="module")
def t5x_data(tmp_path_factory):
    from templm.data.task_data import TaskDataConfig, prepare_task_data
    from templm.data.world import WorldConfig

    out = str(tmp_path_factory.mktemp("t5x_data") / "data")
    prepare_task_data(TaskDataConfig(world=WorldConfig(seed=2, start_year=2013, end_year=2015,
                                                       subjects_per_relation=4, docs_per_month=6),
                                     vocab_size=300, future_years=1), out)
    return out


def _parse_all(stubs, data_dir, extra_files=(), bindings=(), env=None):
    env = {**os.environ, "TEMPLM_DATA_DIR": data_dir, "PYTHONPATH": os.pathsep.join(
        [stubs] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]), **(env or {})}
    result = subprocess.run([sys.executable, "-c", RUNNER, stubs, CONFIG_DIR, json.dumps(list(extra_files)),
                             json.dumps(list(bindings))], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return {row["config"]: row for row in map(json.loads, result.stdout.splitlines()) if row}


def _expect_tasks(rows, year):
    for regime in REGIMES:
        mixture = f"yearly_{year}_mixture" if regime == "yearly" else f"{regime}_mixture"
        infer = f"templama_yearly_{year}" if regime == "yearly" else f"templama_{regime}"
        assert (rows[regime]["task"], rows[regime]["split"]) == (mixture, "train")
        assert (rows[f"{regime}_eval"]["task"], rows[f"{regime}_eval"]["split"]) == (mixture, "test")
        assert (rows[f"{regime}_infer"]["task"], rows[f"{regime}_infer"]["split"]) == (infer, "test")


def test_t5x_configs_with_t5s_public_vocabulary_pass_t5xs_vocabulary_check(t5x_stubs, t5x_data, tmp_path):
    """TEMPLM_VOCABULARY names the same file as the T5X model config (a copy of templm's model with 100 sentinel
    pieces stands in for T5's cc_all.32000.100extra): the tasks load it with extra_ids=0 and the vocabularies the
    model and the tasks hold are equal under seqio's equality, as T5X's check demands, for every config."""
    t5_file = str(tmp_path / "cc_all.32000.100extra" / "sentencepiece.model")
    os.makedirs(os.path.dirname(t5_file))
    base = with_sentinels(os.path.join(t5x_data, "spm", "vocab.model"), t5_file)
    rows = _parse_all(t5x_stubs, t5x_data, bindings=[f"seqio.SentencePieceVocabulary.sentencepiece_model_file = "
                                                     f"'{t5_file}'"], env={"TEMPLM_VOCABULARY": t5_file})
    assert len(rows) == 9
    _expect_tasks(rows, 2014)
    for row in rows.values():
        assert row["vocab_equal"] and not row["same_object"], row  # two objects, equal as T5X compares them
        assert (row["extra_ids"], row["task_vocab_size"], row["model_vocab_size"]) == (0, base + 100, 32128)


def test_t5x_configs_with_templm_vocab_gin_use_the_tasks_vocabulary_at_its_size(t5x_stubs, t5x_data):
    rows = _parse_all(t5x_stubs, t5x_data, extra_files=[os.path.join(CONFIG_DIR, "templm_vocab.gin")])
    assert len(rows) == 9
    _expect_tasks(rows, 2014)
    for row in rows.values():
        assert row["vocab_equal"] and row["same_object"], row
        assert row["extra_ids"] == 100 and row["model_vocab_size"] == -(-row["task_vocab_size"] // 128) * 128
        assert row["model_vocab_size"] < 32128  # sized to the tasks' vocabulary, not T5's


REQUIREMENTS = os.path.join(CONFIG_DIR, "requirements.txt")


def _requirements():
    """(package-index lines, repository lines) of gin_configs/t5x/requirements.txt."""
    with open(REQUIREMENTS) as f:
        lines = [line.split("#")[0].strip() for line in f]
    lines = [line for line in lines if line]
    return [line for line in lines if " @ " not in line], [line for line in lines if " @ " in line]


def test_the_t5x_requirements_are_pinned_and_what_workspace_installs():
    index, repositories = _requirements()
    assert index and all(re.fullmatch(r"[A-Za-z0-9_.-]+==[0-9][0-9A-Za-z.]*", line) for line in index), index
    assert {line.split(" @ ")[0] for line in repositories} == {"jestimator", "airio"}
    assert all(re.search(r"@[0-9a-f]{40}$", line) for line in repositories), repositories  # a commit, not a branch
    workspace = open(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "WORKSPACE.md")).read()
    assert "pip install --no-deps -e t5x -r templm/gin_configs/t5x/requirements.txt" in workspace
    assert "pip install fiddle" not in workspace  # the unpinned line that took jestimator 0.3.3


@pytest.mark.e2e
@pytest.mark.network
def test_the_t5x_requirements_from_the_index_need_nothing_else_and_change_nothing_of_templms():
    """pip's own resolution, as a dry run against the installed templm: the index's packages of the file, with
    their dependencies, install exactly themselves (nothing templm pins is upgraded, downgraded or doubled), so
    `--no-deps` leaves nothing out. (The repositories' packages are not on the index.)"""
    index, _ = _requirements()
    report = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--report", "-",
                             *index], capture_output=True, text=True, timeout=600)
    if report.returncode != 0 and "Could not" in report.stderr and ("connection" in report.stderr.lower()
                                                                    or "resolve" in report.stderr.lower()):
        pytest.skip(f"the package index cannot be reached: {report.stderr.strip().splitlines()[-1]}")
    assert report.returncode == 0, report.stderr[-2000:]
    installs = {item["metadata"]["name"].lower().replace("_", "-"): item["metadata"]["version"]
                for item in json.loads(report.stdout)["install"]}
    wanted = {line.split("==")[0].lower().replace("_", "-"): line.split("==")[1] for line in index}
    assert installs == wanted


def test_t5x_train_imports_against_the_pinned_jax_where_t5x_is_installed():
    """Where T5X and the file's packages are installed (a user's machine after WORKSPACE's recipe; not the CI
    machine, which cannot reach the repositories), its entry points import against templm's jax."""
    import importlib.util

    if importlib.util.find_spec("t5x") is None:
        pytest.skip("T5X is not installed here (WORKSPACE.md, 'Upstream T5X')")
    code = "import t5x.train, t5x.eval, t5x.infer"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
