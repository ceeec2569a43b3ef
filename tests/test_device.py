"""The ``device`` key (issue 15, item 3): validation, resolution, the manifest's record, CPU runs unchanged bit for
bit, checkpoints as CPU tensors, Slurm's ``--gpus-per-task``, the GPU benchmark's smoke run.

Without a GPU, the CUDA path is checked on an *emulated* CUDA device (:class:`FakeCuda`): the run is built with
``device = "cuda"`` and computes on the CPU, but every tensor that would live on CUDA is tagged (by its storage) and
reports ``cuda:0`` as its ``.device``; every torch call of the run is checked for mixing tagged and untagged
tensors (what CUDA refuses). The tests marked ``cuda`` run real CUDA and are skipped where it is not available.
"""

from __future__ import annotations

import json
import subprocess
import time
import traceback
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors import safe_open
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten

import phalanx
from _interrupt import train_interrupted
from _scripts import load_script
from phalanx import aggregators, data, models
from phalanx.errors import ConfigError
from phalanx.executor_cli import ExecutorChoice
from phalanx.experiments import grid, make_config, store, train
from phalanx.experiments.build import check_points, from_config, resolve_device
from phalanx.experiments.slurm import SlurmOptions
from phalanx.studies.tension import Cell, config_for, preset
from phalanx.training import Experiment, Loop, devices
from phalanx.training.algorithms.gossip import Gossip

_PACKAGE_DIR = str(Path(phalanx.__file__).parent) + "/"  # as the frames name it (no symlink resolved)


def _ours(filename: str) -> bool:
    """Whether a stack frame is in Phalanx's own package — by the imported package's directory, so that a clone (or
    a venv) in a folder named ``phalanx`` does not make torch's frames look like ours."""
    return filename.startswith(_PACKAGE_DIR)


def test_frames_are_ours_by_the_package_directory_not_by_a_folder_name() -> None:
    """A venv inside a clone named ``phalanx``: torch's frames there are not Phalanx's (issue 38's red suite)."""
    assert _ours(str(Path(phalanx.aggregators.__file__)))
    clone = "/home/u/phalanx/.venv/lib/python3.11/site-packages/torch/nn/modules/module.py"
    assert not _ours(clone) and not _ours(_PACKAGE_DIR.rstrip("/") + "-other/x.py")

CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
SMALL: dict[str, Any] = {
    "dataset": "digits", "model": "mlp", "workers": 6, "byzantine": 1, "f": 1, "aggregator": "cwtm",
    "attack": "alie", "rounds": 6, "batch_size": 8, "eval_every": 3, "checkpoint_every": 3, "seed": 3,
}
FEDBN: dict[str, Any] = {
    "dataset": "digits", "model": "cnn", "model_params": {"norm": "fedbn"}, "workers": 6, "byzantine": 1, "f": 1,
    "aggregator": "cwmed", "attack": "backdoor", "algorithm": "fedavg", "clients_per_round": 4, "local_epochs": 0.1,
    "rounds": 2, "batch_size": 4, "eval_every": 1, "checkpoint_every": 1, "seed": 2,
}


def _rows_text(rows: list[dict[str, Any]]) -> str:
    return json.dumps(rows, sort_keys=True)


# --- the key ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("spec", ["auto", "cpu", "cuda", "cuda:0", "cuda:3"])
def test_device_specs_are_accepted_on_any_machine(spec: str) -> None:
    """A config is validated where it is written (a Slurm login node): whether CUDA exists is not asked here."""
    assert make_config({**SMALL, "device": spec}).device == spec


@pytest.mark.parametrize("spec", ["gpu", "CUDA", "cuda:", "cuda:x", "cuda:-1", " cpu", "mps", "", "cuda:0:1", 3])
def test_bad_device_specs_are_one_line_errors(spec: Any) -> None:
    with pytest.raises(ConfigError) as exc:
        make_config({**SMALL, "device": spec})
    assert exc.value.parameter == "device" and "\n" not in str(exc.value)


@pytest.mark.parametrize(("extra", "says"), [
    ({"algorithm": "gossip", "graph": "complete", "momentum": 0.0}, "algorithm = 'gossip'"),
    ({"engine": "torchrun", "topology": "server"}, "topology = 'server'"),
    ({"engine": "torchrun", "topology": "serverless", "device": "cuda:1"}, "cuda:LOCAL_RANK"),
])
def test_device_relations(extra: dict[str, Any], says: str) -> None:
    with pytest.raises(ConfigError) as exc:
        make_config({**SMALL, "device": "cuda", **extra})
    assert exc.value.parameter == "device" and says in str(exc.value)
    auto = {**extra, "device": "auto"}
    assert make_config({**SMALL, **auto}).device == "auto"  # 'auto' falls back to the CPU where CUDA cannot be used


def test_torchrun_serverless_takes_cuda() -> None:
    assert make_config({**SMALL, "engine": "torchrun", "topology": "serverless", "device": "cuda"}).device == "cuda"


def test_device_is_not_part_of_a_runs_identity() -> None:
    """Where a run computes does not name it: finished CPU runs are reused by a grid that now says 'auto', and a run
    resumes on another device. The default stays out of the resolved config (run directories keep their names)."""
    plain = make_config(SMALL)
    ids = {grid.run_id(make_config({**SMALL, "device": d})) for d in ("cpu", "auto", "cuda", "cuda:1")}
    assert ids == {grid.run_id(plain)}
    assert "device" not in plain.model_dump() and "device" not in make_config({**SMALL, "device": "auto"}).identity()
    dumped = make_config({**SMALL, "device": "auto"}).model_dump(mode="json")
    assert dumped["device"] == "auto" and make_config(dumped).device == "auto"  # what a Slurm task receives


def test_paper_preset_asks_for_a_gpu_where_there_is_one() -> None:
    p = preset("paper")
    cfg = config_for(p, Cell("T4", p.max_f, 0.1, p.lrs[0], p.seeds[0]))
    assert cfg.device == "auto"
    assert grid.run_id(cfg) == grid.run_id(cfg.model_copy(update={"device": "cpu"}))
    q = preset("quick")
    assert config_for(q, Cell("T4", 1, 0.1, q.lrs[0], q.seeds[0])).device == "cpu"


# --- resolution -------------------------------------------------------------------------------------------------------


@pytest.fixture
def no_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(devices, "cuda_available", lambda: False)


@pytest.fixture
def two_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(devices, "cuda_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)


def test_cuda_without_cuda_is_refused_before_any_run(no_cuda: None, tmp_path: Path) -> None:
    assert devices.resolve("auto") == devices.CPU and devices.resolve("cpu") == devices.CPU
    cfg = make_config({**SMALL, "device": "cuda"})
    for call in (lambda: devices.resolve("cuda:0"), lambda: from_config(cfg), lambda: train(cfg, tmp_path / "r"),
                 lambda: check_points([make_config(SMALL), cfg])):
        with pytest.raises(ConfigError) as exc:
            call()
        assert exc.value.parameter == "device" and "without CUDA" in str(exc.value) and "\n" not in str(exc.value)
    assert not (tmp_path / "r").exists()
    check_points([cfg], here=False)  # a Slurm array's points: their nodes decide
    assert resolve_device(make_config({**SMALL, "device": "auto"})) == devices.CPU


def test_cuda_indices(two_gpus: None) -> None:
    assert devices.resolve("cuda") == torch.device("cuda", 1)  # the current device
    assert devices.resolve("cuda:0") == torch.device("cuda", 0)
    assert devices.resolve(torch.device("cuda", 0)) == torch.device("cuda", 0)
    assert devices.resolve("cuda", local_rank=0) == torch.device("cuda", 0)
    for spec, rank, says in (("cuda:2", None, "cuda:0 … cuda:1"), ("cuda", 5, "LOCAL_RANK 5")):
        with pytest.raises(ConfigError, match=says):
            devices.resolve(spec, local_rank=rank)
    with pytest.raises(ConfigError):
        devices.resolve(torch.device("meta"))
    assert resolve_device(make_config({**SMALL, "device": "auto"})) == torch.device("cuda", 1)
    gossip = {**SMALL, "algorithm": "gossip", "graph": "complete", "momentum": 0.0, "device": "auto"}
    assert resolve_device(make_config(gossip)) == devices.CPU
    fed_ps = {**SMALL, "algorithm": "fedavg", "engine": "torchrun", "device": "auto"}
    assert resolve_device(make_config(fed_ps)) == devices.CPU  # the server topology: CPU bytes through the store
    serverless = make_config({**SMALL, "engine": "torchrun", "topology": "serverless", "device": "cuda"})
    assert resolve_device(serverless, local_rank=0) == torch.device("cuda", 0)


def test_experiment_refuses_a_gpu_for_decentralized_rounds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(devices, "resolve", lambda spec, **_: devices.CPU if spec == "cpu" else torch.device("cuda", 0))
    ds = data.load("digits")
    from phalanx.decentralized import topology

    def build(device: str) -> Experiment:
        return Experiment(model=models.make("logreg", ds.input_shape, ds.num_classes), dataset=ds, workers=4,
                          rule=aggregators.make("mean", f=0), algorithm=Gossip(graph=topology.make("complete", 4)),
                          device=device)

    with pytest.raises(ConfigError, match="decentralized rounds run on the CPU"):
        build("cuda")
    assert build("auto").device == devices.CPU


def test_cli_header_and_error(
    no_cuda: None, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``phalanx run`` says where its runs train; a device this machine lacks is one line, exit 2, nothing run."""
    from typer.testing import CliRunner

    from phalanx import cli

    base = ["run", "--set", "rounds=2", "--set", "workers=5", "--set", "eval_every=2", "--set", "aggregator=mean",
            "--set", "f=0", "--set", "byzantine=0", "--set", "attack=none", "--set", "seed=0"]
    res = CliRunner().invoke(cli.app, [*base, "--set", "device=auto", "--out", str(tmp_path / "a")])
    assert res.exit_code == 0, res.output
    assert "1 run(s) →" in res.output and " on cpu" in res.output
    monkeypatch.setattr("sys.argv", ["phalanx", *base, "--set", "device=cuda", "--out", str(tmp_path / "b")])
    with pytest.raises(SystemExit) as exc:
        cli.main()
    printed = capsys.readouterr().out
    assert exc.value.code == 2 and "device='cuda' is invalid" in printed and "Traceback" not in printed
    assert not (tmp_path / "b").exists() or not any((tmp_path / "b").iterdir())  # nothing ran


# --- runs on the CPU --------------------------------------------------------------------------------------------------


def test_cpu_device_is_the_default_bit_for_bit(no_cuda: None, tmp_path: Path) -> None:
    rows = {}
    for spec in (None, "cpu", "auto"):
        cfg = make_config(SMALL if spec is None else {**SMALL, "device": spec})
        rows[spec] = train(cfg, tmp_path / str(spec))
    assert _rows_text(rows[None]) == _rows_text(rows["cpu"]) == _rows_text(rows["auto"])
    thetas = [store.load_checkpoint(tmp_path / str(s)) for s in (None, "cpu", "auto")]
    assert all(t is not None and torch.equal(t.state.theta, thetas[0].state.theta) for t in thetas)  # type: ignore


def test_manifest_records_the_device_and_checkpoints_hold_cpu_tensors(tmp_path: Path) -> None:
    train(make_config({**SMALL, "device": "cpu"}), tmp_path / "r")
    manifest = json.loads((tmp_path / "r" / "manifest.json").read_text())
    assert manifest["device"] == "cpu" and "gpu" not in manifest and "resumed_on" not in manifest
    assert "device" not in json.loads((tmp_path / "r" / "config.json").read_text())
    with safe_open(str(tmp_path / "r" / "checkpoint.safetensors"), framework="pt") as fh:
        assert all(fh.get_tensor(k).device == devices.CPU for k in fh.keys())


def test_a_resume_on_another_device_is_recorded(tmp_path: Path) -> None:
    d = tmp_path / "r"
    gpu = {"device": "cuda:0", "gpu": "Some GPU"}
    store.prepare_run_dir(d, {"a": 1}, 0, "", gpu)
    assert not store.note_device(d, gpu, 0)
    assert store.note_device(d, {"device": "cpu"}, 3) and not store.note_device(d, {"device": "cpu"}, 4)
    assert store.note_device(d, gpu, 6)
    manifest = json.loads((d / store.MANIFEST).read_text())
    assert (manifest["device"], manifest["gpu"]) == ("cuda:0", "Some GPU")
    assert manifest["resumed_on"] == [{"round": 3, "device": "cpu"}, {"round": 6, **gpu}]
    store.finish_run(d, [])
    assert not store.note_device(d, {"device": "cpu"}, 9)  # a finished (maybe signed) run is left alone
    old = tmp_path / "old"  # written before devices were recorded: it trained on the CPU
    store.prepare_run_dir(old, {"a": 1}, 0, "")
    manifest = json.loads((old / store.MANIFEST).read_text())
    manifest.pop("device")
    (old / store.MANIFEST).write_text(json.dumps(manifest))
    assert not store.note_device(old, {"device": "cpu"}, 2) and store.note_device(old, gpu, 2)


# --- Slurm ------------------------------------------------------------------------------------------------------------


def test_gpus_per_task_reaches_sbatch(tmp_path: Path) -> None:
    submitit = pytest.importorskip("submitit")
    opts = SlurmOptions.from_mapping(ExecutorChoice(executor="slurm", gpus_per_task=1).slurm_settings({"time": 30}))
    params = opts.submitit_parameters("phalanx-x")
    assert params["gpus_per_task"] == 1
    script = submitit.slurm.slurm._make_sbatch_string(command="true", folder=str(tmp_path), **params)
    assert "#SBATCH --gpus-per-task=1" in script.splitlines()
    assert "gpus_per_task" not in SlurmOptions().submitit_parameters("x")  # none unless asked
    assert SlurmOptions.from_mapping({"gpus_per_task": 2}).gpus_per_task == 2  # the [slurm] table
    for bad in (0, "one", True):
        with pytest.raises(ConfigError, match=r"slurm\.gpus_per_task"):
            SlurmOptions.from_mapping({"gpus_per_task": bad})
    with pytest.raises(ConfigError, match="--executor"):
        ExecutorChoice(executor="local", gpus_per_task=1).make(1)


def test_gpus_per_task_flag() -> None:
    from typer.testing import CliRunner

    from phalanx import cli

    res = CliRunner().invoke(cli.app, ["sweep", "--help"], terminal_width=200)
    assert res.exit_code == 0 and "--gpus-per-task" in res.output


# --- the benchmark ----------------------------------------------------------------------------------------------------


def test_gpu_benchmark_runs_on_the_cpu(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bench = load_script("benchmarks/gpu.py", "phalanx_bench_gpu")
    out = tmp_path / "gpu.json"
    assert bench.main(["--device", "cpu", "--quick", "--workload", "resnet20", "mlp1000", "--rounds", "2", "--warmup",
                       "0", "--json", str(out)]) == 0  # rules and population: tests/test_gpu_benchmark.py
    text = capsys.readouterr().out
    assert bench.TITLE in text and "| ResNet-20 (GroupNorm), n = 4" in text and "| MLP 64-100-10, n = 20" in text
    recs = json.loads(out.read_text())["records"]
    assert [(r["workload"], r["device"]) for r in recs] == [("resnet20", "cpu"), ("mlp1000", "cpu")]
    assert all(r["rounds_per_s"] > 0 and len(r["times_s"]) == 2 for r in recs)
    made = [{**r, "device": "cuda:0", "rounds_per_s": 10 * r["rounds_per_s"]} for r in recs]
    assert bench.ratio_rows(recs + made) == pytest.approx({"resnet20": 10.0, "mlp1000": 10.0})
    full = {w.name: w.config for w in bench.workloads(quick=False)}
    assert (full["resnet20"]["model"], full["resnet20"]["workers"], full["resnet20"]["batch_size"]) == \
        ("resnet20", 16, 16)
    assert (full["mlp1000"]["workers"], full["mlp1000"]["model_params"]) == (1000, {"hidden": [100]})


# --- an emulated CUDA device ------------------------------------------------------------------------------------------


class FakeCuda(TorchFunctionMode):
    """CUDA emulated on the CPU (see the module's docstring). ``mixed`` counts, by operation and place in Phalanx,
    the calls that mixed tensors of the two devices (0-dimensional CPU tensors may mix, as on CUDA)."""

    DEVICE = torch.device("cuda", 0)

    def __init__(self) -> None:
        super().__init__()
        self.tagged: dict[int, int] = {}  # storage address → a weak reference to that storage
        self.mixed: Counter[tuple[str, str]] = Counter()
        self._functorch = torch._C._functorch
        self._props = {name: torch._C.TensorBase.__dict__[name] for name in ("device", "is_cuda")}

    @staticmethod
    def supported() -> bool:
        """Whether this torch has the internals the emulation reads (functorch's unwrapping, weak references to
        storages, the tensor's ``device`` descriptor)."""
        f = getattr(torch._C, "_functorch", None)
        return (f is not None and hasattr(f, "get_unwrapped") and hasattr(f, "is_functorch_wrapped_tensor")
                and hasattr(torch.UntypedStorage, "_expired") and hasattr(torch.UntypedStorage, "_weak_ref")
                and "device" in torch._C.TensorBase.__dict__ and "is_cuda" in torch._C.TensorBase.__dict__)

    def _base(self, t: torch.Tensor) -> torch.Tensor:
        while self._functorch.is_functorch_wrapped_tensor(t):  # inside vmap / grad: the tensor underneath
            t = self._functorch.get_unwrapped(t)
        return t

    def on(self, t: torch.Tensor) -> bool | None:
        """Whether ``t`` is on the emulated device (None: it has no storage to tell)."""
        b = self._base(t)
        if b.numel() == 0 or b.is_meta:
            return None
        ref = self.tagged.get(b.untyped_storage().data_ptr())
        if ref is None or torch.UntypedStorage._expired(ref):  # never tagged, or freed and the memory reused
            return False
        return True

    def _mark(self, out: Any, cuda: bool) -> None:
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                b = self._base(t)
                if b.numel() and not b.is_meta:
                    ptr = b.untyped_storage().data_ptr()
                    if cuda:
                        self.tagged[ptr] = b.untyped_storage()._weak_ref()
                    else:
                        self.tagged.pop(ptr, None)

    def _where(self, what: str) -> None:
        frames = [f for f in traceback.extract_stack()[:-2] if _ours(f.filename)]
        self.mixed[(what, f"{frames[-1].filename[len(_PACKAGE_DIR):]}:{frames[-1].lineno}" if frames else "?")] += 1

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        owner = getattr(func, "__self__", None)
        if owner is self._props["device"]:
            return self.DEVICE if self.on(args[0]) else func(*args, **kwargs)
        if owner is self._props["is_cuda"]:
            return bool(self.on(args[0]))
        name = getattr(func, "__name__", "")
        if name in ("to", "cuda", "cpu") and args and isinstance(args[0], torch.Tensor):
            return self._move(name, args, kwargs)
        if name == "numpy" and self.on(args[0]):
            self._where("numpy() of a CUDA tensor")
        device = kwargs.get("device")
        if device is not None and torch.device(device).type == "cuda":  # a factory asked for the device
            out = func(*args, **{**kwargs, "device": "cpu"})
            self._mark(out, True)
            return out
        tensors = [a for a in tree_flatten((args, kwargs))[0] if isinstance(a, torch.Tensor)]
        states = [(self.on(t), self._base(t).dim()) for t in tensors]
        cuda = any(s is True for s, _ in states)
        if cuda and any(s is False and dim > 0 for s, dim in states):
            self._where(name)
        out = func(*args, **kwargs)
        self._mark(out, cuda)
        return out

    def _move(self, name: str, args: Any, kwargs: Any) -> torch.Tensor:
        t, target, dtype = args[0], None, None
        if name != "to":
            target = self.DEVICE if name == "cuda" else devices.CPU
        for a in (*args[1:], kwargs.get("device"), kwargs.get("dtype")):
            if isinstance(a, str | torch.device):
                target = torch.device(a)
            elif isinstance(a, torch.dtype):
                dtype = a
            elif isinstance(a, torch.Tensor):
                target, dtype = (self.DEVICE if self.on(a) else devices.CPU), a.dtype
        out = t.to(dtype) if dtype is not None else t
        was = bool(self.on(t))
        if target is None:
            self._mark(out, was)
            return out
        want = target.type == "cuda"
        if want != was:
            out = out.clone()  # a copy on the other device
        if want or out is not t:
            self._mark(out, want)
        return out

    def problems(self) -> dict[tuple[str, str], int]:
        """The mixed calls, without ``Module.to``'s own ``param.data = moved`` (the emulation's, not a CUDA one)."""
        return {k: n for k, n in self.mixed.items()
                if k[0] not in ("__set__", "_has_compatible_shallow_copy_type") or "experiment.py" not in k[1]}


@contextmanager
def fake_cuda() -> Iterator[FakeCuda]:
    """Inside, ``device = "cuda"`` (or ``"auto"``) is the emulated ``cuda:0``, named "Emulated GPU"; a checkpoint
    written from a tensor on it fails the test."""
    if not FakeCuda.supported():
        pytest.skip("the emulated CUDA device reads torch internals that this torch lacks")
    real = devices.resolve
    mode = FakeCuda()
    save = store.save_file

    def save_file(tensors: dict[str, torch.Tensor], *args: Any, **kwargs: Any) -> None:
        assert not any(mode.on(t) for t in tensors.values()), "a checkpoint written from CUDA tensors"
        save(tensors, *args, **kwargs)

    with pytest.MonkeyPatch.context() as m:
        m.setattr(devices, "resolve", lambda spec, **kw: FakeCuda.DEVICE
                  if str(spec).startswith("cuda") or str(spec) == "auto" else real(spec, **kw))
        m.setattr(torch.cuda, "get_device_name", lambda *a, **k: "Emulated GPU")
        m.setattr(store, "save_file", save_file)
        with mode:
            yield mode


def _same_rows(got: list[dict[str, Any]], want: list[dict[str, Any]]) -> None:
    """Equal rows; the Byzantine share to rounding (the coordinate-wise rules' C kernel runs on CPU tensors only, so
    the emulated device takes the ``torch.sort`` path, whose contributions are summed in another order)."""
    assert [r["round"] for r in got] == [r["round"] for r in want]
    for a, b in zip(got, want):
        assert {k: v for k, v in a.items() if k != "byz_share"} == {k: v for k, v in b.items() if k != "byz_share"}
        assert (a["byz_share"] is None) == (b["byz_share"] is None)
        if b["byz_share"] is not None:
            assert a["byz_share"] == pytest.approx(b["byz_share"], rel=1e-12, abs=1e-15)


@pytest.mark.parametrize("setting", [
    {**SMALL, "model": "logreg", "aggregator": "cc", "attack": "gaussian", "server_momentum": 0.5},
    FEDBN,
], ids=["dsgd", "fedavg-fedbn-backdoor"])
def test_emulated_cuda_run_keeps_its_tensors_on_the_device(setting: dict[str, Any], tmp_path: Path) -> None:
    """Model, data set, θ, batches, aggregation, attack and evaluation stay on the device (no call mixes devices),
    the draws are the CPU's (the same rows as the CPU run), checkpoints are written from CPU tensors, and the
    manifest names the GPU."""
    cfg = make_config({**setting, "device": "cuda"})
    with fake_cuda() as mode:
        exp = from_config(cfg)
        assert all(mode.on(t) for t in (exp.data.x, exp.data.y, exp.test_x, exp.problem.initial_theta()))
        assert not mode.on(exp.dataset.train_x)  # the data set itself is left as given
        rows = train(cfg, tmp_path / "r")
    assert mode.problems() == {}
    _same_rows(rows, train(make_config(setting)))
    manifest = json.loads((tmp_path / "r" / "manifest.json").read_text())
    assert (manifest["device"], manifest["gpu"]) == ("cuda:0", "Emulated GPU")


@pytest.mark.parametrize("first", ["cuda", "cpu"])
def test_emulated_checkpoint_resumes_on_the_other_device(first: str, tmp_path: Path) -> None:
    """Stopped after round 3 on one device, resumed on the other: the rows of an uninterrupted CPU run (centered
    clipping's centre and the server momentum travel in the checkpoint too)."""
    setting = {**SMALL, "aggregator": "cc", "server_momentum": 0.5}
    plain = make_config(setting)
    on_gpu = make_config({**setting, "device": "cuda"})
    d = tmp_path / "r"
    if first == "cuda":
        with fake_cuda() as mode:
            train_interrupted(on_gpu, d, 3)
        rows = train(plain, d)
    else:
        train_interrupted(plain, d, 3)
        with fake_cuda() as mode:
            rows = train(on_gpu, d)
    assert mode.problems() == {}
    assert _rows_text(rows) == _rows_text(train(plain))
    manifest = json.loads((d / "manifest.json").read_text())
    second = {"device": "cpu"} if first == "cuda" else {"device": "cuda:0", "gpu": "Emulated GPU"}
    assert manifest["device"] == ("cuda:0" if first == "cuda" else "cpu")
    assert manifest["resumed_on"] == [{"round": 3, **second}]


# --- real CUDA --------------------------------------------------------------------------------------------------------


def _theta_after(device: str, rounds: int) -> torch.Tensor:
    ds = data.load("digits")
    model = models.make("mlp", ds.input_shape, ds.num_classes, generator=torch.Generator().manual_seed(0))
    exp = Experiment(model=model, dataset=ds, workers=6, rule=aggregators.make("mean", f=0), rounds=rounds,
                     eval_every=rounds, seed=1, device=device)
    loop = Loop(exp, callbacks=[])
    loop.run()
    return loop.state.theta


@needs_cuda
def test_cuda_run_is_close_to_the_cpu_run() -> None:
    """The same rounds, the same draws: θ differs from the CPU's by float32 rounding only. Bound: every round sums
    products over a batch of B samples and up to 64 + 1 inputs per unit (the digits MLP), each sum off by at most
    about √(terms) ulps of its scale in either order; over R rounds of steps no larger than θ itself, R · 8 √(B·65)
    ulps of ‖θ‖∞."""
    rounds, batch = 5, 32
    cpu, gpu = _theta_after("cpu", rounds), _theta_after("cuda", rounds)
    assert gpu.is_cuda and cpu.device == devices.CPU
    eps = torch.finfo(torch.float32).eps
    tol = rounds * 8 * (batch * 65) ** 0.5 * eps * float(cpu.abs().max())
    torch.testing.assert_close(gpu.cpu(), cpu, rtol=0.0, atol=tol)


@needs_cuda
@pytest.mark.parametrize("first", ["cuda", "cpu"])
def test_cuda_checkpoint_resumes_across_devices(first: str, tmp_path: Path) -> None:
    """A run stopped after round 3 on one device resumes on the other; the checkpoint holds CPU tensors; the rows
    match the uninterrupted run of the device it finished on, up to float32 rounding of the first rounds."""
    setting = {**SMALL, "aggregator": "mean", "f": 0, "byzantine": 0, "attack": "none"}
    cfgs = {d: make_config({**setting, "device": d}) for d in ("cuda", "cpu")}
    second = "cpu" if first == "cuda" else "cuda"
    d = tmp_path / "r"
    train_interrupted(cfgs[first], d, 3)
    with safe_open(str(d / "checkpoint.safetensors"), framework="pt") as fh:
        assert all(fh.get_tensor(k).device == devices.CPU for k in fh.keys())
    rows = train(cfgs[second], d)
    whole = train(cfgs[second])
    assert [r["round"] for r in rows] == [r["round"] for r in whole]
    for a, b in zip(rows, whole):
        assert a["test_loss"] == pytest.approx(b["test_loss"], rel=1e-4)
    manifest = json.loads((d / "manifest.json").read_text())
    assert manifest["resumed_on"][0]["round"] == 3 and manifest["resumed_on"][0]["device"].startswith(second)


@needs_cuda
def test_cuda_federated_fedbn_run_finishes(tmp_path: Path) -> None:
    cfg = make_config({**FEDBN, "device": "cuda"})
    exp = from_config(cfg)
    assert exp.data.x.is_cuda and exp.problem.initial_theta().is_cuda
    rows = train(cfg, tmp_path / "r")
    assert rows[-1]["round"] == FEDBN["rounds"] and 0.0 <= rows[-1]["test_accuracy"] <= 1.0
    assert json.loads((tmp_path / "r" / "manifest.json").read_text())["gpu"] == torch.cuda.get_device_name(0)


@needs_cuda
def test_gpu_benchmark_on_cuda(capsys: pytest.CaptureFixture[str]) -> None:
    bench = load_script("benchmarks/gpu.py", "phalanx_bench_gpu")
    assert bench.main(["--device", "cuda", "cpu", "--quick", "--rounds", "2", "--warmup", "1"]) == 0
    assert "cuda:0" in capsys.readouterr().out


@pytest.mark.skipif(not CUDA or torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_cuda_serverless_ranks_compute_on_their_gpus(tmp_path: Path) -> None:
    """engine = torchrun, topology = serverless, device = cuda: rank r computes on cuda:r and NCCL all-gathers there;
    the run finishes, and its θ is the simulated engine's on the CPU up to float32 rounding."""
    from phalanx.distributed import launch
    from phalanx.distributed.env import free_port

    setting = {**SMALL, "workers": 2, "byzantine": 0, "f": 0, "aggregator": "mean", "attack": "none"}
    toml = tmp_path / "job.toml"
    toml.write_text("\n".join(f"{k} = {json.dumps(v)}" for k, v in {**setting, "topology": "serverless",
                                                                    "device": "cuda"}.items()) + "\n")
    with (tmp_path / "err.txt").open("wb") as fh:
        procs = launch.spawn(2, launch.worker_args(toml, [], tmp_path / "dist"), stderr=fh,
                             stdout=subprocess.DEVNULL, master_port=free_port())
        t0 = time.monotonic()
        code = launch.supervise(procs, grace_s=5.0, timeout_s=180.0, say=lambda s: None)
    assert code == 0, (tmp_path / "err.txt").read_text()[-3000:] + f" ({time.monotonic() - t0:.0f} s)"
    (run,) = (tmp_path / "dist").glob("*/checkpoint.safetensors")
    train(make_config(setting), tmp_path / "sim")
    with safe_open(str(run), framework="pt") as a, \
            safe_open(str(tmp_path / "sim" / "checkpoint.safetensors"), framework="pt") as b:
        torch.testing.assert_close(a.get_tensor("theta"), b.get_tensor("theta"), atol=1e-4, rtol=1e-4)
    assert json.loads((run.parent / "manifest.json").read_text())["device"] == "cuda:0"
