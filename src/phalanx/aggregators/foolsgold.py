"""FoolsGold: down-weight clients whose update histories are too similar (Fung, Yoon & Beschastnikh, RAID 2020)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import torch
from torch import Tensor

from phalanx.aggregators._rowops import cosine_matrix, float64_gram, row_norms, weighted_sum
from phalanx.aggregators.base import (
    Aggregator,
    RuleTags,
    as_compute_dtype,
    check_positive,
    worker_ids,
)
from phalanx.aggregators.registry import register
from phalanx.errors import ConfigError, InputError

__all__ = ["FoolsGold", "foolsgold_weights", "similarities", "tie_band"]


def tie_band(d: int) -> float:
    r"""Half-width :math:`\tau(d) = 4(d + 4)\,u` (:math:`u = 2^{-53}`) of the band below 1 in which a computed cosine
    of rows of length ``d`` is a tie with 1 (:func:`similarities`).

    The float64 Gram matrix summed in any order errs by :math:`|\hat g_{ij} - g_{ij}| \le \gamma_d
    \lVert H_i\rVert \lVert H_j\rVert` with :math:`\gamma_d = du/(1 - du)` (Higham, *Accuracy and Stability of
    Numerical Algorithms*, 2nd ed., §3.1, Eq. 3.5: any order, any blocking, with or without FMA); the two square roots,
    their product and the division add four roundings, so the computed cosine errs by at most
    :math:`2\gamma_d + \gamma_4 + O(u^2) \le \tau(d)/2`: a pair whose exact cosine is 1 is computed in
    :math:`[1 - \tau/2, 1]` (after the clamp) on every machine and in every summation order."""
    return 4.0 * (d + 4) * 2.0 ** -53


def similarities(history: Tensor, usable: Tensor) -> tuple[Tensor, Tensor]:
    r"""FoolsGold's similarity matrix ``cs`` (float64 ``(n, n)``, zero diagonal) and the mask of rows that have one.

    :math:`cs_{ij} = \cos(H_i, H_j)` from the float64 Gram matrix (column chunk by column chunk), clamped to
    [−1, 1]; a row that is not ``usable`` or whose history is zero (or overflows) has cosine 0 with every row.

    **Tie rule (ours).** A cosine computed at or above :math:`1 - \tau(d)` (:func:`tie_band`) is set to exactly 1:
    its exact value may be 1 given the rounding of the sums, whose order differs between BLAS kernels, machines
    (AVX2, AVX-512) and the shape of the stacked matrix (which engine stacked it). So identical histories (ALIE's
    sybils send the same row every round) and exactly parallel ones have similarity exactly 1 wherever they are
    computed, and everything Algorithm 1 decides from it — :math:`v_i = \max_j cs_{ij}` and pardoning's
    comparison :math:`v_i < v_j` — is made with that exact value: two twins both have :math:`v = 1`, so neither
    pardons the other, and their weights are exactly 0. Without the rule the cosine of two identical rows is
    :math:`\hat g / (\sqrt{\hat g}\,\sqrt{\hat g})`, 1 or :math:`1 - 2^{-52}` by the last bit of :math:`\hat g`
    (:math:`\hat g = 2` gives the latter); when every participant has a twin the largest :math:`\alpha` is then 0
    (every weight 0) or :math:`2^{-52}` (rescaled to 0.99: every weight 1) — the engines' θ differed by 10 % on an
    AVX-512 machine (commit b2841d0). Pairs whose cosine is within :math:`\tau` of 1 but not exactly parallel (an
    angle below :math:`\sqrt{2\tau}`, 8·10⁻⁶ rad at d = 79,510) count as twins too; a cosine right at the band's
    edge is still decided by the last bit, as any threshold is.
    """
    d = history.shape[1]
    keep = usable.to(history.device)
    cs, ok = cosine_matrix(float64_gram(history.detach(), keep), keep)  # float64, column chunk by column chunk
    cs = torch.where(cs >= 1.0 - tie_band(d), torch.ones_like(cs), cs)  # a row without a cosine has 0s: untouched
    cs.fill_diagonal_(0.0)
    return cs, ok


def foolsgold_weights(history: Tensor, usable: Tensor, confidence: float = 1.0) -> Tensor:
    r"""FoolsGold's weights :math:`\alpha_i \in [0, 1]` (float64 ``(n,)``) from the rows' histories ``(n, d)``.

    Fung, Yoon & Beschastnikh, RAID 2020, Algorithm 1 (the weights), on the histories :math:`H_i`:

    .. math::

        cs_{ij} = \cos(H_i, H_j)\ (i \ne j), \quad cs_{ii} = 0, \qquad v_i = \max_j cs_{ij};

        \text{pardoning: } cs_{ij} \leftarrow cs_{ij}\, v_i / v_j \ \text{ where } v_i < v_j;

        \alpha_i = \mathrm{clip}_{[0,1]}\big(1 - \max_j cs_{ij}\big), \quad
        \alpha_i \leftarrow \alpha_i / \max_k \alpha_k \ (\text{the largest capped at } 0.99), \quad
        \alpha_i \leftarrow \mathrm{clip}_{[0,1]}\Big(\kappa \big(\ln\tfrac{\alpha_i}{1 - \alpha_i} + 0.5\big)\Big).

    Tie rule (ours, :func:`similarities`): a cosine within :math:`\tau(d) = 4(d + 4)\,2^{-53}` of 1 — the rounding
    of the float64 sums in any order — is exactly 1, so identical or exactly parallel histories get the same weights
    (0) on every engine and machine, whatever the order of the rows or of the sums.

    ``usable`` masks the rows that take part (a row that is not usable gets weight 0 and is similar to no one); a
    zero history is similar to no one (cosine 0). The zero diagonal is the authors' ``cs − I``: it makes
    :math:`v_i \ge 0`, so the pardoning divides by :math:`v_j > v_i \ge 0` only. When every weight is 0 before the
    rescaling (every usable history has a twin, or none is usable) all weights are 0.
    """
    n = history.shape[0]
    cs, ok = similarities(history, usable)
    v = cs.max(dim=1).values
    lower = v[:, None] < v[None, :]
    cs = torch.where(lower, cs * (v[:, None] / torch.where(lower, v[None, :], torch.ones_like(cs))), cs)
    alpha = (1.0 - cs.max(dim=1).values).clamp(0.0, 1.0)
    alpha = torch.where(ok, alpha, torch.zeros_like(alpha))
    top = alpha.max() if n else alpha.new_zeros(())
    if float(top) <= 0.0:
        return torch.zeros_like(alpha)
    alpha = (alpha / top).clamp(max=0.99)
    logit = confidence * (torch.log(alpha / (1.0 - alpha)) + 0.5)  # log(0) = -inf: weight 0
    return torch.where(ok, logit.clamp(0.0, 1.0), torch.zeros_like(logit))


@register
class FoolsGold(Aggregator):
    r"""FoolsGold: weight each client by how *unlike* every other client its history of updates is.

    Fung, Yoon & Beschastnikh, "The limitations of federated learning in sybil settings", RAID 2020, Algorithm 1.
    Sybils that push one poisoning objective send similar updates round after round; honest clients, whose data
    differ, do not. The rule keeps each client's history :math:`H_i = \sum_t \Delta_{i,t}` (the sum of the updates
    it sent) and, in each round, weights the round's updates by :math:`\alpha_i` computed from the cosine
    similarities of the participants' histories, with *pardoning* (a client whose maximal similarity is lower than
    another's has its similarity to that one scaled down by the ratio) and the logit confidence :math:`\kappa`
    (:func:`foolsgold_weights`). The output is

    .. math:: \mathrm{FoolsGold}(\Delta_1, \dots, \Delta_n) = \frac{1}{n} \sum_i \alpha_i\, \Delta_i,

    the paper's server update :math:`\sum_i \alpha_i \Delta_i` divided by ``n``, so that with every
    :math:`\alpha_i = 1` it is the mean (a constant factor: the server's learning rate).

    State across rounds: the histories, one row per client id, saved as ``rule.history`` in a run's checkpoints.
    Rows belong to clients through the context key ``ids`` (the server passes the round's workers: the sampled
    clients of a federated round); without it row i is client i. Similarities are taken among the round's
    participants. Not implemented: the paper's optional feature-importance weighting of the output layer, which
    needs the model's layout.

    Robustness conventions (ours): a bad row (NaN/Inf, or a norm that overflows) adds nothing to its client's
    history and gets weight 0 in that round; a client whose history overflows is not used again (weight 0). When
    every weight is 0 the output is the zero vector. The history is kept in float32 for float16/bfloat16/float32
    inputs and in float64 for float64 ones; similarities are computed in float64, and a cosine within
    :math:`\tau(d)` of 1 — the rounding of its sums — is exactly 1 (tie rule, ours: :func:`similarities`), so
    identical histories (ALIE's sybils) get the same weights on every engine and machine.

    ``f`` is not used: FoolsGold assumes no bound on the number of sybils (its guarantee is about *similar* ones);
    n identical rows give weight 0 to all of them, by design. Contributions: :math:`\alpha_i / n` (they add up to
    at most 1). ε and κ: not known; ``None``.
    """

    name: ClassVar[str] = "foolsgold"
    floor = "gemm"
    reference: ClassVar[str] = (
        "C. Fung, C. J. M. Yoon, I. Beschastnikh, 'The limitations of federated learning in sybil settings', "
        "RAID 2020, Algorithm 1"
    )
    requirement = "any n >= 1 (f is not used: no bound on the number of sybils); keeps a history per client"
    context_keys = frozenset({"ids"})
    stateful = True
    pairwise_matrices = 3  # the cosine matrix, its pardoned copy and the comparison mask
    # Cosines of histories are not translation invariant; n identical rows are n perfect sybils (weight 0).
    tags = RuleTags(translation=False, identical=False)

    def __init__(self, f: int = 0, confidence: float = 1.0) -> None:
        super().__init__(f)
        self.confidence = float(check_positive("confidence", confidence))
        self._history: Tensor | None = None

    def state_dict(self) -> dict[str, Tensor]:
        return {} if self._history is None else {"history": self._history}

    def load_state_dict(self, state: Mapping[str, Tensor]) -> None:
        unknown = sorted(set(state) - {"history"})
        if unknown:
            raise ConfigError(f"{self.name}: state", unknown, "only 'history' (one row per client)")
        history = state.get("history")
        if history is not None and (not isinstance(history, Tensor) or history.dim() != 2
                                    or history.dtype not in (torch.float32, torch.float64)):
            what = f"a tensor of shape {tuple(history.shape)} and dtype {history.dtype}" \
                if isinstance(history, Tensor) else type(history).__name__
            raise ConfigError(f"{self.name}: state 'history'", what, "a float32/float64 tensor (clients, d)")
        self._history = history

    def _grown(self, ids: Tensor, d: int, dtype: torch.dtype, device: torch.device) -> Tensor:
        """The history with a row for every client in ``ids``, on ``device`` in (at least) ``dtype``."""
        need = int(ids.max()) + 1
        h = self._history
        if h is None:
            return torch.zeros(need, d, dtype=dtype, device=device)
        if h.shape[1] != d:
            raise InputError(f"{self.name}: x", f"rows of length {d}", f"rows of length {h.shape[1]}, the length of "
                             "the history it keeps (load_state_dict({}) starts a new one)")
        h = h.to(device=device, dtype=torch.promote_types(h.dtype, dtype))
        if h.shape[0] < need:
            h = torch.cat([h, h.new_zeros(need - h.shape[0], d)])
        return h

    def _run(self, x: Tensor, want_contributions: bool, **context: Any) -> tuple[Tensor, Tensor | None]:
        n, d = x.shape
        ids = worker_ids(context, n, self.name)
        xc = as_compute_dtype(x)
        bad = row_norms(xc)[1]
        dtype = torch.float64 if xc.dtype == torch.float64 else torch.float32
        where = ids.to(x.device)
        rows = xc.detach()  # the history is data, never part of an autograd graph
        clean = torch.where(bad[:, None], torch.zeros((), dtype=xc.dtype, device=x.device), rows)
        history = self._grown(ids, d, dtype, x.device).index_add(0, where, clean.to(dtype))  # a new tensor
        self._history = history
        alpha = foolsgold_weights(history.index_select(0, where), ~bad, self.confidence)
        share = alpha / n
        out = weighted_sum(share, xc, bad) if bool((share > 0).any()) else xc.new_zeros(d)
        return out.to(x.dtype), (share if want_contributions else None)
