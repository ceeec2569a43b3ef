"""Byzantine attacks: what the Byzantine workers send (vector attacks) or train on (data attacks).

>>> import torch
>>> from phalanx import attacks
>>> ctx = attacks.AttackContext(torch.randn(8, 5), n_byzantine=2, f=2, aggregator=None,
...                             generator=torch.Generator().manual_seed(0))
>>> attacks.make("alie")(ctx).shape
torch.Size([2, 5])

:func:`make` builds an attack by name; :func:`names` lists them. Every attack carries its reference and threat
model (``describe()``). See docs/attacks.md.
"""

from phalanx.attacks.alie import ALIE, alie_z_max
from phalanx.attacks.backdoor import Backdoor
from phalanx.attacks.base import KNOWLEDGE, Attack, AttackContext, DataAttack
from phalanx.attacks.dba import DBA
from phalanx.attacks.edgecase import EdgeCase
from phalanx.attacks.evade import Evade
from phalanx.attacks.fang import Fang
from phalanx.attacks.fangkrum import FangKrum
from phalanx.attacks.intermittent import Intermittent
from phalanx.attacks.labelflip import LabelFlip
from phalanx.attacks.mimic import Mimic
from phalanx.attacks.minmax import MinMax, MinSum
from phalanx.attacks.neurotoxin import Neurotoxin
from phalanx.attacks.noise import Gaussian, Infinity, NotANumber
from phalanx.attacks.none import NoAttack
from phalanx.attacks.optimal import Optimal, OptimalSearch
from phalanx.attacks.registry import get_class, make, names, register
from phalanx.attacks.replacement import ModelReplacement
from phalanx.attacks.scaling import FallOfEmpires, InnerProductManipulation, SignFlip
from phalanx.attacks.subnormal import Subnormal
from phalanx.attacks.targetflip import TargetFlip
from phalanx.plugins import import_modules

# Every module of this package is imported here, in name order, and importing one registers its attacks with
# make()/names(): a new attack is its file, with no import to add (tests/test_builtin_discovery.py). The classes
# above are the public names of the attacks that came before; a new one need not be added to them.
import_modules(__name__, __path__)

__all__ = [
    "ALIE",
    "DBA",
    "KNOWLEDGE",
    "Attack",
    "AttackContext",
    "Backdoor",
    "DataAttack",
    "EdgeCase",
    "Evade",
    "FallOfEmpires",
    "Fang",
    "FangKrum",
    "Gaussian",
    "Infinity",
    "InnerProductManipulation",
    "Intermittent",
    "LabelFlip",
    "Mimic",
    "MinMax",
    "MinSum",
    "ModelReplacement",
    "Neurotoxin",
    "NoAttack",
    "NotANumber",
    "Optimal",
    "OptimalSearch",
    "SignFlip",
    "Subnormal",
    "TargetFlip",
    "alie_z_max",
    "get_class",
    "make",
    "names",
    "register",
]
