"""Run the app in one process with Flower's simulation engine (``flwr.simulation.run_simulation``, Ray).

    python examples/flower-app/simulate.py --strategy both --rounds 3 --clients 6 --byzantine 2 --f 2 \\
        --attack signflip --params '{"scale": 10.0}' --result out.json

The last ``--byzantine`` clients attack through Phalanx's ClientApp mod; ``--strategy both`` runs Flower's FedAvg,
then PhalanxFedAvg, on the same clients. Offline: Flower's telemetry is off, and Ray is started for this process
only and shut down before it exits.
"""

from __future__ import annotations

import argparse
import json
import os
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


def simulate(settings: dict[str, Any], ray_dir: str) -> list[dict[str, Any]]:
    """One run_simulation of the app with ``settings`` (run-config keys: run_simulation has no run config)."""
    outcomes: list[dict[str, Any]] = []
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        context.run_config.update(settings)
        outcomes.extend(server_app.run(grid, context))

    init_args: dict[str, Any] = {"num_cpus": 2, "include_dashboard": False, "logging_level": "error",
                                 "log_to_driver": False, "_temp_dir": ray_dir}
    try:
        run_simulation(server_app=app, client_app=client_app.make_app(settings),
                       num_supernodes=int(settings["num-clients"]),
                       backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0}, "init_args": init_args})
    finally:
        ray.shutdown()
    return outcomes


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--strategy", default="both", choices=sorted(server_app.STRATEGIES))
    p.add_argument("--aggregator", default="cwtm")
    p.add_argument("--f", type=int, default=3)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--clients", type=int, default=10)
    p.add_argument("--byzantine", type=int, default=3)
    p.add_argument("--attack", default="signflip", help="a Phalanx attack one client can run alone (docs/flower.md)")
    p.add_argument("--params", default='{"scale": 10.0}', help="the attack's parameters, a JSON object")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log-path", default="")
    p.add_argument("--result", default="", help="write the outcomes here as a JSON list")
    p.add_argument("--ray-dir", default=None, help="Ray's session directory (default: a fresh temporary one)")
    args = p.parse_args()
    settings = {"strategy": args.strategy, "aggregator": args.aggregator, "f": args.f, "num-server-rounds": args.rounds,
                "num-clients": args.clients, "num-byzantine": args.byzantine, "byzantine-attack": args.attack,
                "byzantine-params": args.params, "byzantine-seed": args.seed, "log-path": args.log_path}
    with tempfile.TemporaryDirectory(prefix="ray", dir=None if args.ray_dir else "/tmp") as tmp:
        outcomes = simulate(settings, args.ray_dir or tmp)
    print(f"\n{'strategy':<24} {'test acc.':>9} {'honest ref.':>11} {'dist. to honest':>15}")
    for o in outcomes:
        name = o["strategy"] + (f" ({o['aggregator']}, f={o['f']})" if o["strategy"] == "phalanx" else "")
        print(f"{name:<24} {o['test_accuracy']:>9.3f} {o['honest_accuracy']:>11.3f} {o['distance_to_honest']:>15.4g}")
    if args.result:
        Path(args.result).write_text(json.dumps(outcomes, indent=1) + "\n")


if __name__ == "__main__":
    main()
