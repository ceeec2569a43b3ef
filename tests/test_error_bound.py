"""A one-line error repeats at most :data:`phalanx.errors.SHOWN_CHARACTERS` of the bad value: whatever a config, a
flag or a peer sends, the line that refuses it is bounded (a 5,000-character title made a 5,063-byte line)."""

from __future__ import annotations

import pytest

from phalanx import errors
from phalanx.errors import ConfigError
from phalanx.experiments import make_config


def test_a_huge_bad_value_is_refused_in_a_bounded_line() -> None:
    with pytest.raises(ConfigError) as caught:
        make_config({"dataset": "digits", "aggregator": "x" * 5000})
    line = str(caught.value)
    assert "\n" not in line and len(line) < 2 * errors.SHOWN_CHARACTERS + 400 and "aggregator" in line
    assert "(5,002 characters)" in line  # says how long the value was


def test_a_short_value_is_shown_whole_and_the_mutant_repeats_any_length(monkeypatch: pytest.MonkeyPatch) -> None:
    assert str(ConfigError("f", -1, "an integer ≥ 0")) == "f=-1 is invalid: allowed an integer ≥ 0"
    monkeypatch.setattr(errors, "shown", repr)  # the mutant: the value repeated whole, as before
    assert len(str(ConfigError("title", "y" * 5000, "at most 200 characters"))) > 5000
