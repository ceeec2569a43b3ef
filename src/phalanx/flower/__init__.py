"""Phalanx inside Flower: a drop-in for Flower's ``FedAvg`` that aggregates the clients' updates with any Phalanx
rule or chain (``"cwtm"``, ``"nnm>cwtm"``, ``"krum"``…) and logs each client's contribution.

>>> from phalanx.flower import PhalanxFedAvg                         # doctest: +SKIP
>>> strategy = PhalanxFedAvg(fraction_train=1.0, aggregator="nnm>cwtm", f=2)   # doctest: +SKIP
>>> result = strategy.start(grid=grid, initial_arrays=arrays, num_rounds=10)  # doctest: +SKIP

Needs the optional extra ``phalanx[flower]`` (Flower ≥ 1.42, its Message API ``flwr.serverapp.strategy``). Without
it, importing this package raises :class:`FlowerNotInstalledError`, one line saying what to install. See
docs/flower.md.
"""

from __future__ import annotations

from phalanx.errors import PhalanxError

INSTALL_HINT = "pip install 'phalanx[flower]'"
"""What to run when Flower is missing or too old."""


class FlowerNotInstalledError(PhalanxError, ImportError):
    """``phalanx.flower`` was imported but Flower (``flwr>=1.42,<2``, with its Message API) is not importable."""


def _require_flower() -> None:
    """Import the parts of Flower this package uses; raise :class:`FlowerNotInstalledError` (one line) if absent."""
    try:
        import flwr.app
        import flwr.serverapp.strategy  # noqa: F401
    except ImportError as exc:
        raise FlowerNotInstalledError(
            f"phalanx.flower needs Flower >= 1.42 with its Message API (could not import {exc.name or 'flwr'}): "
            f"{INSTALL_HINT}"
        ) from None


_require_flower()

from phalanx.flower.contributions import Contribution  # noqa: E402
from phalanx.flower.strategy import PhalanxFedAvg  # noqa: E402

__all__ = ["INSTALL_HINT", "Contribution", "FlowerNotInstalledError", "PhalanxFedAvg"]
