"""What a config names is built once per run and checked by the components that own the checks: validation builds
the round algorithm, rule, attack and server optimizer (each checking its own parameters, the algorithm checking
what ties them), and the run takes those objects; a grid of one run also trains the data split and model that its
check built. Algorithms declare their defaults, topologies and role spelling of ``lr``."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from phalanx import data, models
from phalanx.errors import ConfigError
from phalanx.experiments import build, components, from_config, make_config, specs, validrun
from phalanx.experiments.config import validate
from phalanx.experiments.grid import run_id
from phalanx.experiments.runner import run_grid
from phalanx.training.algorithms import base
from phalanx.training.algorithms.dsgd import DSGD

SMALL = {"dataset": "digits", "model": "mlp", "workers": 6, "byzantine": 1, "f": 1, "aggregator": "nnm>cwtm",
         "attack": "alie", "rounds": 3, "eval_every": 3, "seed": 1}


def test_the_run_takes_the_objects_its_validation_built_once() -> None:
    run = validate(SMALL)
    exp = from_config(run)
    parts = run.parts
    assert exp.rule is parts.rule and exp.attack is parts.attack and exp.optimizer is parts.optimizer
    assert exp.algorithm is parts.algorithm
    again = from_config(run)  # taken once: a second run of the value builds its own (objects carry state)
    assert again.rule is not exp.rule and again.optimizer is not exp.optimizer
    assert repr(again.rule) == repr(exp.rule)


def test_a_value_taken_twice_builds_its_own_the_second_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """The mutant that hands the same components to every experiment of a value (so two runs share a stateful
    rule's and the server optimizer's state) is caught."""
    run = validate(SMALL)
    monkeypatch.setattr(validrun, "components", lambda r: r.parts)
    exp, again = from_config(run), from_config(run)
    assert again.optimizer is exp.optimizer  # the mutant shares: the assertion above would fail under it


def test_no_config_carries_what_validating_it_built() -> None:
    """No module-wide cache and nothing on the config object: each validation's value holds its own objects; a
    config (and a copy, or a config pickled to another process) carries none, so a run made from it validates it
    there."""
    import pickle

    first, second = validate(SMALL), validate({**SMALL, "seed": 2})
    assert first.parts is not second.parts and first.parts.rule is not second.parts.rule
    for cfg in (first.cfg, first.cfg.model_copy(update={"seed": 3}), pickle.loads(pickle.dumps(first.cfg))):
        assert not any(isinstance(v, components.Components) for v in vars(cfg).values())
    assert first.run_id == run_id(first.cfg) and first.columns == validrun.config_columns(first.cfg)
    assert first.processes == build.processes(first.cfg)


def _counting(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """What the run builds, counted: data split, model, optimizer, rule, attack."""
    built: Counter[str] = Counter()

    def counting(name: str, fn: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            built[name] += 1
            return fn(*args, **kwargs)
        return wrapper

    monkeypatch.setattr(data, "partition", counting("split", data.partition))
    monkeypatch.setattr(models, "make", counting("model", models.make))
    monkeypatch.setattr(components.optim, "build", counting("optimizer", components.optim.build))
    for method, what in (("make_rule", "rule"), ("make_attack", "attack")):  # the algorithm builds them
        original = getattr(base.RoundAlgorithm, method).__func__
        monkeypatch.setattr(base.RoundAlgorithm, method, classmethod(counting(what, original)))
    return built


def test_one_phalanx_run_builds_its_split_model_rule_attack_and_optimizer_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    built = _counting(monkeypatch)
    run = validate(SMALL)
    run_grid([run], tmp_path / "out")
    assert built == {"split": 1, "model": 1, "optimizer": 1, "rule": 1, "attack": 1}
    assert (tmp_path / "out" / run.run_id / "DONE").exists()


def test_the_command_line_validates_each_point_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``phalanx run``: the config is validated once (its components built once) from the command line to the
    trained run; the mutant that validates a point again downstream (train given the config) builds twice."""
    from typer.testing import CliRunner

    from phalanx.cli import app
    from phalanx.experiments import local

    args = ["run", "--set", "rounds=2", "--set", "eval_every=2", "--set", "aggregator=cwtm", "--set", "attack=alie",
            "--set", "workers=6", "--set", "byzantine=1", "--set", "f=1", "--set", "seed=0"]
    built = _counting(monkeypatch)
    result = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "one")])
    assert result.exit_code == 0, result.output
    assert built["rule"] == 1 and built["optimizer"] == 1
    original = local.train
    monkeypatch.setattr(local, "train", lambda run, *a, **k: original(run.cfg, *a, **k))  # validates it again
    built.clear()
    assert CliRunner().invoke(app, [*args, "--out", str(tmp_path / "two")]).exit_code == 0
    assert built["rule"] == 2 and built["optimizer"] == 2


def test_a_grids_points_each_build_their_own_and_equal_a_fresh_build(tmp_path: Path) -> None:
    """Taking the validation's objects changes nothing: the rows equal a run built from scratch."""
    from phalanx.experiments import train

    run = validate(SMALL)
    taken = train(run)
    fresh = train(run)  # taken already: everything built again
    assert taken == fresh == train(run.cfg)  # a config is validated by train itself


def test_server_lr_is_distributed_sgds_lr_by_its_role_and_federated_averagings_own_key() -> None:
    dsgd = make_config({**SMALL, "server_lr": 0.05})
    assert dsgd.lr == 0.05 and run_id(dsgd) == run_id(make_config({**SMALL, "lr": 0.05}))
    with pytest.raises(ConfigError, match=r"server_lr=0.05 is invalid: allowed = lr \(0.1\)"):
        make_config({**SMALL, "server_lr": 0.05, "lr": 0.1})
    fed = make_config({**SMALL, "algorithm": "fedavg", "server_lr": 0.5, "client_lr": 0.02})
    assert fed.server_lr == 0.5 and fed.lr == 0.02
    with pytest.raises(ConfigError, match=r"server_lr=0.5 is invalid: allowed its default with algorithm = 'gossip'"):
        make_config({**SMALL, "algorithm": "gossip", "graph": "complete", "server_lr": 0.5})


class Declares(DSGD):
    """DSGD with other declared defaults and topologies: the config reads them from the class."""

    name = "declares-test"
    config_defaults = {"momentum": 0.5}  # noqa: RUF012 - a test's class
    topologies = ("serverless",)


def test_a_users_algorithm_declares_its_defaults_and_topologies() -> None:
    base.register(Declares)
    cfg = make_config({**SMALL, "algorithm": "declares-test"})
    assert cfg.momentum == 0.5 and make_config({**SMALL, "algorithm": "declares-test", "momentum": 0.0}).momentum == 0
    assert make_config({**SMALL, "algorithm": "declares-test", "engine": "torchrun"}).topology == "serverless"
    with pytest.raises(ConfigError, match=r"topology='server' is invalid: allowed 'serverless' with algorithm = "
                                          r"'declares-test'"):
        make_config({**SMALL, "algorithm": "declares-test", "engine": "torchrun", "topology": "server"})


def test_the_algorithm_owns_the_population_check() -> None:
    """f against the vectors its rule sees, named by the key that sets that number."""
    with pytest.raises(ConfigError, match=r"f=3 is invalid: allowed < workers/2 = 3"):
        make_config({**SMALL, "f": 3})
    with pytest.raises(ConfigError, match=r"f=2 is invalid: allowed < clients_per_round/2 = 2 .*sees 4 updates"):
        make_config({**SMALL, "f": 2, "algorithm": "fedavg", "clients_per_round": 4})
    with pytest.raises(ConfigError, match=r"graph='ring' is invalid: allowed a graph whose every node has >= 4"):
        make_config({**SMALL, "f": 2, "algorithm": "gossip", "graph": "ring"})
    assert build.processes(make_config({**SMALL, "algorithm": "fedavg", "clients_per_round": 4})) == 4


def _objects(byzantine: int, workers: int = 6) -> Any:
    from phalanx import aggregators
    from phalanx.training import Experiment

    ds = data.load("digits")
    return Experiment(model=models.make("mlp", ds.input_shape, ds.num_classes), dataset=ds, workers=workers,
                      byzantine=byzantine, rule=aggregators.make("mean", f=0), rounds=1)


@pytest.mark.parametrize("algorithm", ["dsgd", "fedavg", "gossip", "anytime", "scaffold"])
def test_at_least_one_honest_worker_for_every_algorithm(algorithm: str) -> None:
    """byzantine < workers, checked by the config (before any component is built) whatever the algorithm — gossip
    and Anytime SGD replace the population check but not this one — and by an experiment of objects."""
    with pytest.raises(ConfigError, match=r"byzantine=7 is invalid: allowed < workers = 6 \(at least one honest"):
        make_config({**SMALL, "f": 0, "aggregator": "mean", "attack": "none", "algorithm": algorithm,
                     "byzantine": 7})
    with pytest.raises(ConfigError, match=r"byzantine=6 is invalid: allowed < workers = 6"):
        _objects(6)


def test_the_honest_worker_check_is_written_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The mutant that removes the one check (a rule that ignores the honest majority's least member): then neither
    the config nor the objects refuse a run of Byzantine workers only — so there is no second copy to drift from
    it (the config's ``check_relations`` and ``Experiment`` each had one)."""
    monkeypatch.setattr(base, "check_honest", lambda workers, byzantine: None)
    monkeypatch.setattr(components, "check_honest", lambda workers, byzantine: None)
    cfg = make_config({**SMALL, "f": 0, "aggregator": "mean", "attack": "none", "byzantine": 6})
    assert cfg.byzantine == cfg.workers
    assert _objects(6).byzantine == 6


def test_a_config_made_directly_is_validated_where_it_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A RunConfig built without validation (``RunConfig(...)``) is validated by ``train``: a key file that does not
    exist is refused before anything is built. The mutant that wraps the config into a value without validating it
    trains."""
    import importlib

    from phalanx.experiments.schema import RunConfig

    train_module = importlib.import_module("phalanx.experiments.train")  # the module (the package exports train)

    cfg = RunConfig(**{**SMALL, "rounds": 1, "eval_every": 1, "sign_key": str(tmp_path / "none.pem")})
    with pytest.raises(ConfigError, match=r"sign_key=.*none\.pem' is invalid: allowed an existing PEM key file"):
        train_module.train(cfg)

    def unvalidated(c: RunConfig) -> validrun.ValidRun:
        return validrun.ValidRun(c, run_id(c), components.build(c), validrun.config_columns(c), build.processes(c),
                                 specs.read(c))

    monkeypatch.setattr(train_module, "validate", unvalidated)
    assert train_module.train(cfg)  # the mutant trains a config nothing checked
