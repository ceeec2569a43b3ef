"""Name → class registry of the attacks (:mod:`phalanx.plugins`), :func:`make` and :func:`names`."""

from __future__ import annotations

import inspect
from typing import Any, ClassVar, TypeVar

from torch import Tensor

from phalanx.attacks.base import Attack, AttackContext, DataAttack
from phalanx.errors import ConfigError, InputError
from phalanx.plugins import Registry, check_params

__all__ = ["get_class", "make", "names", "register", "user_attack"]

C = TypeVar("C")


def _accept(obj: Any, name: str) -> type[Attack] | type[DataAttack]:
    """A registered attack class as is; any other class becomes a vector attack through :func:`user_attack`."""
    if isinstance(obj, type) and issubclass(obj, (Attack, DataAttack)):
        return obj
    if callable(obj):
        return user_attack(obj, name)
    raise ConfigError("attack", name, "a class whose instances map an AttackContext to the (b, d) Byzantine vectors")


_REGISTRY: Registry[type[Attack] | type[DataAttack]] = Registry("attack", "phalanx.attacks", _accept)


def register(cls: C) -> C:
    """Class decorator: make an attack known to :func:`make` under ``cls.name`` (else its class name)."""
    _REGISTRY.register(cls)
    return cls


def names(kind: str | None = None) -> list[str]:
    """Names :func:`make` accepts, sorted: ``kind="vector"``, ``kind="data"`` or both (default); installed plug-ins'
    entry points included (a ``module:attr`` spec is accepted too)."""
    if kind not in (None, "vector", "data"):
        raise ConfigError("kind", kind, "'vector', 'data' or None")
    return [n for n in _REGISTRY.names() if kind is None or get_class(n).kind == kind]


def get_class(name: str) -> type[Attack] | type[DataAttack]:
    """The class of ``name`` (registered, ``module:attr`` or an entry point); a :class:`ConfigError` with
    close-match suggestions otherwise."""
    return _REGISTRY.get(name, "attack")


def user_attack(obj: Any, spec: str) -> type[Attack]:
    """A vector attack around a user's class that does not subclass :class:`Attack`: its constructor takes the
    attack's keyword parameters and its instances map an :class:`AttackContext` (the round's honest vectors
    ``ctx.honest``, ``ctx.n_byzantine``, ``ctx.f``, the server's rule ``ctx.aggregator``, the attack stream
    ``ctx.generator``) to the ``(b, d)`` Byzantine vectors. Optional class attributes: ``reference``, ``threat``,
    ``needs_aggregator``, ``stochastic`` (it draws from ``ctx.generator``), ``finite`` (False for one that sends
    NaN or ±Inf on purpose) and ``solo`` (True when it needs no honest vector but the worker's own)."""

    class UserAttack(Attack):
        name: ClassVar[str] = spec
        reference: ClassVar[str] = str(getattr(obj, "reference", f"user-defined attack {spec}"))
        threat: ClassVar[str] = str(getattr(obj, "threat", "omniscient: sees every honest vector of the round"))
        needs_aggregator: ClassVar[bool] = bool(getattr(obj, "needs_aggregator", False))
        stochastic: ClassVar[bool] = bool(getattr(obj, "stochastic", False))
        finite: ClassVar[bool] = bool(getattr(obj, "finite", True))
        solo = bool(getattr(obj, "solo", False))
        wraps: ClassVar[Any] = obj  # the user's own class or function (whose module says whose attack it is)

        def __init__(self, **params: Any) -> None:
            check_params(spec, obj, params)
            self._params = dict(params)
            try:
                self.inner = obj(**params)
            except TypeError as exc:  # not a class or function taking these parameters: a config error
                raise ConfigError("attack", spec, "a class whose constructor takes the attack's keyword parameters "
                                  f"({exc!r})") from None

        def params(self) -> dict[str, Any]:
            return dict(self._params)

        def _run(self, ctx: AttackContext) -> Tensor:
            out = self.inner(ctx)
            if not isinstance(out, Tensor) or tuple(out.shape) != (ctx.n_byzantine, ctx.dim):
                got = tuple(out.shape) if isinstance(out, Tensor) else type(out).__name__
                raise InputError(f"{spec}: output", got, f"a tensor of shape ({ctx.n_byzantine}, {ctx.dim})")
            return out

    UserAttack.__name__ = UserAttack.__qualname__ = f"UserAttack[{spec}]"
    UserAttack.__doc__ = getattr(obj, "__doc__", None)  # the user's description, for help and the listings
    try:  # the user's constructor's parameters, for the listings (the wrapper's own are ``**params``)
        UserAttack.__signature__ = inspect.signature(obj)  # type: ignore[attr-defined]
    except (TypeError, ValueError):
        pass
    return UserAttack


def make(name: str, **params: Any) -> Attack | DataAttack:
    """Build the attack ``name`` (registered, ``module:attr`` or an entry point) with its parameters.

    >>> from phalanx import attacks
    >>> attacks.make("alie", z=1.5)
    ALIE(z=1.5)

    Unknown names and unknown parameters raise :class:`ConfigError` (with suggestions / the accepted parameters);
    bad parameter values raise it from the attack's constructor, naming the parameter and its allowed range.
    """
    cls = get_class(name)
    if cls.__init__ is not object.__init__:
        check_params(cls.name, cls.__init__, params)
    elif params:
        raise ConfigError(f"{cls.name} parameter", sorted(params), f"parameters of {cls.name}: none")
    return cls(**params)
