"""Rules with a C kernel on inputs whose memory does not hold their values as read (``_rowops.kernel_readable``).

``z.conj().imag`` of a complex tensor is a real view of negated memory (``is_neg()``): a kernel that reads the data
pointer raw sees the values with the wrong sign (the coordinate-wise kernel did, for ``cwmed``, ``cwtm`` and
``meamed``). Each rule must give on such a view exactly what it gives on the same values resolved.
"""

from __future__ import annotations

import pytest
import torch

from phalanx.aggregators import make


@pytest.mark.parametrize("name", ["mean", "cwmed", "cwtm", "meamed", "cge", "signguard", "clip>cwtm"])
def test_a_negative_bit_view_gives_what_its_values_give(name: str) -> None:
    g = torch.Generator().manual_seed(0)
    values = torch.randn(9, 5000, generator=g) + 3.0  # away from 0, so a lost sign shows everywhere
    view = torch._neg_view(values)
    assert view.is_neg()
    f = 0 if name == "mean" else 2
    assert torch.equal(make(name, f=f)(view), make(name, f=f)(view.resolve_neg()))


def test_the_public_route_to_a_negative_view_is_read_with_its_sign() -> None:
    z = torch.complex(torch.randn(7, 3000), torch.randn(7, 3000) + 5.0)
    x = z.conj().imag
    assert x.is_neg()
    assert torch.equal(make("cwmed", f=2)(x), make("cwmed", f=2)(x.resolve_neg()))
