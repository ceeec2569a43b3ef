"""LoRA adapters on the torchrun engine (issue 35, "Bad input"): an adapter of the wrong rank or of other layers from
a worker rank is a Byzantine message — the rank is missing from the round, counted against f, recorded with its
reason — never a crash.

On this engine an adapter travels as the flat row θ of the model's trainable vector (A and B of every adapted layer
and the head, :func:`phalanx.training.adapters.layout`); the server knows the row's length, d, from its own model. An
adapter of rank r′ ≠ r, or on other layers, is a row of another length, which rank 0 refuses
(:func:`phalanx.distributed.parameter_server.fits`). A row of the right length is a vector like any other: whatever
its values, the rule handles it (``tests/test_lora.py``, ``tests/test_lora_attacks.py``).

The first test plays it in one process (rank 0's side over fake links that deliver the misfits, so the mutant
checks run in seconds); the second on real processes (``phalanx launch``'s spawn), where two worker ranks run their
own code and re-lay their adapters out before sending.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("peft")

from tests._lora_misfit import BYZANTINE_RANK, EXTRA, misfit_row
from tests.test_distributed import JOB_TIMEOUT_S, run_dir, write_toml

from _processes import supervised
from phalanx.distributed import launch, parameter_server, wire
from phalanx.distributed.env import free_port
from phalanx.distributed.parameter_server import ParameterServer, fits
from phalanx.distributed.rejections import RejectionLog
from phalanx.distributed.sealed import SealedLinks
from phalanx.experiments import make_config
from phalanx.experiments.build import from_config
from phalanx.training import adapters
from phalanx.training.loop import Callback, Loop, RoundInfo

TINY = "hf:phalanx-bert-tiny"
JOB: dict[str, Any] = {
    "dataset": "sent140-sample", "dataset_params": {"tokenizer": TINY, "length": 8}, "partition": "natural",
    "model": TINY, "model_params": {"r": 2, "aggregation": "update"}, "algorithm": "fedavg", "workers": 5,
    "clients_per_round": 5, "local_steps": 1, "batch_size": 4, "lr": 0.1, "byzantine": 0, "f": 2,
    "aggregator": "cwtm", "attack": "none", "rounds": 3, "eval_every": 3, "seed": 0, "engine": "torchrun",
    "round_timeout": 60.0,
}
"""Mode ``update`` (the one whose rule reads each layer's A and B: a misfit reaching it would be re-factorised),
5 client slots, f = 2, no simulated attack: the Byzantine participants are the misfit ranks themselves."""
MISFITS = {3: "rank", 4: "layers"}
"""Which rank sends which misfit."""


class FakeLinks:
    """Rank 0's links with the worker ranks played here: every rank sends a row of the model's length (the honest
    θ − θᵢ of a client that did not move: zeros), except the ranks of ``misfits``, which re-lay theirs out."""

    def __init__(self, layout: Any, misfits: dict[int, str]) -> None:
        self.layout = layout
        self.misfits = misfits
        self.refused: list[tuple[int, int, str]] = []

    def offer(self, init: dict[str, Any]) -> None:
        pass

    def joined(self, n: int) -> set[int]:
        return set(range(1, n))

    def publish_theta(self, t: int, msg: bytes) -> None:
        pass

    def arrived(self, t: int, rank: int) -> bool:
        return True

    def collect(self, t: int, ranks: list[int], suspects: set[int], timeout: float) -> dict[int, bytes]:
        row = torch.zeros(self.layout.dim)
        return {r: wire.tensor_bytes(misfit_row(row, self.layout, self.misfits[r]) if r in self.misfits else row)
                for r in ranks}

    def publish_honest(self, t: int, msg: bytes, ranks: list[int]) -> None:
        pass

    def stop(self, t: int, reason: bytes) -> None:
        pass

    def refuse(self, t: int, rank: int, reason: str) -> None:
        self.refused.append((t, rank, reason))

    def reports(self, t: int, ranks: list[int]) -> dict[int, bytes]:
        return {}

    def close(self) -> None:
        pass


class Seen(Callback):
    def __init__(self) -> None:
        self.missing: list[list[int]] = []
        self.aggregated: list[int] = []

    def on_round(self, loop: Loop, info: RoundInfo) -> None:
        self.missing.append(list(info.missing))
        self.aggregated.append(info.aggregated)


def _rank_zero(job: dict[str, Any]) -> tuple[torch.Tensor, Seen, FakeLinks, list[str]]:
    """Rank 0's run over :class:`FakeLinks`: its final θ, the rounds it saw, the links, what it said."""
    exp = from_config(make_config(job))
    links = FakeLinks(adapters.layout(exp.model), MISFITS)
    said: list[str] = []
    seen = Seen()
    loop = Loop(exp, ParameterServer(links, "digest", 1.0, said.append), [seen])  # type: ignore[arg-type]
    loop.run()
    return loop.state.theta, seen, links, said


BYZANTINE_PHASE = {**JOB, "byzantine": 2, "attack": "signflip"}
"""The same ranks 3 and 4 as the Byzantine clients of a vector attack: rank 0 reads their rows after the honest ones
(phase 2: a row, or a row and the attack stream's state)."""


@pytest.mark.parametrize("job", [JOB, BYZANTINE_PHASE], ids=["honest-phase", "byzantine-phase"])
def test_a_misfit_adapter_is_a_missing_rank_counted_against_f_and_its_mutants_fail(
        job: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """Rank 0 in one process: ranks 3 and 4 send an adapter of rank r + 2 and one without the last layer's adapter.
    Every round they are missing (so the rule runs with f − 2), each misfit is refused with its size and the
    model's, rank 0 says so once (the set does not change), and the run ends with a finite θ. Mutants of the length
    check: the truncating rule the Byzantine phase used to apply (a row at least d long, its first d coordinates
    taken) lets the rank-(r + 2) adapter in as a vector there, and crashes the round in the honest phase (which
    takes the whole row); no check at all crashes the round."""
    exp = from_config(make_config(job))
    layout = adapters.layout(exp.model)
    d, itemsize = layout.dim, exp.problem.initial_theta().element_size()
    grow = EXTRA * sum(b.d_in + b.d_out for b in layout.blocks)
    last = layout.blocks[-1]
    sizes = {3: (d + grow) * itemsize, 4: (d - last.rank * (last.d_in + last.d_out)) * itemsize}
    assert misfit_row(torch.zeros(d), layout, "rank").numel() * itemsize == sizes[3]
    assert misfit_row(torch.zeros(d), layout, "layers").numel() * itemsize == sizes[4]
    for size in sizes.values():  # neither fits as a row, nor as a Byzantine row with its attack state
        assert not fits(size, d * itemsize) and not fits(size, d * itemsize, 16)
    assert fits(d * itemsize, d * itemsize) and fits(d * itemsize + 16, d * itemsize, 16)

    theta, seen, links, said = _rank_zero(job)
    assert seen.missing == [[3, 4]] * job["rounds"]
    assert seen.aggregated == [3] * job["rounds"]
    assert bool(torch.isfinite(theta).all())
    assert [(t, r) for t, r, _ in links.refused] == [(t, r) for t in range(job["rounds"]) for r in (3, 4)]
    for t, r, reason in links.refused:
        assert f"rank {r} sent a round-{t} vector of {sizes[r]} bytes" in reason
        assert f"this model's row is {d * itemsize} bytes ({d} coordinates)" in reason
    assert len([s for s in said if "not of the model's length" in s]) == 1

    monkeypatch.setattr(parameter_server, "fits", lambda size, row, state=None: size >= row)  # the old phase 2
    if job is BYZANTINE_PHASE:  # the truncating mutant reads the rank-(r + 2) adapter as a row and its tail as the
        _, seen, mutant_links, _ = _rank_zero(job)  # attack stream's state: only the state check keeps it out now
        reasons = [reason for _, r, reason in mutant_links.refused if r == 3]
        assert len(reasons) == job["rounds"] and all("attack-stream state" in reason for reason in reasons), \
            "the truncating mutant lets the rank-(r + 2) adapter past the length check"
    else:
        with pytest.raises(RuntimeError, match="stack expects each tensor to be equal size"):
            _rank_zero(job)
    monkeypatch.setattr(parameter_server, "fits", lambda size, row, state=None: True)  # no check
    with pytest.raises(RuntimeError, match="stack expects each tensor to be equal size"):
        _rank_zero(job)


def test_sealed_links_record_a_refused_vector_as_a_rejection_of_that_rank() -> None:
    """With keys, the refusal is a rejection of the rank (round, rank, reason) in the bounded log the transcript
    drains (:mod:`phalanx.distributed.rejections`)."""
    import threading
    from types import SimpleNamespace

    links = SimpleNamespace(cond=threading.Condition(), rejections=RejectionLog())
    SealedLinks.refuse(links, 2, 3, "rank 3 sent a round-2 vector of 9 bytes")  # type: ignore[arg-type]
    [group] = links.rejections.drain()
    assert (group["round"], group["rank"], group["count"]) == (2, 3, 1)
    assert group["samples"] == ["rank 3 sent a round-2 vector of 9 bytes"]


def test_a_rank_sending_a_wrong_rank_or_wrong_layer_adapter_on_real_processes(tmp_path: Path) -> None:
    """Five real processes (the parameter-server topology, no keys): ranks 3 and 4 are Byzantine participants that run
    their own code — the worker rank, with its adapters re-laid out as rank r + 2 (rank 3) or without the last
    layer's (rank 4) before every send. The run finishes (exit 0, DONE), distributed.json records both missing in
    every round, rank 0's stderr names each misfit's size and the rule ran with f − 2 on the three honest rows."""
    cfg = write_toml(tmp_path / "job.toml", JOB)
    out = tmp_path / "out"
    script = tmp_path / "byzantine_rank.py"
    script.write_text(BYZANTINE_RANK.format(root=str(Path(__file__).resolve().parent.parent)))
    args = launch.worker_args(cfg, [], out)
    port = free_port()
    errs = tmp_path / "stderr.txt"
    procs: list[subprocess.Popen[bytes]] = []
    with errs.open("wb") as fh:

        def spawn() -> None:
            for rank in range(JOB["clients_per_round"]):
                env = launch.rank_env(rank, JOB["clients_per_round"], "127.0.0.1", port)
                cmd = ([sys.executable, str(script), MISFITS[rank], *args] if rank in MISFITS
                       else [sys.executable, "-m", "phalanx.distributed.worker", *args])
                procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=fh))

        code = supervised(procs, JOB_TIMEOUT_S, spawn)  # a rank spawned before a failure is reaped too
    text = errs.read_text()
    assert code == 0, text[-3000:]
    run = run_dir(out)
    assert (run / "DONE").exists()
    logged = json.loads((run / "distributed.json").read_text())["rounds"]
    assert [r["missing"] for r in logged] == [[3, 4]] * JOB["rounds"]
    assert "rank 3 sent a round-0 vector of" in text and "rank 4 sent a round-0 vector of" in text
    assert "aggregating 3 vectors with f=0" in text
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["round"] == JOB["rounds"] and math.isfinite(rows[-1]["test_loss"])
    assert not [p.returncode for p in procs if p.returncode not in (0, None)], text[-3000:]
