"""An outsider holding no key of the job, for the availability tests: idle, slow and flooding connections to a
listener, from a chosen source address (Linux routes all of 127/8 to the loopback interface, so 127.0.0.2 plays
another machine)."""

from __future__ import annotations

import json
import socket
import ssl
import threading
from pathlib import Path

from phalanx.distributed.channel import client_context
from phalanx.distributed.keys import ALLOW_LIST, load_identity


class Outsider:
    """Connections of someone holding no key: ``idle`` ones (TCP, never a byte) reopened whenever the listener closes
    one, ``slow`` ones that send a byte of a TLS record every ``drip`` seconds, and a ``flood`` of garbage and of
    full handshakes with another job's key (the key directory ``foreign``), reconnecting at once or every ``pace``
    seconds — from ``source``. ``opened``: how many connections it made."""

    def __init__(self, port: int, source: str = "127.0.0.1", *, idle: int = 0, slow: int = 0, flood: int = 0,
                 foreign: Path | None = None, drip: float = 0.5, pace: float = 0.0) -> None:
        self.port, self.source, self.drip, self.pace = port, source, drip, pace
        self.stop = threading.Event()
        self.opened = 0
        self.threads = [threading.Thread(target=self._hold, args=(idle, False), daemon=True),
                        threading.Thread(target=self._hold, args=(slow, True), daemon=True)]
        self.threads += [threading.Thread(target=self._flood, args=(i, foreign), daemon=True) for i in range(flood)]
        for th in self.threads:
            th.start()

    def _connect(self) -> socket.socket | None:
        try:
            s = socket.create_connection(("127.0.0.1", self.port), timeout=5.0, source_address=(self.source, 0))
        except OSError:  # nothing listens yet (or any more): not a flood of refused connects
            self.stop.wait(0.1)
            return None
        try:
            itself = s.getsockname() == s.getpeername()
        except OSError:  # the listener closed it between the connect and this look (ENOTCONN): try again later —
            s.close()  # raised here, it ended this attacker's thread and the test went on with a weaker outsider
            return None
        if itself:  # TCP connected to itself (its port was the listener's, not yet bound): it would hold the port
            s.close()  # the job is about to listen on — let it go at once
            return None
        self.opened += 1
        return s

    def _hold(self, count: int, slow: bool) -> None:
        held: list[socket.socket] = []
        record = bytes.fromhex("160301") + b"\x02\x00" + b"\x01" * 512  # a TLS record that never ends in time
        sent: dict[socket.socket, int] = {}
        while not self.stop.is_set():
            while len(held) < count and not self.stop.is_set():
                s = self._connect()
                if s is None:
                    break
                s.setblocking(False)
                held.append(s)
            for s in list(held):
                try:
                    if s.recv(1, socket.MSG_PEEK) == b"":  # the listener closed it: reopen
                        raise ConnectionResetError
                except BlockingIOError:
                    pass
                except OSError:
                    held.remove(s)
                    sent.pop(s, None)
                    s.close()
                    continue
                if slow:
                    i = sent.get(s, 0)
                    try:
                        s.send(record[i % len(record):i % len(record) + 1])
                        sent[s] = i + 1
                    except OSError:
                        pass
            self.stop.wait(self.drip if slow else 0.05)
        for s in held:
            s.close()

    def _flood(self, i: int, other: Path | None) -> None:
        ctx = None
        if other is not None and i % 2:
            size = len(json.loads((other / ALLOW_LIST).read_text())["ranks"])
            ctx = client_context(load_identity(other, 1, size))
        while not self.stop.wait(self.pace):
            s = self._connect()
            if s is None:
                continue
            try:
                if ctx is None:
                    s.sendall(b"GET / HTTP/1.0\r\n\r\n" + bytes(range(256)) * 4)
                else:
                    ctx.wrap_socket(s).close()
            except (ssl.SSLError, OSError):
                pass
            finally:
                s.close()

    def close(self) -> None:
        self.stop.set()
        for th in self.threads:
            th.join(timeout=10.0)
