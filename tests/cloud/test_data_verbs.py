"""The data verbs, is-eval and a Hugging Face checkpoint with their inputs and outputs in an emulator bucket
(tests/cloud/conftest.py): the same bytes and numbers as on local folders."""

import json
import os

import jax
import numpy as np

from templm import paths
from templm.data.lm_streams import read_split_stream
from cloud_testing import bucket_files, local_files, timeless, upload
from templm_testing import REPO, run_templm


def test_the_data_verbs_read_and_write_a_bucket_as_a_local_folder(gcs, bucket, tmp_path):
    """data world, splits, spm, streams and stats with every input and output in the bucket: the same bytes (and the
    same statistics) as the same verbs on local folders; nothing left beside the outputs, nothing made locally; a
    rerun replaces the bucket's world."""
    small = ["--seed=3", "--start_year=2015", "--end_year=2018", "--subjects_per_relation=4", "--docs_per_month=8"]
    here, there = tmp_path / "local", f"gs://{bucket}"
    work = tmp_path / "cwd"
    work.mkdir()
    runs = {}
    for root in (str(here), there):
        corpus = f"{root}/world/news.jsonl"
        for args in (["data", "world", *small, "--out", f"{root}/world"],
                     ["data", "world", *small, "--out", f"{root}/world"],  # again: replaces its own output
                     ["data", "splits", "--corpus", corpus, "--out", f"{root}/splits", "--cutoff=2016-12-31",
                      "--test_months=12", "--allow_degenerate"],
                     ["data", "spm", "--corpus", corpus, "--split_dir", f"{root}/splits",
                      "--split=time_stratified_train", "--out", f"{root}/spm/vocab", "--vocab_size=120"],
                     ["data", "streams", "--corpus", corpus, "--split_dir", f"{root}/splits",
                      "--splits=time_stratified_train", "--spm_model", f"{root}/spm/vocab.model", "--out",
                      f"{root}/streams"],
                     ["data", "stats", "--corpus", corpus, "--split_dir", f"{root}/splits", "--split=test"]):
            result = run_templm(*args, cwd=work)
            assert result.returncode == 0, (args, result.stderr[-3000:])
        runs[root] = json.loads(result.stdout)
    assert os.listdir(work) == []
    local, remote_files = local_files(here), bucket_files(gcs, bucket)
    assert set(remote_files) == set(local)  # nothing more in the bucket: no partial folder, no lock, no probe
    for name, data in local.items():
        if name.endswith(("stats.json", "manifest.json")):  # names the corpus it was built from
            data = data.replace(str(here).encode(), there.encode())
        assert remote_files[name] == data, name
    assert {k: v for k, v in runs[there].items() if k not in ("corpus", "split")} == {
        k: v for k, v in runs[str(here)].items() if k not in ("corpus", "split")}
    # train-lm's reading of the streams (lm_streams.read_split_stream), from the bucket as from the folder.
    read = [read_split_stream(f"{root}/streams", "time_stratified_train", str(here / "spm" / "vocab.model"))[:2]
            for root in (there, str(here))]
    for a, b in zip(*read):
        np.testing.assert_array_equal(a, b)


def _write_release(root, year):
    """A CronQuestions release of one question (in `year`) in its published layout: data/wikidata_big/questions/
    {train,valid,test}.pickle (protocol 3, as the publishers' scripts write) and kg/wd_id2entity_text.txt."""
    import pickle

    release = root / "data" / "wikidata_big"
    (release / "questions").mkdir(parents=True)
    (release / "kg").mkdir()
    question = {"question": f"Who held the seat in {year}", "answers": {"Q1"}, "answer_type": "entity",
                "template": "Who held {tail} in {time}", "entities": {"Q2"}, "times": {year}, "relations": ["P39"],
                "type": "simple_entity", "annotation": {"tail": "Q2", "time": year}, "uniq_id": 7, "paraphrases": []}
    for name in ("train.pickle", "valid.pickle", "test.pickle"):
        with open(release / "questions" / name, "wb") as f:
            pickle.dump([question], f, protocol=3)
    (release / "kg" / "wd_id2entity_text.txt").write_text("Q1\tAda Lovelace\nQ2\tthe seat\n", encoding="utf-8")


def test_templama_and_cronquestions_from_and_into_a_bucket_as_from_local_files(gcs, bucket, tmp_path):
    """data templama (a Wikidata dump) and data cronquestions (a release's pickles) read from the bucket and written
    into it: the same files as from and into local folders (the recorded source aside)."""
    fixtures = os.path.join(REPO, "tests", "fixtures")
    _write_release(tmp_path / "release", 2001)
    upload(tmp_path / "release", f"gs://{bucket}/release")
    paths.copy(os.path.join(fixtures, "wikidata_dump.json"), f"gs://{bucket}/dump.json")
    work = tmp_path / "cwd"
    work.mkdir()
    for args in (["data", "templama", "--dump", os.path.join(fixtures, "wikidata_dump.json"), "--out",
                  str(tmp_path / "templama"), "--start_year=2010", "--end_year=2020"],
                 ["data", "templama", "--dump", f"gs://{bucket}/dump.json", "--out", f"gs://{bucket}/templama",
                  "--start_year=2010", "--end_year=2020"],
                 ["data", "cronquestions", "--release", str(tmp_path / "release"), "--out", str(tmp_path / "cq")],
                 ["data", "cronquestions", "--release", f"gs://{bucket}/release", "--out", f"gs://{bucket}/cq"]):
        result = run_templm(*args, cwd=work)
        assert result.returncode == 0, (args, result.stderr[-3000:])
    assert os.listdir(work) == []
    there = bucket_files(gcs, bucket)
    for folder in ("templama", "cq"):
        for name, data in local_files(tmp_path / folder).items():
            if name in ("stats.json", "manifest.json"):  # the source's name and the time it took aside
                data = data.replace(os.path.join(fixtures, "wikidata_dump.json").encode(),
                                    f"gs://{bucket}/dump.json".encode())
                data = data.replace(str(tmp_path).encode(), f"gs://{bucket}".encode())
                assert timeless(json.loads(there[f"{folder}/{name}"])) == timeless(json.loads(data)), name
            else:
                assert there[f"{folder}/{name}"] == data, name


def test_a_hugging_face_checkpoint_in_a_bucket_starts_a_training_as_a_local_one(gcs, bucket, tmp_path):
    """INITIAL_CHECKPOINT_PATH at a URL: the parameters trainer.initial_params reads (checked against the model) are
    the local folder's."""
    from templm.models.t5 import T5_1_1_CONFIGS, EncoderDecoderModel, save_hf_checkpoint
    from templm.training.trainer import initial_params

    model = EncoderDecoderModel(T5_1_1_CONFIGS["tiny"])
    params = model.init(jax.random.PRNGKey(3))
    local = save_hf_checkpoint(params, T5_1_1_CONFIGS["tiny"], str(tmp_path / "hf"))
    remote_dir = upload(local, f"gs://{bucket}/hf")
    here, there = initial_params(local, model), initial_params(remote_dir, model)
    same = jax.tree.map(lambda a, b: np.array_equal(np.asarray(a), np.asarray(b)), here, there)
    assert all(jax.tree.leaves(same)) and len(jax.tree.leaves(same)) > 10


def test_is_eval_into_a_bucket_as_into_a_local_folder(gcs, bucket, tmp_path):
    """`templm is-eval` (the HMM check) with --out in the bucket: the local run's is_eval.json, and its report."""
    small = ["--seed=1", "--ks=1,4", "--temperatures=0.5", "--repeats=2", "--num_docs=3", "--doc_length=8"]
    work = tmp_path / "cwd"
    work.mkdir()
    for out in (str(tmp_path / "is"), f"gs://{bucket}/is"):
        result = run_templm("is-eval", f"--out={out}", *small, cwd=work)
        assert result.returncode == 0, result.stderr[-3000:]
    assert os.listdir(work) == []
    local = json.loads((tmp_path / "is" / "is_eval.json").read_text())
    there = json.loads(gcs.read(bucket, "is/is_eval.json"))
    assert timeless(there) == timeless(local)
    assert {"is/is_eval.md", "is/is_eval.png"} <= set(gcs.objects(bucket))


def test_the_tasks_read_their_vocabulary_and_cronquestions_from_a_bucket(gcs, bucket, data_dir, tmp_path):
    """TEMPLM_DATA_DIR, TEMPLM_VOCABULARY and TEMPLM_CRONQUESTIONS_DIR at URLs (templm.tasks.configure with the
    settings the command line reads): the TempLAMA and CronQuestions tasks give the local folders' examples."""
    import seqio

    from templm import tasks
    from templm.settings import Settings

    _write_release(tmp_path / "release", 2013)
    result = run_templm("data", "cronquestions", "--release", str(tmp_path / "release"), "--out",
                        str(tmp_path / "cq"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    there = {"data_dir": upload(data_dir, f"gs://{bucket}/data"), "cronquestions_dir": upload(tmp_path / "cq",
                                                                                             f"gs://{bucket}/cq")}
    here = {"data_dir": data_dir, "cronquestions_dir": str(tmp_path / "cq")}
    lengths = {"inputs": 32, "targets": 8}
    found = {}
    try:
        for where, folders in (("here", here), ("there", there)):
            vocabulary = f"{folders['data_dir']}/spm/vocab.model"
            tasks.configure(settings=Settings(vocabulary=vocabulary, **folders))
            assert tasks.current()["vocabulary"].sentencepiece_model_file == vocabulary
            found[where] = [[(ex["inputs"].tolist(), ex["targets"].tolist()) for ex in seqio.get_mixture_or_task(
                name).get_dataset(lengths, split="test", shuffle=False).as_numpy_iterator()]
                for name in ("templama_temporal", "cronquestions")]
    finally:
        tasks.configure(data_dir=data_dir)
    assert found["there"] == found["here"] and len(found["here"][0]) > 10 and len(found["here"][1]) == 1
