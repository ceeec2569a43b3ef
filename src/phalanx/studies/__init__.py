"""Studies: experiments of the field as presets — a grid of runs, the statistics of its tables, a plot, a report —
and the planner, on top of the run machinery of :mod:`phalanx.experiments`."""
