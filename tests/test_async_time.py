"""Attackers who exploit time (issue 36 item 3): updates timed to the buffer's boundary (``last_slot``) or to the
staleness bound (``at_bound``), stale replays (``replay``), and every vector attack of the registry under each of
them and under Kardam and Zeno++ — with the Byzantine share of each buffer recorded, and what the staleness bound
does (and does not) see."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from tests._interrupt import whole_and_resumed

from phalanx import aggregators, attacks, data, models
from phalanx.errors import ConfigError
from phalanx.experiments import make_config
from phalanx.training import Experiment, Loop
from phalanx.training.algorithms.asynchronous import Asynchronous, replayed
from phalanx.training.algorithms.basgd import BASGD
from phalanx.training.algorithms.clock import Clock, Speeds
from phalanx.training.algorithms.fedbuff import FedBuff
from phalanx.training.algorithms.kardam import Kardam
from phalanx.training.algorithms.zenopp import ZenoPP
from phalanx.training.loop import Evaluate

DS = data.load("digits")


def experiment(algo: Asynchronous, rule: str = "mean", f: int = 0, workers: int = 10, byzantine: int = 2,
               attack: str = "signflip", rounds: int = 12, seed: int = 1) -> Experiment:
    torch.manual_seed(0)
    return Experiment(model=models.make("logreg", DS.input_shape, DS.num_classes), dataset=DS, workers=workers,
                      byzantine=byzantine, rule=aggregators.make(rule, f=f), attack=attacks.make(attack),
                      algorithm=algo, rounds=rounds, lr=0.5, seed=seed, eval_every=1)


def rows_of(exp: Experiment) -> list[dict[str, Any]]:
    return Loop(exp, callbacks=[Evaluate()]).run()[1:]  # the rows after each step (the first is before training)


def steps(timing: str, bound: int, seed: int, count: int = 15, k: int = 4) -> list[tuple[list[int], list[int],
                                                                                           list[int]]]:
    """The clock alone (n = 10, b = 2, FedBuff's full buffer of k): each step's accepted workers in delivery order,
    their staleness, and the dropped workers."""
    algo = FedBuff(buffer_size=k)
    clock = Clock(workers=10, byzantine=2, max_staleness=bound, timing=timing)
    state = clock.start(Speeds.parse("lognormal(1.0)").draw(10, seed))
    out = []
    for t in range(count):
        step = clock.collect(state, t, lambda order, ok: algo.full(10, order, ok))
        out.append((step.ids.tolist(), step.staleness.tolist(), step.dropped.tolist()))
        state = clock.advance(state, t, step, 0)
    return out


# --- the buffer's boundary ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_last_slot_closes_every_buffer_on_a_byzantine_update(seed: int) -> None:
    """``last_slot``: every FedBuff buffer closes on a Byzantine delivery (its last accepted update is Byzantine), so
    every buffer holds one (share 1/K = ¼, recorded as ``byzantine_buffer_share`` on every row). The mutant — honest
    timing — closes some buffer on an honest update."""
    for ids, _, _ in steps("last_slot", 4, seed):
        assert ids[-1] >= 8
    assert any(ids[-1] < 8 for ids, _, _ in steps("honest", 4, seed))
    rows = rows_of(experiment(FedBuff(buffer_size=4, byzantine_timing="last_slot"), seed=seed))
    assert [r["byzantine_buffer_share"] for r in rows] == [0.25] * len(rows)


def test_last_slot_touches_no_more_basgd_buffers_than_it_has_workers() -> None:
    """BASGD's hashing bounds the touched buffers by b whatever the timing: at the boundary too."""
    for seed in (0, 1, 2):
        rows = rows_of(experiment(BASGD(buffers=5, byzantine_timing="last_slot"), "cwmed", 2, seed=seed))
        assert all(r["byzantine_rows"] <= 2 for r in rows) and any(r["byzantine_rows"] > 0 for r in rows)


# --- the staleness bound --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_at_bound_updates_are_exactly_as_stale_as_the_bound_allows(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """``at_bound`` (S = 3): every Byzantine update aggregated is exactly S versions old and none is dropped. The
    mutant — an attacker that holds its update one step longer (S + 1) — has every one of its updates dropped and
    counted by the bound (``dropped``), never aggregated."""
    seen = 0
    for ids, stale, dropped in steps("at_bound", 3, seed):
        byz = [s for i, s in zip(ids, stale) if i >= 8]
        assert byz == [3] * len(byz) and not any(i >= 8 for i in dropped)
        seen += len(byz)
    assert seen > 0
    monkeypatch.setattr(Clock, "held", lambda self, order, staleness: torch.cat([
        order[self.byz[order] & (staleness[order] >= self.bound + 1)], order[~self.byz[order]],
        order[self.byz[order] & (staleness[order] < self.bound + 1)]]))
    late = steps("at_bound", 3, seed)
    assert not any(i >= 8 for ids, _, _ in late for i in ids) and sum(i >= 8 for *_, d in late for i in d) > 0
    rows = rows_of(experiment(FedBuff(buffer_size=4, max_staleness=3, byzantine_timing="at_bound"), seed=seed))
    assert rows[-1]["byzantine_updates"] == 0 and rows[-1]["dropped"] > 0  # the mutant's record: dropped, counted


# --- stale replays --------------------------------------------------------------------------------------------------


def test_a_replay_is_the_honest_update_from_beyond_the_bound() -> None:
    """The replayed Byzantine rows are the first honest update the server aggregated S + 1 steps earlier (none before
    step S + 1: the attack's own rows), and the step's first honest update is stored for S + 1 steps later."""
    slots = 3
    own = {"replay": torch.zeros(slots, 2), "replay_at": torch.full((slots,), -1, dtype=torch.int64)}
    updates = torch.tensor([[1.0, 1.0], [2.0, 2.0], [9.0, 9.0]])  # two honest rows, one Byzantine
    out, state = replayed(own, updates, 2, 1, 0, slots)
    assert torch.equal(out, updates) and state["replay"][0].tolist() == [1.0, 1.0]
    later = torch.tensor([[5.0, 5.0], [6.0, 6.0], [9.0, 9.0]])
    out, state = replayed(state, later, 2, 1, 3, slots)
    assert out[2].tolist() == [1.0, 1.0] and state["replay"][0].tolist() == [5.0, 5.0]
    assert int(state["replay_at"][0]) == 3


def test_the_bound_records_a_replay_as_fresh() -> None:
    """What a replay makes the system record: the server measures staleness from the version it sent, never from a
    tag, so the replayed update — S + 1 steps old in content — is aggregated as a fresh update (staleness 0 under
    always-first service, no Byzantine drop) and counted in ``byzantine_updates`` and the buffer share. The bound
    drops what the server *sent* long ago, not what an attacker re-sends: the replay's defence must look at the
    content (Zeno++'s score rejects some of them, below)."""
    for ids, stale, dropped in steps("replay", 2, seed=0):
        assert [s for i, s in zip(ids, stale) if i >= 8] == [0, 0] and not any(i >= 8 for i in dropped)
    loop = Loop(experiment(FedBuff(buffer_size=4, max_staleness=2, byzantine_timing="replay"), rounds=8),
                callbacks=[Evaluate()])
    rows = loop.run()[1:]
    assert all(r["byzantine_buffer_share"] == 0.5 for r in rows) and rows[-1]["byzantine_updates"] == 16
    assert sorted(loop.state.own["replay_at"].tolist()) == [5, 6, 7]  # S + 1 stored honest updates, the latest
    zeno = rows_of(experiment(ZenoPP(buffer_size=4, byzantine_timing="replay"), rounds=12))[-1]
    assert zeno["byzantine_updates"] == 24 and zeno["byzantine_rejected"] > 0


# --- every vector attack, asynchronously ----------------------------------------------------------------------------


TIMED = [FedBuff(buffer_size=4, byzantine_timing="last_slot", batch_size=8),
         FedBuff(buffer_size=4, byzantine_timing="at_bound", max_staleness=1, batch_size=8),
         FedBuff(buffer_size=4, byzantine_timing="replay", max_staleness=1, batch_size=8),
         Kardam(buffer_size=4, byzantine_timing="always_first", batch_size=8),
         ZenoPP(buffer_size=4, byzantine_timing="always_first", batch_size=8)]


@pytest.mark.parametrize("attack", attacks.names())
def test_every_attack_plays_under_every_time_attack_and_filter(attack: str) -> None:
    """Every attack of the registry under each time attack (FedBuff) and under Kardam and Zeno++ (always first):
    three server steps with a finite model and the Byzantine updates counted, or refused before anything runs in one
    line naming ``attack…``."""
    for algo in TIMED:
        try:
            exp = experiment(algo, "cwtm", 1, byzantine=1, attack=attack, rounds=3)
        except ConfigError as exc:  # (the honest baseline may not be timed: its timing is named)
            assert "\n" not in str(exc) and exc.parameter.startswith(
                "algorithm_params.byzantine_timing" if attack == "honest" else "attack")
            return
        loop = Loop(exp, callbacks=[Evaluate()])
        rows = loop.run()
        assert bool(torch.isfinite(loop.state.theta).all()), algo
        assert rows[-1]["byzantine_updates"] >= 1, algo


@pytest.mark.parametrize("timing", ["last_slot", "at_bound", "replay"])
def test_time_attacks_are_deterministic_given_the_seed(timing: str) -> None:
    """Two runs of a time attack with the seed are equal bit for bit (θ and every metric row)."""
    algo = FedBuff(buffer_size=4, max_staleness=2, byzantine_timing=timing)
    a, b = Loop(experiment(algo, rounds=6), callbacks=[Evaluate()]), Loop(experiment(algo, rounds=6),
                                                                          callbacks=[Evaluate()])
    assert a.run() == b.run() and torch.equal(a.state.theta, b.state.theta)


def test_a_replay_run_resumes_bit_for_bit(tmp_path: Path) -> None:
    """The replay attacker's stored updates are the algorithm's state: a run stopped after step 4 and resumed ends
    with the uninterrupted run's checkpoint, key for key; a checkpoint without them is refused in one line."""
    cfg = make_config({"dataset": "digits", "model": "logreg", "workers": 8, "byzantine": 2, "f": 0,
                       "aggregator": "mean", "attack": "signflip", "algorithm": "fedbuff",
                       "algorithm_params": {"buffer_size": 3, "max_staleness": 2, "byzantine_timing": "replay"},
                       "rounds": 8, "eval_every": 4, "checkpoint_every": 4, "lr": 0.5, "seed": 4})
    a, b, _ = whole_and_resumed(cfg, tmp_path, stop=4)
    assert set(a) == set(b) and "algorithm.replay" in a
    for key in a:
        assert torch.equal(a[key], b[key]), key
    algo = FedBuff(buffer_size=3, max_staleness=2, byzantine_timing="replay")
    exp = experiment(algo, workers=8)
    own = algo.initial_state(exp, exp.problem.initial_theta())
    with pytest.raises(ConfigError, match=r"^start=") as info:
        algo.load_state(exp, {k: v for k, v in own.items() if k != "replay"})
    assert "\n" not in str(info.value)
