"""Signed run directories, with Sigstore's ``model-signing`` library (OpenSSF Model Signing).

A run directory's ``manifest.json`` records the SHA-256 of every file the run writes, which catches damage and edits
by hand; anyone who can edit the files can also edit the manifest. A signature closes that gap: :func:`sign` hashes
every file of the directory and signs the list with a private key, :func:`verify` checks the list against the files
with the paired public key, so a changed, added or removed file, or a signature made by another key, is refused.

The signature is ``RUN_DIR/phalanx.sig``, written by the library as it writes every signature: a Sigstore bundle
(JSON, media type ``application/vnd.dev.sigstore.bundle.v0.3+json``) holding a DSSE envelope whose payload is an
in-toto statement (``https://in-toto.io/Statement/v1``, predicate type ``https://model_signing/signature/v1.0``)
that lists every file with its SHA-256 (the OpenSSF Model Signing format of sigstore/model-transparency). So the
library's own CLI verifies it too::

    model_signing verify key RUN_DIR --signature RUN_DIR/phalanx.sig --public_key PUB.pem

What is covered: every regular file under the run directory, sub-directories included, except the signature itself
and transient files (``*.tmp``, ``*.lock``: a crashed atomic write's leftover, which Phalanx never reads). A symbolic
link in the directory is refused, as the library refuses them.

Three ways to sign, as the library offers them:

* an elliptic-curve key pair (P-256, P-384 or P-521; :func:`keygen` makes one), offline;
* a private key and its X.509 signing certificate (with the chain up to a CA), verified against the CA's
  certificate, offline;
* keyless Sigstore: a short-lived certificate for an OpenID Connect identity, logged in the public transparency log
  (Rekor). Needs the network (Sigstore's TUF trust root, Fulcio, Rekor) and an identity token: ambient credentials (a
  CI's workload identity) when available, otherwise the browser flow. Verified against that identity and its issuer.

The library is an optional extra (``pip install 'phalanx[signing]'``): importing this module needs nothing beyond
Phalanx; calling :func:`sign` or :func:`verify` without the extra raises :class:`SigningUnavailableError`.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import stat
import tempfile
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from phalanx.errors import ConfigError, PhalanxError
from phalanx.files import write_atomic
from phalanx.walk import walk

__all__ = [
    "CURVES",
    "MAX_SIGNATURE_BYTES",
    "SIGNATURE",
    "TRANSIENT_SUFFIXES",
    "SignatureError",
    "SigningUnavailableError",
    "covered_files",
    "fingerprint",
    "keygen",
    "public_key_of",
    "sign",
    "sign_statement",
    "verify",
    "verify_statement",
]

SIGNATURE = "phalanx.sig"
"""The signature's file name inside the run directory."""

TRANSIENT_SUFFIXES = (".tmp", ".lock")
"""Files ending so are neither signed nor checked (temporary files of atomic writes, locks)."""

CURVES = ("P-256", "P-384", "P-521")
"""The elliptic curves the library signs with (those of Sigstore's specifications)."""

INSTALL = "pip install 'phalanx[signing]'"

MAX_SIGNATURE_BYTES = 4 << 20
"""The largest signature bundle read (an honest one lists every file of a run directory: ~150 bytes a file, a few kB
in all); a larger one is refused unread."""

PathLike = str | os.PathLike[str]

_MAX_NAMES = 5


class SigningUnavailableError(PhalanxError, ImportError):
    """The optional extra ``phalanx[signing]`` (``model-signing`` with ``pyopenssl``) is not installed."""

    def __init__(self, missing: str) -> None:
        self.missing = missing
        super().__init__(
            f"signing run directories needs the optional extra (module {missing!r} is missing): {INSTALL}"
        )


class SignatureError(PhalanxError, RuntimeError):
    """A run directory could not be signed, or its signature does not hold.

    Attributes
    ----------
    run_dir: the run directory.
    problem: what failed, in words (for a changed directory: which files changed, appeared or disappeared).
    hint: what to do.
    stage: ``"sign"`` or ``"verify"``.
    """

    def __init__(self, run_dir: str, problem: str, hint: str, stage: str = "verify") -> None:
        self.run_dir = run_dir
        self.problem = problem
        self.hint = hint
        self.stage = stage
        head = f"{run_dir}: signature verification failed" if stage == "verify" else f"{run_dir}: signing failed"
        super().__init__(f"{head}: {problem} — {hint}")


def _library() -> tuple[ModuleType, ModuleType, ModuleType]:
    """model_signing's hashing, signing and verifying modules, or :class:`SigningUnavailableError`."""
    try:
        from model_signing import hashing, signing, verifying
    except ImportError as exc:  # model-signing itself, or a dependency it imports (pyOpenSSL, sigstore)
        raise SigningUnavailableError(exc.name or "model_signing") from exc
    return hashing, signing, verifying


def require() -> None:
    """Raise :class:`SigningUnavailableError` now if the extra is missing (before a run that will sign or verify)."""
    _library()


def _one_line(text: str, limit: int = 200) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _run_dir(run_dir: PathLike) -> Path:
    path = Path(run_dir)
    if not path.is_dir():
        raise ConfigError("run_dir", str(run_dir), "an existing run directory")
    return path


def _transient(run: Path) -> list[str]:
    return sorted(
        p.relative_to(run).as_posix() for p in walk(run, "run_dir")
        if p.name.endswith(TRANSIENT_SUFFIXES) and not p.is_symlink() and p.is_file()
    )


def covered_files(run_dir: PathLike) -> list[str]:
    """The files (relative paths, sorted) a signature of ``run_dir`` covers now: all but the signature and the
    transient files."""
    run = _run_dir(run_dir)
    skip = {SIGNATURE, *_transient(run)}
    return sorted(
        rel for p in walk(run, "run_dir") if (p.is_file() or p.is_symlink())
        and (rel := p.relative_to(run).as_posix()) not in skip
    )


def _hashing_config(hashing: ModuleType, run: Path) -> Any:
    """File-by-file SHA-256 of everything but the signature and the transient files; git paths are not special."""
    return (
        hashing.Config()
        .use_file_serialization(hashing_algorithm="sha256", allow_symlinks=False)
        .set_ignored_paths(paths=[SIGNATURE, *_transient(run)], ignore_git_paths=False)
    )


def _write_new(path: Path, payload: bytes, mode: int) -> None:
    """Write ``path`` atomically with permissions ``mode``, never replacing an existing file."""
    write_atomic(path, payload, mode, exclusive=True)


def _write_atomic(path: Path, payload: bytes) -> None:
    write_atomic(path, payload, 0o644)


def keygen(
    private_path: PathLike, public_path: PathLike, *, curve: str = "P-256", password: str | None = None,
) -> tuple[Path, Path]:
    """Make an elliptic-curve key pair for :func:`sign` and :func:`verify`, as PEM files.

    The private key (PKCS #8, encrypted with ``password`` when given) is written with permissions 0600, the public
    key (SubjectPublicKeyInfo) 0644, each atomically; neither replaces an existing file. The same keys as::

        openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out KEY.pem
        openssl pkey -in KEY.pem -pubout -out PUB.pem

    Returns the two paths.
    """
    if curve not in CURVES:
        raise ConfigError("curve", curve, ", ".join(CURVES))
    private, public = Path(private_path), Path(public_path)
    if private.resolve() == public.resolve():
        raise ConfigError("public_path", str(public_path), "a path other than the private key's")
    for name, path in (("private_path", private), ("public_path", public)):
        if path.exists() or path.is_symlink():
            raise ConfigError(name, str(path), "a path that does not exist yet",
                              "keygen never overwrites a key: move the old one away or choose another name")
        if not path.parent.is_dir():
            raise ConfigError(name, str(path), "a path in an existing directory")
    try:
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ec
    except ImportError as exc:
        raise SigningUnavailableError(exc.name or "cryptography") from exc

    key = ec.generate_private_key({"P-256": ec.SECP256R1(), "P-384": ec.SECP384R1(), "P-521": ec.SECP521R1()}[curve])
    encryption: serialization.KeySerializationEncryption = (
        serialization.BestAvailableEncryption(password.encode()) if password else serialization.NoEncryption()
    )
    private_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption)
    public_pem = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    for name, path, payload, mode in (("private_path", private, private_pem, 0o600),
                                      ("public_path", public, public_pem, 0o644)):
        try:
            _write_new(path, payload, mode)
        except FileExistsError:
            raise ConfigError(name, str(path), "a path that does not exist yet",
                              "it appeared while the key was written; keygen never overwrites a key") from None
    return private, public


def sign(
    run_dir: PathLike,
    key: PathLike | None = None,
    *,
    certificate: PathLike | None = None,
    certificate_chain: Sequence[PathLike] = (),
    password: str | None = None,
    keyless: bool = False,
    identity_token: str | None = None,
) -> Path:
    """Sign every file of ``run_dir``; write the signature to ``run_dir/phalanx.sig`` and return its path.

    Modes (the library's):

    * ``key``: a PEM elliptic-curve private key (:func:`keygen`); ``password`` if it is encrypted. Offline.
    * ``key`` and ``certificate``: the key's X.509 signing certificate (PEM), and ``certificate_chain`` the PEM
      certificates between it and the CA (intermediates, and the CA itself if you like). Offline.
    * ``keyless=True``: Sigstore keyless signing (no key): needs the network and an OpenID Connect identity —
      ``identity_token`` if given, else ambient credentials (a CI's workload identity), else the interactive
      browser flow. The bundle then holds a Fulcio certificate and a Rekor transparency-log entry.

    An existing signature is replaced (atomically). Raises :class:`~phalanx.errors.ConfigError` for a bad
    argument or an unusable key or certificate, :class:`SignatureError` when signing itself fails (e.g. Sigstore
    unreachable), :class:`SigningUnavailableError` without the extra.
    """
    run = _run_dir(run_dir)
    if keyless and (key is not None or certificate is not None):
        raise ConfigError("keyless", True, "without key or certificate", "keyless signing uses no key of yours")
    if not keyless and key is None:
        raise ConfigError("key", None, "a PEM elliptic-curve private key (phalanx keygen), or keyless=True")
    if certificate is not None and password:
        raise ConfigError("password", "***", "none with a certificate",
                          "model-signing 1.1.1 reads the certificate's key unencrypted only")
    if certificate is None and certificate_chain:
        raise ConfigError("certificate_chain", [str(c) for c in certificate_chain], "given with certificate")
    hashing, signing, _ = _library()
    config = signing.Config().set_hashing_config(_hashing_config(hashing, run))

    if keyless:
        try:
            config.use_sigstore_signer(use_ambient_credentials=True, identity_token=identity_token)
        except Exception as exc:
            raise SignatureError(str(run), f"Sigstore is unreachable ({type(exc).__name__}: {_one_line(str(exc))})",
                                 "keyless signing needs the network; offline, sign with a key (phalanx keygen)",
                                 stage="sign") from exc
    else:
        assert key is not None
        try:
            if certificate is not None:
                config.use_certificate_signer(private_key=key, signing_certificate=certificate,
                                              certificate_chain=list(certificate_chain))
            else:
                # bytes: model-signing 1.1.1 hands the password to cryptography as is (its `str` hint is wrong)
                config.use_elliptic_key_signer(private_key=key, password=password.encode() if password else None)
        except FileNotFoundError as exc:
            raise ConfigError("key" if Path(exc.filename or "") == Path(key) else "certificate",
                              exc.filename, "an existing PEM file") from None
        except Exception as exc:
            what = "key" if certificate is None else "key/certificate"
            raise ConfigError(what, str(key) if certificate is None else f"{key}, {certificate}",
                              "a PEM elliptic-curve private key (P-256, P-384 or P-521)"
                              + ("" if certificate is None else " and the certificate of its public key"),
                              f"{type(exc).__name__}: {_one_line(str(exc)) or 'unreadable'}") from None

    with tempfile.TemporaryDirectory(prefix="phalanx-sign-") as tmp:
        out = Path(tmp) / SIGNATURE
        try:
            config.sign(run, out)
        except PhalanxError:
            raise
        except Exception as exc:
            hint = ("keyless signing needs the network and an identity; offline, sign with a key (phalanx keygen)"
                    if keyless else "check that the directory holds only regular files (no symbolic links)")
            raise SignatureError(str(run), f"{type(exc).__name__}: {_one_line(str(exc))}", hint,
                                 stage="sign") from exc
        bundle = out.read_bytes()
    target = run / SIGNATURE
    _write_atomic(target, bundle)
    return target


def _check_size(run: Path, signature: Path) -> None:
    """Refuse, unread, a signature bundle larger than :data:`MAX_SIGNATURE_BYTES` (the library parses it whole)."""
    size = signature.stat().st_size
    if size > MAX_SIGNATURE_BYTES:
        raise SignatureError(str(run), f"{SIGNATURE} has {size:,} bytes, more than the {MAX_SIGNATURE_BYTES:,} a "
                             "signature may have (not read)", "do not use these results; restore the directory from "
                             "a trusted copy")


def _linked(run: Path) -> SignatureError:
    return SignatureError(str(run), f"{run / SIGNATURE} is a symbolic link, not followed",
                          "signed directories hold only regular files: remove the link")


def _refuse_link(run: Path, signature: Path) -> None:
    """The bundle is read through no link: its bytes are the directory's own (a link would make another file, or a
    FIFO, the signature verified)."""
    if signature.is_symlink():
        raise _linked(run)


def _read_signature(run: Path, signature: Path) -> bytes:
    """The bundle's bytes, at most :data:`MAX_SIGNATURE_BYTES` + 1 (the size was checked, but it may have grown
    since), read through a descriptor opened ``O_NOFOLLOW | O_NONBLOCK`` and checked to be a regular file: a link or
    FIFO swapped in after the checks is refused, never followed or waited on."""
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(signature, flags)
    except OSError:
        if signature.is_symlink():
            raise _linked(run) from None
        raise
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise SignatureError(str(run), f"{signature} is not a regular file", "do not use these results; "
                                 "restore the directory from a trusted copy")
        return fh.read(MAX_SIGNATURE_BYTES + 1)


def _signed_digests(signature: Path) -> dict[str, str] | None:
    """file → SHA-256 as the signed in-toto statement lists them (read only after the library verified it)."""
    try:
        bundle = json.loads(signature.read_text())
        statement = json.loads(base64.b64decode(bundle["dsseEnvelope"]["payload"]))
        return {r["name"]: r["digest"] for r in statement["predicate"]["resources"]}
    except Exception:
        return None


def _names(names: list[str]) -> str:
    shown = ", ".join(names[:_MAX_NAMES])
    return shown + (f" and {len(names) - _MAX_NAMES} more" if len(names) > _MAX_NAMES else "")


def _describe_changes(hashing: ModuleType, run: Path, signature: Path) -> str | None:
    """Which files changed, appeared or disappeared since signing, in words; None if it cannot tell."""
    expected = _signed_digests(signature)
    if expected is None:
        return None
    try:
        manifest = _hashing_config(hashing, run).hash(run)
        actual = {str(rd.identifier): rd.digest.digest_hex for rd in manifest.resource_descriptors()}
    except Exception:
        return None
    changed = sorted(n for n in expected.keys() & actual.keys() if expected[n] != actual[n])
    added = sorted(actual.keys() - expected.keys())
    missing = sorted(expected.keys() - actual.keys())
    parts = ([f"changed: {_names(changed)}"] if changed else []) + (
        [f"added (not signed): {_names(added)}"] if added else []) + (
        [f"missing: {_names(missing)}"] if missing else [])
    return "; ".join(parts) or None


def verify(
    run_dir: PathLike,
    key: PathLike | None = None,
    *,
    certificate_chain: Sequence[PathLike] | None = None,
    identity: str | None = None,
    oidc_issuer: str | None = None,
) -> dict[str, str]:
    """Check ``run_dir/phalanx.sig`` against the files of ``run_dir``; return the file → SHA-256 map the verified
    statement signs, or raise. The bundle is read once and the bytes verified are the bytes parsed for that map (a
    copy in a private temporary folder): a bundle swapped in after the check cannot supply it.

    Modes, matching those of :func:`sign`:

    * ``key``: the PEM public key paired with the signing key. Offline.
    * ``certificate_chain``: the trusted PEM certificates (the CA's, and intermediates) the signing certificate
      must chain to; an empty sequence means the system's roots (certifi). Offline.
    * ``identity`` and ``oidc_issuer``: a keyless Sigstore signature by that identity (e.g. an e-mail address or a
      CI workflow URL) from that OpenID Connect issuer. Needs the network (Sigstore's trust root).

    Raises :class:`SignatureError` — one line naming the run directory, what failed (the files changed, added or
    missing; a signature by another key; no signature) and what to do — :class:`~phalanx.errors.ConfigError` for an
    unusable key or certificate, :class:`SigningUnavailableError` without the extra.
    """
    run = _run_dir(run_dir)
    modes = sum((key is not None, certificate_chain is not None, identity is not None or oidc_issuer is not None))
    if modes != 1:
        raise ConfigError("key", None if key is None else str(key),
                          "exactly one of: key (a public key), certificate_chain, identity with oidc_issuer")
    hashing, _, verifying = _library()
    signature = run / SIGNATURE
    _refuse_link(run, signature)
    if not signature.is_file():
        raise SignatureError(str(run), f"no signature ({SIGNATURE} is missing)",
                             "sign the directory first (phalanx sign RUN_DIR --key KEY.pem), or do not trust it")
    _check_size(run, signature)
    config = verifying.Config()
    try:
        if key is not None:
            config.use_elliptic_key_verifier(public_key=key)
        elif certificate_chain is not None:
            config.use_certificate_verifier(certificate_chain=list(certificate_chain))
        else:
            if not identity or not oidc_issuer:
                raise ConfigError("identity/oidc_issuer", (identity, oidc_issuer), "both, for a keyless signature")
            try:
                config.use_sigstore_verifier(identity=identity, oidc_issuer=oidc_issuer)
            except Exception as exc:
                raise SignatureError(
                    str(run), f"Sigstore's trust root is unreachable ({type(exc).__name__}: {_one_line(str(exc))})",
                    "keyless verification needs the network; try again online") from exc
    except PhalanxError:
        raise
    except FileNotFoundError as exc:
        raise ConfigError("key" if key is not None else "certificate_chain", exc.filename,
                          "an existing PEM file") from None
    except Exception as exc:
        raise ConfigError("key" if key is not None else "certificate_chain",
                          str(key) if key is not None else [str(c) for c in certificate_chain or ()],
                          "a PEM elliptic-curve public key (P-256, P-384 or P-521)" if key is not None
                          else "PEM certificates", f"{type(exc).__name__}: {_one_line(str(exc)) or 'unreadable'}"
                          ) from None
    config.set_hashing_config(_hashing_config(hashing, run))

    with tempfile.TemporaryDirectory(prefix="phalanx-sig-") as private:
        held = Path(private) / SIGNATURE  # the bytes verified are the bytes whose digests are returned
        try:
            held.write_bytes(_read_signature(run, signature))
            _check_size(run, held)
            config.verify(run, held)
        except PhalanxError:
            raise
        except Exception as exc:
            raise _verify_error(hashing, run, held, exc, key) from exc
        digests = _signed_digests(held)
    if digests is None:  # verified, yet not a statement of resources: nothing to hold its files to
        raise SignatureError(str(run), f"{SIGNATURE} verified but lists no files", "do not use these results; "
                             "restore the directory from a trusted copy")
    return digests


def _verify_error(hashing: ModuleType, run: Path, signature: Path, exc: Exception, key: PathLike | None
                  ) -> SignatureError:
    """Turn the library's exception into a :class:`SignatureError` that says what failed and what to do."""
    message = _one_line(str(exc))
    kind = type(exc).__name__
    untrusted = "do not use these results; restore the directory from a trusted copy"
    if message.startswith("Signature mismatch"):
        problem = _describe_changes(hashing, run, signature) or message
        return SignatureError(str(run), f"the files differ from the signed ones ({problem})",
                              untrusted + ", or re-sign it if you made the change (phalanx sign)")
    if message.startswith("Key mismatch"):
        return SignatureError(str(run), f"{SIGNATURE} was made by another key than {key}",
                              "verify with the public key paired with the signing key; if this is the right key, "
                              + untrusted)
    if kind == "InvalidSignature":
        return SignatureError(str(run), f"{SIGNATURE} does not match the statement it signs (the signature was "
                              "altered, or made by another key)", untrusted)
    if kind == "X509StoreContextError":
        return SignatureError(str(run), f"the signing certificate does not chain to the trusted certificates "
                              f"({message})", "verify with the CA certificate that issued it, or " + untrusted)
    if isinstance(exc, (json.JSONDecodeError, UnicodeDecodeError, KeyError, IndexError, RecursionError)) or (
            "parse" in message):
        return SignatureError(str(run), f"{SIGNATURE} is not a readable Sigstore bundle ({kind}: {message})",
                              "re-sign the directory (phalanx sign), or " + untrusted)
    if "symlink" in message:
        return SignatureError(str(run), message, "signed directories hold only regular files: remove the link")
    return SignatureError(str(run), f"{kind}: {message}" if message else kind,
                          "check the key or certificate you verify with, or " + untrusted)


# ------------------------------------------------------------------------------------------------------ statements

STATEMENT_NAME = "segment.json"
"""The file name a signed statement is signed under (:func:`sign_statement`): write the statement's bytes to a file
of that name to check its bundle with the library's own command line."""


def public_key_of(private_key: PathLike, password: str | None = None) -> bytes:
    """The PEM public key (SubjectPublicKeyInfo) of a PEM elliptic-curve private key file (P-256, P-384 or P-521);
    a :class:`~phalanx.errors.ConfigError` naming ``key`` if it cannot be read as one."""
    try:
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ec
    except ImportError as exc:
        raise SigningUnavailableError(exc.name or "cryptography") from exc
    try:
        key = serialization.load_pem_private_key(Path(private_key).read_bytes(),
                                                 password.encode() if password else None)
    except (OSError, ValueError, TypeError) as exc:
        raise ConfigError("key", str(private_key), "a PEM elliptic-curve private key (P-256, P-384 or P-521)",
                          f"{type(exc).__name__}: {_one_line(str(exc)) or 'unreadable'}") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey) or key.curve.name not in ("secp256r1", "secp384r1",
                                                                                  "secp521r1"):
        raise ConfigError("key", str(private_key), "a PEM elliptic-curve private key (P-256, P-384 or P-521)")
    return key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


def fingerprint(public_pem: bytes) -> str:
    """SHA-256 (hex) of a PEM public key's bytes: the key hint model-signing writes into a bundle (its verification
    material), so a bundle names the key that made it."""
    return hashlib.sha256(public_pem).hexdigest()


def sign_statement(statement: bytes, key: PathLike, password: str | None = None) -> str:
    """A Sigstore bundle (JSON text) signing ``statement`` with the elliptic-curve private key ``key``.

    It is exactly the library's signature of a file named :data:`STATEMENT_NAME` holding these bytes (an in-toto
    statement listing the file's SHA-256, in a DSSE envelope signed with ECDSA), so a third party checks it with
    ``model_signing verify key segment.json --signature segment.sig --public_key PUB.pem``; no signature scheme of
    Phalanx's own."""
    hashing, signing, _ = _library()
    config = signing.Config().set_hashing_config(
        hashing.Config().use_file_serialization(hashing_algorithm="sha256", allow_symlinks=False))
    try:
        config.use_elliptic_key_signer(private_key=key, password=password.encode() if password else None)
    except Exception as exc:
        raise ConfigError("key", str(key), "a PEM elliptic-curve private key (P-256, P-384 or P-521)",
                          f"{type(exc).__name__}: {_one_line(str(exc)) or 'unreadable'}") from None
    with tempfile.TemporaryDirectory(prefix="phalanx-statement-") as tmp:
        path, out = Path(tmp) / STATEMENT_NAME, Path(tmp) / "statement.sig"
        path.write_bytes(statement)
        config.sign(path, out)
        return out.read_text(encoding="utf-8")


def verify_statement(statement: bytes, bundle: str, public_key: PathLike | bytes) -> str | None:
    """Whether ``bundle`` (from :func:`sign_statement`) is a signature of ``statement`` by the private key paired
    with ``public_key`` (a PEM file, or its bytes): ``None`` if it is, else what is wrong, in words (another key, an
    altered statement or signature, not a bundle)."""
    _, _, verifying = _library()
    with tempfile.TemporaryDirectory(prefix="phalanx-statement-") as tmp:
        if isinstance(public_key, bytes):
            pem = Path(tmp) / "public.pem"
            pem.write_bytes(public_key)
            public_key = pem
        path, sig = Path(tmp) / STATEMENT_NAME, Path(tmp) / "statement.sig"
        path.write_bytes(statement)
        sig.write_text(bundle, encoding="utf-8")
        try:
            config = verifying.Config().use_elliptic_key_verifier(public_key=public_key)
        except Exception as exc:
            raise ConfigError("key", str(public_key), "a PEM elliptic-curve public key (P-256, P-384 or P-521)",
                              f"{type(exc).__name__}: {_one_line(str(exc)) or 'unreadable'}") from None
        try:
            config.verify(path, sig)
        except Exception as exc:
            message = _one_line(str(exc))
            if message.startswith("Key mismatch"):
                return "signed by another key"
            if type(exc).__name__ == "InvalidSignature":
                return "its signature does not verify (altered, or made by another key)"
            if message.startswith("Signature mismatch"):
                return "the statement differs from the one signed"
            return f"not a readable signature ({type(exc).__name__}: {message})"
    return None
