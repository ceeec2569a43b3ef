"""Shared by the LoRA misfit tests: what a Byzantine participant sends when its adapter is not the model's — a real
adapter row of another rank, or of fewer adapted layers — built from the honest row and the model's layout.

``BYZANTINE_RANK`` is the program such a participant runs on the torchrun engine: the ordinary worker rank
(:mod:`phalanx.distributed.worker`) whose every vector is re-laid out as ``KIND`` before it is sent (its own code,
with its own valid place in the job: the same config, so rank 0 lets it in).
"""

from __future__ import annotations

import torch
from torch import Tensor

from phalanx.aggregators.lora import LoraLayout

EXTRA = 2
"""How much larger the wrong rank is: r + EXTRA."""


def misfit_row(v: Tensor, layout: LoraLayout, kind: str) -> Tensor:
    """``v`` (a row of ``layout``) as the row of another adapter: ``rank`` — every A padded with EXTRA zero rows and
    every B with EXTRA zero columns, so that each layer's product B·A is unchanged but the rank is r + EXTRA;
    ``layers`` — the last adapted layer's A and B left out (adapters on fewer modules)."""
    if kind not in ("rank", "layers"):
        raise ValueError(kind)
    last = layout.blocks[-1]
    pieces: list[tuple[int, Tensor]] = []  # (offset in v, what goes there), in offset order
    covered = torch.zeros(layout.dim, dtype=torch.bool)
    for blk in layout.blocks:
        b, a = layout.factors(v, blk)
        covered[blk.a : blk.a + a.numel()] = True
        covered[blk.b : blk.b + b.numel()] = True
        if kind == "layers" and blk is last:
            continue
        if kind == "rank":
            a = torch.cat([a, a.new_zeros(EXTRA, blk.d_in)])
            b = torch.cat([b, b.new_zeros(blk.d_out, EXTRA)], dim=1)
        pieces += [(blk.a, a.reshape(-1)), (blk.b, b.reshape(-1))]
    rest = (~covered).nonzero().flatten()
    if rest.numel():
        pieces.append((int(rest[0]), v[rest]))
    return torch.cat([p for _, p in sorted(pieces, key=lambda x: x[0])])


BYZANTINE_RANK = """
import sys

sys.path.insert(0, {root!r})
import torch

from phalanx.distributed import parameter_server as ps, wire, worker
from phalanx.training import adapters
from tests._lora_misfit import misfit_row

KIND = sys.argv[1]
honest_run = ps.ParameterServerWorker.run


def run(self):
    layout = adapters.layout(self.exp.model)
    dtype = self.exp.problem.initial_theta().dtype
    send = self.links.send_vector

    def send_misfit(t, payload):
        v = wire.bytes_tensor(payload, dtype)
        send(t, wire.tensor_bytes(misfit_row(v, layout, KIND)))

    self.links.send_vector = send_misfit
    honest_run(self)


ps.ParameterServerWorker.run = run
sys.exit(worker.main(sys.argv[2:]))
"""
