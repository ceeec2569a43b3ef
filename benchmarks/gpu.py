"""Rounds per second of the simulated engine on CUDA and on the CPU, side by side, in one command; every robust rule
and the million-client run on the same devices, each figure beside that device's bandwidth floor.

    .venv/bin/python benchmarks/gpu.py [--device cuda cpu] [--workload resnet20 mlp1000 rules population]
                                       [--rounds 20] [--warmup 3] [--call-timeout 60] [--markdown PATH] [--json PATH]

**One short run on a lent GPU** (no argument: CUDA and the CPU, the four default workloads) is meant to fill the
table of docs/benchmarks.md "CUDA vs CPU rounds" in about 5 minutes on an H100 machine (16 cores). That is an
estimate from the CPU timings and the sizes, not a measurement: on the 2-core development machine (load 4) the CPU
side of ``rules`` and ``population`` took 87 s in all (``--device cpu --workload rules population``: 76 s of rules,
each stopped after 2 s of timed calls), and the two CPU rounds 2.75 s (ResNet-20) and 1.17 s (MLP) each, 23 rounds
of each in 90 s; 16 cores take the CPU side to about 2 minutes or less. On CUDA every rule reads its 256 MiB input in
about 0.1 ms at an H100's 3 TB/s, so the rules' CUDA side is their warm-ups and the 64×2²⁰ input drawn on the CPU
(about 2 s), and the population's two CUDA interpreters start in seconds: under a minute. Each workload alone:
``--workload NAME``.

Five workloads; ``resnet20``, ``mlp1000`` and ``lora`` are each a round as ``phalanx run`` runs it
(``phalanx.experiments.from_config``, then ``phalanx.training.Loop.step`` with the in-process transport; no round of
the timed ones evaluates or measures):

* **resnet20** — the ``paper`` preset's round (``phalanx tension paper --preset paper``; Yang, Shi & Li, ICML 2025,
  Section 6): ResNet-20 (GroupNorm) on CIFAR-10, n = 16 workers, batch 16 per worker, worker momentum 0.9, a
  Dirichlet(α = 0.1) split, no attack, the coordinate-wise trimmed mean configured for f = 7 (table T4's last row;
  ``phalanx.studies.tension.config_for``).
* **mlp1000** — the 1,000-worker MLP round of ``benchmarks/training.py``: Fashion-MNIST, the 784-100-10 ReLU MLP,
  batch 32, IID, b = 100 workers sending sign-flipped vectors, trimmed mean with f = 100.
* **rules** — every robust rule of the registry and every pre-aggregator before the trimmed mean, on the device
  at n = 64, d = 2²⁰ float32, f = 12, each beside the device's bandwidth floor (n·d·4 bytes ÷ its measured copy
  bandwidth), ``x.sum(0)`` and its declared floor (``benchmarks/_gpu_rules.py``); ``--quick``: n = 11, d = 4,096, f = 2.
* **population** — ``benchmarks/scale.py``'s federated run over 10³ and 10⁶ clients on the device: median round,
  peak memory (CUDA: ``torch.cuda.max_memory_allocated``; CPU: peak RSS) and their ratios
  (``benchmarks/_gpu_population.py``); ``--quick``: 100 and 10⁵ clients.
* **lora** (only when asked: ``--workload lora``) — the round of ``phalanx experiment lora --preset gpu``
  (``phalanx.studies.lora``, docs/lora.md) in its costliest mode: BERT-base with LoRA r = 8 on query and value,
  mode ``update`` (a truncated SVD per adapted layer), n = 30 clients, texts of 64 tokens, ``cwtm`` f = 6 under
  ``signflip``. The checkpoint is ``google-bert/bert-base-uncased`` when it is in the Hugging Face cache, else a
  randomly initialised BERT of the same architecture written to a temporary directory (a round's cost depends on
  the shapes, not the weights); the texts are random token ids, IID (no users to split by).

The images are the real data sets when they are on this machine (``phalanx.data.load``), else random tensors of
the same shapes (3×32×32 and 1×28×28, seeded): a round's cost does not depend on the pixel values, only on the
shapes, so the figures are the same either way; the report says which was used.

Each (workload, device) pair builds its run afresh on that device (``device`` in the config: model, data set and
every round's tensors live there; random draws stay on the CPU, docs/cluster.md), runs ``--warmup`` rounds, then
``--rounds`` timed rounds; on CUDA every round ends with ``torch.cuda.synchronize`` so that the time is the round's,
not its launch. Reported: the median round time, rounds per second (1 / median), and per workload the ratio of CUDA's
rounds per second to the CPU's. ``--quick`` (a smoke test on the CPU): the same rounds at toy sizes (n = 4 with
3×16×16 images; n = 20 with 1×8×8). The exit status is 1 when a round's θ is not finite, a population run failed,
or a printed ``× floor`` is not what the raw times give (``_gpu_rules.check``); a rule that fails or runs past
``--call-timeout`` is a row saying so, not a failure of the script.

A full CPU measurement of the ResNet-20 round takes seconds per round on a few cores: on a CPU-only machine run
``--device cpu --rounds 2``.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench_common import all_threads, fmt_time, md_row

TITLE = "Simulated rounds per second on CUDA and on the CPU"
NEVER = 10**9
"""``rounds`` and ``eval_every`` of the benchmark's runs: no round it times evaluates, measures or is the last."""


@dataclass(frozen=True)
class Workload:
    """One round to time: its config (without ``device``) and the data set it needs (name, input shape, classes,
    training samples when synthetic)."""

    name: str
    label: str
    config: dict[str, Any]
    dataset: str
    shape: tuple[int, ...]
    samples: int
    classes: int = 10
    vocab: int = 0
    """Token ids in [1000, vocab) instead of images (0: images)."""


def workloads(quick: bool) -> list[Workload]:
    """The ResNet-20 round of the ``paper`` preset and the 1,000-worker MLP round (toy sizes with ``quick``)."""
    from phalanx.studies.tension import Cell, config_for, preset

    p = preset("paper")
    cell = Cell("T4", p.max_f, 0.1, p.lrs[0], p.seeds[0])  # trimmed mean, f = 7, α = 0.1
    resnet = config_for(p, cell).model_dump(mode="json")
    resnet.pop("device", None)
    mlp = {
        "dataset": "fashion-mnist", "model": "mlp", "model_params": {"hidden": [100]}, "workers": 1000,
        "byzantine": 100, "f": 100, "aggregator": "cwtm", "attack": "signflip", "partition": "iid", "batch_size": 32,
        "lr": 0.1, "momentum": 0.9, "seed": 0,
    }
    if quick:
        resnet.update(workers=4, f=1, batch_size=2, partition="iid")
        mlp.update(workers=20, byzantine=2, f=2, batch_size=8)
    adapters = lora_config(quick)
    for cfg in (resnet, mlp, adapters):
        cfg.update(rounds=NEVER, eval_every=NEVER, checkpoint_every=NEVER)
    length = adapters["dataset_params"]["length"]
    del adapters["dataset_params"]
    return [
        Workload("resnet20", f"ResNet-20 (GroupNorm), n = {resnet['workers']}, batch {resnet['batch_size']}, "
                 f"cwtm f = {resnet['f']}", resnet, "cifar10", (3, 16, 16) if quick else (3, 32, 32),
                 256 if quick else 8192),
        Workload("mlp1000", f"MLP {'64' if quick else '784'}-100-10, n = {mlp['workers']}, batch {mlp['batch_size']}, "
                 f"signflip b = {mlp['byzantine']}, cwtm f = {mlp['f']}", mlp, "fashion-mnist",
                 (1, 8, 8) if quick else (1, 28, 28), 1024 if quick else 60_000),
        Workload("lora", f"LoRA r = {adapters['model_params']['r']} ({adapters['model_params']['aggregation']}) on "
                 f"{'a tiny BERT' if quick else 'BERT-base'}, n = {adapters['workers']}, {length} tokens, "
                 f"{adapters['attack']} b = {adapters['byzantine']}, cwtm f = {adapters['f']}", adapters,
                 "sent140", (length,), 256 if quick else 4096, classes=2, vocab=1024 if quick else 30522),
    ]


def lora_config(quick: bool) -> dict[str, Any]:
    """The ``lora`` workload's config: the study's ``gpu`` preset, cell (update, cwtm, signflip); ``quick``: 4
    clients (and, from :func:`hf_model`, a 2-layer, hidden-64 BERT)."""
    from phalanx.studies.lora import Cell, config_for, preset

    p = preset("gpu")
    if quick:
        p = preset("gpu", workers=4, byzantine=1, f=1, length=16, r=2, batch_size=4, local_steps=1)
    cfg = config_for(p, Cell("update", "cwtm", "vector", p.seeds[0]), trigger=[1000]).model_dump(mode="json")
    cfg.pop("device", None)
    cfg.update(partition="iid", dataset="sent140-sample")  # the model is found where it runs (main: hf_model)
    return cfg


def hf_model(spec: str, quick: bool) -> str:
    """``spec`` when it is on this machine (nothing is downloaded), else ``hf:DIR``: a randomly initialised BERT
    of BERT-base's architecture (``quick``: 2 layers, hidden 64) saved to a temporary directory."""
    import atexit
    import shutil
    import tempfile

    from transformers import BertConfig, BertForSequenceClassification

    from phalanx import hub
    from phalanx.errors import ConfigError

    if not quick:
        try:
            hub.resolve(spec)
            return spec
        except ConfigError:
            pass
    small: dict[str, Any] = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
                             "intermediate_size": 128, "vocab_size": 1024} if quick else {}
    folder = Path(tempfile.mkdtemp(prefix="phalanx-bench-bert-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    torch.manual_seed(0)
    config = BertConfig(**small)
    config.num_labels = 2
    BertForSequenceClassification(config).save_pretrained(folder)
    return f"hf:{folder}"


def dataset_for(w: Workload, quick: bool) -> tuple[Any, str]:
    """The workload's data set: the real one when it is on this machine (not in quick mode), else random tensors of
    its shape; and which it is, in words."""
    from phalanx import data
    from phalanx.data.base import Dataset, DatasetNotFoundError

    if not quick and not w.vocab:
        try:
            return data.load(w.dataset), w.dataset
        except DatasetNotFoundError:
            pass
    g = torch.Generator().manual_seed(0)
    n_test = max(64, w.samples // 8)
    if w.vocab:
        x = torch.randint(1000 if w.vocab > 1000 else 5, w.vocab, (w.samples + n_test, *w.shape), generator=g)
        x = x.float()
    else:
        x = torch.randn(w.samples + n_test, *w.shape, generator=g)
    y = torch.randint(0, w.classes, (w.samples + n_test,), generator=g)
    ds = Dataset.from_tensors(w.dataset, x[: w.samples], y[: w.samples], x[w.samples :], y[w.samples :], w.classes,
                              source="synthetic")
    why = "quick" if quick else f"{w.samples} samples; {w.dataset} not found"
    what = "random token ids" if w.vocab else "random tensors"
    return ds, f"{what} {'×'.join(map(str, w.shape))} ({why})"


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_rounds(w: Workload, dataset: Any, device: str, warmup: int, rounds: int) -> dict[str, Any]:
    """Build the workload's run on ``device`` and time its rounds; one record."""
    from phalanx.experiments import from_config, make_config
    from phalanx.training import Loop

    cfg = make_config({**w.config, "device": device})
    exp = from_config(cfg, dataset)
    dev = torch.device(exp.device)
    loop = Loop(exp, callbacks=[])
    loop.open()
    for _ in range(warmup):
        loop.step()
    _sync(dev)
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        loop.step()
        _sync(dev)
        times.append(time.perf_counter() - t0)
    median = statistics.median(times)
    finite = bool(torch.isfinite(loop.state.theta).all())
    return {"workload": w.name, "device": str(dev), "gpu": torch.cuda.get_device_name(dev) if dev.type == "cuda"
            else None, "rounds": rounds, "warmup": warmup, "median_s": median, "rounds_per_s": 1.0 / median,
            "times_s": times, "parameters": exp.problem.dim, "finite": finite}


def ratio_rows(recs: list[dict[str, Any]]) -> dict[str, float | None]:
    """Per workload: CUDA's rounds per second over the CPU's (None unless both were measured)."""
    out: dict[str, float | None] = {}
    for name in dict.fromkeys(r["workload"] for r in recs):
        cuda = [r["rounds_per_s"] for r in recs if r["workload"] == name and r["device"].startswith("cuda")]
        cpu = [r["rounds_per_s"] for r in recs if r["workload"] == name and r["device"] == "cpu"]
        out[name] = cuda[0] / cpu[0] if cuda and cpu else None
    return out


def table(recs: list[dict[str, Any]], labels: dict[str, str]) -> list[str]:
    """The report as Markdown table lines."""
    ratios = ratio_rows(recs)
    lines = [md_row(["workload", "device", "median round", "rounds/s", "CUDA ÷ CPU"]),
             md_row(["---", "---", "---:", "---:", "---:"])]
    for r in recs:
        dev = r["device"] + (f" ({r['gpu']})" if r["gpu"] else "")
        ratio = ratios[r["workload"]]
        lines.append(md_row([labels[r["workload"]], dev, fmt_time(r["median_s"]), f"{r['rounds_per_s']:.2f}",
                             f"{ratio:.1f}×" if ratio is not None and r["device"] != "cpu" else "—"]))
    return lines


ROUNDS = ("resnet20", "mlp1000", "lora")
WORKLOADS = (*ROUNDS, "rules", "population")
DEFAULT = ("resnet20", "mlp1000", "rules", "population")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=TITLE)
    ap.add_argument("--device", nargs="+", default=None,
                    help="devices to time, in order (default: cuda and cpu when CUDA is available, else cpu)")
    ap.add_argument("--workload", nargs="+", choices=WORKLOADS, default=list(DEFAULT),
                    help="lora (the LoRA study's gpu round) only when named")
    ap.add_argument("--rounds", type=int, default=20, help="timed rounds per workload and device (rules: calls)")
    ap.add_argument("--warmup", type=int, default=3, help="rounds run before timing")
    ap.add_argument("--call-timeout", type=float, default=60.0,
                    help="seconds one call of a rule may take (rules workload) before it is reported as a timeout")
    ap.add_argument("--quick", action="store_true", help="toy sizes (a smoke test)")
    ap.add_argument("--markdown", default=None, help="write the table as Markdown to this file")
    ap.add_argument("--json", default=None, help="write the records as JSON to this file")
    args = ap.parse_args(argv)
    if args.rounds < 1 or args.warmup < 0:
        ap.error("--rounds must be >= 1 and --warmup >= 0")
    if not args.call_timeout > 0:
        ap.error("--call-timeout must be > 0")
    return args


def main(argv: list[str] | None = None) -> int:
    import _gpu_population
    import _gpu_rules

    args = parse_args(argv)
    devices = args.device or (["cuda", "cpu"] if torch.cuda.is_available() else ["cpu"])
    chosen = [w for w in workloads(args.quick) if w.name in args.workload]
    command = ".venv/bin/python benchmarks/gpu.py " + " ".join(argv if argv is not None else sys.argv[1:])
    print(f"{TITLE}\n{command.strip()}\ntorch {torch.__version__}, CUDA {torch.version.cuda or 'none'}, "
          f"{platform.processor() or platform.machine()}, {all_threads()} cores ({torch.get_num_threads()} torch "
          f"threads)", flush=True)
    recs: list[dict[str, Any]] = []
    notes: list[str] = []
    for w in chosen:
        if w.name == "lora":  # the checkpoint, or a random one of its architecture, only when it is timed
            w = replace(w, config={**w.config, "model": hf_model(w.config["model"], args.quick)})
        ds, what = dataset_for(w, args.quick)
        notes.append(f"{w.name}: data = {what}")
        for device in devices:
            rec = time_rounds(w, ds, device, args.warmup, args.rounds)
            recs.append(rec)
            print(f"  {w.name} on {rec['device']}: {fmt_time(rec['median_s'])} a round, "
                  f"{rec['rounds_per_s']:.2f} rounds/s", flush=True)
    lines = table(recs, {w.name: w.label for w in chosen}) if chosen else []
    rules = [_gpu_rules.run(d, args.quick, args.rounds, args.call_timeout, say=lambda m: print(m, flush=True))
             for d in devices] if "rules" in args.workload else []
    population = [_gpu_population.run(d, args.quick) for d in devices] if "population" in args.workload else []
    problems: list[str] = []
    if rules:
        rule_lines = _gpu_rules.table(rules)
        problems = _gpu_rules.check(rules, rule_lines)
        lines += ["", *rule_lines]
        notes += _gpu_rules.notes(rules)
    if population:
        lines += ["", *_gpu_population.table(population)]
        notes += _gpu_population.notes(population)
    print("\n".join(["", *lines, "", *notes, *(f"CHECK FAILED: {p}" for p in problems)]))
    if args.markdown:
        Path(args.markdown).write_text("\n".join([f"Command: `{command.strip()}`", "", *lines, "", *notes]) + "\n")
    if args.json:
        Path(args.json).write_text(json.dumps({"command": command.strip(), "records": recs, "rules": rules,
                                               "population": population, "notes": notes}, indent=1))
    ok = all(r["finite"] for r in recs) and not problems and not any("error" in p for p in population)
    return 0 if ok and (recs or rules or population) else 1


if __name__ == "__main__":
    sys.exit(main())
