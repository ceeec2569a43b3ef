"""Analysis: the price of robustness (Yang, Shi & Li, ICML 2025)."""

from phalanx.analysis.epsilon import EpsilonEstimate, aggregation_error, epsilon, lower_bound

__all__ = ["EpsilonEstimate", "aggregation_error", "epsilon", "lower_bound"]
