"""Shared test settings."""

from __future__ import annotations

import os

import pytest
import torch
from hypothesis import HealthCheck, settings

settings.register_profile(
    "phalanx", deadline=None, max_examples=60, suppress_health_check=[HealthCheck.too_slow],
)
# CI replays a fixed set of examples (no flaky landings); local runs explore new ones each time.
settings.register_profile(
    "ci", deadline=None, max_examples=60, derandomize=True, suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "phalanx"))
torch.set_num_threads(min(2, torch.get_num_threads()))
# No grid times its first rounds to estimate its length (tests/test_estimate.py turns it on where it is tested).
os.environ.setdefault("PHALANX_BUDGET_MINUTES", "off")
# `phalanx run` keeps torch's own thread count here, as before it chose one (tests/test_threads_choice.py turns the
# choice on where it is tested): no test measures the machine or writes to the user's cache.
os.environ.setdefault("PHALANX_THREADS", "torch")


@pytest.fixture
def built_ins_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Installed plug-ins ignored (``PHALANX_NO_PLUGINS``, :mod:`phalanx.plugins`) for a test that compares what
    Phalanx itself declares with what it builds: with a plug-in on the path those listings rightly hold one more
    name."""
    monkeypatch.setenv("PHALANX_NO_PLUGINS", "1")
