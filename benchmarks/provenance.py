"""What a run's provenance record costs (docs/security.md, "Run directories: what a signature proves"): signing and
checking one session's statement, and the digest of a checkpoint's tensors that every checkpoint computes.

    python benchmarks/provenance.py [--mb 8] [--repeat 30]

Prints medians over ``--repeat`` calls (the first signature, which imports model-signing, apart). Needs the
``signing`` extra. Times on a shared machine are what that machine gave, not the code's floor.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path


def _median_ms(call: Callable[[int], object], repeat: int) -> float:
    times = []
    for i in range(repeat):
        t = time.perf_counter()
        call(i)
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=8, help="checkpoint size to digest, MB of float32")
    parser.add_argument("--repeat", type=int, default=30)
    args = parser.parse_args()

    import torch

    from phalanx import signing
    from phalanx.experiments import runfiles

    with tempfile.TemporaryDirectory() as tmp:
        key, pub = signing.keygen(Path(tmp) / "k.pem", Path(tmp) / "k.pub")
        t = time.perf_counter()
        bundle = signing.sign_statement(b"{}", key)
        first = time.perf_counter() - t
        sign = _median_ms(lambda i: signing.sign_statement(b'{"segment": %d}' % i, key), args.repeat)
        check = _median_ms(lambda i: signing.verify_statement(b"{}", bundle, pub), args.repeat)
    tensors = {"theta": torch.randn(args.mb * (1 << 20) // 4)}
    digest = _median_ms(lambda i: runfiles.tensors_digest(tensors), max(3, args.repeat // 3))
    print(f"first signature (imports model-signing): {first:.2f} s")
    print(f"sign one session's statement: {sign:.1f} ms (median of {args.repeat})")
    print(f"check one session's signature: {check:.1f} ms (median of {args.repeat})")
    print(f"digest of {args.mb} MB of checkpoint tensors: {digest:.1f} ms")


if __name__ == "__main__":
    main()
