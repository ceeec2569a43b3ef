"""Identities of a torchrun job: one Ed25519 key pair per rank, and the public allow-list that maps keys to ranks.

``phalanx keys init DIR --workers N`` writes, for ranks 0 … N−1 (rank 0 is also the parameter server)::

    DIR/allow-list.json   public: every rank's self-signed X.509 certificate (its Ed25519 public key) and fingerprint
    DIR/rank-<r>.key      private: rank r's Ed25519 key, PKCS#8 PEM, mode 0600

Each machine needs only the allow-list and the private keys of the ranks it runs. One key per identity and one
identity per key: an allow-list that names a rank twice or holds one key twice is refused. The certificates are
self-signed and *pinned* — a peer is trusted because its certificate is on the list, not because some authority
signed it — so there is no CA key whose theft would let someone mint identities. Keys are made with
``cryptography`` (docs/dependencies.md says why); nothing here is home-made cryptography.

How they are used: mutual TLS 1.3 between each worker and the server (:mod:`phalanx.distributed.channel`), and an
Ed25519 signature on every vector a worker sends (:mod:`phalanx.distributed.transcript`), which is what lets a third
party check afterwards who was heard (``phalanx audit``).
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from phalanx import files
from phalanx.errors import ConfigError
from phalanx.experiments.runfiles import open_regular, problem_of
from phalanx.experiments.store import atomic_write_bytes

ALLOW_LIST = "allow-list.json"
FORMAT = "phalanx-allow-list/1"
MAX_ALLOW_LIST_BYTES = 16 << 20
"""An allow-list larger than this is refused before it is read (≈ 30,000 ranks)."""
KEY_BYTES = 1 << 16
"""A key file larger than this is refused before it is read (an Ed25519 PKCS#8 PEM key: 119 bytes)."""


def key_file(rank: int) -> str:
    """The file name of rank ``rank``'s private key."""
    return f"rank-{rank}.key"


def _crypto() -> Any:
    try:
        import cryptography  # noqa: F401
    except ImportError:
        raise ConfigError(
            "keys", "set", "a Python environment with the `cryptography` package",
            "pip install 'phalanx[secure]'",
        ) from None
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519

    return x509, serialization, ed25519


def fingerprint(cert_der: bytes) -> str:
    """A certificate's SHA-256 fingerprint, ``sha256:<hex>``."""
    return "sha256:" + hashlib.sha256(cert_der).hexdigest()


def _certificate(key: Any, rank: int) -> Any:
    """Rank ``rank``'s self-signed *leaf* certificate: ``CA:FALSE`` and a key usage of signatures only, so that the
    key can prove its identity in a TLS handshake but OpenSSL never accepts a certificate it signed (a rank holding
    its own key cannot mint others that chain to the pinned list)."""
    x509, _, _ = _crypto()
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"phalanx rank {rank}")])
    now = datetime.datetime.now(datetime.timezone.utc)
    usage = x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                          data_encipherment=False, key_agreement=False, key_cert_sign=False, crl_sign=False,
                          encipher_only=False, decipher_only=False)
    return (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1)).not_valid_after(now + datetime.timedelta(days=3650))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(usage, critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                       critical=False)
        .sign(key, None)  # Ed25519 signs without a separate hash
    )


def _authority(cert: Any) -> bool:
    """Whether OpenSSL may take ``cert`` as an issuer of other certificates: ``CA:TRUE``, or no basic constraints
    (the allow-lists of Phalanx before issue 33 were ``CA:TRUE``)."""
    x509, _, _ = _crypto()
    try:
        return bool(cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca)
    except x509.ExtensionNotFound:
        return True


def _write_private(path: Path, data: bytes) -> None:
    """Write a private key atomically with mode 0600 from the start (never readable by others, not even briefly)."""
    atomic_write_bytes(path, data, mode=0o600)


def _write_public(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode(), mode=0o644)


def _new_key() -> tuple[Any, bytes]:
    _, serialization, ed25519 = _crypto()
    key = ed25519.Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    return key, pem


def _entry(rank: int, cert: Any) -> dict[str, Any]:
    _, serialization, _ = _crypto()
    return {
        "rank": rank, "role": "server and worker 0" if rank == 0 else "worker",
        "fingerprint": fingerprint(cert.public_bytes(serialization.Encoding.DER)),
        "certificate": cert.public_bytes(serialization.Encoding.PEM).decode(),
    }


def init_keys(directory: Path, workers: int, *, force: bool = False) -> AllowList:
    """Make a key pair for each of ranks 0 … ``workers``−1 in ``directory`` and the allow-list of their public keys.

    Refuses to overwrite an existing allow-list unless ``force`` (old private keys would no longer match it).
    """
    if workers < 1:
        raise ConfigError("--workers", workers, "an integer ≥ 1 (one key per rank; rank 0 is also the server)")
    directory = Path(directory)
    if (directory / ALLOW_LIST).exists() and not force:
        raise ConfigError("DIR", str(directory), "a directory without an allow-list",
                          f"{directory / ALLOW_LIST} exists; pass --force to replace every key in it")
    directory.mkdir(parents=True, exist_ok=True)
    entries = []
    for rank in range(workers):
        key, pem = _new_key()
        _write_private(directory / key_file(rank), pem)
        entries.append(_entry(rank, _certificate(key, rank)))
    _write_public(directory / ALLOW_LIST, json.dumps({"format": FORMAT, "ranks": entries}, indent=1) + "\n")
    return AllowList.load(directory / ALLOW_LIST)


def rotate_key(directory: Path, rank: int) -> AllowList:
    """Give ``rank`` a new key pair and replace its entry in the allow-list (the others keep theirs). The new
    allow-list must reach every machine before the next launch; the old key is then worthless."""
    allow = AllowList.load(Path(directory) / ALLOW_LIST)
    if rank not in allow.by_rank:
        raise ConfigError("--rank", rank, f"a rank of {allow.path} (0 … {allow.size - 1})")
    key, pem = _new_key()
    raw = json.loads(allow.path.read_text())
    raw["ranks"] = [_entry(rank, _certificate(key, rank)) if e["rank"] == rank else e for e in raw["ranks"]]
    _write_private(Path(directory) / key_file(rank), pem)
    _write_public(allow.path, json.dumps(raw, indent=1) + "\n")
    return AllowList.load(allow.path)


@dataclass(frozen=True)
class AllowList:
    """Which certificate (public key) speaks for which rank."""

    path: Path
    by_rank: dict[int, str]
    """rank → PEM certificate"""
    by_fingerprint: dict[str, int]
    """``sha256:<hex>`` of the DER certificate → rank"""
    digest: str
    """SHA-256 of the allow-list file: recorded in a run's transcript"""
    authorities: tuple[int, ...] = ()
    """Ranks whose certificate may sign others (``CA:TRUE``): read for an audit, refused for a job
    (:func:`load_identity`)."""

    @property
    def size(self) -> int:
        """How many ranks the list names."""
        return len(self.by_rank)

    @classmethod
    def load(cls, path: Path, follow: bool = True) -> AllowList:
        """Read and check an allow-list; any problem is one :class:`ConfigError` naming the file. Read with bounded
        memory (:func:`~phalanx.experiments.runfiles.open_regular`: a FIFO or a device is refused without blocking,
        at most :data:`MAX_ALLOW_LIST_BYTES` + 1 bytes are read); ``follow=False`` — a run directory's copy, which
        whoever writes the directory chooses — refuses a symbolic link instead of following it (a list the user
        names may be one)."""
        x509, serialization, ed25519 = _crypto()
        path = Path(path)

        def bad(problem: str) -> ConfigError:
            return ConfigError("allow-list", str(path), "an allow-list written by `phalanx keys init`", problem)

        try:
            with open_regular(path, follow) as fh:
                size = os.fstat(fh.fileno()).st_size
                if size > MAX_ALLOW_LIST_BYTES:
                    raise bad(f"{size} bytes, more than the {MAX_ALLOW_LIST_BYTES} an allow-list can have")
                blob = fh.read(MAX_ALLOW_LIST_BYTES + 1)
        except OSError as exc:
            raise bad(f"cannot be read ({exc.strerror or type(exc).__name__})") from None
        except ConfigError as exc:
            if exc.parameter == "allow-list":
                raise
            raise bad(problem_of(exc)) from None  # runfiles.damaged: a link not followed, not a regular file
        if len(blob) > MAX_ALLOW_LIST_BYTES:  # it grew since its size was taken
            raise bad(f"{len(blob)} bytes, more than the {MAX_ALLOW_LIST_BYTES} an allow-list can have")
        try:
            raw = json.loads(blob)
        except (ValueError, RecursionError) as exc:  # not UTF-8, not JSON, a number too long, nested too deeply
            raise bad(f"not readable as JSON ({type(exc).__name__})") from None
        if not isinstance(raw, dict) or raw.get("format") != FORMAT or not isinstance(raw.get("ranks"), list):
            raise bad(f"not a {FORMAT} document")
        by_rank: dict[int, str] = {}
        by_fp: dict[str, int] = {}
        keys_seen: dict[bytes, int] = {}
        authorities = []
        for entry in raw["ranks"]:
            if not isinstance(entry, dict) or not isinstance(entry.get("rank"), int) or isinstance(entry["rank"], bool):
                raise bad("an entry without an integer rank")
            rank = entry["rank"]
            if rank in by_rank:
                raise bad(f"rank {rank} is listed twice (one key per identity)")
            try:
                cert = x509.load_pem_x509_certificate(str(entry.get("certificate", "")).encode())
            except ValueError:
                raise bad(f"rank {rank}'s certificate is not a PEM X.509 certificate") from None
            pub = cert.public_key()
            if not isinstance(pub, ed25519.Ed25519PublicKey):
                raise bad(f"rank {rank}'s certificate does not hold an Ed25519 key")
            raw_pub = pub.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
            if raw_pub in keys_seen:
                raise bad(f"ranks {keys_seen[raw_pub]} and {rank} have the same key (one identity per key)")
            keys_seen[raw_pub] = rank
            fp = fingerprint(cert.public_bytes(serialization.Encoding.DER))
            if entry.get("fingerprint") not in (None, fp):
                raise bad(f"rank {rank}'s fingerprint does not match its certificate")
            by_rank[rank] = cert.public_bytes(serialization.Encoding.PEM).decode()
            by_fp[fp] = rank
            if _authority(cert):
                authorities.append(rank)
        if sorted(by_rank) != list(range(len(by_rank))) or not by_rank:
            raise bad(f"ranks {sorted(by_rank)} are not 0 … N−1")
        return cls(path, by_rank, by_fp, hashlib.sha256(blob).hexdigest(), tuple(sorted(authorities)))

    def public_key(self, rank: int) -> Any:
        """Rank ``rank``'s Ed25519 public key (a ``cryptography`` object)."""
        x509, _, _ = _crypto()
        return x509.load_pem_x509_certificate(self.by_rank[rank].encode()).public_key()

    def rank_of(self, cert_der: bytes | None) -> int | None:
        """The rank a peer's DER certificate speaks for, or None if it is not on the list."""
        return None if cert_der is None else self.by_fingerprint.get(fingerprint(cert_der))

    @contextmanager
    def trust_file(self) -> Iterator[str]:
        """A temporary PEM file of every listed certificate (for ``ssl``'s ``load_verify_locations``)."""
        with tempfile.NamedTemporaryFile("w", suffix=".pem") as fh:
            fh.write("".join(self.by_rank[r] for r in sorted(self.by_rank)))
            fh.flush()
            yield fh.name


@dataclass(frozen=True)
class Identity:
    """One rank's private key with its certificate from the allow-list, and the allow-list."""

    rank: int
    key_path: Path
    key: Any
    allow: AllowList

    @property
    def certificate(self) -> str:
        """This rank's PEM certificate."""
        return self.allow.by_rank[self.rank]

    def sign(self, message: bytes) -> bytes:
        """An Ed25519 signature of ``message`` (64 bytes)."""
        return bytes(self.key.sign(message))

    @contextmanager
    def chain_files(self) -> Iterator[tuple[str, str]]:
        """Temporary PEM files (certificate, private key) for ``ssl``'s ``load_cert_chain``, readable by this user
        only, removed on exit."""
        _, serialization, _ = _crypto()
        with tempfile.TemporaryDirectory(prefix="phalanx-tls-") as tmp:
            cert, key = Path(tmp) / "cert.pem", Path(tmp) / "key.pem"
            cert.write_text(self.certificate)
            _write_private(key, self.key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                       serialization.NoEncryption()))
            yield str(cert), str(key)


def load_identity(directory: str | Path, rank: int, world_size: int | None = None) -> Identity:
    """Rank ``rank``'s identity from a key directory: ``DIR/rank-<rank>.key`` and ``DIR/allow-list.json``.

    Checked before any process starts: the files exist and are readable, the key file holds a private Ed25519 key
    (not a public key or certificate), is readable by its owner only, and is the key the allow-list gives this rank,
    and the allow-list names exactly ``world_size`` ranks. Each problem is one line naming the file.
    """
    _, serialization, ed25519 = _crypto()
    directory = Path(directory)
    if not directory.is_dir():
        raise ConfigError("keys", str(directory), "a key directory made by `phalanx keys init DIR --workers N`",
                          "it does not exist or is not a directory")
    allow = AllowList.load(directory / ALLOW_LIST)
    if world_size is not None and allow.size != world_size:
        raise ConfigError("allow-list", str(allow.path), f"an allow-list of exactly {world_size} ranks (the job's)",
                          f"it names {allow.size}; make keys with --workers {world_size}")
    if rank not in allow.by_rank:
        raise ConfigError("RANK", rank, f"a rank of {allow.path} (0 … {allow.size - 1})")
    if allow.authorities:
        raise ConfigError("allow-list", str(allow.path), "leaf certificates (CA:FALSE), as `phalanx keys init` makes "
                          "them", f"rank {allow.authorities[0]}'s certificate is a CA (CA:TRUE): it could sign "
                          f"certificates for keys not on the list; make new keys with `phalanx keys init "
                          f"{directory} --workers {allow.size} --force`")
    path = directory / key_file(rank)

    def bad(problem: str, hint: str | None = None) -> ConfigError:
        return ConfigError("key", str(path), f"rank {rank}'s private key (PKCS#8 PEM, mode 0600)",
                           problem + (f"; {hint}" if hint else ""))

    try:  # a link is followed (the user named the directory); a FIFO or a device is refused unread, without blocking
        with files.open_regular(path, follow=True, error=lambda _, problem: bad(problem)) as fh:
            info = os.fstat(fh.fileno())
            blob = fh.read(KEY_BYTES + 1) if info.st_size <= KEY_BYTES else b""
    except OSError as exc:
        raise bad(f"cannot be read ({exc.strerror or type(exc).__name__})") from None
    if not blob or len(blob) > KEY_BYTES:
        raise bad("empty or larger than a key can be")
    if b"PUBLIC KEY" in blob or b"CERTIFICATE" in blob:
        raise bad("holds a public key or a certificate, not a private key")
    if os.name == "posix" and stat.S_IMODE(info.st_mode) & 0o077:
        raise bad(f"readable by other users (mode {stat.S_IMODE(info.st_mode):04o})", f"chmod 600 {path}")
    try:
        key = serialization.load_pem_private_key(blob, password=None)
    except (ValueError, TypeError):
        raise bad("not an unencrypted PEM private key") from None
    if not isinstance(key, ed25519.Ed25519PrivateKey):
        raise bad("not an Ed25519 key")
    mine = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    listed = allow.public_key(rank).public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    if mine != listed:
        owner = next((r for r in allow.by_rank if allow.public_key(r).public_bytes(
            serialization.Encoding.Raw, serialization.PublicFormat.Raw) == mine), None)
        raise bad("not the key " + str(allow.path) + f" gives rank {rank}"
                  + (f" (it is rank {owner}'s)" if owner is not None else " (it is on no rank's entry)"))
    return Identity(rank, path, key, allow)
