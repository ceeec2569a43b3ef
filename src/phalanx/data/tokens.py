"""Text as a pre-trained model's token ids: the tokenizer shipped with an ``hf:NAME`` checkpoint (:mod:`phalanx.hub`).

``dataset_params = {tokenizer = "hf:phalanx-bert-tiny", length = 32}`` on a text data set (``sent140``,
``sent140-sample``) turns each text into ``length`` token ids — the model's own tokenizer, its special tokens added
(``[CLS] … [SEP]`` for BERT), cut to ``length`` and padded with the tokenizer's padding token — stored as float32
(exact integers below 2²⁴, like the character codes of ``char-lstm``). Loaded with ``local_files_only=True``: nothing
is downloaded.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from phalanx import hub
from phalanx.data.base import DataFormatError
from phalanx.errors import ConfigError
from phalanx.validate import check_int

__all__ = ["MAX_LENGTH", "tokenizer"]

MAX_LENGTH = 512
"""The longest sequence a ``length`` may ask for (BERT's positions)."""


def tokenizer(spec: str, length: int) -> Callable[[list[str], str], np.ndarray[Any, Any]]:
    """``spec``'s tokenizer, loaded now (one line naming ``dataset_params.tokenizer`` if it cannot be), as a function
    of ``(texts, where)`` giving ``(N, length)`` int64 token ids (special tokens added, cut, padded)."""
    check_int("dataset_params.length", length, low=2, high=MAX_LENGTH)
    hub.require("dataset_params.tokenizer", "transformers")
    path = hub.resolve(spec, "dataset_params.tokenizer")
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
    except Exception as exc:  # no tokenizer files in the checkpoint, a broken tokenizer.json
        raise ConfigError("dataset_params.tokenizer", spec, f"a checkpoint that ships its tokenizer "
                          f"({type(exc).__name__}: {str(exc)[:160]})") from None
    if tok.pad_token_id is None:
        raise ConfigError("dataset_params.tokenizer", spec, "a tokenizer with a padding token")

    def tokenize(texts: list[str], where: str) -> np.ndarray[Any, Any]:
        if any(not isinstance(t, str) for t in texts):
            raise DataFormatError(where, "a text that is not a string")
        if not texts:
            return np.zeros((0, length), dtype=np.int64)
        out = tok(texts, padding="max_length", truncation=True, max_length=length, return_tensors="np")["input_ids"]
        return np.asarray(out, dtype=np.int64).reshape(len(texts), length)

    return tokenize
