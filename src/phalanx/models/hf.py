"""Pre-trained Hugging Face transformers with LoRA adapters, as Phalanx models: ``model = "hf:NAME"``.

A sequence classifier (``transformers.AutoModelForSequenceClassification``) is loaded from a local checkpoint
(:mod:`phalanx.hub`: an embedded model, a directory, or the Hugging Face cache — never downloaded here), and
``peft`` puts LoRA adapters on its ``target_modules`` (Hu et al., "LoRA: Low-rank adaptation of large language
models", ICLR 2022, Eq. 3): each adapted linear layer computes ``h = W₀x + (α/r)·B A x`` with the pre-trained ``W₀``
frozen, ``A ∈ ℝ^{r×d_in}`` and ``B ∈ ℝ^{d_out×r}`` trained, ``B = 0`` at the start. The new classification head
(``num_classes`` outputs) is trained too. Only the trainable tensors — the adapters and the head — are the
model's θ: a frozen parameter is not in :class:`~phalanx.training.problem.ParamLayout`, never travels and is never
aggregated; the base lives once in the process, shared by every simulated worker (``functional_call`` reads it from
the module).

``aggregation`` (a model parameter because mode ``"shared"`` changes the model) says how the server combines the
adapters (:mod:`phalanx.aggregators.lora`):

* ``"factors"`` — the rule on the flat vector of A and B, what FedIT / FlowerTune do (the baseline);
* ``"update"`` — the rule on each adapted layer's update ΔWᵢ = BᵢAᵢ − BA, re-factorised to rank r by a truncated
  SVD (FlexLoRA-style; Bai et al., NeurIPS 2024);
* ``"shared"`` — A frozen and shared by every client, B alone trained (FFA-LoRA: Sun et al., ICLR 2024): ΔW = ΔB·A
  is linear in B, so every rule on B is exact in ΔW. Here each A's rows are made orthonormal times that A's own
  root-mean-square row norm c_l, so each layer's B ↦ (α/r)·BA is (α/r)·c_l times an isometry; the head is its own
  update (c = 1). The map is block-wise scaled: a coordinate-wise rule's ε and κ on B hold unchanged on the
  updates, any other rule's up to max c²/min c² (:func:`phalanx.analysis.lora_kappa.shared_bound`; docs/lora.md).

Inputs are token ids ``(B, L)`` (float32, exact integers, as a Phalanx data set stores them; the tokenizer shipped
with the checkpoint makes them: ``dataset_params.tokenizer``). The attention mask is built from the padding token as
a 4-D additive mask, so that no data-dependent branch of ``transformers``' mask helpers runs: per-worker gradients
are one ``torch.func.vmap`` call. Dropout is set to 0 (it would draw from a random stream per call inside
``vmap``); attention is the plain ("eager") implementation, which ``vmap`` batches.

Bad parameters are one line naming them, checked on a ``meta``-device copy before any weight is loaded: an input
longer than the model's positions, an unknown target module, a rank above a layer's smaller side, a model larger
than the memory left. Before that, :func:`phalanx.hub.resolve` has refused a ``config.json`` counting more layers,
heads or experts than :data:`phalanx.hub.STRUCTURE_CAPS` allow (at any depth of the file): a few hundred bytes naming
10⁶ layers of width 2 pass the memory check, yet the skeleton alone would take the machine's memory. The skeleton
itself is bounded too while it is built (:data:`MAX_SKELETON_MODULES`): counts under other names, or products of
counts each under its cap, stop there.
"""

from __future__ import annotations

import threading
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from phalanx import hub
from phalanx.errors import ConfigError
from phalanx.validate import check_int, check_real

__all__ = ["AGGREGATIONS", "AdapterClassifier", "build", "linear_layers"]

AGGREGATIONS = ("factors", "update", "shared")
"""The three ways the server combines LoRA adapters (module docstring; docs/lora.md)."""


class AdapterClassifier(nn.Module):
    """A ``peft``-wrapped sequence classifier as a pure function of token ids: ``(B, L)`` ids → ``(B, C)`` logits.

    ``spec`` is the ``hf:NAME`` it was built from, ``aggregation`` the server's mode, ``rank`` and ``alpha`` the
    adapters' r and α, ``pad_id`` the padding token (masked out), ``causal`` whether the model attends to the past
    only (decoders: the mask is then causal as well).
    """

    def __init__(self, net: nn.Module, *, spec: str, aggregation: str, rank: int, alpha: float, pad_id: int,
                 causal: bool) -> None:
        super().__init__()
        self.net = net
        self.spec = spec
        self.aggregation = aggregation
        self.rank = rank
        self.alpha = alpha
        self.pad_id = pad_id
        self.causal = causal

    def forward(self, x: Tensor) -> Tensor:
        ids = x.long()
        dtype = next(p for p in self.net.parameters()).dtype
        low = torch.finfo(dtype).min
        keys = torch.where(ids != self.pad_id, 0.0, low).to(dtype)[:, None, None, :]  # (B, 1, 1, L)
        if self.causal:
            length = ids.shape[-1]
            future = torch.ones(length, length, dtype=torch.bool, device=ids.device).triu(1)
            keys = keys.masked_fill(future, low)  # (B, 1, L, L)
        out: Any = self.net(input_ids=ids, attention_mask=keys)
        logits: Tensor = out.logits
        return logits


def _no_dropout(config: Any) -> None:
    """Set every dropout probability of a ``transformers`` config to 0 (vmap and dropout do not mix)."""
    for key, value in list(vars(config).items()):
        if isinstance(value, float) and ("dropout" in key or key.endswith("_pdrop")):
            setattr(config, key, 0.0)


def linear_layers(model: nn.Module) -> dict[str, tuple[int, int]]:
    """Every ``nn.Linear`` of ``model`` (works on the ``meta`` device): its name → ``(d_out, d_in)``."""
    return {name: (m.out_features, m.in_features) for name, m in model.named_modules() if isinstance(m, nn.Linear)}


def _targets(layers: dict[str, tuple[int, int]], target_modules: Any, model_type: str) -> list[str]:
    """The target module names, checked against the model's linear layers (the last part of a layer's name)."""
    if target_modules is None:
        from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as DEFAULTS

        if model_type not in DEFAULTS:
            raise ConfigError("model_params.target_modules", None, f"the names of the {model_type} model's linear "
                              "layers to adapt (peft has no default for this model type)")
        target_modules = list(DEFAULTS[model_type])
    if isinstance(target_modules, str):
        target_modules = [target_modules]
    if not isinstance(target_modules, (list, tuple)) or not target_modules or not all(
            isinstance(t, str) and t for t in target_modules):
        raise ConfigError("model_params.target_modules", target_modules, "a non-empty list of layer names")
    known = sorted({name.rsplit(".", 1)[-1] for name in layers})
    for t in target_modules:
        if t not in known:
            raise ConfigError("model_params.target_modules", t, "names of the model's linear layers: "
                              + ", ".join(known))
    return list(target_modules)


def _check_fits(spec: str, skeleton: nn.Module) -> None:
    """Refuse, before any weight is loaded, a checkpoint whose ``config.json`` makes a model larger than the memory
    this process can still get (:data:`~phalanx.memory.MEMORY_SHARE` of it): the weights a file lacks are
    allocated and initialised at the sizes the config names, so a handed-over folder claiming a vocabulary of 2·10¹⁰
    would otherwise fail inside ``transformers`` with a traceback (or take the machine's memory)."""
    from phalanx.memory import MEMORY_SHARE, available_memory

    need = sum(p.numel() * p.element_size() for p in skeleton.parameters())
    avail = available_memory()
    if avail is not None and need > MEMORY_SHARE * avail:
        raise ConfigError("model", spec, f"a checkpoint that fits in memory: its config.json makes a model of "
                          f"{need / 1e9:,.1f} GB, and {avail / 1e9:.1f} GB are available")


MAX_SKELETON_MODULES = 32_768
"""The most submodules the meta-device skeleton of a ``config.json`` may register while it is built. Measured with
transformers 5.24: the embedded ``phalanx-bert-tiny`` has 51 modules; a Llama decoder layer 13 (Llama 3.1 405B's 126
layers: about 1,650), Qwen3-MoE's 14 and DeepSeek-V3's 20 (their experts are one fused module per layer, whatever
their count: DeepSeek-V3's 61 layers, about 1,230) — the cap leaves a margin of about 20 over the largest. Past it the
build stops at once, one line: the counts under names :data:`phalanx.hub.STRUCTURE_CAPS` does not know, or their
products (ALBERT's 1,000 groups of 1,000 layers each, every count under its cap), made a review's 10,000 layers cost
20–30 s and 800 MiB before anything was refused; at the cap, a refused ALBERT of 64 groups of 64 layers took 11 s
and a 480 MiB peak for the whole process (a busy 2-core machine)."""


class _TooManyModules(Exception):
    """Raised by the registration hook of :func:`_skeleton` past :data:`MAX_SKELETON_MODULES`."""


def _skeleton(spec: str, config: Any, from_config: Any) -> nn.Module:
    """``from_config(config)`` on the ``meta`` device, counting the submodules registered by this thread while it runs
    (``torch``'s global module-registration hook, removed in a ``finally``; another thread's modules are not
    counted): past :data:`MAX_SKELETON_MODULES`, or out of memory, one :class:`ConfigError` naming the model."""
    from torch.nn.modules.module import register_module_module_registration_hook

    builder, count = threading.get_ident(), [0]

    def counted(module: nn.Module, name: str, submodule: nn.Module | None) -> None:
        if submodule is not None and threading.get_ident() == builder:
            count[0] += 1
            if count[0] > MAX_SKELETON_MODULES:
                raise _TooManyModules

    handle = register_module_module_registration_hook(counted)
    try:
        with torch.device("meta"):
            skeleton: nn.Module = from_config(config)
    except _TooManyModules:
        raise ConfigError("model", spec, f"a checkpoint whose config.json makes a model of at most "
                          f"{MAX_SKELETON_MODULES:,} modules", "more: its skeleton was not built") from None
    except MemoryError:
        raise ConfigError("model", spec, "a checkpoint whose config.json makes a model whose skeleton fits in "
                          "memory", "out of memory building it on the meta device") from None
    finally:
        handle.remove()
    return skeleton


def build(
    spec: str, input_shape: tuple[int, ...], num_classes: int, r: int = 8, alpha: float | None = None,
    target_modules: list[str] | None = None, aggregation: str = "factors",
) -> AdapterClassifier:
    """The model ``spec`` (``hf:NAME``) as a classifier with ``num_classes`` outputs and rank-``r`` LoRA adapters
    (scaling ``alpha / r``; default α = 2r) on ``target_modules`` (default: peft's for the model type), combined
    by the server as ``aggregation`` says (:data:`AGGREGATIONS`). Torch's global generator initialises the new
    head and the adapters' A (:func:`phalanx.models.make` seeds it from the run's ``init`` stream)."""
    hub.require("model")
    from transformers import AutoConfig, AutoModelForSequenceClassification
    from transformers.utils import logging as hf_logging

    path: Path = hub.resolve(spec, "model")
    check_int("model_params.r", r, low=1)
    alpha = float(2 * r if alpha is None else check_real("model_params.alpha", alpha, low=0.0, low_open=True))
    if aggregation not in AGGREGATIONS:
        raise ConfigError("model_params.aggregation", aggregation, " | ".join(AGGREGATIONS))
    if len(input_shape) != 1:
        raise ConfigError("input_shape", input_shape, f"(L,): token ids, for {spec}")
    try:
        config = AutoConfig.from_pretrained(path, local_files_only=True, num_labels=num_classes)
    except Exception as exc:  # an unreadable config.json, an unknown model type
        raise ConfigError("model", spec, f"a transformers checkpoint whose config loads ({type(exc).__name__}: "
                          f"{str(exc)[:160]})") from None
    positions = getattr(config, "max_position_embeddings", None)
    if isinstance(positions, int) and input_shape[0] > positions:
        raise ConfigError("input_shape", input_shape, f"at most {positions} tokens for {spec} (its positions): set "
                          "the data set's length")
    _no_dropout(config)
    config._attn_implementation = "eager"  # vmap batches it; SDPA's CPU kernels have no batching rule
    skeleton = _skeleton(spec, config, AutoModelForSequenceClassification.from_config)
    _check_fits(spec, skeleton)
    layers = linear_layers(skeleton)
    targets = _targets(layers, target_modules, str(config.model_type))
    chosen = {n: s for n, s in layers.items() if n.rsplit(".", 1)[-1] in targets}
    smallest = min(min(s) for s in chosen.values())
    if r > smallest:
        name = min(chosen, key=lambda n: min(chosen[n]))
        raise ConfigError("model_params.r", r, f"1..{smallest} (layer {name} is {chosen[name][0]}×{chosen[name][1]})")
    del skeleton
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # "some weights were newly initialised": the head, by design
    hf_logging.disable_progress_bar()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # peft asks transformers a deprecated question
            net = AutoModelForSequenceClassification.from_pretrained(path, config=config, local_files_only=True)
            net = _with_adapters(net, r, alpha, targets, aggregation)
    finally:
        hf_logging.set_verbosity(verbosity)
        hf_logging.enable_progress_bar()
    pad = getattr(config, "pad_token_id", None)
    causal = bool(getattr(config, "is_decoder", False)) or str(config.model_type) in _CAUSAL
    return AdapterClassifier(net, spec=spec, aggregation=aggregation, rank=r, alpha=alpha,
                             pad_id=int(pad) if isinstance(pad, int) else 0, causal=causal)


_CAUSAL = frozenset({"gpt2", "gpt_neo", "gpt_neox", "llama", "mistral", "qwen2", "qwen3", "phi", "phi3", "opt",
                     "gemma", "gemma2", "gemma3", "smollm3", "olmo", "olmo2"})
"""Decoder-only model types (their attention sees the past only)."""


def _with_adapters(net: nn.Module, r: int, alpha: float, targets: list[str], aggregation: str) -> nn.Module:
    """``peft``'s LoRA on ``targets`` (dropout 0, no bias, the head trained); with ``"shared"``, every A frozen with
    orthonormal rows scaled to its own root-mean-square row norm c (A Aᵀ = c² I; c differs between layers)."""
    from peft import LoraConfig, TaskType, get_peft_model

    lora = LoraConfig(r=r, lora_alpha=alpha, target_modules=targets, lora_dropout=0.0, bias="none",  # type: ignore[arg-type]
                      task_type=TaskType.SEQ_CLS)  # α/r is a float division in peft: a float α is fine
    model: nn.Module = get_peft_model(net, lora)
    if aggregation == "shared":
        with torch.no_grad():
            for name, p in model.named_parameters():
                if ".lora_A." in name:
                    c = float(p.norm()) / max(p.shape[0], 1) ** 0.5
                    q, _ = torch.linalg.qr(p.T)  # (d_in, r): orthonormal columns
                    p.copy_(q.T * (c if c > 0 else 1.0))
                    p.requires_grad_(False)
    return model
