"""The table of docs/aggregators.md ("Do the backdoor defences stop the backdoor?") from a finished sweep of
examples/federated/backdoor_defences.toml:

    phalanx sweep examples/federated/backdoor_defences.toml --jobs 2 --out runs/backdoor-defences
    python examples/federated/backdoor_defences_table.py runs/backdoor-defences

Per cell: the final round's clean test accuracy and backdoor success (``attack_success``: triggered test inputs of
the other classes classified as the target), in %, mean and 95 % Student-t interval over the seeds.
"""

import glob
import json
import sys
from collections import defaultdict
from pathlib import Path

from phalanx.analysis.stats import mean_ci
from phalanx.experiments import store

root = sys.argv[1]
cells: dict[tuple[str, int], list[tuple[float, float]]] = defaultdict(list)
order: list[str] = []
for cfgp in sorted(glob.glob(f"{root}/*/config.json")):
    cfg = json.loads(Path(cfgp).read_text())
    last = store.finished_rows(Path(cfgp).parent)[-1]
    boost = int(cfg.get("attack_params", {}).get("boost", 1))
    success = last.get("attack_success")
    cells[(cfg["aggregator"], boost)].append((100 * last["test_accuracy"], float("nan") if success is None
                                              else 100 * success))
wanted = ["mean", "cwtm", "foolsgold", "flame", "rlr", "rlr(threshold=4)", "rlr(threshold=6)"]
boosts = sorted({b for _, b in cells})
head = " | ".join(f"boost {b}: accuracy % | boost {b}: backdoor success %" for b in boosts)
print(f"| aggregator | {head} |")
print("|---|" + "---|---|" * len(boosts))
for agg in [a for a in wanted if any((a, b) in cells for b in boosts)]:
    line = [f"`{agg}`"]
    for b in boosts:
        runs = cells[(agg, b)]
        acc, asr = mean_ci([r[0] for r in runs]), mean_ci([r[1] for r in runs])
        line += [acc.show(), asr.show()]
    print("| " + " | ".join(line) + f" |  <!-- {len(cells[(agg, boosts[0])])} seeds -->")
