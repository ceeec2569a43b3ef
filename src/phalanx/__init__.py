"""Phalanx: Byzantine-robust distributed learning.

Robust aggregators, Byzantine attacks, and the measurement of the price of robustness (Yang, Shi & Li, ICML 2025).
"""

from phalanx.errors import ConfigError, InputError, PhalanxError

__version__ = "0.1.0"

__all__ = ["ConfigError", "InputError", "PhalanxError", "__version__"]
