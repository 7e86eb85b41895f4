"""The TEMPLM_* environment is read in one place (templm/settings.py) into a Settings object that callers pass down:
each variable's value read and checked, a bad one named, the object winning over the process's environment where
it is passed, and the command line reading it once per call."""

import pytest

from templm import tasks
from templm.errors import ConfigError, DataError
from templm.settings import VARIABLES, Settings, default_cache_dir
from templm_testing import run_templm


def test_every_variable_is_read_and_checked():
    environ = {"TEMPLM_DATA_DIR": "/d", "TEMPLM_VOCABULARY": "/v.model", "TEMPLM_EXTRA_IDS": "0",
               "TEMPLM_TRAIN_YEARS": "2010-2012,2015", "TEMPLM_CRONQUESTIONS_DIR": "/c", "TEMPLM_CACHE": "/cache"}
    assert set(environ) == set(VARIABLES.values())
    assert Settings.from_environment(environ) == Settings(data_dir="/d", vocabulary="/v.model", extra_ids=0,
                                                          train_years=(2010, 2011, 2012, 2015), cronquestions_dir="/c",
                                                          cache_dir="/cache")
    empty = Settings.from_environment({name: "" for name in environ})  # an empty variable is an unset one
    assert empty == Settings() and empty.cache_dir == default_cache_dir()
    for variable, value in [("TEMPLM_EXTRA_IDS", "many"), ("TEMPLM_EXTRA_IDS", "-1"),
                            ("TEMPLM_TRAIN_YEARS", "twenty")]:
        with pytest.raises(ConfigError, match=f"^{variable}: expected .* got '{value}'"):
            Settings.from_environment({variable: value})


def test_the_settings_passed_win_over_the_process_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("TEMPLM_DATA_DIR", str(tmp_path / "from_the_environment"))
    passed = tmp_path / "passed"
    passed.mkdir()
    try:
        with pytest.raises(DataError, match="TEMPLM_DATA_DIR names a folder without task data") as error:
            tasks.configure(settings=Settings(data_dir=str(passed)))
        assert error.value.path == str(passed)
        with pytest.raises(DataError, match="TEMPLM_DATA_DIR names no folder") as error:  # without an object: read now
            tasks.configure()
        assert error.value.path == str(tmp_path / "from_the_environment")
    finally:
        monkeypatch.delenv("TEMPLM_DATA_DIR")
        tasks.configure()


def test_the_command_line_names_a_bad_variable_before_any_work(tmp_path):
    out = tmp_path / "world"
    result = run_templm("data", "world", f"--out={out}", "--start_year=2014", "--end_year=2015",
                        env={"TEMPLM_TRAIN_YEARS": "last year"})
    assert result.returncode == 1
    assert result.stderr.strip() == ("templm data world: error: TEMPLM_TRAIN_YEARS: expected years such as 2010-2018 "
                                     "or 2010,2012, got 'last year'")
    assert not out.exists()
