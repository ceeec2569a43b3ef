"""FLDetector: flag clients whose updates are inconsistent with an L-BFGS prediction from the history (Zhang, Cao,
Jia & Gong, KDD 2022)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import torch
from torch import Tensor

from phalanx.aggregators._rowops import row_norms
from phalanx.aggregators.base import (
    Aggregator,
    RuleTags,
    as_compute_dtype,
    check_positive,
    random_source,
    worker_ids,
)
from phalanx.aggregators.registry import make, register
from phalanx.errors import ConfigError, InputError

__all__ = ["FLDetector", "gap_clusters", "kmeans_1d", "lbfgs_product"]

_STATE = ("last", "lag", "seen", "scores", "count", "flagged", "s", "y", "prev")


def lbfgs_product(s: Tensor, y: Tensor, v: Tensor) -> Tensor:
    r"""The L-BFGS Hessian approximation :math:`B` built from the pairs ``(s_k, y_k)`` (rows of ``s``, ``y``:
    ``(m, d)``, oldest first) applied to the rows of ``v`` ``(k, d)``: ``(k, d)``.

    Byrd, Nocedal & Schnabel, "Representations of quasi-Newton matrices and their use in limited memory methods",
    Math. Programming 1994, Theorem 2.3 (the compact form FLDetector's Algorithm 2 uses), with
    :math:`\sigma = y_m^\top s_m / s_m^\top s_m`:

    .. math::
        B v = \sigma v - [\sigma S\ \ Y]
        \begin{bmatrix} \sigma S^\top S & L \\ L^\top & -D \end{bmatrix}^{-1}
        \begin{bmatrix} \sigma S^\top v \\ Y^\top v \end{bmatrix},

    :math:`L` the strictly lower triangle of :math:`S^\top Y` and :math:`D` its diagonal. The small matrices are
    float64 (the ``(·, d)`` products in the dtype given); a singular middle matrix is pseudo-inverted. :math:`B v`
    is unchanged when every ``s_k`` and ``v`` are scaled by one constant, so the pairs may be given in any fixed unit
    of the model's steps.
    """
    # Fresh copies: the CPU BLAS picks its kernel by the operands' address alignment, and a pair table that is
    # a slice of a larger one (or a tensor read from a checkpoint) sits at another alignment than a fresh one, so
    # the last bits would depend on how the operands came to be, not on their values (a resumed run would drift).
    s, y, v = s.clone(), y.clone(), v.clone()
    sy = (s @ y.T).to(torch.float64)  # the (m, m) and (2m, k) matrices in float64, the (·, d) ones as given
    ss = (s @ s.T).to(torch.float64)
    last = float(ss[-1, -1])
    sigma = float(sy[-1, -1]) / last if last > 0 else 0.0
    if not torch.isfinite(torch.tensor(sigma)):
        sigma = 0.0
    low = torch.tril(sy, diagonal=-1)
    mid = torch.cat([torch.cat([sigma * ss, low], dim=1), torch.cat([low.T, -torch.diag(sy.diagonal())], dim=1)])
    p = torch.cat([sigma * (s @ v.T), y @ v.T]).to(torch.float64)  # (2m, k)
    coef = (torch.linalg.pinv(mid) @ p).to(v.dtype)
    m = s.shape[0]
    return sigma * v - (coef[:m].T * sigma) @ s - coef[m:].T @ y


def kmeans_1d(values: Tensor, k_max: int) -> tuple[Tensor, Tensor]:
    """Exact 1-D k-means of each row of ``values`` ``(b, m)`` for k = 1 … ``k_max``: the within-cluster sums of
    squares ``(b, k_max)`` and, for k = 2, the index that splits each sorted row (the second cluster starts there).

    In one dimension the optimal clusters are runs of the sorted values, so a dynamic programme over the split
    points finds the global optimum (no random restarts, unlike Lloyd's algorithm): O(k_max · m²) per row.
    """
    a = torch.sort(values.to(torch.float64), dim=1).values
    b, m = a.shape
    zero = torch.zeros(b, 1, dtype=torch.float64)
    s1 = torch.cat([zero, a.cumsum(1)], dim=1)
    s2 = torch.cat([zero, a.square().cumsum(1)], dim=1)
    idx = torch.arange(m + 1)
    size = (idx[None, :] - idx[:, None]).to(torch.float64)  # (i, j): the run a[i:j]
    valid = size > 0
    sums = s1[:, None, :] - s1[:, :, None]
    cost = s2[:, None, :] - s2[:, :, None] - sums.square() / torch.where(valid, size, 1.0)
    cost = torch.where(valid, cost.clamp_min(0.0), torch.full_like(cost, float("inf")))
    dp = cost[:, 0, :]  # one cluster over a[0:j]
    within = [dp[:, m]]
    split = torch.zeros(b, dtype=torch.int64)
    for k in range(2, k_max + 1):
        total = dp[:, :, None] + cost  # (b, i, j): k − 1 clusters over a[0:i], one over a[i:j]
        if k == 2:
            split = torch.argmin(total[:, :, m], dim=1)
        dp = total.min(dim=1).values
        within.append(dp[:, m])
    return torch.stack(within, dim=1), split


def gap_clusters(scores: Tensor, generator: torch.Generator, references: int = 10, k_max: int = 7) -> int:
    """The number of clusters the gap statistic picks for 1-D ``scores`` (Tibshirani, Walther & Hastie, JRSS B
    2001): the smallest k with Gap(k) ≥ Gap(k + 1) − s(k + 1), on the scores rescaled to [0, 1] against
    ``references`` uniform samples on [0, 1] drawn from ``generator``; ``k_max`` if none (1 when all scores are
    equal). Clustering is exact (:func:`kmeans_1d`)."""
    m = scores.numel()
    lo, hi = float(scores.min()), float(scores.max())
    if m < 2 or not hi > lo:
        return 1
    k_max = min(k_max, m)
    data = ((scores.to(torch.float64).cpu() - lo) / (hi - lo))[None, :]
    ref = torch.rand(references, m, generator=generator, dtype=torch.float64)
    within = kmeans_1d(torch.cat([data, ref]), k_max)[0].clamp_min(1e-12).log()
    gap = within[1:].mean(dim=0) - within[0]
    sd = within[1:].std(dim=0, unbiased=False) * (1.0 + 1.0 / references) ** 0.5
    for k in range(1, k_max):
        if bool(gap[k - 1] >= gap[k] - sd[k]):
            return k
    return k_max


@register
class FLDetector(Aggregator):
    r"""FLDetector: predict each client's update from the history with an L-BFGS Hessian, flag the clients whose
    updates keep missing their prediction, aggregate the others with a base robust rule.

    Z. Zhang, X. Cao, J. Jia, N. Z. Gong, "FLDetector: Defending federated learning against model poisoning
    attacks via detecting malicious clients", KDD 2022, Algorithms 1 and 2. In round t, client i's update is
    predicted from its previous one by the Cauchy mean-value theorem with an L-BFGS approximation
    :math:`\hat H_t` of the Hessian built from the last N pairs of global-model differences and global-update
    differences (:func:`lbfgs_product`):

    .. math::
        \hat g^i_t = g^i_{t-1} + \hat H_t (w_t - w_{t-1}), \qquad
        d^i_t = \|\hat g^i_t - g^i_t\|_2, \qquad
        s^i_t = \frac1N \sum_{r=0}^{N-1} \frac{d^i_{t-r}}{\bar d_{t-r}},

    :math:`\bar d` the round's mean error (the paper normalises by the sum; the factor n changes no clustering).
    When the gap statistic on the suspicious scores :math:`s_t` finds more than one cluster
    (:func:`gap_clusters`), 2-means splits them and the clients of the cluster with the larger mean are flagged
    malicious; a flagged client is left out of the aggregation from then on (the paper removes it) and every
    score starts anew (the paper restarts training after a detection). Ours, not the paper's: a detection that
    would bring the flagged clients above f (the number the rule is configured to tolerate) flags no one — without
    it, a gap statistic that splits honest noise flags clients round after round. The round's
    other rows are aggregated by ``base`` (default ``"cwmed"``, the median of the authors' code; any stateless
    rule spec, configured for f, or for fewer when too few rows are kept).

    The model is not seen by a rule: the global-model differences are taken as the rule's own outputs,
    :math:`w_t - w_{t-1} = -\eta\, \mathrm{Agg}_{t-1}` for a server that steps along the aggregate with a fixed
    learning rate η (FedAvg's server step, the paper's setting). :math:`\hat H_t v` is invariant to the unit of
    the pairs, so η is not needed; with a server optimizer that is not plain SGD at a fixed rate the pairs are an
    approximation. Client sampling (the ``ids`` context): a client's prediction uses its last update and the sum
    of the aggregates since then (``lag``), and a client is judged once it has N scored rounds; with full
    participation this is the paper's algorithm. Detection starts once N pairs are stored (round N + 1).

    Documented simplifications: clustering is exact 1-D k-means (dynamic programming) where the authors use
    scikit-learn's k-means; the gap statistic's uniform references (10, k ≤ 7 as in the authors' code) are drawn
    from the ``generator`` the server passes (its checkpointed stream; the rule's own seeded one otherwise); the
    paper's restart of training after a detection is the run's business, not the rule's. A bad row (NaN/Inf, or
    a norm that overflows) is left to the base rule, is not scored and leaves its client's history as it was.

    State across rounds (saved as ``rule.<key>``): per client its last update, the sum of aggregates since
    (``lag``), whether it has one, its last N normalised errors and their count, whether it is flagged; the L-BFGS
    pairs ``s``, ``y`` and the previous aggregate. Memory: two ``(clients, d)`` tables and ``2N + 1`` vectors.
    Contributions: the base rule's shares on the kept rows, 0 on flagged ones. ε and κ: not known; ``None``.
    """

    subnormals_as_zero = True  # subnormal arithmetic made it tens of times slower on a CPU: flush to zero (_subnormals)
    name: ClassVar[str] = "fldetector"
    reference: ClassVar[str] = (
        "Z. Zhang, X. Cao, J. Jia, N. Z. Gong, 'FLDetector: Defending federated learning against model poisoning "
        "attacks via detecting malicious clients', KDD 2022, Algorithms 1-2"
    )
    stateful = True
    pairwise_matrices = 33  # the k-means programme: costs, sums and one step, for the scores and 10 references
    # Pairs of differences of the rule's own outputs are not translation invariant; one round from a fresh state
    # is the base rule's output (the property checks), which keeps the base rule's other claims.
    tags = RuleTags(translation=False)

    def __init__(self, f: int = 0, window: int = 10, base: str = "cwmed", seed: int = 0) -> None:
        super().__init__(f)
        self.window = int(check_positive("window", window, integer=True))
        if not isinstance(base, str):
            raise ConfigError("base", base, "a rule spec such as 'cwmed' or 'cwtm'")
        self.base = base
        self.seed = int(check_positive("seed", seed, integer=True, allow_zero=True))
        self._base = make(base, f)
        if self._base.stateful or "ids" in self._base.context_keys:
            raise ConfigError("base", base, "a stateless rule (FLDetector keeps the history itself)")
        self.context_keys = frozenset({"ids", "generator"}) | self._base.context_keys
        self.requirement = f"{self._base.requirement} (the base rule {base}); window >= 1; keeps a history per client"
        self._rules: dict[int, Aggregator] = {f: self._base}
        self._generator = torch.Generator().manual_seed(self.seed)
        self._state: dict[str, Tensor] = {}

    def min_workers(self) -> int:
        return self._base.min_workers()

    # ------------------------------------------------------------------------------------------------ state

    def state_dict(self) -> dict[str, Tensor]:
        return dict(self._state)

    def load_state_dict(self, state: Mapping[str, Tensor]) -> None:
        unknown = sorted(set(state) - set(_STATE))
        if unknown:
            raise ConfigError(f"{self.name}: state", unknown, f"keys among {', '.join(_STATE)}")
        for key, value in state.items():
            if not isinstance(value, Tensor):
                raise ConfigError(f"{self.name}: state {key!r}", type(value).__name__, "a tensor")
        if state and set(state) != set(_STATE):
            raise ConfigError(f"{self.name}: state", sorted(state), f"all of {', '.join(_STATE)} (or none)")
        if state and state["scores"].shape[1] != self.window:
            raise ConfigError(f"{self.name}: state 'scores'", tuple(state["scores"].shape),
                              f"(clients, window = {self.window})")
        self._state = dict(state)

    def _tables(self, need: int, d: int, dtype: torch.dtype, device: torch.device) -> dict[str, Tensor]:
        st = self._state
        if not st:
            empty = torch.zeros(0, d, dtype=dtype, device=device)
            st = {"last": empty, "lag": empty, "seen": torch.zeros(0, dtype=torch.bool),
                  "scores": torch.zeros(0, self.window, dtype=torch.float64),
                  "count": torch.zeros(0, dtype=torch.int64),
                  "flagged": torch.zeros(0, dtype=torch.bool), "s": empty, "y": empty,
                  "prev": torch.zeros(0, d, dtype=dtype, device=device)}
        if st["last"].shape[1] != d:
            raise InputError(f"{self.name}: x", f"rows of length {d}", f"rows of length {st['last'].shape[1]}, "
                             "the length of the history it keeps (load_state_dict({}) starts a new one)")
        out = {k: v.to(device=device, dtype=torch.promote_types(v.dtype, dtype))
               if k in ("last", "lag", "s", "y", "prev") else v.cpu() for k, v in st.items()}
        have = out["last"].shape[0]
        if have < need:
            extra = need - have
            for k in ("last", "lag"):
                # the device named, not new_zeros of the (maybe empty) table: an empty tensor has no storage, and
                # the emulated CUDA device of tests/test_device.py cannot tell where it lives
                out[k] = torch.cat([out[k], torch.zeros(extra, d, dtype=out[k].dtype, device=device)])
            for k in ("seen", "flagged"):
                out[k] = torch.cat([out[k], torch.zeros(extra, dtype=torch.bool)])
            out["scores"] = torch.cat([out["scores"], torch.zeros(extra, self.window, dtype=torch.float64)])
            out["count"] = torch.cat([out["count"], torch.zeros(extra, dtype=torch.int64)])
        return out

    # ---------------------------------------------------------------------------------------------- a round

    def _base_for(self, kept: int) -> Aggregator | None:
        f = self.f
        while f > 0 and self._rules.setdefault(f, self._base.with_f(f)).min_workers() > kept:
            f -= 1
        rule = self._rules.setdefault(f, self._base.with_f(f))
        return rule if rule.min_workers() <= kept else None

    def _run(self, x: Tensor, want_contributions: bool, **context: Any) -> tuple[Tensor, Tensor | None]:
        n, d = x.shape
        ids = worker_ids(context, n, self.name)
        xc = as_compute_dtype(x).detach()
        bad = row_norms(xc)[1].cpu()
        dtype = torch.float64 if xc.dtype == torch.float64 else torch.float32
        st = self._tables(int(ids.max()) + 1, d, dtype, x.device)
        rows = xc.to(dtype)
        flagged = st["flagged"].clone()
        scores, count = st["scores"], st["count"]
        # Score the participants with a prediction: a stored update, a good row, a full L-BFGS memory.
        scored = st["seen"][ids] & ~bad & ~flagged[ids]
        if st["s"].shape[0] == self.window and bool(scored.any()):
            who = scored.nonzero().flatten()
            cid = ids[who]
            where = cid.to(x.device)
            pred = st["last"].index_select(0, where) + lbfgs_product(st["s"], st["y"], st["lag"].index_select(0, where))
            err = torch.linalg.vector_norm(pred - rows[who.to(x.device)], dim=1).to(torch.float64).cpu()
            mean = float(err.mean())
            norm = err / mean if mean > 0 and torch.isfinite(err).all() else torch.ones_like(err)
            scores = scores.clone()
            count = count.clone()
            scores[cid, count[cid] % self.window] = norm
            count[cid] += 1
            judged = cid[count[cid] >= self.window]
            if judged.numel() >= 2:
                s = scores[judged].mean(dim=1)
                gen = random_source(context, self._generator)
                if gap_clusters(s, gen) > 1:
                    _, split = kmeans_1d(s[None, :], 2)
                    order = torch.sort(s.to(torch.float64), stable=True).indices
                    high = judged[order[int(split[0]):]]
                    if high.numel() <= self.f - int(flagged.sum()):  # never more than f flagged in all
                        flagged[high] = True
                        count = torch.zeros_like(count)  # the paper restarts after a detection: scores anew
        kept = ~flagged[ids]
        out, share = self._aggregate(x, xc, kept, want_contributions, context)
        self._remember(st, ids, rows, bad, out.to(dtype), scores, count, flagged)
        return out.to(x.dtype), share

    def _aggregate(
        self, x: Tensor, xc: Tensor, kept: Tensor, want: bool, context: dict[str, Any],
    ) -> tuple[Tensor, Tensor | None]:
        n, d = x.shape
        keep = kept.nonzero().flatten()
        rule = self._base_for(keep.numel())
        share = torch.zeros(n, dtype=torch.float64, device=x.device)
        if rule is None:
            return xc.new_zeros(d), (share if want else None)
        inner = {k: v for k, v in context.items() if k in rule.context_keys}
        sub = xc if keep.numel() == n else xc[keep.to(x.device)]
        if want:
            out, part = rule.aggregate(sub, **inner)
            share[keep.to(x.device)] = part.to(share.device)
            return out, share
        return rule(sub, **inner), None

    def _remember(
        self, st: dict[str, Tensor], ids: Tensor, rows: Tensor, bad: Tensor, out: Tensor, scores: Tensor,
        count: Tensor, flagged: Tensor,
    ) -> None:
        good = (~bad).nonzero().flatten()
        cid = ids[good].to(rows.device)
        last = st["last"].index_copy(0, cid, rows[good.to(rows.device)])
        lag = (st["lag"] + out).index_copy(0, cid, out.expand(cid.numel(), -1).contiguous())
        seen = st["seen"].clone()
        seen[ids[good]] = True
        s, y, prev = st["s"], st["y"], st["prev"]
        if prev.shape[0] and bool(torch.isfinite(out).all()) and float(prev.square().sum()) > 0:
            s = torch.cat([s, prev])[-self.window :]
            y = torch.cat([y, out[None] - prev])[-self.window :]
        if bool(torch.isfinite(out).all()):
            prev = out[None].clone()
        self._state = {"last": last, "lag": lag, "seen": seen, "scores": scores, "count": count,
                       "flagged": flagged, "s": s, "y": y, "prev": prev}
