"""Step 1 of a real federation (README.md): a throw-away CA, the SuperLink's TLS certificate it signs, and each
SuperNode's authentication key pair — made with the ``cryptography`` package (``pip install cryptography``; Flower
depends on it already).

    python make_keys.py keys --host 127.0.0.1 --nodes 5

writes ``keys/ca.crt`` (what every SuperNode and the ``flwr`` CLI trust), ``keys/server.pem`` and
``keys/server.key`` (the SuperLink's certificate, for ``--host``, and its private key), and for each node i
``keys/node<i>`` (its private key, OpenSSH format, for ``flower-supernode --auth-supernode-private-key``) and
``keys/node<i>.pub`` (its public key, for ``flwr supernode register``). Keys are NIST P-384 elliptic-curve keys, the
kind Flower 1.42's SuperNode authentication takes; the certificates are valid for ``--days`` days. For a test or a
demonstration on one machine: a real deployment's CA is not a file next to the app.
"""

from __future__ import annotations

import argparse
import datetime
import ipaddress
import os
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _host_name(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def make_tls(directory: Path, host: str = "127.0.0.1", days: int = 1) -> dict[str, Path]:
    """A CA and a server certificate it signed for ``host`` (an IP address or a DNS name); their paths."""
    directory.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.timezone.utc)
    start, end = now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=days)
    ca_key = ec.generate_private_key(ec.SECP384R1())
    usage = x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
                          key_encipherment=False, data_encipherment=False, key_agreement=False, encipher_only=False,
                          decipher_only=False)
    ca = (x509.CertificateBuilder().subject_name(_name("phalanx flower-app CA")).issuer_name(_name("phalanx "
          "flower-app CA")).public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(start).not_valid_after(end)
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(usage, critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP384R1())
    cert = (x509.CertificateBuilder().subject_name(_name(host)).issuer_name(ca.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(start).not_valid_after(end)
            .add_extension(x509.SubjectAlternativeName([_host_name(host)]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    paths = {"ca": directory / "ca.crt", "cert": directory / "server.pem", "key": directory / "server.key"}
    paths["ca"].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths["cert"].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    _write_private(paths["key"], key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                   serialization.NoEncryption()))
    return paths


def _write_private(path: Path, data: bytes) -> None:
    """A private key written readable by its owner only from its first byte (created 0600, never through a link
    planted at its name: the old file is removed first, and O_EXCL refuses one that appears meanwhile)."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)


def make_node_key(directory: Path, name: str) -> tuple[Path, Path]:
    """A SuperNode's key pair: ``directory/name`` (OpenSSH private key) and ``directory/name.pub``."""
    directory.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP384R1())
    private, public = directory / name, directory / f"{name}.pub"
    _write_private(private, key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                              serialization.NoEncryption()))
    public.write_bytes(key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                                     serialization.PublicFormat.OpenSSH))
    return private, public


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("directory", type=Path)
    p.add_argument("--host", default="127.0.0.1", help="the SuperLink's address in its certificate")
    p.add_argument("--nodes", type=int, default=5, help="how many SuperNode key pairs (node0 … node<n-1>)")
    p.add_argument("--days", type=int, default=1)
    args = p.parse_args()
    for path in make_tls(args.directory, args.host, args.days).values():
        print(path)
    for i in range(args.nodes):
        for path in make_node_key(args.directory, f"node{i}"):
            print(path)


if __name__ == "__main__":
    main()
