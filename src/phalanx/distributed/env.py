"""The torchrun environment of one rank, the c10d ``TCPStore`` and the backend choice.

A rank reads what ``torchrun`` (or ``phalanx launch``, which sets the same variables) puts in its environment:
``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``. Under torchrun the store at
``MASTER_ADDR:MASTER_PORT`` is hosted by the elastic agent (``TORCHELASTIC_USE_AGENT_STORE=True``) and every rank
is a client; under ``phalanx launch`` rank 0 hosts it. Either way it lives outside the workers that may crash.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from phalanx.errors import ConfigError

PREFIX = "phalanx"


@dataclass(frozen=True)
class RankEnv:
    """Where this process sits in the job."""

    rank: int
    world_size: int
    local_rank: int
    master_addr: str
    master_port: int
    agent_store: bool
    """True when torchrun's agent hosts the store (the ranks are all clients)."""
    run_id: str
    """Distinguishes the jobs (and torchrun restarts) that share a store: the key prefix."""
    local_world_size: int = 0
    """How many ranks run on this machine (``LOCAL_WORLD_SIZE``; 0 when not set)."""

    @property
    def several_machines(self) -> bool:
        """Whether the job's ranks run on more than one machine (torchrun's ``LOCAL_WORLD_SIZE`` < ``WORLD_SIZE``)."""
        return 0 < self.local_world_size < self.world_size

    @classmethod
    def from_environ(cls) -> RankEnv:
        """Read the torchrun variables (a clear error naming the one that is missing or malformed)."""
        env = os.environ

        def integer(name: str, default: str | None = None) -> int:
            raw = env.get(name, default)
            if raw is None:
                raise ConfigError(
                    name, None, "an integer set by torchrun or `phalanx launch`",
                    "start workers with `phalanx launch` or `torchrun … -m phalanx.distributed.worker`",
                )
            try:
                return int(raw)
            except ValueError:
                raise ConfigError(name, raw, "an integer") from None

        rank, world = integer("RANK"), integer("WORLD_SIZE")
        if not 0 <= rank < world:
            raise ConfigError("RANK", rank, f"0 … WORLD_SIZE−1 = {world - 1}")
        restart = env.get("TORCHELASTIC_RESTART_COUNT", "0")
        return cls(
            rank=rank, world_size=world, local_rank=integer("LOCAL_RANK", "0"),
            master_addr=env.get("MASTER_ADDR", "127.0.0.1"), master_port=integer("MASTER_PORT"),
            agent_store=env.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true",
            run_id=f"{env.get('TORCHELASTIC_RUN_ID', 'local')}.{restart}",
            local_world_size=integer("LOCAL_WORLD_SIZE", "0"),
        )


def open_store(renv: RankEnv, timeout_s: float) -> dist.Store:
    """The job's TCPStore (hosted here on rank 0 unless torchrun's agent hosts it), under a per-job key prefix.

    ``timeout_s`` bounds every blocking ``get``/``wait`` that is not given its own timeout.
    """
    host = renv.rank == 0 and not renv.agent_store
    listener = listen(renv.master_addr, renv.master_port) if host else None
    store = dist.TCPStore(
        renv.master_addr, renv.master_port, None, host, timeout=timedelta(seconds=timeout_s),
        wait_for_workers=False, use_libuv=True, master_listen_fd=None if listener is None else listener.fileno(),
    )
    if listener is not None:
        _LISTENERS.append(listener)  # the store serves on this socket: keep it open as long as the process lives
    return dist.PrefixStore(f"{PREFIX}/{renv.run_id}/", store)


_LISTENERS: list[socket.socket] = []


def listen(host: str, port: int) -> socket.socket:
    """A TCP socket listening on ``host:port`` only — not on every interface, which is what the c10d store does when
    it binds by itself (a store for ``MASTER_ADDR=127.0.0.1`` would otherwise be reachable from the network)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        return socket.create_server((host, port), family=family, backlog=4096)
    except OSError as exc:
        raise ConfigError("MASTER_ADDR:MASTER_PORT", f"{host}:{port}", "an address of this machine and a free port",
                          exc.strerror or type(exc).__name__) from None


def resolve_backend(requested: str) -> str:
    """``auto`` → ``nccl`` when CUDA is available, else ``gloo``; ``nccl`` without CUDA is a clear error."""
    if requested == "auto":
        return "nccl" if torch.cuda.is_available() else "gloo"
    if requested == "nccl" and not torch.cuda.is_available():
        raise ConfigError("backend", "nccl", "'gloo' or 'auto' on a machine without CUDA")
    return requested


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free now (bind to port 0 and read it back)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
