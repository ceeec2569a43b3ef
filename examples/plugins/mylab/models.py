# examples/plugins/mylab/models.py
"""A model of one's own: any function (input_shape, num_classes, **params) -> nn.Module."""

import math

import torch
from torch import nn


def tanh_mlp(input_shape: tuple[int, ...], num_classes: int, width: int = 32) -> nn.Module:
    """Flatten → Linear → Tanh → Linear, with Xavier-normal weights drawn here (the builder may draw and read
    tensors: Phalanx seeds torch's generator from the run's seed while it runs)."""
    inputs = math.prod(input_shape)
    model = nn.Sequential(nn.Flatten(), nn.Linear(inputs, width), nn.Tanh(), nn.Linear(width, num_classes))
    for layer in (model[1], model[3]):
        nn.init.xavier_normal_(layer.weight)
        nn.init.zeros_(layer.bias)
    assert torch.isfinite(model[1].weight).all()
    return model
