"""Event-driven admission of a keyed rank's incoming connections: one thread, no slot a stranger can hold.

Every listener of a keyed job (the parameter server's, every mesh rank's) admits connections here before they count
as a rank. A connection is *pending* from the moment it is accepted until it has (1) finished the TLS 1.3 handshake,
whose client certificate OpenSSL checks against the allow-list, and (2) sent its introduction (``HELLO``, at most
:data:`HELLO_BYTES`); only then is it handed, with the rank its *verified certificate* speaks for, to the owner's
``admit`` — which decides what it may do (:mod:`phalanx.distributed.sealed`, :mod:`phalanx.distributed.mesh`).

All pending connections are driven by one thread with ``selectors`` (non-blocking sockets, ``do_handshake`` and
``recv`` resumed on readiness), so a connection that sends nothing, or one byte a second, costs a file descriptor and
a few kilobytes, never a thread, and nobody waits for it. What bounds a stranger:

* **a deadline** — a connection not introduced :data:`ADMIT_DEADLINE_S` after it was accepted is closed;
* **a cap per source** — at most :data:`PER_SOURCE` pending connections per source (an IPv4 address, an IPv6 /64);
  a source at its cap that connects again loses its *own* oldest pending connection — one that never sent a byte
  first, then the oldest of the others — so a source can only ever evict itself;
* **a cap in all** — at most :data:`TOTAL` pending connections, and no more than the descriptors left free allow
  (:func:`total_cap`: the soft limit on open files, raised toward the hard limit as far as needed, less what the
  process holds, its ranks' links to come and :data:`FD_RESERVE` for files — so an outsider cannot take the
  descriptors a checkpoint or the transcript needs; when ``accept`` fails for want of descriptors all the same, one
  is shed the same way); at the cap, the source holding the most pending connections loses its oldest.

So an outsider holding any number of idle or slow connections never keeps a newcomer out: a newcomer is shed only if
its *own source* opens :data:`PER_SOURCE` newer connections (or the busiest source — never one with fewer pending than
it — is its own) before its handshake ends; an honest rank's handshake takes one round trip and two signatures. A
rank whose connection was shed retries until its join deadline (:func:`retry_delays`). The CPU a connection costs is
bounded too: the handshake's bytes (what OpenSSL reads of it), one ECDHE and one signature, and :data:`HELLO_BYTES`
of introduction — garbage ends the handshake at its first record.

Why this and not more threads: the former accept loop gave each pending handshake a thread from a pool of 64, so 64
idle connections held every slot and the ranks were turned away (issue 33). Why not gRPC: docs/dependencies.md.
"""

from __future__ import annotations

import errno
import ipaddress
import os
import resource
import selectors
import socket
import ssl
import struct
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TypeVar

from phalanx.distributed.keys import AllowList
from phalanx.errors import ConfigError, PhalanxError

T = TypeVar("T")

ADMIT_DEADLINE_S = 10.0
"""A connection must finish its TLS handshake and its introduction within this long after it was accepted."""
PER_SOURCE = 128
"""Pending (not yet introduced) connections one source may hold; beyond, its own oldest is shed."""
TOTAL = 1024
"""Pending connections of all sources together; beyond, the busiest source's oldest is shed."""
HELLO_BYTES = 4096
"""The most an introduction (``HELLO``'s JSON) may hold."""
ADMITTING_PER_RANK = 2
"""Introduced connections of one rank being admitted at once (the parameter server's two links)."""
ACCEPTS_PER_WAKE = 64
"""Connections accepted per readiness of the listener before the pending ones get their turn."""
PAUSE_S = (0.1, 1.0)
"""Out of file descriptors with no pending connection to shed: the listener is left unwatched for the first, doubling
up to the second, so the loop does not spin on a listener that stays readable (a review: a full core)."""
FD_RESERVE = 64
"""File descriptors left to the process's files (checkpoints, the transcript, metrics) beyond those it holds and its
links will hold, when :data:`TOTAL` is sized to the file limit."""


def source_of(addr: str) -> str:
    """The source a connection is counted under: its IPv4 address (also when IPv4-mapped), or its IPv6 /64."""
    try:
        ip = ipaddress.ip_address(addr.split("%", 1)[0])
    except ValueError:
        return addr
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((int(ip) >> 64 << 64, 64)))
    return str(ip)


def listen_on(host: str, port: int) -> socket.socket:
    """A TCP listener on ``host:port`` only (port 0: a free one); a one-line error if this machine cannot."""
    from phalanx.distributed.env import wildcard

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        listener = socket.create_server((host, port), family=family, backlog=1024)
    except OSError as exc:
        raise ConfigError("listen address", f"{host}:{port}", "an address of this machine and a free port",
                          exc.strerror or type(exc).__name__) from None
    if wildcard(str(listener.getsockname()[0])):  # (a spelling of the wildcard the checks before did not read)
        listener.close()
        raise ConfigError("listen address", f"{host}:{port}", "one address of this machine, not a wildcard",
                          "a wildcard listens on every network of the machine")
    return listener


def open_fds() -> int:
    """How many file descriptors this process holds now (``/proc/self/fd``, else ``/dev/fd``; 0 if neither lists)."""
    for folder in ("/proc/self/fd", "/dev/fd"):
        try:
            return len(os.listdir(folder))
        except OSError:
            continue
    return 0


def total_cap(limit: int = TOTAL, links: int = 0) -> int:
    """The cap of pending connections: ``min(limit, soft − held − links − FD_RESERVE)`` (at least 8), where ``soft``
    is the process's soft limit on open files, ``held`` the descriptors it holds now (:func:`open_fds`) and ``links``
    those its ranks' connections will hold (2(n − 1) on a parameter server or a mesh rank of n). The soft limit is
    first raised toward the hard limit as far as ``limit`` pending connections need (never lowered). Before, the cap
    was ``soft − 64`` whatever the process held, so outsiders holding idle connections at a rank 0 of ~26 ranks
    under the common soft limit of 1,024 left it no descriptor for a checkpoint (attack38's r4)."""
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (OSError, ValueError):
        return limit
    taken = open_fds() + links + FD_RESERVE
    if soft != resource.RLIM_INFINITY and soft < taken + limit:
        target = taken + limit if hard == resource.RLIM_INFINITY else min(taken + limit, hard)
        if target > soft:
            try:
                resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
                soft = target
            except (OSError, ValueError):  # (not allowed here: the cap is sized to the limit as it is)
                pass
    if soft == resource.RLIM_INFINITY:
        return limit
    return max(8, min(limit, int(soft) - taken))


def retry_delays(first: float = 0.05, most: float = 1.0) -> Iterator[float]:
    """How long a connecting rank waits before its next try (doubling from ``first`` up to ``most``)."""
    delay = first
    while True:
        yield delay
        delay = min(most, 2 * delay)


def at_once(targets: dict[int, T], connect: Callable[[int, T], object], who: str) -> dict[int, str]:
    """``connect(peer, target)`` for every peer of ``targets``, each in a thread of its own (one that stalls delays
    only itself); the peers it raised for, and why (in order of the peers)."""
    failed: dict[int, str] = {}

    def one(peer: int, target: T) -> None:
        try:
            connect(peer, target)
        except PhalanxError as exc:
            failed[peer] = str(exc)
        except Exception as exc:  # whatever a hostile peer's bytes make the TLS stack raise
            failed[peer] = f"{who}: the connection to rank {peer} failed ({type(exc).__name__}: {str(exc)[:120]})"

    threads = [threading.Thread(target=one, args=item, daemon=True, name=f"phalanx-dial-{item[0]}")
               for item in sorted(targets.items())]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return dict(sorted(failed.items()))


class Shed(Exception):
    """The other end closed or reset the connection before it answered the introduction (it shed it, or it is not
    listening yet): worth another try."""


def _refused_key(exc: ssl.SSLError) -> bool:
    """Whether a TLS failure is the other end refusing this end's certificate (no use trying again)."""
    reason = str(getattr(exc, "reason", "") or "")
    return "CERTIFICATE" in reason or "UNKNOWN_CA" in reason or "ACCESS_DENIED" in reason


def dial(host: str, port: int, ctx: ssl.SSLContext, deadline: float, introduce: Callable[[ssl.SSLSocket], T], *,
         who: str, timeout: float, source: str | None = None, gone_if_refused: bool = False) -> T:
    """Connect to ``host:port``, finish the TLS handshake and ``introduce(tls)`` (send the introduction, read the
    answer; it raises :class:`Shed`, ``OSError`` or ``ssl.SSLError`` when the connection ended first), trying again
    after :func:`retry_delays` until ``deadline`` (monotonic) while the other end refuses the TCP connection, sheds it
    or resets it — what a listener under attack, or not yet listening, does. A listener whose certificate is not on
    the allow-list, or that refuses this end's, is :class:`~phalanx.errors.PhalanxError` at once (``who``: this
    rank, for the message); so is running out of time. ``source``: the local address to connect from.

    ``gone_if_refused``: the address is known to have listened (a rank's address from the book, which rank 0
    reached), so a refused TCP connection means its listener closed — the rank left — and is final at once. A
    listener under a flood drops or sheds connections; it does not refuse them (Linux answers a full backlog by
    dropping the SYN). Retrying until ``deadline`` held a node out of round 0 for the whole join timeout when a
    rank it sends to had died, and its own neighbours, waiting as long for its first message, could miss it."""
    where = f"{host}:{port}"
    last = "nothing answered"
    for delay in retry_delays():
        try:
            raw = socket.create_connection((host, port), timeout=max(0.5, min(timeout, deadline - time.monotonic())),
                                           source_address=None if source is None else (source, 0))
        except OSError as exc:
            last = f"the connection failed ({exc.strerror or type(exc).__name__})"
            if gone_if_refused and isinstance(exc, ConnectionRefusedError):
                raise PhalanxError(f"{who}: nothing listens at {where} any more (the connection was refused: the "
                                   "rank left)") from None
        else:
            try:
                tls = ctx.wrap_socket(raw)
            except ssl.SSLCertVerificationError as exc:
                raw.close()
                raise PhalanxError(f"{who}: the peer at {where} did not prove a key of the allow-list "
                                   f"({exc.verify_message or exc.reason})") from None
            except (ssl.SSLError, OSError) as exc:
                raw.close()
                last = f"the TLS handshake ended ({type(exc).__name__})"
            else:
                try:
                    return introduce(tls)
                except PhalanxError:
                    tls.close()
                    raise
                except ssl.SSLError as exc:
                    tls.close()
                    if _refused_key(exc):
                        raise PhalanxError(f"{who}: the peer at {where} refused this rank's certificate "
                                           f"({exc.reason})") from None
                    last = f"the connection ended before the answer ({exc.reason or type(exc).__name__})"
                except (Shed, OSError) as exc:
                    tls.close()
                    last = f"the connection ended before the answer ({str(exc)[:80] or type(exc).__name__})"
        if time.monotonic() + delay > deadline:
            raise PhalanxError(f"{who}: could not reach {where} in time ({last})")
        time.sleep(delay)
    raise AssertionError("unreachable")  # (retry_delays never ends)


@dataclass(eq=False)
class _Pending:
    tls: ssl.SSLSocket
    fd: int
    addr: str
    source: str
    deadline: float
    heard: bool = False
    """Some bytes (or the end) came from it: it is not idle."""
    rank: int | None = None
    """Its certificate's rank, once the handshake is done."""
    buf: bytearray = field(default_factory=bytearray)
    want: int = 0
    """Bytes of the introduction still to read (0: its header)."""


class Admission:
    """Admits the connections of ``listener`` (see the module's docstring) in a thread of its own until
    :meth:`close`.

    ``header``: the protocol's frame header (its first field the magic, its second the kind, its last the length);
    ``hello_kind``: the introduction's kind; ``admit(tls, addr, rank, hello)``: called in a thread of its own for an
    introduced connection (blocking socket; at most :data:`ADMITTING_PER_RANK` at once per rank); ``reject(rank,
    reason)``: a connection that was closed before it was introduced, or refused (``rank`` None: no verified key);
    ``links``: the descriptors the owner's links to its ranks will hold (:func:`total_cap`).
    """

    def __init__(self, listener: socket.socket, ctx: ssl.SSLContext, allow: AllowList, *, header: struct.Struct,
                 magic: bytes, hello_kind: int, admit: Callable[[ssl.SSLSocket, str, int, bytes], None],
                 reject: Callable[[int | None, str], None], name: str, deadline_s: float = ADMIT_DEADLINE_S,
                 per_source: int = PER_SOURCE, total: int | None = None, links: int = 0) -> None:
        self.listener = listener
        self.ctx = ctx
        self.allow = allow
        self.header, self.magic, self.hello_kind = header, magic, hello_kind
        self.admit, self.reject = admit, reject
        self.name = name
        self.deadline_s = deadline_s
        self.per_source = per_source
        self.total = total_cap(links=links) if total is None else total
        self.pending: dict[int, _Pending] = {}  # by file descriptor, in order of arrival (= of deadline)
        self.idle: dict[str, dict[int, _Pending]] = {}  # per source, in order of arrival: never heard from
        self.busy: dict[str, dict[int, _Pending]] = {}  # per source, in order of arrival: the others
        self.admitting: dict[int, int] = {}
        self.lock = threading.Lock()
        self.closed = False
        self.shed = 0
        """Connections closed to make room (for the tests and the record)."""
        self.paused_until: float | None = None
        """While out of file descriptors with nothing to shed: when the listener is watched again."""
        self.pause_s = PAUSE_S[0]
        self.selector = selectors.DefaultSelector()
        self.wake_r, self.wake_w = socket.socketpair()
        self.wake_r.setblocking(False)
        listener.setblocking(False)
        self.selector.register(listener, selectors.EVENT_READ, None)
        self.selector.register(self.wake_r, selectors.EVENT_READ, self.wake_r)
        self.thread = threading.Thread(target=self._run, daemon=True, name=name)
        self.thread.start()

    # -- the loop ------------------------------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while not self.closed:
                oldest = next(iter(self.pending.values()), None)
                timeout = None if oldest is None else max(0.0, oldest.deadline - time.monotonic())
                if self.paused_until is not None:
                    wait = max(0.0, self.paused_until - time.monotonic())
                    timeout = wait if timeout is None else min(timeout, wait)
                for key, _ in self.selector.select(timeout):
                    if key.data is None:
                        try:
                            self._accept()
                        except Exception:  # (a bug must not end the admission of every later connection)
                            continue
                    elif key.data is self.wake_r:
                        self._drain_wake()
                    else:
                        self._advance(key.data)
                self._expire()
                if self.paused_until is not None and time.monotonic() >= self.paused_until:
                    self.paused_until = None
                    self.selector.register(self.listener, selectors.EVENT_READ, None)
        finally:
            for p in list(self.pending.values()):
                self._drop(p, None)
            self.selector.close()
            for s in (self.wake_r, self.wake_w):
                s.close()

    def _drain_wake(self) -> None:
        try:
            while self.wake_r.recv(4096):
                pass
        except OSError:
            pass

    def close(self) -> None:
        """Stop admitting; every pending connection is closed (the listener is its owner's to close)."""
        self.closed = True
        try:
            self.wake_w.send(b"x")
        except OSError:
            pass
        if threading.current_thread() is not self.thread:
            self.thread.join(timeout=5.0)

    def _accept(self) -> None:
        for _ in range(ACCEPTS_PER_WAKE):
            try:
                conn, address = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM) and \
                        not self._shed_busiest("this process has no file descriptor left"):  # room for the next
                    self._pause()
                return  # (the listener was closed, or another error: the loop goes on; close() ends it)
            self.pause_s = PAUSE_S[0]
            addr = str(address[0])
            source = source_of(addr)
            if not self._room_for(source):
                conn.close()
                self.reject(None, f"a connection from {addr} refused: no room")
                continue
            conn.setblocking(False)
            try:
                tls = self.ctx.wrap_socket(conn, server_side=True, do_handshake_on_connect=False)
            except (ssl.SSLError, OSError):
                conn.close()
                continue
            p = _Pending(tls, tls.fileno(), addr, source, time.monotonic() + self.deadline_s)
            self.pending[p.fd] = p
            self.idle.setdefault(source, {})[p.fd] = p
            self.selector.register(tls, selectors.EVENT_READ, p)

    def _expire(self) -> None:
        now = time.monotonic()
        while self.pending:
            p = next(iter(self.pending.values()))
            if p.deadline > now:
                return
            self._drop(p, f"a connection from {p.addr} not introduced within {self.deadline_s:g} s; closed")

    # -- shedding ------------------------------------------------------------------------------------------------

    def _room_for(self, source: str) -> bool:
        """Make room for a new connection of ``source``: at its cap, its own oldest goes; at the cap of all, the
        busiest source's oldest. Always True: a newcomer is never the one turned away (the pool of 64 handshake
        threads before issue 33 turned the newcomer away, so whoever held the pool kept every rank out)."""
        mine = len(self.idle.get(source, ())) + len(self.busy.get(source, ()))
        if mine >= self.per_source:
            self._shed(source, f"{mine} connections of {source} still in their handshake, its cap")
        elif len(self.pending) >= self.total:
            self._shed_busiest(f"{len(self.pending)} connections still in their handshake, the cap")
        return True

    def _shed(self, source: str, why: str) -> None:
        """Close ``source``'s oldest pending connection that never sent a byte, else its oldest."""
        for table in (self.idle.get(source), self.busy.get(source)):
            if table:
                p = next(iter(table.values()))
                self.shed += 1
                self._drop(p, f"a connection from {p.addr} shed: {why}")
                return

    def _pause(self) -> None:
        """Out of descriptors and nothing pending to shed: leave the listener unwatched for a while (doubling)."""
        try:
            self.selector.unregister(self.listener)
        except (KeyError, ValueError):
            return
        self.paused_until = time.monotonic() + self.pause_s
        self.pause_s = min(2 * self.pause_s, PAUSE_S[1])

    def _shed_busiest(self, why: str) -> bool:
        """At the cap of all: the source holding the most pending connections sheds one; among sources holding as
        many (say, an attacker with as many addresses as connections), the one whose next to go — idle before busy —
        is the oldest, so a newcomer outlives the connections that came before it."""
        counts: dict[str, int] = {}
        for table in (self.idle, self.busy):
            for source, items in table.items():
                counts[source] = counts.get(source, 0) + len(items)
        if not counts:
            return False
        top = max(counts.values())
        order: dict[str, tuple[int, float]] = {}
        for source in (s for s, c in counts.items() if c == top):
            idle = self.idle.get(source)
            first = next(iter(idle.values())) if idle else next(iter(self.busy[source].values()))
            order[source] = (0 if idle else 1, first.deadline)
        self._shed(min(order, key=lambda s: order[s]), why)
        return True

    def _drop(self, p: _Pending, reason: str | None) -> None:
        self._forget(p)
        try:
            self.selector.unregister(p.tls)
        except (KeyError, ValueError):
            pass
        try:
            p.tls.close()
        except OSError:
            pass
        if reason is not None:
            self.reject(p.rank, reason)

    def _forget(self, p: _Pending) -> None:
        self.pending.pop(p.fd, None)
        for table in (self.idle, self.busy):
            items = table.get(p.source)
            if items is not None:
                items.pop(p.fd, None)
                if not items:
                    del table[p.source]

    # -- one connection ------------------------------------------------------------------------------------------

    def _advance(self, p: _Pending) -> None:
        if self.pending.get(p.fd) is not p:  # (shed earlier in the same batch of events)
            return
        if not p.heard:  # from idle to busy: it is no longer the first to be shed
            p.heard = True
            idle = self.idle.get(p.source, {})
            idle.pop(p.fd, None)
            if not idle:
                self.idle.pop(p.source, None)
            self.busy.setdefault(p.source, {})[p.fd] = p
        try:
            self._step(p)
        except Exception as exc:  # a bug must not end the admission of every later connection
            self._drop(p, f"a connection from {p.addr} closed: {type(exc).__name__} while admitting it")

    def _step(self, p: _Pending) -> None:
        try:
            if p.rank is None:
                p.tls.do_handshake()
                rank = self.allow.rank_of(p.tls.getpeercert(binary_form=True))
                if rank is None:  # (OpenSSL checked it against the list: only a bug gets here)
                    self._drop(p, f"a connection from {p.addr} refused: its certificate is not on the allow-list")
                    return
                p.rank = rank
            hello = self._read_hello(p)
        except ssl.SSLWantReadError:
            self.selector.modify(p.tls, selectors.EVENT_READ, p)
            return
        except ssl.SSLWantWriteError:
            self.selector.modify(p.tls, selectors.EVENT_WRITE, p)
            return
        except _Refused as exc:
            self._drop(p, f"a connection from {p.addr} that did not introduce itself ({exc}); closed")
            return
        except (ssl.SSLError, OSError, ValueError) as exc:
            what = "a TLS handshake" if p.rank is None else "a connection"
            text = getattr(exc, "reason", None) or str(exc) or type(exc).__name__
            self._drop(p, f"{what} from {p.addr} failed ({str(text)[:120]})")
            return
        if hello is not None:
            self._hand_over(p, hello)

    def _read_hello(self, p: _Pending) -> bytes | None:
        """Read what there is of the introduction (exactly its bytes, nothing after it); the payload once whole."""
        size = self.header.size
        while True:
            need = (size - len(p.buf)) if p.want == 0 else p.want - len(p.buf)
            if need == 0 and p.want == 0:
                fields = self.header.unpack(bytes(p.buf))
                if fields[0] != self.magic:
                    raise _Refused("a frame without the protocol's magic bytes")
                if fields[1] != self.hello_kind:
                    raise _Refused(f"a frame of kind {fields[1]} where the introduction was due")
                length = int(fields[-1])
                if length > HELLO_BYTES:
                    raise _Refused(f"an introduction of {length} bytes, more than the {HELLO_BYTES} it can hold")
                p.buf = bytearray()
                p.want = length
                if length == 0:
                    return b""
                continue
            if need == 0:
                return bytes(p.buf)
            data = p.tls.recv(need)
            if not data:
                raise _Refused("the connection closed")
            p.buf += data

    def _hand_over(self, p: _Pending, hello: bytes) -> None:
        rank = p.rank
        assert rank is not None
        self._forget(p)
        self.selector.unregister(p.tls)
        with self.lock:
            busy = self.admitting.get(rank, 0)
            if busy < ADMITTING_PER_RANK:
                self.admitting[rank] = busy + 1
        if busy >= ADMITTING_PER_RANK:
            p.tls.close()
            self.reject(rank, f"a connection from {p.addr} refused: rank {rank} has {busy} connections being "
                              "admitted already")
            return
        p.tls.setblocking(True)
        p.tls.settimeout(self.deadline_s)  # the owner sets its own once it has let the rank in
        threading.Thread(target=self._admit, args=(p.tls, p.addr, rank, hello), daemon=True,
                         name=f"{self.name}-{rank}").start()

    def _admit(self, tls: ssl.SSLSocket, addr: str, rank: int, hello: bytes) -> None:
        try:
            self.admit(tls, addr, rank, hello)
        except Exception as exc:  # a peer's bytes, or a close under it: never a traceback in a thread
            tls.close()
            self.reject(rank, f"a connection from {addr} closed: {type(exc).__name__} while admitting it")
        finally:
            with self.lock:
                self.admitting[rank] -= 1


class _Refused(Exception):
    """The introduction broke the protocol (the connection is closed)."""
