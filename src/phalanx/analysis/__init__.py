"""Analysis: the price of robustness (Yang, Shi & Li, ICML 2025) and measured (f, κ)-robustness."""

from phalanx.analysis.epsilon import EpsilonEstimate, aggregation_error, epsilon, lower_bound
from phalanx.analysis.kappa import KappaEstimate, kappa, proven_upper_bound, robustness_ratio, universal_lower_bound

__all__ = [
    "EpsilonEstimate", "KappaEstimate", "aggregation_error", "epsilon", "kappa", "lower_bound", "proven_upper_bound",
    "robustness_ratio", "universal_lower_bound",
]
