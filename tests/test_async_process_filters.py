"""Kardam's, Zeno++'s and AFLGuard's filters, and data attacks, on real processes (phalanx.distributed.async_filters,
docs/async.md "On real processes"): a launch of each with a sign-flipping Byzantine rank finishes with the filter
dropping that rank's updates (recorded counts, not one seed's accuracy); the same check fails on a filter that accepts
everything; a resumed filter continues from the checkpoint's state (and a fresh one does not); a label-flipping rank
runs; a bad combination is refused in one line before anything is launched. Every wait is on an event."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors import safe_open
from tests.test_async_processes import ASYNC, killed_while_holding, last_row, launched
from tests.test_distributed import run_dir, write_toml

from phalanx.distributed.async_buffer import Buffer
from phalanx.distributed.async_filters import ProcessFilter
from phalanx.distributed.audit import audit
from phalanx.distributed.keys import init_keys
from phalanx.distributed.worker import resolve_config
from phalanx.errors import ConfigError
from phalanx.experiments.build import from_config
from phalanx.experiments.config import make_config, validate
from phalanx.training.algorithms.asynchronous import RING, SCREENED
from phalanx.training.loop import fresh_start
from phalanx.training.shards import sample_batches_of

FILTERED: dict[str, Any] = {
    **ASYNC, "workers": 5, "byzantine": 1, "attack": "signflip", "attack_params": {"scale": 10.0}, "rounds": 30,
    "eval_every": 30, "checkpoint_every": 30,
}
PARAMS = {"kardam": {"buffer_size": 1, "filter_f": 1, "max_staleness": 3},
          "zenopp": {"buffer_size": 1, "max_staleness": 3},
          "aflguard": {"buffer_size": 1, "max_staleness": 3, "lam": 3.0}}
"""AFLGuard with λ = 3: at the default 1.5 it rejects most honest one-minibatch updates (docs/async.md), so a step
may be a zero step (every worker's update of a version rejected: tests/test_async_zero_step.py)."""


def attacker_filtered(row: dict[str, Any]) -> list[str]:
    """What the test asserts of a run's last metric row (empty: the filter did its job): it dropped the Byzantine
    rank's updates — at least 3 of them, and at least as many as got through (its ``byzantine_updates``
    aggregated). Not asserted: how many honest updates it dropped (Kardam drops many — an update computed at the
    reference's θ, or above the quantile — and how many depends on the processes' timing)."""
    wrong = []
    if not row["byzantine_rejected"] >= 3:
        wrong.append(f"byzantine_rejected = {row['byzantine_rejected']} < 3")
    if not row["byzantine_updates"] <= row["byzantine_rejected"]:
        wrong.append(f"byzantine_updates {row['byzantine_updates']} > byzantine_rejected {row['byzantine_rejected']}")
    return wrong


@pytest.mark.parametrize("name", ["kardam", "zenopp", "aflguard"])
def test_a_filter_on_processes_drops_the_sign_flipping_rank(name: str, tmp_path: Path) -> None:
    """Ranks 0–4 (4 workers, rank 4 Byzantine: sign flip ×10 of its own gradient), K = 1, 30 steps. The run ends;
    rank 0 names the attacker's first filtered update on its log, and the metrics record the filter's drops of it
    (:func:`attacker_filtered`)."""
    data = {**FILTERED, "algorithm": name, "algorithm_params": PARAMS[name]}
    code, errs = launched(data, tmp_path, {})
    assert code == 0, errs[-3000:]
    assert "dropped an update of rank 4" in errs and "filtered" in errs, errs[-3000:]
    row = last_row(tmp_path / "out")
    assert row["round"] == 30
    assert attacker_filtered(row) == [], (attacker_filtered(row), row)
    zero = re.findall(r"zero steps: (\d+) of 30", errs)  # (a step may be a zero step: async_zero)
    assert row["updates"] + int(zero[-1] if zero else 0) == 30
    assert row["rejected"] == row["byzantine_rejected"] + row["honest_rejected"]


def scripted(name: str, accept_all: bool, monkeypatch: pytest.MonkeyPatch, **params: Any) -> dict[str, Any]:
    """The real server's buffer and filter, in this process, offered what the launched job's workers send — rank
    1–3's minibatch gradients at θ, rank 4's sign flip ×10 — for 30 steps of K = 1 (θ stepped by the accepted one),
    and the metric row :func:`attacker_filtered` reads. ``accept_all``: the mutant filter that accepts everything;
    ``params``: the algorithm's parameters changed (a mutant's)."""
    cfg = make_config({**FILTERED, "algorithm": name, "algorithm_params": {**PARAMS[name], **params}})
    exp = from_config(cfg)
    start = fresh_start(exp)
    own = start.state.own
    if accept_all:
        monkeypatch.setattr(type(exp.algorithm), "screen", lambda self, run, o, theta, t, ids, updates, *a, **k:
                            (updates, torch.ones(ids.numel(), dtype=torch.bool), {}))
    flt = ProcessFilter(exp, own)
    buf = Buffer(5, exp.problem.dim, torch.float32, 3, judge=flt.judge)
    theta, gen = start.state.theta.clone(), torch.Generator().manual_seed(0)
    byz_used = 0
    for t in range(30):
        buf.publish(t)
        flt.publish(t, theta)
        for rank in (4, 1, 2, 3):  # the attacker first: a step's first update is the one taken
            xb, yb = sample_batches_of(exp.data, torch.tensor([rank]), 32, gen)
            g = exp.problem.grads_each(theta[None], xb, yb)[0]
            buf.offer(rank, t, (-10.0 * g if rank == 4 else g).numpy().tobytes())
        u = buf.step[0]
        byz_used += u.rank == 4
        theta = theta - 0.5 * (u.row if u.passed is None else u.passed)
    stats = dict(zip(["rejected", "rejected_step", "byzantine_rejected", "honest_rejected"],
                     flt.state()[SCREENED].tolist()))
    return {**stats, "byzantine_updates": byz_used, "updates": 30}


@pytest.mark.parametrize("name", ["kardam", "zenopp", "aflguard"])
def test_the_check_catches_a_filter_that_accepts_everything(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The check of the launch test, on the server's own buffer and filter fed the job's updates: it passes with
    the algorithm's filter, and fails on the mutant that accepts everything (it would pass a server without one)."""
    assert attacker_filtered(scripted(name, False, monkeypatch)) == []
    assert attacker_filtered(scripted(name, True, monkeypatch)) != []


def test_aflguards_check_on_processes_catches_the_lambda_mutant(monkeypatch: pytest.MonkeyPatch) -> None:
    """AFLGuard on the server's own buffer and filter fed the job's updates (:func:`scripted`): with λ = 1.5 the
    sign-flipping rank's updates are dropped; the mutant λ = 10⁶ (a ball that holds any update) admits them and the
    launch test's check fails on it."""
    assert attacker_filtered(scripted("aflguard", False, monkeypatch)) == []
    lax = scripted("aflguard", False, monkeypatch, lam=1e6)
    assert attacker_filtered(lax) != [] and lax["byzantine_rejected"] == 0 and lax["byzantine_updates"] > 0


def test_aflguard_runs_on_processes_with_its_trusted_gradient_at_the_published_theta() -> None:
    """The server's filter computes g₀ at the θ it published last (no state: a fresh filter and one that judged
    before give the same verdict, so a resume needs nothing from the checkpoint): g₀ itself passes at that θ,
    −10·g₀ does not; the config with ``engine = "torchrun"`` resolves (AFLGuard was refused there)."""
    exp = from_config(make_config({**FILTERED, "algorithm": "aflguard", "algorithm_params": PARAMS["aflguard"]}))
    validate(make_config({**FILTERED, "algorithm": "aflguard", "algorithm_params": PARAMS["aflguard"],
                          "engine": "torchrun"}))
    theta = fresh_start(exp).state.theta.clone() + 0.01
    g0 = exp.algorithm.server_update(exp, theta)
    verdicts = []
    for _ in range(2):
        flt = ProcessFilter(exp, fresh_start(exp).state.own)
        flt.publish(3, theta)
        verdicts.append((flt.judge(1, 3, g0) is not None, flt.judge(4, 3, -10.0 * g0) is not None))
    assert verdicts == [(True, False), (True, False)]
    assert set(flt.state()) == {RING, SCREENED}  # the ring and the counts: no filter state to checkpoint


def test_a_resumed_filter_continues_from_the_checkpoints_state(tmp_path: Path) -> None:
    """Kardam, ranks 0–4 with a sign-flipping rank 4, 20 steps, a checkpoint every 10; every rank SIGKILLed while
    rank 0 holds before step 12. The checkpoint of step 10 holds the filter's state (the workers' coefficients, its
    references, its counts); the relaunch resumes from it, ends, and its counts of step 20 are at least those of the
    checkpoint — and the server's filter is built from the checkpoint's state: the mutant that starts it afresh
    (:meth:`ProcessFilter.judge` on a fresh state) judges the next update otherwise. With keys, the two sessions'
    transcript audits and says its filtering is unchecked, step by step."""
    init_keys(tmp_path / "keys", 5)
    data = {**FILTERED, "algorithm": "kardam", "algorithm_params": PARAMS["kardam"], "rounds": 20,
            "eval_every": 5, "checkpoint_every": 10, "keys": str(tmp_path / "keys")}
    code, errs = killed_while_holding(data, tmp_path, 12)
    assert code != 0, errs[-3000:]
    d = run_dir(tmp_path / "out")
    with safe_open(str(d / "checkpoint.safetensors"), framework="pt") as fh:
        assert fh.metadata()["round"] == "10"
        saved = {k.split(".", 1)[1]: fh.get_tensor(k) for k in fh.keys() if k.startswith("algorithm.")}
    lips, screened = saved["kardam_lip"], saved[SCREENED]
    assert int((~torch.isnan(lips)).sum()) >= 2 and int(saved["kardam_refs"]) == 2 and float(screened[0]) >= 1
    code, errs = launched(data, tmp_path, {})
    assert code == 0, errs[-3000:]
    assert "resuming from the checkpoint of round 10" in errs
    rows = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]
    after = [r for r in rows if r.get("round") == 20 and "rejected" in r][-1]
    assert after["rejected"] >= float(screened[0]) and after["byzantine_rejected"] >= float(screened[2])
    report = audit(d)
    assert report.ok, report.problems
    assert report.rounds == 20 and report.filters_unchecked == 20 and report.results_unchecked == 0
    # the server's filter from the checkpoint's state, against the mutant (state not saved: a fresh one)
    exp = from_config(resolve_config(str(tmp_path / "job.toml"), []))
    theta = torch.zeros(exp.problem.dim)
    fresh = fresh_start(exp).state.own
    kept = {**fresh, **saved}
    row = torch.full((exp.problem.dim,), 1e8)  # a coefficient far above any of the run's (a ×10 flip's included)
    verdicts = []
    for own in (kept, fresh):
        flt = ProcessFilter(exp, own)
        flt.publish(10, theta)
        verdicts.append(flt.judge(4, 10, row) is not None)
    assert verdicts == [False, True]  # kept: a coefficient against the saved references; fresh: the first, unjudged


def test_a_data_attack_runs_on_processes(tmp_path: Path) -> None:
    """FedBuff, ranks 0–4, rank 4 label-flipping (the simulator's attack object on its own batches): the run ends all
    its steps with the attacker's updates aggregated (``byzantine_updates`` > 0). A buffer of K = 4, the number of
    worker ranks: with one credit each (flow control) a step fills only with rank 4's update in it, however slowly
    its process runs — with K = 2 the three honest ranks could fill every step before it was scheduled (seen once
    at load 20+)."""
    data = {**ASYNC, "workers": 5, "byzantine": 1, "attack": "labelflip", "rounds": 20, "eval_every": 20,
            "checkpoint_every": 20, "algorithm_params": {"buffer_size": 4, "max_staleness": 3}}
    code, errs = launched(data, tmp_path, {})
    assert code == 0, errs[-3000:]
    row = last_row(tmp_path / "out")
    assert row["round"] == 20 and row["byzantine_updates"] > 0


@pytest.mark.parametrize(("change", "parameter"), [
    ({"algorithm": "kardam", "workers": 7, "algorithm_params": {"buffer_size": 1, "filter_f": 2}},
     "algorithm_params.filter_f"),
    ({"algorithm": "zenopp", "algorithm_params": {"buffer_size": 1, "byzantine_timing": "always_first"}},
     "algorithm_params.byzantine_timing"),
    ({"algorithm": "kardam", "attack": "alie", "attack_params": {}, "algorithm_params": {"buffer_size": 1}},
     "attack"),
])
def test_a_bad_combination_is_refused_before_launch(change: dict[str, Any], parameter: str, tmp_path: Path) -> None:
    """Kardam's 3f < n − 1 on processes (f = 2 of 6 worker ranks: the simulated 3f < n = 7 would pass), a timing the
    processes cannot play, an attack one worker cannot play alone: each one line naming its parameter, from the
    config alone (nothing launched)."""
    data = {**FILTERED, "engine": "torchrun", **change}
    with pytest.raises(ConfigError) as info:
        resolve_config(str(write_toml(tmp_path / "bad.toml", data)), [])
    assert info.value.parameter == parameter and "\n" not in str(info.value)


@pytest.mark.parametrize(("name", "filters", "rows"), [("fedbuff", False, False), ("kardam", True, False),
                                                       ("zenopp", True, True), ("aflguard", True, False)])
def test_the_audit_counts_what_it_cannot_recompute(name: str, filters: bool, rows: bool) -> None:
    """The keyed audit's hook: a filtering algorithm's steps count as ``filters_unchecked`` (the transcript holds
    neither the dropped updates nor every θ: AFLGuard's g₀ needs θₜ); Zeno++'s rows (g̃, v unrecorded) and so its
    results are not recomputed
    (``results_unchecked``), Kardam's and FedBuff's are. The mutant that claims Zeno++'s rows recomputable would
    refuse every honest Zeno++ step ("the recorded rows are not the algorithm's rows")."""
    from phalanx.distributed.async_filters import rows_unchecked, unchecked
    from phalanx.distributed.async_transcript import StepCheck

    params = {"buffer_size": 1} if name != "fedbuff" else {"buffer_size": 2}
    exp = from_config(make_config({**FILTERED, "algorithm": name, "algorithm_params": params}))
    assert unchecked(exp.algorithm) is filters and rows_unchecked(exp.algorithm) is rows
    assert StepCheck(exp).recomputes is not rows
