"""A real single-node Slurm cluster for the tests: ``munged``, ``slurmctld`` and ``slurmd`` from Debian's
``slurm-wlm`` and ``munge`` packages, started in a temporary directory with a configuration of its own (free ports, its
own munge key and socket), so that it touches nothing of the machine's own Slurm, if any.

:func:`start` returns the cluster, or raises :class:`Unavailable` with the reason (not root, a binary missing, a
daemon that does not come up): the tests skip with that reason.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scancel", "sinfo")
UP_TIMEOUT_S = 60.0


class Unavailable(RuntimeError):
    """Slurm cannot run here (the reason is the message)."""


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


@dataclass
class Cluster:
    """A running cluster: ``env`` holds ``SLURM_CONF`` (pass it to every command that talks to Slurm)."""

    root: Path
    env: dict[str, str]

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """A Slurm command (``squeue``, ``scancel``, …) against this cluster."""
        return subprocess.run(list(args), env=self.env, capture_output=True, text=True, check=check)

    def stop(self) -> None:
        """Stop the daemons (SIGTERM, then SIGKILL) and wait for them to exit."""
        for name in ("slurmd", "slurmctld", "munged"):
            pid_file = self.root / f"{name}.pid"
            try:
                pid = int(pid_file.read_text().split()[0])
            except (OSError, ValueError, IndexError):
                continue
            _end(pid)


def _end(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _wait_for(what: str, ready: Callable[[], bool], cluster: Cluster) -> None:
    """Poll ``ready()`` until it is true; :class:`Unavailable` (with the daemons' logs) if it never is."""
    deadline = time.monotonic() + UP_TIMEOUT_S
    while time.monotonic() < deadline:
        if ready():
            return
        time.sleep(0.2)
    logs = "; ".join(f"{p.name}: {p.read_text()[-400:]!r}" for p in sorted((cluster.root / "log").glob("*.log")))
    cluster.stop()
    raise Unavailable(f"{what} did not come up within {UP_TIMEOUT_S:.0f} s ({logs})")


def start(root: Path) -> Cluster:
    """Start munged, slurmctld and slurmd under ``root``; return once the node is idle."""
    if os.geteuid() != 0:
        raise Unavailable("slurmd must run as root to start jobs, and the tests do not run as root")
    missing = [b for b in BINARIES if shutil.which(b) is None]
    if missing:
        raise Unavailable(f"{', '.join(missing)} not installed (Debian: apt-get install slurm-wlm munge)")
    for sub in ("state", "spool", "log"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    key = root / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o600)
    sock = root / "munge.sock"
    host = socket.gethostname().split(".")[0]
    ctl_port, d_port = _free_ports(2)
    conf = root / "slurm.conf"
    conf.write_text("\n".join([
        "ClusterName=phalanxtest", f"SlurmctldHost={host}", "SlurmUser=root", "SlurmdUser=root",
        "AuthType=auth/munge", f"AuthInfo=socket={sock}", "CredType=cred/munge",
        f"SlurmctldPort={ctl_port}", f"SlurmdPort={d_port}",
        f"StateSaveLocation={root / 'state'}", f"SlurmdSpoolDir={root / 'spool'}",
        f"SlurmctldPidFile={root / 'slurmctld.pid'}", f"SlurmdPidFile={root / 'slurmd.pid'}",
        f"SlurmctldLogFile={root / 'log' / 'slurmctld.log'}", f"SlurmdLogFile={root / 'log' / 'slurmd.log'}",
        "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core", "SchedulerType=sched/backfill", "SchedulerParameters=sched_interval=1",
        "MpiDefault=none", "ReturnToService=2", "JobCompType=jobcomp/none",
        "AccountingStorageType=accounting_storage/none", "JobAcctGatherType=jobacct_gather/none",
        "SwitchType=switch/none", "InactiveLimit=0", "KillWait=10", "MinJobAge=300",
        "SlurmctldTimeout=30", "SlurmdTimeout=30",
        f"NodeName={host} CPUs={os.cpu_count() or 1} RealMemory=1000 State=UNKNOWN",
        "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
    ]) + "\n")
    env = {**os.environ, "SLURM_CONF": str(conf)}
    cluster = Cluster(root, env)
    subprocess.run(["munged", "--force", f"--socket={sock}", f"--key-file={key}",
                    f"--pid-file={root / 'munged.pid'}", f"--seed-file={root / 'munge.seed'}",
                    f"--log-file={root / 'log' / 'munged.log'}"], check=True, capture_output=True)
    _wait_for("munged", sock.exists, cluster)
    for daemon in (["slurmctld", "-c"], ["slurmd"]):
        proc = subprocess.run(daemon, env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            cluster.stop()
            raise Unavailable(f"{daemon[0]} failed to start: {proc.stderr.strip()[:400]}")

    def idle() -> bool:
        out = cluster.run("sinfo", "-h", "-o", "%T", check=False).stdout.split()
        return bool(out) and all(state.startswith("idle") for state in out)

    _wait_for("the Slurm node", idle, cluster)
    return cluster
