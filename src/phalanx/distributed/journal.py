"""A gossip node's *journal*: what it took from whom, and what it missed, in each round since its last report —
signed by the node itself, and checked (size, schema, types, ranges, signature) before rank 0 keeps it.

A journal is a list of items, one per round ``u`` of ``rounds`` (the rounds since the node's last report, in
order)::

    {"round": u, "accepted": [{"rank": j, "phase": p, "sha256": <hex 64>, "signature": <hex 128>}, …],
     "missing": [k, …]}

``accepted``: the messages the node used in round u, each with the sender's own Ed25519 signature (domain
``phalanx/gossip/v1``, :func:`~phalanx.distributed.mesh.mesh_message`); ``missing``: the senders whose message did
not come or was refused (sorted). Within an item a (rank, phase) appears once, no rank is both accepted and missing,
and no rank is the node itself.

The node sends its journal to rank 0 as canonical JSON (sorted keys, no spaces: :func:`canonical`) with its
signature over :func:`journal_message` — ``DOMAIN ‖ run nonce ‖ config digest ‖ gathering round ‖ node ‖
SHA-256(journal)`` — so the journal in rank 0's transcript is the node's own word: rank 0 can drop it (the node is
then *silent* at that gathering) but can neither write one for a node nor change one. :func:`read_journal` is what
rank 0 and the audit apply; it never raises on what a peer sent, it says what is wrong.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from typing import Any

from phalanx.distributed.channel import Kind
from phalanx.distributed.mesh import mesh_message

DOMAIN = b"phalanx/journal/v1\x00"
ENTRY_BYTES = 256
"""The most bytes one accepted entry takes in canonical JSON (two hex digests, a rank, a phase)."""
JOURNAL_MAX_BYTES = 4 << 20
"""No journal is longer than this, whatever the job (a longer one is refused unread)."""
_HEX64 = re.compile(r"[0-9a-f]{64}")
_HEX128 = re.compile(r"[0-9a-f]{128}")
_ITEM_KEYS = {"round", "accepted", "missing"}
_ENTRY_KEYS = {"rank", "phase", "sha256", "signature"}


def journal_message(nonce: bytes, config: str, t: int, node: int, digest: bytes) -> bytes:
    """What a node's journal signature covers: the run (nonce, config digest), the gathering round, the node, and
    the SHA-256 of the canonical journal."""
    return DOMAIN + nonce + config.encode() + t.to_bytes(8, "big") + node.to_bytes(4, "big") + digest


JOURNAL_ITEM_CHARS = len('{"accepted":[],"missing":[],"round":0},')
"""The fewest characters one round's entry takes in a journal's canonical JSON (with its comma): a journal of c
characters covers at most c // JOURNAL_ITEM_CHARS rounds."""


def canonical(items: Any) -> str:
    """The canonical JSON of a journal (what is signed)."""
    return json.dumps(items, sort_keys=True, separators=(",", ":"))


def sign_journal(identity: Any, nonce: bytes, config: str, t: int, items: list[dict[str, Any]]) -> tuple[str, str]:
    """A node's journal as sent to rank 0: (canonical JSON, the node's signature in hex)."""
    text = canonical(items)
    digest = hashlib.sha256(text.encode()).digest()
    return text, identity.sign(journal_message(nonce, config, t, identity.rank, digest)).hex()


def journal_limit(workers: int, span: int) -> int:
    """The most bytes a journal of ``span`` rounds of an ``workers``-rank job can take in canonical JSON."""
    per_round = 64 + 2 * workers * ENTRY_BYTES + 12 * workers
    return min(JOURNAL_MAX_BYTES, 2 + max(1, span) * per_round)


def _int(value: Any, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def check_items(items: Any, node: int, workers: int, rounds: list[int]) -> str | None:
    """What is wrong with a journal's items for ``node`` covering ``rounds``, or None."""
    if not isinstance(items, list):
        return "not a list"
    if [item.get("round") if isinstance(item, dict) else None for item in items] != rounds:
        shown = [item.get("round") if isinstance(item, dict) else "?" for item in items[:8]]
        return f"it covers rounds {str(shown)[:80]}, not {rounds[0] if rounds else '–'} … " \
               f"{rounds[-1] if rounds else '–'} (the rounds since its last report)"
    for item in items:
        u = item["round"]
        if not _int(u, 0, 1 << 62):
            return f"a round {str(u)[:20]!r} that is not an integer"
        if set(item) != _ITEM_KEYS:
            return f"round {u}: not an entry of a journal (keys {sorted(item)[:6]})"
        accepted, missing = item["accepted"], item["missing"]
        if not isinstance(accepted, list) or len(accepted) > 2 * workers:
            return f"round {u}: 'accepted' is not a list of at most {2 * workers} entries"
        if not isinstance(missing, list) or len(missing) > workers:
            return f"round {u}: 'missing' is not a list of at most {workers} ranks"
        heard: set[tuple[int, int]] = set()
        for entry in accepted:
            if not isinstance(entry, dict) or set(entry) != _ENTRY_KEYS:
                return f"round {u}: an accepted entry is not {{rank, phase, sha256, signature}}"
            rank, phase = entry["rank"], entry["phase"]
            if not _int(rank, 0, workers - 1) or rank == node:
                return f"round {u}: accepted rank {str(rank)[:20]!r} is not another rank of the job"
            if not _int(phase, 0, 1):  # an int: 0.0 == 0 would pass a membership test, then break the message
                return f"round {u}: rank {rank}'s entry has no valid phase"
            if not (isinstance(entry["sha256"], str) and _HEX64.fullmatch(entry["sha256"])
                    and isinstance(entry["signature"], str) and _HEX128.fullmatch(entry["signature"])):
                return f"round {u}: rank {rank}'s entry has no valid digest or signature"
            if (rank, phase) in heard:
                return f"round {u}: rank {rank} was heard twice"
            heard.add((rank, phase))
        if not all(_int(k, 0, workers - 1) and k != node for k in missing) or missing != sorted(set(missing)):
            return f"round {u}: 'missing' is not a sorted list of other ranks of the job"
        both = sorted({r for r, _ in heard} & set(missing))
        if both:
            return f"round {u}: ranks {both} are both accepted and missing"
    return None


def read_journal(text: Any, signature: Any, node: int, workers: int, rounds: list[int], keys: Mapping[int, Any],
                 nonce: bytes, config: str, t: int) -> list[dict[str, Any]] | str:
    """Node ``node``'s journal as it reported it at gathering round t, checked — its size before it is parsed, its
    items (:func:`check_items`), its canonical form, the node's signature (``keys``: every rank's public key), and
    every accepted message's signature by its sender for this node, round and phase — or what is wrong with it.
    Never raises on input."""
    from cryptography.exceptions import InvalidSignature

    if not isinstance(text, str) or not isinstance(signature, str):
        return "no journal and signature (strings)"
    limit = journal_limit(workers, len(rounds))
    if len(text) > limit:
        return f"a journal of {len(text)} characters, more than the {limit} one of {len(rounds)} rounds can take"
    try:
        items = json.loads(text)
    except (ValueError, RecursionError) as exc:
        return f"not JSON ({type(exc).__name__})"
    problem = check_items(items, node, workers, rounds)
    if problem is not None:
        return problem
    if canonical(items) != text:
        return "not in canonical form (what it signed cannot be checked)"
    try:
        if not _HEX128.fullmatch(signature):
            raise InvalidSignature
        keys[node].verify(bytes.fromhex(signature), journal_message(nonce, config, t, node,
                                                                    hashlib.sha256(text.encode()).digest()))
    except InvalidSignature:
        return f"its signature does not verify with rank {node}'s key"
    for item in items:
        for a in item["accepted"]:
            message = mesh_message("gossip", nonce, config, Kind.ROW, a["phase"], item["round"], a["rank"], node,
                                   bytes.fromhex(a["sha256"]))
            try:
                keys[a["rank"]].verify(bytes.fromhex(a["signature"]), message)
            except InvalidSignature:
                return f"round {item['round']}: rank {a['rank']}'s message does not verify with its key"
    return list(items)
