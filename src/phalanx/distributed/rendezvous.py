"""Where the ranks of a keyed job listen, how they find rank 0, and what they accept from the store on the way.

A keyed job's ranks listen only where they must: rank 0 on ``MASTER_ADDR`` (``MASTER_PORT`` under ``phalanx
launch``), a mesh rank on :data:`ADDR_VAR` or, on one machine, ``MASTER_ADDR`` — never on a wildcard address
(:func:`check_bind_address`). Under torchrun's agent, which holds ``MASTER_PORT`` and whose c10d store listens on
every interface (the agent binds it; Phalanx cannot), rank 0 listens on :data:`PORT_VAR` when it is set — then no
rank reads the store at all — or on a free port that it publishes in the store (:data:`PORT_KEY`,
:data:`ADDRESS_KEY`). Whoever reaches the store may overwrite that value: it is read as untrusted input
(:func:`read_port`, :func:`read_address`), and a forged one is a one-line error — at worst the ranks meet a listener
that cannot prove rank 0's key, and refuse it.

A mesh rank tells rank 0 where it listens; rank 0 dials that address back, so it must be the address the rank's
connection came from (:func:`claimed_address`): a Byzantine rank cannot make rank 0 dial an arbitrary host.
"""

from __future__ import annotations

import ipaddress
import json
import os
from datetime import timedelta
from typing import Any

from phalanx.distributed.env import RankEnv, check_bind_address
from phalanx.distributed.errors import TransportError
from phalanx.errors import ConfigError

ADDR_VAR = "PHALANX_SEALED_ADDR"
"""The address this rank listens on for its peers (a keyed serverless or gossip job). Default: ``MASTER_ADDR`` when
every rank runs on one machine; required on several."""
PORT_VAR = "PHALANX_SEALED_PORT"
"""Under torchrun's agent: the port rank 0's TLS listener takes on ``MASTER_ADDR`` (the same on every machine); the
store is then not read at all."""
ADDRESS_KEY = "sealed/mesh"
"""Under torchrun's agent, rank 0 of a mesh publishes its listener's ``[host, port]`` (JSON) here."""
PORT_KEY = "sealed/port"
"""Under torchrun's agent, the parameter server publishes its TLS listener's port here."""
STORE_VALUE_BYTES = 300
"""A store value longer than this is not a port or an address (refused unread beyond it)."""


def bind_host(renv: RankEnv) -> str:
    """Where this rank listens for its peers: ``PHALANX_SEALED_ADDR``, else ``MASTER_ADDR`` when the job runs on one
    machine (``127.0.0.1`` under ``phalanx launch``); a job across machines must name each machine's address."""
    host = os.environ.get(ADDR_VAR, "").strip()
    if host:
        return check_bind_address(ADDR_VAR, host)
    if renv.several_machines:
        raise ConfigError(
            ADDR_VAR, None, "this machine's address on the job's network, on every machine of a keyed serverless or "
            "gossip job (each rank listens there for its peers' TLS connections)",
            f"export {ADDR_VAR}=<this machine's address> before torchrun (docs/security.md)",
        )
    return check_bind_address("MASTER_ADDR", renv.master_addr)


def claimed_address(listen: Any, addr: str) -> str | None:
    """Why rank 0 refuses the address a rank says it listens on (None: it takes it): a ``[host, port]`` pair whose
    host is the address the rank's connection came from (``addr``) and whose port is 1 … 65535."""
    if not (isinstance(listen, list) and len(listen) == 2 and isinstance(listen[0], str) and len(listen[0]) <= 64
            and isinstance(listen[1], int) and not isinstance(listen[1], bool) and 0 < listen[1] < 65536):
        return "it did not say where it listens"
    try:
        same = ipaddress.ip_address(listen[0]) == ipaddress.ip_address(addr)
    except ValueError:
        same = False
    if not same:
        return f"it says it listens on {listen[0][:64]!r}, not on {addr}, the address it connected from"
    return None


def port_override() -> int | None:
    """:data:`PORT_VAR`, checked (None: not set)."""
    raw = os.environ.get(PORT_VAR, "").strip()
    if not raw:
        return None
    try:
        port = int(raw)
    except ValueError:
        port = 0
    if not 0 < port < 65536:
        raise ConfigError(PORT_VAR, raw, "a TCP port, 1 … 65535")
    return port


def _get(store: Any, key: str, timeout_s: float) -> str:
    """The store's value of ``key`` as text, waiting at most ``timeout_s``; one line if it never comes."""
    default = store.timeout
    store.set_timeout(timedelta(seconds=timeout_s))
    try:
        raw = bytes(store.get(key))
    except Exception as exc:  # the c10d store's timeouts and connection errors, whatever their class
        raise TransportError(f"no {key!r} in torchrun's store within {timeout_s:g} s ({str(exc)[:120]}); is rank 0 "
                             "running?") from None
    finally:
        store.set_timeout(default)
    if len(raw) > STORE_VALUE_BYTES:
        raise TransportError(f"the store's {key!r} holds {len(raw)} bytes: not what rank 0 writes there (forged?)")
    return raw.decode(errors="replace")


def read_port(store: Any, timeout_s: float) -> int:
    """The parameter server's port from torchrun's store (:data:`PORT_KEY`), as untrusted input."""
    text = _get(store, PORT_KEY, timeout_s)
    if not (text.isascii() and text.isdigit() and 0 < int(text) < 65536):
        raise TransportError(f"the store's {PORT_KEY!r} is {text[:40]!r}, not a TCP port (forged?); set {PORT_VAR} "
                             "on every machine to leave the store out")
    return int(text)


def read_address(store: Any, timeout_s: float) -> tuple[str, int]:
    """Rank 0's mesh listener from torchrun's store (:data:`ADDRESS_KEY`), as untrusted input."""
    text = _get(store, ADDRESS_KEY, timeout_s)
    try:
        raw = json.loads(text)
        host, port = raw
        ipaddress.ip_address(host)
        if not (isinstance(port, int) and not isinstance(port, bool) and 0 < port < 65536):
            raise ValueError("not a port")
    except (ValueError, TypeError):
        raise TransportError(f"the store's {ADDRESS_KEY!r} is {text[:60]!r}, not [address, port] (forged?); set "
                             f"{PORT_VAR} on every machine to leave the store out") from None
    return str(host), int(port)
