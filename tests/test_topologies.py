"""The torchrun topologies come from a registry (one class each), and every engine wires a run the same way
(:func:`phalanx.experiments.wiring.run_experiment`): what is checked here without starting processes; the
topologies themselves run in tests/test_distributed*.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from phalanx.distributed import topologies
from phalanx.errors import ConfigError
from phalanx.experiments import from_config, make_config, store, train
from phalanx.experiments.wiring import Recording, run_experiment
from phalanx.training.loop import Callback, Loop


def test_the_built_in_topologies_are_registered_and_declare_how_their_ranks_run() -> None:
    assert {"gossip", "server", "serverless"} <= set(topologies.names())
    server, serverless, gossip = (topologies.make(n) for n in ("server", "serverless", "gossip"))
    assert not server.loop_on_every_rank and not server.meshed  # (its sealed links are its own)
    assert serverless.loop_on_every_rank and serverless.meshed
    assert gossip.loop_on_every_rank and gossip.meshed


def test_an_unknown_topology_is_a_one_line_error_with_a_suggestion() -> None:
    with pytest.raises(ConfigError, match=r"topology='serverles'.*serverless") as info:
        topologies.make("serverles")
    assert "\n" not in str(info.value)


def test_a_registered_topology_is_found_by_its_name() -> None:
    class Loopback(topologies.ServerlessTopology):
        name = "loopback-test"

    topologies.register(Loopback)
    assert isinstance(topologies.make("loopback-test"), Loopback)


class Count(Callback):
    def __init__(self) -> None:
        self.rounds = 0
        self.finished = 0

    def on_round(self, loop: Loop, info: object) -> None:
        self.rounds += 1

    def on_finish(self, loop: Loop) -> None:
        self.finished += 1


def test_the_one_wiring_records_resumes_and_trains_nothing_for_a_finished_run(tmp_path: Path) -> None:
    cfg = make_config({"dataset": "digits", "model": "mlp", "workers": 4, "aggregator": "cwtm", "f": 1,
                       "rounds": 4, "eval_every": 2, "checkpoint_every": 2, "seed": 2})
    out = tmp_path / "run"
    recording = Recording(out, cfg.identity(), cfg.checkpoint_every)
    count = Count()
    rows = run_experiment(from_config(cfg), recording=recording, callbacks=[count])
    assert count.rounds == 4 and count.finished == 1 and store.is_finished(out)
    assert rows == store.read_rows(out) == train(cfg, tmp_path / "plain")  # train() is the same wiring
    said: list[str] = []
    again = Count()
    assert run_experiment(from_config(cfg), recording=recording, callbacks=[again], say=said.append) == rows
    assert again.rounds == 0 and said == [f"{out} has finished already: nothing to train"]


def test_a_config_names_a_topology_from_the_registry_and_the_topology_says_what_it_runs() -> None:
    """``topology`` is checked against the registry (a typo is one line with a suggestion); a topology of one's own
    is accepted by the config and checked against the algorithm where it is built, by its own ``runs``."""
    base = {"workers": 4, "engine": "torchrun"}
    with pytest.raises(ConfigError, match=r"topology='serverles' is invalid: allowed one of .*serverless") as info:
        make_config({**base, "topology": "serverles"})
    assert "\n" not in str(info.value)

    class Picky(topologies.ServerlessTopology):
        name = "picky-test"

    class Open(topologies.ServerlessTopology):
        name = "open-test"

        @classmethod
        def runs(cls, algorithm: type) -> bool:
            return not getattr(algorithm, "decentralized", False)

    topologies.register(Picky)
    topologies.register(Open)
    picky = make_config({**base, "topology": "picky-test"})
    with pytest.raises(ConfigError, match=r"topology='picky-test' is invalid: allowed 'server' or 'serverless' with "
                                          r"algorithm = 'dsgd'"):
        topologies.check(picky)
    assert isinstance(topologies.check(make_config({**base, "topology": "open-test"})), Open)
    assert topologies.check(make_config(base)).name == "server"
    gossip = make_config({**base, "algorithm": "gossip", "graph": "complete"})
    assert gossip.topology == "gossip" and topologies.check(gossip).name == "gossip"
