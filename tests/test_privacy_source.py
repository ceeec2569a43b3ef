"""Where client-level DP noise comes from (``dp_noise_source``, docs/privacy.md "Who the noise protects against"):
with ``seed`` the noise is the run seed's ``dp`` stream, so whoever knows the seed removes it exactly (the documented
behaviour of a simulation study); with ``secret`` it is drawn from a per-session secret that the seed does not give,
that no file of the run holds, and that two sessions do not share; a ``torchrun`` config gets ``secret`` unless it
asks for ``seed``, and spelling out an engine's default names the same run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

import _dp_spy
from phalanx.errors import ConfigError
from phalanx.experiments import from_config, legacy, make_config, train
from phalanx.experiments.validrun import run_id
from phalanx.training import streams
from phalanx.training.streams import generator

pytest.importorskip("dp_accounting")

C, SIGMA = 1.0, 1.0
BASE: dict[str, Any] = {"dataset": "digits", "model": "logreg", "workers": 6, "byzantine": 1, "f": 1,
                        "attack": "_dp_spy:Spy", "aggregator": "mean", "rounds": 1, "eval_every": 1,
                        "momentum": 0.0, "seed": 0}


def _seen(data: dict[str, Any], out: Path) -> torch.Tensor:
    """The honest rows of round 0 as the Byzantine spy received them."""
    _dp_spy.SEEN.clear()
    train(make_config(data), out)
    (rows,) = _dp_spy.SEEN
    return rows


def _clean(tmp_path: Path) -> torch.Tensor:
    """The same workers' updates clipped to C and not noised (same θ₀, same batches)."""
    return _seen({**BASE, "stages": {"update_clip": {"c": C}}}, tmp_path / "clean")


def _seed_noise(rows: torch.Tensor) -> torch.Tensor:
    """σC·ξ from the run seed's dp stream: what whoever knows the seed computes."""
    return SIGMA * C * torch.randn(*rows.shape, generator=generator(BASE["seed"], "dp")).to(rows.dtype)


def test_with_seed_noise_whoever_knows_the_seed_removes_it(tmp_path: Path) -> None:
    """The documented behaviour of ``seed`` (a measurement, not a protection): subtracting the regenerated noise
    gives every honest clipped update back."""
    noised = _seen({**BASE, "dp_noise": SIGMA, "dp_clip": C}, tmp_path / "dp")
    clean = _clean(tmp_path)
    assert float((noised - clean).abs().max()) > 1.0
    torch.testing.assert_close(noised - _seed_noise(noised), clean, atol=1e-5, rtol=0)


def test_with_secret_noise_the_seed_does_not_give_it_and_no_file_holds_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    drawn: list[int] = []
    randbits = streams.secrets.randbits

    def recorded(k: int) -> int:
        drawn.append(randbits(k))
        return drawn[-1]

    monkeypatch.setattr(streams.secrets, "randbits", recorded)
    secret = {**BASE, "dp_noise": SIGMA, "dp_clip": C, "dp_noise_source": "secret"}
    noised = _seen(secret, tmp_path / "dp")
    assert "not bit-for-bit resumable" in capsys.readouterr().err  # the run says so, in one line
    clean = _clean(tmp_path)
    residual = noised - _seed_noise(noised) - clean  # the seed's noise removed: what is left is the secret's
    assert float(residual.norm(dim=1).min()) > 0.5 * SIGMA * C * noised.shape[1] ** 0.5
    noise = noised - clean  # still the mechanism's noise: N(0, σ²C²) per coordinate (3,250 draws: ±10 %)
    assert float(noise.var()) == pytest.approx(SIGMA**2 * C**2, rel=0.1)
    again = _seen(secret, tmp_path / "again")  # another session: other secrets, other noise, same updates
    assert float((again - noised).abs().max()) > 1.0
    assert len(drawn) == 2 and drawn[0] != drawn[1]
    # written nowhere: no checkpoint stream, and neither the seed nor its generator's state in any file of the run
    run = tmp_path / "dp"
    assert "rng.dp" not in load_file(str(run / "checkpoint.safetensors"))
    seed = drawn[0]
    state = torch.Generator().manual_seed(seed).get_state().numpy().tobytes()
    needles = [seed.to_bytes(8, "little"), seed.to_bytes(8, "big"), str(seed).encode(), f"{seed:x}".encode(),
               state[64:128], state[-64:]]
    files = [p for p in run.rglob("*") if p.is_file()]
    assert {p.name for p in files} >= {"checkpoint.safetensors", "config.json", "manifest.json", "metrics.jsonl"}
    for p in files:
        body = p.read_bytes()
        assert not any(n in body for n in needles), p.name


def test_a_torchrun_config_gets_secret_noise_unless_it_asks_for_seed() -> None:
    """The real-process engine's default is ``secret``: the stage a torchrun config builds, and each rank's worker
    built from it — its noise not the seed's stream, not another rank's, in no checkpoint stream; ``seed`` only when
    asked (the launch-vs-simulated equality tests ask). Spelling out an engine's default is the same run id."""
    dp = {**BASE, "attack": "alie", "dp_noise": SIGMA, "dp_clip": C}
    sim, dist = make_config(dp), make_config({**dp, "engine": "torchrun"})
    assert legacy.stage_sections(sim, lambda: [])[0].params["source"] == "seed"
    assert legacy.stage_sections(dist, lambda: [])[0].params["source"] == "secret"
    asked = make_config({**dp, "engine": "torchrun", "dp_noise_source": "seed"})
    assert legacy.stage_sections(asked, lambda: [])[0].params["source"] == "seed"
    assert run_id(make_config({**dp, "dp_noise_source": "seed"})) == run_id(sim)
    assert run_id(make_config({**dp, "dp_noise_source": "secret"})) != run_id(sim)
    assert run_id(make_config({**dp, "engine": "torchrun", "dp_noise_source": "secret"})) == run_id(dist)
    exp = from_config(dist)
    start = {name: generator(dist.seed, name).get_state() for name in ("batches", "attack", "dp")}
    ranks = [exp.algorithm.one_worker(exp, r, start, None) for r in range(exp.honest)]
    public = generator(dist.seed, "dp").get_state()
    states = [w.stages.generators["dp"].get_state() for w in ranks]
    assert all(not torch.equal(s, public) for s in states)
    assert all(not torch.equal(a, b) for i, a in enumerate(states) for b in states[i + 1:])
    assert all("dp" not in w.streams() for w in ranks)
    theta = exp.problem.initial_theta()
    sent = torch.stack([w.vector(theta, 0) for w in ranks])
    sim_exp = from_config(sim)
    seeded = [sim_exp.algorithm.one_worker(sim_exp, r, start, None) for r in range(exp.honest)]
    assert float((sent - torch.stack([w.vector(theta, 0) for w in seeded])).abs().max()) > 1.0


def test_the_noise_source_is_seed_or_secret_and_needs_dp() -> None:
    with pytest.raises(ConfigError, match="dp_noise_source"):
        legacy.stage_sections(make_config({**BASE, "dp_noise_source": "secret"}), lambda: [])
    with pytest.raises(Exception, match="dp_noise_source"):
        make_config({**BASE, "dp_noise": SIGMA, "dp_clip": C, "dp_noise_source": "urandom"})


def test_every_torchrun_rank_holds_every_workers_raw_data() -> None:
    """What `secret` noise does *not* protect against on torchrun today (docs/privacy.md, docs/distributed.md): every
    rank builds the experiment with the same ``from_config`` call (``phalanx.distributed.worker``), so the server's
    rank and each Byzantine rank hold every worker's shard of raw training data in memory and can compute any worker's
    unclipped, unnoised gradient. The noise hides what the messages carry, not what a rank's process already holds.
    When ranks load only their own shards this test fails, and the docs' scoping is to be lifted."""
    cfg = make_config({**BASE, "attack": "alie", "dp_noise": SIGMA, "dp_clip": C, "engine": "torchrun"})
    assert legacy.stage_sections(cfg, lambda: [])[0].params["source"] == "secret"
    exp = from_config(cfg)  # what rank 0 (the server) and the Byzantine rank 5 build alike
    assert exp.data is not None and len(exp.shards) == cfg.workers
    assert exp.data.x.shape[0] == exp.dataset.train_x.shape[0]  # every sample, not one shard's
    held = torch.cat(list(exp.shards)).sort().values
    assert torch.equal(held, torch.arange(exp.dataset.train_x.shape[0]))  # every honest worker's samples among them
    theta, mine = exp.problem.initial_theta(), exp.shards[1][:8]  # honest worker 1's raw samples, read here
    raw = exp.problem.grads(theta, exp.data.x[mine][None], exp.data.y[mine][None])[0]
    assert float(raw.norm()) > 0
