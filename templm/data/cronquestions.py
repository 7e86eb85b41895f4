"""CronQuestions (Saxena et al., 2021) as Dhingra et al. use it (section 4, Table 4): closed-book question answering.

The release (github.com/apoorvumang/CronKGQA, `data/wikidata_big/`) holds `questions/{train,valid,test}.pickle`,
each a Python pickle of a list of dicts:

    {"question": "When did Barack Obama hold the position of President?", "answers": {2009, 2010, ...},
     "answer_type": "time", "type": "simple_time", "template": ..., "entities": {"Q76", ...}, "times": {...},
     "relations": [...], "annotation": {...}, "uniq_id": 17, "paraphrases": [...]}

whose answers are Wikidata ids (entity questions) or years (time questions), and `kg/wd_id2entity_text.txt` (one
"Q76<TAB>Barack Obama" per line) names the ids.

Reading a pickle may run any code the file names, so `read_questions` unpickles with `PlainUnpickler`, which looks up
no global at all except the two container types a protocol-2/3 pickle names for a set (`builtins.set` and
`builtins.frozenset`): strings, numbers, lists, dicts, tuples and sets come back; a file that names any other class
or function is refused as a DataError before anything in it is built.

`convert_release` writes the questions once as record files for the SeqIO task `cronquestions` (templm.tasks):
`{train,validation,test}.tfrecord` of tf.train.Examples with `inputs` (the question), `targets` (the answer the model
is trained on), `answers` (every correct answer, by name or year), `id`, `answer_type` and `question_type`, and
`manifest.json` with the counts. The paper trains on "the first answer in the list of correct answers"; the release
stores answers as a set, whose order Python does not fix (string hashing is salted per process), so templm lists
them in a fixed order (entity names alphabetically, years ascending) and trains on the first of that list. The
evaluation takes the best SQuAD EM and F1 over every answer, as the paper does.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import pickletools
from typing import Any, Dict, List, Mapping, Optional, Sequence

from templm import paths, remote
from templm.data.tfrecords import RecordFile
from templm.errors import DataError
from templm.io import NamedWrites

QUESTION_FILES = {"train": "train.pickle", "validation": "valid.pickle", "test": "test.pickle"}
ENTITY_NAMES = "wd_id2entity_text.txt"
ANSWER_TYPES = ("entity", "time")
SPLITS = tuple(QUESTION_FILES)
MANIFEST = "manifest.json"

# The only globals a CronQuestions pickle may name: the set types (protocols 2 and 3 rebuild a set by calling them).
_ALLOWED_GLOBALS = {("builtins", "set"): set, ("builtins", "frozenset"): frozenset,
                    ("__builtin__", "set"): set, ("__builtin__", "frozenset"): frozenset}


class PlainUnpickler(pickle.Unpickler):
    """Unpickles plain data only: any global other than the set types is refused (no class is built, no function
    called), so a file cannot run code of its own."""

    def find_class(self, module: str, name: str) -> Any:
        try:
            return _ALLOWED_GLOBALS[(module, name)]
        except KeyError:
            raise pickle.UnpicklingError(f"it names {module}.{name}; a CronQuestions file holds plain lists, dicts "
                                         "and sets only, so it is not read") from None


def load_plain_pickle(path: str) -> Any:
    """The plain data in the pickle at `path` (`PlainUnpickler`); a DataError naming the file otherwise."""
    try:
        with paths.open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise DataError("no such file", path) from None
    _check_claims(data, path)
    try:
        value = PlainUnpickler(io.BytesIO(data)).load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, IndexError, KeyError) as e:
        raise DataError(f"not a readable pickle of plain data: {e}", path) from None
    except (MemoryError, RecursionError, OverflowError) as e:  # what the checks above cannot see ahead
        raise DataError(f"not a readable pickle of plain data: it asks for more than its {len(data):,} bytes can "
                        f"hold ({type(e).__name__})", path) from None
    _check_depth(value, path)
    return value


# The opcodes that store into the unpickler's memo at an index the file gives: the C unpickler sizes its memo by
# that index, so a 20-byte file could ask for gigabytes.
_MEMO_PUTS = ("PUT", "BINPUT", "LONG_BINPUT")


def _check_claims(data: bytes, path: str) -> None:
    """Refuses, before anything is unpickled, a pickle whose opcodes claim more than its bytes: a length beyond the
    end of the file (pickletools reads only what is there and says so), a memo index larger than the file (a real
    pickle numbers its memo from 0, one entry per object), or opcodes after the end. A DataError names the file and
    the byte."""
    try:
        for opcode, argument, position in pickletools.genops(data):
            if opcode.name in _MEMO_PUTS and int(argument) > len(data):
                break
        else:
            return
    except (ValueError, TypeError) as e:  # a claimed length past the end, an unknown opcode, a missing STOP
        raise DataError(f"not a readable pickle of plain data: {e}", path) from None
    raise DataError(f"not a readable pickle of plain data: its memo index {int(argument):,} at byte {position} is "
                    f"beyond anything a {len(data):,}-byte pickle stores", path)


MAX_DEPTH = 32  # a CronQuestions file nests three levels (a list of dicts of lists or sets)


def _check_depth(value: Any, path: str) -> None:
    """Refuses plain data nested deeper than MAX_DEPTH (a crafted file: the unpickler builds any depth, and what
    reads it after would end in a RecursionError); walked without recursion, each container once."""
    seen, todo = set(), [(value, 1)]
    while todo:
        item, depth = todo.pop()
        if not isinstance(item, (list, tuple, dict, set, frozenset)) or id(item) in seen:
            continue
        if depth > MAX_DEPTH:
            raise DataError(f"not a readable pickle of plain data: it nests containers more than {MAX_DEPTH} levels "
                            "deep", path)
        seen.add(id(item))
        children = list(item.keys()) + list(item.values()) if isinstance(item, dict) else item
        todo.extend((child, depth + 1) for child in children)


def read_entity_names(path: str) -> Dict[str, str]:
    """{Wikidata id: name} from `wd_id2entity_text.txt` ("Q76<TAB>Barack Obama" per line; blank lines skipped)."""
    names: Dict[str, str] = {}
    try:
        f = paths.open(path, encoding="utf-8")
    except FileNotFoundError:
        raise DataError("no such file (the release's entity names: kg/wd_id2entity_text.txt)", path) from None
    with f:
        for number, line in enumerate(f, 1):
            line = line.rstrip("\n").rstrip("\r")
            if not line.strip():
                continue
            key, tab, name = line.partition("\t")
            if not tab or not key.strip() or not name.strip():
                raise DataError(f"expected 'ID<TAB>name', got {line[:80]!r}", path, number)
            names[key.strip()] = name.strip()
    return names


def _answer_text(answer: Any, answer_type: str, names: Mapping[str, str], where: str) -> str:
    if answer_type == "time":
        year = answer if isinstance(answer, int) and not isinstance(answer, bool) else None
        if isinstance(answer, str) and answer.strip().isdigit():
            year = int(answer)
        if year is None:
            raise ValueError(f"{where}: a time answer must be a year, got {answer!r}")
        return str(year)
    if not isinstance(answer, str) or not answer.strip():
        raise ValueError(f"{where}: an entity answer must be a Wikidata id, got {answer!r}")
    if answer not in names:
        raise ValueError(f"{where}: the answer {answer} has no name in {ENTITY_NAMES}")
    return names[answer]


def question_record(item: Any, names: Mapping[str, str], index: int) -> Dict[str, Any]:
    """One question of the release as templm's record: {"id", "question", "answers" (names or years, in the fixed
    order), "answer_type", "question_type"}; a ValueError says what is wrong with it."""
    where = f"question {index}"
    if not isinstance(item, dict):
        raise ValueError(f"{where}: expected a dict, got {type(item).__name__}")
    question = item.get("question")
    if not isinstance(question, str) or not question.strip():
        raise ValueError(f"{where}: no 'question' text")
    answer_type = item.get("answer_type")
    if answer_type not in ANSWER_TYPES:
        raise ValueError(f"{where}: 'answer_type' must be one of {', '.join(ANSWER_TYPES)}, got {answer_type!r}")
    answers = item.get("answers")
    if isinstance(answers, (str, bytes)) or not isinstance(answers, (set, frozenset, list, tuple)) or not answers:
        raise ValueError(f"{where}: 'answers' must be a non-empty set of {'years' if answer_type == 'time' else 'ids'}")
    texts = sorted({_answer_text(a, answer_type, names, where) for a in answers},
                   key=(lambda t: (int(t),)) if answer_type == "time" else (lambda t: (t.casefold(), t)))
    uid = item.get("uniq_id", index)
    return {"id": str(uid), "question": " ".join(question.split()), "answers": texts, "answer_type": answer_type,
            "question_type": str(item.get("type") or "")}


def _locate(release_dir: str) -> Dict[str, str]:
    """The release's question folder and entity-name file, given the release root, `data/wikidata_big/` or its
    `questions/` folder."""
    release_dir = paths.absolute(release_dir)
    if paths.is_url(release_dir) and not paths.exists(release_dir):
        remote.check_location(release_dir, "the release", write=False)  # why not: no bucket, no route, ...
    candidates = [release_dir, paths.join(release_dir, "data", "wikidata_big"), paths.dirname(release_dir)]
    for base in candidates:
        questions = paths.join(base, "questions")
        if all(paths.exists(paths.join(questions, f)) for f in QUESTION_FILES.values()):
            return {"questions": questions, "names": paths.join(base, "kg", ENTITY_NAMES)}
    missing = ", ".join(f"questions/{f}" for f in QUESTION_FILES.values())
    raise DataError(f"not a CronQuestions release: expected {missing} and kg/{ENTITY_NAMES} here or under "
                    "data/wikidata_big/", release_dir)


def read_questions(path: str, names: Mapping[str, str]) -> List[Dict[str, Any]]:
    """The questions of one release file (`question_record` each); a DataError names the file and the question."""
    items = load_plain_pickle(path)
    if not isinstance(items, list):
        raise DataError(f"expected a list of questions, got {type(items).__name__}", path)
    out, seen = [], set()
    for index, item in enumerate(items):
        try:
            record = question_record(item, names, index)
        except ValueError as e:
            raise DataError(str(e), path) from None
        if record["id"] in seen:
            raise DataError(f"question {index}: uniq_id {record['id']} appears twice", path)
        seen.add(record["id"])
        out.append(record)
    return out


def _example(tf, record: Mapping[str, Any]) -> bytes:
    def text(values: Sequence[str]):
        return tf.train.Feature(bytes_list=tf.train.BytesList(value=[v.encode("utf-8") for v in values]))

    return tf.train.Example(features=tf.train.Features(feature={
        "inputs": text([record["question"]]), "targets": text(record["answers"][:1]),
        "answers": text(record["answers"]), "id": text([record["id"]]),
        "answer_type": text([record["answer_type"]]), "question_type": text([record["question_type"]]),
    })).SerializeToString(deterministic=True)


def convert_release(release_dir: str, out_dir: str, max_questions: Optional[int] = None) -> Dict[str, Any]:
    """Reads a CronQuestions release and writes `out_dir`/{train,validation,test}.tfrecord and manifest.json (module
    docstring); `max_questions` keeps the first N of each split. Every file is read and checked before the first is
    written; out_dir is a folder being built (templm.outputs.build_output_folder puts it in place whole)."""
    import tensorflow as tf  # deferred: seconds to import

    where = _locate(release_dir)
    names = read_entity_names(where["names"])
    splits = {}
    for split, filename in QUESTION_FILES.items():
        records = read_questions(paths.join(where["questions"], filename), names)
        splits[split] = records if max_questions is None else records[:max_questions]
    os.makedirs(out_dir, exist_ok=True)
    counts = {}
    for split, records in splits.items():
        with RecordFile(os.path.join(out_dir, f"{split}.tfrecord")) as writer:
            for record in records:
                writer.write(_example(tf, record))
        counts[split] = {"questions": len(records),
                         **{t: sum(r["answer_type"] == t for r in records) for t in ANSWER_TYPES}}
    manifest = {"source": paths.absolute(release_dir), "splits": counts,
                "first_answer": "entity names alphabetically, years ascending (the release's answers are sets)"}
    with NamedWrites(os.path.join(out_dir, MANIFEST), "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
    return manifest


def read_manifest(data_dir: str) -> Optional[Dict[str, Any]]:
    """The manifest.json of a folder `convert_release` wrote (any path tf.io.gfile reads, gs:// included), or None."""
    import tensorflow as tf  # deferred: seconds to import

    path = f"{data_dir.rstrip('/')}/{MANIFEST}"
    if not tf.io.gfile.exists(path):
        return None
    try:
        with tf.io.gfile.GFile(path, "r") as f:
            manifest = json.loads(f.read())
    except json.JSONDecodeError as e:
        raise DataError(f"corrupt CronQuestions manifest: {e}", path) from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("splits"), dict):
        raise DataError("not a CronQuestions manifest (no 'splits'): rebuild it with `templm data cronquestions`",
                        path)
    return manifest
