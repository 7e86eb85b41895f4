"""Task data built from a user's corpus: what the vocabulary is trained on."""

import json
import os
import random

import sentencepiece as spm

from templm.data.task_data import TaskDataConfig, prepare_task_data


def test_the_vocabulary_has_seen_no_future_text(tmp_path):
    """The study's models never train on the future years, so neither does their vocabulary: every piece of it is
    text of a seen year (or of the Temporal prefix). The future year here is full of a word no earlier year has,
    frequent enough that SentencePiece would make pieces of it."""
    rng = random.Random(3)
    clubs = ["Rovers", "United", "Athletic", "City"]
    lines = []
    for year in (2014, 2015, 2016):
        for k in range(120):
            club = rng.choice(clubs)
            text = f"Fans of {club} cheered on {year}. The crowd left happy. Tickets for {rng.choice(clubs)} sold out."
            if year == 2016:  # varied sentences, so that no sampling of unique sentences thins the word out
                text += "".join(f" Quorvexian {rng.choice(clubs)} won {rng.randint(1, 99)} Quorvexian cups."
                                for _ in range(4))
            lines.append(json.dumps({"id": f"{year}-{k}", "date": f"{year}-05-{1 + k % 28:02d}", "text": text}))
    corpus = tmp_path / "news.jsonl"
    corpus.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = str(tmp_path / "tasks")
    manifest = prepare_task_data(TaskDataConfig(corpus=str(corpus), vocab_size=200, exact_vocab_size=False,
                                                future_years=1), out)
    assert manifest["seen_years"] == [2014, 2015] and manifest["future_years"] == [2016]
    seen_text = " ".join(json.loads(line)["text"] for line in lines if not line.startswith('{"id": "2016'))
    seen_text += " " + " ".join(f"year: {y}" for y in (2014, 2015, 2016))
    processor = spm.SentencePieceProcessor(model_file=os.path.join(out, manifest["vocabulary"]))
    pieces = [processor.id_to_piece(i) for i in range(processor.get_piece_size())
              if not (processor.is_control(i) or processor.is_unknown(i))]
    unseen = [p for p in pieces if p.replace("\u2581", " ").strip() not in seen_text]
    assert unseen == []  # trained on every year, the vocabulary held "Q", "x" and numbers of 2016's text
    assert len(processor.encode("Quorvexian")) > 2  # spelled in pieces of older text


def test_templama_queries_of_years_without_news_are_left_out_and_said(tmp_path, capsys):
    """A release covers more years than a user's corpus (TempLAMA's 2010-2020 beside news of 2014-2016): the queries
    of years without news are left out with one warning naming the years, and the study's years are the corpus's
    (a year without news would have had a Yearly expert with nothing to read)."""
    lines = [json.dumps({"id": f"{y}-{k}", "date": f"{y}-03-{1 + k:02d}",
                         "text": f"Ana Lopes plays for Red Lions in {y}. The crowd cheered Red Lions again."})
             for y in (2014, 2015, 2016) for k in range(20)]
    corpus = tmp_path / "news.jsonl"
    corpus.write_text("\n".join(lines) + "\n", encoding="utf-8")
    release = tmp_path / "templama"
    os.makedirs(release)
    for split, years in (("train", (2013, 2014, 2015)), ("val", (2016,)), ("test", (2012, 2014, 2015, 2016, 2019))):
        rows = [json.dumps({"query": "Ana Lopes plays for _X_.", "answer": [{"wikidata_id": "Q1", "name": "Red Lions"}],
                            "date": str(y), "id": f"Q{split}_P54_{y}", "relation": "P54"}) for y in years]
        (release / f"{split}.json").write_text("\n".join(rows) + "\n", encoding="utf-8")
    manifest = prepare_task_data(TaskDataConfig(corpus=str(corpus), templama_dir=str(release), vocab_size=100,
                                                exact_vocab_size=False, future_years=1), str(tmp_path / "tasks"))
    assert manifest["years"] == [2014, 2015, 2016] and manifest["future_years"] == [2016]
    assert manifest["counts"]["templama"]["test"] == {"2014": 1, "2015": 1, "2016": 1}
    assert manifest["counts"]["templama"]["train"] == {"2014": 1, "2015": 1}
    assert ("warning: 3 TempLAMA queries of 2012, 2013, 2019 are left out: the corpus has no news of those years "
            "(2014-2016)") in capsys.readouterr().err


def _records(folder):
    """{split: [example id, ...]} of the record files in `folder` (customnews/ or templama/ of a task-data folder)."""
    import tensorflow as tf

    found = {}
    for name in sorted(os.listdir(folder)):
        split = name.split("-")[0]
        for raw in tf.data.TFRecordDataset(os.path.join(folder, name)).as_numpy_iterator():
            example = tf.train.Example.FromString(raw)
            found.setdefault(split, []).append(example.features.feature["id"].bytes_list.value[0].decode())
    return found


def test_the_records_are_made_of_the_documents_the_clean_up_keeps(tmp_path):
    """The splits left out what the clean-up removed, but the task records were made from every document the
    reader gave: a near-copy of a held-out article was trained on (the leak the clean-up is for), and so were an
    article in another language and a later document under a repeated id. The records, like the splits and the
    vocabulary, are made of the kept documents only; without the clean-up the near-copy and the other language are
    in, the repeated id's later document still out."""
    rng = random.Random(7)
    names = ["Ana Lopes", "Red Lions", "Port Alba", "Tom Reyes", "Blue Harbour", "Mira Stone", "Green Vale"]
    words = ("the council said on monday that new plans for roads schools and parks would be ready before the "
             "summer while local people asked for more time to read them and to meet officials").split()

    def article():
        sentences = []
        for _ in range(6):
            middle = " ".join(rng.choice(words) for _ in range(9))
            sentences.append(f"Reports say {rng.choice(names)} and {rng.choice(names)} {middle}.")
        return " ".join(sentences)

    docs = [{"id": f"{y}-{k}", "date": f"{y}-{1 + k % 12:02d}-{1 + k % 28:02d}", "text": article()}
            for y in (2014, 2015, 2016) for k in range(40)]
    original = docs[5]
    copy = dict(original, id="copy-of-2014-5", date="2016-11-20",
                text=original["text"].replace(" and ", " with ", 1))
    french = {"id": "fr-1", "date": "2015-06-02",
              "text": "Le conseil municipal a annoncé lundi que les nouveaux projets pour les routes, les écoles et les "
                      "parcs seraient prêts avant l'été, tandis que les habitants ont demandé plus de temps pour les "
                      "lire et rencontrer les responsables de la ville. Selon Ana Lopes, les travaux commenceront "
                      "en septembre et dureront plusieurs mois dans le quartier du port."}
    again = {"id": "2015-3", "date": "2016-12-01", "text": article()}
    corpus = tmp_path / "news.jsonl"
    corpus.write_text("\n".join(json.dumps(d) for d in docs + [copy, french, again]) + "\n", encoding="utf-8")

    def documents(out, clean):
        from templm.data.filters import FilterConfig

        config = TaskDataConfig(corpus=str(corpus), vocab_size=120, exact_vocab_size=False, future_years=1,
                                heldout_fraction=0.5, clean=FilterConfig() if clean else None)
        manifest = prepare_task_data(config, str(out))
        records = _records(os.path.join(str(out), "customnews"))
        return manifest, {split: {i.split("#")[0] for i in ids} for split, ids in records.items()}, records

    manifest, by_split, records = documents(tmp_path / "cleaned", True)
    written = set().union(*by_split.values())
    assert original["id"] in written  # it has salient spans: a near-copy of it would have them too
    assert not {"copy-of-2014-5", "fr-1"} & written
    stats = json.loads((tmp_path / "cleaned" / "splits" / "stats.json").read_text())["yearly"]
    assert stats["cleaned"]["near_duplicates_removed"] == 1 and stats["cleaned"]["other_language_removed"] == 1
    assert stats["duplicates_dropped"] == 1
    assert sum(len(ids) for ids in records.values()) == sum(
        n for split in manifest["counts"]["customnews"].values() for n in split.values())
    # The repeated id's records are its first document's: the same examples as without the later one.
    first = [i for i in records["train"] + records.get("validation", []) + records.get("test", [])
             if i.startswith("2015-3#")]
    assert first and len(first) == len(set(first))

    _, plain, _ = documents(tmp_path / "plain", False)
    everything = set().union(*plain.values())
    assert {"copy-of-2014-5", "fr-1"} <= everything and everything - written == {"copy-of-2014-5", "fr-1"}
