"""Subnormal rows: an availability attack on the server's arithmetic, not on its output."""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import Tensor

from phalanx.attacks._common import check_choice
from phalanx.attacks.base import Attack, AttackContext
from phalanx.attacks.registry import register

__all__ = ["Subnormal"]

_BITS = {
    # dtype: (the signed integer type of its width, its mantissa bits)
    torch.float16: (torch.int16, 10),
    torch.bfloat16: (torch.int16, 7),
    torch.float32: (torch.int32, 23),
    torch.float64: (torch.int64, 52),
}


@register
class Subnormal(Attack):
    r"""Rows of subnormal numbers, or of normal numbers whose products with honest entries are subnormal.

    A *subnormal* number is non-zero and below the dtype's smallest normal :math:`t` (``torch.finfo(dtype).tiny``:
    :math:`1.18\cdot 10^{-38}` in float32). On x86 CPUs an operation that reads or produces one leaves the fast
    path for a microcode assist, tens of times slower (Andrysco et al., "On Subnormal Floating Point and Abnormal
    Timing", IEEE S&P 2015). The rows are numerically almost zero, so they hardly move any rule's output; what
    they attack is the server's *time*: before Phalanx's rules computed with flush-to-zero, four such rows among
    twenty made Krum 28× slower (docs/aggregators.md, "Behaviour under attack").

    * ``values="subnormal"`` (default): every entry is a uniformly random subnormal of the honest rows' dtype — a
      uniformly random non-zero mantissa, a zero exponent field and a random sign bit — so :math:`0 < |y_{ij}| < t`.
    * ``values="near"``: every entry is :math:`\pm t(1 + u_{ij})`, :math:`u_{ij} \sim U[0, 1)`, rounded to the dtype
      (so :math:`t \le |y_{ij}| \le 2t`): normal numbers, which a check of the input for subnormals lets through,
      but whose products with honest entries below 1/2 in magnitude are subnormal (a distance or an inner product
      with an honest row then runs on the slow path).

    The draws come from ``ctx.generator`` on the CPU (the signs, then the mantissas as integers or ``u`` in
    float64), so the same seed gives the same rows on every device. Needs no honest vector (``solo``); the rows are
    finite.
    """

    name: ClassVar[str] = "subnormal"
    reference: ClassVar[str] = (
        "Phalanx's own availability attack through subnormal arithmetic (M. Andrysco, D. Kohlbrenner, K. Mowery, "
        "R. Jhala, S. Lerner, H. Shacham, 'On Subnormal Floating Point and Abnormal Timing', IEEE S&P 2015)"
    )
    threat: ClassVar[str] = "none needed"
    stochastic: ClassVar[bool] = True
    through_weights: ClassVar[bool] = False  # a Flower client replies w + y: every such y rounds away (w + y = w)
    reads_honest = False
    solo = True

    def __init__(self, values: str = "subnormal") -> None:
        self.values = check_choice("values", values, ("subnormal", "near"))

    def _run(self, ctx: AttackContext) -> Tensor:
        dtype, device = ctx.honest.dtype, ctx.honest.device
        shape = (ctx.n_byzantine, ctx.dim)
        negative = torch.randint(0, 2, shape, generator=ctx.generator, dtype=torch.int64)
        if self.values == "near":
            u = torch.rand(shape, generator=ctx.generator, dtype=torch.float64)
            sign = 1.0 - 2.0 * negative.to(torch.float64)
            return (sign * torch.finfo(dtype).tiny * (1.0 + u)).to(dtype=dtype, device=device)
        itype, mantissa = _BITS[dtype]
        width = torch.iinfo(itype).bits
        bits = torch.randint(1, 2**mantissa, shape, generator=ctx.generator, dtype=torch.int64)
        # exponent field 0 and mantissa ≠ 0: a subnormal; the sign bit set in the integers (two's complement), not
        # by arithmetic, which a thread in flush-to-zero mode would turn into 0
        signed = bits - negative * 2 ** (width - 1)
        return signed.to(itype).view(dtype).to(device)
