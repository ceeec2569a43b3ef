"""FLTrust: trust scores from a server reference gradient (Cao et al., NDSS 2021)."""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import Tensor

from phalanx.aggregators._rowops import row_norms, weighted_sum
from phalanx.aggregators.base import Aggregator, RuleTags, as_compute_dtype
from phalanx.aggregators.registry import register
from phalanx.errors import ConfigError

__all__ = ["FLTrust"]


def _check_reference(reference: Any, d: int, device: torch.device) -> Tensor:
    """Validate the server's reference gradient and return it as float64 on ``device``."""
    allowed = f"a finite floating-point torch.Tensor of shape ({d},) (the server's gradient on its root data set)"
    if reference is None:
        raise ConfigError("reference", None, allowed, "pass it per call: agg(x, reference=g0)")
    if not isinstance(reference, Tensor):
        raise ConfigError("reference", type(reference).__name__, allowed)
    if tuple(reference.shape) != (d,):
        raise ConfigError("reference", f"a tensor of shape {tuple(reference.shape)}", allowed)
    if not (reference.is_floating_point() or reference.dtype in (torch.int32, torch.int64)):
        raise ConfigError("reference", f"a tensor of dtype {reference.dtype}", allowed)
    g0 = reference.detach().to(device=device, dtype=torch.float64)
    if not bool(torch.isfinite(g0).all()):
        raise ConfigError("reference", "a tensor with NaN or Inf entries", allowed)
    if not bool(torch.isfinite(torch.linalg.vector_norm(g0))):
        raise ConfigError("reference", "a tensor whose norm overflows float64", allowed)
    return g0


@register
class FLTrust(Aggregator):
    r"""FLTrust: weight each row by its direction's agreement with a trusted server gradient.

    The server computes its own gradient :math:`g_0` on a small clean *root* data set and passes it per call
    (``agg(x, reference=g0)``). Following Cao, Fang, Liu & Gong (NDSS 2021), Eqs. (1)–(4):

    .. math::

        TS_i = \mathrm{ReLU}\big(\cos(g_i, g_0)\big), \qquad
        \bar g_i = \frac{\lVert g_0\rVert}{\lVert g_i\rVert}\, g_i, \qquad
        \mathrm{FLTrust}(g_1, \dots, g_n) = \frac{\sum_i TS_i\, \bar g_i}{\sum_j TS_j}.

    Each row is rescaled to the norm of the reference (so a huge row cannot dominate) and weighted by its positive
    cosine similarity with the reference (a row pointing away from it gets weight 0). When every trust score is 0
    (or ``g0 = 0``) the output is the zero vector, as in the paper's formula with the convention 0/0 = 0.

    Robustness conventions: a bad row (NaN/Inf, or a norm that overflows) and a zero row get trust 0. ``f`` is
    accepted for a uniform interface but not used: FLTrust needs no bound on the number of Byzantine rows, only a
    trusted reference. The reference is the server's own vector, so a missing, wrongly shaped or non-finite
    reference is a :class:`~phalanx.errors.ConfigError`, not an attack.

    Contributions are the normalised trust scores :math:`TS_i / \sum_j TS_j` (they add up to 1, or are all 0 when
    no row is trusted). The output is *not* a convex combination of the rows (each row is rescaled to
    :math:`\lVert g_0\rVert`), so the contributions are shares of trust, not coefficients of the rows.

    ε and κ: not given in Yang, Shi & Li (ICML 2025) nor in Allouah et al. (AISTATS 2023); ``None``.
    """

    name: ClassVar[str] = "fltrust"
    reference: ClassVar[str] = (
        "X. Cao, M. Fang, J. Liu, N. Z. Gong, 'FLTrust: Byzantine-robust federated learning via trust "
        "bootstrapping', NDSS 2021, Eqs. (1)-(4)"
    )
    requirement = "any n >= 1; needs a trusted reference gradient g0 per call (reference=g0); f is not used"
    context_keys = frozenset({"reference"})
    # Every row is rescaled to the norm of the server's reference, which does not move with the rows.
    tags = RuleTags(translation=False, scale=False, identical=False)

    def _run(self, x: Tensor, want_contributions: bool, **context: Any) -> tuple[Tensor, Tensor | None]:
        n, d = x.shape
        g0 = _check_reference(context.get("reference"), d, x.device)
        xc = as_compute_dtype(x)
        ref_norm = torch.linalg.vector_norm(g0)
        norms, bad = row_norms(xc)
        ok = ~bad & (norms > 0)
        safe = torch.where(ok, norms, torch.ones_like(norms))
        if float(ref_norm) == 0.0:
            trust = torch.zeros(n, dtype=torch.float64, device=x.device)
        else:
            unit = (g0 / ref_norm).to(xc.dtype)
            # Each entry of x @ u depends on one row only, so a bad row spoils only its own (masked) entry.
            dots = torch.where(ok, (xc @ unit).to(torch.float64), torch.zeros_like(norms))
            cos = (dots / safe).clamp(-1.0, 1.0)
            trust = torch.where(ok & torch.isfinite(cos), cos.clamp_min(0.0), torch.zeros_like(cos))
        # A row whose rescaling factor does not fit the compute dtype (a denormal norm) cannot be used safely.
        factor = (ref_norm / safe).to(xc.dtype)
        trust = torch.where(torch.isfinite(factor), trust, torch.zeros_like(trust))
        total = trust.sum()
        if float(total.detach()) <= 0.0:
            out = torch.zeros(d, dtype=x.dtype, device=x.device)
            contrib = torch.zeros(n, dtype=torch.float64, device=x.device)
            return out, (contrib if want_contributions else None)
        share = trust / total
        coef = share * (ref_norm / safe)
        out = weighted_sum(coef, xc, bad)
        return out.to(x.dtype), (share if want_contributions else None)
