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
(``config.json``, the tokenizer's files, its chat templates …: :func:`check_files`) — are larger than their cap, or
not regular files: checked from their size before ``transformers`` reads them (a 1 GiB ``config.json`` was read
whole, 2.2 GiB of memory, before it was refused; a 1 GiB ``additional_chat_templates/evil.jinja``, 2.3 GiB).
``transformers`` and ``peft`` are the optional extra ``phalanx[lora]``; a missing install is one line naming it.
"""

from __future__ import annotations

import functools
import json
import os
import re
from collections.abc import Callable
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
                     "processor_config.json", "video_preprocessor_config.json", "audio_tokenizer_config.json",
                     "modelcard.json", "chat_template.json", "chat_template.jinja", "model.safetensors.index.json",
                     "pytorch_model.bin.index.json"), MAX_SETTINGS_BYTES),
    **dict.fromkeys(("tokenizer.json", "vocab.json", "vocab.txt", "merges.txt", "tokenizer.model", "spiece.model",
                     "sentencepiece.bpe.model", "spm.model", "source.spm", "target.spm", "vocab.bpe", "bpe.codes",
                     "tokenizer.tiktoken", "qwen.tiktoken", "tekken.json",
                     # read whole by one model's tokenizer each (LUKE, Jukebox, FSMT, GPT-NeoX-Japanese, ProphetNet …)
                     "entity_vocab.json", "target_vocab.json", "vocab-src.json", "vocab-tgt.json", "emoji.json",
                     "normalizer.json", "byte_maps.json", "word_shape.json", "word_pronunciation.json", "dict.txt",
                     "prophetnet.tokenizer",
                     # the file ids that transformers' search for a Mistral tokenizer (a folder without
                     # tokenizer.json) can take as a file's name: a file so named is read as the vocabulary
                     "vocab", "vocab_file", "merges_file", "tokenizer_file", "spm_file", "source_spm", "target_spm",
                     "src_vocab_file", "tgt_vocab_file", "target_vocab_file", "entity_vocab_file", "emoji_file",
                     "monolingual_vocab_file", "normalizer_file", "word_shape_file", "word_pronunciation_file",
                     "tokenizer_config_file"), MAX_VOCABULARY_BYTES),
}
"""The files of a checkpoint folder that ``transformers`` reads whole (its config, the processor's, the tokenizer's,
the chat template and the sharded weights' index), each with the most bytes it may have: checked before it reads
them (:func:`check_files`), with every other file whose name is a tokenizer's (:data:`VOCABULARY_SUFFIXES`,
:data:`VOCABULARY_PREFIXES`, :data:`VERSIONED_TOKENIZER`) or a chat template's (:data:`TEMPLATE_SUFFIX`,
:data:`TEMPLATES`)."""
VOCABULARY_SUFFIXES = (".model", ".spm", ".tiktoken", ".bpe")
"""Suffixes of tokenizer files that some tokenizer reads whole whatever their name (DeBERTa's ``spm.model``,
Marian's ``source.spm``: a review found them outside the caps): capped as vocabularies."""
VOCABULARY_PREFIXES = ("tokenizer.model",)
"""Prefixes of tokenizer files read whole whatever follows (Mistral's ``tokenizer.model.v3``, which transformers'
search for a Mistral tokenizer picks up): capped as vocabularies."""
VERSIONED_TOKENIZER = re.compile(r"tokenizer\..*\.json")
"""The versioned ``tokenizer.json`` a ``tokenizer_config.json`` may name (``fast_tokenizer_files``, transformers'
``_re_tokenizer_file``): any file of the folder so named is capped as a vocabulary."""
TEMPLATE_SUFFIX = ".jinja"
"""Chat templates, read whole (``chat_template.jinja``; a review: any ``*.jinja`` was outside the caps): every file
of the folder with this suffix is capped as a settings file."""
TEMPLATES = "additional_chat_templates"
"""The subfolder whose every ``*.jinja`` ``transformers`` reads whole as a named chat template (a review: a 1 GiB
sparse ``evil.jinja`` there passed, and the tokenizer's load peaked at 2.3 GiB). Every file in it is capped as a
settings file, and all of them together at :data:`MAX_TEMPLATES_BYTES`."""
MAX_TEMPLATES_BYTES = MAX_SETTINGS_BYTES
"""The most bytes all the files of :data:`TEMPLATES` may hold together (the templates measured are a few kB each, a
handful per model: Cohere's ``rag`` and ``tool_use``): up to :data:`MAX_LISTED` files of a settings file's cap each
would otherwise be 64 GiB."""
MAX_LISTED = 4096
"""The most entries of a checkpoint folder (and of its :data:`TEMPLATES`) looked at for the files above (a folder of
more is refused)."""


STRUCTURE_CAPS = (
    (re.compile(r"(?:^|_)(?:depths?|blocks|block_sizes)$"), 1024, True),
    (re.compile(r"(?:^|_)(?:layers?|groups?|group_num|feedforward_networks|hash_functions|self_attends_per_block)$"),
     1024, False),
    (re.compile(r"(?:^|_)heads?$"), 1024, False),
    (re.compile(r"(?:^|_)experts?$"), 65536, False))
"""The most a ``config.json`` count of layers (``num_hidden_layers``, ``n_layer``, ``decoder_layers``, ``depth``,
ALBERT's ``num_hidden_groups`` and ``inner_group_num``, MobileBERT's ``num_feedforward_networks``, Canine's
``num_hash_functions``, Perceiver's ``num_self_attends_per_block`` …), attention heads (``num_attention_heads``,
``n_head``, ``num_key_value_heads`` …) or experts (``num_experts``, ``num_local_experts``, ``n_routed_experts`` …)
may be, at any depth of the file (``text_config``, ``vision_config`` …; a list under such a key: its length and each
entry; and, under a key that counts blocks per stage — ``depths``, Funnel's ``block_sizes``, ``*_blocks`` — their
sum: ``depths = [1024] * 1024`` is 10⁶ blocks). The third field says whether a list's sum is capped (a list of
layer *indices*, ``mlp_only_layers``, ``kv_source_layers``, sums past 1,024 in honest configs). The largest
published models are far below: 126 layers (Llama 3.1 405B; PaLM 540B 118, GPT-3 96), 232 heads (Falcon-180B;
Llama 3.1 405B 128), 2,048 experts (Switch-C; DeepSeek-V3 256). The experts' cap is 65,536: Doge's default
``num_experts`` is 16,384 (product-key experts, rows of an embedding, in a dense model), and ``transformers`` ≥ 5
builds a layer's experts as one fused module whatever their count. A review: a 612-byte config.json of 20,000
layers of width 2 (almost no parameters, so under the memory check) took 153 s and 1.7 GB building the meta-device
skeleton, and config classes that list their layers' types (Qwen2, Gemma …) spent 29 s and 1.4 GB on 10⁷ layers
inside ``AutoConfig`` itself: the counts are checked on the file's JSON before ``transformers`` parses it. This is
the fast first line: counts under other names, or products of counts, are bounded while the skeleton is built
(:data:`phalanx.models.hf.MAX_SKELETON_MODULES`)."""
MAX_CONFIG_VALUES = 250_000
"""The most JSON values (objects, lists, strings, numbers …, at any depth) a ``config.json`` may hold: at most 501
in every ``transformers`` 5.24 config class at its defaults, about 44,000 with ImageNet-21k's ``id2label`` and
``label2id``. ``AutoConfig`` turns every one into Python objects (a Qwen2-type config listing 10⁷ layer types: 29 s,
1.4 GB), and the structure check walks them: more is one line before either."""
MAX_KEY_CHARS = 4096
"""The longest key of a ``config.json`` (names of a few dozen characters; label names in ``label2id`` a few
hundred at most)."""


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
    """``path``, once each file of it that ``transformers`` reads whole (:data:`SMALL_FILES`, the other files named
    as a tokenizer's or a chat template's, every file of :data:`TEMPLATES`) that exists is a regular file (links
    followed: the Hugging Face cache links its snapshots' files to blobs; a FIFO, a device or a folder is refused) of
    at most its cap — read from its size, nothing read — and :data:`TEMPLATES` holds at most
    :data:`MAX_TEMPLATES_BYTES` in all; else one :class:`ConfigError` naming ``parameter``, the file and the cap."""
    sizes = {name: _size_within(path / name, cap, spec, parameter)
             for name, cap in {**SMALL_FILES, **_named_files(path, spec, parameter)}.items()}
    total = 0
    for name, size in sizes.items():  # (in the templates folder's listing order)
        if size is None or not name.startswith(f"{TEMPLATES}/"):
            continue
        total += size
        if total > MAX_TEMPLATES_BYTES:
            raise ConfigError(parameter, spec, f"a checkpoint whose {TEMPLATES}/ holds at most "
                              f"{MAX_TEMPLATES_BYTES:,} bytes in all", f"{path / name}: "
                              f"{total:,} bytes with the files before it (not read)")
    _check_fast_tokenizer_files(path, spec, parameter)
    _check_structure(path / "config.json", spec, parameter)
    return path


def _size_within(file: Path, cap: int, spec: str, parameter: str) -> int | None:
    """``file``'s size (None when it does not exist), once it is a regular file (links followed) of at most ``cap``
    bytes — read from its size, nothing read; else one :class:`ConfigError` naming ``parameter``, the file and the
    cap."""
    try:
        size = files.size_of(file, follow=True, error=_refused(spec, parameter, cap))
    except FileNotFoundError:
        return None
    if size > cap:
        raise _refused(spec, parameter, cap)(file, files.too_large(size, cap))
    return size


def _check_structure(config: Path, spec: str, parameter: str) -> None:
    """Refuse a ``config.json`` naming more layers, heads or experts than :data:`STRUCTURE_CAPS` allow, at any depth,
    holding more than :data:`MAX_CONFIG_VALUES` values or a key longer than :data:`MAX_KEY_CHARS`: one
    :class:`ConfigError` naming ``parameter``, the file, the key's path and the range. The file is read once, within
    its cap (already checked); one that is not JSON is left to ``transformers`` to refuse in its own words; running
    out of memory on it is a refusal too."""
    document = _settings(config, spec, parameter)
    if document is None:
        return
    try:
        _walk(document, config, spec, parameter)
    except MemoryError:
        raise ConfigError(parameter, spec, "a checkpoint whose config.json is checked within the memory left",
                          f"{config}: out of memory walking it (not loaded)") from None


def _settings(file: Path, spec: str, parameter: str) -> Any:
    """A settings file of the folder parsed (within :data:`MAX_SETTINGS_BYTES`, already checked); None when it is
    missing, unreadable or not JSON (``transformers`` says so in its own words); running out of memory parsing it is
    a refusal naming it."""
    try:
        return json.loads(files.read_regular(file, MAX_SETTINGS_BYTES, follow=True,
                                             error=_refused(spec, parameter, MAX_SETTINGS_BYTES)))
    except (OSError, ValueError, RecursionError):
        return None
    except MemoryError:
        raise ConfigError(parameter, spec, f"a checkpoint whose {file.name} parses within the memory left",
                          f"{file}: out of memory parsing it (not loaded)") from None


def _walk(document: Any, config: Path, spec: str, parameter: str) -> None:
    """:func:`_check_structure`'s walk. Each container on the stack carries the index of its parent's link and its
    own key, never its path: a review's 8 MiB key above 10⁶ entries made the old path strings need 7.8 TiB. A path
    is built (and shortened) only for a refusal."""
    links: list[tuple[int, str | int]] = [(-1, "")]  # a container's parent link and key (or index)

    def path(link: int, key: str | int) -> str:
        parts: list[str] = []
        while link >= 0:
            parts.append(f"[{key}]" if isinstance(key, int) else f".{key:.40}" + ("…" if len(key) > 40 else ""))
            link, key = links[link]
        return "".join(reversed(parts)).lstrip(".")

    if not isinstance(document, (list, dict)):
        return
    stack: list[tuple[int, Any]] = [(0, document)]
    walked = 1
    while stack:
        link, node = stack.pop()
        items = enumerate(node) if isinstance(node, list) else node.items()
        walked += len(node)
        if walked > MAX_CONFIG_VALUES:
            raise ConfigError(parameter, spec, f"a checkpoint whose config.json holds at most "
                              f"{MAX_CONFIG_VALUES:,} JSON values", f"{config}: more (not parsed by transformers)")
        for key, value in items:
            if isinstance(key, str):
                if len(key) > MAX_KEY_CHARS:
                    raise ConfigError(parameter, spec, f"a checkpoint whose config.json has keys of at most "
                                      f"{MAX_KEY_CHARS:,} characters", f"{config}: a key of {len(key):,} characters "
                                      f"at {path(link, key) or 'the top'}")
                _check_count(key, value, functools.partial(path, link, key), config, spec, parameter)
            if isinstance(value, (list, dict)) and value:
                links.append((link, key))
                stack.append((len(links) - 1, value))


def _check_count(key: str, value: Any, at: Callable[[], str], config: Path, spec: str, parameter: str) -> None:
    """Refuse ``value`` when ``key`` names a count of :data:`STRUCTURE_CAPS` beyond its cap (``at()``: the key's
    path, built only then)."""
    cap, summed = next(((c, s) for pattern, c, s in STRUCTURE_CAPS if pattern.search(key)), (None, False))
    if cap is None:
        return
    counts = value if isinstance(value, list) else [value]
    numbers = [n for n in counts if isinstance(n, (int, float)) and not isinstance(n, bool)]
    if len(counts) > cap or any(n > cap for n in numbers) or (summed and sum(numbers) > cap):
        shown = f"a list of {len(counts):,} summing to {sum(numbers):.4g}" if isinstance(value, list) \
            else f"{value!r:.40}"
        where = at()
        raise ConfigError(parameter, spec, f"a checkpoint whose config.json has {where} at most {cap:,} (a list: "
                          f"at most {cap:,} entries of at most {cap:,}" + (f", {cap:,} in all" if summed else "")
                          + ")", f"{config}: {where} = {shown}")


def _check_fast_tokenizer_files(path: Path, spec: str, parameter: str) -> None:
    """Cap every file ``tokenizer_config.json``'s ``fast_tokenizer_files`` names as a vocabulary: ``transformers``
    reads the one for its version whole, and its pattern takes a path (a review: ``sub/tokenizer.1.0.json`` of
    256 MiB passed the caps, which look at the folder's own files). An entry naming a path — ``/``, ``\\``, ``..``
    or absolute — is refused; the file was already capped as a settings file, so this read is bounded."""
    settings = _settings(path / "tokenizer_config.json", spec, parameter)
    named = settings.get("fast_tokenizer_files") if isinstance(settings, dict) else None
    for name in named if isinstance(named, list) else []:
        if not isinstance(name, str):
            continue
        if "/" in name or "\\" in name or ".." in name or not name or Path(name).is_absolute():
            raise ConfigError(parameter, spec, "a checkpoint whose tokenizer_config.json names fast_tokenizer_files "
                              "in its own folder (a file name: no /, \\ or ..)",
                              f"{path / 'tokenizer_config.json'}: {name!r:.80}")
        _size_within(path / name, MAX_VOCABULARY_BYTES, spec, parameter)


def _named_files(path: Path, spec: str, parameter: str) -> dict[str, int]:
    """The folder's other files named as a tokenizer's (capped as vocabularies) or a chat template's (as settings),
    and every file of its :data:`TEMPLATES` (as settings): their paths relative to ``path``."""
    found: dict[str, int] = {}
    for name in _listed(path, spec, parameter):
        if name in SMALL_FILES:
            continue
        if name.endswith(VOCABULARY_SUFFIXES) or name.startswith(VOCABULARY_PREFIXES) \
                or VERSIONED_TOKENIZER.fullmatch(name):
            found[name] = MAX_VOCABULARY_BYTES
        elif name.endswith(TEMPLATE_SUFFIX):
            found[name] = MAX_SETTINGS_BYTES
    for name in _listed(path / TEMPLATES, spec, parameter):
        found[f"{TEMPLATES}/{name}"] = MAX_SETTINGS_BYTES
    return found


def _listed(folder: Path, spec: str, parameter: str) -> list[str]:
    """The names in ``folder`` (at most :data:`MAX_LISTED`: a folder of more is one :class:`ConfigError`); none when
    it is not a folder or cannot be read (transformers then says so in its own words, or does not look in it)."""
    names: list[str] = []
    try:
        with os.scandir(folder) as entries:
            for entry in entries:
                if len(names) >= MAX_LISTED:
                    raise ConfigError(parameter, spec, f"a checkpoint folder of at most {MAX_LISTED:,} entries",
                                      f"{folder} holds more")
                names.append(entry.name)
    except OSError:
        return []
    return names


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
