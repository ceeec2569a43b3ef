"""Split a data set's samples among workers: IID, Dirichlet label skew, pathological k-classes-per-worker, and the
data's own users (``natural``: a FEMNIST writer, a Shakespeare role — one worker each).

:func:`partition` returns one int64 index tensor per worker (sorted ascending, pairwise disjoint). ``iid`` and
``dirichlet`` cover every sample; ``pathological`` does too (every shard goes to some worker); ``natural`` does when
there are as many workers as users, else it covers the sampled users' samples. Shard sizes are
unequal in general — that is the point of the non-IID schemes. :func:`heterogeneity` summarises a partition for
reports (label-distribution distance to the global one, classes and sizes per worker).

All randomness comes from ``numpy.random.default_rng(seed)``: the same labels, scheme, parameters and seed give the
same partition on every machine.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor

from phalanx.errors import ConfigError
from phalanx.validate import check_int, suggest

__all__ = ["SCHEMES", "heterogeneity", "partition"]

SCHEMES = ("iid", "dirichlet", "pathological", "natural")
_MAX_DIRICHLET_DRAWS = 100


def _labels_array(labels: Any) -> np.ndarray[Any, Any]:
    if isinstance(labels, Tensor):
        arr = labels.detach().to("cpu").numpy()
    elif isinstance(labels, np.ndarray):
        arr = labels
    else:
        raise ConfigError("labels", type(labels).__name__, "a 1-D integer torch.Tensor (or numpy array)")
    if arr.ndim != 1 or arr.shape[0] == 0:
        raise ConfigError("labels", f"shape {tuple(arr.shape)}", "a non-empty 1-D tensor of class indices")
    if not np.issubdtype(arr.dtype, np.integer):
        raise ConfigError("labels", f"dtype {arr.dtype}", "an integer dtype (class indices)")
    if int(arr.min()) < 0:
        raise ConfigError("labels", f"min {int(arr.min())}", "class indices >= 0")
    return arr.astype(np.int64, copy=False)


def partition(
    labels: Tensor,
    n_workers: int,
    scheme: str = "iid",
    *,
    alpha: float = 1.0,
    classes_per_worker: int = 2,
    seed: int = 0,
    min_size: int = 1,
    users: Tensor | None = None,
) -> list[Tensor]:
    """Split sample indices ``0 .. len(labels) − 1`` among ``n_workers`` workers.

    Schemes
    -------
    ``"iid"``: a seeded random permutation cut into ``n_workers`` contiguous pieces whose sizes differ by at most 1.

    ``"dirichlet"``: label skew controlled by ``alpha`` > 0. For each class ``c`` independently, proportions
    ``p_c ~ Dir(α·1_n)`` over the workers are drawn and the class's (shuffled) samples are cut at
    ``⌊n_c · cumsum(p_c)⌋``. Small α: each worker holds few classes and sizes vary a lot; α → ∞: every worker gets
    ≈ 1/n of every class, i.e. IID. This is the per-class form used by Yurochkin et al. (ICML 2019) and surveyed by
    Li et al. (ICDE 2022, "Federated learning on non-IID data silos", §4.1), and by Yang, Shi & Li (ICML 2025,
    α ∈ {0.1, 1, 10}); Hsu, Qi & Brown (arXiv:1909.06335, §3) draw per *worker* class proportions
    ``q ~ Dir(α·p)`` instead — both give IID as α → ∞ and concentrate on few classes as α → 0.
    Every worker must get at least ``min_size`` samples: all proportions are redrawn (up to 100 times, which
    conditions the draw on the constraint, as the common implementations do); if that still fails — small α with
    many workers — single samples are moved from the largest worker (its most frequent class) to the smallest
    until the constraint holds, which changes the partition only as much as needed.

    ``"pathological"`` (McMahan et al., AISTATS 2017, §3 "Pathological Non-IID"): the samples, shuffled then
    stably sorted by label, are cut into ``n_workers · classes_per_worker`` shards of near-equal size, and each
    worker gets ``classes_per_worker`` shards at random. Unlike the paper, whose random assignment can give a
    worker two shards of the same class, shards are then swapped between workers until every worker's shards
    have distinct majority labels wherever such a swap exists. When shard boundaries fall inside a class a
    shard spans two labels, so a worker can hold slightly more than ``classes_per_worker`` labels.

    ``"natural"`` (LEAF, Caldas et al. 2018: the data's own clients): ``users`` gives each sample's user (a writer,
    a speaking role); every user with at least ``min_size`` samples is eligible, and each worker is one user, in
    user order (worker ``w`` is the ``w``-th eligible user by id). With as many workers as eligible users that is
    all of them; with fewer — FEMNIST has thousands of writers — ``n_workers`` users are drawn without replacement
    from ``numpy.random.default_rng(seed)`` (kept in user order), and only their samples are covered. More workers
    than eligible users is a ConfigError naming ``n_workers``. No label information is used: the heterogeneity is
    the users' own.

    Parameters
    ----------
    labels: 1-D integer tensor of class indices (≥ 0), one per sample.
    n_workers: number of workers, 1 ≤ n_workers ≤ len(labels).
    scheme: ``"iid"``, ``"dirichlet"``, ``"pathological"`` or ``"natural"``.
    alpha: Dirichlet concentration (> 0, finite); used by ``"dirichlet"``.
    classes_per_worker: shards (≈ classes) per worker, 1 ≤ k ≤ number of distinct labels; used by ``"pathological"``.
    seed: seed of ``numpy.random.default_rng``.
    min_size: the smallest number of samples a worker may get (≥ 1); ``n_workers · min_size ≤ len(labels)``.
    users: ``"natural"`` only: 1-D integer tensor of user ids (≥ 0), one per sample (``Dataset.train_users``).

    Returns a list of ``n_workers`` int64 tensors of sample indices, each sorted ascending, pairwise disjoint,
    together covering every sample (``"natural"`` with fewer workers than users: the sampled users' samples).
    """
    y = _labels_array(labels)
    n = y.shape[0]
    if not isinstance(scheme, str) or scheme not in SCHEMES:
        raise ConfigError("scheme", scheme, "one of " + ", ".join(SCHEMES), suggest(scheme, SCHEMES, n=1))
    n_workers = check_int("n_workers", n_workers, low=1, high=n, hint=f"there are only {n} samples")
    min_size = check_int("min_size", min_size, low=1)
    if n_workers * min_size > n:
        raise ConfigError(
            "min_size", min_size, f"an integer <= {n // n_workers}", f"{n_workers} workers × {min_size} > {n} samples",
        )
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0 < alpha < float("inf"):
        raise ConfigError("alpha", alpha, "a finite number > 0 (small: skewed; large: close to IID)")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ConfigError("seed", seed, "an integer >= 0")
    if scheme == "natural":  # labels play no part (classes_per_worker is pathological's)
        return [torch.from_numpy(p) for p in _natural(users, n, n_workers, min_size, np.random.default_rng(int(seed)))]
    classes = np.unique(y)
    k = check_int("classes_per_worker", classes_per_worker, low=1, high=len(classes),
                  hint=f"{len(classes)} classes in labels")
    rng = np.random.default_rng(int(seed))
    if users is not None:
        raise ConfigError("users", "given", f"None with scheme = {scheme!r} (user ids are read by 'natural' only)")
    if scheme == "iid":
        parts = np.array_split(rng.permutation(n), n_workers)
    elif scheme == "dirichlet":
        parts = _dirichlet(y, classes, n_workers, float(alpha), min_size, rng)
    else:
        shards = n_workers * k
        if shards > n:
            raise ConfigError(
                "classes_per_worker", k, f"an integer <= {n // n_workers}",
                f"{n_workers} workers × {k} shards > {n} samples",
            )
        if n // shards * k < min_size:
            raise ConfigError(
                "min_size", min_size, f"an integer <= {n // shards * k}",
                f"{n_workers} workers × {k} shards of about {n // shards} samples",
            )
        parts = _pathological(y, n_workers, k, rng)
    return [torch.from_numpy(np.sort(p).astype(np.int64)) for p in parts]


def _natural(
    users: Tensor | None, n: int, n_workers: int, min_size: int, rng: np.random.Generator,
) -> list[np.ndarray[Any, Any]]:
    """The ``"natural"`` scheme (see :func:`partition`): one eligible user per worker, all or a seeded sample."""
    if users is None:
        raise ConfigError("users", None, "each sample's user id (a data set with writer or speaker ids: femnist, "
                          "shakespeare, sent140, data.from_hf(..., user=...)) for scheme 'natural'")
    u = _labels_array(users)
    if u.shape[0] != n:
        raise ConfigError("users", f"{u.shape[0]} ids", f"one user id per sample ({n})")
    order = np.argsort(u, kind="stable")  # sample indices grouped by user, ascending within a user
    ids, starts, counts = np.unique(u[order], return_index=True, return_counts=True)
    eligible = np.flatnonzero(counts >= min_size)
    if n_workers > eligible.size:
        raise ConfigError("n_workers", n_workers, f"an integer <= {eligible.size} (the users with >= {min_size} "
                          f"samples: partition 'natural' makes each user one worker)",
                          f"{ids.size} users in all" if ids.size != eligible.size else None)
    chosen = eligible if n_workers == eligible.size else np.sort(rng.choice(eligible, n_workers, replace=False))
    return [np.sort(order[starts[i]: starts[i] + counts[i]]).astype(np.int64) for i in chosen]


def _dirichlet(
    y: np.ndarray[Any, Any], classes: np.ndarray[Any, Any], n_workers: int, alpha: float, min_size: int,
    rng: np.random.Generator,
) -> list[np.ndarray[Any, Any]]:
    per_class = np.array([(y == c).sum() for c in classes], dtype=np.int64)
    counts = np.zeros((len(classes), n_workers), dtype=np.int64)
    for _ in range(_MAX_DIRICHLET_DRAWS):
        p = rng.dirichlet(np.full(n_workers, alpha), size=len(classes))  # (C, n): row c = class c over workers
        cuts = np.floor(np.cumsum(p, axis=1) * per_class[:, None]).astype(np.int64)
        cuts[:, -1] = per_class  # the last cut is the class size exactly, whatever the rounding of cumsum
        cuts = np.maximum.accumulate(np.clip(cuts, 0, per_class[:, None]), axis=1)
        counts = np.diff(cuts, axis=1, prepend=0)
        if counts.sum(axis=0).min() >= min_size:
            break
    else:
        sizes = counts.sum(axis=0)
        while sizes.min() < min_size:  # terminates: n_workers * min_size <= n, so some worker has > min_size
            small, big = int(np.argmin(sizes)), int(np.argmax(sizes))
            c = int(np.argmax(counts[:, big]))
            counts[c, big] -= 1
            counts[c, small] += 1
            sizes[big] -= 1
            sizes[small] += 1
    parts: list[list[np.ndarray[Any, Any]]] = [[] for _ in range(n_workers)]
    for ci, c in enumerate(classes):
        idx = rng.permutation(np.flatnonzero(y == c))
        for w, chunk in enumerate(np.split(idx, np.cumsum(counts[ci])[:-1])):
            parts[w].append(chunk)
    return [np.concatenate(p) for p in parts]


def _pathological(
    y: np.ndarray[Any, Any], n_workers: int, k: int, rng: np.random.Generator,
) -> list[np.ndarray[Any, Any]]:
    order = rng.permutation(y.shape[0])
    order = order[np.argsort(y[order], kind="stable")]  # sorted by label, random within a label
    shards = np.array_split(order, n_workers * k)
    label = np.array([np.bincount(y[s]).argmax() for s in shards])  # majority label (the smaller on ties)
    assign = rng.permutation(n_workers * k).reshape(n_workers, k)  # McMahan et al.: k random shards per worker
    lab = label[assign]  # (n, k) majority labels held by each worker
    for w in range(n_workers):
        while True:
            row = lab[w]
            i = next((i for i in range(1, k) if (row[:i] == row[i]).any()), None)  # a repeated label
            if i is None:
                break
            ls = row[i]
            # A partner slot (v, j) whose label is new to w, while ls is new to v: the swap removes a duplicate
            # from w and adds none to v, so the total number of duplicates falls and the loop terminates.
            has_ls = (lab == ls).any(axis=1)
            ok = ~np.isin(lab, row) & ~has_ls[:, None]
            ok[w] = False
            cand = np.flatnonzero(ok.reshape(-1))
            if cand.size == 0:
                break  # no such swap exists: leave the duplicate ("where possible")
            v, j = divmod(int(cand[rng.integers(cand.size)]), k)
            assign[w, i], assign[v, j] = assign[v, j], assign[w, i]
            lab[w, i], lab[v, j] = lab[v, j], lab[w, i]
    return [np.concatenate([shards[s] for s in assign[w]]) for w in range(n_workers)]


def heterogeneity(parts: list[Tensor], labels: Tensor) -> dict[str, float | int]:
    """Summary of how non-IID a partition is, for reports.

    With ``P`` the label distribution of all samples and ``Q_w`` that of worker ``w``'s samples, the total-variation
    distance ``TV_w = ½ Σ_c |Q_w(c) − P(c)|`` is 0 for a worker whose label mix matches the whole data set and
    approaches 1 for a worker holding only a rare class. Returned keys:

    ``n_workers``; ``mean_tv``, ``max_tv`` (over workers with at least one sample); ``mean_classes`` (average
    number of distinct labels per worker); ``min_size``, ``max_size``, ``size_cv`` (sample counts and their
    coefficient of variation, std/mean); ``coverage`` (fraction of samples assigned to some worker).
    """
    y = _labels_array(labels)
    num_classes = int(y.max()) + 1
    p = np.bincount(y, minlength=num_classes) / y.shape[0]
    tvs: list[float] = []
    n_classes: list[int] = []
    sizes: list[int] = []
    for part in parts:
        idx = part.detach().to("cpu").numpy() if isinstance(part, Tensor) else np.asarray(part)
        sizes.append(int(idx.shape[0]))
        if idx.shape[0] == 0:
            n_classes.append(0)
            continue
        q = np.bincount(y[idx], minlength=num_classes) / idx.shape[0]
        tvs.append(0.5 * float(np.abs(q - p).sum()))
        n_classes.append(int((q > 0).sum()))
    size_arr = np.asarray(sizes, dtype=np.float64)
    assigned = np.unique(np.concatenate([np.asarray(s) for s in parts])) if parts else np.zeros(0)
    return {
        "n_workers": len(parts),
        "mean_tv": float(np.mean(tvs)) if tvs else 0.0,
        "max_tv": float(np.max(tvs)) if tvs else 0.0,
        "mean_classes": float(np.mean(n_classes)) if n_classes else 0.0,
        "min_size": int(size_arr.min()) if sizes else 0,
        "max_size": int(size_arr.max()) if sizes else 0,
        "size_cv": float(size_arr.std() / size_arr.mean()) if sizes and size_arr.mean() > 0 else 0.0,
        "coverage": float(assigned.shape[0] / y.shape[0]),
    }
