"""mylab: an example Phalanx plug-in — a rule, an attack, a model, a data set, a loss, a round algorithm and a
study of one's own.

Phalanx finds them by ``module:attr`` spec (``aggregator = "mylab.rules:MedianOfMeans"``) when this directory is
on ``PYTHONPATH``, or by name (``aggregator = "median-of-means"``) once the package is installed: its
``pyproject.toml`` declares them as entry points. docs/extending.md walks through each file.
"""
