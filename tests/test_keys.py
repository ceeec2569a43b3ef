"""Identities of a keyed job: `phalanx keys init` / `rotate`, and every bad key directory refused in one line naming
the file, before any process starts."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from _fifo import unblocked
from phalanx.cli import app
from phalanx.distributed.keys import ALLOW_LIST, AllowList, init_keys, key_file, load_identity, rotate_key
from phalanx.errors import ConfigError

runner = CliRunner()


def test_init_writes_one_private_key_per_rank_0600_and_a_public_allow_list(tmp_path: Path) -> None:
    allow = init_keys(tmp_path / "k", 4)
    assert allow.size == 4
    for rank in range(4):
        mode = stat.S_IMODE((tmp_path / "k" / key_file(rank)).stat().st_mode)
        assert mode == 0o600, oct(mode)
        ident = load_identity(tmp_path / "k", rank, 4)
        assert ident.rank == rank
    assert len(set(allow.by_fingerprint)) == 4  # four different keys
    assert b"PRIVATE" not in (tmp_path / "k" / ALLOW_LIST).read_bytes()


def test_the_command_line_makes_and_rotates_keys(tmp_path: Path) -> None:
    res = runner.invoke(app, ["keys", "init", str(tmp_path / "k"), "--workers", "3"])
    assert res.exit_code == 0, res.output
    before = AllowList.load(tmp_path / "k" / ALLOW_LIST)
    again = runner.invoke(app, ["keys", "init", str(tmp_path / "k"), "--workers", "3"])
    assert again.exit_code != 0 and "--force" in str(again.exception)
    res = runner.invoke(app, ["keys", "rotate", str(tmp_path / "k"), "--rank", "1"])
    assert res.exit_code == 0, res.output
    after = AllowList.load(tmp_path / "k" / ALLOW_LIST)
    assert after.by_rank[0] == before.by_rank[0] and after.by_rank[2] == before.by_rank[2]
    assert after.by_rank[1] != before.by_rank[1]
    load_identity(tmp_path / "k", 1, 3)  # the new key matches the new list


def test_an_old_key_after_rotation_is_refused(tmp_path: Path) -> None:
    init_keys(tmp_path / "k", 2)
    old = (tmp_path / "k" / key_file(1)).read_bytes()
    rotate_key(tmp_path / "k", 1)
    (tmp_path / "k" / key_file(1)).write_bytes(old)
    with pytest.raises(ConfigError, match=r"not the key .* gives rank 1"):
        load_identity(tmp_path / "k", 1, 2)


def _edit_allow_list(directory: Path, edit: object) -> None:
    path = directory / ALLOW_LIST
    raw = json.loads(path.read_text())
    edit(raw)  # type: ignore[operator]
    path.write_text(json.dumps(raw))


@pytest.mark.parametrize("mode", [0o640, 0o620, 0o604, 0o610])
def test_a_private_key_group_or_others_may_use_is_refused(tmp_path: Path, mode: int) -> None:
    """docs/security.md, Keys: private keys are refused if group or others may read them, not only world-readable
    ones (0644, the case above): any group or other bit is a one-line refusal that says how to fix it."""
    init_keys(tmp_path / "k", 3)
    os.chmod(tmp_path / "k" / key_file(1), mode)
    with pytest.raises(ConfigError, match=f"readable by other users \\(mode {mode:04o}\\)") as info:
        load_identity(tmp_path / "k", 1, 3)
    assert "\n" not in str(info.value) and "chmod 600" in str(info.value)


@pytest.mark.parametrize(("damage", "message"), [
    ("missing_key", "rank-1.key.*cannot be read"),
    ("public_in_place_of_private", "holds a public key or a certificate"),
    ("readable_by_others", "readable by other users"),
    ("garbage_key", "not an unencrypted PEM private key"),
    ("someone_elses_key", "it is rank 2's"),
    ("duplicate_rank", "rank 0 is listed twice"),
    ("duplicate_key", "have the same key"),
    ("not_json", "not readable as JSON"),
    ("missing_allow_list", "allow-list.json.*cannot be read"),
    ("wrong_size", "exactly 4 ranks"),
    ("no_directory", "does not exist"),
])
def test_bad_key_directories_are_one_line_errors_naming_the_file(tmp_path: Path, damage: str, message: str) -> None:
    d = tmp_path / "k"
    init_keys(d, 3)
    size = 3
    if damage == "missing_key":
        (d / key_file(1)).unlink()
    elif damage == "public_in_place_of_private":
        (d / key_file(1)).write_text(json.loads((d / ALLOW_LIST).read_text())["ranks"][1]["certificate"])
        os.chmod(d / key_file(1), 0o600)
    elif damage == "readable_by_others":
        os.chmod(d / key_file(1), 0o644)
    elif damage == "garbage_key":
        (d / key_file(1)).write_text("-----BEGIN PRIVATE KEY-----\nnot a key\n-----END PRIVATE KEY-----\n")
    elif damage == "someone_elses_key":
        (d / key_file(1)).write_bytes((d / key_file(2)).read_bytes())
    elif damage == "duplicate_rank":
        _edit_allow_list(d, lambda raw: raw["ranks"].__setitem__(1, {**raw["ranks"][1], "rank": 0}))
    elif damage == "duplicate_key":
        _edit_allow_list(d, lambda raw: raw["ranks"].__setitem__(2, {**raw["ranks"][1], "rank": 2,
                                                                     "fingerprint": None}))
    elif damage == "not_json":
        (d / ALLOW_LIST).write_text("{not json")
    elif damage == "missing_allow_list":
        (d / ALLOW_LIST).unlink()
    elif damage == "wrong_size":
        size = 4
    elif damage == "no_directory":
        d = tmp_path / "nowhere"
    with pytest.raises(ConfigError, match=message) as info:
        load_identity(d, 1, size)
    assert "\n" not in str(info.value)


def test_a_key_file_planted_as_a_fifo_is_refused_in_one_line_without_blocking(tmp_path: Path) -> None:
    """Before, ``stat`` (size 0) then ``read_bytes`` by name: the load blocked for ever on the FIFO (a writer from the
    test side unblocks a regressed reader: :func:`_fifo.unblocked`)."""
    init_keys(tmp_path / "k", 3)
    key = tmp_path / "k" / key_file(1)
    key.unlink()
    os.mkfifo(key, 0o600)
    got, blocked = unblocked(lambda: load_identity(tmp_path / "k", 1, 3), key)
    assert not blocked, "loading the key blocked on the FIFO"
    assert isinstance(got, ConfigError) and str(key) in str(got) and "not a regular file" in str(got), got
    assert "\n" not in str(got)


ZERO_KEY = """
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))  # (the old reader: a MemoryError, not the machine's RAM)
from phalanx.distributed.keys import load_identity
from phalanx.errors import ConfigError
try:
    load_identity(sys.argv[1], 1, 3)
except ConfigError as exc:
    print(exc)
"""


def test_a_key_file_that_links_to_dev_zero_is_refused_unread(tmp_path: Path) -> None:
    """A link is followed (the user named the directory), and its target checked on the descriptor read: a device
    is refused in one line, unread. Before, ``stat`` said 0 bytes and ``read_bytes`` read ``/dev/zero`` until memory
    ran out (played in a child under a 1 GiB address-space limit and a timeout)."""
    init_keys(tmp_path / "k", 3)
    key = tmp_path / "k" / key_file(1)
    key.unlink()
    os.symlink("/dev/zero", key)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[1] / "src"),
                                                        os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", ZERO_KEY, str(tmp_path / "k")], capture_output=True, text=True,
                         timeout=120, env=env)
    assert out.returncode == 0 and out.stdout.count("\n") == 1, (out.returncode, out.stdout, out.stderr[-2000:])
    assert str(key) in out.stdout and "not a regular file" in out.stdout, out.stdout


def test_launch_refuses_a_bad_key_before_any_process_starts(tmp_path: Path) -> None:
    init_keys(tmp_path / "k", 4)
    (tmp_path / "k" / key_file(3)).unlink()
    res = runner.invoke(app, ["launch", "--workers", "4", "--keys", str(tmp_path / "k"), "--set", "aggregator='cwtm'",
                              "--set", "f=1", "--set", "byzantine=0", "--set", "rounds=2", "--out",
                              str(tmp_path / "out")])
    assert res.exit_code != 0
    assert "rank-3.key" in str(res.exception)
    assert not (tmp_path / "out").exists()  # nothing started, nothing written


def test_keys_are_taken_on_every_topology_but_not_with_nccl(tmp_path: Path) -> None:
    from phalanx.experiments import make_config

    init_keys(tmp_path / "k", 4)
    for topology in ("server", "serverless"):  # (gossip: tests/test_distributed_mesh.py)
        cfg = make_config({"engine": "torchrun", "topology": topology, "workers": 4, "aggregator": "cwtm",
                           "keys": str(tmp_path / "k")})
        assert cfg.keys == str(tmp_path / "k")
    with pytest.raises(ConfigError, match=r"backend='nccl' is invalid: allowed 'auto' or 'gloo' with keys"):
        make_config({"engine": "torchrun", "topology": "serverless", "workers": 4, "aggregator": "cwtm",
                     "backend": "nccl", "keys": str(tmp_path / "k")})


def test_keys_change_no_run_id(tmp_path: Path) -> None:
    from phalanx.experiments import grid, make_config

    plain = make_config({"engine": "torchrun", "workers": 4, "aggregator": "cwtm", "f": 1})
    keyed = make_config({"engine": "torchrun", "workers": 4, "aggregator": "cwtm", "f": 1, "keys": str(tmp_path)})
    assert grid.run_id(plain) == grid.run_id(keyed)


def _mint_leaf(issuer_dir: Path, issuer_rank: int, tmp: Path) -> tuple[str, str]:
    """A certificate for a fresh key, signed by ``issuer_rank``'s key as its issuer (what a rank holding its own key
    can make): the PEM files (leaf + issuer chain, key)."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519
    from cryptography.x509.oid import NameOID

    issuer_key = serialization.load_pem_private_key((issuer_dir / key_file(issuer_rank)).read_bytes(), None)
    issuer_pem = AllowList.load(issuer_dir / ALLOW_LIST).by_rank[issuer_rank]
    issuer = x509.load_pem_x509_certificate(issuer_pem.encode())
    key = ed25519.Ed25519PrivateKey.generate()
    now = datetime.datetime.now(datetime.timezone.utc)
    leaf = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "minted")]))
            .issuer_name(issuer.subject).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1)).not_valid_after(now + datetime.timedelta(days=1))
            .sign(issuer_key, None))  # type: ignore[arg-type]
    chain, secret = tmp / "minted.pem", tmp / "minted.key"
    chain.write_text(leaf.public_bytes(serialization.Encoding.PEM).decode() + issuer_pem)
    secret.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                         serialization.NoEncryption()))
    return str(chain), str(secret)


@pytest.mark.parametrize("certificates", ["leaves", "mutant"])
def test_a_certificate_minted_by_a_listed_key_fails_the_handshake(
    tmp_path: Path, certificates: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Rank 1, with its own key, signs a certificate for a key of its own making and offers it to rank 0's listener.
    The allow-list's certificates are leaves (CA:FALSE): OpenSSL refuses the chain at the handshake. The mutant — the
    CA:TRUE certificates of before issue 33 — lets the minted certificate through the handshake (it is caught only
    afterwards, by its fingerprint)."""
    import socket
    import ssl
    import time

    from cryptography import x509

    from phalanx.distributed import keys as keys_module
    from phalanx.distributed.channel import client_context
    from phalanx.distributed.keys import Identity
    from phalanx.distributed.sealed import SealedLinks

    if certificates == "mutant":
        def ca_true(key: object, rank: int) -> object:
            import datetime

            from cryptography.x509.oid import NameOID

            name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"phalanx rank {rank}")])
            now = datetime.datetime.now(datetime.timezone.utc)
            return (x509.CertificateBuilder().subject_name(name).issuer_name(name)
                    .public_key(key.public_key())  # type: ignore[attr-defined]
                    .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=1))
                    .not_valid_after(now + datetime.timedelta(days=9))
                    .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
                    .sign(key, None))  # type: ignore[arg-type]

        monkeypatch.setattr(keys_module, "_certificate", ca_true)
    d = tmp_path / "k"
    allow = init_keys(d, 3)
    for pem in allow.by_rank.values():
        constraints = x509.load_pem_x509_certificate(pem.encode()).extensions.get_extension_for_class(
            x509.BasicConstraints).value
        assert constraints.ca is (certificates == "mutant")
    if certificates == "mutant":
        with pytest.raises(ConfigError, match="is a CA \\(CA:TRUE\\)"):
            load_identity(d, 0, 3)  # a job refuses such a list …
        assert AllowList.load(d / ALLOW_LIST).authorities == (0, 1, 2)  # … an audit still reads it
        from cryptography.hazmat.primitives import serialization

        identity = Identity(0, d / key_file(0), serialization.load_pem_private_key((d / key_file(0)).read_bytes(),
                                                                                   None), allow)
    else:
        identity = load_identity(d, 0, 3)
    server = SealedLinks(identity, "127.0.0.1", 0, "c", 16, 3)
    server.offer({"config": "c", "round": 0, "streams": {}, "momentum": None})
    try:
        ctx = client_context(load_identity(d, 2, 3)) if certificates == "leaves" else ssl.SSLContext(
            ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
        ctx.load_cert_chain(*_mint_leaf(d, 1, tmp_path))
        try:
            tls = ctx.wrap_socket(socket.create_connection(("127.0.0.1", server.port)))
            tls.sendall(b"x" * 40)
            tls.recv(1)
        except (ssl.SSLError, OSError):
            pass
        deadline = time.monotonic() + 20.0
        while not server.rejections and time.monotonic() < deadline:
            time.sleep(0.01)
        reason = server.rejections[0].reason
        if certificates == "leaves":
            assert "TLS handshake" in reason and "failed" in reason, reason
        else:
            assert "its certificate is not on the allow-list" in reason, reason  # past the handshake
        assert server.rejections[0].rank is None and server.up == {} and server.down == {}
    finally:
        server.close()
