"""The example's task: softmax regression on the 8×8 digits that ship with Phalanx, split evenly over the clients.

Plain numpy, so a client is cheap: the model is two arrays, ``W`` (64, 10) and ``b`` (10,), and a client's local
training is ``local-steps`` full-batch gradient steps of the cross-entropy on its own shard. The honest reference —
what federated averaging over the honest clients alone reaches — is computed here without Flower, so the runs can be
measured against it.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from phalanx import data

FEATURES, CLASSES = 64, 10


@lru_cache(maxsize=1)
def digits() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(train_x (1442, 64), train_y, test_x (355, 64), test_y), standardised, float32."""
    ds = data.load("digits")
    flat = (ds.train_x.reshape(len(ds.train_x), -1).numpy(), ds.test_x.reshape(len(ds.test_x), -1).numpy())
    return flat[0], ds.train_y.numpy(), flat[1], ds.test_y.numpy()


def shard(partition_id: int, num_partitions: int) -> tuple[np.ndarray, np.ndarray]:
    """Client ``partition_id``'s share of the training set (a fixed random permutation cut in equal parts)."""
    x, y, _, _ = digits()
    order = np.random.default_rng(0).permutation(len(y))
    part = np.array_split(order, num_partitions)[partition_id]
    return x[part], y[part]


def initial_model() -> list[np.ndarray]:
    """[W, b], zeros (the loss is convex: every honest run starts from the same point)."""
    return [np.zeros((FEATURES, CLASSES), np.float32), np.zeros(CLASSES, np.float32)]


def _probabilities(w: np.ndarray, b: np.ndarray, x: np.ndarray) -> np.ndarray:
    z = x @ w + b
    z -= z.max(axis=1, keepdims=True)
    p = np.exp(z)
    return p / p.sum(axis=1, keepdims=True)


def train(
    model: list[np.ndarray], x: np.ndarray, y: np.ndarray, lr: float, steps: int,
) -> tuple[list[np.ndarray], float]:
    """``steps`` full-batch gradient steps of the cross-entropy from ``model``; the new model and its loss."""
    w, b = (a.astype(np.float32, copy=True) for a in model)
    onehot = np.eye(CLASSES, dtype=np.float32)[y]
    for _ in range(steps):
        g = (_probabilities(w, b, x) - onehot) / len(y)
        w -= lr * (x.T @ g)
        b -= lr * g.sum(axis=0)
    p = _probabilities(w, b, x)
    loss = float(-np.log(np.clip(p[np.arange(len(y)), y], 1e-12, None)).mean())
    return [w, b], loss


def accuracy(model: list[np.ndarray], x: np.ndarray | None = None, y: np.ndarray | None = None) -> float:
    """Accuracy of ``model`` on (x, y), by default the test set; 0 for a model with NaN/Inf."""
    if x is None or y is None:
        _, _, x, y = digits()
    w, b = model
    if not (np.isfinite(w).all() and np.isfinite(b).all()):
        return 0.0
    return float(((x @ w + b).argmax(axis=1) == y).mean())


def honest_reference(rounds: int, clients: int, byzantine: int, lr: float, steps: int) -> list[np.ndarray]:
    """FedAvg with equal weights over the honest clients only (every round, all of them): w ← mean of their models."""
    model = initial_model()
    honest = range(clients - byzantine)
    for _ in range(rounds):
        models = [train(model, *shard(i, clients), lr, steps)[0] for i in honest]
        model = [np.mean([m[k] for m in models], axis=0).astype(np.float32) for k in range(len(model))]
    return model


def distance(a: list[np.ndarray], b: list[np.ndarray]) -> float:
    """‖a − b‖ over all arrays (inf for a model with NaN/Inf)."""
    with np.errstate(all="ignore"):
        d = float(np.sqrt(sum(float(((x.astype(np.float64) - y) ** 2).sum()) for x, y in zip(a, b))))
    return d if np.isfinite(d) else float("inf")
