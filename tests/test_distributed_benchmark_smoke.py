"""Smoke test of benchmarks/distributed.py's measurements (the launched jobs are covered by test_distributed.py): the
floor's parts, the protocol alone, the simulated round and the table with its ratios."""

from __future__ import annotations

from _scripts import load_script


def test_measurements_and_table() -> None:
    bench = load_script("benchmarks/distributed.py", "phalanx_bench_distributed")
    grad = bench.one_row_gradient(2, 5)
    rtt = bench.store_round_trip(50)
    alone = bench.pingpong_round(2, 30, grad, 4 * 100)
    sim = bench.simulated_round(3, "alie", 2, 5, 1)
    assert 0 < grad and 0 < rtt and 0 < alone and 0 < sim
    row = {"n": 2, "attack": "alie", "simulated_1": sim, "simulated_all": sim, "simulated": sim,
           "floor": 2 * grad + 2 * rtt, "pingpong": alone,
           "server": {"round_s": 2 * alone, "sent": 10.0, "received": 20.0}, "serverless": {"error": "x"}}
    table = bench.table([row])
    cells = table.splitlines()[-1].split(" | ")
    assert cells[5] == f"{2e3 * alone:.2f}" and cells[6] == f"{2 * alone / row['floor']:.1f}×"
    assert "error" in table
