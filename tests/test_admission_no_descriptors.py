"""Out of file descriptors with no pending connection to shed, the admission loop leaves its listener unwatched for a
while instead of spinning on it: a connection waiting in the kernel's backlog keeps the listener readable, every
``accept`` fails with EMFILE, and the loop used a full core doing so (a review). The listener here stays readable (a
client connected) and its ``accept`` always fails as the process's would; the loop's attempts over two seconds are
counted: a spinning loop makes thousands, the paused one a handful (0.1 s doubling to 1 s). The bound is on a
count in the direction a loaded machine only lowers."""

from __future__ import annotations

import errno
import socket
import ssl
import struct
import threading
import time

from phalanx.distributed.admission import Admission

ATTEMPTS_MAX = 50


class OutOfDescriptors(socket.socket):
    """A listening socket whose ``accept`` fails as in a process without a file descriptor left."""

    attempts = 0
    lock = threading.Lock()

    def accept(self) -> tuple[socket.socket, object]:
        with self.lock:
            OutOfDescriptors.attempts += 1
        raise OSError(errno.EMFILE, "Too many open files")


def test_out_of_descriptors_with_nothing_to_shed_the_loop_does_not_spin() -> None:
    listener = OutOfDescriptors(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    client = socket.create_connection(listener.getsockname())  # the listener stays readable: its connection waits
    adm = Admission(listener, ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER), None,  # type: ignore[arg-type]
                    header=struct.Struct("!4sBI"), magic=b"PHLX", hello_kind=1, admit=lambda *a: None,
                    reject=lambda rank, why: None, name="admission-test", total=8)
    try:
        time.sleep(2.0)  # (the loop's attempts are counted over this while)
        attempts = OutOfDescriptors.attempts
    finally:
        adm.close()
        client.close()
        listener.close()
    assert 1 <= attempts <= ATTEMPTS_MAX, attempts
