"""Run the example in one process with Flower's simulation engine (``flwr.simulation.run_simulation``, Ray).

    python examples/flower/run.py                       # FedAvg and Phalanx (cwtm, f=3), 10 clients, 3 attacking
    python examples/flower/run.py --only phalanx --rounds 3 --clients 6 --byzantine 2 --f 2 --result out.json

Each configuration is one ``run_simulation``; the table compares the final test accuracy and the distance to the
honest reference (FedAvg over the honest clients alone, computed without Flower). Offline: Flower's telemetry is
switched off here, and Ray is started for this process only and shut down before it exits.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
os.environ.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")
os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import client_app
import ray
import server_app
from flwr.app import Context
from flwr.serverapp import Grid, ServerApp
from flwr.simulation import run_simulation


def simulate(settings: dict[str, Any], ray_dir: str | None = None) -> dict[str, Any]:
    """One run_simulation of the example with ``settings`` (server_app's run configuration keys)."""
    outcome: dict[str, Any] = {}
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:  # run_simulation has no run_config: inject it here
        context.run_config.update(settings)
        outcome.update(server_app.run(grid, context))

    init_args: dict[str, Any] = {"num_cpus": 2, "include_dashboard": False, "logging_level": "error",
                                 "log_to_driver": False}
    if ray_dir:
        init_args["_temp_dir"] = ray_dir
    try:
        run_simulation(server_app=app, client_app=client_app.app, num_supernodes=int(settings["num-clients"]),
                       backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0}, "init_args": init_args})
    finally:
        ray.shutdown()
    return outcome


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", choices=["fedavg", "phalanx"], help="run one strategy (default: both)")
    p.add_argument("--aggregator", default="cwtm")
    p.add_argument("--f", type=int, default=3)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--clients", type=int, default=10)
    p.add_argument("--byzantine", type=int, default=3)
    p.add_argument("--attack", default="flip", choices=["flip", "nan", "malformed"])
    p.add_argument("--attack-scale", type=float, default=10.0)
    p.add_argument("--log-path", default="", help="JSON lines of every client's contribution (Phalanx only)")
    p.add_argument("--result", default="", help="write the outcomes here as a JSON list")
    p.add_argument("--ray-dir", default=None, help="Ray's session directory (default: a fresh temporary one)")
    args = p.parse_args()
    base = {"aggregator": args.aggregator, "f": args.f, "num-server-rounds": args.rounds, "num-clients": args.clients,
            "num-byzantine": args.byzantine, "attack": args.attack, "attack-scale": args.attack_scale,
            "log-path": args.log_path}
    strategies = [args.only] if args.only else ["fedavg", "phalanx"]
    ray_dir = args.ray_dir or tempfile.mkdtemp(prefix="ray")  # a short path: Ray's socket paths are limited
    outcomes = []
    try:
        for s in strategies:
            try:
                outcomes.append(simulate({**base, "strategy": s}, ray_dir))
            except Exception as exc:  # Flower's FedAvg stops on a malformed reply: report it, run the next one
                outcomes.append({"strategy": s, "aggregator": args.aggregator, "f": args.f,
                                 "error": f"{type(exc).__name__}: {exc}"})
    finally:
        if not args.ray_dir:
            shutil.rmtree(ray_dir, ignore_errors=True)
    print(f"\n{'strategy':<24} {'test acc.':>9} {'honest ref.':>11} {'dist. to honest':>15}")
    for o in outcomes:
        name = o["strategy"] + (f" ({o['aggregator']}, f={o['f']})" if o["strategy"] == "phalanx" else "")
        if "error" in o:
            print(f"{name:<24} stopped: {o['error'][:100]}")
        else:
            print(f"{name:<24} {o['test_accuracy']:>9.3f} {o['honest_accuracy']:>11.3f} "
                  f"{o['distance_to_honest']:>15.4g}")
    if args.result:
        Path(args.result).write_text(json.dumps(outcomes, indent=1) + "\n")


if __name__ == "__main__":
    main()
