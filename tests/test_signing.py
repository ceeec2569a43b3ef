"""Signed run directories (phalanx.signing): keys, signing a real run, and every kind of tampering refused.

Everything here runs offline: elliptic-key and certificate signing are local; keyless Sigstore signing is only
checked to fail with a clear error (its success needs the network and an identity).
"""

from __future__ import annotations

import base64
import datetime
import json
import os
import pickle
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("model_signing")

from cryptography import x509  # a dependency of model-signing
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from phalanx import signing
from phalanx.errors import ConfigError, PhalanxError
from phalanx.experiments import make_config, train
from phalanx.signing import SIGNATURE, SignatureError, SigningUnavailableError

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("trained") / "run"
    train(make_config({"dataset": "digits", "model": "logreg", "workers": 4, "rounds": 2, "eval_every": 1}), out)
    return out


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("keys")
    return signing.keygen(d / "key.pem", d / "key.pub")


@pytest.fixture
def run(trained: Path, tmp_path: Path) -> Path:
    out = tmp_path / "run"
    shutil.copytree(trained, out)
    return out


@pytest.fixture
def signed(run: Path, keys: tuple[Path, Path]) -> Path:
    signing.sign(run, keys[0])
    return run


def _fails(run: Path, key: Path) -> str:
    with pytest.raises(SignatureError) as info:
        signing.verify(run, key)
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith(f"{run}: signature verification failed")
    return msg


# --------------------------------------------------------------------------------------------------------- keys


def test_keygen_writes_a_p256_pair_private_0600_and_never_overwrites(tmp_path: Path) -> None:
    private, public = signing.keygen(tmp_path / "k.pem", tmp_path / "k.pub")
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
    assert stat.S_IMODE(public.stat().st_mode) == 0o644
    key = serialization.load_pem_private_key(private.read_bytes(), None)
    assert isinstance(key, ec.EllipticCurvePrivateKey) and key.curve.name == "secp256r1"
    assert serialization.load_pem_public_key(public.read_bytes()) == key.public_key()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["k.pem", "k.pub"]  # no temporary file left

    before = private.read_bytes()
    with pytest.raises(ConfigError, match=r"k\.pem"):
        signing.keygen(private, tmp_path / "other.pub")
    with pytest.raises(ConfigError, match=r"k\.pub"):
        signing.keygen(tmp_path / "other.pem", public)
    assert private.read_bytes() == before and not (tmp_path / "other.pem").exists()
    with pytest.raises(ConfigError, match="curve"):
        signing.keygen(tmp_path / "a.pem", tmp_path / "a.pub", curve="P-192")


def test_keygen_password_and_larger_curve(tmp_path: Path, run: Path) -> None:
    private, public = signing.keygen(tmp_path / "k.pem", tmp_path / "k.pub", curve="P-384", password="s3cret")
    assert b"ENCRYPTED" in private.read_bytes()
    with pytest.raises(ConfigError, match="key"):
        signing.sign(run, private)  # encrypted, no password
    signing.sign(run, private, password="s3cret")
    signing.verify(run, public)


# ---------------------------------------------------------------------------------------------------- sign/verify


def test_a_signed_run_verifies_and_the_bundle_is_an_in_toto_statement(signed: Path, keys: tuple[Path, Path]) -> None:
    signing.verify(signed, keys[1])
    bundle = json.loads((signed / SIGNATURE).read_text())
    assert bundle["mediaType"] == "application/vnd.dev.sigstore.bundle.v0.3+json"
    envelope = bundle["dsseEnvelope"]
    assert envelope["payloadType"] == "application/vnd.in-toto+json"
    statement = json.loads(base64.b64decode(envelope["payload"]))
    assert statement["_type"] == "https://in-toto.io/Statement/v1"
    assert statement["predicateType"] == "https://model_signing/signature/v1.0"
    names = sorted(r["name"] for r in statement["predicate"]["resources"])
    assert names == signing.covered_files(signed)
    assert {"checkpoint.safetensors", "config.json", "manifest.json", "metrics.jsonl", "DONE"} <= set(names)
    assert SIGNATURE not in names and SIGNATURE in statement["predicate"]["serialization"]["ignore_paths"]
    assert sorted(p.name for p in signed.iterdir() if p.name.endswith(".tmp")) == []


def test_the_librarys_own_cli_verifies_the_bundle(signed: Path, keys: tuple[Path, Path]) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "model_signing", "verify", "key", str(signed), "--signature", str(signed / SIGNATURE),
         "--public_key", str(keys[1])], capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def _flip_checkpoint_byte(run: Path) -> None:
    path = run / "checkpoint.safetensors"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def _append(path: Path, text: str) -> None:
    with path.open("a") as fh:
        fh.write(text)


def _edit_config(run: Path) -> None:
    path = run / "config.json"
    cfg = json.loads(path.read_text())
    cfg["rounds"] = 3
    path.write_text(json.dumps(cfg))


TAMPERINGS = {
    "checkpoint byte": (_flip_checkpoint_byte, "changed: checkpoint.safetensors"),
    "metrics appended": (lambda r: _append(r / "metrics.jsonl", '{"round": 9}\n'), "changed: metrics.jsonl"),
    "file deleted": (lambda r: (r / "metrics.parquet").unlink(), "missing: metrics.parquet"),
    "file added": (lambda r: (r / "extra.safetensors").write_bytes(b"x"), "added (not signed): extra.safetensors"),
    "config edited": (_edit_config, "changed: config.json"),
    "file in a new sub-directory": (lambda r: ((r / "sub").mkdir(), (r / "sub" / "a").write_text("a")),
                                    "added (not signed): sub/a"),
}


@pytest.mark.parametrize("tamper", list(TAMPERINGS))
def test_every_tampering_is_refused_naming_the_file(signed: Path, keys: tuple[Path, Path], tamper: str) -> None:
    change, expected = TAMPERINGS[tamper]
    change(signed)
    msg = _fails(signed, keys[1])
    assert expected in msg, msg
    assert "restore the directory from a trusted copy" in msg


def test_several_changes_are_all_named(signed: Path, keys: tuple[Path, Path]) -> None:
    _edit_config(signed)
    (signed / "DONE").unlink()
    (signed / "notes.txt").write_text("hi")
    msg = _fails(signed, keys[1])
    assert "changed: config.json" in msg and "missing: DONE" in msg and "added (not signed): notes.txt" in msg


def test_transient_files_are_not_covered(signed: Path, keys: tuple[Path, Path]) -> None:
    (signed / ".metrics.jsonl.abc123.tmp").write_text("half-written")
    (signed / "run.lock").write_text("")
    signing.verify(signed, keys[1])
    assert ".metrics.jsonl.abc123.tmp" not in signing.covered_files(signed)


def test_resigning_after_a_change_verifies_again(signed: Path, keys: tuple[Path, Path]) -> None:
    _edit_config(signed)
    _fails(signed, keys[1])
    assert signing.sign(signed, keys[0]) == signed / SIGNATURE
    signing.verify(signed, keys[1])


def test_another_public_key_is_refused(signed: Path, tmp_path: Path) -> None:
    _, other = signing.keygen(tmp_path / "o.pem", tmp_path / "o.pub")
    msg = _fails(signed, other)
    assert f"{SIGNATURE} was made by another key than {other}" in msg


def test_a_missing_signature_is_refused_clearly(run: Path, keys: tuple[Path, Path]) -> None:
    msg = _fails(run, keys[1])
    assert f"no signature ({SIGNATURE} is missing)" in msg and "phalanx sign" in msg


def test_an_altered_statement_is_refused(signed: Path, keys: tuple[Path, Path]) -> None:
    """Rewriting the signed list (to hide an edit) breaks the signature itself."""
    path = signed / SIGNATURE
    bundle = json.loads(path.read_text())
    statement = json.loads(base64.b64decode(bundle["dsseEnvelope"]["payload"]))
    statement["predicate"]["resources"] = [r for r in statement["predicate"]["resources"] if r["name"] != "DONE"]
    bundle["dsseEnvelope"]["payload"] = base64.b64encode(json.dumps(statement).encode()).decode()
    path.write_text(json.dumps(bundle))
    (signed / "DONE").unlink()
    msg = _fails(signed, keys[1])
    assert "does not match the statement it signs" in msg


def test_a_garbled_signature_is_refused(signed: Path, keys: tuple[Path, Path]) -> None:
    (signed / SIGNATURE).write_text("not a bundle")
    assert "not a readable Sigstore bundle" in _fails(signed, keys[1])


def test_bad_arguments_are_config_errors(run: Path, keys: tuple[Path, Path], tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="key"):
        signing.sign(run)
    with pytest.raises(ConfigError, match="run_dir"):
        signing.sign(tmp_path / "nope", keys[0])
    with pytest.raises(ConfigError, match=r"nope\.pem"):
        signing.sign(run, tmp_path / "nope.pem")
    with pytest.raises(ConfigError, match="keyless"):
        signing.sign(run, keys[0], keyless=True)
    with pytest.raises(ConfigError, match="exactly one"):
        signing.verify(run)
    with pytest.raises(ConfigError, match="exactly one"):
        signing.verify(run, keys[1], certificate_chain=[keys[1]])
    rsa_key = tmp_path / "rsa.pem"
    rsa_key.write_bytes(rsa.generate_private_key(public_exponent=65537, key_size=2048).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    with pytest.raises(ConfigError, match="elliptic-curve"):
        signing.sign(run, rsa_key)
    assert not (run / SIGNATURE).exists()


def test_errors_pickle() -> None:
    err = SignatureError("runs/x", "no signature", "sign it")
    back = pickle.loads(pickle.dumps(err))
    assert isinstance(back, SignatureError) and str(back) == str(err) and back.run_dir == "runs/x"
    missing = pickle.loads(pickle.dumps(SigningUnavailableError("model_signing")))
    assert isinstance(missing, ImportError) and "phalanx[signing]" in str(missing)


# --------------------------------------------------------------------------------------------------- certificates


def _cert(subject: str, key: ec.EllipticCurvePrivateKey, issuer: tuple[str, ec.EllipticCurvePrivateKey] | None,
          days_back: int) -> x509.Certificate:
    now = datetime.datetime.now(datetime.timezone.utc)
    issuer_name, issuer_key = issuer or (subject, key)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
        .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer_name)]))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=days_back))
        .not_valid_after(now + datetime.timedelta(days=30))
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_key.public_key()), critical=False)
    )
    if issuer is None:  # a CA
        builder = builder.add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True).add_extension(
            x509.KeyUsage(digital_signature=False, content_commitment=False, key_encipherment=False,
                          data_encipherment=False, key_agreement=False, key_cert_sign=True, crl_sign=True,
                          encipher_only=False, decipher_only=False), critical=True)
    else:
        builder = builder.add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True).add_extension(
            x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                          data_encipherment=False, key_agreement=False, key_cert_sign=False, crl_sign=False,
                          encipher_only=False, decipher_only=False), critical=True).add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CODE_SIGNING]), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def _pem(path: Path, cert: x509.Certificate) -> Path:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return path


def test_certificate_mode_signs_offline_and_checks_the_chain(run: Path, tmp_path: Path) -> None:
    ca_key, other_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca = _pem(tmp_path / "ca.pem", _cert("Phalanx test CA", ca_key, None, days_back=2))
    other_ca = _pem(tmp_path / "other-ca.pem", _cert("Another CA", other_key, None, days_back=2))
    leaf_private, _ = signing.keygen(tmp_path / "leaf.pem", tmp_path / "leaf.pub")
    leaf_key = serialization.load_pem_private_key(leaf_private.read_bytes(), None)
    assert isinstance(leaf_key, ec.EllipticCurvePrivateKey)
    leaf = _pem(tmp_path / "leaf.crt", _cert("signer@example.org", leaf_key, ("Phalanx test CA", ca_key), 1))

    signing.sign(run, leaf_private, certificate=leaf, certificate_chain=[ca])
    signing.verify(run, certificate_chain=[ca])

    with pytest.raises(SignatureError, match="does not chain to the trusted certificates"):
        signing.verify(run, certificate_chain=[other_ca])
    _edit_config(run)
    with pytest.raises(SignatureError, match=r"changed: config\.json"):
        signing.verify(run, certificate_chain=[ca])
    other_private, _ = signing.keygen(tmp_path / "x.pem", tmp_path / "x.pub")
    with pytest.raises(ConfigError, match="certificate"):  # the certificate is not the key's
        signing.sign(run, other_private, certificate=leaf, certificate_chain=[ca])


# -------------------------------------------------------------------------------------- offline and missing extra


def _python(code: str, tmp_path: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache"), XDG_DATA_HOME=str(tmp_path / "data"),
               PYTHONPATH=str(ROOT / "src"))
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, env=env,
                          stdin=subprocess.DEVNULL, cwd=tmp_path)


def test_keyless_sigstore_fails_clearly_offline(signed: Path, tmp_path: Path) -> None:
    """Keyless signing and verification need Sigstore's services; offline (or with a bogus identity token, online)
    they fail with a SignatureError, not a traceback or a hang."""
    code = f"""
from phalanx.signing import SignatureError, sign, verify
for call in (lambda: sign({str(signed)!r}, keyless=True, identity_token="not-a-token"),
             lambda: verify({str(signed)!r}, identity="a@example.org", oidc_issuer="https://accounts.google.com")):
    try:
        call()
    except SignatureError as exc:
        print("ERR", exc)
    else:
        print("NO ERROR")
"""
    try:
        done = _python(code, tmp_path, timeout=240)
    except subprocess.TimeoutExpired:
        pytest.skip("the network neither answered nor refused within 240 s (Sigstore's TUF client retries)")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 2 and all(line.startswith(f"ERR {signed}: ") for line in lines), done.stdout
    assert "signing failed" in lines[0] and "signature verification failed" in lines[1]


def test_without_the_extra_import_works_and_calls_say_how_to_install(signed: Path, tmp_path: Path) -> None:
    code = f"""
import sys
sys.modules["model_signing"] = None
from phalanx import signing
from phalanx.errors import PhalanxError
for call in (lambda: signing.sign({str(signed)!r}, "k.pem"), lambda: signing.verify({str(signed)!r}, "k.pub")):
    try:
        call()
    except signing.SigningUnavailableError as exc:
        assert isinstance(exc, PhalanxError) and isinstance(exc, ImportError)
        print(exc)
signing.keygen("k.pem", "k.pub")
print("keygen ok")
"""
    done = _python(code, tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[-1] == "keygen ok" and len(lines) == 3
    assert all("pip install 'phalanx[signing]'" in line and "model_signing" in line for line in lines[:2])


def test_phalanx_error_hierarchy() -> None:
    assert issubclass(SignatureError, PhalanxError) and issubclass(SigningUnavailableError, PhalanxError)


# ------------------------------------------------------------------------------------------------------------ docs


def test_the_python_example_of_docs_reliability_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "docs" / "reliability.md").read_text(), flags=re.S)
    monkeypatch.chdir(tmp_path)
    exec(compile(blocks[0], "docs/reliability.md:python-block", "exec"), {})
    signing.verify(tmp_path / "runs" / "signed-demo", tmp_path / "demo-key.pub")


@pytest.mark.skipif(shutil.which("openssl") is None, reason="no openssl command")
def test_the_documented_openssl_keys_work(run: Path, tmp_path: Path) -> None:
    text = (ROOT / "docs" / "reliability.md").read_text()
    commands = [line for line in text.splitlines() if line.startswith(("openssl ", "chmod "))]
    assert len(commands) == 3
    for command in commands:
        subprocess.run(command, shell=True, check=True, cwd=tmp_path, capture_output=True, timeout=60)
    assert stat.S_IMODE((tmp_path / "KEY.pem").stat().st_mode) == 0o600
    signing.sign(run, tmp_path / "KEY.pem")
    signing.verify(run, tmp_path / "PUB.pem")


# ---------------------------------------------------------------------------------------------------------------
# the config keys and the CLI
# ---------------------------------------------------------------------------------------------------------------

def test_sign_key_signs_every_finished_run_and_verify_key_guards_resume_and_reuse(tmp_path: Path) -> None:
    """`sign_key`: each finished run of a sweep carries a valid signature; `verify_key`: a sweep that meets a
    finished run whose files changed refuses to use it, and a resume of a signed directory is checked first. Neither
    key changes a run's identity (its directory name)."""
    from phalanx.experiments import grid, make_config, runner

    key, pub = signing.keygen(tmp_path / "k.pem", tmp_path / "k.pub")
    base = {"dataset": "digits", "model": "logreg", "workers": 4, "rounds": 2, "eval_every": 1,
            "aggregator": ["mean", "cwmed"]}
    cfgs = grid.configs({**base, "sign_key": str(key)})
    out = tmp_path / "sweep"
    dirs = runner.run_grid(cfgs, out)
    for d in dirs:
        signing.verify(d, pub)
    plain = grid.configs(base)
    assert [grid.run_id(c) for c in plain] == [d.name for d in dirs]
    checked = grid.configs({**base, "verify_key": str(pub)})
    runner.run_grid(checked, out)  # untouched: reused
    with (dirs[1] / "metrics.jsonl").open("a") as fh:
        fh.write("\n")
    with pytest.raises(signing.SignatureError, match=r"metrics\.jsonl"):
        runner.run_grid(checked, out)
    cfg = make_config({**base, "aggregator": "mean", "verify_key": str(pub)})
    (dirs[0] / "DONE").unlink()  # as if it had stopped: resuming verifies the signature first
    from phalanx.experiments import train

    with pytest.raises(signing.SignatureError, match="DONE"):
        train(cfg, dirs[0])


def test_cli_keygen_sign_verify(tmp_path: Path) -> None:
    from phalanx.experiments import make_config, train

    run = tmp_path / "run"
    train(make_config({"dataset": "digits", "model": "logreg", "workers": 4, "rounds": 2, "eval_every": 1}), run)

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "phalanx.cli", *args], capture_output=True, text=True,
                              timeout=300)

    assert cli("keygen", str(tmp_path / "k.pem"), str(tmp_path / "k.pub")).returncode == 0
    again = cli("keygen", str(tmp_path / "k.pem"), str(tmp_path / "other.pub"))
    assert again.returncode == 2 and "k.pem" in again.stdout + again.stderr
    signed = cli("sign", str(run), "--key", str(tmp_path / "k.pem"))
    assert signed.returncode == 0 and "note: provenance: NOT proven" in signed.stdout, signed.stdout
    # trained without a key, signed by hand: the files are the signed ones (exit 1, not 2), the training is not proven
    ok = cli("verify", str(run), "--key", str(tmp_path / "k.pub"))
    assert ok.returncode == 1 and "signature verified" in ok.stdout, ok.stdout + ok.stderr
    assert "session 1: rounds 0–2, not signed (trained without a key)" in ok.stdout
    (run / "config.json").write_text("{}")
    bad = cli("verify", str(run), "--key", str(tmp_path / "k.pub"))
    out = bad.stdout + bad.stderr
    assert bad.returncode == 2 and "changed: config.json" in out and "Traceback" not in out


def test_a_missing_key_file_is_refused_before_the_run(tmp_path: Path) -> None:
    from phalanx.experiments import make_config

    base = {"dataset": "digits", "model": "logreg", "workers": 4, "rounds": 2}
    for key in ("sign_key", "verify_key"):
        with pytest.raises(ConfigError, match=f"{key}=.* is invalid: allowed an existing PEM key file"):
            make_config({**base, key: str(tmp_path / "nowhere.pem")})
