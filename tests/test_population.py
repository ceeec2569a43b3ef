"""Client populations: a million clients on one machine (docs/federated.md, "A population of clients").

Each claim is played against the failure that would break it: a generator that depends on what was drawn before, a
run that allocates per client of the population, a sampler that is not uniform, a record that ignores f, a forged
checkpoint, a hostile LEAF file.
"""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from phalanx import aggregators, attacks, models
from phalanx.data import leaf
from phalanx.data.base import DataFormatError
from phalanx.data.leaf_population import LeafPopulation
from phalanx.data.population import SyntheticPopulation
from phalanx.errors import ConfigError
from phalanx.experiments import from_config, make_config
from phalanx.training import Experiment, run
from phalanx.training.algorithms.dsgd import DSGD
from phalanx.training.algorithms.fedavg import FedAvg
from phalanx.training.population import PopulationData, sample_clients
from phalanx.training.stages.byzantine_count import ByzantineCount, f_for, pmf, tail
from phalanx.training.streams import generator

POP = SyntheticPopulation(0.5, 0.5, seed=3, max_samples=200, eval_clients=4)


def _experiment(workers: int, *, rule: str = "cwtm", f: int = 1, byzantine: int | None = None, c: int = 10,
                rounds: int = 3, pop: Any = POP, attack: str = "alie") -> Experiment:
    model = models.make("logreg", pop.input_shape, pop.num_classes, generator=torch.Generator().manual_seed(0))
    b = workers // 10 if byzantine is None else byzantine
    return Experiment(model=model, dataset=pop, workers=workers, byzantine=b, rule=aggregators.make(rule, f=f),
                      attack=attacks.make(attack), rounds=rounds, eval_every=rounds, lr=1.0,
                      algorithm=FedAvg(clients_per_round=c, local_steps=2, batch_size=5, lr=0.05))


# --- determinism ------------------------------------------------------------------------------------------------


def test_a_client_is_a_function_of_seed_and_id_alone() -> None:
    """Client 7's data do not depend on which clients were asked for before, nor in which order (a generator shared
    across clients — the mutant below — would give client 7 other data after other clients)."""
    fresh = SyntheticPopulation(0.5, 0.5, seed=3, max_samples=200, eval_clients=4)
    alone = fresh.clients([7])[0]
    after = POP.clients([999_999, 12, 7])[2]
    assert torch.equal(alone[0], after[0]) and torch.equal(alone[1], after[1])
    again = SyntheticPopulation(0.5, 0.5, seed=3, max_samples=200, eval_clients=1).clients([7])[0]
    assert torch.equal(alone[0], again[0])


def test_the_shared_generator_mutant_is_caught() -> None:
    """The mutant: one generator for the population, drawn client after client — client 7's data then depend on
    the clients generated before it, which the check above sees."""

    class Shared(SyntheticPopulation):
        def client_data(self, k: int) -> Any:
            g = getattr(self, "_g", None) or torch.Generator().manual_seed(0)
            self._g = g
            x = torch.randn(60, 60, generator=g)
            return x[:54], x[:54, 0].long().abs() % 10, x[54:], x[54:, 0].long().abs() % 10

    a = Shared(eval_clients=1).clients([7])[0]
    b = Shared(eval_clients=1).clients([3, 7])[1]
    assert not torch.equal(a[0], b[0])


def test_clients_and_seeds_differ_and_the_model_is_fedprox_s() -> None:
    """Different clients and different population seeds give different data; sizes follow the generator
    (50 ≤ n ≤ max_samples, 90 % for training), labels lie in 0..9, inputs in ℝ⁶⁰."""
    x0, y0, t0, _ = POP.client_data(0)
    x1, _, _, _ = POP.client_data(1)
    other = SyntheticPopulation(0.5, 0.5, seed=4, max_samples=200, eval_clients=1).client_data(0)[0]
    assert x0.shape[1] == 60 and not torch.equal(x0[:5], x1[:5]) and not torch.equal(x0[:5], other[:5])
    for k in range(20):
        x, y, tx, _ = POP.client_data(k)
        n = x.shape[0] + tx.shape[0]
        assert 50 <= n <= 200 and x.shape[0] == int(0.9 * n)
        assert y.dtype == torch.long and int(y.min()) >= 0 and int(y.max()) < 10
    assert t0.shape[0] > 0 and y0.numel() == x0.shape[0]


def test_the_input_covariance_is_j_to_the_minus_1_2() -> None:
    """x ~ N(v, Σ) with Σⱼⱼ = j^{−1.2}: within one client, coordinate 1's variance is ~1 and coordinate 60's
    ~60^{−1.2} ≈ 0.0074 (a generator with identity covariance — the mutant — gives ~1 for both)."""
    pop = SyntheticPopulation(0.0, 0.0, seed=1, max_samples=100_000, eval_clients=1)
    big = next(k for k in range(200) if pop.client_data(k)[0].shape[0] > 2000)
    x = pop.client_data(big)[0].double()
    var = x.var(dim=0)
    n = x.shape[0]
    tol = 6 * math.sqrt(2 / (n - 1))  # the sample variance's relative standard error, 6 σ
    assert abs(float(var[0]) - 1.0) < tol
    assert abs(float(var[59]) / 60 ** -1.2 - 1.0) < tol


# --- sampling and memory ----------------------------------------------------------------------------------------


def _inclusion(sampler: Any, n: int = 10, c: int = 3, draws: int = 4000) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    counts = torch.zeros(n)
    for _ in range(draws):
        ids = sampler(n, c, g)
        assert ids.numel() == c and ids.unique().numel() == c and bool((ids[1:] > ids[:-1]).all())
        counts[ids] += 1
    return counts / draws


def _off_by_one(n: int, c: int, g: torch.Generator) -> torch.Tensor:
    u = torch.rand(c, generator=g, dtype=torch.float64).tolist()
    chosen: set[int] = set()
    for i, j in enumerate(range(n - c, n)):
        t = min(int(u[i] * j), j)  # the mutant: t in 0 … j − 1, so j enters only on a collision
        chosen.add(j if t in chosen else t)
    return torch.tensor(sorted(chosen))


@pytest.mark.parametrize(("sampler", "uniform"), [(sample_clients, True), (_off_by_one, False)])
def test_floyd_sampling_is_uniform(sampler: Any, uniform: bool) -> None:
    """Every client is sampled with probability C / N (5 σ of the binomial proportion over 4,000 draws); the
    off-by-one mutant of Floyd's algorithm is not."""
    p = _inclusion(sampler)
    sigma = math.sqrt(0.3 * 0.7 / 4000)
    assert bool(((p - 0.3).abs() < 5 * sigma).all()) is uniform


def test_a_run_holds_only_the_sampled_clients() -> None:
    """Memory independence, structurally: over 10¹² clients (an O(N) array would need terabytes and fail) the
    rounds run, and after each one the data hold at most C clients; every tensor the run's data hold is O(C)."""
    exp = _experiment(10**12, c=10, rounds=3)
    rows = run(exp)
    assert rows[-1]["round"] == 3
    data = exp.data
    assert isinstance(data, PopulationData) and data.held <= 10
    for value in vars(data).values():
        if isinstance(value, torch.Tensor):
            assert value.shape[0] <= 10 * 200


@pytest.mark.parametrize("extra", [1, -1])
def test_a_client_with_more_inputs_than_labels_is_one_line(monkeypatch: pytest.MonkeyPatch, extra: int) -> None:
    """The held clients' inputs are one flat tensor sliced by their label counts: a client whose inputs and labels
    differ in number (a LEAF writer's 784 pixel pairs were 2 images a sample) would shift every later client's
    images onto another's labels. Refused, naming the client, before anything is sliced."""
    pop = SyntheticPopulation(0.5, 0.5, seed=3, max_samples=200, eval_clients=4)
    real = pop.clients

    def skewed(ids: Any) -> list[tuple[torch.Tensor, torch.Tensor]]:
        out = real(ids)
        x, y = out[0]
        out[0] = (torch.cat([x, x[:1]]) if extra > 0 else x, y if extra > 0 else y[:, None])
        return out

    monkeypatch.setattr(pop, "clients", skewed)
    with pytest.raises(ConfigError, match="one label per input") as info:
        PopulationData(pop, 100).sizes(torch.tensor([3, 7]))
    assert info.value.parameter == "dataset" and "client 3" in str(info.value)


def test_the_permutation_sampler_mutant_cannot_run_a_trillion_clients(monkeypatch: pytest.MonkeyPatch) -> None:
    """The mutant: the round sampled by a permutation of all N clients (``randperm(N)``) — O(N) memory, which at
    10¹² clients is refused by the allocator."""
    import phalanx.training.algorithms.fedavg as fedavg

    monkeypatch.setattr(fedavg, "sample_clients", lambda n, c, g: torch.randperm(n, generator=g)[:c].sort().values)
    with pytest.raises(RuntimeError):
        run(_experiment(10**12, c=10, rounds=1))


def test_a_round_uses_only_its_clients_data() -> None:
    """The batches of a round are drawn from the sampled clients' own samples: each client's batch rows are rows of
    its data (a sampler that mixed clients' data up would not be)."""
    data = PopulationData(POP, 10**6)
    ids = torch.tensor([5, 77, 900_000])
    xb, yb = data.batches_of(ids, 8, torch.Generator().manual_seed(0))
    for row, k in enumerate(ids.tolist()):
        x, y = POP.clients([k])[0]
        for s in range(8):
            hit = (x == xb[row, s]).all(dim=1)
            assert bool(hit.any()) and int(y[hit][0]) == int(yb[row, s])


def test_the_same_seed_gives_the_same_run_and_a_data_attack_runs() -> None:
    """Two runs of one experiment over 10⁶ clients give the same rows (the sample, the clients' data, the batches);
    a data attack (label flipping) poisons the sampled Byzantine clients' batches as on a split data set."""
    assert run(_experiment(10**6, rounds=2)) == run(_experiment(10**6, rounds=2))
    rows = run(_experiment(10**6, rounds=2, attack="labelflip"))
    assert rows[-1]["round"] == 2 and math.isfinite(rows[-1]["test_loss"])


# --- Byzantine count and f --------------------------------------------------------------------------------------


def test_the_tail_is_the_hypergeometric_one() -> None:
    """P(X > f) against enumeration of every subset (N = 9, B = 3, C = 4), and the value docs/federated.md quotes
    (N = 100, C = 10, B = 10: P(X ≥ 3) = 0.060)."""
    n, b, c = 9, 3, 4
    subsets = list(itertools.combinations(range(n), c))
    for f in range(c + 1):
        brute = sum(sum(i >= n - b for i in s) > f for s in subsets) / len(subsets)
        assert tail(n, b, c, f) == pytest.approx(brute, abs=1e-12)
    assert sum(pmf(n, b, c)) == pytest.approx(1.0, abs=1e-12)
    assert round(tail(100, 10, 10, 2), 3) == 0.060


def test_f_for_is_the_smallest_f_within_delta() -> None:
    """f_for(N, B, C, δ) has P(X > f) ≤ δ and f − 1 does not (10⁶ clients, 10 % Byzantine, 100 a round, δ = 10⁻³)."""
    f = f_for(10**6, 10**5, 100, 1e-3)
    assert f == 20 and round(tail(10**6, 10**5, 100, 10), 2) == 0.42  # the numbers docs/federated.md quotes
    assert tail(10**6, 10**5, 100, f) <= 1e-3 < tail(10**6, 10**5, 100, f - 1)
    with pytest.raises(ConfigError, match="delta"):
        f_for(100, 10, 10, 1.0)


def test_the_realised_byzantine_count_is_recorded_every_round() -> None:
    """The stage's history is each round's number of sampled Byzantine clients — replayed here from the run's
    ``clients`` stream — and ``rounds_over_f`` counts the rounds with more than f (N = 1,000, 30 % Byzantine, 10 a
    round, f = 1: most rounds are beyond f and recorded as such)."""
    exp = _experiment(1000, byzantine=300, c=10, f=1, rounds=12)
    rows = run(exp)
    stage = exp.stage(ByzantineCount)
    assert stage is not None
    g = generator(exp.seed, "clients")
    replay = [int((sample_clients(1000, 10, g) >= 700).sum()) for _ in range(12)]
    assert stage.history == replay
    assert rows[-1]["rounds_over_f"] == sum(x > 1 for x in replay) > 0
    assert rows[-1]["byzantine_sampled_max"] == max(replay)
    assert rows[-1]["p_over_f"] == pytest.approx(tail(1000, 300, 10, 1))


def test_a_record_that_ignores_f_is_caught() -> None:
    """The mutant: ``rounds_over_f`` counting rounds with any Byzantine client (f ignored) differs from the record
    for f = 2 on the same draws."""
    exp = _experiment(1000, byzantine=300, c=10, f=2, rounds=12)
    rows = run(exp)
    stage = exp.stage(ByzantineCount)
    assert stage is not None
    assert rows[-1]["rounds_over_f"] == sum(x > 2 for x in stage.history)
    assert rows[-1]["rounds_over_f"] != sum(x > 0 for x in stage.history)


def test_the_record_survives_a_checkpoint_and_refuses_a_forged_one() -> None:
    stage = ByzantineCount(1000, 300, 10)
    stage.history, stage.f = [0, 3, 1], 1
    copy = ByzantineCount(1000, 300, 10)
    copy.f = 1
    copy.load_state_dict(stage.state_dict())
    assert copy.history == [0, 3, 1] and copy.over == 1
    for forged in ({"history": torch.tensor([0, 11])}, {"history": torch.tensor([-1])},
                   {"history": torch.tensor([0.5])}, {"history": torch.zeros(2, 2, dtype=torch.long)},
                   {"history": torch.tensor([1]), "extra": torch.tensor([1])}):
        with pytest.raises(ConfigError, match=r"stage\.byzantine_count"):
            copy.load_state_dict(forged)


# --- every rule, the config, refusals ---------------------------------------------------------------------------

RULES = [r for r in aggregators.names("rule")]


@pytest.mark.parametrize("rule", RULES)
def test_every_robust_rule_runs_over_a_million_clients(rule: str) -> None:
    """Every rule of the registry aggregates a population round (10⁶ clients, 12 a round, f = 2)."""
    try:
        exp = _experiment(10**6, rule=rule, f=2, c=12, rounds=1)
    except ConfigError as exc:  # a rule that needs more updates a round than 12 says so in one line
        pytest.skip(f"{rule}: {exc}")
    rows = run(exp)
    assert rows[-1]["round"] == 1 and math.isfinite(rows[-1]["test_loss"])


def test_a_config_runs_a_million_clients() -> None:
    cfg = make_config({"algorithm": "fedavg", "dataset": "synthetic", "dataset_params": {"eval_clients": 3,
                       "max_samples": 100}, "model": "logreg", "workers": 1_000_000, "clients_per_round": 10,
                       "byzantine": 100_000, "f": 2, "aggregator": "cwtm", "attack": "alie", "rounds": 2,
                       "eval_every": 2, "local_steps": 1, "batch_size": 5})
    rows = run(from_config(cfg))
    assert rows[-1]["workers"] == 1_000_000 and "rounds_over_f" in rows[-1]


@pytest.mark.parametrize(("change", "parameter"), [
    ({"clients_per_round": 2_000_000}, "clients_per_round"),
    ({"byzantine": 1_000_000}, "byzantine"),
    ({"workers": 20_000_000}, "workers"),
    ({"dataset_params": {"alpha": -1.0}}, "dataset_params.alpha"),
    ({"dataset_params": {"max_samples": 10**9}}, "dataset_params.max_samples"),
    ({"partition": "dirichlet"}, "partition"),
    ({"algorithm": "dsgd", "clients_per_round": None}, "algorithm"),
])
def test_bad_parameters_are_one_line(change: dict[str, Any], parameter: str) -> None:
    """Population below the round's sample, a Byzantine fraction B/N outside [0, 1), a bad generator parameter, a
    split of a population, a round that keeps state per worker: one typed line naming the parameter."""
    base = {"algorithm": "fedavg", "dataset": "synthetic", "dataset_params": {"eval_clients": 2}, "model": "logreg",
            "workers": 1_000_000, "clients_per_round": 10, "byzantine": 10, "f": 1, "aggregator": "cwtm",
            "rounds": 1}
    with pytest.raises(ConfigError) as info:
        from_config(make_config({**base, **change}))
    assert info.value.parameter == parameter and "\n" not in str(info.value)


def test_an_algorithm_that_keeps_state_per_worker_is_refused() -> None:
    model = models.make("logreg", POP.input_shape, POP.num_classes)
    with pytest.raises(ConfigError, match="algorithm"):
        Experiment(model=model, dataset=POP, workers=10**6, rule=aggregators.make("mean", f=0), algorithm=DSGD())


# --- LEAF, lazily -----------------------------------------------------------------------------------------------


def _writer(rng: np.random.Generator, n: int) -> dict[str, list[Any]]:
    return {"x": (rng.integers(0, 256, (n, 784)) / 255.0).tolist(), "y": rng.integers(0, 62, n).tolist()}


def _leaf_tree(root: Path, files: list[dict[str, int]], bad: dict[str, Any] | None = None) -> Path:
    """A LEAF FEMNIST tree in LEAF's own format: train files of the given writers and sizes, a test file."""
    rng = np.random.default_rng(0)
    for split in ("train", "test"):
        (root / split).mkdir(parents=True)
    for i, writers in enumerate(files):
        data = {u: _writer(rng, n) for u, n in writers.items()}
        if bad is not None and i == 0:
            data[next(iter(writers))] = bad
        doc = {"users": list(writers), "num_samples": [len(d["y"]) for d in data.values()], "user_data": data}
        (root / "train" / f"all_data_{i}_niid_0_keep_0_train_9.json").write_text(json.dumps(doc))
    test_users = {u: 2 for w in files for u in w}
    test = {u: _writer(rng, n) for u, n in test_users.items()}
    doc = {"users": list(test), "num_samples": [2] * len(test), "user_data": test}
    (root / "test" / "all_data_0_niid_0_keep_0_test_9.json").write_text(json.dumps(doc))
    return root


def test_the_leaf_population_reads_writers_lazily(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Writers in file order are clients 0, 1, …; a request parses only the files of the clients it asks for, once
    each; a writer's samples are exactly its entries of the file (pixels round(255·x), labels)."""
    files = [{"f0000_14": 5, "f0001_41": 3}, {"f0002_22": 4}, {"f0003_07": 6, "f0004_33": 2}]
    folder = _leaf_tree(tmp_path, files)
    pop = LeafPopulation(folder, eval_clients=2)
    assert pop.size == 5 and pop.test_y.numel() == 2 * len(pop.eval_ids(2))
    parsed: list[str] = []
    real = leaf.read_leaf_bytes  # each file read once (then hashed against the opening's digest, and parsed)
    monkeypatch.setattr(leaf, "read_leaf_bytes", lambda p: parsed.append(Path(p).name) or real(p))
    got = pop.clients([4, 3])
    assert len(parsed) == 1 and parsed[0].startswith("all_data_2")
    doc = json.loads((folder / "train" / "all_data_2_niid_0_keep_0_train_9.json").read_text())
    want = doc["user_data"]["f0004_33"]
    pixels = torch.tensor(np.rint(np.asarray(want["x"]) * 255)).long()
    back = torch.round((got[0][0].double().reshape(2, 784) * pop.std[0] + pop.mean[0]) * 255).long()
    assert torch.equal(back, pixels) and got[0][1].tolist() == want["y"] and got[1][1].numel() == 6


def test_a_leaf_population_trains(tmp_path: Path) -> None:
    """The lazy FEMNIST population trains in Python and from a config (``femnist-population`` with ``path``); a run
    of more clients than it has writers is one line naming ``workers``."""
    folder = _leaf_tree(tmp_path, [{f"w{i:03d}": 3 + i % 4 for i in range(j * 10, j * 10 + 10)} for j in range(3)])
    pop = LeafPopulation(folder, eval_clients=3)
    exp = _experiment(30, byzantine=3, c=6, f=1, rounds=2, pop=pop)
    assert run(exp)[-1]["round"] == 2
    with pytest.raises(ConfigError, match="workers"):
        _experiment(31, byzantine=3, c=6, f=1, rounds=2, pop=pop)
    cfg = {"algorithm": "fedavg", "dataset": "femnist-population", "dataset_params": {"path": str(folder),
           "eval_clients": 3}, "model": "logreg", "workers": 30, "clients_per_round": 6, "byzantine": 3, "f": 1,
           "aggregator": "cwtm", "rounds": 2, "eval_every": 2, "local_steps": 1, "batch_size": 2}
    assert run(from_config(make_config(cfg)))[-1]["workers"] == 30
    with pytest.raises(ConfigError) as info:
        from_config(make_config({**cfg, "workers": 31}))
    assert info.value.parameter == "workers"


@pytest.mark.parametrize("bad", [{"x": [], "y": []}, {"x": [[2.0] * 784], "y": [0]}, {"x": [[0.0] * 784], "y": [99]}])
def test_a_hostile_leaf_file_is_refused_when_the_population_opens(tmp_path: Path, bad: dict[str, Any]) -> None:
    """A writer without samples, a pixel outside [0, 1], a label outside 0..61: one line naming the file, at open,
    not in the round that samples the writer."""
    folder = _leaf_tree(tmp_path, [{"a": 2, "b": 2}, {"c": 2}], bad=bad)
    with pytest.raises(DataFormatError, match="all_data_0") as info:
        LeafPopulation(folder, eval_clients=1)
    assert "\n" not in str(info.value)


def test_the_scale_benchmark_prints_both_ratios() -> None:
    """benchmarks/scale.py in miniature (each population in its own interpreter): both ratios printed."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parent.parent
    out = subprocess.run([sys.executable, str(root / "benchmarks" / "scale.py"), "--populations", "100,100000",
                          "--per-round", "10", "--rounds", "2", "--warm-up", "1", "--local-steps", "1"],
                         capture_output=True, text=True, check=True, timeout=600).stdout
    assert "peak RSS  100,000 ÷ 100:" in out and "round time 100,000 ÷ 100:" in out


def test_per_client_state_and_the_torchrun_engine_are_refused() -> None:
    """A FedBN model (a BatchNorm row per client: O(N)) and a torchrun client slot over a population are one line
    each, before a round runs."""

    class Images(SyntheticPopulation):  # the same clients, seen as 1×6×10 images, so a CNN builds on them
        def __init__(self) -> None:
            super().__init__(eval_clients=1)
            self.input_shape = (1, 6, 10)
            self.train_x = self.train_x.view(-1, 1, 6, 10)
            self.test_x = self.test_x.view(-1, 1, 6, 10)

    pop = Images()
    model = models.make("cnn", pop.input_shape, 10, channels=[2, 4], norm="fedbn")
    with pytest.raises(ConfigError, match="FedBN"):
        Experiment(model=model, dataset=pop, workers=10**6, rule=aggregators.make("cwtm", f=1),
                   algorithm=FedAvg(clients_per_round=10))
    exp = _experiment(10**6)
    with pytest.raises(ConfigError, match="torchrun"):
        exp.algorithm.one_worker(exp, 0, {}, None)


def test_the_recorded_count_is_the_number_of_attack_rows_each_round() -> None:
    """The record against what the attack was asked for: every round, the number of Byzantine rows the engine had
    the attack make equals the stage's count (0: no call). The test above replays the stage's own formula and could
    not see the engine disagree with it: a review's mutant (client N − B trained honestly, ``ids <= honest_n``)
    passed every test here while its runs attacked with one client fewer than they recorded. N = 20, B = 10, C = 10:
    client 10 is in about half the rounds."""
    exp = _experiment(20, byzantine=10, c=10, f=4, rounds=12)
    asked: dict[int, int] = {}
    inner = exp.attack
    assert isinstance(inner, attacks.Attack)

    class Counting(type(inner)):  # type: ignore[misc]
        def __call__(self, ctx: Any) -> torch.Tensor:
            asked[int(ctx.round)] = asked.get(int(ctx.round), 0) + int(ctx.n_byzantine)
            return inner(ctx)

    counting = Counting.__new__(Counting)
    counting.__dict__.update(inner.__dict__)
    exp.attack = counting
    run(exp)
    stage = exp.stage(ByzantineCount)
    assert stage is not None and len(stage.history) == 12
    assert [asked.get(t, 0) for t in range(12)] == stage.history
    assert 0 < sum(stage.history) and any(0 < x < 10 for x in stage.history)
