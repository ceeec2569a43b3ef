"""A real Flower federation, no simulation engine: a local ``flower-superlink`` with TLS (a CA and a server certificate
made here with ``cryptography``) and SuperNode authentication, SuperNodes registered through the Control API with
``flwr supernode register``, five ``flower-supernode`` processes (two Byzantine through Phalanx's ClientApp mod,
chosen by their node config), one SuperNode whose key was never registered, and examples/flower-app's ServerApp
(PhalanxFedAvg) started with ``flwr run`` against the local SuperLink. Loopback only: every API is bound to
127.0.0.1 with its flags, and the test checks that every listening socket of every process it started is."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import pytest

pytest.importorskip("flwr")
pytest.importorskip("cryptography")

ROOT = Path(__file__).resolve().parent.parent
APP = ROOT / "examples" / "flower-app"
BIN = Path(sys.executable).parent
BINARIES = ("flower-superlink", "flower-supernode", "flower-superexec", "flwr", "flwr-serverapp", "flwr-clientapp")
LOOPBACK = "127.0.0.1"


def _load_make_keys() -> Any:
    """examples/flower-app/make_keys.py, the README's step 1: the CA, the SuperLink's certificate, the nodes' keys."""
    spec = importlib.util.spec_from_file_location("flower_app_make_keys", APP / "make_keys.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


make_keys = _load_make_keys()
WAIT = 120.0  # seconds: the longest any single event may take on a loaded 2-core machine before the test fails


def _path() -> str:
    return os.pathsep.join([str(BIN), os.environ.get("PATH", "")])


def _missing_binaries() -> list[str]:
    return [b for b in BINARIES if shutil.which(b, path=_path()) is None]


pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the processes' sockets from /proc"),
    pytest.mark.skipif(bool(_missing_binaries()), reason=f"Flower's binaries are not installed: {_missing_binaries()}"),
]


# --------------------------------------------------------------------------------------------------- processes


def free_port() -> int:
    """A port nothing listens on now (the kernel's choice); a process that then fails to bind it is restarted on
    another (:meth:`Federation.start`)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOOPBACK, 0))
        return int(s.getsockname()[1])


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path
    handle: IO[bytes]

    def text(self) -> str:
        return self.log.read_text(errors="replace")


def _children_of(pids: set[int]) -> set[int]:
    """Every live descendant of ``pids`` (from /proc: a ClientApp's, a SuperExec's own session included)."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parents[int(stat.parent.name)] = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
    found, frontier = set(), set(pids)
    while frontier:
        frontier = {pid for pid, ppid in parents.items() if ppid in frontier} - found
        found |= frontier
    return found


def _listening(pids: set[int]) -> list[tuple[int, str, int]]:
    """(pid, local address, port) of every TCP socket in LISTEN state held by ``pids`` (IPv4 and IPv6)."""
    inodes: dict[str, int] = {}
    for pid in pids:
        try:
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                target = os.readlink(fd)
                if target.startswith("socket:["):
                    inodes[target[8:-1]] = pid
        except OSError:
            continue
    out = []
    for table, family in (("/proc/net/tcp", socket.AF_INET), ("/proc/net/tcp6", socket.AF_INET6)):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] != "0A" or fields[9] not in inodes:  # 0A: LISTEN
                continue
            address, port = fields[1].split(":")
            raw = bytes.fromhex(address)
            if family == socket.AF_INET:
                host = socket.inet_ntop(family, raw[::-1])
            else:  # four little-endian 32-bit words
                host = socket.inet_ntop(family, b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4)))
            out.append((inodes[fields[9]], host, int(port, 16)))
    return out


class Federation:
    """The processes of one test: started in their own sessions, waited on by their log lines or their exit, and
    all ended (with every descendant's process group) by :meth:`close`."""

    def __init__(self, directory: Path, env: dict[str, str]) -> None:
        self.directory = directory
        self.env = env
        self.procs: list[Proc] = []

    def spawn(self, name: str, cmd: list[str]) -> Proc:
        log = self.directory / f"{name}.log"
        handle = log.open("wb")
        popen = subprocess.Popen(cmd, cwd=self.directory, env=self.env, stdout=handle, stderr=subprocess.STDOUT,
                                 start_new_session=True)
        proc = Proc(name, popen, log, handle)
        self.procs.append(proc)
        return proc

    def wait_for(self, proc: Proc, pattern: str, timeout: float = WAIT) -> re.Match[str] | None:
        """The first match of ``pattern`` in the process's log, or None if it exits first; fails after
        ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            found = re.search(pattern, proc.text())
            if found:
                return found
            if proc.popen.poll() is not None:
                return re.search(pattern, proc.text())
            if time.monotonic() > deadline:
                pytest.fail(f"{proc.name}: no {pattern!r} within {timeout:g} s:\n{proc.text()[-3000:]}")
            time.sleep(0.05)

    def start(self, name: str, make_cmd: Callable[[int], list[str]], ready: str) -> tuple[Proc, re.Match[str]]:
        """Start ``make_cmd(port)`` on a free port until its log shows ``ready`` (a port taken between the choice
        and the bind: another port, at most three times)."""
        for attempt in range(3):
            proc = self.spawn(f"{name}-{attempt}" if attempt else name, make_cmd(free_port()))
            found = self.wait_for(proc, ready)
            if found:
                return proc, found
            if "address already in use" not in proc.text().lower():
                break
        pytest.fail(f"{proc.name} did not start:\n{proc.text()[-3000:]}")

    def pids(self) -> set[int]:
        own = {p.popen.pid for p in self.procs if p.popen.poll() is None}
        return own | _children_of(own)

    def close(self) -> None:
        everyone = self.pids()
        groups = set()
        for pid in everyone:
            try:
                groups.add(os.getpgid(pid))
            except ProcessLookupError:
                continue
        groups &= everyone | {p.popen.pid for p in self.procs}  # only groups led by processes this test started
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for group in groups:
                try:
                    os.killpg(group, sig)
                except (ProcessLookupError, PermissionError):
                    continue
            deadline = time.monotonic() + 10
            for p in self.procs:
                try:
                    p.popen.wait(timeout=max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    continue
            if all(p.popen.poll() is not None for p in self.procs) and not _children_of(
                    {p.popen.pid for p in self.procs}):
                break
        for p in self.procs:
            p.handle.close()


@pytest.fixture
def federation(tmp_path: Path) -> Iterator[Federation]:
    home = tmp_path / "flwr-home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLWR_INTERNAL_")}  # no legacy gRPC APIs
    env.update({
        "PATH": _path(), "FLWR_HOME": str(home), "FLWR_TELEMETRY_ENABLED": "0", "FLWR_DISABLE_UPDATE_CHECK": "1",
        "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",  # the apps run in this environment: no network
        "FLWR_SUPEREXEC_TASK_POLL_INTERVAL": "0.1", "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1",
    })
    fed = Federation(tmp_path, env)
    try:
        yield fed
    finally:
        fed.close()


# -------------------------------------------------------------------------------------------------------- test


def test_a_real_tls_federation_with_node_auth_and_byzantine_supernodes(federation: Federation,
                                                                        tmp_path: Path) -> None:
    """5 registered SuperNodes (partitions 3 and 4 Byzantine by node config: signflip(scale=10) from the app's run
    config, and NaN, overriding the run config in its own), 2 rounds of PhalanxFedAvg(cwtm, f=2) through
    ``flwr run``. The run completes; the model ends within a quarter of ‖w_honest‖ of the honest clients' FedAvg and
    classifies as well; the contributions show the two attackers' updates; the unregistered SuperNode is refused
    (the SuperLink's error, its exit code 305) and never joins the federation."""
    fed = federation
    certs = tmp_path / "certs"
    certs.mkdir()
    tls = make_keys.make_tls(certs, LOOPBACK)
    clients, byzantine = 5, {3: "byzantine-attack='signflip'",
                             4: "byzantine-attack='nan' byzantine-params='{}'"}

    superlink, found = fed.start("superlink", lambda port: [
        "flower-superlink", "--ssl-ca-certfile", str(tls["ca"]), "--ssl-certfile", str(tls["cert"]),
        "--ssl-keyfile", str(tls["key"]), "--enable-supernode-auth", "--host", LOOPBACK, "--port", str(port),
        "--disable-runtime-dependency-installation",
    ], r"Uvicorn running on https://127\.0\.0\.1:(\d+)")
    address = f"{LOOPBACK}:{found.group(1)}"

    # TLS: the SuperLink's port speaks TLS with the certificate our CA signed, and a client without the CA refuses it
    with socket.create_connection((LOOPBACK, int(found.group(1))), timeout=10) as raw:
        with ssl.create_default_context(cafile=str(tls["ca"])).wrap_socket(raw, server_hostname=LOOPBACK) as tlsock:
            assert tlsock.version() in ("TLSv1.2", "TLSv1.3")
    with pytest.raises(ssl.SSLCertVerificationError):
        with socket.create_connection((LOOPBACK, int(found.group(1))), timeout=10) as raw:
            ssl.create_default_context().wrap_socket(raw, server_hostname=LOOPBACK)

    (Path(fed.env["FLWR_HOME"]) / "config.toml").write_text(
        '[superlink]\ndefault = "local-tls"\n\n[superlink.local-tls]\n'
        f'address = "{address}"\nroot-certificates = "{tls["ca"]}"\n'
    )
    keys = [make_keys.make_node_key(certs, f"node{i}") for i in range(clients)]
    rogue_key, _ = make_keys.make_node_key(certs, "rogue")  # its public key is never registered
    registering = [fed.spawn(f"register{i}", ["flwr", "supernode", "register", str(public), "local-tls",
                                              "--format", "json"]) for i, (_, public) in enumerate(keys)]
    registered = []
    for proc in registering:
        assert proc.popen.wait(timeout=WAIT) == 0, proc.text()[-2000:]
        reply = json.loads(proc.text()[proc.text().index("{"):])
        assert reply["success"], reply
        registered.append(int(reply["node-id"]))

    nodes: dict[int, int] = {}  # partition -> node id
    for i, (private, _) in enumerate(keys):
        config = f"partition-id={i} num-partitions={clients} byzantine={'true' if i in byzantine else 'false'}"
        config += f" {byzantine[i]}" if i in byzantine else ""
        _, started = fed.start(f"supernode{i}", lambda port, private=private, config=config: [
            "flower-supernode", "--superlink", address, "--root-certificates", str(tls["ca"]),
            "--auth-supernode-private-key", str(private), "--host", LOOPBACK, "--port", str(port),
            "--node-config", config,
        ], r"SuperNode ID: (\d+)")
        nodes[i] = int(started.group(1))
    assert sorted(nodes.values()) == sorted(registered)  # each SuperNode is the node its key registered

    rogue = fed.spawn("rogue", ["flower-supernode", "--superlink", address, "--root-certificates", str(tls["ca"]),
                                "--auth-supernode-private-key", str(rogue_key), "--host", LOOPBACK,
                                "--port", str(free_port()), "--node-config", f"partition-id=0 num-partitions={clients}",
                                "--max-retries", "0"])
    rogue.popen.wait(timeout=WAIT)
    assert rogue.popen.returncode != 0, rogue.text()[-2000:]
    assert "Failed to activate SuperNode" in rogue.text() and "SuperNode ID" not in rogue.text(), rogue.text()
    refused = fed.wait_for(superlink, r"No SuperNode found with the given public key")
    assert refused, superlink.text()[-3000:]

    result, contributions = tmp_path / "result.json", tmp_path / "contributions.jsonl"
    run_config = (f"num-clients={clients} num-byzantine={len(byzantine)} f={len(byzantine)} num-server-rounds=2 "
                  f"strategy='phalanx' aggregator='cwtm' fraction-evaluate=0.0 result-path='{result}' "
                  f"log-path='{contributions}'")
    run = fed.spawn("flwr-run", ["flwr", "run", str(APP), "local-tls", "--run-config", run_config, "--stream"])
    try:
        run.popen.wait(timeout=300)
    except subprocess.TimeoutExpired:
        pytest.fail("flwr run did not finish in 300 s:\n" + run.text()[-3000:])
    assert run.popen.returncode == 0, run.text()[-3000:]

    # loopback only: every socket any process of the federation listens on is bound to 127.0.0.1
    sockets = _listening(fed.pids())
    assert all(host == LOOPBACK for _, host, _ in sockets), sockets
    assert len({port for _, _, port in sockets}) >= 1 + clients, sockets  # the SuperLink's and each SuperNode's API

    (outcome,) = json.loads(result.read_text())
    assert outcome["nodes"] == sorted(nodes.values()), (outcome["nodes"], nodes)  # the rogue never joined
    assert outcome["distance_to_honest"] < 0.25 * outcome["honest_norm"], outcome
    assert outcome["test_accuracy"] > 0.85 and outcome["test_accuracy"] > outcome["honest_accuracy"] - 0.05, outcome
    rows = [json.loads(line) for line in contributions.read_text().splitlines()]
    assert len(rows) == 2 * clients and all(r["status"] == "used" for r in rows), [r["status"] for r in rows]
    for r in (1, 2):
        norm = {row["node_id"]: row["update_norm"] for row in rows if row["round"] == r}
        honest = [norm[nodes[i]] for i in range(clients) if i not in byzantine]
        assert norm[nodes[3]] > 5 * max(honest), norm  # the sign flipper: −10 × its honest update
        assert norm[nodes[4]] is None, norm  # the NaN sender: a NaN norm, written as null
