"""The table of docs/federated.md ("The price of robustness under local steps") from a finished sweep of
examples/federated/local_steps.toml:

    phalanx sweep examples/federated/local_steps.toml --jobs 2 --out runs/local-steps
    python examples/federated/local_steps_table.py runs/local-steps

Per cell: each seed's final accuracy of the mean minus the rule's (the no-attack cost, in points, paired by seed),
their mean and 95 % Student-t interval over the seeds, and the rule's aggregation error at the last round.
"""

import glob
import json
import sys
from pathlib import Path

from phalanx.analysis.stats import mean_ci
from phalanx.experiments import store

root = sys.argv[1]
rows = {}
for cfgp in glob.glob(f"{root}/*/config.json"):
    cfg = json.loads(Path(cfgp).read_text())
    last = store.finished_rows(Path(cfgp).parent)[-1]
    key = (cfg["alpha"], cfg.get("local_steps", 1), cfg["aggregator"], cfg["f"], cfg["seed"])
    rows[key] = (last["test_accuracy"], last["agg_error"])
print("| split | K | mean: accuracy % | cwtm f=1 | cwtm f=3 | multikrum f=1 | multikrum f=3 |")
print("|---|---|---|---|---|---|---|")
for alpha in (0.1, 1.0):
    for ls in (1, 5, 20):
        base = [rows[(alpha, ls, "mean", 1, s)][0] for s in range(3)]
        b = mean_ci([100 * x for x in base])
        line = [f"α = {alpha:g}", str(ls), f"{b.mean:.1f} ± {b.half_width:.1f}"]
        for agg in ("cwtm", "multikrum(strict=false)"):
            for f in (1, 3):
                acc = [rows[(alpha, ls, agg, f, s)][0] for s in range(3)]
                cost = [100 * (bb - a) for a, bb in zip(acc, base)]
                e = mean_ci(cost)
                err = sum(rows[(alpha, ls, agg, f, s)][1] for s in range(3)) / 3
                line.append(f"{e.mean:+.1f} [{e.low:+.1f}, {e.high:+.1f}] · ε̂ {err:.2f}")
        print("| " + " | ".join(line) + " |")
