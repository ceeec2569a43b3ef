"""Run directories record the SHA-256 of every file they write; resume and reports refuse a changed, truncated or
missing one with one line naming the file (``--force`` / ``PHALANX_FORCE=1`` uses it anyway); a crash between
recording a digest and replacing the file leaves a directory that still checks out."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

from _interrupt import train_interrupted
from phalanx.errors import IntegrityError
from phalanx.experiments import make_config, store, train

SMALL: dict[str, Any] = {
    "dataset": "digits", "model": "logreg", "workers": 5, "byzantine": 1, "f": 1, "aggregator": "cwtm",
    "attack": "signflip", "rounds": 8, "batch_size": 8, "lr": 0.1, "eval_every": 4, "checkpoint_every": 4, "seed": 2,
}


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_finished_run_records_every_file_it_wrote(tmp_path: Path) -> None:
    d = tmp_path / "run"
    train(make_config(SMALL), d)
    manifest = json.loads((d / "manifest.json").read_text())
    assert manifest["integrity"] == 1
    recorded = manifest["artifacts"]
    for name in ("config.json", "metrics.jsonl", "checkpoint.safetensors", "metrics.parquet", "DONE"):
        assert recorded[name]["sha256"] == _sha(d / name), name
    store.verify(d, tuple(recorded))


def _interrupted(tmp_path: Path) -> Path:
    return train_interrupted(make_config(SMALL), tmp_path / "part", 4)


@pytest.mark.parametrize("damage", ["flip", "truncate", "add-tensor", "remove-tensor", "round-metadata", "delete"])
def test_a_damaged_checkpoint_does_not_resume(damage: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    d = _interrupted(tmp_path)
    ckpt = d / "checkpoint.safetensors"
    raw = bytearray(ckpt.read_bytes())
    if damage == "flip":
        raw[-5] ^= 0x01  # one bit of a tensor's data
        ckpt.write_bytes(bytes(raw))
    elif damage == "truncate":
        ckpt.write_bytes(bytes(raw[: len(raw) // 2]))
    elif damage in ("add-tensor", "remove-tensor", "round-metadata"):
        tensors = load_file(str(ckpt))
        if damage == "add-tensor":
            tensors["extra"] = torch.zeros(3)
        elif damage == "remove-tensor":
            del tensors["rng.attack"]
        save_file(tensors, str(ckpt), metadata={"round": "9999" if damage == "round-metadata" else "4", "rows": "2"})
    else:
        ckpt.unlink()
    with pytest.raises(IntegrityError, match=r"checkpoint\.safetensors") as err:
        train(make_config(SMALL), d)
    assert "\n" not in str(err.value) and "--force" in str(err.value)
    if damage in ("flip", "add-tensor"):  # forced: the changed file is used (a changed bit still loads)
        monkeypatch.setenv("PHALANX_FORCE", "1")
        rows = train(make_config(SMALL), d)
        assert rows[-1]["round"] == 8


def test_changed_config_and_metrics_are_refused(tmp_path: Path) -> None:
    d = _interrupted(tmp_path)
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps(cfg, indent=1))  # same content, other bytes: still not what was written
    with pytest.raises(IntegrityError, match=r"config\.json"):
        train(make_config(SMALL), d)
    d2 = _interrupted(tmp_path / "b")
    with (d2 / "metrics.jsonl").open("a") as fh:
        fh.write('{"round": 99, "test_accuracy": 1.0}\n')
    with pytest.raises(IntegrityError, match=r"metrics\.jsonl"):
        train(make_config(SMALL), d2)
    with pytest.raises(IntegrityError, match=r"metrics\.jsonl"):
        store.read_rows(d2)


def test_a_crash_between_recording_and_replacing_leaves_a_valid_directory(tmp_path: Path) -> None:
    """The manifest gets the new digest before the file is replaced: killed in between, the old file is still one of
    the two recorded digests, and the run resumes."""
    d = _interrupted(tmp_path)
    store._record(d, "checkpoint.safetensors", "0" * 64)  # the new digest recorded; the replace never happened
    store.verify(d, ("checkpoint.safetensors",))
    rows = train(make_config(SMALL), d)
    assert rows[-1]["round"] == 8


def test_report_refuses_changed_metrics_with_one_line_and_force_lets_it_through(tmp_path: Path) -> None:
    d = tmp_path / "sweep" / "run"
    train(make_config(SMALL), d)
    (d / "metrics.jsonl").write_text((d / "metrics.jsonl").read_text()[:-10])  # truncated
    cmd = [sys.executable, "-m", "phalanx.cli", "report", str(tmp_path / "sweep")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    err = proc.stderr + proc.stdout
    assert "metrics.jsonl" in err and "changed or truncated" in err and "Traceback" not in err
    proc = subprocess.run([*cmd, "--force"], capture_output=True, text=True, timeout=300)
    assert "changed or truncated" not in proc.stderr + proc.stdout


def test_directories_written_before_digests_existed_are_not_checked(tmp_path: Path) -> None:
    d = _interrupted(tmp_path)
    manifest = json.loads((d / "manifest.json").read_text())
    del manifest["integrity"], manifest["artifacts"]
    (d / "manifest.json").write_text(json.dumps(manifest))
    (d / "config.json").write_text(json.dumps(json.loads((d / "config.json").read_text()), indent=1))
    assert train(make_config(SMALL), d)[-1]["round"] == 8


def test_a_missing_manifest_is_refused(tmp_path: Path) -> None:
    d = _interrupted(tmp_path)
    (d / "manifest.json").unlink()
    with pytest.raises(IntegrityError, match=r"manifest\.json: missing"):
        train(make_config(SMALL), d)
