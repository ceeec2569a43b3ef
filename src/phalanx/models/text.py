"""A character-level LSTM for next-character prediction (LEAF's Shakespeare) and other character inputs (Sent140).

LEAF's Shakespeare model (Caldas et al., "LEAF: A Benchmark for Federated Settings", 2018, §4, after McMahan et
al., AISTATS 2017): an 8-dimensional character embedding, two LSTM layers of 256 units, a dense layer on the last
step's output. Here the LSTM is written out — one ``Linear`` per layer on ``[input, h]`` giving the four gates, a
Python loop over the (fixed) sequence length — rather than ``nn.LSTM``, so that the model is a pure function of its
parameters and input that ``torch.func.vmap`` batches over workers (``nn.LSTM``'s fused kernel has no batching
rule; a loop of fixed length is not data-dependent control flow).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from phalanx.errors import ConfigError
from phalanx.models.registry import register

__all__ = ["CharLSTM", "char_lstm"]

LEAF_VOCAB = 81
"""LEAF's 80 characters and one code for any other character (:data:`phalanx.data.leaf.OOV`)."""


def _positive(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(name, value, "a positive int")
    return value


class CharLSTM(nn.Module):
    """``Embedding(vocab, embedding) → LSTM(hidden) × layers → Linear(hidden, num_classes)`` on the last step.

    The input is ``(B, L)`` character codes (float or integer; a Phalanx data set stores them as float32, exact
    integers ``0 … vocab − 1``). Each layer ``l`` computes, at step ``t``, the gates
    ``[i, f, g, o] = W_l [x_t; h_{t−1}] + b_l`` and ``c_t = σ(f) c_{t−1} + σ(i) tanh(g)``, ``h_t = σ(o) tanh(c_t)``
    (Hochreiter & Schmidhuber 1997, with the forget gate of Gers et al. 2000), from ``h_0 = c_0 = 0``.
    """

    def __init__(
        self, input_shape: tuple[int, ...], num_classes: int, vocab: int = LEAF_VOCAB, embedding: int = 8,
        hidden: int = 256, layers: int = 2,
    ) -> None:
        super().__init__()
        if len(input_shape) != 1:
            raise ConfigError("input_shape", input_shape, "(L,): a sequence of character codes, for char-lstm")
        self.vocab = _positive("vocab", vocab)
        self.hidden = _positive("hidden", hidden)
        width = _positive("embedding", embedding)
        self.embed = nn.Embedding(self.vocab, width)
        cells: list[nn.Module] = []
        for _ in range(_positive("layers", layers)):
            cells.append(nn.Linear(width + self.hidden, 4 * self.hidden))
            width = self.hidden
        self.cells = nn.ModuleList(cells)
        self.out = nn.Linear(self.hidden, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        e = self.embed(x.long())  # (B, L, E)
        zeros = e.new_zeros((e.shape[0], self.hidden))
        h = [zeros for _ in self.cells]
        c = [zeros for _ in self.cells]
        for t in range(e.shape[1]):
            inp = e[:, t]
            for k, cell in enumerate(self.cells):
                i, f, g, o = cell(torch.cat([inp, h[k]], dim=1)).chunk(4, dim=1)
                c[k] = torch.sigmoid(f) * c[k] + torch.sigmoid(i) * torch.tanh(g)
                h[k] = torch.sigmoid(o) * torch.tanh(c[k])
                inp = h[k]
        return self.out(h[-1])


@register("char-lstm", meta=True)
def char_lstm(
    input_shape: tuple[int, ...], num_classes: int, vocab: int = LEAF_VOCAB, embedding: int = 8, hidden: int = 256,
    layers: int = 2,
) -> nn.Module:
    """LEAF's Shakespeare model (8-dim embedding, 2 × 256 LSTM units): see :class:`CharLSTM`. ``vocab``: the number
    of character codes (default 81, LEAF's letters and one for any other character)."""
    return CharLSTM(input_shape, num_classes, vocab=vocab, embedding=embedding, hidden=hidden, layers=layers)
