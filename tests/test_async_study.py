"""The asynchrony study (phalanx.studies.asynchrony, `phalanx experiment async`): the grid and its configurations,
the synchronous round's straggler time replayed from the run's own client sampling, time to target and censoring,
the Holm-corrected paired verdicts, and the report's files — each check with the mutant it rejects."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from phalanx import studies
from phalanx.errors import ConfigError
from phalanx.experiments import from_config, stragglers
from phalanx.studies import asynchrony as A
from phalanx.training import Loop
from phalanx.training.algorithms.clock import Speeds
from phalanx.training.algorithms.fedavg import FedAvgClients


def test_quick_grid_is_modes_by_rules_by_attacks_by_seeds_of_valid_configs() -> None:
    p = A.preset("quick")
    cells, runs = A.Asynchrony().plan(p, {})
    cfgs = [r.cfg for r in runs]
    assert len(cells) == len(A.MODES) * len(p.rules) * len(A.ATTACKS) * len(p.seeds) == len(cfgs)
    for c, cfg in zip(cells, cfgs):
        assert cfg.aggregator == c.rule and cfg.f == (0 if c.rule == "mean" else p.f) and cfg.seed == c.seed
        assert (cfg.attack, cfg.byzantine) == (("none", 0) if c.attack == "none" else (p.attack, p.byzantine))
        if c.mode == "sync":
            assert cfg.algorithm == "fedavg" and cfg.clients_per_round == p.per_step and cfg.local_steps == 1
            assert cfg.server_lr == 1.0 and cfg.rounds == p.sync_rounds
        else:
            params = cfg.algorithm_params
            assert cfg.algorithm == c.mode and cfg.rounds == p.async_steps and params["speeds"] == p.speeds
            assert params["buffer_size" if c.mode == "fedbuff" else "buffers"] == p.per_step
            assert params["byzantine_timing"] == ("always_first" if c.attack == "always_first" else "honest")
    # sync's always-first cells share the vector attack's run: trained once
    shared = len(p.rules) * len(p.seeds)
    assert len(A.Asynchrony().runs(runs)) == len(cfgs) - shared
    assert studies.resolve("async") is A.Asynchrony


@pytest.mark.parametrize(("changes", "key"), [
    ({"rules": ("cwtm", "cwmed")}, "rules"), ({"target": 0.0}, "target"), ({"target": 1.5}, "target"),
    ({"horizon": -1.0}, "horizon"), ({"horizon": math.inf}, "horizon"), ({"f": 1}, "f"),
    ({"per_step": 4}, "per_step"), ({"per_step": 30}, "per_step"), ({"async_steps": 0}, "async_steps"),
    ({"seeds": (0,)}, "seeds"),
])
def test_preset_errors_name_the_field(changes: dict[str, object], key: str) -> None:
    with pytest.raises(ConfigError) as exc:
        A.preset("quick", **changes)
    assert exc.value.parameter == key


def _sampled(cfg: object, rounds: int) -> list[list[int]]:
    """The clients the run itself sampled in each round (its own sample(), recorded)."""
    seen: list[list[int]] = []
    original = FedAvgClients.sample

    def record(self: FedAvgClients) -> torch.Tensor:
        ids = original(self)
        seen.append(ids.tolist())
        return ids

    FedAvgClients.sample = record  # type: ignore[method-assign]
    try:
        loop = Loop(from_config(cfg))  # type: ignore[arg-type]
        for _ in range(rounds):
            loop.step()
    finally:
        FedAvgClients.sample = original  # type: ignore[method-assign]
    return seen


def test_the_sync_round_waits_for_its_slowest_sampled_worker_of_the_runs_own_sample() -> None:
    """sync_times replays the run's own sampled sets: each round lasts the slowest sampled worker's 1/v on the speeds
    the asynchronous runs draw. The mutant that replays another stream (the batches') gives other times."""
    p = A.preset("quick", sync_rounds=8)
    cell = A.Cell("sync", "mean", "vector", 3)
    cfg = A.Asynchrony().run(p, cell).cfg
    sampled = _sampled(cfg, 8)
    duration = 1.0 / Speeds.parse(p.speeds).draw(p.workers, cell.seed)
    expected, now = [], 0.0
    for ids in sampled:
        now += float(duration[ids].max())
        expected.append(now)
    assert stragglers.sync_times(p.speeds, p.workers, p.per_step, 8, cell.seed) == pytest.approx(expected, rel=1e-12)
    gen = torch.Generator().manual_seed(12345)  # the mutant: a sample the run did not draw
    wrong, now = [], 0.0
    for _ in range(8):
        now += float(duration[torch.randperm(p.workers, generator=gen)[: p.per_step]].max())
        wrong.append(now)
    assert wrong != pytest.approx(expected, rel=1e-6)
    # always-first attackers take no time: the round waits for the slowest sampled *honest* worker
    instant = stragglers.sync_times(p.speeds, p.workers, p.per_step, 8, cell.seed, instant=p.byzantine)
    honest_only, now = [], 0.0
    for ids in sampled:
        now += max(float(duration[i]) for i in ids if i < p.workers - p.byzantine)
        honest_only.append(now)
    assert instant == pytest.approx(honest_only, rel=1e-12)


def test_time_to_target_is_the_first_evaluation_reaching_it_and_a_miss_is_censored() -> None:
    cv = A.Curve(((0.0, 0.1), (2.0, 0.7), (3.5, 0.82), (5.0, 0.79), (9.0, 0.9)))
    assert cv.time_to(0.8) == 3.5 and cv.time_to(0.95) == math.inf
    assert cv.accuracy_at(4.0) == 0.82 and cv.accuracy_at(9.0) == 0.9
    assert cv.accuracy_at(9.5) is None  # the run ended before the horizon: no extrapolation


def test_sync_rows_are_timed_by_rounds_done() -> None:
    """A sync row of round r (r rounds done) is at the replayed time after round r; round 0 at time 0."""
    p = A.preset("quick", sync_rounds=4)
    cell = A.Cell("sync", "mean", "none", 0)
    cfg = A.Asynchrony().run(p, cell).cfg
    rows = [{"round": 0, "test_accuracy": 0.1}, {"round": 2, "test_accuracy": 0.5}, {"round": 4, "test_accuracy": 0.8}]
    times = stragglers.sync_times(p.speeds, p.workers, p.per_step, 4, 0)
    assert A.curve(rows, cell, cfg, p.speeds).points == ((0.0, 0.1), (times[1], 0.5), (times[3], 0.8))
    fb = A.Cell("fedbuff", "mean", "none", 0)
    assert A.curve([{"round": 3, "test_accuracy": 0.4, "sim_time": 1.25}], fb, A.Asynchrony().run(p, fb).cfg,
                   p.speeds).points == ((1.25, 0.4),)


def _times(p: A.Preset, values: dict[A.Key, list[float]]) -> dict[A.Key, dict[int, float]]:
    return {k: dict(zip(p.seeds, v)) for k, v in values.items()}


def test_verdicts_are_paired_by_seed_holm_corrected_and_a_censored_seed_decides_nothing() -> None:
    p = A.preset("quick", rules=("mean", "cwmed"))
    times = _times(p, {("sync", r, a): [30.0, 31.0, 30.5] for r in p.rules for a in A.ATTACKS})
    times.update(_times(p, {("fedbuff", r, a): [10.0, 12.0, 11.0] for r in p.rules for a in A.ATTACKS}))
    times.update(_times(p, {("basgd", r, a): [20.0, math.inf, 21.0] for r in p.rules for a in A.ATTACKS}))
    cs = A.comparisons(times, p)
    pays = {(c.mode, c.rule, c.attack): c for c in cs if c.what == "asynchrony pays"}
    fb = pays[("fedbuff", "mean", "none")]
    assert fb.estimate is not None and fb.estimate.mean == pytest.approx((20 + 19 + 19.5) / 3)
    assert A.verdict(fb) == "async sooner"
    assert fb.estimate.family == 6  # 6 fedbuff comparisons decide; basgd's (censored) and the prices (zero width) not
    bg = pays[("basgd", "mean", "none")]
    assert bg.estimate is None and bg.censored == (1,) and "seed 1 did not reach" in A.verdict(bg)
    # the mutant that keeps a censored seed as a number (inf) would give an infinite mean: it decides nothing here
    price = [c for c in cs if c.what == "price of robustness" and c.mode == "fedbuff"]
    assert price and price[0].estimate is not None and "zero width" in A.verdict(price[0])
    assert "in 6 of 12 (mode, rule, attack) comparisons" in A.readout(cs, p)
    assert A.readout(cs, A.preset("quick", seeds=(0, 1))).startswith("2 seeds: fewer than 3")


def test_the_report_writes_its_tables_csv_and_figure(tmp_path: Path) -> None:
    p = A.preset("quick", rules=("mean", "cwmed"))
    curves = {}
    for mode in A.MODES:
        for rule in p.rules:
            for attack in A.ATTACKS:
                for s in p.seeds:
                    speed, lag = (1.0, 0.7 * s) if mode == "sync" else (4.0, 0.1 * s)
                    curves[A.Cell(mode, rule, attack, s)] = A.Curve(tuple((t / speed + lag, min(0.1 + t / 100, 0.95))
                                                                          for t in range(0, 200, 10)))
    rep = A.Asynchrony().report(p, list(curves), curves, tmp_path, command="phalanx experiment async", wall_seconds=6.0,
                                runs=60, overrides={})
    text = (tmp_path / "report.md").read_text()
    assert "## Simulated time to 80% test accuracy" in text and "| fedbuff | cwmed |" in text
    assert "| sync − async | fedbuff | mean | none |" in text and "async sooner" in text
    lines = (tmp_path / "cells.csv").read_text().splitlines()
    assert len(lines) == 1 + len(curves) and lines[0].startswith("mode,rule,attack,seed,time_to_target")
    assert (tmp_path / "async.png").stat().st_size > 0 and len(rep.files) == 3
    # the report from its raw results (runs.csv) is this report, byte for byte
    from phalanx.studies import raw

    cells, runs = A.Asynchrony().plan(p, {})
    assert set(cells) == set(curves)
    ids = raw.run_ids(runs)
    (tmp_path / "runs.csv").write_text(raw.write(cells, ids, curves, A.Curve))
    again = tmp_path / "again"
    again.mkdir()
    A.Asynchrony().report(p, list(curves), raw.read(tmp_path / "runs.csv", cells, ids, A.Curve), again,
                          command="phalanx experiment async", wall_seconds=6.0, runs=60, overrides={})
    for name in ("report.md", "cells.csv"):
        assert (again / name).read_bytes() == (tmp_path / name).read_bytes()
