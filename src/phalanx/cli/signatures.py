"""Signed results: ``phalanx keygen``, ``phalanx sign`` and ``phalanx verify``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from phalanx.cli.common import app, console


@app.command("keygen")
def keygen_cmd(
    private: Annotated[Path, typer.Argument(help="Where to write the private key (PEM, mode 0600).")],
    public: Annotated[Path, typer.Argument(help="Where to write the public key (PEM).")],
    curve: Annotated[str, typer.Option("--curve", help="P-256, P-384 or P-521.")] = "P-256",
) -> None:
    """Make an elliptic-curve key pair for `phalanx sign` / `phalanx verify` (neither file may exist)."""
    from phalanx import signing

    key, pub = signing.keygen(private, public, curve=curve)
    console.print(f"private key {key} (keep it to yourself), public key {pub}", soft_wrap=True)


@app.command("sign")
def sign_cmd(
    run_dir: Annotated[Path, typer.Argument(help="A run directory (sign it once it has finished).")],
    key: Annotated[Path | None, typer.Option("--key", help="PEM private key (phalanx keygen).")] = None,
    certificate: Annotated[Path | None, typer.Option("--certificate", help="The key's X.509 signing "
                                                                            "certificate (PEM).")] = None,
    chain: Annotated[list[Path] | None, typer.Option("--chain", help="Certificates between it and the CA "
                                                                     "(repeatable).")] = None,
    keyless: Annotated[bool, typer.Option("--keyless", help="Sigstore keyless signing (needs the network).")] = False,
) -> None:
    """Sign every file of a run directory (model-signing: an in-toto statement of per-file SHA-256, in phalanx.sig)."""
    from phalanx import signing

    if key is None and not keyless:
        raise typer.BadParameter("give --key KEY.pem (or --keyless for Sigstore, which needs the network)")
    path = signing.sign(run_dir, key, certificate=certificate, certificate_chain=tuple(chain or ()), keyless=keyless)
    console.print(f"signed {len(signing.covered_files(run_dir))} files of {run_dir} → {path}", soft_wrap=True)
    if key is not None:  # what the signature vouches for, beyond the bytes
        from phalanx.experiments import provenance

        found = provenance.inspect(run_dir, signing.public_key_of(key))
        if not found.proven:
            console.print(f"note: {found.lines()[0]} — the signature vouches for these files, not for how they were "
                          "trained; `phalanx verify` says so (exit 1)", soft_wrap=True, highlight=False)


@app.command("verify")
def verify_cmd(
    run_dir: Annotated[Path, typer.Argument(help="A signed run directory.")],
    key: Annotated[Path | None, typer.Option("--key", help="PEM public key paired with the signing key.")] = None,
    chain: Annotated[list[Path] | None, typer.Option("--chain", help="Trusted CA certificates (certificate mode, "
                                                                     "repeatable).")] = None,
    identity: Annotated[str | None, typer.Option("--identity", help="Keyless: the signer's identity.")] = None,
    issuer: Annotated[str | None, typer.Option("--issuer", help="Keyless: its OpenID Connect issuer.")] = None,
) -> None:
    """Check a run directory against its signature, then (with --key) its provenance: which rounds were trained
    under the key. Exit 0: the files are the signed ones and every round was trained under the key; 1: the files are
    the signed ones, but not every round is proven to be trained under the key (the lines say which); 2: the
    signature does not hold (one line)."""
    from phalanx import signing
    from phalanx.experiments import provenance

    signing.verify(run_dir, key, certificate_chain=None if chain is None else tuple(chain), identity=identity,
                   oidc_issuer=issuer)
    named = _named(run_dir)  # the signed config.json: which run the folder holds, its name checked against it
    console.print(f"{run_dir}: signature verified ({len(signing.covered_files(run_dir))} files): they are the files "
                  f"that were signed{named}", soft_wrap=True, highlight=False, markup=False)
    if key is None:
        console.print("provenance: not checked (each training session is signed with the run's sign_key: check it "
                      "with --key PUB.pem)", soft_wrap=True, highlight=False)
        return
    found = provenance.inspect(run_dir, key)
    for line in found.lines():
        console.print(line, soft_wrap=True, highlight=False, markup=False)
    if not found.proven:
        raise typer.Exit(1)


def _named(run_dir: Path) -> str:
    """What ``phalanx verify`` says of the run a signed folder holds: ``, of the run RUN_ID (seed N)`` from its
    ``config.json`` ("" where there is none, or it is not a run config's); a folder named as another run's id (two
    seeds' folders swapped: each signature holds) is a one-line ConfigError naming it
    (:func:`~phalanx.experiments.validrun.check_named`)."""
    from phalanx.experiments import runfiles
    from phalanx.experiments.validrun import check_named

    if not (run_dir / "config.json").is_file():
        return ""
    recorded = runfiles.read_json_object(run_dir / "config.json")
    named = check_named(run_dir, recorded)
    return "" if named is None else f", of the run {named} (seed {str(recorded.get('seed'))[:20]})"
