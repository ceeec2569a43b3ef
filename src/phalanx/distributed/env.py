"""The torchrun environment of one rank, the c10d ``TCPStore`` and the backend choice.

A rank reads what ``torchrun`` (or ``phalanx launch``, which sets the same variables) puts in its environment:
``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``. Under torchrun the store at
``MASTER_ADDR:MASTER_PORT`` is hosted by the elastic agent (``TORCHELASTIC_USE_AGENT_STORE=True``) and every rank
is a client; under ``phalanx launch`` rank 0 hosts it. Either way it lives outside the workers that may crash.
"""

from __future__ import annotations

import ipaddress
import os
import random
import socket
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

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
    nodes: int = 0
    """How many machines torchrun was told the job has (``GROUP_WORLD_SIZE``, its ``--nnodes``; 0 when not set)."""
    master_here: bool = True
    """Whether ``MASTER_ADDR`` — where rank 0 (or torchrun's agent of node 0) is — is an address of this machine."""

    @property
    def several_machines(self) -> bool:
        """Whether the job's ranks may run on more than one machine. Any one sign says so — torchrun's
        ``LOCAL_WORLD_SIZE`` < ``WORLD_SIZE``, its ``GROUP_WORLD_SIZE`` > 1, or ``MASTER_ADDR`` not an address of
        this machine — so no single variable, left unset, hides it; ranks without keys also compare the machines
        they actually run on (:func:`check_one_machine`)."""
        return 0 < self.local_world_size < self.world_size or self.nodes > 1 or not self.master_here

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
        master = env.get("MASTER_ADDR", "127.0.0.1")
        port = integer("MASTER_PORT")
        if not 0 < port < 65536:
            raise ConfigError("MASTER_PORT", port, "a TCP port, 1 … 65535")
        return cls(
            rank=rank, world_size=world, local_rank=integer("LOCAL_RANK", "0"),
            master_addr=master, master_port=port,
            agent_store=env.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true",
            run_id=f"{env.get('TORCHELASTIC_RUN_ID', 'local')}.{restart}",
            local_world_size=integer("LOCAL_WORLD_SIZE", "0"), nodes=integer("GROUP_WORLD_SIZE", "0"),
            master_here=address_here(master),
        )


def address_here(host: str) -> bool:
    """Whether ``host`` names an address of this machine: a loopback address, or one a socket can bind (the kernel
    refuses to bind an address no interface of this machine has)."""
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_DGRAM)
    except (socket.gaierror, UnicodeError):
        return False
    for family, _, _, _, sockaddr in infos:
        address = str(sockaddr[0])
        try:
            if ipaddress.ip_address(address.split("%", 1)[0]).is_loopback:
                return True
        except ValueError:
            continue
        try:
            with socket.socket(family, socket.SOCK_DGRAM) as probe:
                probe.bind((address, 0, *sockaddr[2:]))  # (an IPv6 address keeps its flow and scope)
            return True
        except OSError:
            continue
    return False


def machine_id() -> str:
    """What tells this machine (and network namespace) from another: the kernel's boot id, the network namespace and
    the host name (each may be unreadable; together they tell two hosts apart)."""
    parts = []
    for path in ("/proc/sys/kernel/random/boot_id", "/etc/machine-id"):
        try:
            parts.append(Path(path).read_text()[:64].strip())
        except OSError:
            parts.append("")
    try:
        parts.append(str(os.stat("/proc/self/ns/net").st_ino))
    except OSError:
        parts.append("")
    parts.append(socket.gethostname()[:64])
    return "|".join(parts)


def check_one_machine(store: dist.Store, renv: RankEnv, timeout_s: float) -> None:
    """Ranks without keys: every rank writes :func:`machine_id` into the store and compares it with rank 0's; a rank
    on another machine than rank 0 refuses to run (one line) — the store's addresses, not a variable, decide."""
    mine = machine_id()
    store.set(f"machine/{renv.rank}", mine)
    if renv.rank == 0:
        return
    default = store.timeout  # type: ignore[attr-defined]  # (missing from the c10d stubs)
    store.set_timeout(timedelta(seconds=timeout_s))
    try:
        theirs = bytes(store.get("machine/0")).decode(errors="replace")
    except (dist.DistError, RuntimeError):
        return  # (rank 0 is not there: the topology reports it)
    finally:
        store.set_timeout(default)
    if theirs != mine:
        raise ConfigError(
            "keys", None, "a key directory (phalanx keys init DIR --workers N) when the ranks run on several machines",
            f"rank {renv.rank} runs on another machine than rank 0 (as the store shows); without keys anyone who "
            "reaches the store can speak for any rank; --set insecure=true to run anyway",
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


def wildcard(address: str) -> bool:
    """Whether ``address`` (an IP address as the resolver gives it) is a wildcard: ``0.0.0.0``, ``::`` or
    ``::ffff:0.0.0.0``."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return False
    mapped = ip.ipv4_mapped if isinstance(ip, ipaddress.IPv6Address) else None
    return ip.is_unspecified or (mapped is not None and mapped.is_unspecified)


def check_bind_address(name: str, host: str) -> str:
    """``host`` if a listener may bind it: a host name or an address of one interface — not a wildcard (``0.0.0.0``,
    ``::``), which would listen on every network of the machine, in any spelling the resolver reads as one (``0``,
    ``0.0``, ``0x0``, ``000.000.000.000``, a name that resolves to it): the host is resolved and refused if any of its
    addresses is a wildcard (:func:`~phalanx.distributed.admission.listen_on` checks the bound address again)."""
    if not host or len(host) > 253 or any(c.isspace() for c in host):
        raise ConfigError(name, host, "an address or host name of this machine")
    try:
        found = [str(info[4][0]) for info in socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)]
    except (OSError, UnicodeError):  # (a name that does not resolve: the bind says so)
        found = []
    if wildcard(host) or any(wildcard(a) for a in found):
        raise ConfigError(name, host, "one address of this machine, not a wildcard",
                          "a wildcard listens on every network of the machine")
    return host


def listen(host: str, port: int) -> socket.socket:
    """A TCP socket listening on ``host:port`` only — not on every interface, which is what the c10d store does when
    it binds by itself (a store for ``MASTER_ADDR=127.0.0.1`` would otherwise be reachable from the network)."""
    check_bind_address("MASTER_ADDR", host)  # '0', '0x0', … : the keyless store would speak for any rank to anyone
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        server = socket.create_server((host, port), family=family, backlog=4096)
    except OSError as exc:
        raise ConfigError("MASTER_ADDR:MASTER_PORT", f"{host}:{port}", "an address of this machine and a free port",
                          exc.strerror or type(exc).__name__) from None
    if wildcard(str(server.getsockname()[0])):  # a spelling of the wildcard the check before did not read
        server.close()
        raise ConfigError("MASTER_ADDR", host, "one address of this machine, not a wildcard",
                          "a wildcard listens on every network of the machine")
    return server


def resolve_backend(requested: str) -> str:
    """``auto`` → ``nccl`` when CUDA is available, else ``gloo``; ``nccl`` without CUDA is a clear error."""
    if requested == "auto":
        return "nccl" if torch.cuda.is_available() else "gloo"
    if requested == "nccl" and not torch.cuda.is_available():
        raise ConfigError("backend", "nccl", "'gloo' or 'auto' on a machine without CUDA")
    return requested


EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
"""Where Linux says which ports its outgoing connections take their local port from."""
LOWEST_LISTEN_PORT = 10_000
"""The lowest port :func:`free_port` picks below the ephemeral range (above the registered services of the low
thousands)."""


def ephemeral_range() -> tuple[int, int] | None:
    """The ports outgoing connections take their local port from (``ip_local_port_range``), None where unknown."""
    try:
        low, high = (int(v) for v in EPHEMERAL_RANGE.read_text().split()[:2])
    except (OSError, ValueError):
        return None
    return (low, high) if 0 < low <= high < 65536 else None


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free now, **below the ephemeral range** where the OS says what it is.

    Port 0 would give a port *in* that range, from which every outgoing connection on the machine takes its local
    port: one of them may hold it by the time the listener binds ("Address already in use"). Seen once in a loaded
    suite: rank 0 of an availability test, whose outsiders open and reopen hundreds of connections from before rank 0
    listens, could not bind the port it was given. Below the range no outgoing connection takes a port; a random one
    there is checked by binding it (up to 64 tries, then port 0)."""
    span = ephemeral_range()
    if span is not None and span[0] - 1 > LOWEST_LISTEN_PORT:
        pick = random.SystemRandom()
        for _ in range(64):
            port = pick.randint(LOWEST_LISTEN_PORT, span[0] - 1)
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                try:
                    s.bind((host, port))
                except OSError:
                    continue
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
