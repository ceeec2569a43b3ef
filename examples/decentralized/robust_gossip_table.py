"""The table of docs/decentralized.md ("Robust gossip") from a finished sweep of
examples/decentralized/robust_gossip.toml:

    phalanx sweep examples/decentralized/robust_gossip.toml --jobs 2 --out runs/robust_gossip
    python examples/decentralized/robust_gossip_table.py runs/robust_gossip

Per cell: the honest nodes' mean test accuracy / the worst honest node's, in %, at the last metric row (round 100, or
the row where a diverged run stopped), each averaged over the seeds.
"""

import glob
import json
import sys
from collections import defaultdict
from pathlib import Path

from phalanx.experiments import store

RULES = ("mean", "cwtm", "clipped_gossip", "cs_plus", "ios", "monna")
ATTACKS = ("none", "dissensus", "spectral")

root = sys.argv[1]
cells: dict[tuple[str, str], list[tuple[float, float]]] = defaultdict(list)
for cfgp in sorted(glob.glob(f"{root}/*/config.json")):
    cfg = json.loads(Path(cfgp).read_text())
    rows = store.read_rows(Path(cfgp).parent)  # a diverged run stops early and has no DONE: its last row counts
    last = max((r for r in rows if "test_accuracy" in r), key=lambda r: r["round"])
    cells[(cfg["aggregator"], cfg["attack"])].append((last["test_accuracy"], last["worst_node_accuracy"]))
print("| rule | no attack | dissensus | spectral |")
print("|---|---|---|---|")
for rule in RULES:
    line = [f"`{rule}`" + (" (plain gossip)" if rule == "mean" else "")]
    for attack in ATTACKS:
        got = cells[(rule, attack)]
        line.append(f"{100 * sum(a for a, _ in got) / len(got):.1f} / {100 * sum(w for _, w in got) / len(got):.1f}"
                    if got else "–")
    print("| " + " | ".join(line) + " |")
