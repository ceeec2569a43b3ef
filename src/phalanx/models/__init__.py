"""Models for the simulated and distributed engines: ``logreg``, ``mlp``, ``cnn``, ``resnet20`` (GroupNorm), and
``char-lstm`` (LEAF's Shakespeare model, for character codes).

>>> import torch
>>> from phalanx import models
>>> net = models.make("cnn", input_shape=(1, 28, 28), num_classes=10, generator=torch.Generator().manual_seed(0))
>>> net(torch.zeros(2, 1, 28, 28)).shape
torch.Size([2, 10])

Every model is a pure function of its parameters and input — no BatchNorm, no in-place activations, no
data-dependent Python control flow — so ``torch.func.functional_call`` with ``vmap(grad(...))`` gives per-worker
gradients in one call. Initialisation is deterministic: from the ``generator`` passed to :func:`make`, else from
torch's global generator (``torch.manual_seed``). See docs/models.md.
"""

# Importing a module registers its models with make()/names().
from phalanx.models import resnet, simple, text  # noqa: F401
from phalanx.models.registry import (
    builder,
    count_parameters,
    initialise,
    make,
    names,
    planned_parameters,
    register,
)
from phalanx.models.resnet import ResNet20
from phalanx.models.simple import LeNetLike
from phalanx.models.text import CharLSTM

__all__ = [
    "CharLSTM", "LeNetLike", "ResNet20", "builder", "count_parameters", "initialise", "make", "names",
    "planned_parameters", "register",
]
