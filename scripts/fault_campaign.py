"""Fault campaign: SIGKILL ``phalanx run`` and ``phalanx sweep`` at many points, resume, and check that nothing is
lost and nothing is done twice.

    .venv/bin/python scripts/fault_campaign.py [--points 50] [--seed 0] [--out DIR] [--keep]

A small, fast config — the 64-unit MLP on the built-in digits, 6 workers (one sends sign-flipped vectors), 60 rounds,
a checkpoint every 2 — and a grid of it (2 rules × 2 seeds: 4 runs) run once uninterrupted as the reference, each
command through ``scripts/_fault_harness.py`` (the ``phalanx`` command line with its writes watched). Then every
*case* starts from an empty directory, SIGKILLs the command at one or more points (each is a *kill point*), runs the
same command again until one run of it is not killed, and compares the result with the reference. Families:

* ``a-run`` — ``phalanx run CONFIG``, killed after a random delay (a seeded RNG), uniform between the moment the
  reference wrote into its run directory first and the reference's end;
* ``b-sweep-parent`` — ``phalanx sweep GRID --jobs 2``, its own process killed at a random time (drawn the same way):
  every process it started must end with it (each worker watches its parent), which is waited for, process by
  process;
* ``b-sweep-worker`` — one worker process of the same sweep killed at a random time (once it is inside a run);
* ``c-targeted`` — ``phalanx run CONFIG --set rounds=4`` killed by itself at one *write point* of its reference (see
  ``scripts/_fault_harness.py``): a temporary file torn in the middle of its write (the checkpoint, the metrics, the
  Parquet file, the manifest, ``DONE``), or complete (and recorded in the manifest) just before its rename — every
  write point of the reference's run directory in turn, no hook in Phalanx itself (the harness wraps ``os.replace``,
  ``os.fsync`` and the writer functions of ``phalanx.experiments.store``).

A random case of every third is killed twice (the resumed command killed again). A kill that comes after the command
has ended is a valid point too, reported as ``finished before kill``.

What each case checks, against the reference (parsed content where a file embeds anything that differs from run to
run; the bytes are compared too, and reported, not required):

* the same run directories, each with ``DONE`` and the same files (``*.tmp`` files a SIGKILL leaves in the middle of
  an atomic write are counted and reported: nothing reads them);
* ``metrics.jsonl``: the same rows, bit for bit (floats compared by their bits), each round exactly once;
* ``metrics.parquet``: the same columns, types and rows (read with DuckDB);
* ``checkpoint.safetensors``: the same metadata (round, rows) and tensors, bit for bit — the final model ``theta``, the
  worker momentum, the random streams (``rng.*``) and the server optimizer's state (its bytes differ from run to run:
  safetensors writes the metadata map in a random order per process); its provenance record (one segment per
  session, so it differs from the reference's after a kill) names the run, starts fresh, is contiguous and ends at
  the checkpoint and rows on disk (``phalanx.experiments.provenance.check_recorded``);
* ``config.json``: the same JSON; ``manifest.json``: records every file with the SHA-256 it has now, and
  ``phalanx.experiments.store.verify`` passes (``DONE`` and the manifest hold a time stamp: not compared);
* nothing done twice, from the events the harness logs: no checkpoint round installed twice, every resume starts
  from the last installed checkpoint (nothing lost), a run finished at most once, and a finished run untouched by
  every later command (its files keep their inode, size and modification time; no checkpoint or finish written);
* no process of a command outlives it (found by an environment tag, waited for with ``pidfd``s, not by sleeping);
* ``phalanx report`` on the result exits 0 and writes ``report.md``.

The command prints one line per kill point (family, where, outcome, verdict) and a summary; it exits 1 if any point
failed. Nothing is left behind unless ``--keep``.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import random
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling module of checks, run as a script
from _fault_checks import (
    check_events,
    check_report,
    compare,
    describe,
    done_files,
    read_log,
    state_at,
    untouched,
)

HARNESS = Path(__file__).resolve().with_name("_fault_harness.py")

CONFIG = """\
dataset = "digits"
model = "mlp"
workers = 6
byzantine = 1
f = 1
aggregator = "cwtm"
attack = "signflip"
rounds = 60
batch_size = 8
eval_every = 2
checkpoint_every = 2
seed = 0
"""
"""The config of ``phalanx run`` (families a and c): the MLP (64 hidden units) on the built-in digits, 6 workers
(one sends sign-flipped vectors), a checkpoint every 2 rounds."""

SHORT_ROUNDS = 4
"""The targeted family runs the config with ``--set rounds=4``: 2 checkpoints, 40 write points in all."""

GRID = CONFIG.replace('aggregator = "cwtm"', 'aggregator = ["cwtm", "cwmed"]').replace("seed = 0", "seed = [0, 1]")
"""The grid of ``phalanx sweep --jobs 2`` (family b): the config with 2 rules × 2 seeds (4 runs)."""

FAMILIES = ("a-run", "b-sweep-parent", "b-sweep-worker", "c-targeted")
COMMANDS = {"a-run": "run", "b-sweep-parent": "sweep", "b-sweep-worker": "sweep", "c-targeted": "run-short"}
TIMEOUT = 300.0  # seconds one command may take (the reference takes a few)
EXIT_WAIT = 60.0  # seconds the processes of a killed command have to end


# ---------------------------------------------------------------------------------------------------------------- plan
@dataclass
class Kill:
    """One kill point of a family (:data:`FAMILIES`): ``spec`` for a targeted one (the harness's
    ``PHALANX_FAULT_KILL``), else a delay in seconds after the command started (``b-sweep-worker``: one of its worker
    processes is killed instead of itself)."""

    family: str
    spec: dict[str, Any] | None = None
    delay: float = 0.0
    where: str = ""

    @property
    def worker(self) -> bool:
        return self.family == "b-sweep-worker"


@dataclass
class Case:
    """A fresh output directory, the command killed at ``kills`` in turn (each in the next run of the command), then
    run once more to its end and compared with the reference. The kills of a case are all of ``phalanx run`` (families
    a and c) or all of ``phalanx sweep`` (family b)."""

    number: int
    kills: list[Kill]
    command: str = ""  # run, run-short or sweep (default: the one of the first kill's family)

    def __post_init__(self) -> None:
        if not self.command:
            self.command = COMMANDS[self.kills[0].family]

    @property
    def name(self) -> str:
        return "+".join(dict.fromkeys(k.family for k in self.kills))


@dataclass
class Reference:
    """An uninterrupted run of a command: its output directory, event log, duration, and the moment it first wrote
    a file (seconds after it started)."""

    out: Path
    events: list[dict[str, Any]]
    duration: float
    first_write: float

    @property
    def points(self) -> list[dict[str, Any]]:
        return [e for e in self.events if e["ev"] == "point"]


def allocate(points: int, targets: int) -> dict[str, int]:
    """How many kill points each family gets: the targeted family every write point of the reference when
    ``points`` leaves at least 30 % to the random families, else a share; the random ones 40/30/30, at least 1."""
    if points < 4:
        raise SystemExit(f"error: --points={points} is invalid: allowed at least 4 (one per family)")
    n_random = max(3, round(0.3 * points))
    n_target = min(targets, points - n_random)
    n_random = points - n_target
    a = max(1, round(0.4 * n_random))
    bp = max(1, round(0.3 * n_random))
    bw = max(1, n_random - a - bp)
    a = n_random - bp - bw
    return {"a-run": a, "b-sweep-parent": bp, "b-sweep-worker": bw, "c-targeted": n_target}


def choose_targets(points: list[dict[str, Any]], n: int, rng: random.Random) -> list[dict[str, Any]]:
    """``n`` write points of the reference, in its order: all when they fit; else those inside the run directory
    first (one of each kind — what, which file, which step — before a second of a kind), then the command's own files
    (``grid.json``, the report)."""
    if n >= len(points):
        return list(points)
    ordered: list[dict[str, Any]] = []
    for group in ([p for p in points if p["dir"] != "out"], [p for p in points if p["dir"] == "out"]):
        group = list(group)
        rng.shuffle(group)
        kinds: set[tuple[Any, ...]] = set()
        first: list[dict[str, Any]] = []
        rest: list[dict[str, Any]] = []
        for p in group:
            kind = (p["kind"], p["file"], p["ctx"], p["phase"].split()[0])
            (rest if kind in kinds else first).append(p)
            kinds.add(kind)
        ordered += first + rest
    return sorted(ordered[:n], key=lambda p: p["i"])


def plan(points: int, seed: int, refs: dict[str, Reference]) -> list[Case]:
    """The cases of a campaign of ``points`` kill points (see :func:`allocate`), reproducible from ``seed``; ``refs``:
    the reference of each command."""
    rng = random.Random(seed)
    share = allocate(points, len(refs["run-short"].points))
    cases: list[Case] = []
    for p in choose_targets(refs["run-short"].points, share["c-targeted"], rng):
        cases.append(Case(0, [Kill("c-targeted", spec={"nth": p["i"]}, where=describe(p))]))
    for family in ("a-run", "b-sweep-parent", "b-sweep-worker"):
        ref, left = refs[COMMANDS[family]], share[family]
        for k in itertools.cycle((1, 1, 2)):  # every third case is killed twice
            if left == 0:
                break
            k = min(k, left)
            left -= k
            lo, hi = 0.9 * ref.first_write, ref.duration
            cases.append(Case(0, [Kill(family, delay=rng.uniform(lo, hi)) for _ in range(k)]))
    for number, case in enumerate(cases, 1):
        case.number = number
    return cases


# ------------------------------------------------------------------------------------------------------- processes
def _environ_has(pid: int, needle: bytes) -> bool:
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False
    return needle in env.split(b"\0")


def tagged(tag: str) -> list[int]:
    """The live processes whose environment carries ``PHALANX_FAULT_TAG=tag`` — every process a command started,
    whoever their parent is now."""
    needle = f"PHALANX_FAULT_TAG={tag}".encode()
    return [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit() and _environ_has(int(p.name), needle)]


def wait_gone(pids: list[int], timeout: float) -> list[int]:
    """Wait (on each process's ``pidfd``, not by sleeping) until ``pids`` have ended or ``timeout`` passed; the
    ones still alive."""
    fds: dict[int, int] = {}
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            fds[pid] = os.pidfd_open(pid)
    poller = select.poll()
    for fd in fds.values():
        poller.register(fd, select.POLLIN)
    left = dict(fds)
    deadline = time.monotonic() + timeout
    try:
        while left and time.monotonic() < deadline:
            for fd, _ in poller.poll(max(1, int(1000 * (deadline - time.monotonic())))):
                poller.unregister(fd)
                left = {p: f for p, f in left.items() if f != fd}
    finally:
        for fd in fds.values():
            os.close(fd)
    return sorted(left)


@dataclass
class Outcome:
    """What happened to one run of a command."""

    tag: str
    rc: int | None
    killed: bool
    where: str
    at: float | None = None
    survivors: list[int] = field(default_factory=list)
    stderr: str = ""


class Campaign:
    """The references and the cases of one campaign, under ``work``."""

    def __init__(self, work: Path, seed: int = 0, config: str = CONFIG, grid: str = GRID) -> None:
        self.work = work
        self.seed = seed
        self.rng = random.Random(seed + 1)
        self.config = work / "config.toml"
        self.grid = work / "grid.toml"
        work.mkdir(parents=True, exist_ok=True)
        self.config.write_text(config)
        self.grid.write_text(grid)
        self.refs: dict[str, Reference] = {}
        self._count = itertools.count(1)

    # -- commands
    def argv(self, command: str, out: Path) -> list[str]:
        """``run``: ``phalanx run CONFIG``; ``run-short``: the same with ``--set rounds=4``; ``sweep``: ``phalanx
        sweep GRID --jobs 2`` (each through the harness)."""
        head = [sys.executable, str(HARNESS)]
        if command == "run":
            return [*head, "run", str(self.config), "--out", str(out)]
        if command == "run-short":
            return [*head, "run", str(self.config), "--set", f"rounds={SHORT_ROUNDS}", "--out", str(out)]
        return [*head, "sweep", str(self.grid), "--out", str(out), "--jobs", "2"]

    def start(self, command: str, out: Path, log: Path, spec: dict[str, Any] | None = None,
              ) -> tuple[subprocess.Popen[bytes], str, float, Path]:
        tag = f"fc{os.getpid()}-{next(self._count)}"
        env = {**os.environ, "PHALANX_FAULT_LOG": str(log), "PHALANX_FAULT_TAG": tag, "COLUMNS": "120"}
        env.pop("PHALANX_FAULT_KILL", None)
        env.pop("PHALANX_FORCE", None)
        if spec is not None:
            env["PHALANX_FAULT_KILL"] = json.dumps(spec)
        err = log.with_name(f"{tag}.out")  # what the command printed
        t0 = time.monotonic()
        with open(err, "wb") as fh:
            proc = subprocess.Popen(self.argv(command, out), stdout=fh, stderr=subprocess.STDOUT, env=env)
        return proc, tag, t0, err

    def invoke(self, command: str, out: Path, log: Path, kill: Kill | None = None) -> Outcome:
        """Run the command once; kill it (or one of its workers) as ``kill`` says; wait until it and every process
        it started have ended."""
        proc, tag, t0, err = self.start(command, out, log, kill.spec if kill is not None else None)
        killed, where, at, victim, hung, running = False, "", None, None, False, 0
        try:
            if kill is not None and kill.spec is None:
                try:
                    proc.wait(timeout=kill.delay)
                except subprocess.TimeoutExpired:
                    if kill.worker:
                        victim = self._kill_worker(proc, tag, log)
                        killed = victim is not None
                    else:
                        running = len(tagged(tag))  # the command's processes, each of which must end
                        proc.kill()
                        killed, victim = True, None
                    at = time.monotonic()
            proc.wait(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:  # hung: a failure of the case, not of the campaign
            proc.kill()
            proc.wait()
            hung = True
        except BaseException:  # the campaign itself stopped (Ctrl-C): its command and what it started go too
            proc.kill()
            for pid in tagged(tag):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            raise
        survivors = wait_gone(tagged(tag), EXIT_WAIT)
        for pid in survivors:  # ours: started by this command
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if kill is not None and kill.spec is not None:
            hits = [e for e in read_log(log) if e["ev"] == "kill" and e["tag"] == tag]
            killed, where = bool(hits), describe(hits[0]) if hits else "write point not reached"
        elif killed and at is not None:
            where = state_at(read_log(log), tag, at, victim, command == "sweep")
            if running > 1:
                where += f"; {running} processes: " + (f"{len(survivors)} outlived it" if survivors else "all ended")
        stderr = err.read_text(errors="replace")[-2000:]
        if hung:
            stderr += f"\n(still running after {TIMEOUT:.0f} s: killed)"
        return Outcome(tag, None if hung else proc.returncode, killed, where, None if at is None else at - t0,
                       survivors, stderr)

    def _kill_worker(self, proc: subprocess.Popen[bytes], tag: str, log: Path) -> int | None:
        """SIGKILL one worker process of the sweep ``proc`` that is inside a run (waiting for one to be, unless the
        sweep ends first); its process id."""
        while proc.poll() is None:
            inside = {e["pid"]: e["run"] for e in read_log(log)
                      if e["tag"] == tag and e["pid"] != proc.pid and e["ev"] in ("load", "ckpt-begin", "ckpt-end")}
            alive = sorted(p for p in inside if Path(f"/proc/{p}").exists())
            needle = f"PHALANX_FAULT_TAG={tag}".encode()
            alive = [p for p in alive if _environ_has(p, needle)]  # a process of this sweep, surely
            if alive:
                pid = self.rng.choice(alive)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                    return pid
            try:
                proc.wait(timeout=0.02)  # the sweep ending is the other event waited for
            except subprocess.TimeoutExpired:
                pass
        return None

    # -- references
    def reference(self, command: str) -> Reference:
        """Run ``command`` uninterrupted: the reference of its cases."""
        out, log = self.work / f"ref-{command}" / "out", self.work / f"ref-{command}" / "events.jsonl"
        out.parent.mkdir(parents=True)
        t0 = time.monotonic()
        outcome = self.invoke(command, out, log)
        duration = time.monotonic() - t0
        if outcome.rc != 0:
            raise RuntimeError(f"the reference {command} failed (exit {outcome.rc}): {outcome.stderr}")
        events = read_log(log)
        writes = [e["t"] for e in events if e["ev"] == "point" and e["dir"] != out.name]  # in a run directory
        if not writes or not any(e["ev"] == "ckpt-end" for e in events):
            raise RuntimeError("the harness saw no checkpoint written: phalanx.experiments.store has changed its "
                               "writer functions; update scripts/_fault_harness.py")
        return Reference(out, events, duration, min(writes) - t0)

    def references(self, commands: tuple[str, ...] = ("run", "run-short", "sweep")) -> dict[str, Reference]:
        """The reference of each command."""
        for command in commands:
            self.refs[command] = self.reference(command)
        return self.refs

    # -- cases
    def run_case(self, case: Case) -> CaseResult:
        """Run one case and check it (see the module's docstring)."""
        ref = self.refs[case.command]
        home = self.work / "cases" / f"{case.number:03d}-{case.name}"
        out, log = home / "out", home / "events.jsonl"
        home.mkdir(parents=True)
        result = CaseResult(case)
        for k, kill in enumerate([*case.kills, None], 1):
            before = done_files(out)
            outcome = self.invoke(case.command, out, log, kill)
            result.outcomes.append(outcome)
            if outcome.survivors:
                result.problems.append(f"processes outlived their command: {outcome.survivors}")
            if not outcome.killed and outcome.rc != 0:  # a command that was not killed must succeed
                last = (outcome.stderr.strip().splitlines() or [""])[-1]
                result.problems.append(f"run {k} of the command failed (exit {outcome.rc}): {last}")
            result.problems += untouched(before, done_files(out), read_log(log), outcome.tag)
        if result.outcomes[-1].rc == 0:
            result.problems += compare(ref.out, out, result.info)
            result.problems += check_events(read_log(log))
            result.problems += check_report(out)
        result.info["stray temp files"] = len(list(out.rglob("*.tmp")))
        return result


@dataclass
class CaseResult:
    case: Case
    outcomes: list[Outcome] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.problems

    def lines(self) -> Iterator[str]:
        """One line per kill point: family, where, outcome, verdict."""
        case = self.case
        verdict = "ok" if self.ok else "FAIL: " + "; ".join(self.problems)
        for k, (kill, outcome) in enumerate(zip(case.kills, self.outcomes), 1):
            if kill.spec is not None:
                where = kill.where or json.dumps(kill.spec)
                what = "killed" if outcome.killed else "finished before kill (write point not reached)"
            else:
                where = f"{'a worker ' if kill.worker else ''}at {kill.delay:.2f} s"
                what = f"killed ({outcome.where})" if outcome.killed else "finished before kill"
                if outcome.killed and outcome.at is not None and kill.worker:
                    where = f"a worker at {outcome.at:.2f} s"
            yield f"{case.number:4d} {kill.family:15s} kill {k}/{len(case.kills)} {where}: {what} -> {verdict}"


def summary(results: list[CaseResult], targets: int | None = None) -> tuple[str, int]:
    """The summary line and the number of failed kill points."""
    points = Counter[str]()
    failed = killed = late = stray = 0
    identical, compared = Counter[str](), Counter[str]()
    for r in results:
        n = len(r.case.kills)
        points.update(k.family for k in r.case.kills)
        failed += 0 if r.ok else n
        killed += sum(o.killed for o in r.outcomes[:n])
        late += sum(not o.killed for o in r.outcomes[:n])
        stray += r.info.get("stray temp files", 0)
        identical.update(r.info.get("bytes identical", {}))
        compared.update(r.info.get("compared", {}))
    total = sum(points.values())
    fams = ", ".join(f"{f} {points[f]}" for f in FAMILIES if points[f])
    if targets is not None and points["c-targeted"]:
        fams += f" ({points['c-targeted']} of the reference's {targets} write points)"
    same = ", ".join(f"{f} {identical[f]}/{compared[f]}" for f in compared)
    line = (f"summary: points={total} ({fams}), cases={len(results)}, passed={total - failed}, failed={failed}; "
            f"killed {killed}, finished before kill {late}; temp files left by SIGKILL {stray} (read by nothing); "
            f"byte-identical to the reference (run directories): {same}")
    return line, failed


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--points", type=int, default=50, help="kill points in all (default 50; at least 4)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the random delays and choices (default 0)")
    ap.add_argument("--out", type=Path, help="working directory (must not exist or be empty; default: a temporary "
                    "one)")
    ap.add_argument("--keep", action="store_true", help="keep the working directory (references, cases, logs)")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    allocate(args.points, 1)  # the one-line error for a bad --points, before anything runs
    if args.out is not None and args.out.exists() and (not args.out.is_dir() or any(args.out.iterdir())):
        raise SystemExit(f"error: --out={args.out} is invalid: allowed a new or empty directory (the campaign "
                         "deletes it at the end unless --keep)")
    work = args.out or Path(tempfile.mkdtemp(prefix="phalanx-fault-campaign-"))
    t0 = time.monotonic()
    try:
        camp = Campaign(work, args.seed)
        refs = camp.references()
        print(f"references: phalanx run {refs['run'].duration:.1f} s, phalanx run --set rounds={SHORT_ROUNDS} "
              f"{refs['run-short'].duration:.1f} s ({len(refs['run-short'].points)} write points), phalanx sweep "
              f"--jobs 2 {refs['sweep'].duration:.1f} s; seed {args.seed}", flush=True)
        cases = plan(args.points, args.seed, refs)
        results = []
        for case in cases:
            result = camp.run_case(case)
            results.append(result)
            for line in result.lines():
                print(line, flush=True)
        line, failed = summary(results, len(refs["run-short"].points))
        print(f"{line}; {time.monotonic() - t0:.0f} s", flush=True)
    finally:
        if args.keep:
            print(f"kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
