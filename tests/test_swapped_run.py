"""A finished run is trusted by what it recorded, not by its folder name: a finished run of another configuration
(another seed, another rule) copied under a run's name is refused before the grid skips it as done — signed or not —
and a run directory whose config.json was swapped after the fact is refused too."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from phalanx import signing
from phalanx.errors import ConfigError, IntegrityError
from phalanx.experiments import grid, make_config, store
from phalanx.experiments.runner import run_grid

BASE = {"dataset": "digits", "model": "mlp", "workers": 6, "f": 1, "aggregator": "cwtm", "rounds": 4, "eval_every": 2}


@pytest.mark.parametrize(("other", "key"), [({"seed": 1}, "seed"), ({"aggregator": "cwmed"}, "aggregator")],
                         ids=["seed", "aggregator"])
def test_a_finished_run_copied_under_another_runs_name_is_refused(tmp_path: Path, other: dict[str, object],
                                                                  key: str) -> None:
    """Unsigned (no extra needed): another seed's, or another rule's, finished run under this run's name."""
    a, b = make_config({**BASE, "seed": 0}), make_config({**BASE, "seed": 0, **other})
    out = tmp_path / "grid"
    da, db = run_grid([a, b], out)
    shutil.rmtree(da)
    shutil.copytree(db, da)  # the other run, finished, under a's name
    assert store.is_finished(da)
    with pytest.raises(ConfigError, match=rf"a finished run of the same configuration \(differs in {key}\)") as info:
        run_grid([a, b], out)
    assert "\n" not in str(info.value)


def test_signed_does_not_mean_the_right_run(tmp_path: Path) -> None:
    pytest.importorskip("model_signing")
    key, pub = signing.keygen(tmp_path / "k.pem", tmp_path / "p.pem")
    a = make_config({**BASE, "seed": 0, "sign_key": str(key), "verify_key": str(pub)})
    b = make_config({**BASE, "aggregator": "cwmed", "sign_key": str(key), "verify_key": str(pub)})
    out = tmp_path / "grid"
    da, db = run_grid([a, b], out)
    shutil.rmtree(da)
    shutil.copytree(db, da)  # validly signed by the same key, but cwmed's run
    signing.verify(da, pub)  # the signature itself holds
    with pytest.raises(ConfigError, match="differs in aggregator"):
        run_grid([a, b], out)


def test_a_swapped_config_json_is_refused(tmp_path: Path) -> None:
    a, b = make_config({**BASE, "seed": 0}), make_config({**BASE, "seed": 1})
    out = tmp_path / "grid"
    da, db = run_grid([a, b], out)
    (da / "config.json").write_bytes((db / "config.json").read_bytes())  # make it claim seed 1 … then copy it back
    with pytest.raises(IntegrityError):
        store.check_identity(da, a.identity(), finished=True)
    assert grid.run_id(a) == da.name
