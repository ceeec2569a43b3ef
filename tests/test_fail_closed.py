"""Fail closed (phalanx.training.stages.fail_closed): a run stops, before the round's aggregate is applied, with one
typed line and a FAILED record, when more workers are flagged than the bound (the rule's f); within the bound it goes
on; the window's flags count as stated; its state resumes bit for bit; and the rules it cannot watch are refused.

It is also the proof of the stage seam: this stage's commit touches its own module and this test only."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from _interrupt import train_interrupted
from phalanx import aggregators
from phalanx.errors import ConfigError
from phalanx.experiments import grid, make_config, runstate, store, train
from phalanx.training.divergence import Diverged
from phalanx.training.schedule import LRSchedule
from phalanx.training.server import RoundResult
from phalanx.training.stages import registry
from phalanx.training.stages.base import Plan, ServerRound
from phalanx.training.stages.fail_closed import FailClosed, FailedClosed
from phalanx.training.state import Received

RUN: dict[str, Any] = {
    "dataset": "digits", "model": "mlp", "model_params": {"hidden": [16]}, "workers": 7, "byzantine": 2, "f": 2,
    "aggregator": "cwtm", "attack": "inf", "rounds": 8, "batch_size": 8, "lr": 0.1, "eval_every": 2,
    "checkpoint_every": 4, "seed": 3, "stages": {"fail_closed": {}},
}


def _round(contributions: list[float], workers: int = 5, f: int = 1, t: int = 0, rows: list[int] | None = None,
           vectors: torch.Tensor | None = None) -> ServerRound:
    m = len(contributions)
    x = torch.zeros(m, 3) if vectors is None else vectors
    result = RoundResult(0.0, None, None, contributions=torch.tensor(contributions, dtype=torch.float64))
    return ServerRound(t, 10, Received(x, rows=rows), result, f, workers, {})


def test_it_is_found_by_name_with_no_registry_line() -> None:
    assert "fail_closed" in registry.names() and registry.get("fail_closed") is FailClosed


def test_within_the_bound_the_run_goes_on_and_its_rows_say_how_many_were_flagged() -> None:
    """Two ∞ workers against cwtm at f = 2: both flagged every round (non-finite), 2 ≤ 2, every round trained; with
    nobody attacking, nobody is flagged."""
    rows = train(make_config(RUN))
    assert rows[-1]["round"] == 8
    assert [r["fail_closed_flagged"] for r in rows] == [None, 2, 2, 2, 2]
    assert rows[-1]["fail_closed_suspected"] == 2
    honest = train(make_config({**RUN, "attack": "none", "byzantine": 0}))
    assert honest[-1]["round"] == 8 and honest[-1]["fail_closed_flagged"] == 0


def test_more_attackers_than_f_stop_the_run_with_one_line_and_a_failed_record(tmp_path: Path) -> None:
    """Three ∞ workers against f = 2: round 1 is not applied; FailedClosed names the round, the workers and the
    bound, in one line, and the run directory's FAILED holds it. Without the stage — or with a bound that ignores f,
    3 — the same run goes on into divergence (the stage is what stops it)."""
    cfg = make_config({**RUN, "byzantine": 3, "workers": 8})
    out = tmp_path / grid.run_id(cfg)
    with pytest.raises(FailedClosed) as exc:
        train(cfg, out)
    text = str(exc.value)
    assert "\n" not in text and text.startswith("round 1: 3 workers flagged in this round (workers 5, 6, 7)")
    assert exc.value.round == 1 and exc.value.suspected == [5, 6, 7] and exc.value.bound == 2
    failed = runstate.failure(out)
    assert failed is not None and failed["error"] == "FailedClosed" and failed["message"] == text
    status = runstate.state(out)
    assert status.status == "failed" and status.detail.startswith("FailedClosed: round 1")
    plain = {k: v for k, v in RUN.items() if k != "stages"}
    with pytest.raises(Diverged):
        train(make_config({**plain, "byzantine": 3, "workers": 8}))
    with pytest.raises(Diverged) as looser:
        train(make_config({**RUN, "byzantine": 3, "workers": 8, "stages": {"fail_closed": {"bound": 3}}}))
    assert looser.value.rows[-1]["fail_closed_flagged"] == 3


def test_a_row_the_rule_gave_no_share_or_a_non_finite_row_is_flagged() -> None:
    stage = FailClosed(share=0.05)
    x = torch.ones(4, 3)
    x[3, 1] = math.nan
    got = stage.flagged(torch.tensor([0.5, 0.05, 0.45, 0.3], dtype=torch.float64), x)
    assert got.tolist() == [False, True, False, True]  # at most `share`; non-finite whatever its share
    nan_shares = stage.flagged(torch.full((4,), math.nan, dtype=torch.float64), torch.ones(4, 3))
    assert nan_shares.all()  # no share reported is no trust shown


def test_the_window_counts_a_workers_flags_over_its_last_rounds() -> None:
    """window 3, min_flags 2, bound 0: worker 4 flagged in rounds 0 and 2 (the sampled clients' ids, not the row
    positions) is suspected at round 2 and not before; a worker flagged once is never suspected."""
    stage = FailClosed(window=3, min_flags=2, bound=0)
    agg = torch.zeros(3)
    stage.aggregated(agg, _round([0.0, 0.5, 0.5], t=0, rows=[4, 1, 2]))  # worker 4 flagged once
    stage.aggregated(agg, _round([0.5, 0.0, 0.5], t=1, rows=[4, 3, 2]))  # worker 3 flagged once
    assert stage.last == (1, 0)
    with pytest.raises(FailedClosed) as exc:
        stage.aggregated(agg, _round([0.0, 0.5, 0.5], t=2, rows=[4, 0, 1]))
    assert exc.value.suspected == [4] and exc.value.round == 3
    assert "in at least 2 of the last 3 rounds" in str(exc.value)
    forgetful = FailClosed(window=2, min_flags=2, bound=0)  # round 0's flag has left a window of 2 by round 2
    forgetful.aggregated(agg, _round([0.0, 0.5, 0.5], t=0, rows=[4, 1, 2]))
    forgetful.aggregated(agg, _round([0.5, 0.5, 0.5], t=1, rows=[0, 1, 2]))
    forgetful.aggregated(agg, _round([0.0, 0.5, 0.5], t=2, rows=[4, 0, 1]))
    assert forgetful.last == (1, 0)


def test_a_resumed_run_equals_an_uninterrupted_one_bit_for_bit(tmp_path: Path) -> None:
    """The window is in the checkpoint (stage.fail_closed.history) and comes back."""
    cfg = {**RUN, "stages": {"fail_closed": {"window": 3, "min_flags": 2}}}
    full = tmp_path / "full"
    train(make_config(cfg), full)
    part = train_interrupted(make_config(cfg), tmp_path / "part", 4)
    assert load_file(str(part / "checkpoint.safetensors"))["stage.fail_closed.history"].shape == (3, 7)
    train(make_config(cfg), part)
    a, b = load_file(str(full / "checkpoint.safetensors")), load_file(str(part / "checkpoint.safetensors"))
    assert set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)
    assert store.read_rows(full) == store.read_rows(part)


def test_a_hostile_window_is_refused() -> None:
    stage = FailClosed(window=3)
    for bad in ({"history": torch.zeros(2, 7, dtype=torch.bool)}, {"history": torch.zeros(3, 7)},
                {"history": torch.zeros(3, 7, dtype=torch.bool), "extra": torch.zeros(1)}):
        with pytest.raises(ConfigError, match=r"stage\.fail_closed"):
            stage.load_state_dict(bad)
    stage.load_state_dict({"history": torch.zeros(3, 9, dtype=torch.bool)})  # another run's width
    with pytest.raises(ConfigError, match="a flag per worker of this run"):
        stage.aggregated(torch.zeros(3), _round([0.5, 0.5], workers=7))


def _plan(rule: Any, workers: int = 7) -> Plan:
    cfg = make_config({k: v for k, v in RUN.items() if k != "stages"})
    return Plan(cfg.algorithm_class(), rule, None, workers, 2, 8, LRSchedule(0.1), 0.1)


def test_a_rule_it_cannot_watch_is_refused() -> None:
    """Krum keeps one row of 7 honest ones (6 > f = 2 would be flagged in every honest round); a rule that reports
    no contributions shows nothing; both are refused where the run is validated. cwtm at f = 2 passes."""
    FailClosed().check(_plan(aggregators.make("cwtm", f=2)))
    with pytest.raises(ConfigError, match=r"gives no more to 6 of 7 i.i.d. Gaussian rows"):
        FailClosed().check(_plan(aggregators.make("krum", f=2)))
    with pytest.raises(ConfigError, match=r"stages\.fail_closed") as exc:
        make_config({**RUN, "aggregator": "krum"})
    assert "\n" not in str(exc.value)
    silent = aggregators.make("cwtm", f=2)
    silent.contributions = lambda x, **context: torch.full((x.shape[0],), math.nan)  # type: ignore[method-assign]
    with pytest.raises(ConfigError, match="a rule that reports its contributions"):
        FailClosed().check(_plan(silent))


@pytest.mark.parametrize(("section", "key"), [
    ({"window": 0}, "stages.fail_closed.window"), ({"window": 2, "min_flags": 3}, "stages.fail_closed.min_flags"),
    ({"bound": -1}, "stages.fail_closed.bound"), ({"share": 1.0}, "stages.fail_closed.share"),
    ({"windw": 2}, "stages.fail_closed.windw"),
])
def test_bad_parameters_are_one_line_naming_the_key(section: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError) as exc:
        make_config({**RUN, "stages": {"fail_closed": section}})
    assert exc.value.parameter == key and "\n" not in str(exc.value)


def test_decentralized_rounds_refuse_it() -> None:
    with pytest.raises(ConfigError, match="unset with algorithm = 'gossip'"):
        make_config({**RUN, "algorithm": "gossip", "graph": "complete", "attack": "none", "byzantine": 0, "f": 0,
                     "aggregator": "mean"})
