"""Config edges: learning rates named by role (``client_lr`` for fedavg, ``node_lr`` for gossip and anytime — other
spellings of ``lr``, the same run and run id, refused where ``lr`` plays another role; a ``--set`` of any spelling
replaces the file's learning rate), algorithm-dependent defaults (anytime's momentum), and a decentralized run too
large for the machine refused before its dense n × n matrices are built."""

from __future__ import annotations

from pathlib import Path

import pytest

from phalanx.errors import ConfigError
from phalanx.experiments import from_config, grid, make_config
from phalanx.experiments.config import load_grid

FED = {"algorithm": "fedavg", "workers": 10, "aggregator": "cwtm", "f": 1}
GOSSIP = {"algorithm": "gossip", "workers": 8, "aggregator": "mean", "graph": "ring"}


@pytest.mark.parametrize(("base", "key"), [(FED, "client_lr"), (GOSSIP, "node_lr"), ({**GOSSIP, "algorithm": "anytime",
                                                                                      "momentum": 0.0}, "node_lr")])
def test_a_role_name_is_lr_with_the_same_run_id(base: dict[str, object], key: str) -> None:
    by_role = make_config({**base, key: 0.03})
    old = make_config({**base, "lr": 0.03})
    assert by_role.lr == 0.03 and grid.run_id(by_role) == grid.run_id(old)
    assert key not in by_role.model_dump()


@pytest.mark.parametrize(("data", "match"), [
    ({"client_lr": 0.05}, "client_lr=0.05 is invalid: allowed unset with algorithm = 'dsgd'"),
    ({**GOSSIP, "client_lr": 0.05}, "client_lr=0.05 is invalid"),
    ({**FED, "node_lr": 0.05}, "node_lr=0.05 is invalid"),
    ({**FED, "client_lr": 0.05, "lr": 0.1}, r"= lr \(0.1\) or lr unset"),
])
def test_a_role_name_where_it_does_not_apply_is_a_one_line_error(data: dict[str, object], match: str) -> None:
    with pytest.raises(ConfigError, match=match) as info:
        make_config(data)
    assert "\n" not in str(info.value)


def test_set_replaces_the_files_learning_rate_whatever_its_spelling(tmp_path: Path) -> None:
    job = tmp_path / "job.toml"
    job.write_text('algorithm = "fedavg"\nworkers = 10\naggregator = "cwtm"\nf = 1\nlr = 0.2\n')
    assert [c.lr for c in grid.configs(load_grid(job, ["client_lr=0.01"]))] == [0.01]
    job.write_text('algorithm = "fedavg"\nworkers = 10\naggregator = "cwtm"\nf = 1\nclient_lr = [0.2, 0.3]\n')
    assert [c.lr for c in grid.configs(load_grid(job, []))] == [0.2, 0.3]
    assert [c.lr for c in grid.configs(load_grid(job, ["lr=0.05"]))] == [0.05]


def test_anytime_takes_its_own_default_momentum_and_refuses_an_explicit_one() -> None:
    cfg = make_config({**GOSSIP, "algorithm": "anytime"})
    assert cfg.momentum == 0.0
    assert grid.run_id(cfg) == grid.run_id(make_config({**GOSSIP, "algorithm": "anytime", "momentum": 0.0}))
    with pytest.raises(ConfigError, match=r"momentum=0\.9 is invalid: allowed 0 with algorithm = 'anytime'"):
        make_config({**GOSSIP, "algorithm": "anytime", "momentum": 0.9})


def test_a_decentralized_run_too_large_for_the_machine_is_refused_before_its_graph_is_built() -> None:
    import resource

    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(ConfigError, match=r"workers=100000 is invalid: allowed at most [\d,]+ nodes") as info:
        make_config({"algorithm": "gossip", "graph": "complete", "workers": 100_000, "aggregator": "mean"})
    assert "\n" not in str(info.value)
    grown_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert grown_kb < 500_000  # refused before any n × n matrix (80 GB of W alone) was allocated


def test_a_list_in_the_natural_shell_form_gets_the_quoting_hint() -> None:
    """``--set "aggregator=[cwtm,krum]"`` is not TOML (bare words): one line that says how to write it, not the
    rule parser's complaint about a spec named '[cwtm,krum]'."""
    from phalanx.experiments.config import apply_overrides

    says = r"""aggregator='\[cwtm,krum\]' .*a TOML list .*--set 'aggregator=\["cwtm", "krum"\]'"""
    with pytest.raises(ConfigError, match=says):
        apply_overrides({}, ["aggregator=[cwtm,krum]"])
    assert apply_overrides({}, ['aggregator=["cwtm", "krum"]'])["aggregator"] == ["cwtm", "krum"]
    assert apply_overrides({}, ["f=[1, 2]"])["f"] == [1, 2]


def test_an_unclosed_list_of_numbers_gets_a_hint_that_works() -> None:
    """``--set 'seed=[0,1'`` was told to quote each number (``seed=["0", "1"]``), which the seed then refuses as
    text: numbers need only the brackets closed — and the hint, applied, is accepted."""
    from phalanx.experiments.config import apply_overrides

    with pytest.raises(ConfigError, match=r"""seed='\[0,1' .*close the brackets .*--set 'seed=\[0, 1\]'\)""") as info:
        apply_overrides({}, ["seed=[0,1"])
    hint = str(info.value).rsplit("--set '", 1)[1].rstrip("')")
    assert apply_overrides({}, [hint])["seed"] == [0, 1]


def test_rounds_beyond_a_million_metric_rows_are_refused_before_anything_runs() -> None:
    """``rounds = 10**12`` was accepted silently: its metric rows (kept in memory, rewritten at every checkpoint)
    would grow without bound. At most 1,000,000 rows a run; raising eval_every allows more rounds."""
    with pytest.raises(ConfigError, match=r"rounds=1000000000000 .*<= 19,999,980 with eval_every = 20 .*1,000,000 "):
        make_config({"rounds": 10**12})
    assert make_config({"rounds": 19_999_980}).rounds == 19_999_980  # 999,999 evaluations + round 0
    with pytest.raises(ConfigError, match="rounds=19999981"):
        make_config({"rounds": 19_999_981})
    assert make_config({"rounds": 10**12, "eval_every": 10**7}).rounds == 10**12


def test_a_grid_too_large_to_validate_is_refused_before_a_point_is_built() -> None:
    """A grid of 4·10⁸ points grew to 3.9 GB before printing anything: the points are counted first."""
    from phalanx.experiments.grid import MAX_POINTS

    axes = {"seed": list(range(200)), "lr": [0.1 * i for i in range(1, 11)], "batch_size": list(range(1, 51)),
            "tie": {"rounds": [10, 20, 30], "eval_every": [5, 10, 15]}}
    with pytest.raises(ConfigError, match=r"grid='300,000 points \(200 seed × 10 lr × 50 batch_size × 3 tied\)' .*"
                                          r"at most 100,000 points"):
        grid.configs(axes)
    assert MAX_POINTS == 100_000 and len(grid.expand({"seed": list(range(10)), "lr": [0.1, 0.2]})) == 20


def test_a_misspelled_norm_is_refused_by_its_key_with_a_guess_before_any_point_is_built() -> None:
    """``model_params={norm="btach"}`` was refused only while the grid's first point was built, after the thread
    line, as ``norm=`` and without a guess (a newcomer's finding): now by the config's validation, naming the key as
    written and the closest norm."""
    from phalanx.experiments.config import apply_overrides, validate

    with pytest.raises(ConfigError, match=r"^model_params\.norm='btach' is invalid: .*'batch'.*did you mean batch\?"):
        validate(apply_overrides({}, ["model=cnn", 'model_params={norm="btach"}']))


def test_a_value_given_to_a_sections_name_says_which_key_was_meant() -> None:
    """``--set rule=cwtm`` (a newcomer's): ``rule`` is the section ``[rule]``, not a key; the one line names the
    section's key and its flat spelling (the mutant, the bare "a table of the keys of [rule]", names neither)."""
    with pytest.raises(ConfigError) as info:
        make_config({"rule": "cwtm"})
    text = str(info.value)
    assert "\n" not in text and text.startswith("[rule]='cwtm' is invalid")
    assert "did you mean --set rule.spec=cwtm or --set aggregator=cwtm?" in text


def test_an_unknown_key_is_a_short_line_with_its_suggestion() -> None:
    """The ~60 known keys are not listed (an 817-character line hid the hint at its end); a near miss is named."""
    with pytest.raises(ConfigError) as info:
        make_config({"rouns": 3})
    text = str(info.value)
    assert "\n" not in text and len(text) < 200 and text.endswith("(unknown key; did you mean rounds?)")


SPEC_STAGE = "phalanx.training.stages.update_clip:UpdateClip"


def test_set_reaches_a_stage_named_by_a_module_attr_spec() -> None:
    """``--set 'stages."mylab.stages:Clip".c=0.5'`` is the TOML dotted key of a stage named by its spec: its quoted
    part is one name, not split at its dots (before, the quotes stayed in the name and the stage was not found); a
    bad value names the parameter, and a broken key is one line naming --set."""
    from phalanx.experiments.config import apply_overrides

    made = apply_overrides({}, [f'stages."{SPEC_STAGE}".c=0.5'])
    assert made["stages"] == {SPEC_STAGE: {"c": 0.5}}
    assert apply_overrides({}, ["stages.'update_clip'.c=2"])["stages"] == {"update_clip": {"c": 2}}
    data = {"dataset": "digits", "model": "logreg", "workers": 6, "byzantine": 1, "f": 1, "rounds": 1}
    stages = from_config(make_config({**data, **made})).worker_stages
    assert [(type(s).__name__, s.c) for s in stages] == [("UpdateClip", 0.5)]  # type: ignore[attr-defined]
    with pytest.raises(ConfigError, match=r"stages\.phalanx\.training\.stages\.update_clip:UpdateClip\.c=-1"):
        make_config({**data, **apply_overrides({}, [f'stages."{SPEC_STAGE}".c=-1'])})
    with pytest.raises(ConfigError, match=r"^--set=.*is invalid: allowed a TOML key"):
        apply_overrides({}, [f'stages."{SPEC_STAGE}.c=1'])


def test_an_attack_written_as_a_call_says_where_its_parameters_go() -> None:
    """``attack='alie(z=1)'`` — the call form aggregator specs take — is refused saying where the parameters go,
    not "did you mean alie?" (a first-hour review); a table whose value is not TOML (``{z=abc}``: a string without
    quotes) says so, not "allowed a table" of what is a table."""
    from phalanx.experiments.config import apply_overrides

    with pytest.raises(ConfigError) as caught:
        make_config(apply_overrides({}, ["attack=alie(z=1.5)"]))
    assert "--set attack=alie --set 'attack_params={z = 1.5}'" in str(caught.value)
    assert make_config({"attack": "alie", "attack_params": {"z": 1.5}}).attack == "alie"  # what it says works
    with pytest.raises(ConfigError, match=r"attack_params='\{z=abc\}' is invalid: allowed a TOML inline table"):
        apply_overrides({}, ["attack_params={z=abc}"])
    with pytest.raises(ConfigError, match="did you mean alie"):  # a plain misspelling keeps its suggestion
        make_config({"attack": "alei"})


def test_a_grid_with_more_attackers_than_f_says_so_in_one_line() -> None:
    """``byzantine = 8`` with ``f = 4`` is a legitimate study of a rule beyond its budget, and a newcomer's typo:
    either way ``phalanx run`` says before training that the rules' guarantees do not cover those runs (a first-hour
    review); the mean, which tolerates no attacker whatever its f, is not counted. Mutant: no line."""
    from phalanx.cli.runs import over_budget_line
    from phalanx.experiments.config import apply_overrides

    base = {"dataset": "digits", "model": "logreg", "workers": 20, "attack": "alie", "aggregator": ["mean", "cwtm"]}
    over = grid.runs(apply_overrides(base, ["byzantine=8", "f=4"]))
    assert over_budget_line(over) == ("note: 1 run(s) have more attacking workers than their rule is configured for "
                                      "(e.g. byzantine = 8 > f = 4): the rules' guarantees do not cover them")
    assert over_budget_line(grid.runs(apply_overrides(base, ["byzantine=4", "f=4"]))) is None


@pytest.mark.parametrize("key", ['[x."a"]\n#', "[[aggregator_params]]\n\"a\"", ".".join(['"a"'] * 2000),
                                 'stages."a"."b"' + "." + ".".join(["c"] * 40)])
def test_a_hostile_quoted_set_key_is_one_line_naming_set(key: str) -> None:
    """A table header, a comment, a line break or thousands of parts in a ``--set`` key are refused in one line naming
    --set, before TOML or the nesting recurses (an attacker's review: 2,000 parts ended in a RecursionError, a
    header in an unpacking ValueError)."""
    from phalanx.experiments.config import apply_overrides

    with pytest.raises(ConfigError) as caught:
        apply_overrides({}, [f"{key}=1"])
    assert caught.value.parameter == "--set" and "\n" not in str(caught.value) and len(str(caught.value)) < 400


def test_a_quoted_part_without_a_dot_is_the_bare_key() -> None:
    """In TOML ``"workers"`` and ``workers`` are one key: ``--set run."workers"=5`` and ``rule."f"=3`` set what the
    bare spellings set (they were refused as two spellings of one key)."""
    from phalanx.experiments.config import apply_overrides

    for quoted, bare in (('"workers"=5', "workers=5"), ('rule."f"=3', "rule.f=3"), ('"attack".name=alie', None)):
        if bare is None:
            assert apply_overrides({}, [quoted])["attack"] == "alie"
        else:
            assert apply_overrides({}, [quoted]) == apply_overrides({}, [bare])
