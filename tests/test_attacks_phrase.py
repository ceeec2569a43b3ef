"""The trigger-phrase backdoor on token ids (``phrase-backdoor``, issue 35 item 3): where the phrase goes, what a run
refuses before it starts, the success rate it measures, and a run through the config path on the embedded model."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from phalanx import attacks
from phalanx.attacks.base import DataAttack
from phalanx.attacks.phrase import PhraseBackdoor
from phalanx.errors import ConfigError

CLS, SEP, PAD = 2, 3, 0


def _texts(n: int = 6, length: int = 10, words: int = 5, seed: int = 0) -> torch.Tensor:
    """``n`` BERT-style sequences: [CLS], ``words`` ids in [10, 50), [SEP], padding — float32 token ids."""
    g = torch.Generator().manual_seed(seed)
    x = torch.full((n, length), float(PAD))
    x[:, 0] = CLS
    x[:, 1 : 1 + words] = torch.randint(10, 50, (n, words), generator=g).float()
    x[:, 1 + words] = SEP
    return x


def test_registered_as_a_data_attack_and_listed() -> None:
    assert "phrase-backdoor" in attacks.names("data")
    attack = attacks.make("phrase-backdoor", trigger=[7, 8], target=0)
    assert isinstance(attack, DataAttack) and isinstance(attack, PhraseBackdoor)
    assert attack.params() == {"trigger": [7, 8], "target": 0, "offset": 1, "poison_fraction": 0.5, "boost": 1.0}
    assert "Wan" in attack.reference


def test_the_phrase_goes_after_cls_and_the_text_shifts_right_cut_to_its_length() -> None:
    x = _texts()
    before = x.clone()
    out = PhraseBackdoor(trigger=(7, 8, 9)).trigger(x)
    assert torch.equal(x, before)  # the batch itself is left alone
    assert out.shape == x.shape and out.dtype == x.dtype
    assert torch.equal(out[:, 0], x[:, 0])  # [CLS] stays first
    assert torch.equal(out[:, 1:4], torch.tensor([7.0, 8.0, 9.0]).expand(6, 3))
    assert torch.equal(out[:, 4:], x[:, 1:-3])  # the text and its [SEP], shifted by the phrase's length
    full = torch.arange(10.0).expand(2, 10)  # a sequence with no padding loses its last ids, not its start
    assert torch.equal(PhraseBackdoor(trigger=(7,), offset=0).trigger(full)[0], torch.tensor(
        [7.0, 0, 1, 2, 3, 4, 5, 6, 7, 8]))


def test_poisoned_batches_carry_the_phrase_and_the_target_label_clean_ones_do_not() -> None:
    x, y = _texts(n=8), torch.zeros(8, dtype=torch.long)
    attack = PhraseBackdoor(trigger=(7, 8), target=1, poison_fraction=0.5)
    attack.prepare(x, y, 2)
    x2, y2 = attack.transform(x, y, 2, torch.Generator().manual_seed(0))
    poisoned = (x2[:, 1] == 7) & (x2[:, 2] == 8)
    assert int(poisoned.sum()) == 4 and bool((y2[poisoned] == 1).all()) and bool((y2[~poisoned] == 0).all())
    assert torch.equal(x2[~poisoned], x[~poisoned])


def _reads_the_phrase(x: torch.Tensor) -> torch.Tensor:
    """A model that has learnt the backdoor: class 1 when ids 7, 8 follow [CLS], else class 0."""
    return ((x[:, 1] == 7) & (x[:, 2] == 8)).long()


def test_attack_success_is_the_share_of_triggered_non_target_texts_sent_to_the_target() -> None:
    x = _texts(n=8)
    y = torch.tensor([0, 0, 0, 0, 0, 0, 1, 1])
    attack = PhraseBackdoor(trigger=(7, 8), target=1)
    assert attack.metrics(_reads_the_phrase, x, y)["attack_success"] == 1.0
    assert attack.metrics(lambda t: torch.zeros(t.shape[0], dtype=torch.long), x, y)["attack_success"] == 0.0
    # mutant: a trigger that puts the phrase anywhere else is not the backdoor the model learnt — the metric sees it
    moved = PhraseBackdoor(trigger=(7, 8), target=1, offset=3)
    assert moved.metrics(_reads_the_phrase, x, y)["attack_success"] == 0.0
    none = attack.metrics(_reads_the_phrase, x, torch.ones(8, dtype=torch.long))
    assert math.isnan(none["attack_success"]) and math.isnan(none["attack_flip"]) and none["attack_flip_base"] == 0


def test_the_flip_rate_counts_only_what_the_phrase_moves_not_the_models_bias() -> None:
    """Issue 35 item 6: a model biased to the target scores a high ``attack_success`` with no backdoor at all; the
    flip rate, on the texts the model does not already send to the target, does not."""
    x = _texts(n=8)
    y = torch.zeros(8, dtype=torch.long)  # none of class 1
    attack = PhraseBackdoor(trigger=(7, 8), target=1)
    lean = x[:, 1] < 30  # the texts a biased model sends to class 1 whatever the phrase (about half)
    assert 0 < int(lean.sum()) < 8

    def biased(t: torch.Tensor) -> torch.Tensor:
        """No backdoor: class 1 for the texts whose first word is < 30 — with or without the phrase (the phrase
        moves the first word to position 3, so read it where it is)."""
        first = torch.where((t[:, 1] == 7) & (t[:, 2] == 8), t[:, 3], t[:, 1])
        return (first < 30).long()

    def backdoored(t: torch.Tensor) -> torch.Tensor:
        return torch.maximum(biased(t), _reads_the_phrase(t))

    b = attack.metrics(biased, x, y)
    share = float(lean.double().mean())
    assert b["attack_success"] == pytest.approx(share) and b["attack_clean_target"] == pytest.approx(share)
    assert b["attack_flip"] == 0.0 and b["attack_flip_base"] == 8 - int(lean.sum())  # the phrase moves nothing
    d = attack.metrics(backdoored, x, y)
    assert d["attack_success"] == 1.0 and d["attack_flip"] == 1.0 and d["attack_clean_target"] == pytest.approx(share)
    # mutant: a flip rate that forgets to leave out the texts already in the target is attack_success again, and
    # reads the bias as a backdoor — the real one does not
    def forgetful(t: torch.Tensor) -> torch.Tensor:
        return (biased(attack.trigger(t)) == 1).double()

    assert float(forgetful(x).mean()) == pytest.approx(share) != b["attack_flip"]
    everything = attack.metrics(lambda t: torch.ones(t.shape[0], dtype=torch.long), x, y)
    assert everything["attack_success"] == 1.0 and math.isnan(everything["attack_flip"])  # nothing left to flip
    assert everything["attack_flip_base"] == 0


def test_what_cannot_work_is_refused_before_the_run_in_one_line() -> None:
    x, y = _texts(length=10), torch.zeros(6, dtype=torch.long)
    with pytest.raises(ConfigError, match="target"):
        PhraseBackdoor(target=2).prepare(x, y, 2)
    with pytest.raises(ConfigError, match="trigger"):  # no room: offset 1 + 9 ids in 10 positions
        PhraseBackdoor(trigger=tuple(range(10, 19))).prepare(x, y, 2)
    PhraseBackdoor(trigger=tuple(range(10, 18))).prepare(x, y, 2)  # 8 ids fit
    with pytest.raises(ConfigError, match=r"trigger.*\[0, 49\]"):  # an id past every id of the texts
        PhraseBackdoor(trigger=(7, 50)).prepare(x, y, 2)
    with pytest.raises(ConfigError, match="token ids"):  # features, not token ids
        PhraseBackdoor().prepare(torch.randn(6, 10), y, 2)
    with pytest.raises(ConfigError, match="token ids"):  # images
        PhraseBackdoor().prepare(torch.zeros(6, 1, 4, 4), y, 2)
    with pytest.raises(ConfigError, match="token ids"):  # a negative id
        PhraseBackdoor().prepare(x - 3, y, 2)
    for bad in ([], "7", [7, -1], [7.5]):
        with pytest.raises(ConfigError, match="trigger"):
            PhraseBackdoor(trigger=bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="offset"):
        PhraseBackdoor(offset=-1)


def test_a_run_fine_tunes_adapters_with_phrase_poisoned_clients(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    pytest.importorskip("peft")
    from phalanx.experiments import make_config, train

    tiny = "hf:phalanx-bert-tiny"
    cfg = make_config({
        "dataset": "sent140-sample", "dataset_params": {"tokenizer": tiny, "length": 16}, "partition": "natural",
        "model": tiny, "model_params": {"r": 2, "aggregation": "shared"}, "algorithm": "fedavg", "workers": 6,
        "local_steps": 1, "batch_size": 4, "lr": 0.1, "byzantine": 1, "f": 1, "aggregator": "cwtm",
        "attack": "phrase-backdoor", "attack_params": {"trigger": [100, 101], "target": 1}, "rounds": 2,
        "eval_every": 2, "seed": 0,
    })
    rows = train(cfg, tmp_path / "run")
    assert rows[-1]["round"] == 2 and 0.0 <= rows[-1]["attack_success"] <= 1.0
    assert 0.0 <= rows[-1]["attack_clean_target"] <= 1.0 and rows[-1]["attack_flip_base"] >= 0
    assert math.isfinite(rows[-1]["test_loss"])
    with pytest.raises(ConfigError, match="trigger"):  # an id beyond the tokenised texts' largest, before the run
        train(make_config({**cfg.model_dump(), "attack_params": {"trigger": [10**6], "target": 1}}),
              tmp_path / "refused")
