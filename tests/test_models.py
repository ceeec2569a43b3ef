"""phalanx.models: shapes, sizes, seeded initialisation, per-worker gradients with torch.func, errors."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad, vmap

from phalanx import models
from phalanx.errors import ConfigError

SHAPES = [(1, 8, 8), (1, 28, 28), (3, 32, 32)]


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    """Small convolutions: one thread is fastest here, and immune to thread contention on a busy machine (with 2
    threads and other processes on the 2 cores, the ResNet gradient checks took 30× longer)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_names() -> None:
    assert models.names() == ["char-lstm", "cnn", "logreg", "mlp", "resnet20"]


@pytest.mark.parametrize("name", ["logreg", "mlp", "cnn", "resnet20"])
@pytest.mark.parametrize("shape", SHAPES)
def test_forward_shapes_and_no_batchnorm(name: str, shape: tuple[int, ...]) -> None:
    model = models.make(name, shape, 7, generator=gen(0))
    out = model(torch.randn(3, *shape, generator=gen(1)))
    assert out.shape == (3, 7) and out.dtype == torch.float32 and torch.isfinite(out).all()
    assert model.training
    assert not list(model.buffers())  # nothing stateful: pure function of (params, input)
    assert not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())
    assert not any(getattr(m, "inplace", False) for m in model.modules())


def test_parameter_counts() -> None:
    count = models.count_parameters
    assert count(models.make("logreg", (1, 8, 8), 10)) == 64 * 10 + 10
    assert count(models.make("mlp", (1, 8, 8), 10)) == 64 * 64 + 64 + 64 * 10 + 10  # default hidden (64,)
    assert count(models.make("mlp", (1, 28, 28), 10, hidden=(100,))) == 784 * 100 + 100 + 100 * 10 + 10
    assert count(models.make("mlp", (4,), 3, hidden=())) == 4 * 3 + 3
    # He et al.'s CIFAR ResNet-20 (option A shortcuts): 0.27M; GroupNorm has BatchNorm's 2 parameters per channel.
    assert count(models.make("resnet20", (3, 32, 32), 10)) == 269_722
    assert count(models.make("cnn", (1, 28, 28), 10)) == (
        (1 * 25 * 16 + 16) + (16 * 25 * 32 + 32) + (32 * 7 * 7 * 128 + 128) + (128 * 10 + 10)
    )
    m = models.make("logreg", (2,), 2)
    m[1].bias.requires_grad_(False)
    assert count(m) == 4 and count(m, trainable_only=False) == 6


def test_resnet20_structure_and_groups() -> None:
    m = models.make("resnet20", (3, 32, 32), 10, groups=4)
    norms = [mod for mod in m.modules() if isinstance(mod, nn.GroupNorm)]
    assert len(norms) == 19 and all(n.num_groups == 4 for n in norms)
    convs = [mod for mod in m.modules() if isinstance(mod, nn.Conv2d)]
    assert len(convs) == 19 and sum(isinstance(mod, nn.Linear) for mod in m.modules()) == 1  # 6·3 + 2 = 20 layers
    assert models.make("resnet20", (3, 32, 32), 10).blocks[0].norm1.num_groups == 2  # the default


@pytest.mark.parametrize("name", ["logreg", "mlp", "cnn", "resnet20"])
def test_seeded_init(name: str) -> None:
    shape = (3, 32, 32)
    torch.manual_seed(11)
    a = models.make(name, shape, 10)
    b = models.make(name, shape, 10, generator=gen(11))
    c = models.make(name, shape, 10, generator=gen(12))
    pa, pb, pc = (list(m.parameters()) for m in (a, b, c))
    assert all(torch.equal(x, y) for x, y in zip(pa, pb))
    assert any(not torch.equal(x, y) for x, y in zip(pa, pc))
    # With a generator, the global generator is not touched.
    torch.manual_seed(5)
    before = torch.get_rng_state()
    models.make(name, shape, 10, generator=gen(1))
    assert torch.equal(before, torch.get_rng_state())


def test_init_distributions() -> None:
    m = models.make("resnet20", (3, 32, 32), 10, generator=gen(0))
    w = m.blocks[8].conv2.weight  # 64·64·9 weights, N(0, 2/fan_in)
    assert w.std().item() == pytest.approx((2 / (64 * 9)) ** 0.5, rel=0.05)
    assert m.blocks[8].conv2.bias is None
    assert torch.equal(m.norm.weight, torch.ones(16)) and torch.equal(m.norm.bias, torch.zeros(16))
    lin = models.make("logreg", (1, 28, 28), 10, generator=gen(0))[1]
    bound = 1 / 784**0.5
    assert lin.weight.abs().max() <= bound and lin.weight.abs().max() > 0.9 * bound
    assert lin.bias.abs().max() <= bound


@pytest.mark.parametrize(
    "name, shape",
    [(n, (1, 8, 8)) for n in ("logreg", "mlp", "cnn", "resnet20")]
    + [(n, (3, 32, 32)) for n in ("logreg", "mlp", "cnn", "resnet20")],
)
def test_vmap_per_worker_gradients_match_a_loop(name: str, shape: tuple[int, ...]) -> None:
    # float64: the three ways of computing the same gradient sum in different orders; in float32 a ResNet-20's
    # gradients differ between them by up to ~1e-4 (measured: 25 % of a conv's entries beyond 1e-6), an artefact of
    # the dtype, not of the batching. In float64 they agree to ~1e-12 (tolerance 1e-9 leaves a wide margin).
    model = models.make(name, shape, 10, generator=gen(0)).double()
    params = {k: v.detach() for k, v in model.named_parameters()}
    workers, batch = 4, 3
    x = torch.randn(workers, batch, *shape, generator=gen(1), dtype=torch.float64)
    y = torch.randint(0, 10, (workers, batch), generator=gen(2))

    def loss(p: dict[str, torch.Tensor], xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(functional_call(model, p, (xb,)), yb)

    batched = vmap(grad(loss), in_dims=(None, 0, 0))(params, x, y)
    for w in range(workers):
        model.zero_grad()
        F.cross_entropy(model(x[w]), y[w]).backward()  # plain autograd, one worker at a time
        for k, p in model.named_parameters():
            assert p.grad is not None
            torch.testing.assert_close(batched[k][w], p.grad, atol=1e-9, rtol=1e-7)
    # And with per-worker parameters (each worker its own model copy), as the engines hold them:
    stacked = {k: v.expand(workers, *v.shape).clone() for k, v in params.items()}
    per_model = vmap(grad(loss), in_dims=(0, 0, 0))(stacked, x, y)
    for k in params:
        torch.testing.assert_close(per_model[k], batched[k], atol=1e-9, rtol=1e-7)


@pytest.mark.parametrize(
    "args, kwargs, match",
    [
        (("mpl", (1, 8, 8), 10), {}, "did you mean mlp"),
        (("mlp", (1, 8, 8), 1), {}, "num_classes"),
        (("mlp", (), 10), {}, "input_shape"),
        (("mlp", (1, 0, 8), 10), {}, "input_shape"),
        (("mlp", (1, 8, 8), 10), {"hidden": (64, 0)}, "hidden"),
        (("mlp", (1, 8, 8), 10), {"depth": 3}, "parameters of mlp: hidden"),
        (("cnn", (64,), 10), {}, r"\(C, H, W\)"),
        (("cnn", (1, 3, 3), 10), {}, "at least 4×4"),
        (("cnn", (1, 8, 8), 10), {"kernel_size": 4}, "odd"),
        (("cnn", (1, 8, 8), 10), {"hidden": (3, 4)}, "hidden"),
        (("resnet20", (1, 8, 8), 10), {"groups": 3}, "divisor of 16"),
        (("resnet20", (8, 8), 10), {}, r"\(C, H, W\)"),
        (("logreg", (1, 8, 8), 10), {"generator": 3}, "generator"),
    ],
)
def test_errors(args: tuple, kwargs: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        models.make(*args, **kwargs)


def test_initialise_refuses_unknown_layers() -> None:
    with pytest.raises(TypeError, match="PReLU"):
        models.initialise(nn.Sequential(nn.Linear(2, 2), nn.PReLU()))


def test_char_lstm_is_leafs_shakespeare_model_and_vmap_safe() -> None:
    """char-lstm: LEAF's size (8-dim embedding, 2 × 256 LSTM units, 81 codes), seeded, and per-worker gradients
    under vmap equal to plain autograd on character-code inputs (stored as float32 codes, as the loaders do)."""
    lstm_params = 4 * 256 * (8 + 256 + 1) + 4 * 256 * (256 + 256 + 1)
    assert models.count_parameters(models.make("char-lstm", (80,), 81)) == 81 * 8 + lstm_params + 256 * 81 + 81
    a = models.make("char-lstm", (10,), 81, generator=gen(3), hidden=6)
    b = models.make("char-lstm", (10,), 81, generator=gen(3), hidden=6)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))
    assert not list(a.buffers())
    model = models.make("char-lstm", (10,), 81, generator=gen(0), hidden=6, embedding=4).double()
    params = {k: v.detach() for k, v in model.named_parameters()}
    workers, batch = 3, 4
    x = torch.randint(0, 81, (workers, batch, 10), generator=gen(1)).to(torch.float64)
    y = torch.randint(0, 81, (workers, batch), generator=gen(2))

    def loss(p: dict[str, torch.Tensor], xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(functional_call(model, p, (xb,)), yb)

    batched = vmap(grad(loss), in_dims=(None, 0, 0))(params, x, y)
    stacked = {k: v.expand(workers, *v.shape).clone() for k, v in params.items()}
    per_model = vmap(grad(loss), in_dims=(0, 0, 0))(stacked, x, y)
    for w in range(workers):
        model.zero_grad()
        F.cross_entropy(model(x[w]), y[w]).backward()
        for k, p in model.named_parameters():
            assert p.grad is not None
            torch.testing.assert_close(batched[k][w], p.grad, atol=1e-9, rtol=1e-7)
            torch.testing.assert_close(per_model[k][w], p.grad, atol=1e-9, rtol=1e-7)
    with pytest.raises(ConfigError, match="input_shape"):
        models.make("char-lstm", (1, 8, 8), 10)
    with pytest.raises(ConfigError, match="hidden"):
        models.make("char-lstm", (8,), 10, hidden=0)


@pytest.mark.parametrize("layer", [torch.nn.BatchNorm1d(8), torch.nn.InstanceNorm1d(8, track_running_stats=True)])
def test_a_model_with_torch_batchnorm_is_refused_in_one_line_naming_the_fix(layer: torch.nn.Module,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """A user's model with nn.BatchNorm1d failed every run with functorch's in-place error, three times on one line
    (issue 38); now one ConfigError naming the layer and what to use instead, before any run starts."""
    import types

    module = types.ModuleType("user_bn_model")
    module.build = lambda input_shape, num_classes: torch.nn.Sequential(  # type: ignore[attr-defined]
        torch.nn.Flatten(), torch.nn.Linear(64, 8), layer, torch.nn.Linear(8, num_classes))
    monkeypatch.setitem(sys.modules, "user_bn_model", module)
    with pytest.raises(ConfigError, match=r"model='user_bn_model:build'.*\(layer '2'\).*nn.GroupNorm") as exc:
        models.make("user_bn_model:build", (1, 8, 8), 10)
    assert "\n" not in str(exc.value)
    plain = torch.nn.InstanceNorm1d(8)  # no running statistics: a pure function, allowed
    module.build = lambda input_shape, num_classes: torch.nn.Sequential(  # type: ignore[attr-defined]
        torch.nn.Flatten(), torch.nn.Linear(64, 8), plain, torch.nn.Linear(8, num_classes))
    assert isinstance(models.make("user_bn_model:build", (1, 8, 8), 10), torch.nn.Module)
