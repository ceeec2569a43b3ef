"""``scripts/signal_race.py`` (the measurement behind :mod:`phalanx.waits`) runs and prints its two lines."""

from __future__ import annotations

import re

import pytest

from _scripts import load_script


def test_the_script_prints_how_many_signals_each_wait_saw_late(capsys: pytest.CaptureFixture[str]) -> None:
    script = load_script("scripts/signal_race.py", "signal_race")
    script.main(["--tries", "3", "--hold", "0.3"])
    lines = capsys.readouterr().out.splitlines()
    assert [re.sub(r"\d+ of", "N of", line) for line in lines] == [
        "Event.wait: N of 3 signals late", "phalanx.waits.wait_event: N of 3 signals late"]
    with pytest.raises(SystemExit):
        script.main(["--tries", "0"])
