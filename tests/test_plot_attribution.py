"""Issue 38: no plot that misattributes. A folder holding CNN and MLP runs (docs/start.md step 2, rerun shrunk into
the same folder) drew a heat map whose cells averaged the two models (mean/none = 79: CNN 81.2, MLP 76.0), and an
``accuracy.png`` whose line style followed the (attack, model) pair, so that "mean, alie, cnn" and "mean, signflip,
mlp" were both solid orange. Each check here is played against the broken variant (the mutant) it must reject."""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from phalanx.experiments import plots, report, store

ACC = {("cnn", "mean", "none"): 0.812, ("mlp", "mean", "none"): 0.760, ("cnn", "mean", "alie"): 0.781,
       ("mlp", "mean", "alie"): 0.760, ("cnn", "cwtm", "none"): 0.80, ("mlp", "cwtm", "none"): 0.74,
       ("cnn", "cwtm", "alie"): 0.79, ("mlp", "cwtm", "alie"): 0.70}
"""The newcomer's two-model grid: final accuracy per (model, aggregator, attack)."""


def _summary() -> list[dict[str, Any]]:
    return [{"model": m, "aggregator": a, "attack": t, "final_accuracy": v} for (m, a, t), v in ACC.items()]


def _pooling_panels(summary: list[dict[str, Any]], keys: list[str]
                    ) -> list[tuple[str, list[str], list[str], list[list[float]]]]:
    """The mutant: the heat map before issue 38 — one panel, each cell the mean over every setting in it."""
    aggs = sorted({s["aggregator"] for s in summary})
    atts = sorted({s["attack"] for s in summary})
    cells: dict[tuple[str, str], list[float]] = defaultdict(list)
    for s in summary:
        cells[(s["aggregator"], s["attack"])].append(100 * s["final_accuracy"])
    return [("", aggs, atts, [[sum(cells[(a, t)]) / len(cells[(a, t)]) for t in atts] for a in aggs])]


def _misattributed(panels: Any) -> list[str]:
    """Every cell of ``panels(summary, keys)`` whose number is not the accuracy of the one setting its panel title and
    its row and column name."""
    keys = ["aggregator", "attack", "model"]
    bad = []
    for title, aggs, atts, grid in panels(_summary(), keys):
        model = dict(p.split("=") for p in title.split(", ") if p).get("model")
        for i, a in enumerate(aggs):
            for j, t in enumerate(atts):
                want = ACC.get((str(model), a, t))
                if want is None or not math.isclose(grid[i][j], 100 * want):
                    bad.append(f"{title or '(one panel)'}: {a}/{t} = {grid[i][j]:.1f}")
    return bad


def test_heatmap_never_pools_a_varying_key() -> None:
    assert _misattributed(plots.heatmap_panels) == []
    assert "(one panel): mean/none = 78.6" in _misattributed(_pooling_panels)  # the mutant pools: rejected
    titles = [p[0] for p in plots.heatmap_panels(_summary(), ["aggregator", "attack", "model"])]
    assert titles == ["model=cnn", "model=mlp"]


def test_heatmap_leaves_a_cell_two_settings_would_fill_empty() -> None:
    """A key left out of ``keys`` (a caller's slip) blanks the cells it would pool — never their mean."""
    [(_, _, _, grid)] = plots.heatmap_panels(_summary(), ["aggregator", "attack"])
    assert all(math.isnan(v) for row in grid for v in row)


def _runs(out: Path, attacks: tuple[str, ...] = ("alie", "none")) -> None:
    for (model, agg, att), acc in ACC.items():
        if att not in attacks:
            continue
        d = out / f"{model}-{agg}-{att}"
        cfg = {"aggregator": agg, "attack": att, "model": model}
        store.prepare_run_dir(d, cfg, 0, "synthetic")
        store.finish_run(d, [{**cfg, "round": t, "test_accuracy": acc * t / 4, "agg_error": 0.5, "byz_share": 0.1}
                             for t in range(1, 5)])


def _figures(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Per file name, the figure the report saves (drawn, before it is closed)."""
    seen: dict[str, Any] = {}
    real = plots.save_figure

    def save(fig: Any, path: Path, dpi: int = 100) -> Path:
        fig.canvas.draw()
        seen[path.name] = {
            "titles": [ax.get_title() for ax in fig.axes],
            "texts": [[t.get_text() for t in ax.texts] for ax in fig.axes],
            "overlap": [_legend_overlaps(ax) for ax in fig.axes],
            "legend_titles": [ax.get_legend().get_title().get_text() for ax in fig.axes if ax.get_legend()],
        }
        return real(fig, path, dpi)

    monkeypatch.setattr(plots, "save_figure", save)
    return seen


def _legend_overlaps(ax: Any) -> bool:
    """Whether the axes' legend lies (partly) over the axes' plotting area."""
    legend = ax.get_legend()
    return legend is not None and legend.get_window_extent().overlaps(ax.get_window_extent())


def test_report_of_a_two_model_folder_draws_a_panel_per_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                              ) -> None:
    seen = _figures(monkeypatch)
    _runs(tmp_path)
    report.write_report(tmp_path)
    heat = seen["heatmap.png"]
    assert heat["titles"][:2] == ["model=cnn", "model=mlp"]
    cnn, mlp = heat["texts"][:2]  # rows cwtm, mean; columns alie, none
    assert cnn == ["79", "80", "78", "81"] and mlp == ["70", "74", "76", "76"]
    assert "79" not in mlp and "77" not in cnn + mlp  # the pooled values (mean/none 78.6, mean/alie 77.0) are gone


OLD_LINESTYLES = ("-", "--", ":", "-.")
"""The mutant's line styles (``plots.LINESTYLES`` before issue 38)."""


def _pair_styles(rows: list[dict[str, Any]], keys: list[str]) -> dict[str, dict[str, Any]]:
    """The mutant: ``accuracy.png``'s styles before issue 38 — colour per rule, line style and marker by the rank of
    the pair of the other keys (so the dash of an attack depended on the model too)."""
    colours = plots.rule_colours([str(r.get("aggregator")) for r in rows])
    rest = [k for k in keys if k != "aggregator"]
    others = sorted({plots.setting_label(r, rest) for r in rows})
    out = {}
    for r in rows:
        i = others.index(plots.setting_label(r, rest))
        out[plots.setting_label(r, keys)] = {"color": colours[str(r.get("aggregator"))],
                                             "linestyle": OLD_LINESTYLES[i % len(OLD_LINESTYLES)],
                                             "marker": plots.MARKERS[i % len(plots.MARKERS)]}
    return out


def _channels_mixing_keys(styles_of: Any, keys: list[str]) -> list[str]:
    """Each channel whose value is not a function of its one key alone, or that gives two values of it one value."""
    rows = [{"aggregator": a, "attack": t, "model": m, "f": f}
            for a in ("cwtm", "mean", "nnm>cwtm") for t in ("alie", "none", "signflip") for m in ("cnn", "mlp")
            for f in (1, 2)]
    styles = styles_of(rows, keys)
    rest = [k for k in keys if k not in ("aggregator", "attack")]  # the marker's, then the fill's, in keys' order
    channel = dict(zip(("color", "linestyle", "marker", "fillstyle"), ["aggregator", "attack", *rest]))
    if not rest:
        channel["marker"] = "attack"  # two keys: the marker doubles the dash
    bad = []
    for c, key in channel.items():
        by_value: dict[Any, set[str]] = defaultdict(set)
        for r in rows:
            by_value[r[key]].add(repr(styles[plots.setting_label(r, keys)].get(c)))
        if any(len(v) != 1 for v in by_value.values()) or len(set.union(*by_value.values())) != len(by_value):
            bad.append(f"{c} ({key})")
    return bad


@pytest.mark.parametrize("keys", [["aggregator", "attack"], ["aggregator", "attack", "model"],
                                  ["aggregator", "f", "attack", "model"]])
def test_each_visual_channel_follows_one_key(keys: list[str]) -> None:
    assert _channels_mixing_keys(plots.curve_styles, keys) == []


def test_the_pair_based_styles_are_rejected() -> None:
    """The mutant: its dash follows the (attack, model) pair — "mean, alie, cnn" and "mean, signflip, cnn" share one,
    while "mean, alie, mlp" has another."""
    assert "linestyle (attack)" in _channels_mixing_keys(_pair_styles, ["aggregator", "attack", "model"])
    styles = _pair_styles([{"aggregator": "mean", "attack": t, "model": m} for t in ("alie", "none", "signflip")
                           for m in ("cnn", "mlp")], ["aggregator", "attack", "model"])
    alie_cnn, alie_mlp = styles["mean, attack=alie, model=cnn"], styles["mean, attack=alie, model=mlp"]
    assert alie_cnn["linestyle"] == styles["mean, attack=signflip, model=cnn"]["linestyle"] != alie_mlp["linestyle"]


def test_legend_says_which_channel_is_which() -> None:
    assert plots.legend_title(["aggregator", "attack", "model"]) == "colour: aggregator · line: attack · marker: model"
    assert plots.legend_title(["aggregator", "attack"]) == "colour: aggregator · line + marker: attack"
    assert plots.legend_title(["aggregator", "f", "attack", "model", "lr"]) == (
        "colour: aggregator · line: attack · marker: f · fill: model, lr")


def test_accuracy_legends_lie_outside_the_axes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`make run`'s middle panel: a legend inside covered a curve at its "≈ 0" floor. Mutant: a legend inside."""
    seen = _figures(monkeypatch)
    _runs(tmp_path)
    report.write_report(tmp_path)
    acc = seen["accuracy.png"]
    assert set(acc["legend_titles"]) == {"colour: aggregator · line: attack · marker: model"}  # every legend drawn
    assert acc["overlap"] == [False] * len(acc["overlap"])
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    ax.plot([0, 1], [0, 1], label="x")
    ax.legend(loc="lower right")  # the mutant's placement
    fig.canvas.draw()
    assert _legend_overlaps(ax)
    plt.close(fig)


def test_a_single_attack_is_named_in_the_title(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen = _figures(monkeypatch)
    _runs(tmp_path, attacks=("alie",))
    report.write_report(tmp_path)
    assert seen["accuracy.png"]["titles"][0] == "Test accuracy per setting — attack: alie"


def test_a_heatmap_of_many_settings_draws_at_most_its_cap_and_says_so(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A panel per setting of the other keys grows with the grid; past ``MAX_HEATMAP_PANELS`` the figure draws that
    many and its title says how many there were (a grid of a thousand would exceed the largest image matplotlib
    draws)."""
    summary = [{"lr": lr, "aggregator": a, "attack": t, "final_accuracy": 0.5}
               for lr in range(30) for a in ("mean", "cwtm") for t in ("none", "alie")]
    seen: dict[str, Any] = {}
    real = plots.save_figure

    def keep(fig: Any, path: Path, **kw: Any) -> Path:
        seen["axes"] = [ax for ax in fig.axes if ax.get_visible() and ax.images]
        seen["title"] = fig._suptitle.get_text()
        return real(fig, path, **kw)

    monkeypatch.setattr(plots, "save_figure", keep)
    assert plots.plot_heatmap(summary, tmp_path / "h.png", ["aggregator", "attack", "lr"]) is not None
    assert len(seen["axes"]) == plots.MAX_HEATMAP_PANELS == 24
    assert "the first 24 of 30" in seen["title"]


def _hidden(ax: Any) -> list[str]:
    """Every line of ``ax`` that a later line hides: drawn within a line width of it (``coincide.coincide`` on the
    axis' height) at the same x, and not narrower (no casing shows the line beneath)."""
    from phalanx.experiments import coincide

    log = ax.get_yscale() == "log"
    low, high = ax.get_ylim()
    span = math.log10(high / low) if log else high - low
    lines = [ln for ln in ax.get_lines() if len(ln.get_xdata()) > 1 and not ln.get_label().startswith("_")]
    hidden = []
    for i, under in enumerate(lines):
        for over in lines[i + 1:]:
            same_x = list(under.get_xdata()) == list(over.get_xdata())
            if (same_x and coincide.coincide(list(under.get_ydata()), list(over.get_ydata()), log=log, span=span)
                    and under.get_linewidth() <= over.get_linewidth()):
                hidden.append(f"{under.get_label()} under {over.get_label()}")
    return hidden


def _no_separation(series: dict[str, Any], *, linewidth: float, **_: Any) -> dict[str, Any]:
    """The mutant: every curve drawn alike, as before issue 38 (the later hides the earlier)."""
    from phalanx.experiments.coincide import Separation

    return {label: Separation(linewidth) for label in series}


def _axes_of(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[Any]]:
    """Per file name, the axes of the figure the code saves (drawn, before it is closed)."""
    seen: dict[str, list[Any]] = {}
    real = plots.save_figure

    def save(fig: Any, path: Path, dpi: int = 100) -> Path:
        fig.canvas.draw()
        seen[path.name] = list(fig.axes)
        return real(fig, path, dpi)

    monkeypatch.setattr(plots, "save_figure", save)
    return seen


@pytest.mark.parametrize("mutant", [False, True])
def test_coincident_convergence_curves_are_both_visible(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        mutant: bool) -> None:
    """``convergence.png`` of the committed quick results (nothing run): cwmed's curve lay under krum's. Now krum's
    is drawn thinner over cwmed's thicker one and its label says so; the mutant (drawn alike) hides cwmed."""
    from typer.testing import CliRunner

    from phalanx import cli
    from phalanx.experiments import coincide

    if mutant:
        monkeypatch.setattr(coincide, "separate", _no_separation)
    seen = _axes_of(monkeypatch)
    res = CliRunner().invoke(cli.app, ["tension", "convergence", "--preset", "quick", "--out", str(tmp_path),
                                       "--results", "docs/results/convergence_quick_runs.csv"])
    assert res.exit_code == 0, res.output
    least = next(ax for ax in seen["convergence.png"] if ax.get_title().startswith("least-squares"))
    if mutant:
        assert _hidden(least) == ["cwmed under krum f=5"]
        return
    assert _hidden(least) == []
    labels = [t.get_text() for t in least.get_legend().get_texts()]
    assert "krum f=5 (≈ cwmed, drawn over it)" in labels


def _equal_accuracy_runs(out: Path, errors: dict[str, Any]) -> None:
    """A sweep folder of one seed per rule, every rule at the same accuracy, with the aggregation errors ``errors``
    (rule → error in round t)."""
    for agg, err in errors.items():
        d = out / agg.replace(">", "-")
        cfg = {"aggregator": agg, "attack": "none"}
        store.prepare_run_dir(d, cfg, 0, "synthetic")
        store.finish_run(d, [{**cfg, "round": t, "test_accuracy": 0.2 * t, "agg_error": err(t), "byz_share": 0.0}
                             for t in range(1, 5)])


EXACT = {"mean": lambda t: 0.0, "cwtm": lambda t: 0.3 / t, "nnm>cwtm": lambda t: 10.0 ** -(1 + t)}
"""A fedavg/mean sweep's errors: the mean's exactly 0, the others over four decades."""


def test_equal_accuracy_curves_are_both_visible(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen = _axes_of(monkeypatch)
    _equal_accuracy_runs(tmp_path, EXACT)
    report.write_report(tmp_path)
    acc = seen["accuracy.png"][0]
    assert _hidden(acc) == []
    assert "mean (= cwtm, drawn over it)" in [t.get_text() for t in acc.get_legend().get_texts()]
    from phalanx.experiments import coincide

    monkeypatch.setattr(coincide, "separate", _no_separation)  # the mutant: drawn alike
    report.write_report(tmp_path)
    assert _hidden(seen["accuracy.png"][0]) == ["cwtm under mean", "cwtm under nnm>cwtm", "mean under nnm>cwtm"]


def _lost(ax: Any) -> list[str]:
    """Every line with a point the axes cannot show: ≤ 0 on a log axis, or outside the y limits."""
    low, high = ax.get_ylim()
    log = ax.get_yscale() == "log"
    return [ln.get_label() for ln in ax.get_lines()
            if any((log and y <= 0) or not low <= y <= high for y in ln.get_ydata())]


def test_an_exact_zero_error_is_drawn_on_the_log_axis_edge(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A sweep whose mean's aggregation error is exactly 0: the axis stays logarithmic (the others span four
    decades), the mean lies on its bottom edge, named "= 0". Mutants: zeros left on a log axis (matplotlib drops
    them: the series vanishes), and the axis made linear by the zero (where 1e-5 and 0 look alike)."""
    seen = _axes_of(monkeypatch)
    _equal_accuracy_runs(tmp_path, EXACT)
    report.write_report(tmp_path)
    errors = seen["accuracy.png"][1]
    assert errors.get_yscale() == "log" and _lost(errors) == []
    assert "mean (= 0: on the bottom edge)" in [t.get_text() for t in errors.get_legend().get_texts()]
    [mean] = [ln for ln in errors.get_lines() if ln.get_label().startswith("mean")]
    floor = plots.error_axis([v(t) for v in EXACT.values() for t in range(1, 5)])[1]
    assert set(mean.get_ydata()) == {floor}
    assert floor is not None and errors.get_ylim()[0] == pytest.approx(floor / plots.FLOOR_MARGIN)  # on the edge
    assert plots.FLOOR_MARGIN < 1.5  # not floor / 2, where the curve floated a third of a decade above the edge
    assert plots.error_axis([0.0, 1e-5, 0.3]) == (True, pytest.approx(1e-6))
    assert plots.error_axis([0.0, 0.05, 0.09]) == (True, pytest.approx(0.005))  # zero and a narrow range: log too
    assert plots.error_axis([0.0, 0.0]) == (False, None) and plots.error_axis([0.1, 0.3]) == (False, None)
    monkeypatch.setattr(plots, "_on_floor", lambda label, ys, floor: (ys, label, False))  # mutant 1: zeros kept
    report.write_report(tmp_path)
    assert _lost(seen["accuracy.png"][1]) == ["mean"]
    monkeypatch.setattr(plots, "error_axis", lambda values: (False, None))  # mutant 2: linear, as before
    report.write_report(tmp_path)
    assert seen["accuracy.png"][1].get_yscale() != "log"  # what the first assertion rejects


def test_the_byzantine_share_is_a_fraction_on_a_linear_axis_from_zero(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A share is part of the aggregate, in [0, 1]: one share of 0 turned the panel logarithmic and put 0 at the
    bottom edge, 0.017, where it read as 1.7 % (issue 38). Now linear from 0: every share where its value is, 0 at
    0, the largest inside the axes. Mutant: the error's axis rule for the share too (a log axis)."""
    seen = _axes_of(monkeypatch)
    for agg, share in {"mean": 0.2, "cwtm": 0.0, "krum": 0.017}.items():
        d = tmp_path / agg
        cfg = {"aggregator": agg, "attack": "alie"}
        store.prepare_run_dir(d, cfg, 0, "synthetic")
        store.finish_run(d, [{**cfg, "round": t, "test_accuracy": 0.2 * t, "agg_error": 0.1 * t, "byz_share": share}
                             for t in range(1, 5)])
    report.write_report(tmp_path)
    shares = seen["accuracy.png"][2]
    assert shares.get_yscale() == "linear" and _lost(shares) == []
    low, high = shares.get_ylim()
    assert low <= 0.0 < 0.2 <= high <= 0.25
    drawn = {ln.get_label().split(" (")[0]: set(ln.get_ydata()) for ln in shares.get_lines()}
    assert drawn == {"mean": {0.2}, "cwtm": {0.0}, "krum": {0.017}}  # each at its value: 0 at 0
    monkeypatch.setattr(plots, "panel_axis", lambda metric, values: (  # the mutant: the rule before
        plots.error_axis(values) if metric != "test_accuracy" else (False, None)))
    report.write_report(tmp_path)
    assert seen["accuracy.png"][2].get_yscale() == "log"  # what the first assertion rejects


def test_a_long_legend_is_inside_the_image(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A folder of 40 settings: every legend entry lies inside the PNG written (a newcomer's planner folder of 55
    ran off the right and bottom edges, entries cut to "cwtm, f…", issue 38). The legends take columns of at most
    ``LEGEND_ROWS`` entries, beside the axes; the image is the figure's tight box. Mutant: the figure's own box
    (``savefig`` without ``bbox_inches``) cuts them."""
    import matplotlib.image

    for i in range(40):
        d = tmp_path / f"r{i}"
        cfg = {"aggregator": ["cwtm", "geomed", "krum", "mean"][i % 4], "attack": ["none", "alie"][i // 4 % 2],
               "f": i // 8}
        store.prepare_run_dir(d, cfg, 0, "synthetic")
        store.finish_run(d, [{**cfg, "round": t, "test_accuracy": 0.02 * i + 0.1 * t, "agg_error": 0.01 * (i + 1),
                              "byz_share": 0.005 * i} for t in range(1, 4)])
    right: list[float] = []
    real = plots.save_figure

    def measured(fig: Any, path: Path, dpi: int = 100) -> Path:
        if path.name != "accuracy.png":
            return real(fig, path, dpi)
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        left = fig.get_tightbbox(renderer).x0 * fig.dpi  # inches → pixels at the figure's dpi
        legends = [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None]
        assert legends and max(len(lg.get_texts()) for lg in legends) == 40
        right.append((max(lg.get_window_extent(renderer).x1 for lg in legends) - left) * dpi / fig.dpi)
        return real(fig, path, dpi)

    monkeypatch.setattr(plots, "save_figure", measured)
    report.write_report(tmp_path)
    width = matplotlib.image.imread(tmp_path / "accuracy.png").shape[1]
    assert right and width >= right[0], (width, right)


def test_a_rule_has_the_same_colour_in_every_figure() -> None:
    """A newcomer saw orange stand for geomed, cwtm and the mean in three figures: colours were handed out by sorted
    position within each figure. Now a rule keeps its colour across figures with different rule sets (the README's
    five, the planner's, a gossip run's), and a figure of ≤ 10 rules still gives each its own. Mutant: the
    positional assignment."""
    sets = [["mean", "cwtm", "geomed", "krum", "nnm>cwtm"], ["cwtm", "geomed", "cwmed"], ["mean", "cwtm", "nnm>cwtm"],
            ["cwtm", "my.plugin:rule", "mean", "clip>krum"]]

    def positional(rules: list[str]) -> dict[str, str]:
        return {r: f"C{i % 10}" for i, r in enumerate(sorted(set(rules)))}

    for assign, consistent in ((plots.rule_colours, True), (positional, False)):
        seen: dict[str, set[str]] = {}
        for rules in sets:
            colours = assign(rules)
            assert len(set(colours.values())) == len(rules)  # distinct within a figure
            for r, c in colours.items():
                seen.setdefault(r, set()).add(c)
        assert all(len(c) == 1 for c in seen.values()) is consistent, seen
    many = [f"rule{i}" for i in range(12)]
    assert set(plots.rule_colours(many).values()) == {f"C{i}" for i in range(10)}  # beyond 10 they repeat


def test_the_planners_plot_draws_each_rule_in_its_colour(tmp_path: Path) -> None:
    """``plan.png`` draws cwtm and geomed in their colours, as every other figure does (the mean: a black star).
    Mutant: the planner's former positional ``C{i}``."""
    from types import SimpleNamespace

    import matplotlib.pyplot as plt

    from phalanx.studies import planner

    drawn: dict[str, str] = {}

    def capture(fig: Any, path: Path, dpi: int = 100) -> Path:
        drawn.update({str(line.get_label()): str(line.get_color()) for ax in fig.axes for line in ax.get_lines()})
        plt.close(fig)
        return path

    rows = [planner.Row(rule=r, f=f, no_attack=a, cost=0.0, agg_error=None, under_attack={"alie": w}, worst=w,
                        worst_attack="alie") for r, f, a, w in
            (("mean", 0, 0.95, 0.1), ("geomed", 2, 0.93, 0.85), ("cwtm", 2, 0.94, 0.9))]
    monkey = pytest.MonkeyPatch()
    monkey.setattr(planner, "save_figure", capture)
    try:
        planner.plot(rows, SimpleNamespace(expect=2), SimpleNamespace(rule="cwtm", f=2),  # type: ignore[arg-type]
                     tmp_path / "plan.png")
    finally:
        monkey.undo()
    colours = plots.rule_colours(["cwtm", "geomed", "cwmed"])  # another figure's set
    assert drawn["cwtm"] == colours["cwtm"] and drawn["geomed"] == colours["geomed"]
    assert drawn["mean (no defence)"] == "k"


def test_a_large_group_of_coincident_curves_is_noted_not_cased() -> None:
    """Six accuracy curves that all reach ~95 % coincide: casing them made the first 12.6 pt wide, a band over the
    panel (the README job's accuracy.png). Groups of more than MOST_CASED are only noted in the legend; a pair is
    still cased. Mutant: casing every group (MOST_CASED unbounded)."""
    from phalanx.experiments import coincide

    six = {f"rule{i}": [10.0, 60.0, 90.0, 95.0, 95.0 + 0.01 * i] for i in range(6)}
    pair = {"a": [1.0, 2.0, 3.0], "b": [1.0, 2.0, 3.0], "c": [30.0, 20.0, 10.0]}
    for most, bounded in ((coincide.MOST_CASED, True), (10**6, False)):
        got = {k: v for k, v in coincide.__dict__.items() if k == "MOST_CASED"}
        assert got
        coincide.MOST_CASED = most
        try:
            sep = coincide.separate(six, log=False, linewidth=1.6)
            two = coincide.separate(pair, log=False, linewidth=1.6)
        finally:
            coincide.MOST_CASED = got["MOST_CASED"]
        assert (max(s.linewidth for s in sep.values()) == 1.6) is bounded
        assert sum(bool(s.note) for s in sep.values()) == 5
        assert two["a"].linewidth > two["b"].linewidth == two["c"].linewidth == 1.6 and "drawn over it" in two["b"].note


def test_a_curve_of_one_point_hides_nothing() -> None:
    """The README job's mean under ``inf`` diverged at round 1: its one drawn point (round 0, where every run starts)
    was read as lying under cwtm's whole curve, and the legend said so. A curve coincides only at most of the longer
    curve's points, and at two at least. Mutant: the share over the points both draw (one: 100 %)."""
    from phalanx.experiments import coincide

    nan = float("nan")
    full = [8.0, 70.0, 90.0, 94.0, 95.0]
    stub = [8.0, nan, nan, nan, nan]
    assert not coincide.coincide(full, stub, log=False, span=100.0)
    assert coincide.coincide(full, [8.0, 70.5, 90.0, 94.0, 95.2], log=False, span=100.0)
    assert not coincide.coincide([8.0, nan], [8.0, nan], log=False, span=100.0)  # one point each: nothing hidden


def test_the_neighbours_plot_draws_each_rule_in_its_colour(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The Byzantine-neighbours figure drew the mean blue and cwtm orange (positional colours) while every other
    figure draws cwtm blue and the mean red; from the committed raw results (nothing trained). Mutant: no
    ``color=`` (matplotlib's cycle, the mean first in C0)."""
    import matplotlib.pyplot as plt
    from typer.testing import CliRunner

    from phalanx import cli
    from phalanx.studies import neighbours

    drawn: dict[str, str] = {}

    def capture(fig: Any, path: Path, dpi: int = 100) -> Path:
        for ax in fig.axes:
            handles, labels = ax.get_legend_handles_labels()
            for handle, label in zip(handles, labels):
                drawn[label] = str(handle[0].get_color())  # an errorbar's container: its line first
        plt.close(fig)
        return path

    monkeypatch.setattr(neighbours, "save_figure", capture)
    results = Path(__file__).resolve().parents[1] / "docs" / "results" / "neighbours_quick_runs.csv"
    res = CliRunner().invoke(cli.app, ["experiment", "byzantine-neighbours", "--preset", "quick", "--results",
                                       str(results), "--out", str(tmp_path / "out")])
    assert res.exit_code == 0, res.output
    colours = plots.rule_colours(list(drawn))
    assert {"mean", "cwtm"} <= set(drawn) and drawn == colours, drawn
    assert colours["mean"] != "C0"  # the cycle's first colour, the mutant's for the mean


def test_a_rule_has_the_same_marker_in_every_trade_off_figure() -> None:
    """The trade-off plot's markers go with the rule, as its colours do (the mean was ◆ in one folder's figure and
    ■ — geomed's in the other — in another). Mutant: markers by sorted position within a figure."""
    sets = [["mean", "cwtm", "geomed", "krum", "nnm>cwtm"], ["mean", "cwtm", "nnm>cwtm"], ["mean", "geomed", "cwmed"]]

    def positional(rules: list[str]) -> dict[str, str]:
        return {r: plots.MARKERS[i] for i, r in enumerate(sorted(set(rules)))}

    for assign, consistent in ((plots.rule_markers, True), (positional, False)):
        seen: dict[str, set[str]] = {}
        for rules in sets:
            markers = assign(rules)
            assert len(set(markers.values())) == len(rules)
            for r, m in markers.items():
                seen.setdefault(r, set()).add(m)
        assert all(len(m) == 1 for m in seen.values()) is consistent, seen


def test_the_accuracy_title_says_each_curve_is_a_mean_over_its_seeds() -> None:
    """A first-hour review read the accuracy curves as single runs: the title says how many seeds each averages."""
    rows = [{"aggregator": a, "attack": "none", "seed": s} for a in ("cwtm", "mean") for s in range(3)]
    assert plots.seeds_phrase(rows, ["aggregator"]) == " (each curve the mean over its 3 seeds, shaded: their range)"
    rows.append({"aggregator": "krum", "attack": "none", "seed": 0})
    assert plots.seeds_phrase(rows, ["aggregator"]) == " (each curve the mean over its 1–3 seeds, shaded: their range)"
    assert plots.seeds_phrase(rows[-1:], ["aggregator"]) == " (each curve the mean over its 1 seed)"
    assert plots.seeds_phrase([{"aggregator": "cwtm"}], ["aggregator"]) == ""


def test_the_accuracy_panel_shades_each_settings_range_over_its_seeds(tmp_path: Path) -> None:
    """The curve is the mean; the band behind it is the seeds' smallest to largest accuracy at each round (a mean
    alone hid a seed that failed). A setting with one seed, or a round only one seed reached, has no band; a seed's
    NaN is left out of the range."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    assert plots.seed_range({1: [0.5, 0.7, float("nan")], 2: [0.9], 3: [0.2, 0.4]}, 100.0) == (
        [1, 3], [50.0, 20.0], [70.0, 40.0])
    assert plots.seed_range({1: [0.5]}, 100.0) is None
    rows = [{"aggregator": a, "attack": "none", "seed": s, "run": f"{a}-{s}", "round": r, "test_accuracy": acc}
            for a, seeds in (("cwtm", (0, 1, 2)), ("krum", (0,))) for s in seeds
            for r, acc in ((1, 0.2 + 0.1 * s), (2, 0.5 + 0.1 * s))]
    shaded: list[Any] = []
    real = matplotlib.axes.Axes.fill_between

    def spy(self: Any, *args: Any, **kwargs: Any) -> Any:
        shaded.append((list(args[0]), list(args[1]), list(args[2])))
        return real(self, *args, **kwargs)

    matplotlib.axes.Axes.fill_between = spy  # type: ignore[method-assign]
    try:
        plots.plot_curves(rows, ["aggregator"], tmp_path / "accuracy.png")
    finally:
        matplotlib.axes.Axes.fill_between = real  # type: ignore[method-assign]
        plt.close("all")
    assert len(shaded) == 1  # cwtm's three seeds; krum's one seed has none
    xs, lows, highs = shaded[0]
    assert xs == [1, 2] and lows == pytest.approx([20.0, 50.0]) and highs == pytest.approx([40.0, 70.0])
