"""The regimes table (templm/data/regimes.py): the one place the Temporal prefix is written, and the SeqIO
registry's TensorFlow prefix gives the same text as the table's Python one."""

import pytest

from templm.data import regimes


def test_the_table_gives_each_regime_its_inputs():
    assert regimes.ORDER == ("uniform", "yearly", "temporal") and regimes.SHARED_MODEL == ("uniform", "temporal")
    temporal, uniform, yearly = (regimes.regime(n) for n in ("temporal", "uniform", "yearly"))
    assert temporal.model_input(2014, "X plays for <extra_id_0>.") == "year: 2014 X plays for <extra_id_0>."
    assert uniform.model_input(2014, "X plays for <extra_id_0>.") == "X plays for <extra_id_0>."
    assert uniform.probe_input(2019, "X plays for <extra_id_0>.") == "In 2019, X plays for <extra_id_0>."
    assert temporal.probe_input(2019, "q") == "year: 2019 q" and yearly.per_year and not yearly.year_prefix
    assert [regimes.label(n) for n in regimes.ORDER] == ["Uniform", "Yearly", "Temporal"]
    assert regimes.label("retrain") == "Retrain"
    with pytest.raises(ValueError, match="regime must be one of uniform, yearly, temporal"):
        regimes.regime("monthly")


def test_the_registry_prefixes_as_the_table_does():
    import tensorflow as tf

    from templm.tasks.registry import add_year_prefix

    data = tf.data.Dataset.from_tensor_slices({"inputs": ["A is the chair of <extra_id_0>.", "B works for"],
                                               "year": [2017, 1999]})
    got = [ex["inputs"].decode("utf-8") for ex in add_year_prefix(data).as_numpy_iterator()]
    assert got == [regimes.regime("temporal").model_input(2017, "A is the chair of <extra_id_0>."),
                   regimes.regime("temporal").model_input(1999, "B works for")]
