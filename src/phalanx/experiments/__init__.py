"""Experiments: run directories, results, checkpoints, sweeps and reports."""
