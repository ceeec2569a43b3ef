"""Write a small data set in LEAF's FEMNIST file format, from the digits built into Phalanx, for trying
``partition = "natural"`` without LEAF's 1 GB download:

    python examples/natural/femnist_format.py DIR      # → DIR/femnist/data/{train,test}/*.json

Each of the 1,797 8×8 digits (pixel counts 0..16) is scaled ×3 and centred in a 28×28 image (LEAF's size), stored
as LEAF's ``data_to_json.py`` stores pixels (``v/255``), with its label (0..9 of FEMNIST's 62 classes). The
"writers" are made up — 30 of them, each writing mostly three digits — so that the natural split is skewed the way
real writers are; LEAF's real FEMNIST (3,550 writers of NIST SD19) is read the same way. Every 10th sample of a
writer goes to ``test/`` (LEAF's ``-t sample --tf 0.9``). Format: Caldas et al., "LEAF: A Benchmark for Federated
Settings", 2018.
"""

from __future__ import annotations

import gzip
import io
import json
import sys
from importlib import resources
from pathlib import Path

import numpy as np

WRITERS = 30


def main(out: Path) -> None:
    raw = resources.files("phalanx.data").joinpath("_files/digits.csv.gz").read_bytes()
    table = np.loadtxt(io.StringIO(gzip.decompress(raw).decode("ascii")), delimiter=",", dtype=np.int64)
    counts, labels = table[:, :64].reshape(-1, 8, 8), table[:, 64]
    images = np.zeros((len(labels), 28, 28), dtype=np.int64)
    images[:, 2:26, 2:26] = np.kron(counts, np.ones((3, 3), dtype=np.int64))
    pixels = np.rint(images * 255 / 16).astype(np.int64)  # 0..255, as NIST's grey levels
    rng = np.random.default_rng(0)
    favourite = [rng.choice(10, 3, replace=False) for _ in range(WRITERS)]
    writer = np.empty(len(labels), dtype=np.int64)
    for i, y in enumerate(labels):  # 85 %: one of the writers whose favourite digits include y; else anyone
        likes = [w for w in range(WRITERS) if y in favourite[w]]
        writer[i] = rng.choice(likes) if likes and rng.random() < 0.85 else rng.integers(WRITERS)
    for split in ("train", "test"):
        users: dict[str, dict[str, list[object]]] = {}
        for w in range(WRITERS):
            mine = np.flatnonzero(writer == w)
            test = np.zeros(len(mine), dtype=bool)
            test[9::10] = True
            take = mine[test] if split == "test" else mine[~test]
            users[f"f{w:04d}_00"] = {"x": (pixels[take].reshape(len(take), -1) / 255).tolist(),
                                     "y": labels[take].tolist()}
        folder = out / "femnist" / "data" / split
        folder.mkdir(parents=True, exist_ok=True)
        doc = {"users": list(users), "num_samples": [len(u["y"]) for u in users.values()], "user_data": users}
        path = folder / f"all_data_0_niid_0_keep_0_{split}_9.json"
        path.write_text(json.dumps(doc))
        print(f"wrote {path}: {len(users)} writers, {sum(doc['num_samples'])} samples ({split})")  # type: ignore[arg-type]
    print(f"use it with: phalanx run examples/natural/femnist.toml --set data_root={out}")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "femnist-format"))
