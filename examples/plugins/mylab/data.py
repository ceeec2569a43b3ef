# examples/plugins/mylab/data.py
"""A data set of one's own: a function that returns (train_x, train_y, test_x, test_y) or a phalanx Dataset."""

import torch


def blobs(root: str | None = None, classes: int = 4, dim: int = 10, per_class: int = 150):
    """Gaussian blobs: `classes` centres in `dim` dimensions, `per_class` training and 50 test points each,
    always the same (a fixed seed). `root` is where a real loader would look for its files."""
    gen = torch.Generator().manual_seed(0)
    centres = 1.2 * torch.randn(classes, dim, generator=gen)

    def draw(count: int) -> tuple[torch.Tensor, torch.Tensor]:
        y = torch.arange(classes).repeat_interleave(count)
        return centres[y] + torch.randn(len(y), dim, generator=gen), y

    train_x, train_y = draw(per_class)
    test_x, test_y = draw(50)
    return train_x, train_y, test_x, test_y
