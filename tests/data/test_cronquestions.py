"""CronQuestions as its release ships it (pickles of plain lists, dicts and sets; an id-to-name file), read without
running code from the file, converted into the `cronquestions` SeqIO task, and scored as Dhingra et al. score it:
trained on the first answer, the best SQuAD EM and F1 over every answer."""

import json
import os
import pickle
import struct

import numpy as np
import pytest
import seqio

from templm.data.cronquestions import convert_release, load_plain_pickle, read_entity_names, read_manifest
from templm.errors import DataError
from templm.tasks import registry
from templm_testing import run_templm

NAMES = {"Q76": "Barack Obama", "Q11696": "President of the United States", "Q13133": "Michelle Obama",
         "Q1124": "Bill Clinton", "Q207": "George W. Bush", "Q212": "Ukraine"}

# Questions in the release's shape: answers are sets of Wikidata ids or of years.
QUESTIONS = {
    "train": [
        {"question": "Who held the position of President of the United States after George W. Bush",
         "answers": {"Q76"}, "answer_type": "entity", "template": "Who held {tail} after {head}",
         "entities": {"Q207", "Q11696"}, "times": set(), "relations": ["P39"], "type": "before_after",
         "annotation": {"head": "Q207", "tail": "Q11696"}, "uniq_id": 101, "paraphrases": []},
        {"question": "When did Barack Obama hold the position of President of the United States",
         "answers": {2012, 2009, 2016, 2010}, "answer_type": "time", "template": "When did {head} hold {tail}",
         "entities": {"Q76", "Q11696"}, "times": set(), "relations": ["P39"], "type": "simple_time",
         "annotation": {"head": "Q76", "tail": "Q11696"}, "uniq_id": 102, "paraphrases": ["..."]},
    ],
    "validation": [
        {"question": "Who was President of the United States in 1999", "answers": {"Q1124"},
         "answer_type": "entity", "template": "Who was {tail} in {time}", "entities": {"Q11696"}, "times": {1999},
         "relations": ["P39"], "type": "simple_entity", "annotation": {"tail": "Q11696", "time": 1999},
         "uniq_id": 201, "paraphrases": []},
    ],
    "test": [
        {"question": "Who was President of the United States before   Barack Obama", "answers": {"Q207", "Q1124"},
         "answer_type": "entity", "template": "Who held {tail} before {head}", "entities": {"Q76", "Q11696"},
         "times": set(), "relations": ["P39"], "type": "before_after",
         "annotation": {"head": "Q76", "tail": "Q11696"}, "uniq_id": 301, "paraphrases": []},
        {"question": "When did Michelle Obama marry Barack Obama", "answers": {1992}, "answer_type": "time",
         "template": "When did {head} marry {tail}", "entities": {"Q13133", "Q76"}, "times": set(),
         "relations": ["P26"], "type": "simple_time", "annotation": {"head": "Q13133", "tail": "Q76"},
         "uniq_id": 302, "paraphrases": []},
    ],
}
FILES = {"train": "train.pickle", "validation": "valid.pickle", "test": "test.pickle"}


def write_release(root, questions=QUESTIONS, names=NAMES, protocol=3):
    """The release's layout, data/wikidata_big/{questions,kg}/, written with pickle and plain text as the
    publishers' own scripts write it (protocol 3 rebuilds sets through builtins.set; 4 and 5 have set opcodes)."""
    base = root / "data" / "wikidata_big"
    (base / "questions").mkdir(parents=True)
    (base / "kg").mkdir()
    for split, items in questions.items():
        with open(base / "questions" / FILES[split], "wb") as f:
            pickle.dump(items, f, protocol=protocol)
    (base / "kg" / "wd_id2entity_text.txt").write_text("".join(f"{k}\t{v}\n" for k, v in names.items()),
                                                       encoding="utf-8")
    return root


def read_records(path):
    import tensorflow as tf

    features = {k: tf.io.VarLenFeature(tf.string) for k in ("inputs", "targets", "answers", "id", "answer_type",
                                                             "question_type")}
    out = []
    for raw in tf.data.TFRecordDataset(str(path)):
        ex = tf.io.parse_single_example(raw, features)
        out.append({k: [x.decode() for x in tf.sparse.to_dense(v).numpy()] for k, v in ex.items()})
    return out


@pytest.mark.parametrize("protocol", [3, pickle.HIGHEST_PROTOCOL])
def test_a_release_becomes_records_with_every_answer_by_name(tmp_path, protocol):
    release = write_release(tmp_path / "release", protocol=protocol)
    out = tmp_path / "out"
    manifest = convert_release(str(release), str(out))
    assert manifest["splits"] == {"train": {"questions": 2, "entity": 1, "time": 1},
                                  "validation": {"questions": 1, "entity": 1, "time": 0},
                                  "test": {"questions": 2, "entity": 1, "time": 1}}
    assert read_manifest(str(out))["splits"] == manifest["splits"]
    train = read_records(out / "train.tfrecord")
    assert train[0] == {"inputs": ["Who held the position of President of the United States after George W. Bush"],
                        "targets": ["Barack Obama"], "answers": ["Barack Obama"], "id": ["101"],
                        "answer_type": ["entity"], "question_type": ["before_after"]}
    # The release's answers are sets: templm fixes their order (years ascending) and trains on the first.
    assert train[1]["answers"] == ["2009", "2010", "2012", "2016"] and train[1]["targets"] == ["2009"]
    test = read_records(out / "test.tfrecord")
    assert test[0]["answers"] == ["Bill Clinton", "George W. Bush"] and test[0]["targets"] == ["Bill Clinton"]
    assert test[0]["inputs"] == ["Who was President of the United States before Barack Obama"]  # spaces collapsed
    # Given the questions/ folder itself, or data/wikidata_big/, the same release is found.
    again = convert_release(str(release / "data" / "wikidata_big" / "questions"), str(tmp_path / "again"))
    assert again["splits"] == manifest["splits"]


class _Payload:
    """What a hostile file could carry: unpickling it would call os.system."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_pickle_that_names_a_function_is_refused_and_never_runs(tmp_path):
    marker = tmp_path / "ran"
    hostile = {**QUESTIONS, "test": QUESTIONS["test"] + [{"question": "q", "answers": {_Payload(marker)},
                                                          "answer_type": "entity", "uniq_id": 999}]}
    release = write_release(tmp_path / "release", questions=hostile)
    path = release / "data" / "wikidata_big" / "questions" / "test.pickle"
    with pytest.raises(DataError, match=r"test.pickle: not a readable pickle of plain data: it names "
                                        r"(posix|os|nt)\.system"):
        convert_release(str(release), str(tmp_path / "out"))
    assert not marker.exists() and not (tmp_path / "out").exists()
    with pytest.raises(DataError, match="names numpy"):
        (tmp_path / "array.pickle").write_bytes(pickle.dumps([np.arange(3)]))
        load_plain_pickle(str(tmp_path / "array.pickle"))
    assert load_plain_pickle(str(path.with_name("train.pickle")))[1]["answers"] == {2009, 2010, 2012, 2016}


@pytest.mark.parametrize("data, message", [
    # 20-byte files whose opcodes claim a terabyte string, a gigabyte memo (MemoryError tracebacks before) ...
    (b"\x80\x04\x8d" + struct.pack("<Q", 1 << 40) + b"abc.", r"expected 1099511627776 bytes in a unicodestring8, "
                                                              r"but only 4 remain"),
    (b"\x80\x03]r" + struct.pack("<I", 1 << 30) + b".", r"its memo index 1,073,741,824 at byte 3 is beyond anything a "
                                                        r"9-byte pickle stores"),
    # ... and lists nested 100,000 deep (a RecursionError traceback in whatever read them after).
    (b"\x80\x03" + b"]" * 100_000 + b"a" * 99_999 + b".", r"it nests containers more than 32 levels deep"),
    (b"\x80\x03]", r"pickle exhausted before seeing STOP"),
])
def test_a_pickle_that_claims_more_than_its_bytes_is_refused_before_it_is_unpickled(tmp_path, data, message):
    path = tmp_path / "test.pickle"
    path.write_bytes(data)
    with pytest.raises(DataError, match=f"{path}: not a readable pickle of plain data: {message}"):
        load_plain_pickle(str(path))


@pytest.mark.parametrize("change, message", [
    (lambda q: q["test"][1].update(answers=set()), r"test.pickle: question 1: 'answers' must be a non-empty set"),
    (lambda q: q["test"][0].update(answers={"Q999"}), r"test.pickle: question 0: the answer Q999 has no name"),
    (lambda q: q["train"][1].update(answers={"2009-01-01"}), r"train.pickle: question 1: a time answer must be a "
                                                              "year, got '2009-01-01'"),
    (lambda q: q["validation"][0].pop("question"), r"valid.pickle: question 0: no 'question' text"),
    (lambda q: q["test"][1].update(answer_type="date"), r"test.pickle: question 1: 'answer_type' must be one of"),
    (lambda q: q["test"][1].update(uniq_id=301), r"test.pickle: question 1: uniq_id 301 appears twice"),
])
def test_a_malformed_question_names_the_file_and_the_question(tmp_path, change, message):
    import copy

    questions = copy.deepcopy(QUESTIONS)
    change(questions)
    release = write_release(tmp_path / "release", questions=questions)
    with pytest.raises(DataError, match=message):
        convert_release(str(release), str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()


def test_the_name_file_and_the_release_layout_are_checked(tmp_path):
    bad = tmp_path / "names.txt"
    bad.write_text("Q76\tBarack Obama\n\nQ11696 President\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"names.txt:3: expected 'ID<TAB>name'"):
        read_entity_names(str(bad))
    with pytest.raises(DataError, match="not a CronQuestions release: expected questions/train.pickle"):
        convert_release(str(tmp_path), str(tmp_path / "out"))


def test_the_task_trains_on_the_first_answer_and_scores_the_best_of_all(tmp_path):
    out = tmp_path / "records"
    convert_release(str(write_release(tmp_path / "release")), str(out))
    vocabulary = seqio.ByteVocabulary(extra_ids=0)
    name = registry.register_cronquestions(str(out), vocabulary, read_manifest(str(out))["splits"])
    try:
        task = seqio.get_mixture_or_task(name)
        dataset = task.get_dataset({"inputs": 96, "targets": 24}, split="test", shuffle=False)
        examples = list(dataset.as_numpy_iterator())
        assert [vocabulary.decode(list(ex["targets"][:-1])) for ex in examples] == ["Bill Clinton", "1992"]
        assert vocabulary.decode(list(examples[1]["inputs"][:-1])) == "When did Michelle Obama marry Barack Obama"
        targets = [task.postprocess_fn(None, example=ex, is_target=True) for ex in examples]
        assert targets[0]["answers"] == ["Bill Clinton", "George W. Bush"]
        # The second answer of a two-answer question counts in full; "1990" against "1992" scores nothing.
        scores = task.metric_fns[0](targets, ["George W. Bush", "1990"])
        assert scores["em"] == pytest.approx(50.0) and scores["f1"] == pytest.approx(50.0)
        partial = task.metric_fns[0](targets, ["George Bush", "1992"])
        assert partial["em"] == pytest.approx(50.0) and partial["f1"] == pytest.approx((80.0 + 100.0) / 2)
    finally:
        seqio.TaskRegistry.remove(name)
        registry._registered.remove(name)


@pytest.mark.e2e
def test_templm_data_cronquestions_writes_the_folder_whole_or_not_at_all(tmp_path):
    release = write_release(tmp_path / "release")
    out = tmp_path / "out"
    result = run_templm("data", "cronquestions", f"--release={release}", f"--out={out}", "--max_questions=1")
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads(result.stdout)["splits"]["test"] == {"questions": 1, "entity": 1, "time": 0}
    assert len(read_records(out / "test.tfrecord")) == 1
    (release / "data" / "wikidata_big" / "kg" / "wd_id2entity_text.txt").write_text("Q76 Barack Obama\n")
    result = run_templm("data", "cronquestions", f"--release={release}", f"--out={tmp_path / 'other'}")
    assert result.returncode != 0 and "wd_id2entity_text.txt:1: expected 'ID<TAB>name'" in result.stderr
    assert "Traceback" not in result.stderr and not (tmp_path / "other").exists()
