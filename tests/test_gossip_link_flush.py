"""A keyless gossip link whose send fails (the peer died with a message of ours in flight) ends a flush waiting on it
at once, as the sealed mesh's does — before, the sending thread closed the inbox and left ``pending`` as it was, so
the flush slept until its deadline (``round_timeout``) on a link known to be dead (a review of liveness under load).

The gloo pair is a stand-in (``dist.ProcessGroupGloo`` replaced in the module): its send fails, its receive waits for
the test's end. The flush's deadline is 600 s and the test waits at most 120 s for it, on the flush's own end."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import torch

from phalanx.distributed import gossip_links
from phalanx.distributed.gossip_links import Inbox, Link


class _Work:
    def __init__(self, fail: threading.Event | None) -> None:
        self.fail = fail

    def wait(self, timeout: Any) -> None:
        if self.fail is not None:
            self.fail.wait()
        raise RuntimeError("Connection reset by peer")


class _DyingPair:
    """A gloo pair whose sends fail at once and whose receive fails when the test ends."""

    def __init__(self, *args: Any) -> None:
        self.ended = threading.Event()

    def send(self, msgs: list[torch.Tensor], other: int, tag: int) -> _Work:
        return _Work(None)

    def recv(self, bufs: list[torch.Tensor], other: int, tag: int) -> _Work:
        return _Work(self.ended)


def test_a_flush_on_a_link_whose_send_failed_ends_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gossip_links.dist, "ProcessGroupGloo", _DyingPair)
    inbox = Inbox()
    link = Link(torch.distributed.HashStore(), 0, 1, 4, torch.float32, inbox, 5.0)
    try:
        link.send(0, 0, torch.zeros(4))
        flushed = threading.Thread(target=link.flush, args=(time.monotonic() + 600.0,), daemon=True)
        flushed.start()
        flushed.join(120.0)
        assert not flushed.is_alive(), "the flush waited on a dead link until its deadline"
        assert 1 in inbox.closed_links()
    finally:
        link.pg.ended.set()  # type: ignore[attr-defined]
