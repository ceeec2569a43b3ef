"""scripts/time_command.py: the load a quoted time was measured at is sampled *while* the command runs (a mutant that
samples only before and after misses it), the command's exit status and CPU time come through, and the line names
the load range. No wall-clock assertion: the child waits on a file the fake load reading creates."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _module():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("time_command", ROOT / "scripts" / "time_command.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["time_command"] = module  # a dataclass looks its module up
    spec.loader.exec_module(module)
    return module


def _child(started: Path, release: Path) -> list[str]:
    """A command that says it started, then waits until the release file appears (an event, not a sleep length)."""
    code = (f"import pathlib, time\npathlib.Path({str(started)!r}).touch()\n"
            f"while not pathlib.Path({str(release)!r}).exists():\n    time.sleep(0.01)\n")
    return [sys.executable, "-c", code]


def _fake_load(started: Path, release: Path):  # type: ignore[no-untyped-def]
    """1.0 until the child has started; then 9.0 once, and the child is let go."""
    def load() -> float:
        if started.exists() and not release.exists():
            release.touch()
            return 9.0
        return 1.0
    return load


def test_the_load_is_sampled_while_the_command_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tc = _module()
    started, release = tmp_path / "started", tmp_path / "release"
    monkeypatch.setattr(tc, "load_average", _fake_load(started, release))
    t = tc.time_command(_child(started, release), label="child", period_s=0.01)
    assert (t.load_min, t.load_max, t.returncode) == (1.0, 9.0, 0)
    assert "load 1.0–9.0" in tc.line(t) and t.command == "child"


def test_a_timer_that_reads_the_load_only_at_the_ends_misses_it(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The mutant: the same timer with no sample between the ends (period of an hour). The child is let go by the
    test's own thread reading the load mid-run; the timer, reading only at the ends, never sees the 9.0 — so the
    test above, which finds it, can fail."""
    tc = _module()
    started, release = tmp_path / "started", tmp_path / "release"
    seen_mid_run = _fake_load(started, release)
    monkeypatch.setattr(tc, "load_average", seen_mid_run)  # 9.0 to any read made mid-run, 1.0 at the ends
    import threading

    def releaser() -> None:
        while not started.exists():
            threading.Event().wait(0.01)
        seen_mid_run()

    thread = threading.Thread(target=releaser)
    thread.start()
    t = tc.time_command(_child(started, release), period_s=3600.0)  # no sample between the ends
    thread.join()
    assert t.load_max == 1.0


def test_exit_status_cpu_time_and_bad_input(tmp_path: Path) -> None:
    tc = _module()
    burn = [sys.executable, "-c", "import sys\nx = 0\nfor i in range(3_000_000):\n    x += i\nsys.exit(3)"]
    t = tc.time_command(burn)
    assert t.returncode == 3 and t.cpu_s > 0 and t.peak_rss_mib > 0
    assert "exit status 3" in tc.line(t)
    with pytest.raises(ValueError, match="command: empty"):
        tc.time_command([])
    assert tc.clock(12.34) == "12.3 s" and tc.clock(75.4) == "1 min 15 s" and tc.clock(3725) == "1 h 2 min"
