"""The two interfaces of the aggregation core: robust rules and pre-aggregators.

A *rule* maps a stacked float tensor ``x`` of shape ``(n, d)`` (one row per worker) to one vector of shape ``(d,)``.
A *pre-aggregator* maps ``(n, d)`` to ``(n', d)`` and can be put in front of any rule (``"nnm>cwtm"``).

Conventions shared by every component (docs/design.md, "Conventions"):

* ``f`` is the number of Byzantine rows the component is *configured* to tolerate. How many rows actually attack is
  not known to it.
* The input is never modified; the output has the input's device and dtype. The input is a float tensor
  (float16, bfloat16, float32 or float64) of shape ``(n, d)``, or what :func:`as_input` converts to one at the
  boundary: a NumPy array, or a list of n 1-D tensors or NumPy arrays. Any other type or dtype is an
  :class:`~phalanx.errors.InputError`; the output is always a tensor.
* A Byzantine row may hold anything (NaN, ±Inf, 1e38, denormals). With at most ``f`` such rows, every rule meant to
  tolerate ``f`` rows returns a finite vector. A *bad row* is a row whose squared norm is not finite (NaN, ±Inf,
  or so large that it overflows): such a row is infinitely far from every other row.
* Configuration errors raise :class:`phalanx.errors.ConfigError` at construction; a badly shaped input raises
  :class:`phalanx.errors.InputError` naming what was expected.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Any, ClassVar

import numpy as np
import torch
from torch import Tensor

from phalanx.aggregators._subnormals import denormals_are_zero
from phalanx.errors import ConfigError, InputError
from phalanx.plugins import Component
from phalanx.validate import check_int, check_real

__all__ = [
    "FLOAT_DTYPES", "Aggregator", "PreAggregator", "RuleTags", "as_input", "check_f", "check_input", "check_positive",
    "check_probability", "random_source", "worker_ids",
]


def check_f(f: Any) -> int:
    """Validate the configured number of Byzantine workers ``f`` (an int ≥ 0)."""
    if isinstance(f, bool) or not isinstance(f, int):
        raise ConfigError("f", f, "an integer >= 0")
    if f < 0:
        raise ConfigError("f", f, "an integer >= 0")
    return f


def check_positive(name: str, value: Any, *, integer: bool = False, allow_zero: bool = False) -> Any:
    """Validate a positive (or non-negative) scalar parameter and return it (:mod:`phalanx.validate`)."""
    if integer:
        return check_int(name, value, low=0 if allow_zero else 1)
    return check_real(name, value, low=0.0, low_open=not allow_zero)


def check_probability(name: str, value: Any, *, open_low: bool = True) -> float:
    """Validate a fraction in (0, 1] (or [0, 1] with ``open_low=False``)."""
    return check_real(name, value, low=0.0, low_open=open_low, high=1.0)


FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
"""The dtypes a component accepts; any other (integers, bool, complex, float8) is an :class:`InputError`."""
Rows = Tensor | np.ndarray | Sequence[Tensor] | Sequence[np.ndarray]
"""What a component's call accepts (:func:`as_input`)."""
_ACCEPTED = "a torch.Tensor or NumPy array of shape (n, d), or a list of n 1-D tensors or NumPy arrays of length d"


def _from_numpy(a: np.ndarray, who: str) -> Tensor:
    """A tensor on the array's data (no copy when the array is contiguous, writable and in native byte order)."""
    b = np.ascontiguousarray(a)
    if not b.dtype.isnative:
        b = b.astype(b.dtype.newbyteorder("="))
    if not b.flags.writeable:  # torch.from_numpy warns on read-only memory; the components never write anyway
        b = b.copy()
    try:
        return torch.from_numpy(b)
    except TypeError:  # object, string, long double, ... arrays
        raise InputError(f"{who}: x", f"a NumPy array of dtype {a.dtype}", "a floating-point dtype "
                         "(float16/32/64)") from None


def _stack(rows: list[Any] | tuple[Any, ...], who: str) -> Tensor:
    """A list (or tuple) of ``n`` 1-D rows of one length, dtype and device — all tensors or all NumPy arrays —
    stacked into ``(n, d)``."""
    kind = {type(r).__name__ for r in rows}
    if not rows or not (all(isinstance(r, Tensor) for r in rows) or all(isinstance(r, np.ndarray) for r in rows)):
        what = f"a {type(rows).__name__} of {', '.join(sorted(kind))}" if rows else f"an empty {type(rows).__name__}"
        raise InputError(f"{who}: x", what, _ACCEPTED)
    shapes = sorted({tuple(r.shape) for r in rows})
    if len(shapes) != 1 or len(shapes[0]) != 1:
        raise InputError(f"{who}: x", f"rows of shapes {', '.join(map(str, shapes[:4]))}",
                         "rows that are 1-D and of one length d")
    dtypes = sorted({str(r.dtype) for r in rows})
    if len(dtypes) != 1:
        raise InputError(f"{who}: x", f"rows of dtypes {', '.join(dtypes)}", "rows of one dtype")
    if isinstance(rows[0], np.ndarray):
        return _from_numpy(np.stack(rows), who)
    devices = sorted({str(r.device) for r in rows})
    if len(devices) != 1:
        raise InputError(f"{who}: x", f"rows on devices {', '.join(devices)}", "rows on one device")
    return torch.stack(list(rows))


def as_input(x: Any, who: str) -> Tensor:
    """``x`` as a tensor: a tensor as it is, a NumPy array as a tensor on its data, a list or tuple of 1-D rows
    (tensors, or NumPy arrays) stacked — converted once, here, at the boundary; anything else an
    :class:`InputError`."""
    if isinstance(x, Tensor):
        return x
    if isinstance(x, np.ndarray):
        return _from_numpy(x, who)
    if isinstance(x, (list, tuple)):
        return _stack(x, who)
    raise InputError(f"{who}: x", type(x).__name__, _ACCEPTED)


def check_input(x: Any, who: str) -> Tensor:
    """``x`` (see :func:`as_input`) as a non-empty tensor of shape ``(n, d)`` and one of :data:`FLOAT_DTYPES`."""
    x = as_input(x, who)
    if x.ndim != 2:
        raise InputError(f"{who}: x", f"a tensor of shape {tuple(x.shape)}", "a 2-D tensor of shape (n, d)")
    if x.shape[0] == 0 or x.shape[1] == 0:
        raise InputError(f"{who}: x", f"a tensor of shape {tuple(x.shape)}", "n >= 1 rows and d >= 1 columns")
    if x.dtype not in FLOAT_DTYPES:
        raise InputError(f"{who}: x", f"dtype {x.dtype}", "a floating-point dtype (float16/bfloat16/32/64)")
    return x


def random_source(context: dict[str, Any], own: torch.Generator) -> torch.Generator:
    """The generator a stochastic component draws from in one call: ``context["generator"]`` when the caller passes
    one (a training run passes its server's stream, which its checkpoints hold, so a resumed run draws what an
    uninterrupted one would), else the component's own seeded generator (a stand-alone sequence of calls)."""
    gen = context.get("generator")
    if gen is None:
        return own
    if not isinstance(gen, torch.Generator):
        raise ConfigError("generator", type(gen).__name__, "a torch.Generator or None")
    return gen


def worker_ids(context: Mapping[str, Any], n: int, who: str) -> Tensor:
    """The worker of each of the ``n`` rows, an ``(n,)`` int64 CPU tensor: ``context["ids"]`` when the caller passes
    it (a training run passes the round's workers: the sampled clients of a federated round), else ``0 … n−1``.
    They are the server's own knowledge, not a worker's, so ids that are not ``n`` distinct integers ≥ 0 are a
    :class:`~phalanx.errors.ConfigError`."""
    ids = context.get("ids")
    if ids is None:
        return torch.arange(n)
    allowed = f"{n} distinct integers >= 0 (the worker of each row), as a 1-D tensor or a list"
    if isinstance(ids, (list, tuple, np.ndarray)):
        ids = torch.as_tensor(np.asarray(ids))
    if not isinstance(ids, Tensor) or ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
        raise ConfigError(f"{who}: ids", type(ids).__name__ if not isinstance(ids, Tensor) else str(ids.dtype),
                          allowed)
    ids = ids.detach().to(device="cpu", dtype=torch.int64)
    if ids.shape != (n,) or (n and int(ids.min()) < 0) or int(torch.unique(ids).numel()) != n:
        raise ConfigError(f"{who}: ids", ids.tolist()[:8], allowed)
    return ids


CLAIMS = ("permutation", "translation", "scale", "identical", "robust")
"""The properties a :class:`RuleTags` claims or not, in the order tables show them."""


@dataclass(frozen=True)
class RuleTags:
    """What a rule declares about itself: the symmetries it has, whether it survives garbage rows, the tolerance they
    hold to and the parameters they are checked with — data on the class, read through one function.

    A rule declares them once, as a class attribute (``tags = RuleTags(translation=False)``); anything not named
    keeps its default. :func:`phalanx.aggregators.get_tags` reads them (from a rule, a class, a name or a spec), and
    the property checks — :func:`phalanx.testing.check_aggregator` and ``tests/test_properties.py`` — test every
    claim of every registered rule, a user's plug-in included, with no list to edit. The defaults are the full
    contract of the conventions above, so a rule that declares nothing is held to all of it; a rule that lacks a
    property by design switches it off. ``False`` claims nothing (the property is not checked), it does not assert
    that the property fails. The smallest n is not a tag: it is the rule's own :meth:`~_Component.min_workers`,
    which the rule enforces on every call.

    On a pre-aggregator the tags say what a chain through it keeps of the rule after it (bucketing's random buckets
    do not keep permutation invariance, clipping's fixed radius not translation or scale equivariance); a chain
    claims what all its elements claim (:meth:`all_of`).
    """

    permutation: bool = True
    """Invariant to the order of the rows: ``Agg(x[π]) = Agg(x)``."""
    translation: bool = True
    """Translation equivariant: ``Agg(x + c) = Agg(x) + c``."""
    scale: bool = True
    """Scale equivariant: ``Agg(a·x) = a·Agg(x)`` for ``a > 0``."""
    identical: bool = True
    """``n`` identical rows give that row."""
    robust: bool = True
    """A finite output with up to ``f`` garbage rows (NaN, ±Inf, ±1e38, denormals; whole rows or single entries);
    ``False`` only for a rule that tolerates no Byzantine row (the mean)."""
    tol: float = 1e-5
    """The absolute and relative tolerance to which the symmetries hold (built with ``check_params``): rounding for
    a rule in closed form, the accuracy an iterative solver reaches for one that is not."""
    check_params: Mapping[str, Any] = field(default_factory=dict, hash=False)
    """Constructor parameters the checks build the rule with (default: none, its defaults): a configuration that
    exercises it (centered clipping's radius at the scale of unit rows) or reaches ``tol`` (a tighter solver)."""

    def __post_init__(self) -> None:
        for name in CLAIMS:
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"RuleTags.{name}", getattr(self, name), "True or False")
        check_real("RuleTags.tol", self.tol, low=0.0, low_open=True)
        params = self.check_params
        if not isinstance(params, Mapping) or not all(isinstance(k, str) for k in params):
            raise ConfigError("RuleTags.check_params", params, "a mapping of constructor parameter names to values")
        object.__setattr__(self, "check_params", MappingProxyType(dict(params)))  # frozen, like the rest

    def __reduce__(self) -> tuple[Any, ...]:
        # A read-only mapping does not pickle; a chain (which holds its own tags) is pickled and deep-copied.
        values = [getattr(self, f.name) for f in fields(self)]
        return (RuleTags, tuple(dict(v) if isinstance(v, MappingProxyType) else v for v in values))

    def claims(self) -> dict[str, bool]:
        """The properties claimed or not, by name (:data:`CLAIMS`), for tables and checks."""
        return {name: getattr(self, name) for name in CLAIMS}

    @staticmethod
    def all_of(parts: Iterable[RuleTags]) -> RuleTags:
        """What a composition claims: each property that every part claims, to the loosest of their tolerances,
        built as given (no ``check_params``)."""
        parts = list(parts)
        if not parts:
            raise ConfigError("parts", parts, "at least one RuleTags")
        claims: dict[str, Any] = {name: all(getattr(p, name) for p in parts) for name in CLAIMS}
        return RuleTags(**claims, tol=max(p.tol for p in parts))


class _Component(Component, ABC):
    """What rules and pre-aggregators share: a name, a reference, ``f`` and the requirement on ``n``."""

    requirement: str = "n >= 1"
    """The requirement on n and f, as text (``min_workers`` is the same as a number)."""
    context_keys: frozenset[str] = frozenset()
    """Per-call keyword arguments this component accepts (for example ``reference`` for FLTrust)."""
    pairwise_matrices: int = 0
    """How many ``(n, n)`` float64 matrices (pairwise distances, a Gram matrix) its peak memory holds; 0 when it
    builds none. Memory estimates (``phalanx epsilon``) read it (measured: the Gram product, its symmetrised copy,
    the distances and the sort of a row, about 4.2–5 for most distance-based rules)."""
    floor: str = "pass"
    """The least work its definition needs on an ``(n, d)`` input, which ``make bench`` times beside it (its ``×
    floor``, benchmarks/_bench_floors.py): ``"pass"`` (one streaming pass, the default), ``"copy"`` (a fresh
    ``(n, d)`` output), ``"passes"`` (one pass per iteration) or ``"gemm"`` (the Gram matrix, for a rule defined on
    every pairwise distance). Declared here, on the class, so that a new rule is its one file."""
    tags: RuleTags = RuleTags()
    """What it claims (:class:`RuleTags`; read with :func:`phalanx.aggregators.get_tags`): the full contract unless
    the class says otherwise."""
    subnormals_as_zero: bool = False
    """On the CPU, run the arithmetic with flush-to-zero: every value below the dtype's smallest normal counts as 0
    (:mod:`phalanx.aggregators._subnormals`). Set by the components whose products over Byzantine rows of subnormal
    or near-subnormal values ran tens of times slower."""

    def __init__(self, f: int = 0) -> None:
        self.f = check_f(f)

    def _arithmetic(self, x: Tensor) -> AbstractContextManager[None]:
        """Where :meth:`_run` computes: with flush-to-zero on the CPU for a component that sets
        :attr:`subnormals_as_zero`, as it is otherwise."""
        return denormals_are_zero(x) if self.subnormals_as_zero else nullcontext()

    def min_workers(self) -> int:
        """Smallest number of input rows for which the component is defined with this ``f``."""
        return 1

    def _check_rows(self, n: int) -> None:
        need = self.min_workers()
        if n < need:
            raise ConfigError(
                "n", n, f"n >= {need} for {self.name} with f={self.f} ({self.requirement})",
            )

    def _check_context(self, context: dict[str, Any]) -> None:
        unknown = set(context) - self.context_keys
        if unknown:
            allowed = ", ".join(sorted(self.context_keys)) or "none"
            raise ConfigError("context", sorted(unknown), f"keyword arguments accepted by {self.name}: {allowed}")

    def with_f(self, f: int) -> Any:
        """The same component configured for another ``f`` (every other parameter kept): a server that counts m
        missing workers against f aggregates with ``rule.with_f(f − m)``. Rebuilt from :meth:`params`, so a
        subclass whose constructor takes other arguments than ``params()`` lists overrides it."""
        return type(self)(**{**self.params(), "f": check_f(f)})

    def describe(self, n: int | None = None) -> dict[str, Any]:
        """Metadata for tables: name, kind, reference, requirement, parameters, and the declared tags (the claimed
        properties and their tolerance)."""
        return {
            "name": self.name, "kind": "pre" if isinstance(self, PreAggregator) else "rule",
            "reference": self.reference, "requirement": self.requirement, "params": self.params(),
            "tags": {**self.tags.claims(), "tol": self.tags.tol},
        }

class Aggregator(_Component):
    """A robust aggregation rule: ``(n, d) -> (d,)``.

    Subclasses implement :meth:`_run`, which returns the output and, when asked, each row's contribution.

    A rule that keeps state across rounds (FoolsGold's per-client history) declares ``stateful = True`` and
    implements :meth:`state_dict` and :meth:`load_state_dict`. Its contract, which the server and the checkpoints
    rely on:

    * every call (``rule(x)``, ``aggregate``, ``contributions``) is one round: it reads the state, computes and
      *replaces* the state by new tensors — it never changes a tensor that :meth:`state_dict` handed out, so a
      state taken before a call is still the state before the call (a checkpoint being written, an attacker's
      call that must not move the server's state: :class:`~phalanx.training.server.BoundRule`);
    * ``load_state_dict({})`` resets it to the state before the first round; ``load_state_dict(rule.state_dict())``
      makes a rule continue exactly where ``rule`` is;
    * rows belong to workers: a rule that keeps something per worker declares the context key ``ids`` and reads
      ``ids`` (an ``(n,)`` integer tensor: the worker of each row; the rows ``0 … n−1`` when not given). A training
      run passes it every round (:class:`~phalanx.training.server.Server`: the sampled clients of a federated
      round) and saves the state in its checkpoint under ``rule.<key>``, so a resumed run equals an uninterrupted
      one bit for bit.
    """

    stateful: bool = False
    """Whether the rule keeps state across calls (rounds); see the class docstring for the contract."""
    epsilon_source: ClassVar[str] = ""
    """The paper and statement that prove :meth:`epsilon` (empty where it returns None: nothing proven)."""
    kappa_source: ClassVar[str] = ""
    """The paper and statement that prove :meth:`kappa` (empty where it returns None)."""

    def state_dict(self) -> dict[str, Tensor]:
        """The rule's state across rounds, as named tensors (a checkpoint saves them as ``rule.<name>``); empty for
        a stateless rule. The tensors are the rule's own (not copies): a later call replaces them, never changes
        them."""
        return {}

    def load_state_dict(self, state: Mapping[str, Tensor]) -> None:
        """Continue from ``state`` (:meth:`state_dict` of this rule or of one configured alike); ``{}`` resets. A
        stateless rule accepts only ``{}``."""
        if state:
            raise ConfigError(f"{self.name}: state", sorted(state), "no state (the rule keeps none across rounds)")

    @abstractmethod
    def _run(self, x: Tensor, want_contributions: bool, **context: Any) -> tuple[Tensor, Tensor | None]:
        """Aggregate a validated input; return ``(output (d,), contributions (n,) or None)``."""

    def __call__(self, x: Rows, **context: Any) -> Tensor:
        """Aggregate the rows of ``x`` (shape ``(n, d)``; see :func:`as_input`) into one vector of shape ``(d,)``."""
        x = self._prepare(x, context)
        with self._arithmetic(x):
            return self._run(x, False, **context)[0]

    def aggregate(self, x: Rows, **context: Any) -> tuple[Tensor, Tensor]:
        """Aggregate and report who was trusted: return ``(output (d,), contributions (n,))``."""
        x = self._prepare(x, context)
        with self._arithmetic(x):
            out, contrib = self._run(x, True, **context)
        assert contrib is not None
        return out, contrib

    def contributions(self, x: Rows, **context: Any) -> Tensor:
        """Each input row's share of the output, an ``(n,)`` float64 tensor on the input's device.

        Selection rules give their exact weights (Krum: 1 for the chosen row); coordinate-wise rules give the share
        of coordinates at which the row was kept (weighted by its weight in that coordinate's average). The shares
        are non-negative and add up to 1 for rules whose output is a convex combination of the inputs; rules whose
        output also draws on something else (centered clipping's centre, FLTrust's rescaling) document their sum.
        """
        return self.aggregate(x, **context)[1]

    def _prepare(self, x: Rows, context: dict[str, Any]) -> Tensor:
        x = check_input(x, self.name)
        self._check_rows(x.shape[0])
        self._check_context(context)
        return x

    def epsilon(self, n: int) -> float | None:
        """The **proven** no-attack aggregation error factor ε (Yang, Shi & Li, ICML 2025, Definition 2.2) — exact,
        or a proven upper bound that :attr:`epsilon_source` says is tight where it is — or ``None`` when nothing is
        proven (``phalanx.analysis.epsilon`` then measures a lower bound).

        ε is the smallest constant with ``‖Agg(x) − mean(x)‖² ≤ ε · (1/n) Σᵢ ‖xᵢ − mean(x)‖²`` for all inputs.
        """
        return None

    def kappa(self, n: int) -> float | None:
        """The proven (f, κ)-robustness coefficient (Allouah et al., AISTATS 2023), or ``None`` when not known."""
        return None

    def describe(self, n: int | None = None) -> dict[str, Any]:
        """Metadata for tables: name, reference, requirement, and (given ``n``) ε and κ with the statements that
        prove them."""
        info = super().describe(n)
        if n is not None:
            info["epsilon"] = self.epsilon(n)
            info["kappa"] = self.kappa(n)
            info["epsilon_source"] = self.epsilon_source if info["epsilon"] is not None else ""
            info["kappa_source"] = self.kappa_source if info["kappa"] is not None else ""
        return info


class PreAggregator(_Component):
    """A pre-aggregator: ``(n, d) -> (n', d)``, placed in front of a rule.

    :meth:`mix` also returns the provenance matrix ``M`` of shape ``(n', n)``: row ``i`` of the output was built from
    input row ``j`` with share ``M[i, j]`` (rows of ``M`` add up to 1). Mixing rules (NNM, bucketing) have
    ``y = M x``; scaling rules (clipping) have ``M = I``. It lets a chain report which *inputs* the final rule
    trusted.
    """

    @abstractmethod
    def _run(self, x: Tensor, **context: Any) -> tuple[Tensor, Tensor]:
        """Transform a validated input; return ``(y (n', d), M (n', n) float64)``."""

    def output_rows(self, n: int) -> int:
        """Number of rows ``n'`` produced from ``n`` input rows."""
        return n

    def __call__(self, x: Rows, **context: Any) -> Tensor:
        """Transform ``x`` (shape ``(n, d)``) into ``(n', d)``."""
        return self.mix(x, **context)[0]

    def mix(self, x: Rows, **context: Any) -> tuple[Tensor, Tensor]:
        """Return ``(y, M)``: the transformed rows and their provenance matrix. ``x`` is never modified."""
        x = check_input(x, self.name)
        self._check_rows(x.shape[0])
        self._check_context(context)
        with self._arithmetic(x):
            return self._run(x, **context)

    def mix_(self, x: Tensor, **context: Any) -> tuple[Tensor, Tensor]:
        """:meth:`mix` for a caller that owns ``x`` and gives it up: the values of ``x`` may be overwritten (``y`` may
        be ``x`` itself), so ``x`` must not be read afterwards. The same ``(y, M)`` as :meth:`mix` (bit for bit:
        ``_rowops.scale_rows_``).

        Scaling rules (``clip``, ``arc``) then scale ``x`` in place (on one CPU thread only the rows they clip)
        instead of writing a fresh ``(n, d)`` output; every other pre-aggregator returns what :meth:`mix` does. Only
        a caller that created ``x`` may call it: :class:`~phalanx.aggregators.chain.Chain` does for the rows a
        previous element made, never for its own caller's (``tests/test_inplace_pre.py``).
        """
        x = check_input(x, self.name)
        self._check_rows(x.shape[0])
        self._check_context(context)
        with self._arithmetic(x):
            if torch.is_grad_enabled() and x.requires_grad:
                return self._run(x, **context)  # autograd forbids overwriting a tensor it needs
            return self._run_(x, **context)

    def _run_(self, x: Tensor, **context: Any) -> tuple[Tensor, Tensor]:
        """:meth:`_run` allowed to overwrite ``x`` (see :meth:`mix_`); by default :meth:`_run` itself."""
        return self._run(x, **context)


def as_compute_dtype(x: Tensor) -> Tensor:
    """Half-precision inputs are computed in float32 (results are cast back by the caller)."""
    if x.dtype in (torch.float16, torch.bfloat16):
        return x.float()
    return x
