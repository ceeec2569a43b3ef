"""The config sections by name, in the tree's order (issue 39, item 2: "each section declared by the component that
reads it"; the newcomer's "a config section of one's own is one file").

A module declares its :class:`~phalanx.validate.Section` and registers it in the same file, with :func:`register`:
the built-in ones in :mod:`phalanx.experiments.concerns` (each on the value that reads it: ``@register`` on
``RunShape``, whose ``section`` is ``[run]``), a plug-in's in its own module, found by its entry point in the group
``phalanx.sections`` (:data:`GROUP`; the value is the module, or the :class:`Section` it declares) — the package's
plug-in mechanism for every other kind of piece (:class:`phalanx.plugins.Registry`). The entry points are read
once, after the built-in sections and before the schema's fields are made (:mod:`phalanx.experiments.schema` reads
:func:`declared` when it is imported), so that every consumer reads one list: :func:`phalanx.experiments.
concerns.declared` (what the schema's fields, the flat-key adapter's table, the range checks and ``phalanx list
sections`` are made from), :data:`phalanx.experiments.tree.SECTIONS` (:class:`Names`, the tree's order), the
schema's ``LATER_KEYS`` and ``RESULT_NEUTRAL_KEYS`` (a section declared ``result_neutral`` names no run).

A holder is a :class:`Section`, or a class that carries its section(s) as ``section`` / ``sections``: the
declaration is read from the class at every look-up, so that a declaration replaced on its class (a test's, the
recipe of docs/config.md) is the one read. A name is registered once: a section whose name another section has —
a built-in's or another plug-in's — is a one-line :class:`~phalanx.errors.ConfigError` naming both, never a silent
replacement; so is a flat key that another section already declares.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator, Sequence
from types import ModuleType
from typing import Any, TypeVar

from phalanx.errors import ConfigError
from phalanx.plugins import installed_entry_points, plugins_disabled
from phalanx.validate import Section

__all__ = ["GROUP", "Names", "SectionRegistry", "declared", "names", "register", "sections"]

GROUP = "phalanx.sections"
"""The entry-point group of a plug-in's config sections."""

NAME = re.compile(r"^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)?$")
"""A section's name: a lower-case word (``run_notes``), or two joined by a dot (``server.optimizer``)."""

RESERVED = ("tie",)
"""Top-level tables that are no component's section: a grid's ``[tie]``."""

H = TypeVar("H")


def read(holder: Any) -> tuple[Section, ...]:
    """The sections ``holder`` declares now: itself (a :class:`Section`), or its class's ``sections`` / ``section``."""
    if isinstance(holder, Section):
        return (holder,)
    many = getattr(holder, "sections", None)
    if many is not None:
        return tuple(many)
    return (holder.section,)


class SectionRegistry:
    """Section holders in registration order (built-ins first, then the entry points of ``group``), each name once."""

    def __init__(self, group: str = GROUP) -> None:
        self.group = group
        self._holders: list[tuple[Any, str]] = []
        self._found = False
        self.closed = False
        """Set when the schema's fields have been made from the sections (:mod:`phalanx.experiments.schema`): a
        section registered after that would have no field, and is refused."""

    def register(self, holder: H, origin: str = "") -> H:
        """Register ``holder`` (a :class:`Section`, or a class whose ``section`` / ``sections`` it is), from
        ``origin`` (who registers it, for a collision's error: its module by default). A name another section has,
        a malformed name, or a flat key another section declares is a one-line :class:`ConfigError`."""
        origin = origin or _origin(holder)
        for section in read(holder):
            if self.closed:
                raise ConfigError("section", section.name, f"a section registered before the run config's schema is "
                                  f"made (by its entry point in {self.group}: docs/config.md); {origin} registers it "
                                  "after")
            self.refusal(section, origin)
        self._holders.append((holder, origin))
        return holder

    def refusal(self, section: Section, origin: str) -> None:
        """The check of one section before it is registered (see :meth:`register`)."""
        if not isinstance(section.name, str) or not NAME.match(section.name) or section.name in RESERVED:
            raise ConfigError("section", section.name, "a lower-case name (run_notes, or two words joined by a "
                              f"dot), not {', '.join(RESERVED)}")
        taken = {s.name: where for h, where in self._holders for s in read(h)}
        heads = {name.split(".")[0]: where for name, where in taken.items()}
        head = section.name.split(".")[0]
        if section.name in taken or (head in heads and section.name != head):
            where = taken.get(section.name) or heads[head]
            raise ConfigError("section", section.name, f"a name no other section has ([{section.name}] is "
                              f"declared by {where}; {origin} declares it again)")
        if head in heads:  # [server] beside [server.optimizer]
            raise ConfigError("section", section.name, f"a name no other section has ([{head}.…] is declared by "
                              f"{heads[head]}; {origin} declares [{section.name}])")
        flats = {k.flat.partition(".")[0]: (s.name, where) for h, where in self._holders for s in read(h)
                 for k in s.keys}
        for key in section.keys:
            outer = key.flat.partition(".")[0]
            owner = flats.get(outer) if "." not in key.flat else None
            if owner is not None:
                name, where = owner
                raise ConfigError(f"[{section.name}].{key.key}", key.flat, f"a flat key no other section declares "
                                  f"([{name}], by {where}, declares {outer})")

    def discover(self) -> None:
        """Read the entry points of :attr:`group` once: each one's module is imported (a module that registers
        its section itself), and a :class:`Section` or holder it names is registered unless it already was. A
        broken plug-in is a one-line :class:`ConfigError` naming its entry point."""
        if self._found or plugins_disabled():  # disabled: nothing read, so a later call without it still reads
            return
        self._found = True
        for ep in sorted(installed_entry_points(self.group), key=lambda e: (e.name, e.value)):
            try:
                obj = ep.load()
            except ConfigError:
                raise
            except Exception as exc:  # a broken plug-in: say which one
                raise ConfigError(self.group, ep.name, f"an entry point that loads ({exc!r})") from None
            if isinstance(obj, ModuleType) or any(h is obj for h, _ in self._holders):
                continue
            if not isinstance(obj, Section) and not hasattr(obj, "section") and not hasattr(obj, "sections"):
                raise ConfigError(self.group, ep.name, "a module, a Section or a class with its section")
            self.register(obj, f"the entry point {ep.name} ({ep.value})")

    def sections(self) -> tuple[Section, ...]:
        """Every registered section, in order, read from its holder now (the entry points read first)."""
        self.discover()
        return tuple(s for h, _ in self._holders for s in read(h))

    def declared(self) -> tuple[Section, ...]:
        """The sections with keys of their own (``[stages]``, whose tables are the stages', has none)."""
        return tuple(s for s in self.sections() if s.keys)

    def names(self) -> tuple[str, ...]:
        """Every section's name, in order: the tree's sections, as :func:`~phalanx.experiments.tree.to_tree`
        writes them."""
        return tuple(s.name for s in self.sections())

    def origins(self) -> dict[str, str]:
        """Section name → who registered it."""
        self.discover()
        return {s.name: where for h, where in self._holders for s in read(h)}


def _origin(holder: Any) -> str:
    """The module that declares ``holder``: its class's, or (a :class:`Section`) the first caller outside this
    module."""
    module = None if isinstance(holder, Section) else getattr(holder, "__module__", None)
    if not module:
        frame = sys._getframe(1)
        while frame.f_back is not None and frame.f_globals.get("__name__") == __name__:
            frame = frame.f_back
        module = frame.f_globals.get("__name__", "?")
    return str(module)


REGISTRY = SectionRegistry()
"""The one registry: the built-in sections (:mod:`phalanx.experiments.concerns`) and the plug-ins'."""


def register(holder: H, origin: str = "") -> H:
    """Register a config section (or a class carrying it) in :data:`REGISTRY`; usable as a class decorator."""
    return REGISTRY.register(holder, origin)


def sections() -> tuple[Section, ...]:
    """:meth:`SectionRegistry.sections` of :data:`REGISTRY`."""
    return REGISTRY.sections()


def declared() -> tuple[Section, ...]:
    """:meth:`SectionRegistry.declared` of :data:`REGISTRY`."""
    return REGISTRY.declared()


def names() -> tuple[str, ...]:
    """:meth:`SectionRegistry.names` of :data:`REGISTRY`."""
    return REGISTRY.names()


class Names(Sequence[str]):
    """The registered sections' names, read at every look-up (:data:`phalanx.experiments.tree.SECTIONS`): no
    second list."""

    def __getitem__(self, index: Any) -> Any:
        return names()[index]

    def __len__(self) -> int:
        return len(names())

    def __iter__(self) -> Iterator[str]:
        return iter(names())

    def __contains__(self, name: object) -> bool:
        return name in names()

    def __eq__(self, other: object) -> bool:
        return tuple(self) == (tuple(other) if isinstance(other, (tuple, list, Names)) else other)

    def __hash__(self) -> int:
        return hash(names())

    def __repr__(self) -> str:
        return repr(names())
