"""``python -m phalanx.cli``: the ``phalanx`` command."""

from phalanx.cli import main

main()
