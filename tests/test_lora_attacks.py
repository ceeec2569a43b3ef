"""Every vector attack on LoRA adapter rows, in each aggregation mode (issue 35 item 3; docs/lora.md, "Attacks on
adapters"): it runs on the rows the server receives in that mode, it changes the mean's aggregate, and the trimmed
mean configured for f ≥ b keeps its (f, κ)-robustness bound where that bound is stated —

* ``factors`` and ``shared``: on the flat rows the rule sees (factor space; in ``shared`` that is B and the head,
  and cwtm's inequality holds coordinate by coordinate, so the bound carries unchanged to the block-wise scaled
  updates: docs/lora.md);
* ``update``: on each adapted layer's update ΔWᵢ = BᵢAᵢ − BA and on the head's rows, before the truncation
  (``AdapterUpdates`` applies the rule block by block);

‖cwtm(x) − x̄_S‖² ≤ κ · (1/|S|) Σ_{i∈S} ‖xᵢ − x̄_S‖², S the honest rows, κ = 6·f/(n − 2f)·(1 + f/(n − 2f))
(Allouah et al., AISTATS 2023, Prop. 2). The honest rows are real pseudo-gradients of the embedded model on the
shipped Sent140 sample (one local step of lr 1 from adapters with B ≠ 0), the attackers omniscient (they see every
honest row and the rule, the update mode's with θ).
"""

from __future__ import annotations

import functools

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("peft")

from phalanx import aggregators, attacks, data, models
from phalanx.aggregators.lora import AdapterUpdates, updates_of
from phalanx.attacks.base import Attack, AttackContext
from phalanx.training import adapters
from phalanx.training.problem import Problem

TINY = "hf:phalanx-bert-tiny"
LENGTH = 16
N, B, F = 10, 2, 2
MODES = ("factors", "update", "shared")
VECTOR_ATTACKS = [a for a in attacks.names("vector") if a != "none"]


@functools.cache
def _round(mode: str) -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor]:
    """The model in ``mode``, the global θ (B ≠ 0) and N honest pseudo-gradients θ − θᵢ (one step, lr 1) of N
    clients' batches of 8 texts."""
    ds = data.load("sent140-sample", params={"tokenizer": TINY, "length": LENGTH})
    model = models.make(TINY, (LENGTH,), 2, generator=torch.Generator().manual_seed(0), r=4, aggregation=mode)
    problem = Problem(model)
    g = torch.Generator().manual_seed(1)
    theta = problem.initial_theta() + 0.05 * torch.randn(problem.dim, generator=g)  # B ≠ 0: A gets gradients
    idx = torch.randperm(ds.train_x.shape[0], generator=g)[: N * 8]
    rows = problem.grads(theta, ds.train_x[idx].view(N, 8, LENGTH), ds.train_y[idx].view(N, 8))
    return model, theta, rows.detach()


def _rule(name: str, f: int, mode: str) -> tuple[aggregators.Aggregator, dict[str, torch.Tensor]]:
    model, theta, _ = _round(mode)
    rule = adapters.rule_for(aggregators.make(name, f=f), model)
    return rule, ({"theta": theta} if isinstance(rule, AdapterUpdates) else {})


def _attacked(attack: str, mode: str, rule: aggregators.Aggregator, ctx: dict[str, torch.Tensor]) -> torch.Tensor:
    """The N rows the server receives: the first N − B honest, then the attack's B, made knowing the rule."""
    honest = _round(mode)[2][: N - B]
    made = attacks.make(attack)
    assert isinstance(made, Attack)
    byz = made(AttackContext(honest=honest, n_byzantine=B, f=F,
                                             aggregator=functools.partial(rule, **ctx),
                                             generator=torch.Generator().manual_seed(0)))
    assert byz.shape == (B, honest.shape[1])
    return torch.cat([honest, byz.to(honest.dtype)])


def _changed(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Not the same aggregate: non-finite, or apart by more than float32 rounding of this size allows."""
    if not bool(torch.isfinite(a).all()):
        return True
    return float((a - b).norm()) > 1e-4 * max(float(b.norm()), 1e-12)


KAPPA = aggregators.make("cwtm", f=F).kappa(N)
"""The trimmed mean's κ at n = N, f = F: the bound a deployment configured for F attackers is promised."""


def _kappa_holds(rule: aggregators.Aggregator, x: torch.Tensor, mode: str) -> bool:
    """The (F, κ) bound of cwtm, checked on ``rule``'s inner rule where the mode states it (the module's
    docstring): on the flat rows, or block by block on the layers' updates and on the head's rows. Non-finite
    output: it does not hold."""
    _, theta, _ = _round(mode)
    inner = rule.rule if isinstance(rule, AdapterUpdates) else rule
    assert KAPPA is not None and KAPPA > 0
    if isinstance(rule, AdapterUpdates):
        lay = rule.layout
        parts = [updates_of(x.double(), theta.double(), blk) for blk in lay.blocks] + [x[:, lay.rest()].double()]
    else:
        parts = [x.double()]
    for rows in parts:
        out, honest = inner(rows), rows[: N - B]
        if not bool(torch.isfinite(out).all()):
            return False
        spread = float(((honest - honest.mean(0)) ** 2).sum(1).mean())
        if float(((out - honest.mean(0)) ** 2).sum()) > KAPPA * spread * (1 + 1e-6) + 1e-12:
            return False
    return True


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("attack", VECTOR_ATTACKS)
def test_every_vector_attack_changes_the_means_aggregate_and_cwtm_keeps_its_bound(attack: str, mode: str) -> None:
    _, _, rows = _round(mode)
    mean, mctx = _rule("mean", 0, mode)
    x = _attacked(attack, mode, mean, mctx)
    assert _changed(mean(x, **mctx), mean(rows, **mctx))  # against the round where all N are honest
    cwtm, cctx = _rule("cwtm", F, mode)
    x = _attacked(attack, mode, cwtm, cctx)  # the attack adapts to the rule in use
    out = cwtm(x, **cctx)
    assert bool(torch.isfinite(out).all())
    assert _kappa_holds(cwtm, x, mode)


@pytest.mark.parametrize("mode", MODES)
def test_the_checks_reject_their_mutants(mode: str) -> None:
    """A check that cannot fail is a defect: the bound check rejects a trimmed mean that ignores f (f = 0: the mean)
    under ``inf``, and under a scaled sign flip it rejects the mean where cwtm passes; the change check does not
    call the attackers' own honest rows a change."""
    _, _, rows = _round(mode)
    ignores_f, ctx = _rule("cwtm", 0, mode)
    assert not _kappa_holds(ignores_f, _attacked("inf", mode, ignores_f, ctx), mode)
    honest = _round(mode)[2][: N - B]
    flipped = torch.cat([honest, -100.0 * honest.mean(0).expand(B, -1)])
    assert not _kappa_holds(ignores_f, flipped, mode)
    cwtm, _ = _rule("cwtm", F, mode)
    assert _kappa_holds(cwtm, flipped, mode)
    mean, mctx = _rule("mean", 0, mode)
    assert not _changed(mean(rows, **mctx), mean(rows.clone(), **mctx))
