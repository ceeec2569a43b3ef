"""One vote per sampled node and round: which replies are a vote of the round, checked before any is read.

``configure_train`` (``configure_evaluate``) remembers the round's instructions — one ``Message`` per sampled node —
as :class:`Sent`: the live ``Metadata`` objects, because the Grid gives each instruction its ``message_id`` in place
when it pushes it, *after* ``configure_train`` has returned (``InMemoryGrid`` and the deployment grid both do).
:func:`screen` then judges each reply of the round, in order:

``unsampled``  its ``src_node_id`` is not a node the round sampled (or is unreadable: no int, outside uint64);
``stale``      it answers no instruction of this round: its ``reply_to_message_id`` is none of the round's
               instructions' ids, or its ``group_id`` is not the round's (a reply of an earlier round, a replay);
``impostor``   it answers an instruction of this round sent to *another* node (its ``src_node_id`` is not that
               instruction's ``dst_node_id``: a node claiming another node's vote, or another node's id);
``duplicate``  it is one of two or more replies that passed the checks above from the same node: *all* of that
               node's replies are dropped — a node voting twice is faulty, and which of its replies is the genuine
               one cannot be known.

A reply that passes is the *vote* of its node (:attr:`Screened.voter`). The replies dropped as unsampled, stale or
impostor are no sampled node's vote: they never count against f (otherwise replies under made-up ids, or replays,
would lower the f the rule is configured for down to 0). A duplicated node is one node whose vote is void: missing,
but not counted against f either, since the second reply in its name may be an impostor's that passed these checks
(``phalanx.flower.strategy._lost_votes``).

Flower's error reply for a reply whose objects the SuperLink could not pull (``src_node_id`` = the SuperLink's id,
``reply_to_message_id`` = the instruction) only ever says that the instruction's node is silent: it is reported under
that node and read as an error reply, but it is *no vote* (:attr:`Screened.is_vote` is False) — it never cancels the
node's own reply, never counts as a second reply in its name, never counts towards the SecAgg+ refusal. Anyone can
send a reply claiming id 1: taken as the node's vote, a forged one voided every honest node's vote (each then had
two) and, with secaggplus_mod's error text, counted towards the refusal that ends the run (an attacker's review).

While the instructions have no ``message_id`` (they were not pushed through a Grid that sets it in place), a reply is
checked against the sampled nodes and the round's ``group_id`` only: an impostor is then not detected. Without the
round's instructions at all (``aggregate_train`` driven after ``remember_global`` only) nothing is known of the
sample: only duplicates are dropped, and each reply's claimed ``src_node_id`` is its voter.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from flwr.app import Message, Metadata
from flwr.common.constant import SUPERLINK_NODE_ID

__all__ = ["REASONS", "Screened", "Sent", "node_id_of", "screen"]

_UINT64 = 2 ** 64
"""Node ids are uint64 on the wire; in-process Flower's ``Metadata`` takes any int (one of 5,000 digits ended the run
where it was formatted: Python refuses int → str beyond 4,300 digits — an attacker's review)."""

REASONS = ("duplicate", "unsampled", "stale", "impostor")
"""Why a reply is not a vote of the round, in the order the train metrics report them (``replies-<reason>``)."""


@dataclass(frozen=True)
class Sent:
    """A round's instructions: each one's live ``Metadata`` (``dst_node_id``, ``group_id``, and the ``message_id`` the
    Grid fills in when it pushes them)."""

    server_round: int
    metadata: tuple[Metadata, ...]

    @classmethod
    def of(cls, server_round: int, messages: Sequence[Message]) -> Sent:
        """Tag ``messages`` (as ``configure_train`` returns them) with the round as their ``group_id`` where they have
        none (Flower's ``FedAvg`` leaves it empty; its legacy workflows set it to the round) and remember them."""
        for msg in messages:
            if not msg.metadata.group_id:
                msg.metadata.group_id = str(server_round)
        return cls(server_round, tuple(m.metadata for m in messages))

    @cached_property
    def sampled(self) -> frozenset[int]:
        """The node ids the round's instructions were sent to."""
        return frozenset(int(m.dst_node_id) for m in self.metadata)

    @cached_property
    def group_ids(self) -> frozenset[str]:
        """The ``group_id`` of the round's instructions (one: the round, unless set otherwise)."""
        return frozenset(str(m.group_id) for m in self.metadata)

    def by_message_id(self) -> dict[str, Metadata] | None:
        """Each instruction's ``Metadata`` by its ``message_id``; None while the ids are unknown (the messages were not
        pushed through a Grid that sets them in place)."""
        ids = {str(m.message_id): m for m in self.metadata}
        return None if not ids or "" in ids else ids


@dataclass(frozen=True)
class Screened:
    """One reply as judged by :func:`screen`.

    ``node_id``: the node it is reported under (its ``src_node_id``; for the SuperLink's error reply, the node whose
    reply was lost). ``voter``: the sampled node whose vote it is or was (a node id, or a unique key for a reply
    without one when the sample is unknown; kept for a duplicate, whose node lost its vote), None when it is no vote
    of the round (unsampled, stale, impostor, and the SuperLink's error reply, which passes — it is read, as an error
    reply — without being a vote). ``reason``: None when it passed, else one of :data:`REASONS`; ``detail`` says why
    in words.
    """

    node_id: int | None
    voter: Hashable | None
    reason: str | None = None
    detail: str = ""

    @property
    def passed(self) -> bool:
        """True when the reply is its node's only vote of the round (it may still be dropped for its content)."""
        return self.reason is None

    @property
    def is_vote(self) -> bool:
        """True when the reply passed and is a node's own vote (the SuperLink's error reply passes but is none)."""
        return self.reason is None and self.voter is not None


def node_id_of(msg: Any) -> int | None:
    """The reply's ``src_node_id``; None when it is unreadable — no int, or outside uint64. Never raises."""
    try:
        value = msg.metadata.src_node_id
        if isinstance(value, bool) or not isinstance(value, int):
            value = int(value)
        return value if 0 <= value < _UINT64 else None
    except Exception:  # a reply without readable metadata is judged, never a crash
        return None


def _field(msg: Any, name: str) -> str:
    try:
        return str(getattr(msg.metadata, name))
    except Exception:  # as above
        return ""


def _short(text: str, limit: int = 40) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _judge(index: int, msg: Message, sent: Sent | None, instructions: dict[str, Metadata] | None) -> Screened:
    """The reply's verdict before duplicates are looked for."""
    src = node_id_of(msg)
    if sent is None:
        return Screened(src, src if src is not None else ("reply", index))
    reply_to, group_id = _field(msg, "reply_to_message_id"), _field(msg, "group_id")
    answered = None if instructions is None else instructions.get(reply_to)
    if src == SUPERLINK_NODE_ID and answered is not None and msg.has_error():
        owner = int(answered.dst_node_id)  # the SuperLink's error for a reply it could not pull: node silent
        return Screened(owner, None)  # reported under that node, but no vote (anyone can claim id 1)
    if src is None or src not in sent.sampled:
        who = "no readable node id" if src is None else f"node {src} was not sampled"
        return Screened(src, None, "unsampled", f"unsampled: {who} in round {sent.server_round}")
    if answered is None:  # without the ids (not pushed yet), the round's group_id is all there is to check
        fresh = instructions is None and group_id in sent.group_ids
    else:
        fresh = group_id == str(answered.group_id)
    if not fresh:
        return Screened(src, None, "stale", f"stale: answers no instruction of round {sent.server_round} "
                        f"(reply_to_message_id {_short(reply_to)!r}, group_id {_short(group_id)!r})")
    owner = src if answered is None else int(answered.dst_node_id)
    if owner != src:
        return Screened(src, None, "impostor",
                        f"impostor: from node {src}, but answers the instruction sent to node {owner}")
    return Screened(src, src)


def screen(messages: Iterable[Message], sent: Sent | None) -> list[Screened]:
    """One :class:`Screened` per reply, in order (see the module's docstring). Never raises on a reply."""
    instructions = None if sent is None else sent.by_message_id()
    verdicts = [_judge(i, m, sent, instructions) for i, m in enumerate(messages)]
    votes = Counter(v.voter for v in verdicts if v.is_vote)
    out: list[Screened] = []
    for v in verdicts:
        count = votes[v.voter] if v.is_vote else 0
        if count > 1:
            where = "" if sent is None else f" in round {sent.server_round}"
            v = Screened(v.node_id, v.voter, "duplicate",
                         f"duplicate: node {v.node_id} sent {count} replies{where}; all of them are dropped")
        out.append(v)
    return out
