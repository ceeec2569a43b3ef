"""One registry mechanism for everything a user can bring: rules, attacks, models, data sets, losses and server
optimizers.

A name given to Phalanx (in Python, in a TOML config, on the command line) resolves, in this order, to:

1. a built-in, or an entry registered in this process with the kind's decorator (``@aggregators.register``,
   ``@attacks.register``, ``@models.register("name")``, ``@data.register("name")``, ``@losses.register("name")``);
2. a ``module:attr`` spec — ``"mylab.rules:Trimmed2"`` — imported where it is resolved, so it reaches every process
   that reads the config (a parallel sweep's workers, every torchrun rank) as long as ``mylab`` is importable there;
3. an installed package's entry point in the kind's group (``phalanx.aggregators``, ``phalanx.attacks``,
   ``phalanx.models``, ``phalanx.datasets``, ``phalanx.losses``, ``phalanx.optimizers``): ``pip install`` a plug-in
   once and its names work everywhere, like the built-ins.

An unknown name is a :class:`~phalanx.errors.ConfigError` naming the parameter, listing the known names and
suggesting the closest ones.
"""

from __future__ import annotations

import importlib
import inspect
import os
import pkgutil
import re
import warnings
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from importlib.metadata import EntryPoint, entry_points
from types import ModuleType
from typing import Any, ClassVar, Generic, TypeVar, overload

from phalanx.errors import ConfigError
from phalanx.validate import suggest

__all__ = ["NO_PLUGINS", "Component", "Registry", "accepted_params", "check_params", "import_modules", "import_spec",
           "installed_entry_points", "is_spec", "no_spec_imports", "parse_value", "plugins_disabled", "split_call"]

NO_PLUGINS = "PHALANX_NO_PLUGINS"
"""Set (to anything but ``0``), installed plug-ins are ignored: Phalanx's own components only, whatever is installed
(the outputs docs/ quotes are regenerated so, and the tests that compare Phalanx's declarations with its classes run
so). A component given by a ``module:attr`` spec still loads: it is named, not discovered."""


def plugins_disabled() -> bool:
    """Whether :data:`NO_PLUGINS` is set (read at each call, not cached)."""
    return os.environ.get(NO_PLUGINS, "") not in ("", "0")


def installed_entry_points(group: str) -> list[EntryPoint]:
    """The installed entry points of ``group``, or none while :func:`plugins_disabled`."""
    return [] if plugins_disabled() else list(entry_points(group=group))

T = TypeVar("T")
Obj = TypeVar("Obj")


class Component:
    """What every registered component (rule, pre-aggregator, attack) has: the name it is known by, the paper that
    defines it, its configuration (:meth:`params`, the constructor's arguments) and a ``repr`` that shows it."""

    name: ClassVar[str]
    """The name ``make`` knows it by."""
    reference: ClassVar[str]
    """The paper that defines it (authors, title, venue, year, and the equation or algorithm used)."""

    def params(self) -> dict[str, Any]:
        """The configuration — the constructor's arguments, read from the attributes of the same names
        (:func:`constructor_params`) — for logs, manifests and rebuilding the component (a rule's ``with_f``).
        A component that keeps an argument under another name overrides this."""
        return constructor_params(self)

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.params().items())
        return f"{type(self).__name__}({args})"


def constructor_params(obj: object) -> dict[str, Any]:
    """``obj``'s configuration derived from its class's constructor (scikit-learn's ``get_params`` convention): each
    named parameter of ``__init__`` (``*args``/``**kwargs`` skipped), in the signature's order, with the value of
    the attribute of that name. A parameter kept under another name (or as a method's name) is a
    :class:`TypeError` naming the class and the parameter — the author overrides ``params()`` then — rather than a
    configuration that silently drops it."""
    out: dict[str, Any] = {}
    for name, p in list(inspect.signature(type(obj).__init__).parameters.items())[1:]:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        value = getattr(obj, name, _MISSING)
        if value is _MISSING or inspect.ismethod(value):
            raise TypeError(f"{type(obj).__name__}.params(): constructor parameter {name!r} is not kept as "
                            f"self.{name}; keep it so, or override params()")
        out[name] = value
    return out


_MISSING = object()


def import_modules(package: str, path: Iterable[str]) -> list[ModuleType]:
    """Import every public module of ``package`` (whose ``__path__`` is ``path``), then every module of its public
    subpackages, each level in name order, and return them in that order: how a package of built-ins (rules,
    attacks, round algorithms) finds its members by itself — importing a module registers what it defines, so a new
    built-in is one file there, with no list of imports to extend. A name starting with ``_`` (a helper, a compiled
    kernel) is left out. The order is fixed (sorted), so registration is the same in every process."""
    found = sorted(pkgutil.iter_modules(list(path)), key=lambda m: (m.ispkg, m.name))
    modules: list[ModuleType] = []
    for info in found:
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{package}.{info.name}")
        modules.append(module)
        if info.ispkg:
            modules += import_modules(module.__name__, module.__path__)
    return modules


def is_spec(name: str) -> bool:
    """Whether ``name`` is a ``module:attr`` spec (rather than a registered name)."""
    return isinstance(name, str) and ":" in name


_RECORDED: ContextVar[str | None] = ContextVar("phalanx_recorded_config", default=None)
"""The recorded file whose names are being resolved (:func:`no_spec_imports`); None: a user's own config."""


@contextmanager
def no_spec_imports(origin: str) -> Iterator[None]:
    """While the block runs, :func:`import_spec` refuses every ``module:attr`` spec — a one-line
    :class:`ConfigError` naming the parameter and ``origin`` — instead of importing it: for a config read back from a
    file that someone else may have written (``phalanx audit`` of a run directory handed over), where importing
    ``pwn:Rule`` would run the code of whoever wrote the file (a ``pwn.py`` next to it is importable when the
    command runs from that directory). Registered names and installed entry points (code the auditor installed)
    still resolve. Issue 38, finding 4; ``tests/test_audit_hostile.py``."""
    token = _RECORDED.set(origin)
    try:
        yield
    finally:
        _RECORDED.reset(token)


def import_spec(spec: str, parameter: str) -> Any:
    """The object a ``module:attr`` spec names (``attr`` may be dotted); a clear error if it cannot be imported, or
    if it is named by a recorded config (:func:`no_spec_imports`: refused, never imported)."""
    if (origin := _RECORDED.get()) is not None:
        raise ConfigError(parameter, spec, "a registered name or an installed entry point",
                          f"{origin} is a recorded config: a 'module:attr' spec in it is not imported, as that would "
                          "run the code of whoever wrote the file")
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ConfigError(parameter, spec, "a registered name or a 'module:attr' spec such as 'mylab.rules:Trimmed2'")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(
            parameter, spec, f"a 'module:attr' spec whose module can be imported ({exc})",
            "is the module installed, or its directory on PYTHONPATH (for every process of a sweep or a launch)?",
        ) from None
    except Exception as exc:  # a relative or malformed name (TypeError, ValueError), or a module that fails to load
        raise ConfigError(parameter, spec, f"a 'module:attr' spec whose module can be imported ({exc!r})") from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ConfigError(parameter, spec, f"an attribute that exists in {module_name} (no {part!r})")
        obj = getattr(obj, part)
    return obj


CALL = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_.-]*(?::[A-Za-z_][A-Za-z0-9_.]*)?)\s*(?:\((.*)\))?\s*$", re.S)
"""A name with inline parameters: ``name``, ``module:attr`` or either followed by ``(key=value, ...)``."""


def parse_value(text: str) -> Any:
    """An inline parameter's value: a boolean, ``none``, an int, a float, a quoted or a bare string."""
    t = text.strip()
    low = t.lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("none", "null"):
        return None
    for conv in (int, float):
        try:
            return conv(t)
        except ValueError:
            pass
    if len(t) >= 2 and t[0] == t[-1] and t[0] in "'\"":
        return t[1:-1]
    return t


def split_call(spec: str, parameter: str) -> tuple[str, dict[str, Any]]:
    """``"name(key=value, ...)"`` as ``("name", {key: value, ...})`` (a bare name has no parameters); ``parameter``
    names the config key in the error for a malformed one."""
    m = CALL.match(spec) if isinstance(spec, str) else None
    if m is None:
        raise ConfigError(parameter, spec, "a name, or a name with parameters: name(key=value, ...)")
    name, arg_text = m.group(1), m.group(2)
    params: dict[str, Any] = {}
    if arg_text and arg_text.strip():
        for kv in arg_text.split(","):
            if "=" not in kv:
                raise ConfigError(parameter, spec, f"parameters as key=value, got {kv.strip()!r}")
            key, value = kv.split("=", 1)
            if key.strip() in params:
                raise ConfigError(parameter, spec, f"each parameter once ({key.strip()!r} is given twice)")
            params[key.strip()] = parse_value(value)
    return name, params


def accepted_params(fn: Callable[..., Any], skip: tuple[str, ...] = ()) -> list[str] | None:
    """The keyword parameters ``fn`` accepts (without ``self`` and ``skip``), or None when it takes ``**kwargs``."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    names = []
    for p in sig.parameters.values():
        if p.kind is inspect.Parameter.VAR_KEYWORD:
            return None
        if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY):
            if p.name != "self" and p.name not in skip:
                names.append(p.name)
    return names


def check_params(what: str, fn: Callable[..., Any], params: dict[str, Any], skip: tuple[str, ...] = ()) -> None:
    """Refuse parameters ``fn`` does not take, listing the ones it does (``what`` names the component)."""
    accepted = accepted_params(fn, skip)
    if accepted is None:
        return
    unknown = sorted(set(params) - set(accepted))
    if unknown:
        raise ConfigError(f"{what} parameter", unknown, f"parameters of {what}: {', '.join(accepted) or 'none'}")


class Registry(Generic[T]):
    """Names of one kind of component → objects (classes or builder functions).

    ``kind`` is how the user names the kind in errors (``"aggregator"``), ``group`` the entry-point group
    (``"phalanx.aggregators"``), ``accept(obj, name)`` validates (or adapts) an object before it is handed out.
    ``legacy_group``: an older group this kind was read from, still read (its entry points under the names the new
    group does not have), each with a :class:`DeprecationWarning` naming the group to move to — the communication
    graphs and the torchrun topologies shared ``phalanx.topologies`` until each got its own group.
    """

    def __init__(self, kind: str, group: str, accept: Callable[[Any, str], T] | None = None,
                 legacy_group: str | None = None) -> None:
        self.kind = kind
        self.group = group
        self.legacy_group = legacy_group
        self._accept = accept
        self._entries: dict[str, T] = {}
        self._loaded: dict[str, T] = {}  # entry points loaded, by name: kept apart, as they shadow nothing
        self._entry_points: dict[str, EntryPoint] | None = None
        self._shadowed: set[str] = set()  # names whose shadowed entry point was already said

    @overload
    def register(self, obj: Obj, *, name: str | None = None) -> Obj: ...

    @overload
    def register(self, obj: None = None, *, name: str | None = None) -> Callable[[Obj], Obj]: ...

    def register(self, obj: Any = None, *, name: str | None = None) -> Any:
        """Register ``obj`` under ``name`` (default: its ``name`` attribute, else its ``__name__``); usable as a
        decorator with or without arguments. Registering a name twice is an error."""

        def deco(o: Any) -> Any:
            key = name or getattr(o, "name", None) or getattr(o, "__name__", None)
            if not isinstance(key, str) or not key:
                raise ConfigError(f"{self.kind} name", key, "a non-empty string (pass name=...)")
            if is_spec(key) or ">" in key:
                raise ConfigError(f"{self.kind} name", key, "a name without ':' or '>'")
            if key in self._entries:
                raise RuntimeError(f"{self.kind} name {key!r} registered twice")
            self._entries[key] = self._accept(o, key) if self._accept else o
            return o

        return deco if obj is None else deco(obj)

    def _eps(self) -> dict[str, EntryPoint]:
        if plugins_disabled():
            return {}
        if self._entry_points is None:
            old = {ep.name: ep for ep in entry_points(group=self.legacy_group)} if self.legacy_group else {}
            self._entry_points = old | {ep.name: ep for ep in entry_points(group=self.group)}
        return self._entry_points

    def _warn_shadowed(self, name: str) -> None:
        """Once per name: an installed entry point of this group named like a registered entry is never used (the
        registered one comes first), which a plug-in's author would not see (an extension author's review)."""
        ep = self._eps().get(name)
        if ep is None or name in self._shadowed:
            return
        self._shadowed.add(name)
        registered = self._entries[name]
        if ep.module == getattr(registered, "__module__", None) or ep.module.split(".")[0] == "phalanx":
            return  # the same object (an entry point of a module that also registers it), or Phalanx's own
        warnings.warn(f"{self.kind} {name!r}: the installed entry point {name} = {ep.value} ({ep.group}) is "
                      f"shadowed by the built-in of that name and never used — name it otherwise, or give the spec "
                      f"{ep.value!r}", UserWarning, stacklevel=3)

    def names(self) -> list[str]:
        """Every name :meth:`get` knows without a spec: registered ones and installed entry points, sorted."""
        return sorted(set(self._entries) | set(self._eps()))

    def registered(self) -> dict[str, T]:
        """The entries registered in this process (built-ins and decorators), by name."""
        return dict(self._entries)

    def __contains__(self, name: object) -> bool:
        if not isinstance(name, str):
            return False
        return name in self._entries or name in self._eps() or is_spec(name)

    def get(self, name: str, parameter: str | None = None) -> T:
        """The object for ``name`` (a registered name, a ``module:attr`` spec or an entry point's name)."""
        parameter = parameter or self.kind
        if isinstance(name, str) and name in self._entries:
            self._warn_shadowed(name)
            return self._entries[name]
        if isinstance(name, str) and is_spec(name):
            obj = import_spec(name, parameter)
            return self._accept(obj, name) if self._accept else obj
        if isinstance(name, str) and name in self._loaded:  # an entry point loaded before: the same object again
            return self._loaded[name]
        ep = self._eps().get(name) if isinstance(name, str) else None
        if ep is not None:
            if ep.group != self.group:
                warnings.warn(f"{self.kind} {name!r} is an entry point of the old group {ep.group}; register it "
                              f"under {self.group} (the old group is read for now)", DeprecationWarning,
                              stacklevel=2)
            try:
                obj = ep.load()
            except Exception as exc:  # a broken plug-in: say which one
                raise ConfigError(parameter, name, f"an entry point of {ep.group} that loads ({exc!r})") from None
            accepted = self._accept(obj, name) if self._accept else obj
            # cached apart from the registered entries: cached among them, its next lookup took it for a registered
            # name that shadows the entry point, and warned that the plug-in in use was "never used" (audit F5)
            self._loaded[name] = accepted
            return accepted
        raise ConfigError(
            parameter, name, "one of " + ", ".join(self.names()) + " or a 'module:attr' spec",
            _params_hint(parameter, name, self.names()) or suggest(name, self.names()),
        )


def _params_hint(parameter: str, name: Any, known: list[str]) -> str | None:
    """For ``attack='alie(z=1)'`` — the call form aggregator specs take — where the parameters go instead:
    ``--set attack=alie --set 'attack_params={z = 1}'``; None for any other name."""
    call = re.fullmatch(r"\s*([\w.-]+)\s*\((.*)\)\s*", name) if isinstance(name, str) else None
    if call is None or call[1] not in known:
        return None
    table = ", ".join(part.strip().replace("=", " = ", 1) for part in call[2].split(",") if part.strip())
    return (f"the {parameter}'s parameters go in {parameter}_params, not in parentheses: --set {parameter}={call[1]} "
            f"--set '{parameter}_params={{{table}}}'")
