"""A new built-in rule, attack or round algorithm is its one file (and its test), as a stage is: dropped into its
package's directory it is found, registered and usable by name, and of the completeness checks only the catalogue's
asks for something more — its one declared entry (docs/design.md, "To add …").

The files go into a copy of the source tree (``src/phalanx`` copied to a temporary directory, the worktree left
alone), and a fresh interpreter imports Phalanx from there, as a checkout with the new file would.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from phalanx import plugins

ROOT = Path(__file__).resolve().parent.parent

RULE = '''"""A new built-in rule for the test: the mean of the n - f rows of smallest norm."""

from typing import ClassVar

import torch
from torch import Tensor

from phalanx.aggregators.base import Aggregator
from phalanx.aggregators.registry import register


@register
class SmallNormMean(Aggregator):
    """Mean of the n - f rows of smallest Euclidean norm."""

    name: ClassVar[str] = "smallnormmean"
    reference: ClassVar[str] = "a test's new built-in rule"

    def _run(self, x: Tensor, want_contributions: bool, **context: object) -> tuple[Tensor, Tensor | None]:
        keep = torch.linalg.vector_norm(x, dim=1).argsort()[: x.shape[0] - self.f]
        return x[keep].mean(0), None
'''

ATTACK = '''"""A new built-in attack for the test: every Byzantine worker sends minus the honest mean."""

from typing import ClassVar

from torch import Tensor

from phalanx.attacks.base import Attack, AttackContext
from phalanx.attacks.registry import register


@register
class NegatedMean(Attack):
    """y_i = -mean(honest): the same row from every Byzantine worker, a function of the honest mean alone (solo),
    for the test that a new built-in attack is its one file and needs no list of names edited anywhere else."""

    name: ClassVar[str] = "negatedmean"
    reference: ClassVar[str] = "a test's new built-in attack"
    solo = True

    def _run(self, ctx: AttackContext) -> Tensor:
        return (-ctx.honest.mean(dim=0)).expand(ctx.n_byzantine, -1).clone()
'''

ALGORITHM = '''"""A new built-in round algorithm for the test: federated averaging under another name."""

from dataclasses import dataclass

from phalanx.training.algorithms.base import register
from phalanx.training.algorithms.fedavg import FedAvg


@register
@dataclass(frozen=True)
class FedAvgAgain(FedAvg):
    """Federated averaging, registered under a name of its own."""

    name = "fedavg-again"
'''

SCRIPT = '''
import json, sys
import torch
from phalanx import aggregators, attacks
from phalanx.training.algorithms import base, builtin
import test_attacks_base, test_bench_floors, test_catalogue
from phalanx.catalogue import AGGREGATORS

out = {}
out["rule_file"] = aggregators.get_class("smallnormmean").__module__
out["rule"] = aggregators.make("smallnormmean", f=1)(torch.arange(12.0).reshape(4, 3)).tolist()
out["rule_listed"] = "smallnormmean" in aggregators.names("rule")
ctx = attacks.AttackContext(torch.ones(4, 3), n_byzantine=2, f=1, aggregator=None, generator=torch.Generator())
out["attack"] = attacks.make("negatedmean")(ctx).tolist()
out["attack_listed"] = "negatedmean" in attacks.names("vector")
out["algorithm"] = builtin.algorithm_class("fedavg-again").__qualname__
out["algorithm_listed"] = "fedavg-again" in base.names()
test_attacks_base.test_names_and_kinds()
test_attacks_base.test_params_round_trip_and_describe("negatedmean")
out["floor"] = test_bench_floors._bench_floors.FLOOR_KINDS["smallnormmean"]
test_bench_floors.test_every_registered_rule_has_a_floor_kind()
out["catalogue"] = (test_catalogue.rule_mismatches(AGGREGATORS) + test_catalogue.attack_mismatches()
                    + test_catalogue.algorithm_mismatches())
print(json.dumps(out))
'''


@pytest.fixture(scope="module")
def checkout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of ``src/`` with a new rule, attack and algorithm file in their packages, and nothing else edited."""
    src = tmp_path_factory.mktemp("checkout") / "src"
    shutil.copytree(ROOT / "src" / "phalanx", src / "phalanx", ignore=shutil.ignore_patterns("__pycache__"))
    (src / "phalanx" / "aggregators" / "smallnormmean.py").write_text(RULE)
    (src / "phalanx" / "attacks" / "negatedmean.py").write_text(ATTACK)
    (src / "phalanx" / "training" / "algorithms" / "fedavg_again.py").write_text(ALGORITHM)
    return src


def _run(src: Path) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(src), str(ROOT / "tests")])}
    done = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    out: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return out


def test_a_new_rule_attack_and_algorithm_file_is_all_it_takes(checkout: Path) -> None:
    """Found from the copy, usable by name, listed by names(); the attack and floor checks pass as they are (they
    read the classes' declarations); the catalogue's check asks for each one's declared entry, and only that."""
    out = _run(checkout)
    assert out["rule_file"] == "phalanx.aggregators.smallnormmean"
    assert out["rule"] == [3.0, 4.0, 5.0] and out["rule_listed"]
    assert out["attack"] == [[-1.0] * 3] * 2 and out["attack_listed"]
    assert out["algorithm"] == "FedAvgAgain" and out["algorithm_listed"]
    assert out["floor"] == "pass"
    assert out["catalogue"] == ["smallnormmean: registered, not declared", "negatedmean: registered, not declared",
                                "fedavg-again: registered, not declared"]


def test_import_modules_imports_every_public_module_in_name_order(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The discovery itself: public modules in name order, then subpackages' (a module of ``_`` left out)."""
    pkg = tmp_path / "discpkg"
    (pkg / "sub").mkdir(parents=True)
    for rel in ("__init__.py", "b.py", "a.py", "_private.py", "sub/__init__.py", "sub/c.py"):
        (pkg / rel).write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    import discpkg  # type: ignore[import-not-found]

    found = [m.__name__ for m in plugins.import_modules("discpkg", discpkg.__path__)]
    assert found == ["discpkg.a", "discpkg.b", "discpkg.sub", "discpkg.sub.c"]
    assert "discpkg._private" not in sys.modules
