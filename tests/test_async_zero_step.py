"""The zero step of a filtered asynchronous server on real processes (phalanx.distributed.async_zero, docs/async.md
"Liveness"): when the filter has rejected every live worker's update of the newest version, the server publishes the
next version with θ unchanged instead of waiting until ``round_timeout``; a run whose every update is rejected ends
after its steps with one line; the keyed transcript records each zero step and the audit recomputes it, refusing a
forged one. In-process tests feed the real server scripted arrivals (no wait: an empty queue answers at once); the
launch tests wait on the job's own end."""

from __future__ import annotations

import base64
import hashlib
import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch
from tests.test_async_process_filters import FILTERED
from tests.test_async_processes import last_row, launched
from tests.test_audit import forge, one_line
from tests.test_distributed import run_dir

from phalanx.distributed import wire
from phalanx.distributed.async_server import AsyncServer
from phalanx.distributed.async_transcript import step_bytes
from phalanx.distributed.async_zero import holds_still
from phalanx.distributed.audit import audit
from phalanx.distributed.keys import init_keys, load_identity
from phalanx.distributed.sealed import signed_message
from phalanx.distributed.transcript import TRANSCRIPT, load
from phalanx.experiments.build import from_config
from phalanx.experiments.config import make_config
from phalanx.training.algorithms.clock import STATS
from phalanx.training.loop import fresh_start
from phalanx.training.shards import sample_batches_of
from phalanx.training.state import RoundAborted

AFLGUARD = {**FILTERED, "algorithm": "aflguard"}


class Links:
    """The links the server opens with: every rank in ``joined`` started."""

    def __init__(self, joined: set[int]) -> None:
        self.joined_ranks = joined

    def offer(self, init: dict[str, Any]) -> None:
        pass

    def joined(self, n: int) -> set[int]:
        return self.joined_ranks

    def stop(self, t: int, why: bytes) -> None:
        pass

    def close(self) -> None:
        pass


class Scripted:
    """Arrivals from a list: the next one, or None at once when the list is empty (a step that would wait)."""

    last_proof = None

    def __init__(self) -> None:
        self.queue: list[tuple[int, int, bytes]] = []

    def publish(self, t: int, msg: bytes, credit: bytes = b"") -> None:
        pass

    def next(self, timeout: float) -> tuple[int, int, bytes] | None:
        return self.queue.pop(0) if self.queue else None

    def stale(self) -> Counter[int]:
        return Counter()

    def rejections(self) -> list[dict[str, Any]]:
        return []


def server(lam: float, joined: set[int]) -> tuple[AsyncServer, Scripted, Any, torch.Tensor, list[str]]:
    """The real asynchronous server of the 5-rank AFLGuard job (K = 1), opened on scripted arrivals."""
    exp = from_config(make_config({**AFLGUARD, "algorithm_params": {"buffer_size": 1, "max_staleness": 3,
                                                                    "lam": lam}}))
    start = fresh_start(exp)
    exp.algorithm.load_state(exp, start.state.own)  # (what the loop does on opening)
    said: list[str] = []
    arrivals = Scripted()
    srv = AsyncServer(Links(joined), arrivals, "digest", 20.0, said.append)
    srv.open(exp, start)
    return srv, arrivals, exp, start.state.theta.clone(), said


def gradients(exp: Any, theta: torch.Tensor, ranks: list[int]) -> list[bytes]:
    gen = torch.Generator().manual_seed(0)
    out = []
    for rank in ranks:
        xb, yb = sample_batches_of(exp.data, torch.tensor([rank]), 32, gen)
        out.append(wire.tensor_bytes(exp.problem.grads_each(theta[None], xb, yb)[0]))
    return out


def test_a_version_whose_every_update_is_rejected_is_a_zero_step_that_leaves_theta() -> None:
    """λ = 10⁻⁶ (every update rejected), ranks 1–4 each deliver their update of version 0: the step is a zero step
    without waiting — rows of zeros, no update aggregated, and θ − η·rule(rows) is θ bit for bit (SGD, the mean). The
    mutant without the zero step (``_exhausted`` always False) gives the step up: the stall this fixes."""
    srv, arrivals, exp, theta, said = server(1e-6, {1, 2, 3, 4})
    arrivals.queue = [(r, 0, g) for r, g in zip([1, 2, 3, 4], gradients(exp, theta, [1, 2, 3, 4]))]
    got = srv.exchange(theta, 0, exp.rule)  # type: ignore[arg-type]
    assert got.rows == [1, 2, 3, 4] and not bool(got.vectors.any())
    assert holds_still(exp) and torch.equal(exp.optimizer.step(theta, exp.rule(got.vectors), 0.5), theta)
    assert got.own is not None and dict(zip(STATS, got.own["stats"].tolist()))["updates"] == 0
    assert srv.zero == 1 and any("a zero step, θ not moved, version 1 published" in s for s in said)
    assert srv.buffer.counts()["filtered"] == 4
    mutant, arrivals, exp, theta, _ = server(1e-6, {1, 2, 3, 4})
    mutant._exhausted = lambda: False  # type: ignore[method-assign]
    arrivals.queue = [(r, 0, g) for r, g in zip([1, 2, 3, 4], gradients(exp, theta, [1, 2, 3, 4]))]
    with pytest.raises(RoundAborted):
        mutant.exchange(theta, 0, exp.rule)  # type: ignore[arg-type]


def test_a_zero_step_waits_for_every_live_worker_and_never_follows_an_accepted_update() -> None:
    """Ranks 1–3 rejected, rank 4 (joined) not yet delivered: no zero step — the server waits for rank 4 (here the
    script is empty, so the step is given up); with rank 4 not joined (not live) the same arrivals make a zero step.
    With λ = 10⁶ (everything accepted) the first update fills the buffer: an ordinary step, never a zero one."""
    srv, arrivals, exp, theta, _ = server(1e-6, {1, 2, 3, 4})
    arrivals.queue = [(r, 0, g) for r, g in zip([1, 2, 3], gradients(exp, theta, [1, 2, 3]))]
    with pytest.raises(RoundAborted):
        srv.exchange(theta, 0, exp.rule)  # type: ignore[arg-type]
    srv, arrivals, exp, theta, _ = server(1e-6, {1, 2, 3})
    arrivals.queue = [(r, 0, g) for r, g in zip([1, 2, 3], gradients(exp, theta, [1, 2, 3]))]
    assert not bool(srv.exchange(theta, 0, exp.rule).vectors.any()) and srv.zero == 1  # type: ignore[arg-type]
    srv, arrivals, exp, theta, _ = server(1e6, {1, 2, 3, 4})
    arrivals.queue = [(r, 0, g) for r, g in zip([1, 2, 3, 4], gradients(exp, theta, [1, 2, 3, 4]))]
    got = srv.exchange(theta, 0, exp.rule)  # type: ignore[arg-type]
    assert srv.zero == 0 and got.rows == [1] and bool(got.vectors.any())


def test_theta_holds_still_only_with_a_stateless_server_step() -> None:
    """The audit's θ check applies when a zero aggregate cannot move θ: SGD without momentum or weight decay; the
    mutant configs (server momentum, weight decay) do not hold still, and the audit does not demand it of them."""
    base = {**AFLGUARD, "algorithm_params": {"buffer_size": 1}}
    assert holds_still(from_config(make_config(base)))
    assert not holds_still(from_config(make_config({**base, "server_momentum": 0.9})))


def zero_steps(errs: str) -> int:
    """The zero steps rank 0's closing line counts (0 when it has none)."""
    found = re.findall(r"zero steps: (\d+) of \d+", errs)
    return int(found[-1]) if found else 0


@pytest.mark.parametrize("seed", [1, 2])
def test_aflguard_at_its_default_lambda_on_processes_finishes_the_seeds_that_stalled(seed: int,
                                                                                     tmp_path: Path) -> None:
    """The case that stopped (docs/async.md "Liveness"): AFLGuard at λ = 1.5 on ranks 0–4, rank 4 flipping its sign
    ×10, K = 1, 30 steps — seeds 1 and 2 stopped at steps 27 and 24 (exit 3). The run ends; every step aggregated
    an update or was a zero step; the attacker is filtered (the launch test's check)."""
    from tests.test_async_process_filters import attacker_filtered

    code, errs = launched({**AFLGUARD, "seed": seed, "algorithm_params": {"buffer_size": 1, "max_staleness": 3}},
                          tmp_path, {})
    assert code == 0, errs[-3000:]
    row = last_row(tmp_path / "out")
    assert row["round"] == 30 and row["updates"] + zero_steps(errs) == 30, (row, errs[-2000:])
    assert attacker_filtered(row) == [], row


@pytest.fixture(scope="module")
def rejected(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, str]:
    """A keyed AFLGuard run whose every update is rejected (λ = 10⁻³), 6 steps: its run directory, key directory and
    the ranks' stderr."""
    tmp = tmp_path_factory.mktemp("zero-steps")
    init_keys(tmp / "keys", 5)
    code, errs = launched({**AFLGUARD, "algorithm_params": {"buffer_size": 1, "max_staleness": 3, "lam": 1e-3},
                           "rounds": 6, "eval_every": 6, "checkpoint_every": 6, "keys": str(tmp / "keys")}, tmp, {})
    assert code == 0, errs[-3000:]
    return run_dir(tmp / "out"), tmp / "keys", errs


def test_a_run_whose_every_update_is_rejected_ends_with_one_line_and_audits(rejected: tuple[Path, Path, str]
                                                                           ) -> None:
    """The bound: 6 zero steps of 6, exit status 0, one closing line; no update aggregated; θ never moved (every
    zero step records θ₀); each zero step's line within the step line's bound (n bodies). The keyed transcript
    holds a zero step per step and passes the audit, which recomputed each (AFLGuard's rejections at the recorded
    θ, the rows, the result)."""
    run, _, errs = rejected
    assert "zero steps: 6 of 6" in errs and errs.count("a zero step, θ not moved") == 1
    assert last_row(run.parent)["updates"] == 0
    report = audit(run)
    assert report.ok, report.problems
    assert report.rounds == 6 and report.accepted == 0
    steps = [e for e in load(run / TRANSCRIPT)["rounds"]]
    exp = from_config(make_config({**AFLGUARD, "algorithm_params": {"buffer_size": 1, "lam": 1e-3}}))
    theta0 = base64.b64encode(wire.tensor_bytes(fresh_start(exp).state.theta)).decode()
    assert all(e["updates"] == [] and e["judged"] and e["theta"] == theta0 for e in steps)
    lines = (run / TRANSCRIPT).read_bytes().splitlines()
    dim = json.loads(lines[0])["dim"]
    assert all(len(x) <= step_bytes(5, dim) for x in lines if b'"type":"step"' in x)  # the record's bound


def _resign(doc: dict[str, Any], keys: Path, u: dict[str, Any], body: bytes, theta: str) -> None:
    """Worker ``u['rank']`` signs ``body`` computed at the θ of digest ``theta`` (as an honest worker would)."""
    sha = hashlib.sha256(bytes.fromhex(theta) + body).digest()
    sig = load_identity(keys, u["rank"], 5).sign(signed_message(bytes.fromhex(doc["sessions"][0]["nonce"]),
                                                                doc["config"], u["version"], u["rank"], sha))
    u.update(body=base64.b64encode(body).decode(), theta=theta, sha256=sha.hex(), signature=sig.hex())


def _accepted_as_rejected(keys: Path) -> Any:
    """Rank 0 records as a zero step a version one of whose updates passes: the first judged worker's update is
    g₀(θ₂) itself (signed by that worker), which AFLGuard accepts at any λ."""

    def edit(doc: dict[str, Any]) -> None:
        entry = doc["rounds"][2]
        exp = from_config(make_config({**AFLGUARD, "algorithm_params": {"buffer_size": 1, "lam": 1e-3}}))
        theta = wire.bytes_tensor(base64.b64decode(entry["theta"]), torch.float32)
        u = entry["judged"][0]
        _resign(doc, keys, u, wire.tensor_bytes(exp.algorithm.server_update(exp, theta)), u["theta"])

    return edit


def _theta_moved(keys: Path, resign: bool) -> Any:
    """Rank 0 moves θ on zero step 2 (version 3 is θ₂ + 0.01): step 3 records the moved θ and its workers computed
    there (``resign``: each signs its update at the moved θ, as honest workers would; else their signatures name θ₂)."""

    def edit(doc: dict[str, Any]) -> None:
        entry = doc["rounds"][3]
        moved = wire.tensor_bytes(wire.bytes_tensor(base64.b64decode(entry["theta"]), torch.float32) + 0.01)
        entry["theta"] = base64.b64encode(moved).decode()
        if resign:
            for u in entry["judged"]:
                _resign(doc, keys, u, base64.b64decode(u["body"]), hashlib.sha256(moved).hexdigest())

    return edit


def _judged_nan(keys: Path) -> Any:
    """Rank 0 records zero step 2 on the strength of a worker's NaN update (signed by that worker)."""

    def edit(doc: dict[str, Any]) -> None:
        u = doc["rounds"][2]["judged"][0]
        nan = wire.tensor_bytes(torch.full((len(base64.b64decode(u["body"])) // 4,), float("nan")))
        _resign(doc, keys, u, nan, u["theta"])

    return edit


@pytest.mark.parametrize("case", ["copy", "updates-in-zero", "accepted-as-rejected", "theta-moved",
                                  "theta-not-theirs", "judged-twice", "updates-not-a-list", "judged-nan"])
def test_each_forged_zero_step_is_refused(case: str, rejected: tuple[Path, Path, str], tmp_path: Path) -> None:
    """Each mutant of a zero step, signed by rank 0 (and by the workers where the forgery needs their honest
    signature), fails the audit with its own line; the copy re-rendered without an edit passes (the loader and
    writer keep a zero step's fields)."""
    run, keys, _ = rejected
    plans: dict[str, tuple[Any, str | None]] = {
        "copy": (lambda d: None, None),
        "updates-in-zero": (lambda d: d["rounds"][2].update(updates=d["rounds"][2]["judged"][:1]),
                            "step 2: a zero step with 1 accepted update(s)"),
        "accepted-as-rejected": (_accepted_as_rejected(keys), "filter at the recorded θ: a zero step recorded while "
                                 "an accepted update exists"),
        "theta-moved": (_theta_moved(keys, True), "not at θ of zero step 2"),
        "theta-not-theirs": (_theta_moved(keys, False), "not at the recorded θ"),
        "judged-twice": (lambda d: d["rounds"][2]["judged"].__setitem__(1, d["rounds"][2]["judged"][0]),
                         "two rejected updates of rank"),
        # an attacker's review: `updates` of another type made the audit raise TypeError (a traceback, not a line)
        "updates-not-a-list": (lambda d: d["rounds"][2].update(updates=1), "a zero step's 'updates' is not a list"),
        # ... and a worker's NaN update, which the server drops before its filter, passed as the zero step's reason
        "judged-nan": (_judged_nan(keys), "rejected update is not finite"),
    }
    edit, expected = plans[case]
    report = audit(forge(run, tmp_path, edit, load_identity(keys, 0, 5)))
    if expected is None:
        assert report.ok, report.problems
        assert json.dumps(load(run / TRANSCRIPT)["rounds"][2]["judged"]) == json.dumps(
            load(tmp_path / "run" / TRANSCRIPT)["rounds"][2]["judged"])
    else:
        one_line(report, expected)
