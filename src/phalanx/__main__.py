"""``python -m phalanx …``: the same command line as the ``phalanx`` script (``phalanx.cli:main``)."""

from __future__ import annotations

from phalanx.cli import main

if __name__ == "__main__":
    main()
