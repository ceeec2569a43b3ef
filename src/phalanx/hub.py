"""Where a pre-trained model named ``hf:NAME`` lies on this machine — never downloaded at run time.

``NAME`` is, in this order:

1. an embedded model (:data:`EMBEDDED`): shipped inside the package, so it needs no network — ``phalanx-bert-tiny``,
   a 2-layer BERT-style encoder pre-trained here by masked language modelling on Shakespeare's plays (public
   domain; ``scripts/pretrain_tiny_bert.py`` reproduces it);
2. a local directory holding a ``transformers`` checkpoint (its ``config.json``);
3. a model already in the Hugging Face cache (``$HF_HOME``, ``$HF_HUB_CACHE``), looked up with
   ``local_files_only=True``: ``hf:sentence-transformers/all-MiniLM-L6-v2`` once ``hf download`` has fetched it.

Anything else is one :class:`~phalanx.errors.ConfigError` naming the parameter (``model``, or the data set's
``tokenizer``) before anything is loaded. So is a folder whose small files — those ``transformers`` reads whole
(``config.json``, the tokenizer's files …: :data:`SMALL_FILES`) — are larger than their cap, or not regular files:
checked from their size before ``transformers`` reads them (a 1 GiB ``config.json`` was read whole, 2.2 GiB of
memory, before it was refused). ``transformers`` and ``peft`` are the optional extra ``phalanx[lora]``;
a missing install is one line naming it.
"""

from __future__ import annotations

import os
from importlib import import_module
from pathlib import Path
from typing import Any

from phalanx import files
from phalanx.errors import ConfigError

__all__ = ["EMBEDDED", "PREFIX", "SMALL_FILES", "is_hf", "require", "resolve"]

PREFIX = "hf:"
"""How a config names a pre-trained Hugging Face model: ``model = "hf:NAME"``."""
EMBEDDED = {"phalanx-bert-tiny": Path(__file__).resolve().parent / "_hub" / "phalanx-bert-tiny"}
"""The models shipped inside the package, by name."""

MAX_SETTINGS_BYTES = 16 << 20
"""The largest settings file of a checkpoint (``config.json``, ``tokenizer_config.json`` …) read: a few kB in the
checkpoints measured, about 1 MB with a large ``added_tokens_decoder`` (Gemma 3's); the cap of a Phalanx config."""
MAX_VOCABULARY_BYTES = 64 << 20
"""The largest vocabulary file (``tokenizer.json``, ``vocab.txt``, ``merges.txt``, a sentencepiece model) read:
33 MB is the largest measured (Gemma 3's ``tokenizer.json``)."""
SMALL_FILES = {
    **dict.fromkeys(("config.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                     "generation_config.json", "adapter_config.json", "preprocessor_config.json",
                     "chat_template.json", "chat_template.jinja", "model.safetensors.index.json",
                     "pytorch_model.bin.index.json"), MAX_SETTINGS_BYTES),
    **dict.fromkeys(("tokenizer.json", "vocab.json", "vocab.txt", "merges.txt", "tokenizer.model", "spiece.model",
                     "sentencepiece.bpe.model", "spm.model", "source.spm", "target.spm", "vocab.bpe", "bpe.codes",
                     "tokenizer.tiktoken", "qwen.tiktoken"), MAX_VOCABULARY_BYTES),
}
"""The files of a checkpoint folder that ``transformers`` reads whole (its config, the tokenizer's and the sharded
weights' index), each with the most bytes it may have: checked before it reads them (:func:`check_files`), with
every other file whose suffix is a tokenizer's (:data:`VOCABULARY_SUFFIXES`)."""
VOCABULARY_SUFFIXES = (".model", ".spm", ".tiktoken", ".bpe")
"""Suffixes of tokenizer files that some tokenizer reads whole whatever their name (DeBERTa's ``spm.model``,
Marian's ``source.spm``: a review found them outside the caps): capped as vocabularies."""
MAX_LISTED = 4096
"""The most entries of a checkpoint folder looked at for :data:`VOCABULARY_SUFFIXES` (a folder of more is refused)."""


def is_hf(name: object) -> bool:
    """Whether ``name`` is an ``hf:NAME`` spec."""
    return isinstance(name, str) and name.startswith(PREFIX)


def require(parameter: str, *modules: str) -> None:
    """Import ``modules`` (default: transformers and peft) or raise one line naming the extra that brings them."""
    for module in modules or ("transformers", "peft"):
        try:
            import_module(module)
        except ImportError:
            raise ConfigError(parameter, module, "an installed package: pip install 'phalanx[lora]' (transformers and "
                              "peft, for Hugging Face models with LoRA adapters)") from None


def resolve(spec: str, parameter: str = "model") -> Path:
    """The local directory of ``spec`` (``hf:NAME`` or a bare ``NAME``): embedded, a directory, or the Hugging Face
    cache — never the network; a :class:`ConfigError` naming ``parameter`` when it is in none of them."""
    if not isinstance(spec, str) or not spec.removeprefix(PREFIX).strip():
        raise ConfigError(parameter, spec, "hf:NAME — an embedded model, a local directory or a model in the Hugging "
                          "Face cache")
    name = spec.removeprefix(PREFIX)
    if name in EMBEDDED:
        return EMBEDDED[name]
    path = Path(name).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ConfigError(parameter, spec, f"a directory holding a transformers checkpoint (no config.json in "
                              f"{path})")
        return check_files(path, spec, parameter)
    found = _cached(name)
    if found is None:
        raise ConfigError(
            parameter, spec, "hf:NAME for an embedded model (" + ", ".join(sorted(EMBEDDED)) + "), a local directory "
            "with config.json, or a model already in the Hugging Face cache (nothing is downloaded at run time)",
            f"fetch it once (hf download {name}) or pass its directory",
        )
    return check_files(found, spec, parameter)


def check_files(path: Path, spec: str, parameter: str = "model") -> Path:
    """``path``, once each of its :data:`SMALL_FILES` that exists is a regular file (links followed: the Hugging
    Face cache links its snapshots' files to blobs) of at most its cap — read from its size, nothing read; else one
    :class:`ConfigError` naming ``parameter``, the file and the cap."""
    for name, cap in {**SMALL_FILES, **_tokenizer_files(path, spec, parameter)}.items():
        try:
            size = files.size_of(path / name, follow=True, error=_refused(spec, parameter, cap))
        except FileNotFoundError:
            continue
        if size > cap:
            raise _refused(spec, parameter, cap)(path / name, files.too_large(size, cap))
    return path


def _tokenizer_files(path: Path, spec: str, parameter: str) -> dict[str, int]:
    """The folder's other files with a tokenizer's suffix, each capped as a vocabulary (at most :data:`MAX_LISTED`
    entries looked at; a folder of more is one :class:`ConfigError`)."""
    found: dict[str, int] = {}
    try:
        with os.scandir(path) as entries:
            for k, entry in enumerate(entries):
                if k >= MAX_LISTED:
                    raise ConfigError(parameter, spec, f"a checkpoint folder of at most {MAX_LISTED:,} entries",
                                      f"{path} holds more")
                if entry.name.endswith(VOCABULARY_SUFFIXES) and entry.name not in SMALL_FILES:
                    found[entry.name] = MAX_VOCABULARY_BYTES
    except OSError:  # (not a folder, or unreadable: transformers says so in its own words)
        return {}
    return found


def _refused(spec: str, parameter: str, cap: int) -> files.Refusal:
    def refuse(path: Path, problem: str) -> Exception:
        return ConfigError(parameter, spec, f"a checkpoint whose {path.name} is a regular file of at most {cap:,} "
                           f"bytes", f"{path}: {problem}")
    return refuse


def _cached(repo: str) -> Path | None:
    """The snapshot directory of ``repo`` in the Hugging Face cache, or None (no network: ``local_files_only``)."""
    if "/" not in repo or repo.count("/") > 1 or any(c.isspace() for c in repo):
        return None
    try:
        hub: Any = import_module("huggingface_hub")
    except ImportError:
        return None
    try:
        return Path(hub.snapshot_download(repo, local_files_only=True))
    except Exception:  # not in the cache (LocalEntryNotFoundError), or a name the hub client refuses
        return None
