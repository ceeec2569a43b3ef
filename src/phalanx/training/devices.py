"""Where a run computes: the ``device`` a config or an :class:`~phalanx.training.Experiment` names, resolved once.

``device`` is ``"cpu"`` (the default), ``"cuda"`` (this process's CUDA device; a torchrun rank's is
``cuda:LOCAL_RANK``), ``"cuda:N"`` or ``"auto"`` (``"cuda"`` when ``torch.cuda.is_available()``, else ``"cpu"``).
On a CUDA device the model's parameters θ, the data set's tensors (moved once, when the experiment is built), every
round's batches, the workers' momentum rows, the aggregation and the attacks' vectors live there.

Random streams stay on the CPU (:mod:`phalanx.training.streams`): batch positions, attack noise, client samples and a
stochastic rule's draws are drawn from CPU generators and then moved to the device, so a run on CUDA makes the same
random draws as on the CPU — its results differ only by floating-point rounding (CUDA kernels sum in other orders).
Checkpoints hold CPU tensors and resume on either device.
"""

from __future__ import annotations

import re

import torch

from phalanx.errors import ConfigError

ALLOWED = "'auto', 'cpu', 'cuda' or 'cuda:N'"
_SPEC = re.compile(r"(auto|cpu|cuda(:[0-9]{1,4})?)")
CPU = torch.device("cpu")


def check(value: object) -> str:
    """``value`` if it is a device spec (:data:`ALLOWED`); else a :class:`ConfigError` naming ``device``. Says
    nothing about this machine (a config is checked on a login node, then runs on a GPU node)."""
    if not isinstance(value, str) or _SPEC.fullmatch(value) is None:
        raise ConfigError("device", value, ALLOWED)
    return value


def cuda_available() -> bool:
    """Whether this process can use CUDA (``torch.cuda.is_available()``)."""
    return bool(torch.cuda.is_available())


def resolve(requested: str | torch.device, *, local_rank: int | None = None) -> torch.device:
    """The device ``requested`` names on this machine, with its index (``cuda:0``, not ``cuda``).

    ``"auto"``: CUDA when available, else the CPU. ``"cuda"``: ``cuda:local_rank`` when given (a torchrun rank),
    else the current CUDA device. A CUDA device on a machine without CUDA, or an index the machine does not have,
    is a :class:`ConfigError` naming ``device``.
    """
    if isinstance(requested, torch.device):
        spec = str(requested)
        if requested.type not in ("cpu", "cuda"):
            raise ConfigError("device", spec, ALLOWED)
    else:
        spec = check(requested)
    if spec == "cpu":
        return CPU
    if spec == "auto":
        if not cuda_available():
            return CPU
        spec = "cuda"
    if not cuda_available():
        raise ConfigError("device", spec, "'cpu' or 'auto' on a machine without CUDA (torch.cuda.is_available() "
                          "is false)", "run it on a GPU node, or set device = 'auto'")
    count = torch.cuda.device_count()
    if spec == "cuda":
        index = torch.cuda.current_device() if local_rank is None else local_rank
    else:
        index = int(spec.split(":", 1)[1])
    if not 0 <= index < count:
        what = f"LOCAL_RANK {index}: " if spec == "cuda" and local_rank is not None else ""
        raise ConfigError("device", spec, f"a CUDA device of this machine ({what}it has cuda:0 … cuda:{count - 1})",
                          "one process per GPU: no more workers per node than GPUs" if what else None)
    return torch.device("cuda", index)


def describe(device: str | torch.device) -> dict[str, str]:
    """What a run's manifest records about its device: ``{"device": "cpu"}``, or ``{"device": "cuda:0",
    "gpu": "<the GPU's name>"}``."""
    dev = torch.device(device)
    out = {"device": str(dev)}
    if dev.type == "cuda":
        out["gpu"] = torch.cuda.get_device_name(dev)
    return out


def label(device: str | torch.device) -> str:
    """One line for a header: ``cpu`` or ``cuda:0 (NVIDIA H200)``."""
    info = describe(device)
    return info["device"] + (f" ({info['gpu']})" if "gpu" in info else "")
