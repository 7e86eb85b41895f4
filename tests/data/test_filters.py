"""The paper's corpus clean-up before splitting (templm/data/filters.py through make_splits, yearly_buckets and
`templm data splits`): documents in another language and near-duplicates of an earlier document are in no split, the
earliest copy stays, stats.json counts what went, and without the clean-up every document is there."""

import datetime
import json
import os

import pytest

from templm.data.filters import DocumentFilter, FilterConfig, shingles
from templm.data.records import Document
from templm.data.splits import SPLIT_NAMES, make_splits, read_split_file, yearly_buckets
from templm_testing import run_templm

D = datetime.date

ENGLISH = [
    "The city council voted on Tuesday to extend the tram line to the northern suburbs, after two years of public "
    "hearings in which residents argued about noise, parking and the cost of moving the old market hall. The mayor "
    "said the first trains could run within four years if the regional government pays its share, while opposition "
    "members warned that the budget had already grown twice since the plan was first drawn up by the transport "
    "office.",
    "Researchers at the university reported that the glacier above the valley lost more ice last summer than in any "
    "year since measurements began, and they expect the melt to speed up as the dark rock beneath it is exposed to "
    "the sun. Farmers downstream depend on the meltwater for their fields in August, so the regional water board has "
    "asked for a study of new reservoirs before the next dry season begins.",
    "The national football team named a new captain before the autumn qualifiers, choosing the veteran midfielder "
    "who has played more than eighty matches for his country. The coach told reporters that experience would matter "
    "in the away games, where the side has struggled for years, and added that two young defenders from the league "
    "champions will join the squad for the first time next week.",
]
FRENCH = ("Le conseil municipal a voté mardi le prolongement de la ligne de tramway vers les quartiers du nord, après "
          "deux années de consultations publiques au cours desquelles les habitants ont discuté du bruit, du "
          "stationnement et du coût du déménagement de l'ancienne halle du marché.")
GERMAN = ("Die Forscher der Universität berichteten, dass der Gletscher oberhalb des Tals im vergangenen Sommer mehr "
          "Eis verloren hat als in jedem anderen Jahr seit Beginn der Messungen, und sie erwarten, dass die Schmelze "
          "sich weiter beschleunigt, sobald das dunkle Gestein darunter freiliegt.")
# A later copy of ENGLISH[0] with one word changed: a near-duplicate (5-gram Jaccard 0.87); with a closing sentence
# too it would be 0.80, at the threshold.
NEAR_COPY = ENGLISH[0].replace("Tuesday", "Wednesday")


def _corpus(path):
    """Short filler documents every week of 2016-2019 (too short for language identification, all distinct), and
    the documents above: the English originals in 2016, their copies and the foreign ones in the test period."""
    docs = []
    day, i = D(2016, 1, 1), 0
    while day <= D(2019, 12, 31):
        docs.append({"id": f"filler-{i:04d}", "date": day.isoformat(), "text": f"Filler note number {i}."})
        day += datetime.timedelta(days=7)
        i += 1
    docs += [{"id": f"english-{k}", "date": f"2016-0{k + 3}-10", "text": text} for k, text in enumerate(ENGLISH)]
    docs += [{"id": "french", "date": "2018-03-05", "text": FRENCH},
             {"id": "german", "date": "2018-07-05", "text": GERMAN},
             {"id": "near-copy", "date": "2018-09-05", "text": NEAR_COPY},
             {"id": "exact-copy", "date": "2019-02-05", "text": ENGLISH[1]}]
    with open(path, "w", encoding="utf-8") as f:
        for doc in docs:
            f.write(json.dumps(doc) + "\n")
    return str(path), len(docs)


REMOVED = {"french", "german", "near-copy", "exact-copy"}


def _split_ids(out):
    return {doc_id for name in SPLIT_NAMES for _, doc_id in read_split_file(os.path.join(out, f"{name}.gz"))}


def _make(corpus, out, **kwargs):
    # A small corpus whose test months are all test documents: degenerate on purpose, the clean-up is the subject.
    return make_splits(corpus, str(out), cutoff=D(2017, 9, 30), test_docs_per_month=100, allow_degenerate=True,
                       **kwargs)


def test_other_languages_and_near_duplicates_are_in_no_split_and_counted(tmp_path):
    corpus, n = _corpus(tmp_path / "news.jsonl")
    stats = _make(corpus, tmp_path / "clean")
    with_everything = _make(corpus, tmp_path / "raw", clean=None)
    kept, everything = _split_ids(tmp_path / "clean"), _split_ids(tmp_path / "raw")
    assert REMOVED <= everything and with_everything["cleaned"] is None
    assert everything - kept == REMOVED  # and nothing else went
    assert {f"english-{k}" for k in range(3)} <= kept  # the earliest copy stays
    cleaned = stats["cleaned"]
    assert cleaned["other_language_removed"] == 2 and cleaned["languages_removed"] == {"fr": 1, "de": 1}
    assert cleaned["near_duplicates_removed"] == 2 and cleaned["kept"] == n - 4
    assert cleaned["language_unchecked_short"] == n - 7  # the fillers
    assert stats["corpus_documents"] == n
    with open(tmp_path / "clean" / "stats.json") as f:
        assert json.load(f)["cleaned"] == cleaned

    yearly = yearly_buckets(corpus, str(tmp_path / "clean"), heldout_fraction=0.0)
    raw = yearly_buckets(corpus, str(tmp_path / "raw"), heldout_fraction=0.0, clean=None)
    assert yearly["cleaned"]["near_duplicates_removed"] == 2
    assert {year: raw["years"][year]["train"] - yearly["years"][year]["train"] for year in raw["years"]} == \
        {"2016": 0, "2017": 0, "2018": 3, "2019": 1}


def test_the_threshold_and_the_language_are_settings(tmp_path):
    corpus, _ = _corpus(tmp_path / "news.jsonl")
    # Only (almost) exact copies at threshold 0.97: the edited copy stays. Another language asked: English goes.
    strict = _make(corpus, tmp_path / "strict", clean=FilterConfig(near_duplicate_threshold=0.97, language=None))
    assert strict["cleaned"]["near_duplicates_removed"] == 1 and "near-copy" in _split_ids(tmp_path / "strict")
    french = FilterConfig(language="fr", near_duplicate_threshold=None)
    doc_filter = DocumentFilter(french)
    assert doc_filter.reason(Document("f", D(2018, 1, 1), FRENCH)) is None
    assert doc_filter.reason(Document("e", D(2018, 1, 1), ENGLISH[2])) == "other_language"
    with pytest.raises(ValueError, match="language must be one of langid's ISO 639-1 codes"):
        FilterConfig(language="english")
    with pytest.raises(ValueError, match="langid's ISO 639-1 codes"):
        FilterConfig(language="xx")
    with pytest.raises(ValueError, match="near_duplicate_threshold must be in"):
        FilterConfig(near_duplicate_threshold=1.0)


def test_shingles_are_word_five_grams_of_the_lowercased_text():
    assert shingles("A b, C d e F!", 5) == {b"a b c d e", b"b c d e f"}
    assert shingles("Two words", 5) == {b"two words"}


def test_the_verb_takes_the_clean_up_flags_and_names_a_bad_one(tmp_path):
    corpus, _ = _corpus(tmp_path / "news.jsonl")
    base = ["data", "splits", f"--corpus={corpus}", "--cutoff=2017-09-30", "--test_docs_per_month=100", "--noyearly",
            "--allow_degenerate"]
    ok = run_templm(*base, f"--out={tmp_path / 'out'}", "--near_duplicate_threshold=0")
    assert ok.returncode == 0, ok.stderr[-3000:]
    with open(tmp_path / "out" / "stats.json") as f:
        cleaned = json.load(f)["cleaned"]
    assert cleaned["other_language_removed"] == 2 and cleaned["near_duplicate_threshold"] is None
    bad = run_templm(*base, f"--out={tmp_path / 'bad'}", "--language=english")
    assert bad.returncode == 1 and "--language" in bad.stderr and "langid's ISO 639-1 codes" in bad.stderr
    assert not os.path.exists(tmp_path / "bad")


def test_the_sparse_language_score_decides_as_langid_does():
    """`language_of` sums langid's naive-Bayes scores over the features a text has; on texts that mix the three
    languages, truncated anywhere and with noise, it names the language langid.classify names."""
    import random

    from langid import langid

    from templm.data.filters import language_of

    reference = langid.LanguageIdentifier.from_modelstring(langid.model, norm_probs=True)
    rng = random.Random(11)
    words = [text.split() for text in ENGLISH + [FRENCH, GERMAN]]
    texts = []
    for _ in range(400):
        mix = [w for source in rng.sample(words, rng.randint(1, 3)) for w in rng.sample(source, rng.randint(1, 20))]
        noise = "".join(rng.choice("abcxyz0123 .,;éüß") for _ in range(rng.randint(0, 30)))
        texts.append(" ".join(mix)[:rng.randint(5, 400)] + noise)
    decided = [language_of(text) for text in texts]
    assert decided == [reference.classify(text)[0] for text in texts]
    assert {"en", "fr", "de"} <= set(decided)


def test_the_languages_a_config_accepts_are_langids_and_importing_templm_unpacks_no_model():
    """FilterConfig checks its language against LANGID_LANGUAGES without unpacking langid's model: the list is the
    model's own, and a fresh process that imports the task registry (whose defaults build FilterConfigs) has not
    loaded it."""
    import subprocess
    import sys

    from langid import langid

    from templm.data.filters import LANGID_LANGUAGES

    model = langid.LanguageIdentifier.from_modelstring(langid.model)
    assert LANGID_LANGUAGES == set(model.nb_classes)
    code = ("import templm.data.filters as f, templm.data.splits, templm.data.task_data; "
            "print(sorted(f._IDENTIFIER), f.FilterConfig(language='de').language)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["[]", "de"]


def test_langids_model_is_unpacked_once_into_the_cache_and_read_back_as_langid_unpacks_it(tmp_path, monkeypatch):
    """Unpacking langid's model string took 1-3 s in every process that filtered a corpus; its arrays go to templm's
    cache once (an .npz named after the string's digest) and the next process reads them back: the identifier's
    arguments are langid's own, element for element, from the cache as when first unpacked. A damaged cache file is
    unpacked again and replaced; a cache that cannot be written still gives the model."""
    import numpy as np
    from langid import langid

    from templm.data.filters import _langid_model

    reference = langid.LanguageIdentifier.from_modelstring(langid.model)
    expected = (reference.nb_ptc, reference.nb_pc, reference.nb_numfeats, list(reference.nb_classes),
                reference.tk_nextmove, reference.tk_output)

    def same(got):
        assert got[0].dtype == expected[0].dtype and np.array_equal(got[0], expected[0])
        assert got[1].dtype == expected[1].dtype and np.array_equal(got[1], expected[1])
        assert got[2:] == expected[2:]

    monkeypatch.setenv("TEMPLM_CACHE", str(tmp_path / "cache"))
    same(_langid_model(langid.model))  # unpacked, then written
    (cached,) = (tmp_path / "cache").iterdir()
    assert cached.name.startswith("langid-") and cached.suffix == ".npz"
    written = cached.stat().st_mtime_ns
    same(_langid_model(langid.model))  # read back
    assert cached.stat().st_mtime_ns == written
    cached.write_bytes(b"not an npz")
    same(_langid_model(langid.model))
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [cached.name] and cached.read_bytes()[:2] == b"PK"
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("TEMPLM_CACHE", str(tmp_path / "file" / "cache"))  # under a file: nothing can be written
    same(_langid_model(langid.model))
