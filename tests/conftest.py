"""Shared test settings."""

from __future__ import annotations

import importlib
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
# `make test` runs two pytest workers on a machine of two cores or more (pytest-xdist): each takes its share of the
# cores, so that two workers' OpenMP teams do not wait on each other's descheduled threads. A test that needs more
# threads sets them itself.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
torch.set_num_threads(max(1, min(2, torch.get_num_threads() // _WORKERS)))
# The CLI honours COLUMNS (phalanx.cli.common._console), and the assertions on its output read unwrapped lines:
# pytest-xdist's workers set COLUMNS=80, and so may a developer's shell. Subprocesses inherit its absence.
os.environ.pop("COLUMNS", None)
# Typer reads TERMINAL_WIDTH once, when typer.rich_utils is first imported: a test that sets it for one invocation
# (tests/test_cli_consistency.py) must not fix every later --help's width in its process. Imported here, unset.
os.environ.pop("TERMINAL_WIDTH", None)
importlib.import_module("typer.rich_utils")
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


# Files whose tests start real processes (torchrun jobs, Flower federations, killed and resumed sweeps), the longest
# first: pytest-xdist hands whole files to its workers in collection order (`--dist loadfile --no-loadscope-reorder`:
# without it, xdist orders the files by their number of tests, which put these last), so these start first
# and the short files fill in around them, instead of one long file running alone at the end. Order only: a file
# missing here runs after them, and a stale entry changes nothing else.
LONG_FILES = (
    "test_distributed.py", "test_fault_campaign.py", "test_distributed_mesh.py", "test_stage_reports_engines.py",
    "test_distributed_sealed.py", "test_distributed_availability.py", "test_flower_federation.py", "test_records.py",
    "test_extending.py", "test_async_resume.py", "test_async_processes.py", "test_distributed_gossip.py",
    "test_own_algorithm.py", "test_tension_paper.py", "test_metric_rows.py", "test_async_attacks.py",
    "test_slurm.py", "test_sweep_kill.py", "test_user_errors.py", "test_async_zero_step.py", "test_async_audit.py",
    "test_distributed_lora.py", "test_stage_reports.py", "test_lora_study.py", "test_federated_benchmark_smoke.py",
    "test_async_process_filters.py", "test_flower.py", "test_flower_byzantine.py", "test_gpu_benchmark.py",
    "test_clone_folder.py", "test_update_clip.py", "test_lora_benchmark_smoke.py",
    "test_distributed_benchmark_smoke.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist, the files of ``LONG_FILES`` first, in its order; every other file after them, in pytest's
    order. Each file's tests keep their own order (a module's fixture is built once, on one worker)."""
    if _WORKERS <= 1 and not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    rank = {name: i for i, name in enumerate(LONG_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(LONG_FILES)))
