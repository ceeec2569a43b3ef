"""Handed-over checkpoint folders built to exhaust memory before any one-line refusal (an attacker's review of
``hf:DIR``): chat templates and other files ``transformers`` reads whole outside the size caps, and a tiny
``config.json`` whose structural counts (layers, heads, experts) make the meta-device skeleton itself the bomb.

Every large file here is sparse (``truncate``): no disk, no memory. ``transformers``' loaders are replaced by one
that fails the test, so a refusal that comes too late (or never) is seen without loading anything.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytest.importorskip("peft")

from phalanx import hub, models
from phalanx.errors import ConfigError

TINY = "hf:phalanx-bert-tiny"
LENGTH = 16


def _folder(tmp_path: Path) -> Path:
    folder = tmp_path / "ckpt"
    shutil.copytree(hub.resolve(TINY), folder)
    return folder


def _never_loaded(monkeypatch: pytest.MonkeyPatch) -> None:
    import transformers

    def never(*args: object, **kwargs: object) -> None:
        raise AssertionError("transformers read the folder")

    for auto in ("AutoConfig", "AutoTokenizer", "AutoModelForSequenceClassification"):
        monkeypatch.setattr(getattr(transformers, auto), "from_pretrained", never)


def _makers(folder: Path) -> list[tuple[str, Callable[[], object]]]:
    from phalanx.data import tokens

    return [("model", lambda: models.make(f"hf:{folder}", (LENGTH,), 2)),
            ("dataset_params.tokenizer", lambda: tokens.tokenizer(f"hf:{folder}", LENGTH))]


@pytest.mark.parametrize(("name", "cap"), [
    ("additional_chat_templates/evil.jinja", hub.MAX_SETTINGS_BYTES),
    ("additional_chat_templates/notes.txt", hub.MAX_SETTINGS_BYTES),
    ("other.jinja", hub.MAX_SETTINGS_BYTES),
    ("processor_config.json", hub.MAX_SETTINGS_BYTES),
    ("tokenizer.4.0.0.json", hub.MAX_VOCABULARY_BYTES),
    ("tokenizer.model.v3", hub.MAX_VOCABULARY_BYTES),
    ("tekken.json", hub.MAX_VOCABULARY_BYTES),
    ("entity_vocab.json", hub.MAX_VOCABULARY_BYTES),
    ("vocab", hub.MAX_VOCABULARY_BYTES),
])
def test_a_huge_chat_template_or_other_file_transformers_reads_whole_is_refused_from_its_size(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, cap: int) -> None:
    """The attacker hands over the embedded model's folder plus one sparse file a byte over its cap that
    ``transformers`` reads whole: a chat template in ``additional_chat_templates/`` (every ``*.jinja`` there is read
    as a named template), a ``*.jinja``, a processor config, a versioned ``tokenizer.X.json`` that
    ``tokenizer_config.json`` may name, Mistral's ``tokenizer.model.v3`` / ``tekken.json``, LUKE's
    ``entity_vocab.json``, a file named as a vocabulary's file id. The old code capped only fixed names and
    tokenizer suffixes in the top folder: these passed, and a 1 GiB ``additional_chat_templates/evil.jinja`` took the
    tokenizer's load to 2.3 GiB. Now: one line naming the file and its cap, before transformers opens the folder."""
    folder = _folder(tmp_path)
    (folder / name).parent.mkdir(exist_ok=True)
    with open(folder / name, "wb") as fh:
        fh.truncate(cap + 1)
    _never_loaded(monkeypatch)
    for parameter, make in _makers(folder):
        with pytest.raises(ConfigError) as info:
            make()
        text = str(info.value)
        assert "\n" not in text and text.startswith(f"{parameter}=") and \
            f"{Path(name).name} is a regular file of at most {cap:,} bytes" in text and str(folder / name) in text, text


def test_many_chat_templates_each_under_its_cap_are_refused_by_their_total(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The attacker splits the bomb: 4 sparse templates of 8 MiB each (each under a settings file's 16 MiB cap),
    4,096 of which would be 32 GiB. The old code looked at none of them. Now the folder's total is capped too."""
    folder = _folder(tmp_path)
    (folder / "additional_chat_templates").mkdir()
    for k in range(4):
        with open(folder / "additional_chat_templates" / f"t{k}.jinja", "wb") as fh:
            fh.truncate(hub.MAX_SETTINGS_BYTES // 2)
    _never_loaded(monkeypatch)
    for parameter, make in _makers(folder):
        total = f"additional_chat_templates/ holds at most {hub.MAX_SETTINGS_BYTES:,} bytes in all"
        with pytest.raises(ConfigError, match=total) as info:
            make()
        assert "\n" not in str(info.value) and str(info.value).startswith(f"{parameter}=")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs")
@pytest.mark.parametrize("name", ["additional_chat_templates/evil.jinja", "other.jinja"])
def test_a_fifo_planted_as_a_chat_template_is_refused_without_blocking(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """The attacker plants a FIFO where transformers reads a chat template: its read would wait for a writer for
    ever. The old code never looked at it (transformers would open it and block). Now: refused from ``stat``, never
    opened."""
    folder = _folder(tmp_path)
    (folder / name).parent.mkdir(exist_ok=True)
    os.mkfifo(folder / name)
    _never_loaded(monkeypatch)
    for _, make in _makers(folder):
        with pytest.raises(ConfigError, match="not a regular file"):
            make()


def test_honest_chat_templates_and_a_linked_template_folder_still_load(tmp_path: Path) -> None:
    """The caps refuse no honest folder: small templates (one of them a link, as in the Hugging Face cache, whose
    snapshot files link to blobs) load with the tokenizer."""
    from phalanx.data import tokens

    folder = _folder(tmp_path)
    (folder / "additional_chat_templates").mkdir()
    (tmp_path / "blob").write_text("{{ messages }}")
    (folder / hub.TEMPLATES / "tool_use.jinja").symlink_to(tmp_path / "blob")
    (folder / hub.TEMPLATES / "rag.jinja").write_text("{% for m in messages %}{{ m }}{% endfor %}")
    (folder / "chat_template.jinja").write_text("{{ messages }}")
    assert hub.resolve(f"hf:{folder}") == folder
    assert tokens.tokenizer(f"hf:{folder}", LENGTH) is not None


@pytest.mark.parametrize(("key", "value", "cap"), [
    ("num_hidden_layers", 1_000_000, 1024),
    ("text_config.num_hidden_layers", 1_000_000, 1024),
    ("n_layer", 20_000, 1024),
    ("vision_config.depths", [2, 2, 1_000_000, 2], 1024),
    ("num_attention_heads", 100_000, 1024),
    ("num_experts", 1_000_000, 4096),
    ("num_hidden_layers", 1e300, 1024),
])
def test_a_config_with_a_huge_count_of_layers_heads_or_experts_is_one_line_before_transformers_parses_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, key: str, value: object, cap: int) -> None:
    """The attacker hands over a 612-byte ``config.json`` claiming 10⁶ layers of width 2 (or as many heads or
    experts, or the count in a nested ``text_config``/``vision_config``): almost no parameters, so the memory check on
    the skeleton passed, but building the meta-device skeleton took 153 s and 1.7 GB at 20,000 layers before
    failing, and Qwen2-like configs list their layers' types inside ``AutoConfig`` (29 s, 1.4 GB at 10⁷). The old
    code parsed the config and built the skeleton; now the model and the tokenizer are one line naming the file, the
    key and the allowed range, before transformers reads the folder."""
    folder = _folder(tmp_path)
    config = json.loads((folder / "config.json").read_text())
    outer, _, inner = key.rpartition(".")
    (config.setdefault(outer, {}) if outer else config)[inner] = value
    (folder / "config.json").write_text(json.dumps(config))
    _never_loaded(monkeypatch)
    for parameter, make in _makers(folder):
        with pytest.raises(ConfigError) as info:
            make()
        text = str(info.value)
        assert "\n" not in text and text.startswith(f"{parameter}=") and \
            f"config.json has {key} at most {cap:,}" in text and str(folder / "config.json") in text, text


def test_counts_as_large_as_the_largest_published_models_pass_the_structure_check(tmp_path: Path) -> None:
    """The caps refuse no real checkpoint: 126 layers (Llama 3.1 405B), 232 heads (Falcon-180B), 2,048 experts
    (Switch-C), a negative layer index (LLaVA's ``vision_feature_layer``) and a list of layer indices pass."""
    folder = _folder(tmp_path)
    config = json.loads((folder / "config.json").read_text())
    config.update(text_config={"num_hidden_layers": 126, "num_attention_heads": 232, "num_local_experts": 2048},
                  vision_feature_layer=-2, mlp_only_layers=list(range(126)))
    (folder / "config.json").write_text(json.dumps(config))
    assert hub.resolve(f"hf:{folder}") == folder
