"""templm.evaluation.qa_metrics: SQuAD EM/F1, sentinel stripping, per-year/slice aggregation, perplexity, SeqIO glue."""

import math
import types

import numpy as np
import pytest

from templm.metrics.qa import (
    exact_match,
    make_perplexity_metric_fn,
    make_qa_metric_fn,
    normalize_answer,
    perplexity_by_year,
    ppl_postprocessor,
    qa_postprocessor,
    qa_scores,
    strip_sentinels,
    token_f1,
)

EXACT = dict(abs=1e-12)


# ---------------------------------------------------------------------------------------------- normalisation, EM, F1

@pytest.mark.parametrize("raw, expected", [
    ("The Reds", "reds"),
    ("  Barack   OBAMA!! ", "barack obama"),
    ("U.S. Army", "us army"),
    ("a cat and an owl, the end.", "cat and owl end"),
    ("Theresa May", "theresa may"),          # "the" only as a whole word
    ("Anne of the Andes", "anne of andes"),  # "an" inside "Anne"/"Andes" stays
    ("Rock-'n'-Roll", "rocknroll"),          # punctuation is deleted, not replaced by a space
    ("", ""),
    ("the", ""),
])
def test_normalize_answer(raw, expected):
    assert normalize_answer(raw) == expected


def test_exact_match_articles_punctuation_case():
    assert exact_match("the Reds", ["Reds"]) == 1.0
    assert exact_match("Reds", ["the Reds"]) == 1.0
    assert exact_match("REDS.", ["reds"]) == 1.0
    assert exact_match("Red", ["Reds"]) == 0.0
    assert exact_match("New York City", ["New York"]) == 0.0


def test_exact_match_is_max_over_answers_and_accepts_one_string():
    assert exact_match("Obama", ["Trump", "obama", "Biden"]) == 1.0
    assert exact_match("Clinton", ["Trump", "obama", "Biden"]) == 0.0
    assert exact_match("Obama", "Obama") == 1.0  # a single gold answer as a str, not split into characters
    assert exact_match(b"Obama", (b"obama",)) == 1.0


def test_token_f1_partial_overlap_by_hand():
    # P = 2/3, R = 2/2 -> F1 = 2 * (2/3) / (5/3) = 0.8
    assert token_f1("New York City", ["New York"]) == pytest.approx(0.8, **EXACT)
    # P = 1/1, R = 1/3 -> F1 = 2 * (1/3) / (4/3) = 0.5
    assert token_f1("York", ["New York City"]) == pytest.approx(0.5, **EXACT)
    # articles and punctuation do not count as tokens: "the new york times" -> [new, york, times]
    assert token_f1("The New York Times!", ["new york"]) == pytest.approx(0.8, **EXACT)
    assert token_f1("Paris", ["London"]) == 0.0


def test_token_f1_counts_repeated_tokens_as_a_multiset():
    # pred [x x y], gold [x y y]: overlap = min(2,1) + min(1,2) = 2 -> P = R = 2/3 -> F1 = 2/3
    assert token_f1("x x y", ["x y y"]) == pytest.approx(2 / 3, **EXACT)


def test_token_f1_max_over_answers():
    # vs "New York": 0.8; vs "New York City": 1.0; vs "NYC": 0
    assert token_f1("New York City", ["New York", "NYC"]) == pytest.approx(0.8, **EXACT)
    assert token_f1("New York City", ["New York", "new york city", "NYC"]) == 1.0


def test_empty_strings_score_f1_zero_as_squad_does():
    """SQuAD v1.1's script (and T5's qa_utils): F1 counts overlapping tokens, so an empty normalised prediction or
    answer scores 0, even against an empty one; exact match compares the normalised strings, so "" matches ""."""
    assert exact_match("", [""]) == 1.0
    assert token_f1("", [""]) == 0.0
    assert token_f1("the", ["."]) == 0.0  # both normalise to nothing
    assert exact_match("the", ["."]) == 1.0
    assert token_f1("", ["Reds"]) == 0.0
    assert token_f1("Reds", [""]) == 0.0
    assert exact_match("", ["Reds"]) == 0.0
    assert token_f1("", ["Reds", ""]) == 0.0
    assert token_f1("Reds", ["", "the reds"]) == 1.0  # the max over answers


def test_no_gold_answers_is_an_error():
    with pytest.raises(ValueError, match="no gold answers"):
        exact_match("x", [])
    with pytest.raises(ValueError, match="no gold answers"):
        token_f1("x", np.array([], dtype=object))


# ------------------------------------------------------------------------------------------------- sentinel stripping

@pytest.mark.parametrize("raw, expected", [
    ("<extra_id_0> Barack Obama <extra_id_1>", "Barack Obama"),
    ("<extra_id_0>Barack Obama", "Barack Obama"),
    ("  <extra_id_0>  Barack Obama  ", "Barack Obama"),
    ("<extra_id_0> A <extra_id_1> B <extra_id_2>", "A"),
    ("<extra_id_0> Reds <extra_id_12> junk", "Reds"),
    ("junk <extra_id_0> Reds <extra_id_1>", "Reds"),
    ("<extra_id_0><extra_id_1>", ""),
    ("<extra_id_0>", ""),
    ("  Barack Obama \n", "Barack Obama"),
    ("", ""),
    ("Obama <extra_id_1> rest", "Obama"),          # no <extra_id_0>: the first non-empty piece
    ("<extra_id_3> Obama <extra_id_4>", "Obama"),
    ("<extra_id_10> x", "x"),                      # <extra_id_10> is not <extra_id_0> followed by "0>"
    (b"<extra_id_0> Z\xc3\xbcrich <extra_id_1>", "Z\u00fcrich"),
])
def test_strip_sentinels(raw, expected):
    assert strip_sentinels(raw) == expected


# ------------------------------------------------------------------------------------------------------- aggregation

PREDICTIONS = ["Reds", "New York City", "Paris", "Barack Obama", ""]
ANSWERS = [["the Reds"], ["New York"], ["London"], ["Donald Trump", "barack obama."], [""]]
YEARS = [2014, 2014, 2018, 2019, 2016]
# per example: EM 1, 0, 0, 1, 1   F1 1, 0.8, 0, 1, 0 (an empty answer: EM 1, F1 0, as SQuAD v1.1)


def test_qa_scores_overall_only():
    out = qa_scores(PREDICTIONS, ANSWERS)
    assert set(out) == {"em", "f1", "count"}
    assert out["count"] == 5
    assert out["em"] == pytest.approx(60.0, **EXACT)   # 3 / 5
    assert out["f1"] == pytest.approx(56.0, **EXACT)   # 2.8 / 5


def test_qa_scores_per_year_and_slice():
    out = qa_scores(PREDICTIONS, ANSWERS, YEARS, seen_years=[2014, 2018], future_years={2019, 2020})
    expected = {
        "em": 60.0, "f1": 56.0, "count": 5,
        "em_2014": 50.0, "f1_2014": 90.0, "count_2014": 2,
        "em_2016": 100.0, "f1_2016": 0.0, "count_2016": 1,
        "em_2018": 0.0, "f1_2018": 0.0, "count_2018": 1,
        "em_2019": 100.0, "f1_2019": 100.0, "count_2019": 1,
        "seen_em": 100 / 3, "seen_f1": 60.0, "seen_count": 3,   # (1+0+0)/3, (1+0.8+0)/3
        "future_em": 100.0, "future_f1": 100.0, "future_count": 1,
    }
    assert set(out) == set(expected)  # 2016 is in neither slice; 2020 has no examples and so no per-year key
    for key, value in expected.items():
        assert out[key] == pytest.approx(value, **EXACT), key
    assert all(isinstance(v, float) for v in out.values())


def test_qa_scores_empty_slice_reports_only_its_count():
    out = qa_scores(PREDICTIONS, ANSWERS, YEARS, seen_years=[2014], future_years=[2030])
    assert out["future_count"] == 0
    assert "future_em" not in out and "future_f1" not in out
    assert out["seen_count"] == 2 and out["seen_f1"] == pytest.approx(90.0, **EXACT)


def test_qa_scores_years_as_numpy_and_none():
    years = [np.int64(2014), np.array(2014), None, 2019, None]
    out = qa_scores(PREDICTIONS, ANSWERS, years)
    assert out["count"] == 5 and out["count_2014"] == 2 and out["count_2019"] == 1
    assert not any(k.endswith(("_2016", "_2018")) for k in out)


def test_qa_scores_input_errors():
    with pytest.raises(ValueError, match="2 predictions but 1 answer"):
        qa_scores(["a", "b"], [["a"]])
    with pytest.raises(ValueError, match="years"):
        qa_scores(["a"], [["a"]], [2014, 2015])
    with pytest.raises(ValueError, match="years="):
        qa_scores(["a"], [["a"]], seen_years=[2014])


def test_qa_scores_no_examples():
    assert qa_scores([], []) == {"count": 0.0}


# -------------------------------------------------------------------------------------------------------- perplexity

def test_perplexity_by_year_by_hand():
    # 2014: (4 + 6) / (2 + 3) = 2.0 -> e^2; 2015: 3 / 3 = 1.0 -> e^1; overall 13 / 8
    out = perplexity_by_year([4.0, 6.0, 3.0], [2, 3, 3], [2014, 2014, 2015])
    assert out["ppl_2014"] == pytest.approx(math.exp(2.0), rel=1e-12)
    assert out["ppl_2015"] == pytest.approx(math.e, rel=1e-12)
    assert out["ppl"] == pytest.approx(math.exp(13 / 8), rel=1e-12)
    assert out["tokens"] == 8 and out["tokens_2014"] == 5 and out["tokens_2015"] == 3
    assert set(out) == {"ppl", "tokens", "ppl_2014", "tokens_2014", "ppl_2015", "tokens_2015"}


def test_perplexity_weighs_by_tokens_not_examples():
    # per-example ppl e^1 and e^3; token-weighted: (1*1 + 3*3) / (1 + 3) = 2.5, not the mean exponent 2
    out = perplexity_by_year([1.0, 9.0], [1, 3])
    assert out == {"ppl": pytest.approx(math.exp(2.5), rel=1e-12), "tokens": 4.0}


def test_perplexity_edge_cases():
    assert perplexity_by_year([0.0], [5])["ppl"] == 1.0
    assert perplexity_by_year([1e6], [1])["ppl"] == math.inf
    out = perplexity_by_year([2.0, 0.0], [1, 0], [2014, 2015])
    assert out["tokens_2015"] == 0 and "ppl_2015" not in out
    with pytest.raises(ValueError, match="zero tokens"):
        perplexity_by_year([1.0], [0])
    with pytest.raises(ValueError, match="non-negative"):
        perplexity_by_year([1.0, 1.0], [2, -1])
    with pytest.raises(ValueError, match="one per example"):
        perplexity_by_year([1.0, 1.0], [2])


# ------------------------------------------------------------------------------------------------------- SeqIO glue

def _templama_example(answers, year, pretokenized=b"<extra_id_0> Reds"):
    # What tfds.as_numpy yields for a TempLAMA task example: bytes, object arrays of bytes, numpy scalars.
    return {
        "inputs_pretokenized": b"year: 2014 Joey Votto plays for _X_.",
        "targets_pretokenized": pretokenized,
        "answers": np.array(answers, dtype=object),
        "year": np.int64(year),
        "targets": np.array([5, 6, 1], dtype=np.int32),
    }


def test_qa_postprocessor_targets_and_predictions():
    ex = _templama_example([b"Cincinnati Reds", "Reds", b"Z\xc3\xbcrich"], 2014)
    target = qa_postprocessor("<extra_id_0> Reds", example=ex, is_target=True)
    assert target == {"answers": ["Cincinnati Reds", "Reds", "Z\u00fcrich"], "year": 2014}
    assert type(target["year"]) is int and all(type(a) is str for a in target["answers"])
    assert qa_postprocessor(b"<extra_id_0> the Reds <extra_id_1>", example=ex) == "the Reds"
    assert qa_postprocessor("<extra_id_0> Reds", is_target=False) == "Reds"


def test_qa_postprocessor_target_fallbacks():
    # One answer as a 0-d bytes array; no year feature; no answers feature (the target text is the answer).
    assert qa_postprocessor("x", {"answers": np.array(b"Reds", dtype=object), "year": np.array(2019)},
                            is_target=True) == {"answers": ["Reds"], "year": 2019}
    assert qa_postprocessor("<extra_id_0> Reds <extra_id_1>", {}, is_target=True) == {"answers": ["Reds"],
                                                                                       "year": None}


def test_qa_metric_fn_end_to_end():
    examples = [_templama_example([b"the Reds"], 2014), _templama_example([b"New York"], 2014),
                _templama_example([b"London"], 2018), _templama_example([b"Donald Trump", b"barack obama."], 2019)]
    outputs = [b"<extra_id_0> Reds <extra_id_1>", "<extra_id_0> New York City", "Paris", "<extra_id_0>Barack Obama"]
    targets = [qa_postprocessor("ignored", example=ex, is_target=True) for ex in examples]
    predictions = [qa_postprocessor(o, example=ex) for o, ex in zip(outputs, examples)]
    metric = make_qa_metric_fn(seen_years=range(2010, 2019), future_years=[2019])(targets, predictions)
    assert metric["em"] == pytest.approx(50.0, **EXACT)
    assert metric["f1"] == pytest.approx(70.0, **EXACT)
    assert metric["f1_2014"] == pytest.approx(90.0, **EXACT)
    assert metric["seen_count"] == 3 and metric["seen_f1"] == pytest.approx(60.0, **EXACT)
    assert metric["future_em"] == 100.0
    # Without years on any target there are only overall keys.
    no_year = [{"answers": t["answers"], "year": None} for t in targets]
    assert set(make_qa_metric_fn()(no_year, predictions)) == {"em", "f1", "count"}
    with pytest.raises(ValueError, match="no target carries a year"):
        make_qa_metric_fn(seen_years=[2014])(no_year, predictions)


def test_ppl_postprocessor_counts_non_padding_ids():
    ex = {"targets": np.array([17, 23, 5, 1, 0, 0, 0], dtype=np.int32), "year": np.int64(2016)}
    assert ppl_postprocessor("decoded text", example=ex, is_target=True) == {"year": 2016, "num_tokens": 4}
    assert ppl_postprocessor("decoded text", example=ex, is_target=False) == "decoded text"
    with pytest.raises(ValueError, match="targets"):
        ppl_postprocessor("x", example={"year": 2016}, is_target=True)


def test_perplexity_metric_fn_from_scores():
    examples = [{"targets": np.array([9, 1, 0], np.int32), "year": np.int64(2014)},
                {"targets": np.array([9, 8, 1], np.int32), "year": np.int64(2014)},
                {"targets": np.array([7, 7, 1], np.int32), "year": np.int64(2015)}]
    targets = [ppl_postprocessor("", example=ex, is_target=True) for ex in examples]
    scores = np.array([-4.0, -6.0, -3.0], dtype=np.float32)  # log-likelihood sums: NLL = -score
    out = make_perplexity_metric_fn()(targets, scores)
    assert out["ppl_2014"] == pytest.approx(math.exp(2.0), rel=1e-12)
    assert out["ppl_2015"] == pytest.approx(math.exp(1.0), rel=1e-12)
    assert out["ppl"] == pytest.approx(math.exp(13 / 8), rel=1e-12)
    # Per-token score arrays are summed per example.
    per_token = [np.array([-1.0, -3.0]), np.array([-2.0, -2.0, -2.0]), np.array([-1.0, -1.0, -1.0])]
    assert make_perplexity_metric_fn()(targets, per_token)["ppl_2014"] == pytest.approx(math.exp(2.0), rel=1e-12)


def test_metric_fns_through_seqio_legacy_metric():
    """SeqIO classifies the metric fns by signature and feeds them postprocessed targets/predictions/scores."""
    seqio_metrics = pytest.importorskip("seqio.metrics")
    pieces = {3: "<extra_id_0>", 4: "the", 5: "Reds", 6: "<extra_id_1>", 7: "Paris", 8: "year"}

    class TinyVocab:
        def decode(self, ids):
            return " ".join(pieces[int(i)] for i in ids if int(i) > 1)

    features = {"targets": types.SimpleNamespace(vocabulary=TinyVocab())}
    inputs = [_templama_example([b"Reds", b"Cincinnati Reds"], 2014),
              _templama_example([b"London"], 2019)]

    qa = seqio_metrics.LegacyMetric.empty(make_qa_metric_fn([2014], [2019]), qa_postprocessor)
    assert qa.model_output_type == seqio_metrics.ModelOutputType.PREDICTION
    model_output = np.array([[3, 4, 5, 6, 1], [3, 7, 6, 1, 0]], dtype=np.int32)
    result = qa.from_model_output(inputs, model_output, features).compute()
    assert result["em"] == 50.0 and result["seen_em"] == 100.0 and result["future_f1"] == 0.0

    ppl = seqio_metrics.LegacyMetric.empty(make_perplexity_metric_fn(), ppl_postprocessor)
    assert ppl.model_output_type == seqio_metrics.ModelOutputType.SCORE
    inputs = [{"targets": np.array([5, 7, 1], np.int32), "year": np.int64(2014)},
              {"targets": np.array([8, 1], np.int32), "year": np.int64(2015)}]
    result = ppl.from_model_output(inputs, np.array([-6.0, -2.0]), features).compute()
    assert result["ppl_2014"] == pytest.approx(math.exp(2.0), rel=1e-12)
    assert result["ppl_2015"] == pytest.approx(math.exp(1.0), rel=1e-12)
    assert result["ppl"] == pytest.approx(math.exp(8 / 5), rel=1e-12)
