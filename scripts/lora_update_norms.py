"""Issue 35's diagnostic: the norms of each round's global LoRA factors in one run of the LoRA study's quick setting.

    python scripts/lora_update_norms.py MODE SEED OUT      # MODE: factors | update; prints one line per round

Trains the quick preset's no-attack cell (``phalanx experiment lora --preset quick``: ``phalanx.studies.lora``) of
``MODE`` with the mean for ``SEED``, and prints for the first adapted layer (layer 0's query) the norms ‖B‖_F and
‖A‖_F the clients start each round from, the mean of the clients' own ‖Bᵢ‖_F, ‖Aᵢ‖_F after their local steps, and
‖B′A′ − mean BᵢAᵢ‖_F (how far the new product is from the mean of the clients' products), then the final test
accuracy. The server's round is read through ``Server.context`` and ``Server.aggregate``, left unchanged.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch

from phalanx import models
from phalanx.experiments import train
from phalanx.studies import lora as study
from phalanx.training import adapters
from phalanx.training import server as srv


def main(mode: str, seed: int, out: Path) -> None:
    p = study.PRESETS["quick"]
    cell = next(c for c in study.cells(p) if (c.mode, c.rule, c.arm, c.seed) == (mode, study.MEAN, "none", seed))
    lay = adapters.layout(models.make(p.model, (p.length,), 2, r=p.r, aggregation="factors"))
    blk = lay.blocks[0]
    seen: dict[str, torch.Tensor] = {}
    context, aggregate = srv.Server.context, srv.Server.aggregate

    def spy_context(self: srv.Server, theta: torch.Tensor, previous: torch.Tensor | None) -> dict[str, Any]:
        seen["theta"] = theta.detach().clone()
        return context(self, theta, previous)

    def spy_aggregate(self: srv.Server, got: Any, ctx: dict[str, Any], measure: bool) -> Any:
        out_, res = aggregate(self, got, ctx, measure)
        theta, x = seen["theta"], got.vectors
        b, a = lay.factors(theta, blk)
        b2, a2 = lay.factors(theta - out_, blk)
        ai = a - x[:, blk.a : blk.a + blk.rank * blk.d_in].reshape(-1, blk.rank, blk.d_in)
        bi = b - x[:, blk.b : blk.b + blk.d_out * blk.rank].reshape(-1, blk.d_out, blk.rank)
        mean = torch.einsum("nij,njk->ik", bi, ai) / x.shape[0]
        print(f"|B| {b.norm():.3g}  |A| {a.norm():.3g}  clients |Bi| {bi.norm(dim=(1, 2)).mean():.3g}  "
              f"|Ai| {ai.norm(dim=(1, 2)).mean():.3g}  |B'A' - mean BiAi| {(b2 @ a2 - mean).norm():.3g}", flush=True)
        return out_, res

    srv.Server.context = spy_context  # type: ignore[method-assign]
    srv.Server.aggregate = spy_aggregate  # type: ignore[method-assign]
    rows = train(study.config_for(p, cell), out)
    print(f"final test accuracy {rows[-1]['test_accuracy']:.4f}")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), Path(sys.argv[3]))
