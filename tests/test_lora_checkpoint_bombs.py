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


def _refused_by_both(folder: Path, monkeypatch: pytest.MonkeyPatch, *phrases: str) -> list[str]:
    """The model's and the tokenizer's refusal of ``folder``, each one line naming its parameter and holding every
    phrase, with transformers' loaders replaced by ones that fail the test; the texts."""
    _never_loaded(monkeypatch)
    texts = []
    for parameter, make in _makers(folder):
        with pytest.raises(ConfigError) as info:
            make()
        text = str(info.value)
        assert "\n" not in text and text.startswith(f"{parameter}=") and all(p in text for p in phrases), text
        texts.append(text)
    return texts


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
    _refused_by_both(folder, monkeypatch, f"{Path(name).name} is a regular file of at most {cap:,} bytes",
                     str(folder / name))


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
    ("num_experts", 1_000_000, 65536),
    ("num_hidden_layers", 1e300, 1024),
    ("inner_group_num", 2000, 1024),
    ("num_hidden_groups", 2000, 1024),
    ("num_feedforward_networks", 2000, 1024),
    ("num_hash_functions", 2000, 1024),
    ("num_self_attends_per_block", 2000, 1024),
    ("block_sizes", [1000, 1000], 1024),
    ("vision_config.depths", [1024] * 1024, 1024),
    ("vision_config.depths", [1] * 2000, 1024),
    ("text_config.mlp_only_layers", [1] * 2000, 1024),
])
def test_a_config_with_a_huge_count_of_layers_heads_or_experts_is_one_line_before_transformers_parses_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, key: str, value: object, cap: int) -> None:
    """The attacker hands over a 612-byte ``config.json`` claiming 10⁶ layers of width 2 (or as many heads or
    experts, or the count in a nested ``text_config``/``vision_config``): almost no parameters, so the memory check on
    the skeleton passed, but building the meta-device skeleton took 153 s and 1.7 GB at 20,000 layers before
    failing, and Qwen2-like configs list their layers' types inside ``AutoConfig`` (29 s, 1.4 GB at 10⁷). The old
    code parsed the config and built the skeleton; now the model and the tokenizer are one line naming the file, the
    key and the allowed range, before transformers reads the folder. A second review: ALBERT's ``inner_group_num``
    and ``num_hidden_groups``, Funnel's ``block_sizes``, MobileBERT's ``num_feedforward_networks``, Canine's
    ``num_hash_functions``, Perceiver's ``num_self_attends_per_block`` and ``depths = [1024] * 1024`` (10⁶ blocks,
    each entry under the cap) passed the old names and caps (10,000 modules: 20–30 s, 800 MiB), and a list of 2,000
    ones under ``depths`` passed a mutant that ignored a list's length."""
    folder = _folder(tmp_path)
    config = json.loads((folder / "config.json").read_text())
    outer, _, inner = key.rpartition(".")
    (config.setdefault(outer, {}) if outer else config)[inner] = value
    (folder / "config.json").write_text(json.dumps(config))
    _refused_by_both(folder, monkeypatch, f"config.json has {key} at most {cap:,}", str(folder / "config.json"))


def test_counts_as_large_as_the_largest_published_models_pass_the_structure_check(tmp_path: Path) -> None:
    """The caps refuse no real checkpoint: 126 layers (Llama 3.1 405B), 232 heads (Falcon-180B), 2,048 experts
    (Switch-C), a negative layer index (LLaVA's ``vision_feature_layer``) and a list of layer indices pass."""
    folder = _folder(tmp_path)
    config = json.loads((folder / "config.json").read_text())
    config.update(text_config={"num_hidden_layers": 126, "num_attention_heads": 232, "num_local_experts": 2048},
                  vision_feature_layer=-2, mlp_only_layers=list(range(126)))
    (folder / "config.json").write_text(json.dumps(config))
    assert hub.resolve(f"hf:{folder}") == folder


def test_every_transformers_config_class_at_its_defaults_passes_the_structure_check(tmp_path: Path) -> None:
    """No attacker: ``save_pretrained`` of any ``transformers`` config class at its defaults writes what this walks
    (``to_json_string(use_diff=False)``). The old experts' cap (4,096) refused every Doge checkpoint: DogeConfig
    defaults ``num_experts`` to 16,384 in a dense model (product-key experts, rows of one embedding). About 10 s:
    every class is checked, none sampled."""
    import warnings

    from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    refused, checked = [], 0
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for model_type in sorted(CONFIG_MAPPING.keys()):
                try:
                    text = CONFIG_MAPPING[model_type]().to_json_string(use_diff=False)
                except Exception:  # two classes need arguments: nothing to save at defaults
                    continue
                (tmp_path / "config.json").write_text(text)
                checked += 1
                try:
                    hub._check_structure(tmp_path / "config.json", f"hf:{model_type}", "model")
                except ConfigError as exc:
                    refused.append(f"{model_type}: {exc}")
    finally:
        hf_logging.set_verbosity(verbosity)
    assert checked > 500 and not refused, refused


def test_a_long_key_above_many_entries_is_walked_in_bounded_memory_or_refused_as_one_line(tmp_path: Path) -> None:
    """The attacker writes a 9.9 MiB ``config.json`` whose one key of 8 MiB holds 10⁶ entries (and a honest-sized
    variant: a key at the 4,096-character cap above 240,000 entries). The old walk kept each entry's full path on its
    stack — 7.8 TiB of strings for the first, 0.9 GiB for the second — and died of MemoryError (a traceback, or the
    OOM killer). Now the first is one line refusing the key's length, the second passes in a child whose address
    space is capped at 1 GiB above its start."""
    import subprocess
    import sys

    big, wide = tmp_path / "big", tmp_path / "wide"
    for folder, key, entries in ((big, "k" * (8 << 20), 1_000_000), (wide, "k" * hub.MAX_KEY_CHARS, 240_000)):
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps({"model_type": "bert", key: [0] * entries},
                                                       separators=(",", ":")))
    script = (
        "import resource, sys\n"
        "from pathlib import Path\n"
        "from phalanx import hub\n"
        "from phalanx.errors import ConfigError\n"
        "vm = int(open('/proc/self/statm').read().split()[0]) * resource.getpagesize()\n"
        "resource.setrlimit(resource.RLIMIT_AS, (vm + (1 << 30), resource.getrlimit(resource.RLIMIT_AS)[1]))\n"
        "for folder in sys.argv[1:]:\n"
        "    try:\n"
        "        hub.check_files(Path(folder), 'hf:' + folder)\n"
        "        print('passed')\n"
        "    except ConfigError as exc:\n"
        "        print('refused', exc)\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run([sys.executable, "-c", script, str(big), str(wide)], capture_output=True, text=True,
                          env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert len(lines) == 2 and lines[1] == "passed", done.stdout[:2000]
    assert lines[0].startswith("refused model=") and f"keys of at most {hub.MAX_KEY_CHARS:,} characters" in lines[0] \
        and str(big / "config.json") in lines[0], lines[0]


def test_running_out_of_memory_on_a_config_is_one_line_naming_the_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The attacker's ``config.json`` (within its 16 MiB cap) exhausts memory while it is parsed: the old code let
    the MemoryError through, a traceback. Now it is one line naming the file."""
    folder = _folder(tmp_path)
    (folder / "tokenizer_config.json").unlink()  # parsed first (its fast_tokenizer_files): config.json alone here

    def exhausted(*args: object, **kwargs: object) -> None:
        raise MemoryError

    monkeypatch.setattr(json, "loads", exhausted)
    with pytest.raises(ConfigError) as info:
        hub.check_files(folder, f"hf:{folder}")
    text = str(info.value)
    assert "\n" not in text and "out of memory" in text and str(folder / "config.json") in text, text


def test_a_config_listing_a_million_layer_types_is_one_line_before_autoconfig_parses_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The attacker hands over a Qwen2-type ``config.json`` listing 300,000 layer types under ``layer_types`` (no
    capped name; 2.4 MiB, within the file's cap): ``AutoConfig`` turns every entry into an object (10⁷: 29 s, 1.4
    GB). The old code let it through to ``AutoConfig``; now the model and the tokenizer are one line naming the
    file and :data:`phalanx.hub.MAX_CONFIG_VALUES`, before transformers reads the folder."""
    folder = _folder(tmp_path)
    config = json.loads((folder / "config.json").read_text())
    config.update(model_type="qwen2", layer_types=["full_attention"] * 300_000)
    (folder / "config.json").write_text(json.dumps(config))
    _refused_by_both(folder, monkeypatch, f"at most {hub.MAX_CONFIG_VALUES:,} JSON values", str(folder / "config.json"))


@pytest.mark.parametrize("entry", ["sub/tokenizer.1.0.json", "../tokenizer.1.0.json", "my_tokenizer.1.0.json"])
def test_a_huge_fast_tokenizer_file_named_by_tokenizer_config_is_refused_before_transformers_reads_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, entry: str) -> None:
    """The attacker lists ``fast_tokenizer_files: ["sub/tokenizer.1.0.json"]`` in ``tokenizer_config.json`` and puts
    a 256 MiB sparse file there (or next to the folder, or under a name the folder's caps miss but transformers'
    pattern, which searches rather than matches, takes): transformers reads it whole (the review: 292 MiB read,
    +521 MiB) — the old caps looked at the folder's own files only. Now a path is refused and a file name is capped
    as a vocabulary, one line before transformers reads the folder."""
    folder = _folder(tmp_path)
    target = (folder / entry).resolve()
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target, "wb") as fh:
        fh.truncate(4 * hub.MAX_VOCABULARY_BYTES)
    settings = json.loads((folder / "tokenizer_config.json").read_text())
    settings["fast_tokenizer_files"] = [entry]
    (folder / "tokenizer_config.json").write_text(json.dumps(settings))
    _refused_by_both(folder, monkeypatch,
                     "fast_tokenizer_files" if "/" in entry else f"{hub.MAX_VOCABULARY_BYTES:,}")


def test_a_skeleton_of_too_many_modules_stops_while_it_is_built_and_leaves_no_hook(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The attacker multiplies counts each under its name's cap (ALBERT: 8 groups of 64 layers, 512 layers of 14
    modules; 1,000 of 1,000 would be 10⁶ layers), or uses a name the caps do not know: the old code built the whole
    meta-device skeleton (10,000 layers: 20–30 s, 800 MiB) before anything was refused. Now the build stops once
    :data:`phalanx.models.hf.MAX_SKELETON_MODULES` modules are registered (lowered here to keep the test cheap): one
    line, and torch's global registration hook is gone afterwards."""
    from torch.nn.modules import module as torch_module

    from phalanx.models import hf

    folder = _folder(tmp_path)
    (folder / "config.json").write_text(json.dumps(dict(
        model_type="albert", hidden_size=4, num_attention_heads=1, intermediate_size=4, embedding_size=4,
        max_position_embeddings=LENGTH, vocab_size=16, num_hidden_layers=8, num_hidden_groups=8,
        inner_group_num=64)))
    monkeypatch.setattr(hf, "MAX_SKELETON_MODULES", 2000, raising=False)
    hooks = dict(torch_module._global_module_registration_hooks)
    with pytest.raises(ConfigError) as info:
        models.make(f"hf:{folder}", (LENGTH,), 2)
    text = str(info.value)
    assert "\n" not in text and text.startswith("model=") and "at most 2,000 modules" in text, text
    assert dict(torch_module._global_module_registration_hooks) == hooks


def test_the_largest_published_decoder_depth_builds_far_below_the_module_cap() -> None:
    """No attacker: a Llama of 126 layers (Llama 3.1 405B's depth, at a tiny width) builds its meta-device skeleton
    through the bounded builder, with a tenth of :data:`phalanx.models.hf.MAX_SKELETON_MODULES` to spare."""
    from transformers import AutoModelForSequenceClassification, LlamaConfig

    from phalanx.models import hf

    config = LlamaConfig(num_hidden_layers=126, hidden_size=8, intermediate_size=8, num_attention_heads=2,
                         num_key_value_heads=1, head_dim=4, vocab_size=16, num_labels=2)
    skeleton = hf._skeleton("hf:llama", config, AutoModelForSequenceClassification.from_config)
    assert sum(1 for _ in skeleton.modules()) * 10 < hf.MAX_SKELETON_MODULES


def test_a_skeleton_counts_only_its_own_threads_modules_and_never_breaks_another_thread(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """torch's registration hook is global: while one thread builds a skeleton, another thread (a tracker, a data
    loader, a second model) registers modules too. Those are not counted against the skeleton's cap, and the cap
    never raises inside the other thread — a mutant hook that counts every thread's modules fails both checks."""
    import threading

    from torch import nn

    from phalanx.models import hf

    monkeypatch.setattr(hf, "MAX_SKELETON_MODULES", 50, raising=False)
    other_may_build, other_built = threading.Event(), threading.Event()
    outcome: dict[str, object] = {}

    def other_thread() -> None:
        other_may_build.wait(timeout=600)
        try:
            outcome["modules"] = sum(1 for _ in nn.Sequential(*[nn.ReLU() for _ in range(200)]).modules())
        except BaseException as error:  # the check is that nothing at all escapes into this thread
            outcome["error"] = repr(error)
        other_built.set()

    def from_config(config: object) -> nn.Module:
        other_may_build.set()
        assert other_built.wait(timeout=600), "the other thread did not finish"
        return nn.Sequential(*[nn.ReLU() for _ in range(10)])

    worker = threading.Thread(target=other_thread)
    worker.start()
    skeleton = hf._skeleton("hf:test", None, from_config)
    worker.join(timeout=600)
    assert outcome == {"modules": 201}
    assert sum(1 for _ in skeleton.modules()) == 11
