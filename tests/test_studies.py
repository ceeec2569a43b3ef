"""The study seam (phalanx.studies): the registry — built-ins, ``module:attr`` specs, entry points, one-line errors —
what every study declares, and the options every study command shares (a preset field or a run key)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from phalanx import studies
from phalanx.errors import ConfigError
from phalanx.studies import backdoor, convergence, corrupted, hbn, lora, neighbours, parallelism, privacy, tension
from phalanx.studies.base import Report, Study

BUILT_IN: dict[str, type[Study[Any, Any, Any]]] = {
            "tension": tension.Tension, "hbn": hbn.HBN, "parallelism": parallelism.Parallelism,
            "byzantine-neighbours": neighbours.ByzantineNeighbours, "privacy": privacy.Privacy,
            "backdoor": backdoor.BackdoorDefences,
            "corrupted-rounds": corrupted.CorruptedRounds, "lora": lora.Lora,
            "convergence": convergence.ConvergenceStudy}


def test_the_built_in_studies_are_registered_by_their_modules() -> None:
    assert set(BUILT_IN) <= set(studies.names())
    assert studies.names() == sorted(studies.names())
    for name, cls in BUILT_IN.items():
        assert studies.resolve(name) is cls and cls.name == name
        assert cls.default_preset in cls.presets and cls.help and cls.out.startswith("runs/")


def test_an_unknown_study_is_one_line_that_lists_them_and_suggests() -> None:
    with pytest.raises(ConfigError) as exc:
        studies.resolve("hbx")
    text = str(exc.value)
    assert "\n" not in text and text.startswith("study='hbx' is invalid")
    assert ("backdoor, byzantine-neighbours, convergence, corrupted-rounds, hbn, lora, parallelism, privacy, "
            "tension") in text
    assert "'module:attr' spec" in text
    assert "did you mean hbn?" in text


def test_a_spec_names_a_study_class_and_nothing_else() -> None:
    assert studies.resolve("phalanx.studies.hbn:HBN") is hbn.HBN
    for spec, says in (("phalanx.studies.hbn:Preset", "a subclass of phalanx.studies.Study"),
                       ("phalanx.studies.base:Study", "a subclass of phalanx.studies.Study"),  # abstract
                       ("no_such_module_xyz:Study", "whose module can be imported"),
                       ("phalanx.studies.hbn:Nope", "an attribute that exists in phalanx.studies.hbn")):
        with pytest.raises(ConfigError, match=says):
            studies.resolve(spec)


@dataclass(frozen=True)
class _Preset:
    name: str
    description: str
    dataset: str = "digits"
    fallback_dataset: str | None = None
    seeds: tuple[int, ...] = (0, 1)
    rounds: int = 2


_PRESETS = {"quick": _Preset("quick", "two runs")}


class _Tiny(Study[_Preset, int, float]):
    name = "tiny"
    help = "A study for the tests."
    preset_type = _Preset
    presets = _PRESETS
    out = "runs/tiny"

    def plan(self, preset: _Preset, overrides: dict[str, Any]) -> tuple[list[int], list[Any]]:
        return list(preset.seeds), []

    def collect(self, cells: list[int], configs: list[Any], runs_dir: Path) -> dict[int, float]:
        return {}

    def report(self, preset: _Preset, cells: list[int], collected: dict[int, float], out: Path, *, command: str,
               wall_seconds: float | None, runs: int, overrides: dict[str, Any]) -> Report:
        return Report([], [])


def test_a_study_must_declare_what_the_command_line_needs() -> None:
    from phalanx.studies.registry import _accept

    assert _accept(_Tiny, "tiny") is _Tiny
    bad_default = type("BadDefault", (_Tiny,), {"default_preset": "full"})
    with pytest.raises(ConfigError, match=r"presets include its default_preset 'full' \(presets: quick\)"):
        _accept(bad_default, "x")

    @dataclass(frozen=True)
    class Bare:
        name: str

    bare = type("Bare", (_Tiny,), {"preset_type": Bare})
    with pytest.raises(ConfigError, match="missing: description, dataset, fallback_dataset, seeds"):
        _accept(bare, "x")
    plain = type("Plain", (_Tiny,), {"preset_type": dict})
    with pytest.raises(ConfigError, match="preset_type is a dataclass"):
        _accept(plain, "x")


def test_a_study_without_its_declarations_is_refused() -> None:
    from phalanx.studies.registry import _accept

    class Undeclared(Study[Any, Any, Any]):
        def plan(self, preset: Any, overrides: dict[str, Any]) -> tuple[list[Any], list[Any]]:
            return [], []

        def collect(self, cells: list[Any], configs: list[Any], runs_dir: Path) -> dict[Any, Any]:
            return {}

        def report(self, preset: Any, cells: list[Any], collected: dict[Any, Any], out: Path, *, command: str,
                   wall_seconds: float | None, runs: int, overrides: dict[str, Any]) -> Report:
            return Report([], [])

    with pytest.raises(ConfigError, match="missing: name, help, preset_type, presets, out"):
        _accept(Undeclared, "x")


def test_register_makes_a_study_known_once(monkeypatch: pytest.MonkeyPatch) -> None:
    from phalanx.studies.registry import _REGISTRY

    monkeypatch.setattr(_REGISTRY, "_entries", dict(_REGISTRY._entries))
    assert studies.register(_Tiny) is _Tiny
    assert "tiny" in studies.names() and studies.resolve("tiny") is _Tiny
    with pytest.raises(RuntimeError, match="registered twice"):
        studies.register(_Tiny)


def test_set_keys_that_are_preset_fields_change_the_preset_the_others_are_run_keys() -> None:
    p, overrides = hbn.HBN().configure("quick", 2, ["rounds=5", "alphas=[0.5, 1.0]", "rules=[['mean', 0]]",
                                                    "lr=0.05", "dataset=digits"])
    assert p.rounds == 5 and p.alphas == (0.5, 1.0) and p.rules == (("mean", 0),) and p.seeds == (0, 1)
    assert p.lr == 0.05 and overrides == {}  # lr is a field of the preset: it is not a run key
    p, overrides = tension.Tension().configure("quick", 3, ["dataset=digits", "checkpoint_every=3",
                                                            "momentum=0.5", "local_steps=2"])
    assert p.momentum == 0.5 and overrides == {"checkpoint_every": 3, "local_steps": 2}
    with pytest.raises(ConfigError, match="preset"):
        hbn.HBN().configure("huge", 2, [])
    with pytest.raises(ConfigError, match="at least two distinct seeds"):
        parallelism.Parallelism().configure("quick", 1, [])


def test_a_misspelled_set_key_is_one_line_with_did_you_mean_over_preset_fields_and_run_keys() -> None:
    """``--set rulez=1``: the run keys' own check suggests among run keys only (nothing near "rulez"); the study
    suggests the preset's ``rules``, and a run key's misspelling still gets its run key. The mutant (no study-level
    check) raises the run keys' error, which names no preset field."""
    for study, key, meant in ((hbn.HBN(), "rulez", "rules"), (tension.Tension(), "momentun", "momentum"),
                              (hbn.HBN(), "checkpoint_evry", "checkpoint_every")):
        with pytest.raises(ConfigError) as exc:
            study.configure("quick", 2, [f"{key}=1", "dataset=digits"])
        text = str(exc.value)
        assert "\n" not in text and text.startswith(f"--set={key!r} is invalid") and f"did you mean {meant}" in text


def test_the_preset_falls_back_to_data_that_is_here(monkeypatch: pytest.MonkeyPatch) -> None:
    from phalanx import data
    from phalanx.data.base import DatasetNotFoundError

    real = data.load

    def load(name: str, **kwargs: Any) -> Any:  # Fashion-MNIST is not on this machine
        if name == "fashion-mnist":
            raise DatasetNotFoundError(name, [], "download it")
        return real(name, **kwargs)

    monkeypatch.setattr(data, "load", load)
    study = hbn.HBN()
    assert study.configure("quick", 2, [])[0].dataset == "digits"  # the preset's fallback_dataset
    assert study.data_note is not None and "names the data set fashion-mnist, which is not on this machine: it " \
        "runs on digits instead" in study.data_note
    assert study.configure("quick", 2, ["dataset=digits"])[0].dataset == "digits"
    assert study.data_note is None  # asked for by name: nothing to warn about
    with pytest.raises(DatasetNotFoundError):  # a data set asked for by name does not fall back
        hbn.HBN().configure("quick", 2, ["dataset=fashion-mnist"])


def _cli(args: list[str]) -> Any:
    from typer.testing import CliRunner

    from phalanx import cli

    return CliRunner().invoke(cli.app, args, env={"COLUMNS": "200"})  # help on one line per option


def test_experiment_lists_the_registered_studies_and_tension_keeps_paper() -> None:
    res = _cli(["experiment", "--help"])
    assert res.exit_code == 0, res.output
    for name, cls in BUILT_IN.items():
        assert f"│ {name} " in res.output and cls.help[:40] in res.output
    res = _cli(["tension", "--help"])
    assert res.exit_code == 0 and all(f"│ {c} " in res.output for c in ("paper", "plan", "theory", "convergence"))


TENSION_PRESETS = "quick (Fashion-MNIST/digits, minutes on a CPU), cpu (the full grids, ~1 h) or paper."


@pytest.mark.parametrize(("args", "preset_help", "out"), [
    (["tension", "paper"], TENSION_PRESETS, "runs/tension-quick"),
    (["experiment", "tension"], TENSION_PRESETS, "runs/tension-quick"),
    (["experiment", "hbn"], "quick (CPU, ≤ 30 min) or paper (CIFAR-10, GPU).", "runs/hbn-quick"),
    (["experiment", "parallelism"], "quick (digits, CPU, minutes) or full (Fashion-MNIST).", "runs/parallelism-quick"),
    (["experiment", "byzantine-neighbours"], "quick (digits, CPU, minutes) or full", "runs/neighbours-quick"),
    (["experiment", "phalanx.studies.hbn:HBN"], "quick (CPU, ≤ 30 min)", "runs/hbn-quick"),
    (["experiment", "lora"], "quick (the embedded tiny BERT", "runs/lora-quick"),
])
def test_every_study_command_has_the_shared_options_with_its_own_defaults(
    args: list[str], preset_help: str, out: str,
) -> None:
    res = _cli([*args, "--help"])
    assert res.exit_code == 0, res.output
    assert preset_help in res.output and f"[default: {out}]" in res.output
    for option in ("--preset", "--out", "--seeds", "--jobs", "--set", "--executor", "--partition", "--wait"):
        assert option in res.output
    # --results (report from raw per-run results, nothing trained): every one of these studies writes them
    assert "--results" in res.output


def test_every_built_in_study_writes_raw_results() -> None:
    """One mechanism (phalanx.studies.raw) for every study's runs.csv, LoRA's included (issue 34 item 4)."""
    from phalanx import studies

    names = {n for n in studies.names() if studies.resolve(n).raw_value is None}
    assert names == set()


def test_an_unknown_study_command_is_one_line(capsys: pytest.CaptureFixture[str],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    from phalanx import cli

    monkeypatch.setattr("sys.argv", ["phalanx", "experiment", "hbx", "--preset", "quick"])
    with pytest.raises(SystemExit) as exc:
        cli.main()
    assert exc.value.code == 2
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and "study='hbx' is invalid" in out and "did you mean hbn?" in out
    res = _cli(["tension", "pape"])
    assert res.exit_code == 2 and "Did you mean 'paper'?" in res.output


_FALLBACK_PRESETS = {"quick": _Preset("quick", "two runs", dataset="fashion-mnist", fallback_dataset="digits")}


class _Fallback(_Tiny):
    """A study whose preset names a data set that (in the test) is not on the machine."""

    name = "fallback-tiny"
    presets = _FALLBACK_PRESETS

    def report(self, preset: _Preset, cells: list[int], collected: dict[int, float], out: Path, *, command: str,
               wall_seconds: float | None, runs: int, overrides: dict[str, Any]) -> Report:
        out.mkdir(parents=True, exist_ok=True)
        (out / "report.md").write_text(f"# Tiny on {preset.dataset}\n\nnothing measured\n")
        return Report([out / "report.md"], ["done"])


def test_a_preset_that_runs_on_its_fallback_says_so_loudly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from phalanx import data
    from phalanx.data.base import DatasetNotFoundError

    real = data.load

    def load(name: str, **kwargs: Any) -> Any:
        if name == "fashion-mnist":
            raise DatasetNotFoundError(name, [], "download it")
        return real(name, **kwargs)

    monkeypatch.setattr(data, "load", load)
    res = _cli(["experiment", f"{__name__}:_Fallback", "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    warning = "preset quick names the data set fashion-mnist, which is not on this machine: it runs on digits instead"
    assert res.output.count(warning) == 2  # before training, and after the tables
    md = (tmp_path / "report.md").read_text()
    assert md.startswith("# Tiny on digits\n\n> **Warning: " + warning)
