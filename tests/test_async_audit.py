"""The transcript of a keyed asynchronous run and its audit (phalanx.distributed.async_transcript, docs/async.md
"On real processes"): a real keyed FedBuff run's transcript passes ``phalanx audit``, one step line per step within
its size bound; each forgery of a Byzantine server (rank 0's key, which the test holds) or of a Byzantine worker
(its own valid key) is refused with its line. The job waits on its own end, never on a sleep."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from tests.test_async_processes import ASYNC, launched
from tests.test_audit import forge, one_line
from tests.test_distributed import run_dir

from phalanx.distributed.async_transcript import StepCheck, digest, experiment_of, step_bytes
from phalanx.distributed.audit import audit
from phalanx.distributed.keys import init_keys, load_identity
from phalanx.distributed.sealed import signed_message
from phalanx.distributed.transcript import TRANSCRIPT, load, records

JOB: dict[str, Any] = {**ASYNC, "workers": 5, "rounds": 12, "eval_every": 6, "checkpoint_every": 6,
                       "algorithm_params": {"buffer_size": 2, "max_staleness": 3}}


@pytest.fixture(scope="module")
def honest(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A keyed FedBuff run of 12 steps on ranks 0–4 (K = 2, S = 3): its run directory and its key directory."""
    tmp = tmp_path_factory.mktemp("async-audit")
    init_keys(tmp / "keys", 5)
    code, errs = launched({**JOB, "keys": str(tmp / "keys")}, tmp, {})
    assert code == 0, errs[-3000:]
    return run_dir(tmp / "out"), tmp / "keys"


@pytest.fixture(scope="module")
def honest_basgd(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The same job under BASGD with B = 2 buffers (ranks 1 and 3 hash to buffer 1, ranks 2 and 4 to buffer 0)."""
    tmp = tmp_path_factory.mktemp("async-audit-basgd")
    init_keys(tmp / "keys", 5)
    code, errs = launched({**JOB, "algorithm": "basgd", "algorithm_params": {"buffers": 2, "max_staleness": 3},
                           "keys": str(tmp / "keys")}, tmp, {})
    assert code == 0, errs[-3000:]
    return run_dir(tmp / "out"), tmp / "keys"


def test_a_keyed_async_runs_transcript_passes_the_audit_one_bounded_step_per_step(honest: tuple[Path, Path]) -> None:
    run, _ = honest
    report = audit(run)
    assert report.ok, report.problems
    assert report.rounds == 12 and report.accepted == 24 and report.results_unchecked == 0
    lines = (run / TRANSCRIPT).read_bytes().splitlines(keepends=True)
    steps = [json.loads(x) for x in lines if b'"type":"step"' in x]
    assert [s["round"] for s in steps] == list(range(12))
    dim = json.loads(lines[0])["dim"]
    assert all(len(x) <= step_bytes(5, dim) for x in lines if b'"type":"step"' in x)
    assert all(len(s["updates"]) == 2 and all(u["staleness"] <= 3 for u in s["updates"]) for s in steps)


def test_a_keyed_basgd_runs_transcript_passes_the_audit(honest_basgd: tuple[Path, Path]) -> None:
    """The control of the BASGD mutant: every honest step is the shortest prefix that fills both buffers."""
    report = audit(honest_basgd[0])
    assert report.ok, report.problems
    assert report.rounds == 12 and report.results_unchecked == 0


Edit = Callable[[dict[str, Any]], None]


def _redigest(run: Path, doc: dict[str, Any], entry: dict[str, Any]) -> None:
    """Make a step's rows and result those of its (edited) updates: the forger keeps everything else consistent."""
    import base64

    import torch

    from phalanx.distributed import wire

    exp = experiment_of(json.loads((run / "config.json").read_text()))
    assert exp is not None
    check = StepCheck(exp)
    t = entry["round"]
    rows = torch.stack([wire.bytes_tensor(base64.b64decode(u["body"]), check.dtype) for u in entry["updates"]])
    ids = torch.tensor([u["rank"] for u in entry["updates"]])
    made, _, _ = check.algo.assemble(exp, ids, rows, torch.tensor([t - u["version"] for u in entry["updates"]]))
    entry["rows"] = [digest(r) for r in made]
    entry["result"] = digest(exp.rule(made))


def _kept_stale(run: Path) -> Edit:
    """Step t drops rank j's update and keeps, in its place, j's older update that an earlier step aggregated
    (within the staleness bound, its staleness, rows and result recomputed: only the order of versions betrays it)."""

    def edit(doc: dict[str, Any]) -> None:
        seen: dict[int, dict[str, Any]] = {}
        for entry in doc["rounds"]:
            t = entry["round"]
            for i, u in enumerate(entry["updates"]):
                old = seen.get(u["rank"])
                if old is not None and t - old["version"] <= 3 and old["version"] < u["version"]:
                    entry["updates"][i] = {**old, "staleness": t - old["version"]}
                    _redigest(run, doc, entry)
                    return
                seen[u["rank"]] = u
        raise AssertionError("no step with a worker's earlier update within the bound")

    return edit


def _claim(doc: dict[str, Any], byz: Any) -> None:
    """A Byzantine rank 3 puts its own update (signed with its own key) in rank 1's name."""
    entry = next(e for e in doc["rounds"] if all(u["rank"] != 1 for u in e["updates"]))
    i, mine = next((i, u) for i, u in enumerate(entry["updates"]))
    sig = byz.sign(signed_message(bytes.fromhex(doc["sessions"][0]["nonce"]), doc["config"], mine["version"], 3,
                                  bytes.fromhex(mine["sha256"])))
    entry["updates"][i] = {**mine, "rank": 1, "signature": sig.hex()}


def _set(step: int, **changes: Any) -> Edit:
    def edit(doc: dict[str, Any]) -> None:
        doc["rounds"][step]["updates"][0].update(changes)

    return edit


def _fewer_than_k(run: Path) -> Edit:
    """Step 4 keeps only its first update (FedBuff's K = 2), rows and result recomputed over that one: the rule runs
    over rows the algorithm never makes (the reviewer's F1a)."""

    def edit(doc: dict[str, Any]) -> None:
        entry = doc["rounds"][4]
        entry["updates"] = entry["updates"][:1]
        _redigest(run, doc, entry)

    return edit


def _more_than_k(run: Path) -> Edit:
    """A step takes, besides its K = 2 updates, a third worker's genuine update that the next step aggregated (its
    version ≤ t, within the bound), rows and result recomputed (the reviewer's F1b)."""

    def edit(doc: dict[str, Any]) -> None:
        for entry, after in zip(doc["rounds"], doc["rounds"][1:]):
            t, ranks = entry["round"], {u["rank"] for u in entry["updates"]}
            extra = [u for u in after["updates"] if u["rank"] not in ranks and u["version"] <= t]
            if extra:
                entry["updates"].append({**extra[0], "staleness": t - extra[0]["version"]})
                _redigest(run, doc, entry)
                return
        raise AssertionError("no step followed by a third worker's update of a version it could have taken")

    return edit


def _one_buffer_only(run: Path) -> Edit:
    """BASGD (B = 2): a step holds rank 2's and rank 4's genuine updates (both buffer 0: rank 4's taken from the next
    step, a version the step could have taken) and no other; buffer 1's row is 0/0 = NaN and so is the mean, rows
    and result recomputed to match (the reviewer's F1c)."""

    def edit(doc: dict[str, Any]) -> None:
        for entry, after in zip(doc["rounds"], doc["rounds"][1:]):
            t = entry["round"]
            mine = [u for u in entry["updates"] if u["rank"] in (2, 4)]
            other = [u for u in after["updates"] if mine and u["rank"] == 6 - mine[0]["rank"] and u["version"] <= t
                     and t - u["version"] <= 3]
            if mine and other:
                entry["updates"] = [mine[0], {**other[0], "staleness": t - other[0]["version"]}]
                _redigest(run, doc, entry)
                return
        raise AssertionError("no step of rank 2 or 4 followed by the other's update of a version it could take")

    return edit


@pytest.mark.parametrize("case", ["byzantine-writer", "claimed-by-server", "stale-kept", "result", "rows",
                                  "staleness", "beyond-bound", "rank-0", "too-many", "fewer-than-K", "more-than-K",
                                  "basgd-empty-buffer"])
def test_each_forged_async_transcript_is_refused(case: str, honest: tuple[Path, Path], tmp_path: Path,
                                                 request: pytest.FixtureRequest) -> None:
    """Each mutant of the transcript, signed as its forger can sign it, fails the audit with its own line."""
    run, keys = request.getfixturevalue("honest_basgd") if case.startswith("basgd") else honest
    server, byz = load_identity(keys, 0, 5), load_identity(keys, 3, 5)
    step4 = load(run / TRANSCRIPT)["rounds"][4]
    v = step4["updates"][0]["version"]

    def rows_of_unweighted(doc: dict[str, Any]) -> None:  # the mutant without FedBuff's 1/√(1 + s)
        import base64

        import torch

        from phalanx.distributed import wire

        for entry in doc["rounds"]:
            entry["rows"] = [digest(wire.bytes_tensor(base64.b64decode(u["body"]), torch.float32))
                             for u in entry["updates"]]

    def flood(doc: dict[str, Any]) -> None:
        entry = doc["rounds"][4]
        entry["updates"] = entry["updates"] * 3

    plans: dict[str, tuple[Edit, Any, str]] = {
        "byzantine-writer": (lambda d: _claim(d, byz), byz, "signed by rank 3's key, not rank 0's"),
        "claimed-by-server": (lambda d: _claim(d, byz), server, "rank 1's signature of version"),
        "stale-kept": (_kept_stale(run), server, "aggregated before (a stale one kept)"),
        "result": (lambda d: d["rounds"][4].update(result=d["rounds"][4]["rows"][0]), server,
                   "the recorded result is not"),
        "rows": (rows_of_unweighted, server, "not the algorithm's rows"),
        "staleness": (_set(4, staleness=0 if 4 - v else 1), server, "(edited)"),
        "beyond-bound": (_set(4, version=0, staleness=4), server, "beyond the staleness bound"),
        "rank-0": (_set(4, rank=0), server, "not a worker of the job"),
        "too-many": (flood, server, "not 1 … n − 1 updates"),
        "fewer-than-K": (_fewer_than_k(run), server, "step 4: 1 updates, not a step fedbuff takes (its buffer is not "
                         "full"),
        "more-than-K": (_more_than_k(run), server, "3 updates, not a step fedbuff takes (its buffer is full after the "
                        "first 2)"),
        "basgd-empty-buffer": (_one_buffer_only(run), server, "not a step basgd takes (its buffer is not full"),
    }
    edit, signer, expected = plans[case]
    one_line(audit(forge(run, tmp_path, edit, signer)), expected)


def test_what_the_algorithm_or_rule_raises_on_a_step_is_a_problem_line(honest: tuple[Path, Path], tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The reviewer's F3: whatever ``assemble`` or the rule raises inside the audit's recomputation (here the
    mutant: a FedBuff whose assemble refuses every step with a ConfigError, as a rule refuses too few rows) is a
    "step t: …" line and exit 1 — never an exception out of ``audit()``, nor the CLI's exit 2."""
    from typer.testing import CliRunner

    from phalanx.cli import app
    from phalanx.errors import ConfigError
    from phalanx.training.algorithms.fedbuff import FedBuff

    def refuses(*args: Any, **kwargs: Any) -> Any:
        raise ConfigError("n", 1, "n >= 3 for cwtm with f=1 (n > 2f)")

    run, _ = honest
    monkeypatch.setattr(FedBuff, "assemble", refuses)
    one_line(audit(run), "step 0: fedbuff or mean cannot take the recorded updates (ConfigError: n=1 is invalid")
    got = CliRunner().invoke(app, ["audit", str(run)])
    assert got.exit_code == 1 and "step 0: fedbuff or mean cannot take" in got.output, got.output


def test_the_honest_transcript_copied_is_still_accepted(honest: tuple[Path, Path], tmp_path: Path) -> None:
    """The forgery harness alone (a copy, re-rendered and re-signed by rank 0 without an edit) passes: each refusal
    above is the edit's."""
    run, keys = honest
    report = audit(forge(run, tmp_path, lambda d: None, load_identity(keys, 0, 5)))
    assert report.ok, report.problems


def test_a_resumed_keyed_async_transcript_loads_with_its_steps(honest: tuple[Path, Path], tmp_path: Path) -> None:
    """The loader rank 0 resumes from reads the step lines back (what on_start keeps before the checkpoint)."""
    run, _ = honest
    doc = load(run / TRANSCRIPT)
    assert [e["round"] for e in doc["rounds"]] == list(range(12)) and doc["dim"] > 0
    assert sum(1 for r in records(run / TRANSCRIPT) if r["type"] == "step") == 12
    shutil.rmtree(tmp_path)


def _resumed_step(run: Path, keys: Path, floor: bool) -> tuple[dict[str, Any], Any]:
    """A real :class:`AsyncServer` resumed at step 6 (a fake transport: the arrivals a queue) is offered, first, a
    Byzantine rank 3's update of an old version v (r − S ≤ v < r, signed with its own key for this session's nonce),
    then ranks 1's and 2's honest updates of version 6: the step it records, and the server. ``floor=False``: the
    mutant server that forgets where its session started (what it was before the fix)."""
    import base64
    import hashlib
    import os
    from types import SimpleNamespace

    import torch

    from phalanx.distributed import wire
    from phalanx.distributed.async_server import AsyncServer
    from phalanx.distributed.async_transcript import step_entry
    from phalanx.training.algorithms.asynchronous import clock_stage

    exp = experiment_of(json.loads((run / "config.json").read_text()))
    assert exp is not None
    doc = load(run / TRANSCRIPT)
    nonce = os.urandom(32)

    def signed(rank: int, version: int, body: bytes) -> tuple[int, int, bytes, tuple[str, str, str]]:
        at = hashlib.sha256(f"θ of version {version}".encode()).digest()  # what the worker signs: SHA-256(θ) ‖ body
        sha = hashlib.sha256(at + body).digest()
        sig = load_identity(keys, rank, 5).sign(signed_message(nonce, doc["config"], version, rank, sha))
        return rank, version, body, (sha.hex(), sig.hex(), at.hex())

    class Queue:
        def __init__(self, q: list[tuple[int, int, bytes, tuple[str, str, str]]]) -> None:
            self.q, self.last_proof = q, None

        def publish(self, t: int, msg: bytes, credit: bytes = b"") -> None:
            pass

        def next(self, timeout: float) -> tuple[int, int, bytes] | None:
            if not self.q:
                return None
            rank, version, payload, self.last_proof = self.q.pop(0)
            return rank, version, payload

        def stale(self) -> Counter[int]:
            return Counter()

        def rejections(self) -> list[dict[str, Any]]:
            return []

    body = base64.b64decode(doc["rounds"][6]["updates"][0]["body"])
    byz = wire.tensor_bytes(torch.full((len(body) // 4,), 0.01))
    queue = Queue([signed(3, 3, byz), signed(1, 6, body), signed(2, 6, body)])
    links = SimpleNamespace(offer=lambda init: None, joined=lambda n: set(range(1, n)))
    srv = AsyncServer(links, queue, doc["config"], 5.0, lambda text: None)
    theta = exp.problem.initial_theta()
    srv.open(exp, SimpleNamespace(state=SimpleNamespace(theta=theta, round=6), streams={}))  # type: ignore[arg-type]
    if not floor:
        srv.buffer.since = 0
    clock_stage(exp).own.update(exp.algorithm.initial_state(exp, theta))
    seen: dict[str, Any] = {}
    srv.on_step = lambda t, used, rows, result, groups: seen.update(entry=step_entry(t, used, rows, result))
    srv.exchange(theta, 6, exp.rule)
    check = StepCheck(exp)
    allow = load_identity(keys, 0, 5).allow
    pub = {r: allow.public_key(r) for r in range(5)}
    for e in doc["rounds"][:6]:  # the steps before the checkpoint, as the audit reads them
        assert check.check(e, e["round"], bytes.fromhex(doc["sessions"][0]["nonce"]), doc["config"], pub) == []
    return seen["entry"], (srv, check.check(seen["entry"], 6, nonce, doc["config"], pub, since=6))


def test_a_byzantine_workers_old_version_after_a_resume_is_dropped(honest: tuple[Path, Path]) -> None:
    """The reviewer's F2 (a Byzantine worker with its own valid key, after a resume): its signed update of a version
    the resumed session never published (3 < 6, within S = 3 of it) is dropped and counted as ``unpublished``, and
    the honest server's step passes the audit's check. The mutant server without the session's floor aggregates it,
    and the audit then refuses that step as the server's own fault ("predates this session")."""
    entry, (srv, problems) = _resumed_step(*honest, floor=True)
    assert [(u["rank"], u["version"]) for u in entry["updates"]] == [(1, 6), (2, 6)]
    assert srv.dropped()["unpublished"] == 1 and problems == []
    entry, (srv, problems) = _resumed_step(*honest, floor=False)
    assert (3, 3) in [(u["rank"], u["version"]) for u in entry["updates"]]
    assert srv.dropped()["unpublished"] == 0
    assert any("rank 3's update of version 3 predates this session (from round 6)" in p for p in problems), problems


def test_a_config_naming_a_huge_model_is_refused_before_anything_is_built(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The reviewer's F6 (whoever hands over the run directory, with no key): ``config.json`` names an MLP of
    [30000, 30000] hidden units (about 9·10⁸ parameters — 3.6 GB for θ₀ alone, 15 GiB as the review measured the
    growth). The audit sizes the model on the meta device and refuses it in one line naming config.json and the cap,
    with the model builder and the shard split patched to fail if called, and a traced peak far below one copy of
    θ. Mutant: a cap above the model's size — the builder is then reached (the patched one raises, and says so)."""
    import tracemalloc

    from phalanx.distributed import async_transcript
    from phalanx.experiments import build, make_config

    def never(*_: Any, **__: Any) -> Any:
        raise AssertionError("the audit built the hostile config's model")

    monkeypatch.setattr(build, "_model", never)
    monkeypatch.setattr(build, "_split", never)
    init_keys(tmp_path / "keys", 5)
    run = tmp_path / "run"
    run.mkdir()
    identity = make_config({**JOB, "model": "mlp", "model_params": {"hidden": [30000, 30000]}}).identity()
    (run / "config.json").write_text(json.dumps(identity))
    shutil.copy(tmp_path / "keys" / "allow-list.json", run / "allow-list.json")
    (run / TRANSCRIPT).write_bytes(b'{"type":"header"}\n')
    tracemalloc.start()
    try:
        report = audit(run)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    said = [p for p in report.problems if "does not build its experiment" in p]
    assert len(said) == 1 and str(run / "config.json") in said[0] and \
        f"at most {async_transcript.AUDIT_DIM:,} parameters" in said[0] and "not built" in said[0], report.problems
    assert peak < 64 << 20, peak  # θ₀ alone would be 3.6 GB; digits and the meta model are a few MB
    monkeypatch.setattr(async_transcript, "AUDIT_DIM", 1 << 40)  # the mutant: no cap that binds
    with pytest.raises(AssertionError, match="built the hostile config's model"):
        audit(run)


def _two_thetas(keys: Path) -> Edit:
    """A Byzantine rank 0 sends one worker another θ′ under a version label it also sent, with the true θ, to another
    worker: that worker, honest, signs SHA-256(θ′) ‖ its update (the test holds its key and signs as it would), and
    rank 0 records it truthfully — its only way past the signature check — and re-signs the file."""
    import base64
    import hashlib

    def edit(doc: dict[str, Any]) -> None:
        seen: dict[int, int] = {}
        for entry in doc["rounds"]:
            for u in entry["updates"]:
                v = u["version"]
                if v > 0 and v in seen and seen[v] != u["rank"]:
                    other = hashlib.sha256(b"theta-prime").digest()
                    sha = hashlib.sha256(other + base64.b64decode(u["body"])).digest()
                    sig = load_identity(keys, u["rank"], 5).sign(signed_message(
                        bytes.fromhex(doc["sessions"][0]["nonce"]), doc["config"], v, u["rank"], sha))
                    u.update(theta=other.hex(), sha256=sha.hex(), signature=sig.hex())
                    return
                seen.setdefault(v, u["rank"])
        raise AssertionError("no version with updates of two ranks")

    return edit


def test_rank_0_sending_two_models_under_one_version_is_refused(honest: tuple[Path, Path], tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The reviewer's I1 (a Byzantine rank 0): a worker's signature covers SHA-256 of the θ it computed at, so two
    workers' updates of one version label computed at two different θ are refused ("two models under one version"),
    and every honest update of version 0 carries θ₀'s digest, which the config's seed fixes. Control: in the honest
    run every version's updates carry one θ digest. Mutant: an audit without the θ check passes the forgery."""
    from phalanx.distributed.async_transcript import StepCheck as Check

    run, keys = honest
    by_version: dict[int, set[str]] = {}
    for rec in records(run / TRANSCRIPT):
        for u in rec.get("updates", []) if rec["type"] == "step" else []:
            by_version.setdefault(u["version"], set()).add(u["theta"])
    assert by_version and all(len(x) == 1 for x in by_version.values()), by_version
    forged = forge(run, tmp_path / "two", _two_thetas(keys), load_identity(keys, 0, 5))
    report = audit(forged)
    one_line(report, "rank 0 sent two models under one version")
    assert len(report.problems) == 1, report.problems  # every signature verifies: only the θ digests tell
    monkeypatch.setattr(Check, "_same_theta", lambda self, rank, version, theta: None)
    assert audit(forged).ok  # the mutant audit without the θ check


def test_a_byzantine_workers_update_at_another_theta_is_refused_by_the_honest_server() -> None:
    """A Byzantine worker with its own key signs an update under version 5 but SHA-256 of another θ: the honest
    server's arrivals refuse it (recorded as a rejection, not aggregated), so it cannot put two θ digests under one
    version in the honest server's transcript and frame rank 0. An honest update of the same version passes with its
    θ digest in the proof. Mutant: arrivals that do not remember the published θ pass the forged one."""
    import hashlib
    import threading
    from types import SimpleNamespace

    from phalanx.distributed import wire
    from phalanx.distributed.async_server import THETA_DIGEST, SealedArrivals
    from phalanx.distributed.sealed import Accepted

    theta = wire.THETA + bytes(range(16))
    right, wrong = hashlib.sha256(theta[1:]).digest(), hashlib.sha256(b"another").digest()
    assert len(right) == THETA_DIGEST
    refused: list[tuple[int, int, str]] = []

    def arrivals() -> SealedArrivals:
        links = SimpleNamespace(cond=threading.Condition(), inbox={}, publish_theta=lambda t, m: None,
                                refuse=lambda t, r, why: refused.append((t, r, why)))
        arr = SealedArrivals(links, 3)
        arr.publish(5, theta)
        links.inbox = {(5, 3): Accepted(wrong + b"row3", "aa", "bb"), (5, 1): Accepted(right + b"row1", "cc", "dd")}
        links.fresh = [(5, 3), (5, 1)]
        return arr

    arr = arrivals()
    assert arr.next(0.0) == (3, 5, b"") and arr.last_proof is None
    assert refused and refused[0][:2] == (5, 3) and "another θ" in refused[0][2]
    assert arr.next(0.0) == (1, 5, b"row1") and arr.last_proof == ("cc", "dd", right.hex())
    mutant = arrivals()
    mutant.thetas.clear()
    assert mutant.next(0.0) == (3, 5, b"row3")  # without the check the forged θ digest is kept



@pytest.mark.parametrize("filed", ["step", "mutant"])
def test_a_refusal_at_another_theta_is_filed_under_the_step_so_the_honest_transcript_audits(
    tmp_path: Path, filed: str,
) -> None:
    """attack38's r6: an outsider from 23 addresses fills round 0's record (16 groups and the overflow at step 0's
    drain, the overflow again after it: 18, the most a round holds), then at step 2 one Byzantine worker with its own
    key sends an update of version 0 (still within S = 4) signed at another θ. The honest server refuses it under its
    current step (2), so no round holds more than 18 groups and the audit's check of the drained groups finds
    nothing. The mutant — the refusal filed under the update's version, the code before the fix — makes round 0 hold
    19 and the audit rejects the honest server's own record."""
    import hashlib

    from phalanx.distributed import wire
    from phalanx.distributed.async_server import THETA_DIGEST, SealedArrivals
    from phalanx.distributed.audit import AuditReport, _Audit
    from phalanx.distributed.rejections import GROUPS_PER_ROUND
    from phalanx.distributed.runfacts import RunFacts
    from phalanx.distributed.sealed import Accepted, SealedLinks

    n, row = 4, 64
    init_keys(tmp_path / "job", n)
    links = SealedLinks(load_identity(tmp_path / "job", 0, n), "127.0.0.1", 0, "c0nf1g", THETA_DIGEST + row, n)
    try:
        arrivals = SealedArrivals(links, 4)
        theta = [wire.THETA + bytes([t]) * row for t in range(3)]

        def outsiders(first: int, count: int) -> None:  # (what the listener records for each address's handshake)
            for i in range(first, first + count):
                links._reject(None, f"a connection from 127.0.0.{i} that did not finish its TLS handshake (garbage)")

        drained: list[dict[str, Any]] = []
        arrivals.publish(0, theta[0])
        outsiders(2, 20)
        drained += arrivals.rejections()  # step 0's record: 16 groups and the overflow
        outsiders(30, 3)  # still round 0, after its record: the overflow again (its second record)
        arrivals.publish(1, theta[1])
        drained += arrivals.rejections()
        arrivals.publish(2, theta[2])
        if filed == "mutant":
            arrivals.step = 0  # the refusal filed under the update's version (0), as before the fix
        body = hashlib.sha256(b"another theta").digest() + bytes([9]) * row
        with links.cond:  # rank 1's update of version 0, its signature verified by the links: at another θ
            links.inbox[(0, 1)] = Accepted(bytearray(body), hashlib.sha256(body).hexdigest(), "00" * 64)
            links.fresh = [(0, 1)]
        assert arrivals.next(0.0) == (1, 0, b"")
        drained += arrivals.rejections()  # step 2's record
    finally:
        links.closed = True
        links.close()
    per_round = Counter(g["round"] for g in drained)
    report = AuditReport()
    check = _Audit(report, RunFacts(), links.identity.allow)
    check.n = n
    for group in drained:
        check.line_rejected(group)
    if filed == "step":
        assert per_round == {0: GROUPS_PER_ROUND + 2, 2: 1}, per_round
        assert report.problems == [], report.problems
    else:
        assert per_round[0] == GROUPS_PER_ROUND + 3
        one_line(report, f"round 0: rank 0 recorded more than the {GROUPS_PER_ROUND + 2} groups")

def test_a_zero_step_in_a_run_that_filters_nothing_is_refused(honest: tuple[Path, Path], tmp_path: Path) -> None:
    """A zero step (phalanx.distributed.async_zero) follows a filter's rejections: rank 0 of a FedBuff run that
    records step 4 as one — its updates moved to ``judged`` — is refused."""
    run, keys = honest

    def edit(doc: dict[str, Any]) -> None:
        entry = doc["rounds"][4]
        entry.update(judged=entry["updates"], theta="", updates=[])

    one_line(audit(forge(run, tmp_path, edit, load_identity(keys, 0, 5))), "step 4: a zero step in a run of fedbuff")
