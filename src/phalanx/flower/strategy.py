"""``PhalanxFedAvg``: Flower's ``FedAvg`` with a Phalanx rule in place of the weighted average.

Round t of Flower's strategy loop (``Strategy.start``, Flower's Message API: https://flower.ai/docs/framework/
ref-api/flwr.serverapp.strategy.FedAvg.html), with the broadcast global model w:

1. ``configure_train`` samples the clients as ``FedAvg`` does (after waiting for ``min_available_nodes`` to be
   connected, so that the first round is not under-sampled) and remembers w and the round's instructions (which
   node each was sent to; the Grid gives each its ``message_id``).
2. Each client i trains from w and replies wᵢ. ``aggregate_train`` first keeps one vote per sampled node
   (:mod:`phalanx.flower.identity`): it drops every reply of a node that replied more than once, replies from nodes
   the round did not sample, and replies that answer no instruction of the round or another node's instruction. It
   then forms the updates Δᵢ = wᵢ − w (all arrays of the record flattened, in the global record's key order), drops
   the replies whose structure does not fit (error replies, no ``ArrayRecord``, other keys or shapes, not real
   numbers) and keeps the others, NaN and Inf included.
3. The server steps w ← w + η·Agg(Δ₁, …, Δₙ) with the Phalanx rule ``Agg`` configured for f − m when m sampled nodes
   gave no usable vote of their own doing — silent, or their one reply an error or malformed (each is one the
   adversary may have spent), η = ``server_lr``. A node whose vote is *void* — two or more replies in its name —
   is missing like them but never lowers f: the second reply need not be its own, and an adversary that voided an
   honest node's vote must not also weaken the rule (see :func:`_lost_votes`).

Flower's SecAgg+ (``SecAggPlusWorkflow`` on the server, ``secaggplus_mod`` on the clients) would hand the strategy
only the sum of the updates, which no robust rule can use: it is refused with a :class:`~phalanx.errors.ConfigError`
(see :meth:`PhalanxFedAvg.configure_fit` and :meth:`PhalanxFedAvg.aggregate_train`).

With ``aggregator="mean"`` and η = 1 this is FedAvg (McMahan et al., "Communication-efficient learning of deep
networks from decentralized data", AISTATS 2017, Algorithm 1) with **equal client weights**: robust rules weigh every
client the same, because a Byzantine client can claim any number of examples. The clients' ``num-examples`` is
logged, never used as a weight. Updates rather than models are aggregated so that the rules' guarantees (stated
for vectors around the honest mean) and the server step η apply as in the rest of Phalanx (docs/federated.md).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from logging import ERROR, INFO, WARNING
from pathlib import Path
from typing import Any, NoReturn

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg
from torch import Tensor

from phalanx import aggregators
from phalanx.aggregators import Aggregator
from phalanx.aggregators.missing import MissingTooMany, RulesForMissing
from phalanx.aggregators.missing import min_workers as _min_workers
from phalanx.aggregators.missing import rule_name as _name
from phalanx.errors import ConfigError, PhalanxError
from phalanx.flower.adapters import ADAPTER, MODES, AdapterPlan
from phalanx.flower.contributions import Contribution, append_jsonl
from phalanx.flower.identity import REASONS, Screened, Sent, screen
from phalanx.flower.metrics import median_metrics
from phalanx.flower.replies import Layout, Reply, metrics_of, read_reply, shorten
from phalanx.flower.secagg import RECORD_KEY_CONFIGS, SECAGG, is_secagg_error, legacy_refusal
from phalanx.validate import check_int, check_real

__all__ = ["PhalanxFedAvg"]

Rule = Callable[[Tensor], Tensor]
MetricsFn = Callable[[list[RecordDict], str], MetricRecord]


def _build_rule(aggregator: Any, f: int | None) -> tuple[Any, int]:
    """The rule object and its ``f`` from a spec string, a Phalanx rule, or a plain callable ``(n, d) → (d,)``."""
    if f is not None:
        check_int("f", f, low=0)
    final = aggregators.get_class(aggregators.parse_spec(aggregator)[-1][0]) if isinstance(aggregator, str) else None
    if getattr(aggregator, "stateful", False) or getattr(final, "stateful", False):
        raise ConfigError("aggregator", _name(aggregator) if not isinstance(aggregator, str) else aggregator,
                          "a rule that keeps no state across rounds (the strategy passes neither the nodes' ids "
                          "nor a checkpoint of the rule's history so far)")
    if isinstance(aggregator, str):
        rule: Any = aggregators.make(aggregator, f=0 if f is None else f)
        return rule, rule.f
    if isinstance(aggregator, type) or not callable(aggregator):
        raise ConfigError(
            "aggregator", aggregator,
            "a spec such as 'cwtm' or 'nnm>cwtm', a Phalanx rule, or a callable (n, d) -> (d,)",
            "a rule class is passed as a spec: 'module:Class'" if isinstance(aggregator, type) else None,
        )
    if isinstance(aggregator, Aggregator):
        if f is None or f == aggregator.f:
            return aggregator, aggregator.f
        return aggregator.with_f(f), f
    own = getattr(aggregator, "f", 0)
    return aggregator, (f if f is not None else (own if isinstance(own, int) and own >= 0 else 0))


_MAX_DROP_LINES = 20
"""Warning lines per round for the replies dropped by the one-vote check (one line per node and reason)."""

def _lost_votes(screened: Sequence[Screened], parsed: Sequence[Reply], sent: Sent | None) -> tuple[int, int]:
    """``(m, void)`` for the round's sampled nodes without a usable vote.

    ``m`` (counted against f): those whose vote is missing by their own doing — silent, when the round's sample is
    known (a missing worker, as on the Phalanx server), or whose one reply was an error or malformed. Each is faulty
    (a crash is the most benign Byzantine behaviour), so at most f − m of the used rows are Byzantine.

    ``void`` (never counted against f): those whose vote was voided because two or more replies came in their name
    (``duplicate``). Such a node is missing like the others, but it need not be faulty: a second reply that passes
    every other check — the node's own id on the node's own instruction — may come from an impostor (a Grid or
    SuperLink that does not bind node ids to senders). Lowering f for it would let the adversary drop an honest vote
    *and* weaken the rule: with cwtm, f = 1, four honest updates of +0.1 and a Byzantine +100, one forged reply in an
    honest node's name made the rule the mean of the rest, a step of +25 instead of +0.1
    (tests/test_flower_void.py). Kept at f, the used rows still hold at most f − m Byzantine ones whatever the
    adversary voids: voiding gains it nothing but a smaller sample (the round keeps the model when the rule then
    needs more updates). A node that did reply twice itself is not credited to f either — the safe side.

    An adapter that does not fit (reason ``"adapter"``, :mod:`phalanx.flower.adapters`: another rank, other layers,
    a changed frozen A) voids its node's vote too: another rank is no proof of a Byzantine sender."""
    voters = {s.voter for s in screened if s.voter is not None} | (set(sent.sampled) if sent is not None else set())
    used = {s.voter for s, p in zip(screened, parsed) if p.update is not None}
    void = {s.voter for s, p in zip(screened, parsed) if s.reason == "duplicate" or p.reason == ADAPTER} - used
    return len(voters - used - void), len(void)


class PhalanxFedAvg(FedAvg):
    """Flower's ``FedAvg`` aggregating the clients' updates with a Phalanx rule: w ← w + η·Agg(Δ₁, …, Δₙ), Δᵢ = wᵢ − w.

    A drop-in for ``flwr.serverapp.strategy.FedAvg``: it takes every ``FedAvg`` argument (same order, same
    defaults) and runs under ``strategy.start(grid=..., initial_arrays=..., ...)`` unchanged. Added, keyword-only:

    Parameters
    ----------
    aggregator: a Phalanx spec (``"cwtm"``, ``"nnm>cwtm"``, ``"krum"``, ``"mylab.rules:MyRule"``; see
        ``phalanx.aggregators.names()``), a Phalanx rule object, or any callable mapping an ``(n, d)`` tensor to
        ``(d,)``. Rules that need a server reference gradient (``fltrust``) are refused.
    f: the number of Byzantine replies per round the rule is configured to tolerate (default: 0 for a spec, the rule's
        own ``f`` for a rule object).
    server_lr: η > 0, the server's step on the aggregated update (1 = replace the model by w + Agg).
    log_path: a JSON-lines file each round's contributions are appended to (one line per reply), or None.
    count_dropped_against_f: use the rule configured for f − m when m sampled nodes gave no usable vote of their
        own doing — silent, or an error or malformed reply (default; the Phalanx server's convention for missing
        workers). A node whose vote is void (two or more replies in its name), replies of unsampled nodes, stale and
        impostor replies never lower f. False keeps f whatever was dropped — safer when honest clients fail often,
        at the price of a larger no-attack error.
    lora: None (the default: every array is a coordinate of the rule), or how LoRA adapters sent as ``peft``'s
        ``get_peft_model_state_dict`` arrays are aggregated — ``"factors"`` (the rule on every A and B),
        ``"update"`` (the rule on each layer's BᵢAᵢ − BA, re-factorised to rank r; needs ``server_lr = 1`` and a
        Phalanx rule), ``"shared"`` (A frozen and shared, the rule on the B's and the head; a Phalanx rule):
        :mod:`phalanx.flower.adapters`, docs/lora.md. A reply whose adapters do not fit is a void vote.

    The clients' train (and evaluate) metrics are aggregated by the per-key unweighted median unless
    ``train_metrics_aggr_fn`` (``evaluate_metrics_aggr_fn``) is given; the train metrics also hold
    ``replies-received``, ``replies-valid``, ``replies-dropped`` (of which ``replies-duplicate``,
    ``replies-unsampled``, ``replies-stale`` and ``replies-impostor`` by the one-vote check; ``replies-adapter``
    with ``lora``), ``nodes-dropped`` (the m of f − m), ``nodes-void`` (sampled nodes whose vote was voided by
    duplicates or an adapter that does not fit: missing, not counted against f) and ``aggregated`` (1, or 0 when the
    round kept the global model). ``contributions`` lists one :class:`~phalanx.flower.contributions.Contribution`
    per reply.
    """

    def __init__(
        self,
        fraction_train: float = 1.0,
        fraction_evaluate: float = 1.0,
        min_train_nodes: int = 2,
        min_evaluate_nodes: int = 2,
        min_available_nodes: int = 2,
        weighted_by_key: str = "num-examples",
        arrayrecord_key: str = "arrays",
        configrecord_key: str = "config",
        train_metrics_aggr_fn: MetricsFn | None = None,
        evaluate_metrics_aggr_fn: MetricsFn | None = None,
        *,
        aggregator: str | Rule = "cwtm",
        f: int | None = None,
        server_lr: float = 1.0,
        log_path: str | Path | None = None,
        count_dropped_against_f: bool = True,
        lora: str | None = None,
    ) -> None:
        check_real("fraction_train", fraction_train, low=0.0, high=1.0)
        check_real("fraction_evaluate", fraction_evaluate, low=0.0, high=1.0)
        for name, value in (("min_train_nodes", min_train_nodes), ("min_evaluate_nodes", min_evaluate_nodes),
                            ("min_available_nodes", min_available_nodes)):
            check_int(name, value, low=0)
        self.rule, self.f = _build_rule(aggregator, f)
        if "reference" in getattr(self.rule, "context_keys", ()):
            raise ConfigError(
                "aggregator", _name(self.rule), "a rule that needs no server reference gradient",
                "FLTrust needs a root data set on the server, which a Flower strategy does not have",
            )
        self.server_lr = check_real("server_lr", server_lr, low=0.0, low_open=True)
        self.log_path = None if log_path is None else Path(log_path)
        self.count_dropped_against_f = bool(count_dropped_against_f)
        if lora is not None and lora not in MODES:
            raise ConfigError("lora", lora, "None | " + " | ".join(MODES))
        if lora in ("update", "shared") and not isinstance(self.rule, Aggregator):
            raise ConfigError("aggregator", _name(self.rule), f"a Phalanx spec or rule object with lora={lora!r}")
        if lora == "update" and self.server_lr != 1.0:
            raise ConfigError("server_lr", self.server_lr, "1.0 with lora='update' (the step lands on the "
                              "re-factorised adapters only at rate 1)")
        self.lora = lora
        super().__init__(
            fraction_train=fraction_train, fraction_evaluate=fraction_evaluate, min_train_nodes=min_train_nodes,
            min_evaluate_nodes=min_evaluate_nodes, min_available_nodes=min_available_nodes,
            weighted_by_key=weighted_by_key, arrayrecord_key=arrayrecord_key, configrecord_key=configrecord_key,
            train_metrics_aggr_fn=train_metrics_aggr_fn, evaluate_metrics_aggr_fn=evaluate_metrics_aggr_fn,
        )
        self._user_train_metrics = train_metrics_aggr_fn
        self._user_evaluate_metrics = evaluate_metrics_aggr_fn
        self.contributions: list[Contribution] = []
        """One record per reply of every round, in order (see :mod:`phalanx.flower.contributions`)."""
        self._layouts: dict[int, Layout] = {}
        self._plans: dict[int, AdapterPlan] = {}  # round -> the broadcast adapters (with ``lora``)
        self._skew_logged = False
        self._sent: dict[tuple[str, int], Sent] = {}  # ("train" | "evaluate", round) -> the round's instructions
        self._for_missing = RulesForMissing(self.rule)  # the rule for f − m, shared with the Phalanx server
        self._previous: Tensor | None = None  # the last aggregate: centered clipping's centre

    # ------------------------------------------------------------------------------------------------ Flower API

    def summary(self) -> None:
        """Log the configuration (``FedAvg``'s, then the rule's)."""
        super().summary()
        log(INFO, "\t└──> Phalanx: aggregator %s, f=%d, server_lr=%g, needs >= %d updates per round",
            _name(self.rule), self.f, self.server_lr, _min_workers(self.rule))

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid,
    ) -> Iterable[Message]:
        """``FedAvg``'s sampling and messages, after waiting for ``min_available_nodes``; the broadcast model is
        remembered for forming the round's updates, and the messages (their ``group_id`` set to the round) for
        keeping one vote per sampled node."""
        if self.fraction_train > 0:
            self._wait_for_nodes(grid)
        self.remember_global(server_round, arrays)
        messages = list(super().configure_train(server_round, arrays, config, grid))
        self._remember_sent("train", server_round, messages)
        need = _min_workers(self.rule)
        if messages and len(messages) < need:
            log(WARNING, "phalanx: round %d samples %d clients but %s with f=%d needs %d updates; the round will keep "
                "the global model (raise fraction_train or min_train_nodes)",
                server_round, len(messages), _name(self.rule), self.f, need)
        return messages

    def remember_global(self, server_round: int, arrays: ArrayRecord) -> None:
        """Remember the global model w broadcast in ``server_round`` (``configure_train`` does it; call it yourself
        when driving :meth:`aggregate_train` without ``configure_train`` — the sample is then unknown, and only
        duplicate replies are dropped by the one-vote check)."""
        try:
            layout = Layout.of(arrays)
        except Exception as exc:
            raise ConfigError("arrays", type(arrays).__name__, "an ArrayRecord of numpy-serialised arrays",
                              f"{type(exc).__name__}: {exc}") from None
        self._layouts = {r: v for r, v in self._layouts.items() if r >= server_round - 1}
        self._layouts[server_round] = layout
        self._plans = {r: v for r, v in self._plans.items() if r >= server_round - 1}
        if self.lora is not None:
            plan = self._plans[server_round] = AdapterPlan.of(self.lora, layout)
            if plan.skewed is not None and not self._skew_logged:  # once: A is frozen, it stays so every round
                self._skew_logged = True
                log(WARNING, "phalanx: lora='shared': the A of %s is not orthonormal times c (A Aᵀ ≠ c² I): the step "
                    "is exact in ΔW, but the rule's ε and κ hold for B only; start from "
                    "phalanx.flower.adapters.shared_a(arrays)", plan.skewed)

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message],
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """w + η·Agg(Δ₁, …, Δₙ) as an ``ArrayRecord`` with the global model's keys, shapes and dtypes (the global
        model unchanged when the round cannot be aggregated), and the round's metrics.

        One vote per sampled node: duplicate, unsampled, stale and impostor replies are dropped before any is read
        (:mod:`phalanx.flower.identity`). Never raises on a reply, with one exception: when more than f sampled
        nodes reply with the error of a ClientApp running Flower's ``secaggplus_mod`` (so at least one honest client
        does), the run is refused with a :class:`~phalanx.errors.ConfigError` — SecAgg+ leaves the server only the
        sum of the updates."""
        layout = self._layouts.pop(server_round, None)
        if layout is None:
            raise PhalanxError(
                f"aggregate_train(server_round={server_round}): no global model remembered for this round "
                "(configure_train, or remember_global, must run first)"
            )
        sent = self._sent.pop(("train", server_round), None)
        plan = self._plans.pop(server_round, None)
        messages = list(replies)
        if not messages:
            level = INFO if self.fraction_train == 0 else WARNING  # no clients asked: nothing to warn about
            log(level, "phalanx: round %d: no replies; the global model is kept", server_round)
            return None, None
        screened = self._screen("round", server_round, messages, sent)
        self._refuse_secagg_clients(server_round, messages, screened)
        parsed = [self._read(m, v, layout, plan) for m, v in zip(messages, screened)]
        used = [i for i, p in enumerate(parsed) if p.update is not None]
        lost, void = _lost_votes(screened, parsed, sent)
        x = self._stack(parsed, used, layout)
        agg, share, f_eff, why_not = self._aggregate(x, lost, layout.size, plan)
        applied = why_not is None
        assert agg is None or x is not None
        if applied and agg is not None:
            with np.errstate(all="ignore"):
                new = layout.flat + np.asarray(self.server_lr, dtype=layout.compute) * agg.numpy()
            arrays = layout.record(new)
            self._previous = agg
        else:
            arrays = layout.record(layout.flat)
        records = self._contributions(server_round, parsed, used, x, agg, share, why_not)
        metrics = self._train_metrics([messages[i] for i in used], [parsed[i] for i in used], f_eff)
        metrics["replies-received"] = len(parsed)
        metrics["replies-valid"] = len(used)
        metrics["replies-dropped"] = len(parsed) - len(used)
        for reason in REASONS:
            metrics[f"replies-{reason}"] = sum(p.reason == reason for p in parsed)
        if plan is not None:
            metrics[f"replies-{ADAPTER}"] = sum(p.reason == ADAPTER for p in parsed)
        metrics["nodes-dropped"] = lost
        metrics["nodes-void"] = void
        metrics["aggregated"] = int(applied)
        self._log_round(server_round, parsed, records, f_eff, agg, why_not)
        self.contributions.extend(records)
        if self.log_path is not None:
            try:
                append_jsonl(self.log_path, records)
            except OSError as exc:
                log(ERROR, "phalanx: could not append the contributions to %s: %s", self.log_path, exc)
        return arrays, metrics

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        """The clients' evaluation metrics: the per-key median (or ``evaluate_metrics_aggr_fn``'s result) over the
        replies that carry a ``MetricRecord``; error and malformed replies are counted and skipped, and the one-vote
        check drops duplicate, unsampled, stale and impostor replies as in :meth:`aggregate_train`."""
        messages = list(replies)
        sent = self._sent.pop(("evaluate", server_round), None)
        screened = self._screen("evaluate round", server_round, messages, sent)
        votes = [m for m, v in zip(messages, screened) if v.passed]
        good = [(m, r) for m in votes if (r := metrics_of(m)) is not None]
        text = f"phalanx: evaluate round {server_round}: {len(messages)} replies, {len(good)} with metrics"
        if len(votes) < len(messages):
            text += f", {len(messages) - len(votes)} dropped (not one vote per sampled node)"
        log(INFO, "%s", text)
        if not good:
            return None
        return self._metrics(self._user_evaluate_metrics, [m for m, _ in good], [r for _, r in good], "evaluate")

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid,
    ) -> Iterable[Message]:
        """``FedAvg``'s evaluation messages, remembered (their ``group_id`` set to the round) for keeping one vote
        per sampled node."""
        messages = list(super().configure_evaluate(server_round, arrays, config, grid))
        self._remember_sent("evaluate", server_round, messages)
        return messages

    # ------------------------------------------------------------------------------------- refused: legacy / SecAgg+

    def initialize_parameters(self, *args: Any, **kwargs: Any) -> NoReturn:
        """Refused (:class:`~phalanx.errors.ConfigError`): the first call of Flower's legacy ``DefaultWorkflow``, which
        is how ``SecAggPlusWorkflow`` runs in Flower 1.42. PhalanxFedAvg runs under ``strategy.start``."""
        raise legacy_refusal("initialize_parameters")

    def configure_fit(self, *args: Any, **kwargs: Any) -> NoReturn:
        """Refused (:class:`~phalanx.errors.ConfigError`): ``SecAggPlusWorkflow``'s (and ``SecAggWorkflow``'s) first
        call to the strategy. Under SecAgg+ the strategy sees only the sum of the updates; no robust rule can use it."""
        raise legacy_refusal("configure_fit")

    def aggregate_fit(self, *args: Any, **kwargs: Any) -> NoReturn:
        """Refused (:class:`~phalanx.errors.ConfigError`): where SecAgg+ hands a strategy the unmasked *sum*."""
        raise legacy_refusal("aggregate_fit")

    # ------------------------------------------------------------------------------------------------ internals

    def _remember_sent(self, what: str, server_round: int, messages: Sequence[Message]) -> None:
        self._sent = {k: v for k, v in self._sent.items() if k[1] >= server_round - 1}
        self._sent[(what, server_round)] = Sent.of(server_round, messages)

    def _screen(self, what: str, server_round: int, messages: Sequence[Message], sent: Sent | None) -> list[Screened]:
        """The one-vote check of the round's replies; each node's dropped replies logged at WARNING."""
        if sent is not None and sent.metadata and sent.by_message_id() is None:
            log(WARNING, "phalanx: %s %d: the instructions have no message_id (not pushed through a Flower Grid): "
                "replies are checked against the sampled nodes and the round only", what, server_round)
        screened = screen(messages, sent)
        groups = Counter((v.node_id, v.reason) for v in screened if not v.passed)
        detail = {(v.node_id, v.reason): v.detail for v in screened if not v.passed}
        for n, ((node, reason), count) in enumerate(groups.items()):
            if n == _MAX_DROP_LINES:
                log(WARNING, "phalanx: %s %d: replies of %d more nodes dropped (see the contributions)", what,
                    server_round, len(groups) - n)
                break
            log(WARNING, "phalanx: %s %d: dropped %d %s from node %s (%s) — %s", what, server_round, count,
                "reply" if count == 1 else "replies", node, reason, detail[(node, reason)])
        return screened

    def _refuse_secagg_clients(
        self, server_round: int, messages: Sequence[Message], screened: Sequence[Screened],
    ) -> None:
        """Raise when more than f sampled nodes replied with ``secaggplus_mod``'s error (see :meth:`aggregate_train`):
        f Byzantine clients alone cannot end the run this way."""
        nodes = {v.voter for m, v in zip(messages, screened) if v.is_vote and is_secagg_error(m)}
        if len(nodes) > self.f:
            raise ConfigError(
                "mods", "secaggplus_mod", "a ClientApp without Flower's secure aggregation mods (secaggplus_mod, "
                "secagg_mod) under PhalanxFedAvg",
                f"round {server_round}: {len(nodes)} sampled clients failed on SecAgg+'s missing "
                f"{RECORD_KEY_CONFIGS!r} record, more than f={self.f} Byzantine ones could fake; {SECAGG}",
            )

    def _read(self, msg: Message, verdict: Screened, layout: Layout, plan: AdapterPlan | None) -> Reply:
        """The reply's update, or why it is dropped: by the one-vote check (then its content is never read), its
        structure, or (with ``lora``) its adapters."""
        if not verdict.passed:
            return Reply(node_id=verdict.node_id, dropped=verdict.detail, reason=verdict.reason)
        reply = read_reply(msg, layout, self.arrayrecord_key, self.weighted_by_key)
        reply.node_id = verdict.node_id
        if plan is not None:
            plan.check(reply, msg, self.arrayrecord_key)
        return reply

    def _wait_for_nodes(self, grid: Grid) -> None:
        """FedAvg sizes its sample on the nodes connected *now*; at the start of a simulation they are still
        registering, and round 1 would sample only ``min_train_nodes``. Wait as ``sample_nodes`` would anyway."""
        waited = False
        while len(list(grid.get_node_ids())) < self.min_available_nodes:
            if not waited:
                log(INFO, "phalanx: waiting for %d nodes to connect", self.min_available_nodes)
                waited = True
            time.sleep(0.1)

    @staticmethod
    def _stack(parsed: list[Reply], used: list[int], layout: Layout) -> Tensor | None:
        """The valid updates as one ``(n, d)`` tensor; each reply's own copy is released as it is copied in."""
        if not used:
            return None
        dtype = torch.float64 if layout.compute == np.float64 else torch.float32
        x = torch.empty((len(used), layout.size), dtype=dtype)
        for row, i in enumerate(used):
            update = parsed[i].update
            assert update is not None
            x[row] = torch.from_numpy(update)
            parsed[i].update = update[:0]  # still "valid", no longer holding d values
        return x

    def _aggregate(
        self, x: Tensor | None, lost: int, d: int, plan: AdapterPlan | None = None,
    ) -> tuple[Tensor | None, Tensor | None, int, str | None]:
        """``(Agg, shares, f used, None)``, or ``(…, why the model is kept)``; ``lost``: the m of f − m (nodes
        without a vote of their own doing, :func:`_lost_votes`; counted unless ``count_dropped_against_f`` is False);
        ``plan``: the round's adapters (the rule wrapped for the mode)."""
        f_eff = max(self.f - lost, 0) if self.count_dropped_against_f else self.f
        if x is None:
            return None, None, f_eff, "no valid reply"
        try:
            rule = self._for_missing.for_f(f_eff)
            rule = rule if plan is None else plan.rule(rule)
        except MissingTooMany as exc:
            return None, None, f_eff, f"{_name(self.rule)} with f={f_eff}: {exc.reason}"
        except PhalanxError as exc:
            return None, None, f_eff, f"{_name(self.rule)} with f={f_eff}: {exc}"
        need = _min_workers(rule)
        if x.shape[0] < need:
            return None, None, f_eff, f"{_name(rule)} with f={f_eff} needs {need} updates, got {x.shape[0]}"
        context: dict[str, Any] = {} if plan is None else plan.context(rule, x.dtype)
        prev = self._previous
        if "center" in getattr(rule, "context_keys", ()) and prev is not None and prev.shape == (d,):
            context["center"] = prev.to(x.dtype)
        try:
            if isinstance(rule, Aggregator):
                out, share = rule.aggregate(x, **context)
            else:
                out, share = rule(x), None
            if not isinstance(out, Tensor) or tuple(out.shape) != (d,):
                got = tuple(out.shape) if isinstance(out, Tensor) else type(out).__name__
                raise PhalanxError(f"the rule returned {got}, expected a tensor of shape ({d},)")
        except Exception as exc:  # a rule failing on the round's values must not end the run
            return None, None, f_eff, f"aggregation failed: {type(exc).__name__}: {exc}"
        out = out.detach().to(device="cpu", dtype=x.dtype)
        if not bool(torch.isfinite(out).all()):
            return out, share, f_eff, f"the aggregate is not finite ({_name(rule)} with f={f_eff} did not survive " \
                "the round's updates)"
        return out, share, f_eff, None

    def _contributions(
        self, server_round: int, parsed: list[Reply], used: list[int], x: Tensor | None, agg: Tensor | None,
        share: Tensor | None, why_not: str | None,
    ) -> list[Contribution]:
        norms: dict[int, float] = {}
        dists: dict[int, float] = {}
        shares: dict[int, float] = {}
        if x is not None:
            agg64 = None if agg is None else agg.double()
            for row, i in enumerate(used):  # row by row in float64: no (n, d) float64 copy, no overflow
                x64 = x[row].double()
                norms[i] = float(torch.linalg.vector_norm(x64))
                if agg64 is not None:
                    dists[i] = float(torch.linalg.vector_norm(x64 - agg64))
                if share is not None and bool(torch.isfinite(share[row])):
                    shares[i] = float(share[row])
        out: list[Contribution] = []
        for i, p in enumerate(parsed):
            if p.update is None:
                status, reason = f"dropped: {p.dropped}", p.reason or "malformed"
            elif why_not is None:
                status, reason = "used", "used"
            else:
                status, reason = f"not aggregated: {why_not}", "not-aggregated"
            out.append(Contribution(
                round=server_round, node_id=p.node_id, status=status, reason=reason, update_norm=norms.get(i),
                distance_to_aggregate=dists.get(i), share=shares.get(i), num_examples=p.num_examples,
            ))
        return out

    def _train_metrics(self, messages: list[Message], parsed: list[Reply], f: int) -> MetricRecord:
        records = [p.metrics for p in parsed if p.metrics is not None]
        return self._metrics(self._user_train_metrics, messages, records, "train", f)

    def _metrics(
        self, user_fn: MetricsFn | None, messages: list[Message], records: list[MetricRecord], what: str,
        f: int | None = None,
    ) -> MetricRecord:
        """The round's metrics: ``user_fn``'s, or the per-key median over at least 2f + 1 clients (``f``: the round's
        own, lowered by the nodes counted against it — as its update's rule is; the strategy's f otherwise)."""
        f = self.f if f is None else f
        if user_fn is not None and messages:
            try:
                result = user_fn([m.content for m in messages], self.weighted_by_key)
                if not isinstance(result, MetricRecord):
                    raise TypeError(f"returned {type(result).__name__}, not a MetricRecord")
                return result
            except Exception as exc:  # a client's odd metrics must not end the run
                log(WARNING, "phalanx: %s_metrics_aggr_fn failed (%s: %s); the per-key median is used instead",
                    what, type(exc).__name__, shorten(exc))  # its text may quote a client's keys or values
        if records and len(records) < 2 * f + 1:
            log(INFO, "phalanx: %s metrics of %d clients, fewer than 2f + 1 = %d: not reported (f Byzantine ones "
                "could choose their median)", what, len(records), 2 * f + 1)
        return median_metrics(records, exclude=(self.weighted_by_key,), at_least=2 * f + 1)

    def _log_round(
        self, server_round: int, parsed: list[Reply], records: list[Contribution], f_eff: int, agg: Tensor | None,
        why_not: str | None,
    ) -> None:
        used = sum(p.update is not None for p in parsed)
        drops = [f"node {p.node_id}: {p.dropped}" for p in parsed if p.update is None]
        text = (f"phalanx: round {server_round}: {len(parsed)} replies, {used} used, {len(drops)} dropped; "
                f"{_name(self.rule)} with f={f_eff}")
        if agg is not None and why_not is None:
            text += f"; |agg| = {float(agg.double().norm()):.4g}"
            far = [(r["distance_to_aggregate"], r["node_id"]) for r in records
                   if r["distance_to_aggregate"] is not None and np.isfinite(r["distance_to_aggregate"])]
            if far:
                dist, node = max(far, key=lambda t: t[0])
                text += f"; farthest node {node} at {dist:.4g}"
        if drops:
            text += "; dropped " + "; ".join(drops[:3]) + (f"; +{len(drops) - 3} more" if len(drops) > 3 else "")
        log(INFO, "%s", text)
        if why_not is not None:
            log(WARNING, "phalanx: round %d keeps the global model: %s", server_round, why_not)
