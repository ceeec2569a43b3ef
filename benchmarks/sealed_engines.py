"""Which engine carries a keyed job's links: the evidence behind docs/dependencies.md ("Keyed links: why not gRPC").

    .venv/bin/python benchmarks/sealed_engines.py [--messages 40] [--size-mb 4] [--repeats 3]

Measures, on loopback, one connection carrying ``messages`` messages of ``size-mb`` MB one way (a worker's vectors to
the server at d ≈ 10⁶), with mutual TLS 1.3:

* **ssl** — Python's ``ssl`` over a blocking socket, the framing of :mod:`phalanx.distributed.channel` (what the
  keyed engine's links do), with the job's Ed25519 certificates (``phalanx keys init``) and with P-256 ECDSA ones;
* **grpc** — a gRPC client-streaming call (grpcio, Flower's transport) with mutual TLS: first with the job's Ed25519
  certificates (does the handshake succeed?), then with P-256 ECDSA ones;
* **tcp** — the same bytes in clear, for scale.

Prints MB/s per engine (median of ``repeats``, the engines interleaved so that the machine's load hits each alike)
and each one's ratio to ssl with Ed25519.
"""

from __future__ import annotations

import argparse
import datetime
import os
import socket
import ssl
import statistics
import sys
import tempfile
import threading
import time
from concurrent import futures
from pathlib import Path
from typing import Any


def certificates(kind: str, directory: Path) -> tuple[bytes, bytes, bytes, bytes, bytes]:
    """Two self-signed leaf certificates (server, client) and their keys, and the trust list of both: ``kind``
    ``ed25519`` is what ``phalanx keys init`` makes; ``p256`` the same with ECDSA P-256."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec, ed25519
    from cryptography.x509.oid import NameOID

    if kind == "ed25519":
        from phalanx.distributed.keys import init_keys, load_identity

        init_keys(directory / kind, 2)
        out: list[bytes] = []
        for rank in (0, 1):
            ident = load_identity(directory / kind, rank, 2)
            out += [ident.certificate.encode(), ident.key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())]
        return out[0], out[1], out[2], out[3], out[0] + out[2]
    pems: list[bytes] = []
    for rank in (0, 1):
        key = ec.generate_private_key(ec.SECP256R1()) if kind == "p256" else ed25519.Ed25519PrivateKey.generate()
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"phalanx rank {rank}")])
        now = datetime.datetime.now(datetime.timezone.utc)
        cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
                .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=1))
                .not_valid_after(now + datetime.timedelta(days=2))
                .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                .add_extension(x509.SubjectAlternativeName([x509.DNSName("phalanx")]), critical=False)
                .sign(key, hashes.SHA256()))
        pems += [cert.public_bytes(serialization.Encoding.PEM), key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())]
    return pems[0], pems[1], pems[2], pems[3], pems[0] + pems[2]


def _files(directory: Path, name: str, data: bytes) -> str:
    path = directory / name
    path.write_bytes(data)
    return str(path)


def ssl_rate(certs: tuple[bytes, ...], messages: int, size: int, directory: Path, tls: bool = True) -> float:
    """MB/s of ``messages`` framed messages over one (mutual TLS, or clear) loopback connection."""
    from phalanx.distributed.channel import HEADER, Kind, Limits, recv_frame, send_frame

    s_cert, s_key, c_cert, c_key, trust = certs
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    payload = os.urandom(size)
    got: list[int] = []

    def contexts(server: bool) -> ssl.SSLContext:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER if server else ssl.PROTOCOL_TLS_CLIENT)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_3
        ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_REQUIRED
        ctx.load_cert_chain(_files(directory, f"c{server}", s_cert if server else c_cert),
                            _files(directory, f"k{server}", s_key if server else c_key))
        ctx.load_verify_locations(_files(directory, "trust", trust))
        return ctx

    def serve() -> None:
        conn, _ = listener.accept()
        sock = contexts(True).wrap_socket(conn, server_side=True) if tls else conn
        limits = Limits({Kind.VECTOR: size})
        for _ in range(messages):
            got.append(len(recv_frame(sock, limits)[2]))
        sock.close()

    th = threading.Thread(target=serve)
    th.start()
    raw = socket.create_connection(("127.0.0.1", port))
    sock = contexts(False).wrap_socket(raw) if tls else raw
    start = time.perf_counter()
    for _ in range(messages):
        send_frame(sock, Kind.VECTOR, 0, payload)
    th.join()
    seconds = time.perf_counter() - start
    sock.close()
    listener.close()
    assert sum(got) == messages * size and HEADER.size > 0
    return messages * size / seconds / 1e6


def grpc_rate(certs: tuple[bytes, ...], messages: int, size: int) -> float | str:
    """MB/s of a client-streaming gRPC call carrying ``messages`` messages with mutual TLS; the error's text if
    the handshake fails."""
    import grpc

    s_cert, s_key, c_cert, c_key, trust = certs
    received: list[int] = []

    def handler(requests: Any, context: Any) -> bytes:
        for message in requests:
            received.append(len(message))
        return b"ok"

    limit = [("grpc.max_receive_message_length", 2 * size), ("grpc.max_send_message_length", 2 * size)]
    server = grpc.server(futures.ThreadPoolExecutor(2), options=limit)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
        "bench", {"up": grpc.stream_unary_rpc_method_handler(handler)}),))
    port = server.add_secure_port("127.0.0.1:0", grpc.ssl_server_credentials(
        [(s_key, s_cert)], root_certificates=trust, require_client_auth=True))
    server.start()
    creds = grpc.ssl_channel_credentials(root_certificates=trust, private_key=c_key, certificate_chain=c_cert)
    channel = grpc.secure_channel(f"127.0.0.1:{port}", creds,
                                  options=[*limit, ("grpc.ssl_target_name_override", "phalanx")])
    call = channel.stream_unary("/bench/up")
    payload = os.urandom(size)
    try:
        start = time.perf_counter()
        call(iter([payload] * messages), timeout=120, wait_for_ready=False)
        seconds = time.perf_counter() - start
    except grpc.RpcError as exc:
        return f"handshake failed: {exc.details()[:160]}"  # type: ignore[attr-defined]
    finally:
        channel.close()
        server.stop(None)
    assert sum(received) == messages * size
    return messages * size / seconds / 1e6


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=40)
    ap.add_argument("--size-mb", type=float, default=4.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--probe", action="store_true", help="only try gRPC with Ed25519 certificates (one message)")
    args = ap.parse_args(argv)
    if args.probe:
        with tempfile.TemporaryDirectory(prefix="phalanx-engines-") as tmp:
            print(grpc_rate(certificates("ed25519", Path(tmp)), 1, 1024))
        return 0
    os.environ.setdefault("GRPC_VERBOSITY", "NONE")
    size = int(args.size_mb * (1 << 20))
    print(f"# {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}, {args.messages} × {args.size_mb:g} MB, "
          f"{args.repeats} repeats", flush=True)
    with tempfile.TemporaryDirectory(prefix="phalanx-engines-") as tmp:
        d = Path(tmp)
        ed, p256 = certificates("ed25519", d), certificates("p256", d)
        runs: dict[str, list[float]] = {}
        failures: dict[str, str] = {}
        for _ in range(args.repeats):
            for name, fn in (("ssl, Ed25519 (Phalanx's links)", lambda: ssl_rate(ed, args.messages, size, d)),
                             ("ssl, P-256", lambda: ssl_rate(p256, args.messages, size, d)),
                             ("grpc, Ed25519", lambda: grpc_rate(ed, args.messages, size)),
                             ("grpc, P-256", lambda: grpc_rate(p256, args.messages, size)),
                             ("tcp, no TLS", lambda: ssl_rate(ed, args.messages, size, d, tls=False))):
                got = fn()
                if isinstance(got, str):
                    failures[name] = got
                else:
                    runs.setdefault(name, []).append(got)
        base = statistics.median(runs["ssl, Ed25519 (Phalanx's links)"])
        print("| engine | MB/s (median; runs) | ÷ ssl with Ed25519 |\n|---|---|---|")
        for name, rates in runs.items():
            print(f"| {name} | {statistics.median(rates):.0f} ({', '.join(f'{r:.0f}' for r in rates)}) | "
                  f"{statistics.median(rates) / base:.2f}× |")
        for name, text in failures.items():
            print(f"| {name} | {text} | — |")
    if failures:  # why, in the words of gRPC's TLS library (its log, not the exception)
        import re
        import subprocess

        probe = subprocess.run([sys.executable, __file__, "--probe"], capture_output=True, text=True, timeout=120,
                               env={**os.environ, "GRPC_VERBOSITY": "INFO"})
        found = sorted(set(re.findall(r"OPENSSL_internal:([A-Z_]+)", probe.stderr)))
        print(f"gRPC's TLS library on the Ed25519 handshake: {', '.join(found) or probe.stderr[-300:]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
