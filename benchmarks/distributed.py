"""Round time of the torchrun engine (one process per worker) against the simulated engine, and bytes per round.

    .venv/bin/python benchmarks/distributed.py [--ns 4,8] [--rounds 300] [--warmup 30] [--markdown PATH] [--json PATH]

Setting: the default MLP (64 hidden units, d = 4,810) on the embedded ``digits`` data set, batch 32 per worker, IID
split, worker momentum 0.9, coordinate-wise trimmed mean with f = 1, and either no attack (b = 0) or one Byzantine
worker running ALIE (b = 1; in the torchrun engine a real Byzantine process that is sent the honest vectors).

* **simulated** — the training loop's round (:meth:`phalanx.training.Loop.step`, in-process transport) in this
  process, ``warmup`` rounds then ``rounds`` timed rounds, the median; once with 1 thread and once with all cores
  (``phalanx run``'s default). The ratios are taken against the faster of the two.
* **server** / **serverless** — ``phalanx launch``'s process start-up (:mod:`phalanx.distributed.launch`): n
  processes of ``python -m phalanx.distributed.worker``, one thread each (``OMP_NUM_THREADS=1``, as torchrun sets),
  store and process group on 127.0.0.1. Rank 0 times every round from publishing θ (server) or starting its
  gradient (serverless) to the new θ — evaluation and checkpoints excluded, as for the simulated engine — and writes
  the times to ``distributed.json``; the median over the rounds after the first ``warmup`` is reported (the first
  round of every process pays torch.func's one-time set-up, ~2 s).

**protocol alone** — the parameter-server protocol without Phalanx (:func:`pingpong_round`): the same n processes
and store, the same payload sizes, a busy-wait of one gradient call's length in every process. What the machine's
scheduler and store cost; when it is itself above the target, no implementation can meet the target here.

**floor** — what a parameter-server round cannot go below on this machine: n × (one rank's compute alone, 1 thread:
its batch, gradient and momentum) / cores — the compute every round needs when each of the n processes does its own
— plus two store round trips in sequence (θ to the workers, their vectors back), each measured here as the median of a
``get`` from a second process to a ``TCPStore`` hosted by this one. The target: the server round within
:data:`TARGET` × the floor at n = 4 and n = 8.

Bytes per round are payload bytes counted from the messages' sizes (no TCP/IP or store framing):
server topology — what rank 0 sends (θ to each of the n − 1 workers, plus the honest vectors to each Byzantine
rank of an omniscient attack) and receives (the n − 1 workers' vectors, plus each Byzantine rank's 5,056-byte
attack-stream state); serverless — what one rank sends: its row to each of the n − 1 others per all-gather (one
all-gather, two with a vector attack; gloo's ring all-gather sends the same amount per rank).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

TOPOLOGIES = ("server", "serverless")
ATTACKS = ("none", "alie")
TARGET = 2.0
"""The parameter-server round within this factor of its floor (n gradient calls over the cores + two store round
trips), at n = 4 and n = 8."""
TARGET_NS = (4, 8)


def config(n: int, attack: str, rounds: int) -> dict[str, Any]:
    """The benchmark's run config (torchrun keys are ignored by the simulated engine)."""
    return {
        "dataset": "digits", "model": "mlp", "workers": n, "byzantine": 0 if attack == "none" else 1, "f": 1,
        "aggregator": "cwtm", "attack": attack, "partition": "iid", "rounds": rounds, "batch_size": 32, "lr": 0.1,
        "momentum": 0.9, "seed": 0, "eval_every": rounds, "checkpoint_every": rounds, "round_timeout": 60.0,
    }


def simulated_round(n: int, attack: str, warmup: int, rounds: int, threads: int) -> float:
    """Median wall time of the simulated engine's round (this process, ``threads`` intra-op threads)."""
    import torch

    from phalanx.experiments import from_config, make_config
    from phalanx.training import Loop
    from phalanx.training.memory import tune_allocator

    tune_allocator()
    torch.set_num_threads(threads)
    cfg = make_config({**config(n, attack, warmup + rounds), "eval_every": 10**9, "rounds": 10**9})
    loop = Loop(from_config(cfg))  # no callbacks: no evaluation, as in the distributed rounds that are timed
    loop.open()
    times = []
    for t in range(warmup + rounds):
        t0 = time.perf_counter()
        loop.step()
        if t >= warmup:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def one_row_gradient(warmup: int, rounds: int) -> float:
    """Median time of what one rank computes each round, alone on one thread: its batch draw, gradient and momentum
    update (``OneWorker.vector``, the call a rank makes). Its fixed cost is what the simulated engine pays once for
    all n workers."""
    import torch

    from phalanx.experiments import from_config, make_config
    from phalanx.training.streams import generator

    torch.set_num_threads(1)
    exp = from_config(make_config(config(4, "none", 1)))
    streams = {name: generator(0, name).get_state() for name in ("batches", "attack")}
    worker = exp.algorithm.one_worker(exp, 1, streams, None)
    theta = exp.problem.initial_theta()
    times = []
    for t in range(warmup + rounds):
        t0 = time.perf_counter()
        worker.vector(theta, t)
        if t >= warmup:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


_RTT_CLIENT = """
import statistics, sys, time
from datetime import timedelta
import torch.distributed as dist
store = dist.TCPStore("127.0.0.1", int(sys.argv[1]), None, False, timeout=timedelta(seconds=60))
times = []
for i in range(int(sys.argv[2])):
    t0 = time.perf_counter()
    store.get("k")
    times.append(time.perf_counter() - t0)
print(statistics.median(times[len(times) // 10:]))
"""


def store_round_trip(rounds: int) -> float:
    """Median seconds of one store request that gets an answer, from a second process to a ``TCPStore`` (libuv)
    hosted by this process — what a worker pays to reach rank 0's store."""
    import subprocess
    from datetime import timedelta

    import torch.distributed as dist

    from phalanx.distributed.env import free_port

    port = free_port()
    store = dist.TCPStore("127.0.0.1", port, None, True, timeout=timedelta(seconds=60), wait_for_workers=False,
                          use_libuv=True)
    store.set("k", b"x" * 64)
    out = subprocess.run([sys.executable, "-c", _RTT_CLIENT, str(port), str(max(200, rounds))], capture_output=True,
                         text=True, timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"})
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-2000:])
    return float(out.stdout.strip())


_PINGPONG = """
import statistics, sys, time
from datetime import timedelta
import torch.distributed as dist
n, rounds, rank, port, busy, size = (int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]),
                                     float(sys.argv[5]), int(sys.argv[6]))
store = dist.TCPStore("127.0.0.1", port, None, rank == 0, timeout=timedelta(seconds=120), wait_for_workers=False,
                      use_libuv=True)
payload = b"x" * size


def compute():  # stands for this process's gradient call
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < busy:
        pass


times = []
for t in range(rounds):
    t0 = time.perf_counter()
    if rank == 0:
        store.multi_set([f"s/{t}", "latest"], [payload, str(t).encode()])
        compute()
        store.multi_get([f"v/{t}/{r}" for r in range(1, n)])
        times.append(time.perf_counter() - t0)
    else:
        store.multi_get(["latest", f"s/{t}"])
        compute()
        store.set(f"v/{t}/{rank}", payload)
if rank == 0:
    print(statistics.median(times[len(times) // 10:]))
    store.set("done", b"1")
else:
    store.get("done")
"""


def pingpong_round(n: int, rounds: int, busy: float, size: int) -> float:
    """Median round of the parameter-server protocol alone: n processes, rank 0 hosting the ``TCPStore``; per
    round rank 0 publishes a θ-sized payload, every process busy-waits ``busy`` seconds (standing for its gradient
    call), the workers send a vector-sized payload back and rank 0 reads them all. No tensors, no training: what
    this machine's processes and store cost before any of Phalanx's work."""
    import subprocess

    from phalanx.distributed.env import free_port

    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, "-c", _PINGPONG, str(n), str(rounds), str(r), str(port), str(busy),
                               str(size)], stdout=subprocess.PIPE, text=True, env=env) for r in range(n)]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    if any(p.returncode for p in procs):
        raise RuntimeError(f"ping-pong failed: {[p.returncode for p in procs]}")
    return float(outs[0].strip())


def distributed_round(n: int, attack: str, topology: str, warmup: int, rounds: int, timeout: float) -> dict[str, Any]:
    """Launch one job; rank 0's median round time and bytes per round."""
    from phalanx.distributed import launch

    with tempfile.TemporaryDirectory(prefix="phalanx-bench-") as tmp:
        cfg = {**config(n, attack, warmup + rounds), "topology": topology}
        cfg_path = Path(tmp) / "job.toml"
        cfg_path.write_text("".join(f"{k} = {json.dumps(v)}\n" for k, v in cfg.items()))
        out = Path(tmp) / "out"
        t0 = time.perf_counter()
        with (Path(tmp) / "stderr").open("wb") as err:
            procs = launch.spawn(n, launch.worker_args(cfg_path, [], out), stderr=err)
            code = launch.supervise(procs, timeout_s=timeout, say=lambda s: None)
        wall = time.perf_counter() - t0
        if code != 0:
            return {"error": f"rank 0 exit status {code}: {(Path(tmp) / 'stderr').read_text()[-800:]}"}
        log = json.loads(next(out.iterdir()).joinpath("distributed.json").read_text())
    timed = [r for r in log["rounds"] if warmup <= r["round"] < warmup + rounds - 1]  # last round measures
    return {
        "round_s": statistics.median(r["seconds"] for r in timed),
        "sent": statistics.fmean(r["sent"] for r in timed), "received": statistics.fmean(r["received"] for r in timed),
        "missing_rounds": sum(1 for r in log["rounds"] if r["missing"]), "job_wall_s": wall,
    }


KEYS_HIDDEN = 13_333
"""The keys comparison's MLP width: 64·13,333 + 13,333 + 13,333·10 + 10 = 1,000,052 parameters (a 4 MB vector)."""
KEYS_TARGET = 1.1
"""The keyed round within this factor of the same round without keys (issue: ≤ 1.1×), on every topology."""
KEYS_TOPOLOGIES = ("server", "serverless", "gossip")


def keys_config(n: int, topology: str, rounds: int) -> dict[str, Any]:
    """The keys comparison's job at d ≈ 10⁶, no attack: the parameter server and the serverless all-gather with the
    trimmed mean (f = 1), gossip on a ring with plain averaging (every node's neighbours only)."""
    cfg = {**config(n, "none", rounds), "batch_size": 16, "topology": topology}
    if topology == "gossip":
        cfg.update({"algorithm": "gossip", "graph": "ring", "aggregator": "mean", "f": 0})
    return cfg


def keys_round(n: int, keyed: bool, keydir: Path, warmup: int, rounds: int, timeout: float,
               topology: str = "server") -> dict[str, Any]:
    """The round of ``topology`` at d ≈ 10⁶ (no attack), with the job's keys (mutual TLS — the parameter server's
    sealed links or the sealed mesh —, signed rows, the transcript) or without (the c10d store; gloo for the
    serverless all-gather and the gossip links): rank 0's median round."""
    from phalanx.distributed import launch

    with tempfile.TemporaryDirectory(prefix="phalanx-bench-") as tmp:
        cfg = keys_config(n, topology, warmup + rounds)
        if keyed:
            cfg["keys"] = str(keydir)
        cfg_path = Path(tmp) / "job.toml"
        lines = [f"{k} = {json.dumps(v)}\n" for k, v in cfg.items()]
        cfg_path.write_text("".join(lines) + f"model_params = {{ hidden = [{KEYS_HIDDEN}] }}\n")
        out = Path(tmp) / "out"
        with (Path(tmp) / "stderr").open("wb") as err:
            procs = launch.spawn(n, launch.worker_args(cfg_path, [], out), stderr=err)
            code = launch.supervise(procs, timeout_s=timeout, say=lambda s: None)
        if code != 0:
            return {"error": f"rank 0 exit status {code}: {(Path(tmp) / 'stderr').read_text()[-800:]}"}
        log = json.loads(next(out.iterdir()).joinpath("distributed.json").read_text())
    timed = [r["seconds"] for r in log["rounds"] if warmup <= r["round"] < warmup + rounds - 1]
    return {"round_s": statistics.median(timed), "missing_rounds": sum(1 for r in log["rounds"] if r["missing"])}


def crypto_costs(row_bytes: int, repeats: int = 15) -> dict[str, float]:
    """Seconds one core takes, in this process, to seal (AES-256-GCM, what TLS 1.3 negotiates here), open, and hash
    (SHA-256) one row of ``row_bytes``: the medians of ``repeats`` calls through OpenSSL (``cryptography`` and
    ``hashlib``), the same code the keyed links run."""
    import hashlib

    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    row, aead, nonce = os.urandom(row_bytes), AESGCM(AESGCM.generate_key(bit_length=256)), os.urandom(12)
    sealed = aead.encrypt(nonce, row, None)

    def median_s(call: Any) -> float:
        call()
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            call()
            times.append(time.perf_counter() - start)
        return statistics.median(times)

    return {"seal_s": median_s(lambda: aead.encrypt(nonce, row, None)),
            "open_s": median_s(lambda: aead.decrypt(nonce, sealed, None)),
            "hash_s": median_s(lambda: hashlib.sha256(row).digest())}


def crypto_floor(n: int, topology: str, costs: dict[str, float], cores: int) -> float:
    """The least a keyed round adds to the same round without keys on this machine, in seconds: the cryptographic
    work every rank must do on its rows, spread over the cores (n processes, min(n, cores) at once).

    Per rank and round, with S rows sent and R received: serverless S = R = n − 1 (every rank's signed row to every
    other) and one SHA-256 of its own row (one signature for all); gossip on a ring S = R = 2 (one signed message per
    link, each hashed by its sender); the parameter server's rows are sealed per link and not hashed here, and the
    floor is not computed for it (its target is met). Each sent row is sealed once, each received row opened once and
    hashed once (to check its signature): ``n · (S·seal + R·open + (R + H)·hash) / min(n, cores)``, H the sender's
    hashes (1 serverless, S gossip). The TCP copies are not counted: the round without keys makes them too."""
    if topology == "serverless":
        sent = received = n - 1
        own_hashes = 1
    elif topology == "gossip":
        sent = received = min(2, n - 1)
        own_hashes = sent
    else:
        return float("nan")
    per_rank = sent * costs["seal_s"] + received * costs["open_s"] + (received + own_hashes) * costs["hash_s"]
    return n * per_rank / max(1, min(n, cores))


def keys_comparison(ns: list[int], repeats: int, warmup: int, rounds: int, timeout: float,
                    topologies: tuple[str, ...] = KEYS_TOPOLOGIES) -> list[dict[str, Any]]:
    """Without and with keys, alternating ``repeats`` times per n and topology (so drift in the machine's load hits
    both); the ratio of the medians of the two."""
    from phalanx.distributed.keys import init_keys

    out = []
    costs = crypto_costs(4 * (75 * KEYS_HIDDEN + 10))
    cores = len(os.sched_getaffinity(0))
    print(f"# one core: seal {1e3 * costs['seal_s']:.2f} ms, open {1e3 * costs['open_s']:.2f} ms, SHA-256 "
          f"{1e3 * costs['hash_s']:.2f} ms per 4 MB row", flush=True)
    with tempfile.TemporaryDirectory(prefix="phalanx-keys-") as tmp:
        for n in ns:
            keydir = Path(tmp) / f"n{n}"
            init_keys(keydir, n)
            for topology in topologies:
                plain, keyed = [], []
                for _ in range(repeats):
                    for flag, into in ((False, plain), (True, keyed)):
                        got = keys_round(n, flag, keydir, warmup, rounds, timeout, topology)
                        if "error" in got:
                            raise RuntimeError(got["error"])
                        into.append(got["round_s"])
                row = {"n": n, "topology": topology, "d": 75 * KEYS_HIDDEN + 10, "plain_s": plain, "keyed_s": keyed,
                       "ratio": statistics.median(keyed) / statistics.median(plain),
                       "crypto_floor_s": crypto_floor(n, topology, costs, cores)}
                print(json.dumps(row), flush=True)
                out.append(row)
    return out


def keys_table(rows: list[dict[str, Any]]) -> str:
    """The Markdown table of the keys comparison."""
    lines = ["| topology | n | d | round without keys ms (runs) | with keys ms (runs) | with ÷ without "
             "| crypto floor ms | with ÷ (without + floor) |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        runs = ", ".join(f"{1e3 * x:.0f}" for x in r["plain_s"]), ", ".join(f"{1e3 * x:.0f}" for x in r["keyed_s"])
        plain, keyed, floor = statistics.median(r["plain_s"]), statistics.median(r["keyed_s"]), r.get("crypto_floor_s")
        has_floor = floor is not None and floor == floor
        floor_cells = (f"{1e3 * floor:.1f} | {keyed / (plain + floor):.3f}×" if has_floor else "— | —")
        lines.append(f"| {r.get('topology', 'server')} | {r['n']} | {r['d']:,} | {1e3 * plain:.1f} ({runs[0]}) | "
                     f"{1e3 * keyed:.1f} ({runs[1]}) | {r['ratio']:.3f}× | {floor_cells} |")
    return "\n".join(lines)


def table(rows: list[dict[str, Any]]) -> str:
    """The Markdown table of the measurements."""
    head = (
        "| n | attack | simulated ms (1 thr / all) | floor ms | protocol alone ms (÷ floor) | server ms | ÷ floor "
        "| ÷ simulated | serverless ms | ÷ simulated | server bytes sent / received per round "
        "| serverless bytes sent per rank per round |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|"
    )
    lines = [head]
    for r in rows:
        cells = [str(r["n"]), r["attack"], f"{1e3 * r['simulated_1']:.2f} / {1e3 * r['simulated_all']:.2f}",
                 f"{1e3 * r['floor']:.2f}", f"{1e3 * r['pingpong']:.2f} ({r['pingpong'] / r['floor']:.1f}×)"]
        for topo in TOPOLOGIES:
            d = r[topo]
            if "error" in d:
                cells += ["error", "—"] + (["—"] if topo == "server" else [])
                continue
            cells.append(f"{1e3 * d['round_s']:.2f}")
            if topo == "server":
                cells.append(f"{d['round_s'] / r['floor']:.1f}×")
            cells.append(f"{d['round_s'] / r['simulated']:.1f}×")
        s, sl = r["server"], r["serverless"]
        cells.append(f"{s.get('sent', 0):,.0f} / {s.get('received', 0):,.0f}" if "error" not in s else "—")
        cells.append(f"{sl.get('sent', 0):,.0f}" if "error" not in sl else "—")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--ns", default="4,8", help="comma-separated worker (= process) counts (default 4,8)")
    ap.add_argument("--attacks", default=",".join(ATTACKS), help="comma-separated: none, alie (default both)")
    ap.add_argument("--rounds", type=int, default=300, help="timed rounds (default 300)")
    ap.add_argument("--warmup", type=int, default=30, help="untimed first rounds (default 30)")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per launched job (default 600)")
    ap.add_argument("--markdown", metavar="PATH", help="also write the table as Markdown to PATH")
    ap.add_argument("--json", metavar="PATH", help="also write the raw measurements as JSON to PATH")
    ap.add_argument("--keys", choices=("with", "only", "skip"), default="with",
                    help="the parameter-server round with and without keys at d ≈ 10⁶: with the rest (default), "
                    "only it, or not at all")
    ap.add_argument("--keys-rounds", type=int, default=40, help="timed rounds per keys-comparison job (default 40)")
    ap.add_argument("--keys-repeats", type=int, default=2, help="alternations without / with keys (default 2)")
    ap.add_argument("--keys-topologies", default=",".join(KEYS_TOPOLOGIES),
                    help="comma-separated topologies of the keys comparison (default server,serverless,gossip)")
    args = ap.parse_args(argv)
    import torch

    ns = [int(x) for x in args.ns.split(",")]
    attacks = [a.strip() for a in args.attacks.split(",") if a.strip()]
    env = {
        "cores": len(os.sched_getaffinity(0)), "torch": torch.__version__, "python": platform.python_version(),
        "platform": platform.platform(), "load_start": os.getloadavg()[0],
    }
    print(f"# {env}", flush=True)
    keys_rows: list[dict[str, Any]] = []
    if args.keys != "skip":
        topologies = tuple(t.strip() for t in args.keys_topologies.split(",") if t.strip())
        keys_rows = keys_comparison([n for n in ns if n in TARGET_NS] or ns, args.keys_repeats, 5, args.keys_rounds,
                                    args.timeout, topologies)
        print(keys_table(keys_rows))
        worst = max(r["ratio"] for r in keys_rows)
        print(f"target (keyed round ≤ {KEYS_TARGET:g}× the round without keys, d ≈ 10⁶): "
              f"{'met' if worst <= KEYS_TARGET else 'not met'} (worst {worst:.3f}×)", flush=True)
        if args.keys == "only":
            if args.json:
                Path(args.json).write_text(json.dumps({"env": env, "keys": keys_rows}, indent=1))
            return 0
    rows = []
    grad1 = one_row_gradient(args.warmup, args.rounds)
    rtt = store_round_trip(args.rounds)
    env["one_row_gradient_s"], env["store_round_trip_s"] = grad1, rtt
    print(f"# one rank's compute (batch, gradient, momentum) {1e3 * grad1:.3f} ms; store round trip {1e3 * rtt:.3f} ms",
          flush=True)
    for n in ns:
        for attack in attacks:
            row: dict[str, Any] = {
                "n": n, "attack": attack, "simulated_1": simulated_round(n, attack, args.warmup, args.rounds, 1),
                "simulated_all": simulated_round(n, attack, args.warmup, args.rounds, env["cores"]),
            }
            row["simulated"] = min(row["simulated_1"], row["simulated_all"])
            row["floor"] = n * grad1 / env["cores"] + 2 * rtt  # n gradient calls over the cores, θ out, vectors back
            row["pingpong"] = pingpong_round(n, args.warmup + args.rounds, grad1, 4 * 4810)
            for topo in TOPOLOGIES:
                row[topo] = distributed_round(n, attack, topo, args.warmup, args.rounds, args.timeout)
            print(json.dumps(row), flush=True)
            rows.append(row)
    env["load_end"] = os.getloadavg()[0]
    md = table(rows)
    print(md)
    ratios = [r["server"]["round_s"] / r["floor"] for r in rows if r["n"] in TARGET_NS and "round_s" in r["server"]]
    if ratios:
        verdict = "met" if max(ratios) <= TARGET else "not met"
        print(f"target (server round ≤ {TARGET:g}× its floor at n = {', '.join(map(str, TARGET_NS))}): {verdict} "
              f"(worst {max(ratios):.1f}×)")
    if args.markdown:
        Path(args.markdown).write_text(md + "\n")
    if args.json:
        Path(args.json).write_text(json.dumps({"env": env, "rows": rows, "keys": keys_rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
