"""LoRA adapters on pre-trained transformers (issue 35): the model, the frozen base, the three aggregation modes,
bad input, and runs through the config path.

The embedded model (``hf:phalanx-bert-tiny``) and the shipped ``sent140-sample`` keep these on two CPU cores; the
larger checks build a randomly initialised BERT of the same architecture into ``tmp_path`` (``hf:DIR``).
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("peft")

from phalanx import aggregators, data, hub, models
from phalanx.aggregators.lora import AdapterUpdates, LoraBlock, LoraLayout, updates_of
from phalanx.errors import ConfigError
from phalanx.training import adapters
from phalanx.training.problem import Problem

TINY = "hf:phalanx-bert-tiny"
LENGTH = 16


@pytest.fixture(scope="module")
def sample() -> data.Dataset:
    return data.load("sent140-sample", params={"tokenizer": TINY, "length": LENGTH})


def _tiny(mode: str = "factors", r: int = 4, seed: int = 0) -> torch.nn.Module:
    return models.make(TINY, (LENGTH,), 2, generator=torch.Generator().manual_seed(seed), r=r, aggregation=mode)


# ------------------------------------------------------------------------------------------- the model and its base


def test_embedded_model_is_found_offline_and_trained_vector_is_adapters_and_head() -> None:
    assert hub.resolve(TINY) == hub.EMBEDDED["phalanx-bert-tiny"]
    assert (hub.resolve(TINY) / "model.safetensors").is_file()
    model = _tiny()
    problem = Problem(model)
    names = problem.layout.names
    assert names and all(".lora_" in n or "classifier" in n for n in names)
    frozen = [n for n, p in model.named_parameters() if not p.requires_grad]
    assert frozen and not set(frozen) & set(names)  # the base is not in θ: it never travels
    assert problem.dim == sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert problem.initial_theta().shape == (problem.dim,)


def test_per_worker_gradients_in_one_vmap_equal_the_loop(sample: data.Dataset) -> None:
    problem = Problem(_tiny())
    theta = problem.initial_theta()
    theta += 0.01 * torch.randn(theta.shape, generator=torch.Generator().manual_seed(1))  # B ≠ 0: A gets gradients
    xb, yb = sample.train_x[:12].view(3, 4, LENGTH), sample.train_y[:12].view(3, 4)
    g = problem.grads(theta, xb, yb)
    assert g.shape == (3, problem.dim) and bool(torch.isfinite(g).all())
    torch.testing.assert_close(g, problem.grads_loop(theta, xb, yb), atol=1e-6, rtol=1e-4)
    each = problem.grads_each(theta.expand(3, -1).clone(), xb, yb)
    torch.testing.assert_close(each, g, atol=1e-6, rtol=1e-4)


def test_same_seed_same_model_and_the_padding_is_masked(sample: data.Dataset) -> None:
    a, b = Problem(_tiny(seed=3)), Problem(_tiny(seed=3))
    assert torch.equal(a.initial_theta(), b.initial_theta())
    x = sample.test_x[:4]
    assert bool((x == 0).any())  # padded
    longer = torch.cat([x, torch.zeros(4, 8)], 1)  # more padding: masked keys change nothing
    torch.testing.assert_close(a.model(longer), a.model(x), atol=1e-5, rtol=1e-5)
    a.model.pad_id = -1  # the mutant without the mask: the padding is attended, and the logits move
    assert not torch.allclose(a.model(longer), a.model(x), atol=1e-5, rtol=1e-5)


_MEMORY_CHILD = textwrap.dedent("""
    import json, resource, sys, torch
    from phalanx import models
    from phalanx.training.problem import Problem
    model = models.make("hf:" + sys.argv[1], (8,), 2, generator=torch.Generator().manual_seed(0), r=2)
    problem = Problem(model)
    theta = problem.initial_theta()
    base = sum(p.numel() * 4 for p in model.parameters() if not p.requires_grad)
    peaks = []
    for workers in (2, 24):  # ru_maxrss is the peak so far: the second call's growth is what 22 more workers cost
        x = torch.randint(1, 500, (workers, 2, 8)).float()
        problem.grads(theta, x, torch.randint(0, 2, (workers, 2)))
        peaks.append(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
    print(json.dumps({"base": base, "peaks": peaks}))
""")


def _checkpoint(folder: Path, hidden: int = 128, layers: int = 2, vocab: int = 30000) -> Path:
    from transformers import BertConfig, BertForSequenceClassification

    cfg = BertConfig(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=4,
                     intermediate_size=4 * hidden, max_position_embeddings=32)
    torch.manual_seed(0)
    BertForSequenceClassification(cfg).save_pretrained(folder)
    return folder


def test_the_frozen_base_is_held_once_however_many_workers(tmp_path: Path) -> None:
    """Peak memory of one batched gradient call with 2, then 24 workers (one child process): the growth is far
    below one copy of the base per extra worker (its 4.3 M parameters, 17 MB, copied per worker would add ≥ 22 × 17
    MB); only the adapters and activations grow with the workers."""
    folder = _checkpoint(tmp_path / "bert")
    out = subprocess.run([sys.executable, "-c", _MEMORY_CHILD, str(folder)], capture_output=True, text=True,
                         check=True, timeout=600)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["base"] > 15e6
    assert got["peaks"][1] - got["peaks"][0] < 4 * got["base"]  # copies would be >= 22 × base


# ------------------------------------------------------------------------------------------------------- bad input


def test_bad_model_parameters_are_one_line_before_the_weights_load(monkeypatch: pytest.MonkeyPatch) -> None:
    import transformers

    def never(*args: object, **kwargs: object) -> None:
        raise AssertionError("the weights were loaded before the parameters were checked")

    monkeypatch.setattr(transformers.AutoModelForSequenceClassification, "from_pretrained", never)
    with pytest.raises(ConfigError, match=r"model_params.target_modules.*query"):
        models.make(TINY, (LENGTH,), 2, target_modules=["q_proj"])
    with pytest.raises(ConfigError, match=r"model_params.r.*1\.\.64"):
        models.make(TINY, (LENGTH,), 2, r=65)
    with pytest.raises(ConfigError, match=r"input_shape.*at most 64 tokens"):
        models.make(TINY, (65,), 2)
    with pytest.raises(ConfigError, match=r"model_params.aggregation"):
        models.make(TINY, (LENGTH,), 2, aggregation="fedex")
    with pytest.raises(ConfigError, match=r"parameter=\[.rank.\].*r, alpha, target_modules, aggregation"):
        models.make(TINY, (LENGTH,), 2, rank=4)


def test_a_model_that_is_not_here_is_one_line_and_no_download(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ConfigError, match=r"model.*nothing is downloaded") as err:
        models.make("hf:someone/not-a-model", (LENGTH,), 2)
    assert "not-a-model" in str(err.value)
    empty = tmp_path / "no-config"
    empty.mkdir()
    with pytest.raises(ConfigError, match=r"no config.json"):
        models.make(f"hf:{empty}", (LENGTH,), 2)
    with pytest.raises(ConfigError, match=r"dataset_params.tokenizer"):
        data.load("sent140-sample", params={"tokenizer": "hf:someone/not-a-model"})


# ------------------------------------------------------------------------------------------------ the three modes


def _layout(d_out: int = 6, d_in: int = 5, r: int = 2, head: int = 3) -> LoraLayout:
    names = ["l.lora_A.default.weight", "l.lora_B.default.weight", "head.weight"]
    return LoraLayout.of(names, [(r, d_in), (d_out, r), (head,)])


def test_layout_pairs_peft_names_and_refuses_mismatched_ranks() -> None:
    lay = _layout()
    assert lay.dim == 2 * 5 + 6 * 2 + 3
    assert lay.blocks == (LoraBlock("l", 0, 10, 2, 5, 6),)
    assert int(lay.rest().sum()) == 3
    with pytest.raises(ConfigError, match="adapters"):
        LoraLayout.of(["l.lora_A.x.weight", "l.lora_B.x.weight"], [(2, 5), (6, 3)])
    model_layout = adapters.layout(_tiny())
    assert len(model_layout.blocks) == 4 and all(b.rank == 4 and b.d_in == b.d_out == 64 for b in
                                                  model_layout.blocks)


def _clients(n: int, lay: LoraLayout, spread: float = 0.3, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    theta = torch.randn(lay.dim, generator=g, dtype=torch.float64)
    x = spread * torch.randn(n, lay.dim, generator=g, dtype=torch.float64)
    return theta, x


def test_update_mode_is_exact_for_the_mean_when_the_updates_fit_in_rank_r() -> None:
    """Clients that change B only: the mean of their products has rank r, the truncation is exact, and the new
    factors' product is the mean of the clients' products (FedEx-LoRA's exactness, without the residual)."""
    lay = _layout()
    theta, x = _clients(7, lay)
    blk = lay.blocks[0]
    x[:, blk.a : blk.a + blk.rank * blk.d_in] = 0  # A unchanged by every client
    rule = AdapterUpdates(aggregators.make("mean", f=0), lay)
    out = rule(x, theta=theta)
    new = theta - out
    b2, a2 = lay.factors(new, blk)
    clients = torch.stack([torch.mm(*lay.factors(theta - xi, blk)) for xi in x])  # each client's Bᵢ Aᵢ
    torch.testing.assert_close(b2 @ a2, clients.mean(0), atol=1e-10, rtol=1e-10)
    assert rule.last_residual < 1e-12
    # the head (no block) gets the rule on its own rows
    torch.testing.assert_close(out[lay.rest()], x[:, lay.rest()].mean(0))


def test_update_mode_is_the_best_rank_r_approximation_and_factor_mode_is_not_the_mean_update() -> None:
    lay = _layout()
    theta, x = _clients(9, lay)
    blk = lay.blocks[0]
    b, a = lay.factors(theta, blk)
    mean_update = updates_of(x, theta, blk).mean(0).view(blk.d_out, blk.d_in)
    rule = AdapterUpdates(aggregators.make("mean", f=0), lay)
    b2, a2 = lay.factors(theta - rule(x, theta=theta), blk)
    u, s, vh = torch.linalg.svd(b @ a + mean_update)
    best = (u[:, :2] * s[:2]) @ vh[:2]
    torch.testing.assert_close(b2 @ a2, best, atol=1e-10, rtol=1e-10)
    assert rule.last_residual == pytest.approx(float(s[2:].norm() / s.norm()), rel=1e-9)
    # mode (a), the mutant the exactness test rejects: averaging the factors is not averaging the products
    b3, a3 = lay.factors(theta - x.mean(0), blk)
    assert float((b3 @ a3 - (b @ a + mean_update)).norm()) > 1e-3


@pytest.mark.parametrize("garbage", [float("nan"), float("inf"), 1e38])
def test_update_mode_survives_f_garbage_rows_and_the_mean_reports_them(garbage: float) -> None:
    lay = _layout()
    theta, x = _clients(9, lay)
    x[-2:] = garbage
    robust = AdapterUpdates(aggregators.make("cwtm", f=2), lay)
    out, share = robust.aggregate(x.float(), theta=theta.float())
    assert bool(torch.isfinite(out).all()) and float(share[-2:].sum()) == 0.0
    plain = AdapterUpdates(aggregators.make("mean", f=0), lay)(x.float(), theta=theta.float())  # no crash: non-finite
    assert not bool(torch.isfinite(plain).all())


def test_update_mode_keeps_the_rules_kappa_on_the_layer_updates() -> None:
    """(f, κ)-robustness holds block by block, so on the concatenation: ‖ΔW* − mean_S ΔW‖² ≤ κ/|S| Σ_S ‖ΔWᵢ −
    mean_S ΔW‖² for cwtm's κ, with f rows of an ALIE-like attack in ΔW space."""
    lay = _layout()
    theta, x = _clients(10, lay)
    f = 2
    x[-f:] = x[:-f].mean(0) + 1.5 * x[:-f].std(0)
    cwtm = aggregators.make("cwtm", f=f)
    rule = AdapterUpdates(cwtm, lay)
    blk = lay.blocks[0]
    honest = updates_of(x[:-f], theta, blk)
    agg = updates_of(rule(x, theta=theta)[None], theta, blk)[0]
    spread = float(((honest - honest.mean(0)) ** 2).sum(1).mean())
    kappa = cwtm.kappa(10)
    assert kappa is not None
    # the truncation is part of the output: measure before it, on the rule's own aggregate of the rows
    inner = cwtm(updates_of(x, theta, blk))
    assert float(((inner - honest.mean(0)) ** 2).sum()) <= kappa * spread + 1e-12
    assert bool(torch.isfinite(agg).all())


def test_update_mode_refuses_stateful_and_reference_rules() -> None:
    lay = _layout()
    with pytest.raises(ConfigError, match="keeps no state"):
        AdapterUpdates(aggregators.make("foolsgold", f=1), lay)
    with pytest.raises(ConfigError, match="reference"):
        AdapterUpdates(aggregators.make("fltrust", f=1), lay)
    with pytest.raises(ConfigError, match="theta"):
        AdapterUpdates(aggregators.make("mean", f=0), lay)(torch.zeros(3, lay.dim))


def test_shared_mode_freezes_orthonormal_a_so_the_rule_on_b_is_exact_in_the_update() -> None:
    model = _tiny("shared")
    a_params = {n: p for n, p in model.named_parameters() if ".lora_A." in n}
    assert a_params and all(not p.requires_grad for p in a_params.values())
    problem = Problem(model)
    assert not any(".lora_A." in n for n in problem.layout.names)  # A never travels
    for p in a_params.values():
        c2 = float((p @ p.T).diagonal().mean())
        torch.testing.assert_close(p @ p.T, c2 * torch.eye(p.shape[0]), atol=1e-5, rtol=1e-4)
        delta = torch.randn(64, p.shape[0])
        assert float((delta @ p).norm()) == pytest.approx(math.sqrt(c2) * float(delta.norm()), rel=1e-4)


def test_rule_for_wraps_only_the_update_mode() -> None:
    cwtm = aggregators.make("cwtm", f=1)
    assert adapters.rule_for(cwtm, _tiny("factors")) is cwtm
    assert adapters.rule_for(cwtm, _tiny("shared")) is cwtm
    wrapped = adapters.rule_for(cwtm, _tiny("update"))
    assert isinstance(wrapped, AdapterUpdates) and "theta" in wrapped.context_keys
    assert isinstance(wrapped.with_f(0), AdapterUpdates) and wrapped.with_f(0).f == 0


def test_update_mode_needs_fedavg_at_server_rate_one() -> None:
    adapters.check_step("update", "fedavg", "sgd", 1.0, 0.0)
    adapters.check_step("factors", "dsgd", "adam", 0.1, 0.9)
    with pytest.raises(ConfigError, match="algorithm"):
        adapters.check_step("update", "dsgd", "sgd", 1.0, 0.0)
    with pytest.raises(ConfigError, match="server_lr"):
        adapters.check_step("update", "fedavg", "sgd", 0.5, 0.0)
    with pytest.raises(ConfigError, match="server_optimizer"):
        adapters.check_step("update", "fedavg", "sgd", 1.0, 0.9)


# ------------------------------------------------------------------------------------------- data and full runs


def test_sent140_sample_in_leafs_format_by_user_as_token_ids(sample: data.Dataset) -> None:
    assert sample.name == "sent140-sample" and sample.num_classes == 2 and sample.input_shape == (LENGTH,)
    assert len(sample.users) == 60 and sample.has_users
    assert int(sample.train_x.max()) < 2048 and bool((sample.train_x[:, 0] == 2).all())  # [CLS] first
    chars = data.load("sent140-sample")
    assert chars.input_shape == (144,) and torch.equal(chars.train_y, sample.train_y)
    with pytest.raises(ConfigError, match=r"dataset_params.length"):
        data.load("sent140-sample", params={"length": 8})


def _cfg(mode: str, **over: object) -> dict[str, object]:
    cfg: dict[str, object] = {
        "dataset": "sent140-sample", "dataset_params": {"tokenizer": TINY, "length": LENGTH},
        "partition": "natural", "model": TINY, "model_params": {"r": 2, "aggregation": mode}, "algorithm": "fedavg",
        "workers": 8, "clients_per_round": 6, "local_steps": 1, "batch_size": 4, "lr": 0.1, "byzantine": 1, "f": 1,
        "aggregator": "cwtm", "attack": "signflip", "rounds": 2, "eval_every": 2, "seed": 0,
    }
    cfg.update(over)
    return cfg


@pytest.mark.parametrize("mode", ["factors", "update", "shared"])
def test_a_config_fine_tunes_adapters_under_attack_in_each_mode(mode: str, tmp_path: Path) -> None:
    from phalanx.experiments import make_config, train

    rows = train(make_config(_cfg(mode)), tmp_path / mode)
    assert rows[-1]["round"] == 2 and 0.0 <= rows[-1]["test_accuracy"] <= 1.0
    assert math.isfinite(rows[-1]["test_loss"])


def test_a_config_with_update_mode_and_a_server_rate_is_refused_before_it_runs(tmp_path: Path) -> None:
    from phalanx.experiments import make_config

    with pytest.raises(ConfigError, match="server_lr"):
        make_config(_cfg("update", server_lr=0.5))


@pytest.mark.parametrize("momentum", [{"server_momentum": 0.5}, {"server_optimizer_params": {"momentum": 0.5}}])
def test_update_mode_refuses_server_momentum_however_it_is_spelled(momentum: dict[str, object]) -> None:
    """The check reads the SGD section's momentum, from the flat key or from server_optimizer_params (a check that
    read the flat key alone let the second spelling through)."""
    from phalanx.experiments import make_config

    with pytest.raises(ConfigError, match="'sgd' without momentum") as exc:
        make_config(_cfg("update", **momentum))
    assert exc.value.parameter == "server_optimizer"


def test_fail_closed_watches_the_update_mode_and_stops_a_run_with_more_than_f_flagged(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The fail-closed stage (main's stage seam) over mode 'update': its check probes the wrapped rule on i.i.d. rows
    with no θ (the inner rule's shares answer), and in the run it reads the blocks' shares — 3 workers sending inf
    against f = 1 stop the run with one line. The mutant wrapper that cannot answer the probe is refused."""
    from phalanx.experiments import make_config, train
    from phalanx.training.stages.fail_closed import FailedClosed

    rows = train(make_config(_cfg("update", stages={"fail_closed": {}})), tmp_path / "calm")
    assert rows[-1]["round"] == 2 and rows[-1]["fail_closed_flagged"] == 0
    with pytest.raises(FailedClosed, match="more than the bound 1"):
        train(make_config(_cfg("update", attack="inf", byzantine=3, stages={"fail_closed": {}})), tmp_path / "inf")
    monkeypatch.setattr(AdapterUpdates, "contributions", aggregators.Aggregator.contributions)
    with pytest.raises(ConfigError, match=r"stages.fail_closed.*theta"):
        train(make_config(_cfg("update", stages={"fail_closed": {}})), tmp_path / "mutant")


def test_the_cli_lists_hf_models_and_the_example_grid_is_valid() -> None:
    from typer.testing import CliRunner

    from phalanx import cli
    from phalanx.experiments import grid, load_toml
    from phalanx.experiments.build import check_points

    res = CliRunner().invoke(cli.app, ["list", "models", "--format", "csv"])
    assert res.exit_code == 0 and "hf:phalanx-bert-tiny" in res.stdout.splitlines()
    cfgs = grid.configs(load_toml(Path(__file__).resolve().parent.parent / "examples" / "lora" / "sent140.toml"))
    check_points(cfgs)
    assert sorted({c.model_params["aggregation"] for c in cfgs}) == ["factors", "shared", "update"]
    assert all(hub.is_hf(c.model) and c.dataset_params["tokenizer"] == c.model for c in cfgs)


def test_a_checkpoint_whose_config_claims_a_model_larger_than_memory_is_one_line(tmp_path: Path) -> None:
    """A handed-over folder: the embedded model's files with a config.json claiming a vocabulary of 2·10¹⁰ (10 TB of
    embeddings in float32). Refused on the meta-device skeleton, before transformers allocates the missing weights
    (before: a traceback from the allocator, or the machine's memory)."""
    folder = tmp_path / "huge"
    shutil.copytree(hub.resolve(TINY), folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "vocab_size": 20_000_000_000}))
    with pytest.raises(ConfigError, match="a checkpoint that fits in memory") as info:
        models.make(f"hf:{folder}", (LENGTH,), 2)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("name", ["config.json", "tokenizer.json", "tokenizer_config.json", "spm.model",
                                  "source.spm", "any.model"])
def test_a_huge_small_file_of_a_checkpoint_is_refused_from_its_size_before_transformers_reads_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """A handed-over folder whose ``config.json`` (or tokenizer file) is a sparse file one byte over its cap: one
    line naming the file and the cap, from its size — transformers never opens it (a review: a 1 GiB config.json
    was read whole, 2.2 GiB of memory, before its JSON error; a second review: DeBERTa's ``spm.model`` and Marian's
    ``source.spm`` were outside the caps — any file with a tokenizer's suffix is capped now)."""
    import transformers

    from phalanx.data import tokens

    folder = tmp_path / "big"
    shutil.copytree(hub.resolve(TINY), folder)
    cap = hub.SMALL_FILES.get(name, hub.MAX_VOCABULARY_BYTES)  # a tokenizer's suffix: capped as a vocabulary
    with open(folder / name, "a+b") as fh:  # (a file the folder lacks is made: DeBERTa's, Marian's)
        fh.truncate(cap + 1)

    def never(*args: object, **kwargs: object) -> None:
        raise AssertionError("transformers read the folder")

    for auto in ("AutoConfig", "AutoTokenizer", "AutoModelForSequenceClassification"):
        monkeypatch.setattr(getattr(transformers, auto), "from_pretrained", never)
    for parameter, make in (("model", lambda: models.make(f"hf:{folder}", (LENGTH,), 2)),
                            ("dataset_params.tokenizer", lambda: tokens.tokenizer(f"hf:{folder}", LENGTH))):
        with pytest.raises(ConfigError) as info:
            make()
        text = str(info.value)
        assert "\n" not in text and text.startswith(f"{parameter}=") and f"{name} is a regular file of at most " \
            f"{cap:,} bytes" in text and str(folder / name) in text, text
