"""Adaptive clipping of the aggregate (phalanx.training.stages.adaptive_clip): with at most f Byzantine rows of any
kind among the m received, the aggregate leaves with norm at most κ · the largest honest norm and the threshold is
at least κ · the (k − f)-th smallest honest norm; a non-finite aggregate becomes 0 and is counted; found by name with
no registry line; turned on by a TOML section from `phalanx run` and by `Experiment(stages=...)`; its bad parameters
and a hostile checkpoint state are one line; a resumed run is the uninterrupted one bit for bit.

Added by a newcomer following docs/design.md, "Add a stage": this file and the stage's module, nothing else."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file
from torch import Tensor
from typer.testing import CliRunner

from _interrupt import train_interrupted
from phalanx import aggregators, attacks, cli, data, models
from phalanx.errors import ConfigError
from phalanx.experiments import make_config, runstate, store, train
from phalanx.training import Experiment, run
from phalanx.training.divergence import Diverged
from phalanx.training.server import RoundResult
from phalanx.training.stages import registry
from phalanx.training.stages.adaptive_clip import AdaptiveClip, threshold
from phalanx.training.stages.base import ServerRound
from phalanx.training.state import Received

EPS = torch.finfo(torch.float32).eps
"""Scaling a float32 aggregate by a float64 factor rounds each coordinate once and the factor once: the clipped
norm is at most τ·(1 + 2·eps) — 4·eps allowed."""

RUN: dict[str, Any] = {
    "dataset": "digits", "model": "mlp", "model_params": {"hidden": [16]}, "workers": 7, "byzantine": 2, "f": 2,
    "aggregator": "mean", "attack": "inf", "rounds": 8, "batch_size": 8, "lr": 0.1, "eval_every": 2,
    "checkpoint_every": 4, "seed": 3, "stages": {"adaptive_clip": {}},
}

TOML = """\
[run]
workers = 7
byzantine = 2
rounds = 2
seed = 0
eval_every = 1

[rule]
spec = "mean"
f = 2

[attack]
name = "inf"

[data]
name = "digits"

[model]
name = "mlp"
hidden = [16]

[stages.adaptive_clip]
quantile = 0.5
multiplier = 1.0
"""


def _round(vectors: Tensor, f: int, t: int = 0) -> ServerRound:
    return ServerRound(t, 10, Received(vectors), RoundResult(0.0, None, None), f, vectors.shape[0], {})


def byzantine_rows(kind: str, honest: Tensor, b: int) -> Tensor:
    """``b`` rows an attacker with full knowledge of the honest rows may send."""
    d = honest.shape[1]
    top = honest[int(torch.linalg.vector_norm(honest, dim=1).argmax())]
    return {
        "1e38": torch.full((b, d), 1e38), "inf": torch.full((b, d), math.inf), "nan": torch.full((b, d), math.nan),
        "zero": torch.zeros(b, d), "tiny": torch.full((b, d), 1e-30), "huge-flip": -1e6 * top.expand(b, d),
        "just-above": 1.5 * top.expand(b, d), "mixed": torch.stack([torch.full((d,), math.inf), torch.zeros(d)])[:b],
    }[kind]


KINDS = ("1e38", "inf", "nan", "zero", "tiny", "huge-flip", "just-above", "mixed")


def assert_bounded(stage: AdaptiveClip, honest: Tensor, byz: Tensor, agg: Tensor, f: int) -> None:
    """The guarantee on one round: the returned aggregate has norm ≤ κ · max honest norm (whatever ``agg`` was), and
    τ ≥ κ · the (k − f)-th smallest honest norm when k > f."""
    x = torch.cat([honest, byz])
    out = stage.aggregated(agg, _round(x, f))
    hn = torch.linalg.vector_norm(honest.double(), dim=1).sort().values
    kappa = stage.multiplier
    assert torch.isfinite(out).all()
    assert float(torch.linalg.vector_norm(out.double())) <= kappa * float(hn[-1]) * (1 + 4 * EPS)
    m = x.shape[0]
    k = max(1, min(math.ceil(stage.quantile * m), m - f))
    if k > f:
        assert stage.last is not None and stage.last >= kappa * float(hn[k - f - 1]) * (1 - 4 * EPS)


class NoRankCap(AdaptiveClip):
    """Mutant: τ read at rank ⌈q·m⌉, ignoring f (Andrew et al.'s quantile as it is, no Byzantine in mind)."""

    def aggregated(self, agg: Tensor, r: ServerRound) -> Tensor:
        return super().aggregated(agg, ServerRound(r.round, r.rounds, r.received, r.result, 0, r.workers, {}))


class MeanNorm(AdaptiveClip):
    """Mutant: τ = κ · the mean of the received norms (one row of 1e38 moves it as far as it likes)."""

    def aggregated(self, agg: Tensor, r: ServerRound) -> Tensor:
        norms = torch.linalg.vector_norm(r.received.vectors.double(), dim=1)
        tau = self.multiplier * float(torch.nan_to_num(norms, nan=0.0, posinf=1e300).mean())
        norm = float(torch.linalg.vector_norm(agg.double()))
        self.last = tau
        return torch.zeros_like(agg) if not math.isfinite(norm) else agg * min(1.0, tau / norm) if norm else agg


def test_it_is_found_by_name_with_no_registry_line() -> None:
    assert "adaptive_clip" in registry.names() and registry.get("adaptive_clip") is AdaptiveClip
    out = CliRunner().invoke(cli.app, ["list", "stages", "--format", "json"]).output
    row = next(r for r in json.loads(out)["tables"][0]["rows"] if r["name"] == "adaptive_clip")
    assert row["side"] == "server" and "stages.adaptive_clip" in json.dumps(row)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(("quantile", "multiplier", "m", "f"), [(0.5, 1.0, 7, 2), (1.0, 2.0, 7, 3), (0.75, 1.0, 9, 4),
                                                                 (0.1, 0.5, 5, 2)])
def test_f_byzantine_rows_of_any_kind_cannot_lift_the_step_above_the_largest_honest_norm(
        kind: str, quantile: float, multiplier: float, m: int, f: int) -> None:
    """f rows of 1e38, ∞, NaN, 0, 1e-30, −1e6 × the longest honest row, 1.5 × it, or ∞ and 0 mixed; the aggregate
    handed to the stage is the worst it could be (1e30 in the longest honest row's direction, or ∞): the guarantee
    holds for each. The two mutants (no rank cap at m − f; the mean of the norms) break it for some kind."""
    gen = torch.Generator().manual_seed(m * 10 + f)
    honest = torch.randn(m - f, 40, generator=gen) * torch.rand(m - f, 1, generator=gen) * 3
    byz = byzantine_rows(kind, honest, f)
    for agg in (1e30 * honest[0], torch.full((40,), math.inf), honest.mean(0)):
        assert_bounded(AdaptiveClip(quantile, multiplier), honest, byz, agg, f)


def test_each_mutant_is_rejected_by_the_guarantees_check() -> None:
    gen = torch.Generator().manual_seed(0)
    honest = torch.randn(4, 40, generator=gen)
    with pytest.raises(AssertionError):
        assert_bounded(NoRankCap(quantile=1.0), honest, byzantine_rows("1e38", honest, 3), 1e30 * honest[0], 3)
    with pytest.raises(AssertionError):
        assert_bounded(MeanNorm(), honest, byzantine_rows("1e38", honest, 3), 1e30 * honest[0], 3)


def test_a_non_finite_aggregate_becomes_zero_and_both_counts_are_kept() -> None:
    stage = AdaptiveClip()
    x = torch.eye(5)
    assert torch.equal(stage.aggregated(torch.full((5,), math.nan), _round(x, 2)), torch.zeros(5))
    assert torch.equal(stage.aggregated(3 * torch.ones(5), _round(x, 2)), torch.ones(5) * (1 / math.sqrt(5)))
    small = 0.1 * torch.ones(5)
    assert torch.equal(stage.aggregated(small, _round(x, 2)), small)
    assert stage.counts.tolist() == [1, 1] and stage.last == 1.0
    assert threshold(torch.zeros(0, 5), 0, 0.5, 1.0) == math.inf  # nothing received: nothing to read a bound from


def test_in_a_run_the_mean_under_inf_is_kept_from_diverging(tmp_path: Path) -> None:
    """mean + 2 ∞ workers: without the stage the run diverges; with it every round's aggregate is ∞, replaced by 0
    and counted (zeroed = rounds), θ stays finite and the run ends DONE."""
    plain = {k: v for k, v in RUN.items() if k != "stages"}
    with pytest.raises(Diverged):
        train(make_config(plain))
    rows = train(make_config(RUN), tmp_path / "r")
    assert rows[-1]["round"] == 8 and rows[-1]["adaptive_clip_zeroed"] == 8 and rows[-1]["adaptive_clip_clipped"] == 0
    assert runstate.state(tmp_path / "r").status == "done"


class Recording(AdaptiveClip):
    """The stage, recording for each round the received rows and what it returned."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.seen: list[tuple[Tensor, Tensor]] = []

    def aggregated(self, agg: Tensor, r: ServerRound) -> Tensor:
        out = super().aggregated(agg, r)
        self.seen.append((r.received.vectors.clone(), out.clone()))
        return out


def _experiment(attack: str, stages: list[Any], rule: str = "mean", rounds: int = 2) -> Experiment:
    ds = data.load("digits")
    model = models.make("mlp", ds.input_shape, ds.num_classes, generator=torch.Generator().manual_seed(0), hidden=[16])
    return Experiment(model=model, dataset=ds, rule=aggregators.make(rule, f=2), workers=7, byzantine=2,
                      attack=attacks.make(attack), rounds=rounds, eval_every=1, lr=0.1, stages=stages)


def test_the_api_runs_it_and_every_rounds_step_direction_is_bounded_by_an_honest_norm() -> None:
    """`Experiment(stages=[...])` through `phalanx.training.run`, mean under a Gaussian attack (σ = 200): in every
    round the aggregate the step takes has norm ≤ the largest honest row's (the 5 first rows), and the rows carry
    the columns."""
    stage = Recording()
    rows = run(_experiment("gaussian", [stage], rounds=4))
    assert len(stage.seen) == 4 and rows[-1]["adaptive_clip_clipped"] == 4  # σ = 200 rows pull the mean far out
    for vectors, out in stage.seen:
        top = float(torch.linalg.vector_norm(vectors[:5].double(), dim=1).max())
        assert float(torch.linalg.vector_norm(out.double())) <= top * (1 + 4 * EPS)
    assert rows[-1]["adaptive_clip_threshold"] is not None and rows[-1]["adaptive_clip_zeroed"] == 0


def test_phalanx_run_turns_it_on_from_a_toml_section(tmp_path: Path) -> None:
    """`phalanx run` on a tiny tree config (rounds = 2) with the mean under ∞: DONE, not diverged, each round zeroed
    and counted, and the section in config.json."""
    (tmp_path / "c.toml").write_text(TOML)
    res = CliRunner().invoke(cli.app, ["run", str(tmp_path / "c.toml"), "--out", str(tmp_path / "out")])
    assert res.exit_code == 0, res.output
    assert "diverged" not in res.output
    (run_dir,) = [p for p in (tmp_path / "out").iterdir() if p.is_dir()]
    assert runstate.state(run_dir).status == "done"
    rows = store.read_rows(run_dir)
    assert [r["adaptive_clip_zeroed"] for r in rows] == [0, 1, 2]
    assert rows[0]["adaptive_clip_threshold"] is None and rows[2]["adaptive_clip_threshold"] > 0
    assert json.loads((run_dir / "config.json").read_text())["stages"] == {
        "adaptive_clip": {"quantile": 0.5, "multiplier": 1.0}}


@pytest.mark.parametrize(("section", "key"), [
    ({"quantile": 0}, "stages.adaptive_clip.quantile"), ({"quantile": 1.5}, "stages.adaptive_clip.quantile"),
    ({"multiplier": 0}, "stages.adaptive_clip.multiplier"),
    ({"multiplier": math.inf}, "stages.adaptive_clip.multiplier"),
    ({"multiplier": "2"}, "stages.adaptive_clip.multiplier"), ({"qantile": 0.5}, "stages.adaptive_clip.qantile"),
])
def test_bad_parameters_are_one_line_naming_the_key(section: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError) as exc:
        make_config({**RUN, "stages": {"adaptive_clip": section}})
    assert exc.value.parameter == key and "\n" not in str(exc.value)


def test_the_command_line_names_the_key_of_a_bad_value(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "c.toml").write_text(TOML.replace("quantile = 0.5", "quantile = 2"))
    monkeypatch.setattr("sys.argv", ["phalanx", "run", str(tmp_path / "c.toml"), "--out", str(tmp_path / "out")])
    with pytest.raises(SystemExit) as exc:
        cli.main()
    assert exc.value.code == 2
    out = capsys.readouterr().out.strip()
    assert out.startswith("error: [stages.adaptive_clip].quantile=2 is invalid: allowed") and "\n" not in out


def test_decentralized_rounds_refuse_it() -> None:
    with pytest.raises(ConfigError, match="unset with algorithm = 'gossip'") as exc:
        make_config({**RUN, "algorithm": "gossip", "graph": "complete", "attack": "none", "byzantine": 0, "f": 0})
    assert exc.value.parameter == "stages.adaptive_clip"


def test_a_resumed_run_equals_an_uninterrupted_one_bit_for_bit(tmp_path: Path) -> None:
    """The counts are in the checkpoint (stage.adaptive_clip.counts) and come back: cwtm under ALIE, clipped rounds."""
    cfg = {**RUN, "aggregator": "cwtm", "attack": "alie", "stages": {"adaptive_clip": {"multiplier": 0.5}}}
    full = tmp_path / "full"
    train(make_config(cfg), full)
    part = train_interrupted(make_config(cfg), tmp_path / "part", 4)
    assert load_file(str(part / "checkpoint.safetensors"))["stage.adaptive_clip.counts"].tolist()[0] > 0
    train(make_config(cfg), part)
    a, b = load_file(str(full / "checkpoint.safetensors")), load_file(str(part / "checkpoint.safetensors"))
    assert set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)
    assert store.read_rows(full) == store.read_rows(part)


@pytest.mark.parametrize("state", [
    {"counts": torch.zeros(3, dtype=torch.int64)}, {"counts": torch.zeros(2)},
    {"counts": torch.tensor([-1, 0])}, {"counts": torch.zeros(2, dtype=torch.int64), "extra": torch.zeros(1)},
    {"other": torch.zeros(2, dtype=torch.int64)},
])
def test_a_hostile_checkpoint_state_is_refused(state: dict[str, Tensor]) -> None:
    with pytest.raises(ConfigError, match=r"stage\.adaptive_clip") as exc:
        AdaptiveClip().load_state_dict(state)
    assert "\n" not in str(exc.value)
