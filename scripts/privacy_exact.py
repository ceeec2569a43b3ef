"""The DSGD budget Phalanx reports (the RDP accountant's upper bound) beside the exact ε of the same mechanism.

docs/privacy.md quotes these figures for the privacy study's quick preset (σ = 0.5, 1, 1.5 over T = 150 rounds,
δ = 10⁻⁵, every worker every round): the exact ε of μ-GDP with μ = √T/(σ/2)
(:func:`phalanx.analysis.privacy.exact_gdp_epsilon`, computed without dp-accounting) and the reported one
(:func:`phalanx.analysis.privacy.budget`).

    PYTHONPATH=src .venv/bin/python scripts/privacy_exact.py
"""

from __future__ import annotations

import math

from phalanx.analysis import privacy

DELTA = 1e-5
ROUNDS = 150


def main() -> None:
    print(f"{'sigma':>6} {'T':>5} {'exact eps':>10} {'reported eps':>13} {'reported/exact':>15}")
    for sigma in (0.5, 1.0, 1.5):
        exact = privacy.exact_gdp_epsilon(math.sqrt(ROUNDS) / (sigma / 2), DELTA)
        reported = privacy.budget(sigma, DELTA, ROUNDS, 20, 20).epsilon
        print(f"{sigma:>6} {ROUNDS:>5} {exact:>10.1f} {reported:>13.1f} {reported / exact:>15.3f}")


if __name__ == "__main__":
    main()
