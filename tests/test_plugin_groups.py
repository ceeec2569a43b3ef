"""Communication graphs and torchrun topologies have their own entry-point groups (``phalanx.graphs``,
``phalanx.torchrun_topologies``); the group they shared, ``phalanx.topologies``, is still read for both, with a
deprecation warning naming the group to move to."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from phalanx.decentralized import topology
from phalanx.plugins import Registry
from phalanx.training import transport

TARGET = "phalanx.decentralized.topology:ring"


def _site(tmp_path: Path, groups: dict[str, dict[str, str]]) -> Path:
    """A site directory with one installed distribution whose entry points are ``groups``."""
    meta = tmp_path / "site" / "lab_plugins-0.1.dist-info"
    meta.mkdir(parents=True)
    (meta / "METADATA").write_text("Metadata-Version: 2.1\nName: lab-plugins\nVersion: 0.1\n")
    lines = []
    for group, entries in groups.items():
        lines += [f"[{group}]", *(f"{name} = {target}" for name, target in entries.items())]
    (meta / "entry_points.txt").write_text("\n".join(lines) + "\n")
    return tmp_path / "site"


def test_the_two_kinds_read_two_groups() -> None:
    graphs = topology._REGISTRY
    assert (graphs.group, graphs.legacy_group) == ("phalanx.graphs", "phalanx.topologies")
    assert (transport.TOPOLOGIES.group, transport.TOPOLOGIES.legacy_group) == (
        "phalanx.torchrun_topologies", "phalanx.topologies")


def test_a_graph_in_its_own_group_is_not_a_torchrun_topology(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(_site(tmp_path, {"phalanx.graphs": {"labring": TARGET}})))
    graphs = Registry("topology", "phalanx.graphs", legacy_group="phalanx.topologies")
    torchrun = Registry("topology", "phalanx.torchrun_topologies", legacy_group="phalanx.topologies")
    assert "labring" in graphs.names() and "labring" not in torchrun.names()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the new group: no warning
        assert graphs.get("labring")(4).n == 4
    # the mutant: both kinds on one group again — the graph shows up as a torchrun topology
    shared = Registry("topology", "phalanx.graphs")
    assert "labring" in shared.names()


def test_the_old_group_is_still_read_with_a_deprecation_line(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(_site(tmp_path, {"phalanx.topologies": {"oldring": TARGET}})))
    graphs = Registry("topology", "phalanx.graphs", legacy_group="phalanx.topologies")
    assert "oldring" in graphs.names()
    with pytest.warns(DeprecationWarning, match=r"old group phalanx\.topologies; register it under phalanx\.graphs"):
        build = graphs.get("oldring")
    assert build(5).n == 5
    assert "oldring" not in Registry("topology", "phalanx.graphs").names()  # without the legacy group: not read


def test_the_new_group_wins_over_the_old_for_one_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(_site(tmp_path, {
        "phalanx.topologies": {"labring": "phalanx.decentralized.topology:complete"},
        "phalanx.graphs": {"labring": TARGET}})))
    graphs = Registry("topology", "phalanx.graphs", legacy_group="phalanx.topologies")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        graph = graphs.get("labring")(6)
    assert graph.degrees.tolist() == [2] * 6  # the ring, not the complete graph


def test_an_entry_point_shadowed_by_a_built_in_is_said_once() -> None:
    """An installed entry point named like a built-in is never used (the built-in comes first): said once, with the
    spec that reaches it (an extension author's review: ``cwtm = xlab.rules:Reputation`` ran the built-in silently).
    Phalanx's own entry points and one of the module that registers the name are not warned about."""
    import warnings
    from importlib.metadata import EntryPoint

    from phalanx.plugins import Registry

    class Builtin:
        pass

    reg: Registry[type] = Registry("aggregator", "phalanx.aggregators")
    reg.register(Builtin, name="cwtm")
    reg.register(Builtin, name="same")
    reg.register(Builtin, name="own")
    reg._entry_points = {
        "cwtm": EntryPoint("cwtm", "xlab.rules:Reputation", "phalanx.aggregators"),
        "same": EntryPoint("same", f"{Builtin.__module__}:Builtin", "phalanx.aggregators"),
        "own": EntryPoint("own", "phalanx.aggregators.cwtm:Trimmed", "phalanx.aggregators"),
    }
    with pytest.warns(UserWarning, match=r"'cwtm'.*xlab\.rules:Reputation.*shadowed by the built-in"):
        assert reg.get("cwtm") is Builtin
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert reg.get("cwtm") is Builtin  # once
        assert reg.get("same") is Builtin and reg.get("own") is Builtin


def test_a_loaded_entry_point_is_not_said_to_be_shadowed_by_itself(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """An installed plain-class rule (wrapped by Phalanx, so the object handed out is of another module) is loaded
    once and used: later lookups give the same class, say nothing of shadowing, and it stays out of the entries
    registered in this process (extension audit F5: the second lookup warned that the plug-in in use was "shadowed
    by the built-in … and never used")."""
    from phalanx.aggregators import registry as rules

    pkg = tmp_path / "f5lab"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "rules.py").write_text("import torch\n\n\nclass Plain:\n    def __init__(self, f=0):\n        self.f = f\n\n"
                                  "    def __call__(self, x):\n        return x.mean(0)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.syspath_prepend(str(_site(tmp_path, {"phalanx.aggregators": {"f5-plain": "f5lab.rules:Plain"}})))
    reg = Registry("aggregator", "phalanx.aggregators", rules._accept)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        first = reg.get("f5-plain")
        assert first.__module__ == "phalanx.aggregators.registry"  # the wrapper: not the entry point's module
        assert reg.get("f5-plain") is first and reg.names().count("f5-plain") == 1
    assert "f5-plain" not in reg.registered()


def test_phalanx_no_plugins_hides_installed_entry_points_and_nothing_else(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``PHALANX_NO_PLUGINS=1``: an installed entry point is neither listed nor found by name — in a registry, in the
    catalogue's names beyond its table, in the sections read — while a ``module:attr`` spec still loads; unset (or
    ``0``), it is read again, with no cache left from the hidden read."""
    from phalanx import catalogue
    from phalanx.plugins import NO_PLUGINS, installed_entry_points

    monkeypatch.syspath_prepend(str(_site(tmp_path, {"phalanx.graphs": {"labring": TARGET},
                                                     "phalanx.aggregators": {"zz-rule": "mylab_zz:Rule"}})))
    graphs = Registry("topology", "phalanx.graphs")  # a registry of its own: the process's are left as they are
    where = catalogue.Group("phalanx.aggregators", "not_imported_here")  # the entry points alone, nothing loaded
    monkeypatch.setenv(NO_PLUGINS, "1")
    assert "labring" not in graphs.names() and "labring" not in graphs
    assert installed_entry_points("phalanx.graphs") == []
    assert "zz-rule" not in catalogue.extra_names((), where)
    assert graphs.get(TARGET)(4).n == 4  # named, not discovered
    monkeypatch.setenv(NO_PLUGINS, "0")
    assert "labring" in graphs.names() and graphs.get("labring")(4).n == 4
    assert "zz-rule" in catalogue.extra_names((), where)
