"""The corrupted-rounds study (phalanx.studies.corrupted, `phalanx experiment corrupted-rounds`): the intermittent
attack it runs, the grid and its configurations, the paired comparisons, and one tiny end-to-end run through the
CLI."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file
from tests._raw import assert_rebuilt

from _interrupt import train_interrupted
from phalanx import attacks, studies
from phalanx.attacks import AttackContext
from phalanx.errors import ConfigError
from phalanx.experiments import make_config, train
from phalanx.studies import corrupted


def _ctx(t: int, seed: int = 0) -> AttackContext:
    honest = torch.randn(5, 4, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return AttackContext(honest, 2, 2, None, torch.Generator().manual_seed(seed), round=t)


def test_intermittent_attacks_only_its_rounds_and_replays_honest_rows_in_the_others() -> None:
    a = attacks.make("intermittent", attack="signflip", params={"scale": 3.0}, every=5, start=2, length=2)
    assert [t for t in range(15) if a.active(t)] == [2, 3, 7, 8, 12, 13] and a.attacked(15) == 6
    base = attacks.make("signflip", scale=3.0)
    for t in range(10):
        ctx = _ctx(t)
        want = base(ctx) if a.active(t) else ctx.honest[:2]
        assert torch.equal(a(ctx), want)
    assert attacks.make("intermittent", **a.params()).params() == a.params()


def test_a_stochastic_wrapped_attack_draws_only_in_its_active_rounds() -> None:
    a = attacks.make("intermittent", attack="gaussian", every=3)
    g = torch.Generator().manual_seed(1)
    honest = torch.randn(4, 3, dtype=torch.float64)
    for t in range(6):
        before = g.get_state()
        a(AttackContext(honest, 1, 1, None, g, round=t))
        assert torch.equal(g.get_state(), before) != a.active(t)
    assert a.describe()["stochastic"] is True


def test_a_run_under_an_intermittent_stochastic_attack_resumes_bit_for_bit(tmp_path: Path) -> None:
    run = {"dataset": "digits", "model": "mlp", "model_params": {"hidden": [8]}, "workers": 6, "byzantine": 1, "f": 1,
           "aggregator": "mean", "attack": "intermittent", "rounds": 12, "batch_size": 8, "lr": 0.1,
           "attack_params": {"attack": "gaussian", "params": {"sigma": 5.0}, "every": 5, "start": 3},
           "eval_every": 4, "checkpoint_every": 4, "seed": 2}
    full = train(make_config(run), tmp_path / "full") and tmp_path / "full"
    part = train_interrupted(make_config(run), tmp_path / "part", 4)  # attacked rounds 3 | 8: both sides of the stop
    train(make_config(run), part)
    a, b = load_file(str(full / "checkpoint.safetensors")), load_file(str(part / "checkpoint.safetensors"))
    assert set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize(("params", "key"), [
    ({"attack": "labelflip"}, "attack"), ({"attack": "intermittent"}, "attack"), ({"every": 0}, "every"),
    ({"start": -1}, "start"), ({"every": 3, "length": 4}, "length"), ({"params": {"scale": -1.0}}, "scale"),
])
def test_intermittent_bad_parameters_name_the_key(params: dict[str, object], key: str) -> None:
    with pytest.raises(ConfigError) as exc:
        attacks.make("intermittent", **params)
    assert exc.value.parameter == key


def test_quick_grid_is_rules_by_arm_by_attack_by_seeds_of_valid_configs() -> None:
    p = corrupted.preset("quick")
    k = corrupted.corrupted(p)
    assert k == 10 == attacks.make("intermittent", **corrupted.attack_params(p)).attacked(p.rounds)
    cells, runs = corrupted.CorruptedRounds().plan(p, {})
    cfgs = [r.cfg for r in runs]
    assert len(cells) == len(p.rules) * len(corrupted.ARMS) * 2 * len(p.seeds) == len(cfgs)
    told = {"robust-online": (k, p.gradient_bound, p.online_scale), "undefended-online": (0, p.gradient_bound,
            p.online_scale), "undefended-tuned": (0, p.undefended_bound, p.undefended_scale),
            "online-no-k": (1, p.gradient_bound, p.online_scale)}
    for c, cfg in zip(cells, cfgs):
        assert cfg.aggregator == c.rule and cfg.f == (0 if c.rule == "mean" else p.f)
        assert (cfg.attack, cfg.byzantine) == (("intermittent", p.byzantine) if c.attacked else ("none", 0))
        if c.optimizer in told:
            budget, bound, scale = told[c.optimizer]
            assert cfg.server_optimizer == "robust-online" and cfg.lr == scale
            assert cfg.server_optimizer_params == {"corruptions": budget, "gradient_bound": bound}
        elif c.optimizer == "clipped-sgd":  # the same G as the learner clips to
            assert cfg.server_optimizer_params == {"clip": p.gradient_bound} and cfg.lr == p.clipped_lr
        else:
            assert (cfg.server_optimizer, cfg.lr) == ("sgd", p.lr)
    assert studies.resolve("corrupted-rounds") is corrupted.CorruptedRounds
    told_cfg = corrupted.CorruptedRounds().run(corrupted.preset("quick", corruptions=0),
                                               corrupted.Cell("mean", "robust-online", True, 0)).cfg
    assert told_cfg.server_optimizer_params["corruptions"] == 0


def test_the_runs_of_the_earlier_two_arm_grid_keep_their_ids() -> None:
    """Adding the controls adds runs; the sgd and robust-online runs are the ones the study ran before (their run
    ids pinned here), so a finished run directory is reused."""
    study = corrupted.CorruptedRounds()
    p = corrupted.preset("quick")
    ids = {c: study.run(p, c).run_id for c in (corrupted.Cell("mean", "sgd", True, 0),
                                                                  corrupted.Cell("mean", "robust-online", True, 0))}
    two = corrupted.preset("quick", arms=("sgd", "robust-online"))
    assert ids == {c: study.run(two, c).run_id for c in ids}
    assert len(corrupted.cells(two)) == len(two.rules) * 2 * 2 * len(two.seeds)


@pytest.mark.parametrize(("changes", "key"), [
    ({"rules": ("cwtm", "cwmed")}, "rules"), ({"f": 1}, "f"), ({"seeds": (0,)}, "seeds"),
    ({"gradient_bound": 0.0}, "gradient_bound"), ({"online_scale": float("inf")}, "online_scale"),
    ({"start": 150}, "start"), ({"corruptions": -1}, "corruptions"),
    ({"every": 0}, "every"), ({"start": -1}, "start"), ({"rounds": -5}, "rounds"), ({"rounds": 0}, "rounds"),
    ({"arms": ("sgd", "adam")}, "arms"),
    ({"arms": ("clipped-sgd", "robust-online")}, "arms"), ({"clipped_lr": 0.0}, "clipped_lr"),
    ({"undefended_scale": float("nan")}, "undefended_scale"), ({"undefended_bound": True}, "undefended_bound"),
])
def test_preset_errors_name_the_field(changes: dict[str, object], key: str) -> None:
    with pytest.raises(ConfigError) as exc:
        corrupted.preset("quick", **changes)
    assert exc.value.parameter == key


def test_comparisons_are_paired_by_seed_and_holm_adjusted() -> None:
    p = corrupted.preset("quick", rules=("mean", "cwtm"), seeds=(0, 1, 2), arms=("sgd", "clipped-sgd",
                                                                                 "robust-online"))
    acc = {("mean", "sgd", True): [0.10, 0.12, 0.08], ("mean", "robust-online", True): [0.90, 0.93, 0.91],
           ("mean", "clipped-sgd", True): [0.95, 0.95, 0.94],
           ("cwtm", "sgd", True): [0.95, 0.94, 0.96], ("cwtm", "robust-online", True): [0.95, 0.93, 0.96],
           ("cwtm", "clipped-sgd", True): [0.95, 0.94, 0.96],
           ("mean", "sgd", False): [0.96, 0.95, 0.97], ("mean", "robust-online", False): [0.95, 0.93, 0.95],
           ("mean", "clipped-sgd", False): [0.96, 0.95, 0.97],
           ("cwtm", "sgd", False): [0.95, 0.95, 0.96], ("cwtm", "robust-online", False): [0.95, 0.94, 0.96],
           ("cwtm", "clipped-sgd", False): [0.95, 0.95, 0.96]}
    finals = {corrupted.Cell(r, o, a, s): corrupted.Final(v[s], ((150, v[s]),))
              for (r, o, a), v in acc.items() for s in range(3)}
    found = corrupted.comparisons(corrupted.tabulate(finals), p)
    cs = {(c.question, c.a): c for c in found}
    buys = cs[("second line, attacked", ("mean", "robust-online", True))]
    assert buys.diff.mean == pytest.approx((0.80 + 0.81 + 0.83) / 3) and buys.verdict == "a is better"
    beyond = cs[("the learner beyond clipping, attacked", ("mean", "robust-online", True))]
    assert beyond.b == ("mean", "clipped-sgd", True) and beyond.diff.mean < 0
    assert cs[("second line, attacked", ("cwtm", "robust-online", True))].verdict == "no difference shown"
    assert cs[("first line, attacked", ("cwtm", "sgd", True))].diff.mean > 0.8
    # the p-values are adjusted over the whole family: Holm's multiplier for the smallest is the family's size
    tested = [c for c in found if c.p == c.p]
    smallest = min(tested, key=lambda c: c.p)
    assert smallest.p_holm == pytest.approx(min(1.0, len(tested) * smallest.p))
    assert all(c.p_holm >= c.p for c in tested)
    # a difference whose raw p is below 0.05 but whose Holm p is not gets no verdict of a difference
    price = cs[("robust-online's price, no attack", ("mean", "robust-online", False))]
    assert price.p < 0.05 < price.p_holm and price.verdict == "no difference shown"
    assert len(found) == 3 * 2 + 1 + 2 + 2 * 2 + 1
    assert "second line, behind mean (robust-online − sgd): +81.3 points" in corrupted.readout(found, p)


def test_cli_runs_a_tiny_grid_and_writes_the_report(tmp_path: Path) -> None:
    out = tmp_path / "corrupted"
    cmd = [sys.executable, "-m", "phalanx.cli", "experiment", "corrupted-rounds", "--seeds", "2", "--out", str(out),
           "-j", "1", "--set", "rounds=4", "--set", "eval_every=2", "--set", "every=2", "--set", "start=1",
           "--set", "workers=6", "--set", "byzantine=1", "--set", "f=1", "--set", "model_params={hidden=[8]}",
           "--set", 'arms=["sgd", "clipped-sgd", "robust-online"]']
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)  # a hang guard: 24 runs, loaded machine
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-3000:]
    # the printed accuracy table has its title, which says what ± is (issue 38: it had none)
    assert "Final test accuracy % (mean ± 95 % Student-t half-width over 2 seeds" in proc.stdout
    report = (out / "report.md").read_text()
    assert "| mean | sgd |" in report and "| cwtm | robust-online |" in report and "| mean | clipped-sgd |" in report
    assert "signflip in 2 of 4 rounds (b = 1)" in report and "no verdict (2 seeds, 3 needed)" in report
    assert (out / "corrupted-rounds.png").stat().st_size > 0
    arms = 3
    assert "| mean | undefended-online |" not in report
    assert len((out / "cells.csv").read_text().splitlines()) == 1 + 2 * arms * 2
    assert len(list((out / "runs").glob("*/DONE"))) == 2 * arms * 2 * 2
    assert_rebuilt("corrupted-rounds", out, 2, ["rounds=4", "eval_every=2", "every=2", "start=1", "workers=6",
                                                "byzantine=1", "f=1", "model_params={hidden=[8]}",
                                                'arms=["sgd", "clipped-sgd", "robust-online"]'])


def _plotted(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[Any]:
    """The axes of ``corrupted-rounds.png`` for a small grid whose mean + sgd seeds (99, 70, 99 %) give a 95 %
    interval reaching past 100 % (drawn before the figure is closed)."""
    p = corrupted.preset("quick", rules=("mean", "cwtm"), seeds=(0, 1, 2), arms=("sgd", "robust-online"))
    acc = {0: 0.99, 1: 0.70, 2: 0.99}
    finals = {c: corrupted.Final(acc[c.seed], ((0, 0.1), (75, acc[c.seed]), (150, acc[c.seed])))
              for c in corrupted.cells(p)}
    est = corrupted.estimates(corrupted.tabulate(finals))
    assert est[("mean", "sgd", True)].high > 1.0  # the interval the tables keep
    seen: list[Any] = []

    def save(fig: Any, path: Path, dpi: int = 100) -> Path:
        fig.canvas.draw()
        seen.extend(fig.axes)
        return path

    monkeypatch.setattr(corrupted, "save_figure", save)
    corrupted.plot(finals, est, p, tmp_path / "corrupted-rounds.png")
    return seen


def _drawn_past(axes: list[Any], lo: float = 0.0, hi: float = 100.0) -> list[str]:
    """Every error-bar end and interval band of ``axes`` drawn below ``lo`` or above ``hi``."""
    from matplotlib.collections import PolyCollection
    from matplotlib.container import ErrorbarContainer

    out = []
    for ax in axes:
        for c in ax.containers:
            if isinstance(c, ErrorbarContainer):
                ys = [y for cap in c.lines[1] for y in cap.get_ydata()]
                ys += [y for seg in c.lines[2][0].get_segments() for _, y in seg]
                out += [f"{ax.get_title()}: bar end {y:.1f}" for y in ys if not lo <= y <= hi]
        for coll in ax.collections:
            if isinstance(coll, PolyCollection):
                ys = [y for path in coll.get_paths() for _, y in path.vertices]
                out += [f"{ax.get_title()}: band {y:.1f}" for y in ys if not lo <= y <= hi]
    return out


def test_the_plot_clips_intervals_to_0_100_and_gives_each_rule_its_panel(monkeypatch: pytest.MonkeyPatch,
                                                                         tmp_path: Path) -> None:
    """Issue 38: the intervals of an accuracy ran past 100 % and twelve by-round curves shared one crowded panel.
    Mutant: the old error bars (± the half-width, unclipped), rejected."""
    axes = _plotted(monkeypatch, tmp_path)
    assert _drawn_past(axes) == []
    titles = [ax.get_title() for ax in axes]
    assert titles == ["no attack", "signflip in 10 of 150 rounds", "under attack, behind mean, by round",
                      "under attack, behind cwtm, by round"]
    for ax in axes[2:]:  # a curve per arm, the legend below the panel, where it covers none
        assert len([ln for ln in ax.get_lines() if not ln.get_label().startswith("_")]) == 2
        assert not ax.get_legend().get_window_extent().overlaps(ax.get_window_extent())
    monkeypatch.setattr(corrupted, "bar_errors", lambda est, keys: [[100 * est[k].half_width for k in keys]] * 2)
    assert any("bar end" in s and float(s.split()[-1]) > 100 for s in _drawn_past(_plotted(monkeypatch, tmp_path)))
