"""Buffered asynchronous training on a simulated clock (issue 36): FedBuff (Nguyen et al., AISTATS 2022) and BASGD
(Yang & Li, ICML 2021) as one-file round algorithms; the clock's staleness bound, drops and versions in flight; one
batched gradient call per server step; a resumed run equal to the uninterrupted one bit for bit; the always-first
time attack; every registry rule over buffers; and the bad inputs refused in one line before anything runs."""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import pickle
import re
from pathlib import Path
from typing import Any

import pytest
import torch
from tests._interrupt import whole_and_resumed
from torch import Tensor
from typer.testing import CliRunner

from phalanx import aggregators, attacks, cli, data, models
from phalanx.errors import ConfigError
from phalanx.experiments import make_config
from phalanx.training import Experiment, Loop
from phalanx.training.algorithms import traces
from phalanx.training.algorithms.asynchronous import Asynchronous
from phalanx.training.algorithms.basgd import BASGD
from phalanx.training.algorithms.clock import Clock, Speeds
from phalanx.training.algorithms.fedbuff import FedBuff, staleness_weight
from phalanx.training.loop import Evaluate

DS = data.load("digits")
CHANCE = 1 / DS.num_classes


def experiment(algo: Asynchronous, rule: str = "mean", f: int = 0, workers: int = 10, byzantine: int = 0,
               attack: str = "none", rounds: int = 6, seed: int = 1, eval_every: int = 1,
               attack_params: dict[str, Any] | None = None) -> Experiment:
    torch.manual_seed(0)  # the model's initialisation
    return Experiment(model=models.make("logreg", DS.input_shape, DS.num_classes), dataset=DS, workers=workers,
                      byzantine=byzantine, rule=aggregators.make(rule, f=f),
                      attack=attacks.make(attack, **(attack_params or {})),
                      algorithm=algo, rounds=rounds, lr=0.5, seed=seed, eval_every=eval_every)


def run(exp: Experiment) -> tuple[Loop, list[dict[str, Any]]]:
    loop = Loop(exp, callbacks=[Evaluate()])
    return loop, loop.run()


# --- the clock ------------------------------------------------------------------------------------------------------


def test_the_staleness_bound_drops_what_is_older_and_only_that() -> None:
    """Widely spread speeds (lognormal σ = 2) and S = 1: stale updates arrive, every one older than S is dropped and
    counted, no aggregated update is older than S. The mutant — the same run with the bound lifted — aggregates
    updates older than 1: the bound is what keeps them out."""
    _, rows = run(experiment(FedBuff(buffer_size=3, max_staleness=1, speeds="lognormal(2.0)"), rounds=12))
    assert rows[-1]["dropped"] > 0
    assert sum(r["dropped_step"] for r in rows) == rows[-1]["dropped"]
    assert max(r["staleness_max"] for r in rows) <= 1
    _, lifted = run(experiment(FedBuff(buffer_size=3, max_staleness=100, speeds="lognormal(2.0)"), rounds=12))
    assert max(r["staleness_max"] for r in lifted) > 1 and lifted[-1]["dropped"] == 0


def test_versions_in_flight_are_bounded_by_the_staleness_bound() -> None:
    """The algorithm keeps S + 1 versions of θ, and every aggregated update started from one of θ_{t−S} … θₜ (ring
    slot v mod (S + 1) still holds θ_v when it is read: checked against the θ the loop had at version v)."""
    algo = FedBuff(buffer_size=3, max_staleness=2, speeds="lognormal(1.5)")
    loop = Loop(experiment(algo, rounds=10))
    loop.open()
    assert loop.state.own["thetas"].shape == (3, loop.experiment.problem.dim)
    history = [loop.state.theta.clone()]
    while loop.state.round < 10:
        loop.step()
        history.append(loop.state.theta.clone())
        t = loop.state.round - 1
        for v in range(max(0, t - 2), t + 1):
            assert torch.equal(loop.state.own["thetas"][v % 3], history[v])


def test_each_server_step_computes_its_arrivals_in_one_batched_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """One ``grads_each`` call per server step, whatever the versions of its arrivals; and its rows equal each
    worker's gradient computed alone at its own version's θ (the batching changes no number beyond float32
    reassociation)."""
    exp = experiment(BASGD(buffers=4, max_staleness=3, speeds="lognormal(1.0)"), rounds=5)
    calls: list[tuple[Tensor, Tensor, Tensor]] = []
    original = exp.problem.grads_each

    def counting(thetas: Tensor, xb: Tensor, yb: Tensor) -> Tensor:
        calls.append((thetas.clone(), xb, yb))
        return original(thetas, xb, yb)

    monkeypatch.setattr(exp.problem, "grads_each", counting)
    loop = Loop(exp)
    loop.run()
    assert len(calls) == 5
    thetas, xb, yb = calls[-1]
    assert len({tuple(row.tolist()) for row in thetas}) > 1  # the last step mixes versions
    alone = torch.stack([exp.problem.grads(thetas[i], xb[i : i + 1], yb[i : i + 1])[0] for i in range(len(xb))])
    tol = 64 * torch.finfo(torch.float32).eps * (1 + float(alone.abs().max()))
    torch.testing.assert_close(original(thetas, xb, yb), alone, atol=tol, rtol=0)


def test_fedbuffs_staleness_scaling_is_the_papers() -> None:
    """w(s) = 1/√(1 + s): 1 for a fresh update, ½ at staleness 3; the rows are the scaled updates."""
    assert staleness_weight(torch.tensor([0, 3, 8])).tolist() == [1.0, 0.5, 1 / 3]
    exp = experiment(FedBuff(buffer_size=2))
    updates = torch.ones(2, 4)
    rows, ids, byz = FedBuff(buffer_size=2).assemble(exp, torch.tensor([0, 9]), updates, torch.tensor([0, 3]))
    assert rows[:, 0].tolist() == [1.0, 0.5] and ids == [0, 9] and byz.tolist() == [False, False]


def test_an_interrupted_run_resumes_bit_for_bit(tmp_path: Path) -> None:
    """The clock (speeds, arrivals, versions, statistics) and the ring of versions are checkpointed: a run stopped
    after server step 4 and resumed ends with the same checkpoint, key for key, as the run that never stopped."""
    cfg = make_config({"dataset": "digits", "model": "logreg", "workers": 8, "byzantine": 2, "f": 1,
                       "aggregator": "cwtm", "attack": "alie", "algorithm": "basgd",
                       "algorithm_params": {"buffers": 4, "max_staleness": 2, "byzantine_timing": "always_first"},
                       "rounds": 8, "eval_every": 4, "checkpoint_every": 4, "lr": 0.5, "seed": 4})
    a, b, part = whole_and_resumed(cfg, tmp_path, stop=4)
    assert set(a) == set(b) and {"algorithm.arrival", "algorithm.thetas"} <= set(a)
    for key in a:
        assert torch.equal(a[key], b[key]), key
    rows = [json.loads(line) for line in next((tmp_path / "whole").glob("**/metrics.jsonl")).read_text().splitlines()]
    resumed = [json.loads(line) for line in next(part.glob("**/metrics.jsonl")).read_text().splitlines()]
    assert rows == resumed and rows[-1]["sim_time"] > 0


# --- the time attack ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_always_first_fills_the_buffers_beyond_their_share(seed: int) -> None:
    """n = 10, b = 2, K = 4: always-first Byzantine workers deliver first in every step, so every FedBuff buffer
    holds exactly min(b, K)/K = ½ of Byzantine updates — above b/n = 0.2 — while BASGD's hashing keeps the
    Byzantine-touched buffers at most b whatever the timing."""
    timing = "always_first"
    _, rows = run(experiment(FedBuff(buffer_size=4, byzantine_timing=timing), byzantine=2, attack="signflip",
                             seed=seed))
    shares = [r["byzantine_buffer_share"] for r in rows[1:]]
    assert shares == [0.5] * len(shares) and rows[-1]["byzantine_buffer_share_mean"] > 2 / 10
    _, rows = run(experiment(BASGD(buffers=5, byzantine_timing=timing), "cwmed", 2, byzantine=2, attack="signflip",
                             seed=seed))
    assert all(r["byzantine_rows"] <= 2 for r in rows) and rows[-1]["byzantine_buffer_share_mean"] > 2 / 10


def test_honest_timing_is_not_always_first() -> None:
    """The mutant of the test above: without the time attack the same Byzantine workers do not hold half of every
    buffer (they run at the speeds the distribution gave them)."""
    _, rows = run(experiment(FedBuff(buffer_size=4), byzantine=2, attack="signflip", seed=0))
    assert any(r["byzantine_buffer_share"] != 0.5 for r in rows[1:])


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_basgd_with_a_robust_rule_holds_where_fedbuffs_mean_does_not(seed: int) -> None:
    """Always-first sign flippers scaled by 10 (b = 2 of n = 10: in any mean that holds them, 2 × 10 outweighs the
    at most 8 honest updates beside them, so a mean must go the wrong way). The bar is the midpoint between chance
    (1/10 on digits) and the accuracy the same FedBuff run reaches without an attack: "holds" is above it, "breaks"
    below. FedBuff's mean (half of each buffer Byzantine) breaks; BASGD with the coordinate-wise median over B = 5
    buffers (at most 2 touched, f = 2 < 5/2) holds; the mutant — BASGD with the mean over its buffers — breaks: the
    robustness is the rule's over buffers, not the buffering's."""
    kw: dict[str, Any] = {"byzantine": 2, "rounds": 30, "seed": seed, "eval_every": 30,
                          "attack_params": {"scale": 10.0}}
    _, clean = run(experiment(FedBuff(buffer_size=4, byzantine_timing="always_first"),
                              **{**kw, "byzantine": 0, "attack_params": None}))
    bar = (CHANCE + clean[-1]["test_accuracy"]) / 2
    assert clean[-1]["test_accuracy"] > CHANCE + 0.5  # the setting learns at all
    first = {"byzantine_timing": "always_first"}
    _, fedbuff = run(experiment(FedBuff(buffer_size=4, **first), attack="signflip", **kw))
    _, basgd = run(experiment(BASGD(buffers=5, **first), "cwmed", 2, attack="signflip", **kw))
    _, mutant = run(experiment(BASGD(buffers=5, **first), "mean", 0, attack="signflip", **kw))
    assert fedbuff[-1]["test_accuracy"] < bar
    assert basgd[-1]["test_accuracy"] > bar
    assert mutant[-1]["test_accuracy"] < bar


# --- rules and attacks over buffers ---------------------------------------------------------------------------------


RULES = [*(r for r in aggregators.names() if r not in ("arc", "bucketing", "clip", "nnm")),
         "arc>cwtm", "bucketing>cwmed", "clip>mean", "nnm>cwtm"]


@pytest.mark.parametrize("rule", RULES)
def test_every_registry_rule_runs_over_buffers(rule: str) -> None:
    """Every rule of the registry (and each pre-aggregation in a chain) aggregates BASGD's buffer means and FedBuff's
    buffered updates under an always-first ALIE attack: B = K = the rule's smallest population for f = 1 (at least
    3), two server steps, a finite model, and one row touched by the one Byzantine worker."""
    size = max(3, aggregators.make(rule, f=1).min_workers())
    for algo in (BASGD(buffers=size, byzantine_timing="always_first", batch_size=8),
                 FedBuff(buffer_size=size, byzantine_timing="always_first", batch_size=8)):
        loop, rows = run(experiment(algo, rule, 1, workers=size + 2, byzantine=1, attack="alie", rounds=2))
        assert bool(torch.isfinite(loop.state.theta).all())
        assert rows[-1]["byzantine_rows"] == 1


@pytest.mark.parametrize("attack", attacks.names())
def test_every_attack_plays_asynchronously_or_is_refused_in_one_line(attack: str) -> None:
    """Every attack of the registry on always-first Byzantine workers of a FedBuff run: it runs two server steps
    (a vector attack's rows, a data attack's poisoned batches) or is refused before anything runs, in one line."""
    try:
        exp = experiment(FedBuff(buffer_size=4, byzantine_timing="always_first", batch_size=8), "cwtm", 1,
                         byzantine=1, attack=attack, rounds=2)
    except ConfigError as exc:  # (the honest baseline may not arrive first: its timing is named)
        assert "\n" not in str(exc) and exc.parameter.startswith(
            "algorithm_params.byzantine_timing" if attack == "honest" else "attack")
        return
    _, rows = run(exp)
    assert rows[-1]["byzantine_updates"] == 2  # one per step: the Byzantine worker's, first


# --- bad input ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("make", "parameter"), [
    (lambda: experiment(FedBuff(buffer_size=11)), "algorithm_params.buffer_size"),
    (lambda: experiment(BASGD(buffers=11)), "algorithm_params.buffers"),
    (lambda: FedBuff(max_staleness=-1), "algorithm_params.max_staleness"),
    (lambda: FedBuff(speeds="lognormal(0)"), "algorithm_params.speeds"),
    (lambda: FedBuff(speeds="lognormal(-1)"), "algorithm_params.speeds"),
    (lambda: FedBuff(speeds=[1.0, 0.0]), "algorithm_params.speeds"),
    (lambda: FedBuff(speeds=[1.0, float("nan")]), "algorithm_params.speeds"),
    (lambda: FedBuff(speeds="weibull(2)"), "algorithm_params.speeds"),
    (lambda: experiment(FedBuff(speeds=[1.0] * 9)), "algorithm_params.speeds"),
    (lambda: FedBuff(byzantine_timing="last"), "algorithm_params.byzantine_timing"),
    (lambda: FedBuff(buffer_size=0), "algorithm_params.buffer_size"),
    (lambda: experiment(BASGD(buffers=5), "cwmed", 3, byzantine=3), "f"),
    (lambda: experiment(BASGD(buffers=5), "krum", 2, byzantine=2), "algorithm_params.buffers"),
    (lambda: FedBuff().one_worker(None, 0, {}, None), "engine"),
])
def test_bad_input_is_refused_in_one_line(make: Any, parameter: str) -> None:
    with pytest.raises(ConfigError) as info:
        make()
    assert info.value.parameter == parameter and "\n" not in str(info.value)


def test_the_rule_is_checked_against_the_buffers_not_the_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    """Krum with f = 2 needs 7 vectors: 5 buffers are refused though 10 workers would do. The mutant — BASGD claiming
    the rule sees every worker — accepts it: the check is the buffers'."""
    with pytest.raises(ConfigError, match=r"algorithm_params\.buffers"):
        experiment(BASGD(buffers=5), "krum", 2, byzantine=2)
    monkeypatch.setattr(BASGD, "per_round", lambda self, workers: workers)
    experiment(BASGD(buffers=5), "krum", 2, byzantine=2)


def test_the_config_refuses_what_the_api_does() -> None:
    base = {"dataset": "digits", "model": "logreg", "workers": 6, "aggregator": "cwmed", "f": 1}
    with pytest.raises(ConfigError, match=r"^algorithm_params.buffer_size=7"):
        make_config({**base, "algorithm": "fedbuff", "algorithm_params": {"buffer_size": 7}})
    with pytest.raises(ConfigError, match=r"^f=2"):
        make_config({**base, "f": 2, "byzantine": 2, "algorithm": "basgd", "algorithm_params": {"buffers": 4}})
    with pytest.raises(ConfigError, match=r"^algorithm_params.filter_f=2 .*on processes"):  # n − 1 = 6 ranks compute
        make_config({**base, "workers": 7, "engine": "torchrun", "algorithm": "kardam",
                     "algorithm_params": {"buffer_size": 3, "filter_f": 2}})
    with pytest.raises(ConfigError, match=r"^attack="):  # on real processes, only attacks one worker plays alone
        make_config({**base, "engine": "torchrun", "algorithm": "fedbuff", "algorithm_params": {"buffer_size": 3},
                     "attack": "alie", "byzantine": 1})


def test_a_hostile_checkpoint_clock_is_refused() -> None:
    """A resumed state with a clock of another population, or a non-finite arrival, is refused in one line."""
    clock = Clock(workers=4, byzantine=1, max_staleness=1, timing="honest")
    state = clock.start(Speeds.parse("constant").draw(4, 0))
    clock.check_state(state)
    for bad in ({**state, "arrival": torch.tensor([0.0, float("inf"), 1.0, 1.0], dtype=torch.float64)},
                {**state, "version": torch.zeros(3, dtype=torch.int64)}):
        with pytest.raises(ConfigError, match=r"^start="):
            clock.check_state(bad)


# --- CLI ------------------------------------------------------------------------------------------------------------


def test_the_cli_lists_and_runs_them(tmp_path: Path) -> None:
    runner = CliRunner()
    res = runner.invoke(cli.app, ["list", "algorithms", "--format", "csv"])
    assert res.exit_code == 0 and "fedbuff" in res.output and "basgd" in res.output and "AISTATS 2022" in res.output
    res = runner.invoke(cli.app, ["run", "--set", "dataset=digits", "--set", "model=logreg", "--set", "workers=6",
                                  "--set", "aggregator=mean", "--set", "f=0", "--set", "byzantine=0",
                                  "--set", "algorithm=fedbuff", "--set", "algorithm_params={buffer_size = 3}",
                                  "--set", "rounds=2", "--set", "seed=0", "--out", str(tmp_path / "out")])
    assert res.exit_code == 0, res.output
    rows = [json.loads(line) for line in next(tmp_path.glob("out/**/metrics.jsonl")).read_text().splitlines()]
    assert rows[-1]["round"] == 2 and rows[-1]["updates"] == 6


def test_a_shared_algorithm_object_keeps_each_runs_clock() -> None:
    """Two runs of one algorithm object, stepped in turn, each keep their own clock (the state lives in the run)."""
    algo = FedBuff(buffer_size=3)
    a, b = Loop(experiment(algo, seed=1)), Loop(experiment(algo, seed=2))
    for _ in range(3):
        a.step()
        b.step()
    alone = Loop(experiment(dataclasses.replace(algo), seed=1))
    for _ in range(3):
        alone.step()
    assert torch.equal(a.state.theta, alone.state.theta)





# --- FedScale device traces -----------------------------------------------------------------------------------------


def test_the_shipped_trace_is_fedscales_format_and_gives_the_speeds() -> None:
    """The sample is the pickle of its generator's table (its provenance), in FedScale's device-capacity format; worker
    i is the i-th client by id, its speed median(latency)/latencyᵢ; a run on it takes its speeds from it."""
    raw = traces.SAMPLE.read_bytes()
    assert raw == pickle.dumps(traces.sample_table(), protocol=4)
    table = traces.sample_table()
    latency = [table[c]["computation"] for c in sorted(table)]
    median = sorted(latency)[len(latency) // 2]
    assert traces.load("fedscale:sample") == tuple(median / v for v in latency)
    loop, rows = run(experiment(FedBuff(buffer_size=3, speeds="fedscale:sample"), rounds=3))
    assert loop.state.own["speed"].tolist() == [median / v for v in latency[:10]]
    assert rows[-1]["sim_time"] > 0


class _Named:
    pass


@pytest.mark.parametrize(("payload", "says"), [
    (pickle.dumps({1: _Named()}), "not a pickle of plain data"),
    (pickle.dumps(collections.OrderedDict({1: {"computation": 1.0}})), "not a pickle of plain data"),
    (b"not a pickle", "not a pickle of plain data"),
    (pickle.dumps([1.0, 2.0]), "not a non-empty dict"),
    (pickle.dumps({}), "not a non-empty dict"),
    (pickle.dumps({1: {"computation": 0.0}}), "'computation' must be"),
    (pickle.dumps({1: {"computation": float("nan")}}), "'computation' must be"),
    (pickle.dumps({1: {"computation": True}}), "'computation' must be"),
    (pickle.dumps({1: {"communication": 3.0}}), "'computation' must be"),
    (pickle.dumps({1: {"computation": 1.0}, "a": {"computation": 1.0}}), "mixed"),
    # an attacker's review: a value nested 200,000 deep made the error's repr raise RecursionError (a traceback)
    (b"\x80\x04}K\x01}\x8c\x0bcomputation" + b"]" * 200_001 + b"a" * 200_000 + b"ss.", "'computation' must be"),
])
def test_a_hostile_trace_is_refused_in_one_line(tmp_path: Path, payload: bytes, says: str) -> None:
    """A trace is unpickled with no globals (a pickle that names any class — the only way one runs code — is refused,
    the mutant being plain ``pickle.loads``, which builds the object) and checked entry by entry."""
    path = tmp_path / "trace.pkl"
    path.write_bytes(payload)
    with pytest.raises(ConfigError, match=re.escape(says)) as info:
        FedBuff(speeds=f"fedscale:{path}")
    assert info.value.parameter == "algorithm_params.speeds" and "\n" not in str(info.value)
    if b"_Named" in payload:
        assert isinstance(pickle.loads(payload)[1], _Named)  # the mutant: an ordinary unpickler builds it


def test_a_trace_too_large_missing_or_too_short_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match="cannot be read"):
        FedBuff(speeds=f"fedscale:{tmp_path / 'absent.pkl'}")
    fifo = tmp_path / "trace.fifo"  # a FIFO blocked the read for ever, /dev/zero was read until memory ran out
    os.mkfifo(fifo)
    for path in (fifo, Path("/dev/zero")):
        with pytest.raises(ConfigError, match="not a regular file"):
            FedBuff(speeds=f"fedscale:{path}")
    monkeypatch.setattr(traces, "MAX_BYTES", 100)
    with pytest.raises(ConfigError, match="more than the 100 such a file may have"):
        FedBuff(speeds="fedscale:sample")
    monkeypatch.undo()
    with pytest.raises(ConfigError, match="at least as many clients as workers"):
        experiment(FedBuff(speeds="fedscale:sample"), workers=33)


def test_only_the_runs_own_last_state_skips_the_clock_checks() -> None:
    """load_state takes the state the run's own last step returned (the same object) unchecked — the speed-up — and
    still refuses a corrupted copy of it (the mutant that skips the checks for any state would take it)."""
    from phalanx.training.algorithms.asynchronous import clock_stage

    algo = FedBuff(buffer_size=3)
    exp = experiment(algo)
    loop = Loop(exp)
    loop.step()
    stage = clock_stage(exp)
    made = stage.made
    assert made is not None and stage.own is made
    bad = {**made, "arrival": torch.full_like(made["arrival"], float("inf"))}
    with pytest.raises(ConfigError, match=r"^start="):
        algo.load_state(exp, bad)
    algo.load_state(exp, made)
    assert stage.own is made


def test_a_checkpoint_from_before_the_unavailable_stat_resumes() -> None:
    """The clock's last statistic, ``unavailable``, came with availability traces: a checkpoint written before it
    holds one statistic fewer. It resumes with that count 0 (every worker was always available then); a clock state
    missing more is still refused in one line."""
    from phalanx.training.algorithms.asynchronous import clock_stage

    exp = experiment(FedBuff(buffer_size=3), rounds=3)
    run(exp)
    own = clock_stage(exp).own
    assert own is not None
    full = own["stats"].clone()
    exp.algorithm.load_state(exp, {**own, "stats": full[:-1].clone()})
    assert torch.equal(clock_stage(exp).own["stats"], torch.cat([full[:-1], full.new_zeros(1)]))
    with pytest.raises(ConfigError, match=r"^start="):
        exp.algorithm.load_state(exp, {**own, "stats": full[:-2].clone()})


def test_the_honest_baseline_arrives_as_honest_workers_do() -> None:
    """``attack = "honest"`` is the price's all-honest baseline; with ``byzantine_timing = "always_first"`` its
    workers would deliver instantly and first, so the run is not all-honest yet a report would read it as one (an
    attacker's review): refused in one line naming the key. The same timing under a real attack is accepted."""
    from phalanx.experiments import from_config

    base = {"dataset": "digits", "model": "logreg", "workers": 10, "byzantine": 2, "f": 0, "aggregator": "mean",
            "algorithm": "fedbuff", "algorithm_params": {"buffer_size": 4, "byzantine_timing": "always_first"},
            "rounds": 2}
    with pytest.raises(ConfigError, match=r"^algorithm_params\.byzantine_timing='always_first' is invalid"):
        from_config(make_config({**base, "attack": "honest"}))
    assert from_config(make_config({**base, "attack": "signflip"})) is not None
