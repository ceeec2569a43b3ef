"""Pre-train Phalanx's embedded transformer, ``hf:phalanx-bert-tiny``, from public-domain text shipped here.

What it is: a BERT-style encoder (Devlin et al., NAACL 2019) — 2 layers, hidden size 64, 2 attention heads,
feed-forward 256, at most 64 positions — with a lower-cased WordPiece vocabulary of 2,048 tokens, pre-trained by
masked language modelling (15 % of the tokens chosen; of those 80 % replaced by [MASK], 10 % by a random token,
10 % kept: Devlin et al. §3.1) on Shakespeare's plays as compiled in ``scripts/corpora/tinyshakespeare.txt.gz``
(1,115,394 characters, public domain; the compilation is char-rnn's ``tinyshakespeare``, Karpathy 2015). It is
small so that the tests and the default study run on two CPU cores; it is a real pre-trained transformer in the
format ``transformers`` loads (``config.json``, ``model.safetensors``, ``tokenizer.json``), not a stand-in. Its
knowledge is of Early Modern English only: say so wherever its results are quoted.

Run (deterministic on one machine; 40 minutes on 2 busy cores, OMP_NUM_THREADS=1)::

    python scripts/pretrain_tiny_bert.py --out src/phalanx/_hub/phalanx-bert-tiny

It needs the ``[lora]`` extra (transformers, tokenizers). The held-out masked-token accuracy it prints is written
into the model card (``README.md`` of the output directory).
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import time
from pathlib import Path

import torch

CORPUS = Path(__file__).resolve().parent / "corpora" / "tinyshakespeare.txt.gz"
VOCAB = 2048
LENGTH = 64
SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def tokenizer_from(lines: list[str]):  # type: ignore[no-untyped-def]
    """A lower-cased WordPiece tokenizer trained on ``lines``, wrapped as a ``BertTokenizerFast``."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    tok.train_from_iterator(lines, trainers.WordPieceTrainer(vocab_size=VOCAB, special_tokens=SPECIAL))
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B [SEP]", special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]", sep_token="[SEP]",
        mask_token="[MASK]", model_max_length=LENGTH)


def chunks(ids: list[int], cls: int, sep: int) -> torch.Tensor:
    """The token stream cut into ``[CLS] … [SEP]`` sequences of :data:`LENGTH` tokens."""
    body = LENGTH - 2
    n = len(ids) // body
    x = torch.tensor(ids[: n * body], dtype=torch.long).view(n, body)
    return torch.cat([torch.full((n, 1), cls), x, torch.full((n, 1), sep)], dim=1)


def masked(x: torch.Tensor, mask_id: int, vocab: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Devlin et al.'s masking: 15 % of the non-special positions are predicted; 80/10/10 [MASK]/random/kept."""
    labels = x.clone()
    special = x < len(SPECIAL)
    chosen = (torch.rand(x.shape, generator=gen) < 0.15) & ~special
    labels[~chosen] = -100
    u = torch.rand(x.shape, generator=gen)
    inputs = x.clone()
    inputs[chosen & (u < 0.8)] = mask_id
    rand = chosen & (u >= 0.8) & (u < 0.9)
    inputs[rand] = torch.randint(len(SPECIAL), vocab, x.shape, generator=gen)[rand]
    return inputs, labels


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    from transformers import BertConfig, BertForMaskedLM

    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    text = gzip.decompress(CORPUS.read_bytes()).decode("utf-8")
    lines = [ln for ln in text.splitlines() if ln.strip()]
    tok = tokenizer_from(lines)
    ids = tok(" ".join(lines), add_special_tokens=False)["input_ids"]
    data = chunks(ids, tok.cls_token_id, tok.sep_token_id)
    held = data[-200:]  # the end of the corpus (the last scenes): never trained on
    train = data[:-200]
    cfg = BertConfig(vocab_size=len(tok), hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=256, max_position_embeddings=LENGTH, type_vocab_size=2,
                     pad_token_id=tok.pad_token_id, hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)
    model = BertForMaskedLM(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.01)
    warm = max(1, args.steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warm) * 0.5 * (1 + math.cos(math.pi * min(s, args.steps) / args.steps)))
    start = time.time()
    model.train()
    for step in range(args.steps):
        idx = torch.randint(0, train.shape[0], (args.batch,), generator=gen)
        inputs, labels = masked(train[idx], tok.mask_token_id, len(tok), gen)
        hidden = model.bert(input_ids=inputs).last_hidden_state
        chosen = labels != -100  # the prediction head on the chosen positions only (15 %): the same loss, cheaper
        loss = torch.nn.functional.cross_entropy(model.cls(hidden[chosen]), labels[chosen])
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % 250 == 0 or step < 5:
            print(f"step {step}: loss {float(loss):.3f} ({time.time() - start:.0f} s)", flush=True)
    model.eval()
    with torch.no_grad():
        inputs, labels = masked(held, tok.mask_token_id, len(tok), torch.Generator().manual_seed(1))
        logits = model(input_ids=inputs).logits
        keep = labels != -100
        acc = float((logits.argmax(-1)[keep] == labels[keep]).float().mean())
    args.out.mkdir(parents=True, exist_ok=True)
    model.config.hidden_dropout_prob = 0.1
    model.save_pretrained(args.out, safe_serialization=True)
    tok.save_pretrained(args.out)
    minutes = (time.time() - start) / 60
    print(f"held-out masked-token accuracy: {acc:.3f}; {args.steps} steps in {minutes:.1f} min")
    (args.out / "pretraining.json").write_text(json.dumps({
        "corpus": "scripts/corpora/tinyshakespeare.txt.gz", "steps": args.steps, "batch": args.batch,
        "seed": args.seed, "held_out_sequences": int(held.shape[0]), "held_out_masked_accuracy": round(acc, 4),
        "parameters": sum(p.numel() for p in model.bert.parameters()),
        "command": f"python scripts/pretrain_tiny_bert.py --out DIR --steps {args.steps} --batch {args.batch} "
                   f"--seed {args.seed}",
    }, indent=1) + "\n")


if __name__ == "__main__":
    main()
