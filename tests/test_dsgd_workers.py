"""DSGD's worker side in its two shapes: one worker of a distributed rank draws exactly the in-process batch for its
index, keeps the shared random streams in step while gathering only its own samples, and sends the same vector as
the in-process row (no attack, a vector attack, a data attack)."""

from __future__ import annotations

import pytest
import torch

from phalanx.experiments import from_config, make_config
from phalanx.training.algorithms.dsgd import worker_batches
from phalanx.training.server import BoundRule
from phalanx.training.streams import generator, restored


@pytest.mark.parametrize(("attack", "byzantine"), [("none", 0), ("alie", 2), ("labelflip", 2)])
def test_rank_batches_and_vectors_are_the_in_process_rows(attack: str, byzantine: int) -> None:
    cfg = make_config({
        "dataset": "digits", "model": "logreg", "workers": 6, "byzantine": byzantine, "f": 2, "aggregator": "cwtm",
        "attack": attack, "partition": "dirichlet", "alpha": 0.5, "rounds": 3, "batch_size": 5, "seed": 11,
    })
    exp = from_config(cfg)
    streams = {name: generator(11, name).get_state() for name in ("batches", "attack")}
    sim_b, sim_a = restored(streams["batches"]), restored(streams["attack"])
    everyone = exp.algorithm.all_workers(exp, streams, None)
    ranks = [exp.algorithm.one_worker(exp, r, streams, None) for r in range(cfg.workers)]
    theta = exp.problem.initial_theta()
    rule = BoundRule(exp.rule, {})
    for t in range(3):
        xb, yb = worker_batches(
            exp.data, exp.attack, workers=cfg.workers, byzantine=byzantine, batch_size=cfg.batch_size,
            batch_gen=sim_b, attack_gen=sim_a, round=t,
        )
        for w in ranks:
            x1, y1 = w._batch(t)
            assert x1.shape == (1, *xb.shape[1:]) and y1.shape == (1, cfg.batch_size)
            if w.rank < xb.shape[0]:  # a vector-attack Byzantine rank has no batch of its own, it only draws
                assert torch.equal(x1[0], xb[w.rank]) and torch.equal(y1[0], yb[w.rank])
            assert torch.equal(w.batch_gen.get_state(), sim_b.get_state())
            if attack == "labelflip":
                assert torch.equal(w.attack_gen.get_state(), sim_a.get_state())
    # the vectors: every rank's (momentum row, or attack row) equals the in-process row, round after round
    ranks = [exp.algorithm.one_worker(exp, r, streams, None) for r in range(cfg.workers)]
    for t in range(3):
        rows = everyone.round(theta, t, rule).vectors.clone()
        sent = [w.vector(theta, t) for w in ranks]
        honest = torch.stack([v for v in sent[: exp.honest] if v is not None])
        for w, v in zip(ranks, sent):
            if v is None:
                v = w.attack_vector(honest, rule, t)
            torch.testing.assert_close(v, rows[w.rank])  # float32 defaults: the shapes of the products differ
        theta = theta - 0.1 * rows.mean(0)
