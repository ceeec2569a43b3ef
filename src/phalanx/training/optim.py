"""Server optimizers: how the server turns the round's aggregate into a step of the model.

The aggregate ``a_t = Agg(v_1, …, v_n)`` is a (robust) estimate of the gradient — or, in federated rounds, of the
negative model update — and the server optimizer applies it: ``θ_{t+1} = step(θ_t, a_t, η_t)``. An optimizer
holds its own state (momentum buffers), exposed as ``state_dict()`` / ``load_state_dict()`` so that checkpoints
hold it and a resumed run continues exactly.

Optimizers are registered by name (:func:`make`, :func:`names`); a user's own is any object with ``step``,
``state_dict`` and ``load_state_dict`` (subclassing :class:`ServerOptimizer` adds validation and ``params``).

The server optimizer is the stage at the step (:mod:`phalanx.training.stages`): one per run, the experiment's
``optimizer``, with a stage's interface — its config section (the constructor, :meth:`ServerOptimizer.configure`),
one check against the run (:meth:`ServerOptimizer.check`), its state (checkpointed as ``optim.<key>``).
"""

from __future__ import annotations

import math
from abc import abstractmethod
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, TypeVar

import torch
from torch import Tensor

from phalanx.errors import ConfigError
from phalanx.online.reduction import DirectionMagnitude
from phalanx.online.robust import robust
from phalanx.plugins import Registry, check_params
from phalanx.training.stages.base import Plan, Stage
from phalanx.validate import Key, Section, check_int, check_real

__all__ = ["SGD", "Adam", "ClippedSGD", "RobustOnline", "ServerOptimizer", "build", "make", "names", "register"]

Opt = TypeVar("Opt")


class ServerOptimizer(Stage):
    """``θ_{t+1} = step(θ_t, a_t, η_t)`` with state that checkpoints hold (``optim.<key>``)."""

    name: ClassVar[str]
    state_prefix: ClassVar[str | None] = "optim."

    @classmethod
    def configure(cls, section: Mapping[str, Any], plan: Plan) -> ServerOptimizer:
        """The optimizer a config's section (its parameters) describes in ``plan``'s run: its constructor."""
        check_params(cls.name, cls, dict(section))
        return cls(**section)

    @abstractmethod
    def step(self, theta: Tensor, direction: Tensor, lr: float) -> Tensor:
        """The new parameters (a new tensor; ``theta`` is not modified) after stepping along ``direction``."""

    def state_dict(self) -> dict[str, Tensor]:
        """The optimizer's state as named tensors (empty when it has none)."""
        return {}

    def load_state_dict(self, state: Mapping[str, Tensor]) -> None:
        """Restore a state saved by :meth:`state_dict` (an empty dict: the fresh state)."""
        if state:
            raise ConfigError("optimizer state", sorted(state), f"no state ({self.name} keeps none)")


class SGD(ServerOptimizer):
    r"""Stochastic gradient descent with optional server momentum and weight decay.

    .. math:: d_t = a_t + \lambda\theta_t,\qquad u_t = \mu u_{t-1} + d_t\ (u_0 = d_0),\qquad
              \theta_{t+1} = \theta_t - \eta_t\,(d_t + \mu u_t \text{ if Nesterov else } u_t)

    — PyTorch's ``torch.optim.SGD`` convention (no dampening). With μ = λ = 0 it is the plain step
    :math:`\theta_{t+1} = \theta_t - \eta_t a_t` of distributed SGD. Server momentum over aggregated updates is
    FedAvgM (Hsu, Qi & Brown, "Measuring the effects of non-identical data distribution for federated visual
    classification", arXiv:1909.06335, 2019, §4); over aggregated gradients it is the server-side momentum that
    Karimireddy, He & Jaggi (ICML 2021, §4) contrast with worker momentum.
    """

    name: ClassVar[str] = "sgd"
    config_section: ClassVar[Section] = Section("server.optimizer", (
        Key("momentum", "server_momentum", float, 0.0, "server momentum μ: u ← μ u + Agg, θ ← θ − η u (0: plain "
            "θ ← θ − η Agg)", ge=0, lt=1),
        Key("weight_decay", "server_weight_decay", float, 0.0, "L2 penalty λ the server adds to the aggregate", ge=0),
    ), "the SGD server optimizer's flat keys")
    """Its parameters that flat keys of earlier releases set (``[server.optimizer] momentum`` is ``server_momentum``:
    the adapter, :data:`phalanx.experiments.legacy.SGD`), each with its type, default, range and description: the
    run config's fields are made from them and a config's values checked once against them
    (:func:`phalanx.experiments.declare.check`); the constructor's checks are the object's."""

    def __init__(self, momentum: float = 0.0, weight_decay: float = 0.0, nesterov: bool = False) -> None:
        self.momentum = check_real("momentum", momentum, low=0.0, high=1.0, high_open=True)
        self.weight_decay = check_real("weight_decay", weight_decay, low=0.0)
        if not isinstance(nesterov, bool):
            raise ConfigError("nesterov", nesterov, "true or false")
        if nesterov and self.momentum == 0:
            raise ConfigError("nesterov", nesterov, "false when momentum = 0 (Nesterov needs momentum)")
        self.nesterov = nesterov
        self.buffer: Tensor | None = None

    def params(self) -> dict[str, Any]:
        return {"momentum": self.momentum, "weight_decay": self.weight_decay, "nesterov": self.nesterov}

    def step(self, theta: Tensor, direction: Tensor, lr: float) -> Tensor:
        d = direction + self.weight_decay * theta if self.weight_decay else direction
        if self.momentum:
            if self.buffer is None:
                self.buffer = d.detach().clone()
            else:
                self.buffer.mul_(self.momentum).add_(d)
            d = d + self.momentum * self.buffer if self.nesterov else self.buffer
        return theta - lr * d

    def state_dict(self) -> dict[str, Tensor]:
        return {} if self.buffer is None else {"momentum_buffer": self.buffer.clone()}

    def load_state_dict(self, state: Mapping[str, Tensor]) -> None:
        unknown = set(state) - {"momentum_buffer"}
        if unknown:
            raise ConfigError("optimizer state", sorted(unknown), "momentum_buffer only (SGD)")
        buf = state.get("momentum_buffer")
        self.buffer = None if buf is None else buf.clone()


class Adam(ServerOptimizer):
    r"""Adam on the server, as FedAdam (Reddi et al., "Adaptive federated optimization", ICLR 2021, Algorithm 2):

    .. math:: m_t = \beta_1 m_{t-1} + (1-\beta_1) a_t,\qquad v_t = \beta_2 v_{t-1} + (1-\beta_2) a_t^2,\qquad
              \theta_{t+1} = \theta_t - \eta\, m_t / (\sqrt{v_t} + \tau)

    with :math:`a_t` the aggregate (for federated rounds the aggregated pseudo-gradient θ − θᵢ, so this is the
    paper's :math:`x_{t+1} = x_t + \eta\, m_t/(\sqrt{v_t}+\tau)` with :math:`\Delta_t = -a_t`), :math:`m_0 = v_0 = 0`,
    no bias correction (as in the paper), and the adaptivity :math:`\tau` (the paper searches 10⁻⁹ … 10⁻¹; default
    10⁻³). ``bias_correction=True`` gives PyTorch's Adam (Kingma & Ba 2015) with ε = τ.
    """

    name: ClassVar[str] = "adam"

    def __init__(
        self, beta1: float = 0.9, beta2: float = 0.99, tau: float = 1e-3, bias_correction: bool = False,
    ) -> None:
        self.beta1 = check_real("beta1", beta1, low=0.0, high=1.0, high_open=True)
        self.beta2 = check_real("beta2", beta2, low=0.0, high=1.0, high_open=True)
        self.tau = check_real("tau", tau, low=0.0, low_open=True)
        if not isinstance(bias_correction, bool):
            raise ConfigError("bias_correction", bias_correction, "true or false")
        self.bias_correction = bias_correction
        self.m: Tensor | None = None
        self.v: Tensor | None = None
        self.t = 0

    def params(self) -> dict[str, Any]:
        return {"beta1": self.beta1, "beta2": self.beta2, "tau": self.tau, "bias_correction": self.bias_correction}

    def step(self, theta: Tensor, direction: Tensor, lr: float) -> Tensor:
        if self.m is None or self.v is None:
            self.m, self.v = torch.zeros_like(direction), torch.zeros_like(direction)
        self.t += 1
        self.m.mul_(self.beta1).add_(direction, alpha=1 - self.beta1)
        self.v.mul_(self.beta2).addcmul_(direction, direction, value=1 - self.beta2)
        m, v = self.m, self.v
        if self.bias_correction:
            m = m / (1 - self.beta1**self.t)
            v = v / (1 - self.beta2**self.t)
        return theta - lr * m / (v.sqrt() + self.tau)

    def state_dict(self) -> dict[str, Tensor]:
        if self.m is None or self.v is None:
            return {}
        return {"m": self.m.clone(), "v": self.v.clone(), "step": torch.tensor([self.t], dtype=torch.float64)}

    def load_state_dict(self, state: Mapping[str, Tensor]) -> None:
        unknown = set(state) - {"m", "v", "step"}
        if unknown:
            raise ConfigError("optimizer state", sorted(unknown), "m, v and step (Adam)")
        if not state:
            self.m = self.v = None
            self.t = 0
            return
        self.m, self.v = state["m"].clone(), state["v"].clone()
        self.t = int(state["step"].reshape(-1)[0])


class ClippedSGD(SGD):
    r"""SGD on the aggregate clipped to norm G: the step of :class:`SGD` (momentum and weight decay included) taken
    along

    .. math:: \bar a_t = a_t\,\min\!\big(1,\ G/\|a_t\|\big),

    so a round moves θ by at most η·G (without momentum) however large the aggregate. Norm clipping of the update is
    Pascanu, Mikolov & Bengio ("On the difficulty of training recurrent neural networks", ICML 2013, §3.2); here it
    is the control a reviewer asks for beside ``robust-online``, which clips the aggregate to the same G before its
    learner sees it (docs/online.md, the corrupted-rounds study): what clipping alone buys.

    - ``clip`` (G > 0): the norm the aggregate is clipped to.
    - ``momentum``, ``weight_decay``, ``nesterov``: as :class:`SGD` (server momentum is taken after clipping).

    A Byzantine majority may make the aggregate anything: its norm and the scaling are computed in float64 (finite
    float32 entries never overflow them), and a non-finite aggregate (NaN, ±Inf) is skipped — the round steps as if
    the aggregate were 0 — as ``robust-online`` does. State: SGD's (the momentum buffer).
    """

    name: ClassVar[str] = "clipped-sgd"

    def __init__(self, clip: float = 1.0, momentum: float = 0.0, weight_decay: float = 0.0,
                 nesterov: bool = False) -> None:
        self.clip = check_real("clip", clip, low=0.0, low_open=True)
        super().__init__(momentum, weight_decay, nesterov)

    def params(self) -> dict[str, Any]:
        return {"clip": self.clip, **super().params()}

    def step(self, theta: Tensor, direction: Tensor, lr: float) -> Tensor:
        norm = float(torch.linalg.vector_norm(direction, dtype=torch.float64))
        if not math.isfinite(norm):
            clipped = torch.zeros_like(direction)
        elif norm > self.clip:  # scaled in float64: clip/norm may be below float32's normal range
            clipped = (direction.to(torch.float64) * (self.clip / norm)).to(direction.dtype)
        else:
            clipped = direction
        return super().step(theta, clipped, lr)


class RobustOnline(ServerOptimizer):
    r"""The corruption-robust online learner (Zhang & Cutkosky, "Unconstrained robust online convex optimization",
    ICML 2025; :func:`phalanx.online.robust.robust`, docs/online.md) as the server optimizer: a second line of
    defence *after* aggregation, for the rounds in which the aggregate itself is corrupted.

    The model is :math:`\theta_t = \theta_0 + w_t`, with :math:`w_t` the learner's point and the round's aggregate
    :math:`a_t` its gradient: ``step`` feeds :math:`a_t` (clipped to norm ≤ G; skipped when non-finite) and returns
    :math:`\theta_0 + w_{t+1}`. Its regret against every offset u, :math:`\sum_t\langle g_t, w_t - u\rangle` with
    the true gradients :math:`g_t`, is :math:`\tilde O(\|u\|G(\sqrt T + k))` when at most k aggregates were
    corrupted (the paper's budget) and every true gradient has norm ≤ G.

    - ``corruptions`` (k ≥ 0): the budget; k = 0 is the plain parameter-free learner (coin betting).
    - ``gradient_bound`` (G > 0): a bound on the norm of an honest aggregate. The paper's unknown-G variant
      (``"auto"``) is not built (docs/online.md says which piece is missing).
    - ``horizon`` (T): the number of rounds, which sets the regulariser's exponent p = ln T; the config fills it with
      ``rounds``.
    - ``lr``: the learner chooses its own steps (it is parameter-free), so the learning rate is not a step size: it
      is the learner's *scale* ε — its initial wealth, the size of its first moves in parameter units (its regret
      against u = 0 is at most about G·ε). It must stay constant (``schedule = "constant"``): a learning rate that
      changes between rounds has no meaning here and is refused.

    State (checkpointed): ``anchor`` (θ₀), ``epsilon`` and ``horizon`` (float64) and the learner's ``learner.*``
    (float64), so a resumed run continues bit for bit.
    """

    name: ClassVar[str] = "robust-online"

    def __init__(self, corruptions: int = 0, gradient_bound: float = 1.0, horizon: int = 1000) -> None:
        if isinstance(gradient_bound, str):
            raise ConfigError("gradient_bound", gradient_bound, "a number > 0 (the unknown-G variant, 'auto', is "
                              "not implemented: docs/online.md)")
        self.corruptions = check_int("corruptions", corruptions, low=0)
        self.gradient_bound = check_real("gradient_bound", gradient_bound, low=0.0, low_open=True)
        self.horizon = check_int("horizon", horizon, low=1)
        self.anchor: Tensor | None = None
        self.epsilon: float | None = None
        self.learner: DirectionMagnitude | None = None

    def params(self) -> dict[str, Any]:
        return {"corruptions": self.corruptions, "gradient_bound": self.gradient_bound, "horizon": self.horizon}

    @classmethod
    def configure(cls, section: Mapping[str, Any], plan: Plan) -> RobustOnline:
        """The horizon T defaults to the run's rounds."""
        opt = super().configure({"horizon": plan.rounds, **section}, plan)
        assert isinstance(opt, RobustOnline)
        return opt

    def check(self, plan: Plan) -> None:
        """A constant server step: the learning rate is the learner's scale ε, not a step size."""
        kind = getattr(plan.server_lr, "kind", "constant")
        if kind != "constant":
            raise ConfigError("schedule", kind, "'constant' with server_optimizer = 'robust-online' (lr is the "
                              "learner's scale, not a step size; docs/online.md)")

    def _build(self, anchor: Tensor, epsilon: float) -> DirectionMagnitude:
        return robust(anchor.numel(), self.gradient_bound, self.corruptions, self.horizon, epsilon)

    def step(self, theta: Tensor, direction: Tensor, lr: float) -> Tensor:
        if self.learner is None or self.anchor is None:
            eps = check_real("lr", lr, low=0.0, low_open=True)
            if direction.shape != theta.shape:
                raise ConfigError("gradient", tuple(direction.shape), f"the parameters' shape {tuple(theta.shape)}")
            learner = self._build(theta, eps)
            self.anchor, self.epsilon, self.learner = theta.detach().clone(), eps, learner
        elif lr != self.epsilon:
            raise ConfigError("lr", lr, f"{self.epsilon!r} in every round with server_optimizer = 'robust-online' (the "
                              "learner's scale ε, fixed at the first round: schedule = 'constant')")
        if direction.shape != self.anchor.shape:
            shape = tuple(self.anchor.shape)
            raise ConfigError("gradient", tuple(direction.shape), f"the parameters' shape {shape}")
        self.learner.update(direction.reshape(-1))
        w = self.learner.predict().to(device=self.anchor.device, dtype=self.anchor.dtype)
        return self.anchor + w.reshape(self.anchor.shape)

    def state_dict(self) -> dict[str, Tensor]:
        if self.learner is None or self.anchor is None or self.epsilon is None:
            return {}
        head = {"anchor": self.anchor.clone(), "epsilon": torch.tensor([self.epsilon], dtype=torch.float64),
                "horizon": torch.tensor([float(self.horizon)], dtype=torch.float64)}
        return {**head, **{f"learner.{k}": v for k, v in self.learner.state_dict().items()}}

    def load_state_dict(self, state: Mapping[str, Tensor]) -> None:
        if not state:
            self.anchor = self.epsilon = self.learner = None
            return
        unknown = {k for k in state if k not in ("anchor", "epsilon", "horizon") and not k.startswith("learner.")}
        if unknown or not {"anchor", "epsilon", "horizon"} <= set(state):
            raise ConfigError("optimizer state", sorted(state), "anchor, epsilon, horizon, learner.* (robust-online)")
        horizon = int(state["horizon"].reshape(-1)[0])
        if horizon != self.horizon:
            raise ConfigError("horizon", self.horizon, f"{horizon}, the horizon of the checkpoint's learner")
        anchor, eps = state["anchor"].clone(), float(state["epsilon"].reshape(-1)[0].to(torch.float64))
        learner = self._build(anchor, eps)
        learner.load_state_dict({k.removeprefix("learner."): v for k, v in state.items() if k.startswith("learner.")})
        self.anchor, self.epsilon, self.learner = anchor, eps, learner


def _accept(obj: Any, name: str) -> Any:
    if not callable(obj):
        raise ConfigError("server_optimizer", name, "a class whose instances have step, state_dict and load_state_dict")
    return obj


_REGISTRY: Registry[Any] = Registry("server_optimizer", "phalanx.optimizers", _accept)
_REGISTRY.register(SGD)
_REGISTRY.register(Adam)
_REGISTRY.register(ClippedSGD)
_REGISTRY.register(RobustOnline)


def register(cls: Opt) -> Opt:
    """Class decorator: make a server optimizer known to :func:`make` under ``cls.name`` (else its class name)."""
    _REGISTRY.register(cls)
    return cls


def names() -> list[str]:
    """Names :func:`make` accepts (a ``module:attr`` spec too)."""
    return _REGISTRY.names()


def make(name: str, **params: Any) -> ServerOptimizer:
    """Build a server optimizer by name (``"sgd"``, a registered name, a ``module:attr`` spec or an entry point) with
    its parameters."""
    cls = _REGISTRY.get(name, "server_optimizer")
    check_params(str(name), cls, params)
    opt: ServerOptimizer = cls(**params)
    return opt


def build(name: str, section: Mapping[str, Any], plan: Plan, name_of: Callable[[str], str] = str) -> Any:
    """The server optimizer a config names, with its section of parameters, in ``plan``'s run: a
    :class:`ServerOptimizer`'s :meth:`~ServerOptimizer.configure` and :meth:`~ServerOptimizer.check`; a plain class
    of one's own (``step``, ``state_dict``, ``load_state_dict``) from its constructor. An optimizer checks its own
    parameters (SGD's ``momentum``); ``name_of(p)`` is the config key of the section's parameter ``p``, which the
    errors of building it name (``server_momentum``: :func:`phalanx.experiments.legacy.optimizer`)."""
    cls = _REGISTRY.get(name, "server_optimizer")
    try:
        if isinstance(cls, type) and issubclass(cls, ServerOptimizer):
            opt = cls.configure(section, plan)
        else:
            check_params(str(name), cls, dict(section))
            return cls(**section)
    except ConfigError as exc:
        raise ConfigError(name_of(exc.parameter), exc.value, exc.allowed, exc.hint) from None
    opt.check(plan)
    return opt
