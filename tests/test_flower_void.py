"""phalanx.flower: a vote voided by a second reply in a node's name never lowers f — with real Flower Messages.

The attacker of issue 33 (item 6): a Byzantine node sends its own update and, in an honest node's name (that node's
id, answering that node's own instruction of the round), one more reply. Both replies in the honest node's name
are dropped as duplicates; if that also lowered f, the adversary would drop an honest vote *and* weaken the rule —
with cwtm, f = 1, four honest updates of +0.1 and a Byzantine +100, the rule became the mean of the rest and the
step was +25 instead of +0.1. Every test here also runs that counting (the mutant) and shows the check catches it.

The harness (a Grid that sets message ids in place, Flower's own replies, forged Metadata) is the one of
tests/test_flower_identity.py.
"""

from __future__ import annotations

import itertools
import logging
from typing import Any

import numpy as np
import pytest
import torch

flwr = pytest.importorskip("flwr")

from flwr.app import Error, Message  # noqa: E402
from flwr.common.constant import ErrorCode  # noqa: E402

import phalanx.flower.strategy as strategy_module  # noqa: E402
from phalanx.flower import PhalanxFedAvg  # noqa: E402
from test_flower import honest_models, model  # noqa: E402
from test_flower_identity import (  # noqa: E402
    BAD,
    NODES,
    FakeGrid,
    answer,
    flat,
    forged,
    rule_step,
    serverapp_identity,  # noqa: F401 - the autouse fixture: the identity of a running ServerApp
    shifted,
    start_round,
    step,
)

_REAL = strategy_module._lost_votes


def _void_lowers_f(*args: Any) -> tuple[int, int]:
    """The mutant: the counting before the fix, where a void vote lowered f like a silent node."""
    m, void = _REAL(*args)
    return m + void, 0


@pytest.fixture(params=["fixed", "mutant"])
def counting(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "mutant":
        monkeypatch.setattr(strategy_module, "_lost_votes", _void_lowers_f)
    return str(request.param)


def _tol(w: list[np.ndarray], spread: float) -> float:
    """Rounding of Δ = w_i − w and of the server step in float64, relative to the model's magnitude."""
    return 16 * float(torch.finfo(torch.float64).eps) * (float(np.abs(flat(w)).max()) + spread)


def test_a_second_reply_in_an_honest_nodes_name_does_not_lower_f(
    counting: str, caplog: pytest.LogCaptureFixture,
) -> None:
    """The issue's attack: cwtm, f = 1, nodes 101-104 honest (+0.1), node 105 Byzantine (+100) and a forged +100 in
    node 101's name on node 101's own instruction. Node 101's vote is void; f stays 1; the trimmed mean of the four
    rows left drops the +100 and steps +0.1. The mutant (f lowered to 0: the mean) steps +25.075."""
    w = model(np.float64)
    honest, bad = shifted(w, 0.1), shifted(w, 100.0)
    s = PhalanxFedAvg(aggregator="cwtm", f=1, min_available_nodes=5)
    ins = start_round(s, FakeGrid(NODES), w)
    replies = [answer(ins[n], honest) for n in NODES[:4]] + [answer(ins[BAD], bad), forged(ins[101], 101, bad)]
    with caplog.at_level(logging.INFO, logger="flwr"):
        got, metrics = step(s, 1, replies, w)
    assert (metrics["replies-duplicate"], metrics["replies-valid"]) == (2, 4)
    if counting == "mutant":
        np.testing.assert_allclose(got, (3 * 0.1 + 100.0) / 4, rtol=1e-9)  # the +25 step of the issue
        return
    np.testing.assert_allclose(got, 0.1, rtol=0, atol=_tol(w, 100.0))
    np.testing.assert_allclose(got, rule_step("cwtm", 1, w, [honest] * 3 + [bad]), rtol=0, atol=_tol(w, 100.0))
    assert (metrics["nodes-void"], metrics["nodes-dropped"], metrics["aggregated"]) == (1, 0, 1)
    summary = [r.getMessage() for r in caplog.records if r.getMessage().startswith("phalanx: round 1: ")]
    assert "6 replies, 4 used, 2 dropped; cwtm with f=1" in summary[-1]


def test_voiding_more_votes_than_the_rule_can_spare_keeps_the_model() -> None:
    """Seven nodes, cwtm with f = 2 (it needs 5 updates): a Byzantine node voiding three honest votes leaves four
    rows. f is not lowered to make them enough, so the round keeps the global model: the adversary gains a stalled
    round, never a step."""
    w = model(np.float64)
    nodes = [101, 102, 103, 104, 105, 106, 107]
    models = honest_models(w, 6)
    s = PhalanxFedAvg(aggregator="cwtm", f=2, min_available_nodes=7)
    ins = start_round(s, FakeGrid(nodes), w)
    huge = shifted(w, 1e6)
    replies = [answer(ins[n], m) for n, m in zip(nodes, models)] + [answer(ins[107], huge)]
    replies += [forged(ins[n], n, huge) for n in (101, 102, 103)]
    out, metrics = s.aggregate_train(1, replies)
    assert out is not None and metrics is not None
    np.testing.assert_array_equal(flat(out.to_numpy_ndarrays()), flat(w))
    assert (metrics["aggregated"], metrics["nodes-void"], metrics["nodes-dropped"]) == (0, 3, 0)


# The adversary's full power on a small federation: seven sampled nodes, cwtm with f = 2. Up to f nodes are faulty:
# Byzantine ones, and honest ones that are silent (a crash counts among the f). Each Byzantine node sends its own
# update (+1e3 or −1e3), nothing, an error, or two updates, and may forge one more +1e3 reply in the name of node 101
# or 102, answering that node's own instruction — a silent node's included, where the forged reply becomes that
# node's vote. Whatever they do, a round that steps must step inside the honest updates' range, coordinate by
# coordinate (cwtm with at most f_used Byzantine rows does): no choice of voids buys the adversary a step.
_N7 = [101, 102, 103, 104, 105, 106, 107]
_OWN = ("plus", "minus", "silent", "error", "twice")
_FORGE = (None, 101, 102)


def _scenarios() -> list[tuple[tuple[int, ...], tuple[int, ...], tuple[tuple[str, int | None], ...]]]:
    out = []
    for byz in [(), (107,), (106, 107)]:
        silent_choices = [s for k in range(3 - len(byz)) for s in itertools.combinations((101, 102), k)]
        for silent in silent_choices:
            for acts in itertools.product(itertools.product(_OWN, _FORGE), repeat=len(byz)):
                out.append((byz, silent, acts))
    return out


def _round(byz: tuple[int, ...], silent: tuple[int, ...], acts: tuple[tuple[str, int | None], ...],
           w: list[np.ndarray], models: dict[int, list[np.ndarray]]) -> tuple[np.ndarray | None, list[int]]:
    """The step (None when the model is kept) and the honest nodes whose own update was used."""
    s = PhalanxFedAvg(aggregator="cwtm", f=2, min_available_nodes=7)
    ins = start_round(s, FakeGrid(_N7), w)
    replies = [answer(ins[n], models[n]) for n in _N7 if n not in byz and n not in silent]
    plus, minus = shifted(w, 1e3), shifted(w, -1e3)
    for node, (own, target) in zip(byz, acts):
        if own in ("plus", "minus"):
            replies.append(answer(ins[node], plus if own == "plus" else minus))
        elif own == "error":
            replies.append(Message(Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason="x"), reply_to=ins[node]))
        elif own == "twice":
            replies += [answer(ins[node], plus), answer(ins[node], minus)]
        if target is not None:
            replies.append(forged(ins[target], target, plus))
    targets = {t for _, t in acts if t is not None}
    honest_used = [n for n in _N7 if n not in byz and n not in silent and n not in targets]
    out, metrics = s.aggregate_train(1, replies)
    assert out is not None and metrics is not None
    if not metrics["aggregated"]:
        np.testing.assert_array_equal(flat(out.to_numpy_ndarrays()), flat(w))
        return None, honest_used
    return flat(out.to_numpy_ndarrays()) - flat(w), honest_used


def test_no_choice_of_void_votes_moves_the_step_outside_the_honest_updates(counting: str) -> None:
    w = model(np.float64)
    models = dict(zip(_N7, honest_models(w, 7)))
    deltas = {n: flat(m) - flat(w) for n, m in models.items()}
    tol = _tol(w, 1e3)
    stepped, escaped = 0, []
    for byz, silent, acts in _scenarios():
        got, honest_used = _round(byz, silent, acts, w, models)
        if got is None:
            continue
        stepped += 1
        rows = np.stack([deltas[n] for n in honest_used])
        if not (np.all(got >= rows.min(axis=0) - tol) and np.all(got <= rows.max(axis=0) + tol)):
            escaped.append((byz, silent, acts, float(np.abs(got).max())))
            if counting == "mutant":
                break  # one escape is the mutant caught
    if counting == "mutant":
        assert escaped, "the mutant (void votes lower f) must let some round step outside the honest range"
        assert any(target is not None for _, target in escaped[0][2])  # by a forged reply in another's name
    else:
        assert stepped > 100  # the bound is checked on rounds that stepped, not vacuously
        assert not escaped, escaped[:5]
