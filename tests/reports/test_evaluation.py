"""What `templm eval` says about the examples it scored: with --num_examples it takes each task's first N examples,
which come in year order, so it names the years and the slice it left out (a future_f1 that came out empty without
a word)."""

from templm.metrics import qa
from templm.reports.evaluation import subset_notes


def _metrics(years, seen, future):
    targets = [{"answers": ["Kora United"], "year": y} for y in years]
    return qa.make_qa_metric_fn(seen, future)(targets, ["Kora United", "Lima", "Kora United"][:len(years)])


def test_num_examples_names_the_years_and_the_slice_it_left_out():
    first_three = {"templama_temporal": _metrics([2013, 2013, 2014], seen=[2013, 2014, 2015], future=[2016])}
    assert first_three["templama_temporal"]["future_count"] == 0
    assert subset_notes(first_three, 3, years=[2013, 2014, 2015, 2016]) == [
        "templama_temporal: --num_examples 3 scored the split's first 3 examples, which come in year order: years "
        "2013-2014 only, none of 2015, 2016; its future slice is empty (future_f1 has no value). Leave "
        "--num_examples unset to score every year"]
    # Every year scored, or no --num_examples: nothing to say; a task without years (CronQuestions) neither.
    every = {"templama_temporal": _metrics([2013, 2014, 2016], seen=[2013, 2014], future=[2016])}
    assert subset_notes(every, 3, years=[2013, 2014, 2016]) == []
    assert subset_notes(first_three, None, years=[2013, 2014, 2015, 2016]) == []
    no_years = {"cronquestions": qa.make_qa_metric_fn()([{"answers": ["1992"], "year": None}], ["1992"])}
    assert subset_notes(no_years, 1, years=[2013]) == []
