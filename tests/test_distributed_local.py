"""A rank's own worker draws exactly the simulated engine's batch for its index and keeps the shared random streams
in step, while gathering only its own samples (no attack, a vector attack, a data attack)."""

from __future__ import annotations

import pytest
import torch

from phalanx.distributed.local import LocalWorker
from phalanx.training import make_config
from phalanx.training.round import worker_batches
from phalanx.training.trainer import build, generator


@pytest.mark.parametrize(("attack", "byzantine"), [("none", 0), ("alie", 2), ("labelflip", 2)])
def test_rank_batches_are_the_simulated_rows(attack: str, byzantine: int) -> None:
    cfg = make_config({
        "dataset": "digits", "model": "logreg", "workers": 6, "byzantine": byzantine, "f": 2, "aggregator": "cwtm",
        "attack": attack, "partition": "dirichlet", "alpha": 0.5, "rounds": 3, "batch_size": 5, "seed": 11,
    })
    setup = build(cfg)
    batch0, attack0 = generator(11, "batches").get_state(), generator(11, "attack").get_state()
    sim_b, sim_a = torch.Generator(), torch.Generator()
    sim_b.set_state(batch0)
    sim_a.set_state(attack0)
    ranks = [LocalWorker(r, setup, batch0, attack0, None) for r in range(cfg.workers)]
    for _ in range(3):
        xb, yb = worker_batches(
            setup.worker_data, setup.attack, workers=cfg.workers, byzantine=byzantine, batch_size=cfg.batch_size,
            batch_gen=sim_b, attack_gen=sim_a,
        )
        for w in ranks:
            x1, y1 = w._batches()
            assert x1.shape == (1, *xb.shape[1:]) and y1.shape == (1, cfg.batch_size)
            if w.rank < xb.shape[0]:  # a vector-attack Byzantine rank has no batch of its own, it only draws
                assert torch.equal(x1[0], xb[w.rank]) and torch.equal(y1[0], yb[w.rank])
            assert torch.equal(w.batch_gen.get_state(), sim_b.get_state())
            if attack == "labelflip":
                assert torch.equal(w.attack_gen.get_state(), sim_a.get_state())
