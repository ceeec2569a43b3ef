"""Phalanx: Byzantine-robust distributed learning.

Robust aggregators, Byzantine attacks, and the measurement of the price of robustness (Yang, Shi & Li, ICML 2025).
"""

from functools import lru_cache

from phalanx.errors import ConfigError, InputError, PhalanxError

__version__ = "0.1.0"

__all__ = ["ConfigError", "InputError", "PhalanxError", "__version__", "code_digest"]


@lru_cache(maxsize=1)
def code_digest() -> str:
    """SHA-256 (hex) of this installation's source and data: every file of the package but compiled ones
    (``__pycache__``, ``.pyc``, ``.so``: the ``.c`` they come from counts), each by its path relative to the package
    and its bytes, in sorted order — the default config and the embedded data and model included (about 4.6 MB).
    ``__version__`` stays the same across commits that change results; a run's manifest records this digest
    (``code``), so a grid that reuses or resumes a run trained by other code says so
    (:func:`phalanx.experiments.runner.say_other_code`)."""
    import hashlib
    from pathlib import Path

    root = Path(__file__).resolve().parent
    h = hashlib.sha256()
    compiled = (".pyc", ".so", ".pyd")
    for path in sorted(p for p in root.rglob("*")
                       if p.is_file() and p.suffix not in compiled and "__pycache__" not in p.parts):
        rel = path.relative_to(root).as_posix().encode()
        data = path.read_bytes()
        h.update(len(rel).to_bytes(8, "big") + rel + len(data).to_bytes(8, "big") + data)
    return h.hexdigest()
