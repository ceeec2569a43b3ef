"""How the ranks of a torchrun job are connected, one class per topology, chosen by name from a registry.

A topology decides, for one rank, what the rank runs (:meth:`Topology.start`): the transport its training loop
runs over — with the callbacks that transport brings and a way to let the run's transcript hear its messages — or
nothing, when the rank serves its part without a loop of its own (a worker of the parameter server). Everything
else about a rank is the same for every topology (:func:`phalanx.distributed.worker.run_rank`): the identity check,
the experiment, the run directory and the loop's wiring (:func:`phalanx.experiments.wiring.run_experiment`).

Built in: ``server`` (:mod:`~phalanx.distributed.parameter_server`: rank 0 aggregates; over sealed links with keys,
:mod:`~phalanx.distributed.sealed`), ``serverless`` (:mod:`~phalanx.distributed.serverless`: every rank gathers
every vector and aggregates) and ``gossip`` (:mod:`~phalanx.distributed.neighbours`: a rank per node of the graph).
A topology of one's own subclasses :class:`Topology` and is registered (:func:`register`, or the
``phalanx.torchrun_topologies`` entry-point group; the old shared ``phalanx.topologies`` is still read, with a
deprecation warning).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from phalanx.distributed import rendezvous, wire
from phalanx.distributed.async_server import (
    THETA_DIGEST,
    AsyncServer,
    AsyncWorker,
    SealedArrivals,
    StoreArrivals,
    store_notifier,
)
from phalanx.distributed.env import RankEnv, check_one_machine, open_store
from phalanx.distributed.keys import Identity
from phalanx.distributed.mesh import Mesh
from phalanx.distributed.neighbours import MessageCount, Neighbours
from phalanx.distributed.parameter_server import (
    JOIN_TIMEOUT_S,
    ParameterServer,
    ParameterServerWorker,
    StoreLinks,
    StoreWorkerLinks,
)
from phalanx.distributed.recording import RankLog
from phalanx.distributed.sealed import SealedLinks, SealedWorkerLinks
from phalanx.distributed.serverless import AllGather
from phalanx.distributed.transcript import Transcript
from phalanx.errors import ConfigError
from phalanx.experiments.config import RunConfig, processes
from phalanx.training.algorithms import builtin
from phalanx.training.algorithms.asynchronous import Asynchronous
from phalanx.training.algorithms.base import RoundAlgorithm
from phalanx.training.experiment import Experiment
from phalanx.training.loop import Callback
from phalanx.training.transport import TOPOLOGIES, Transport
from phalanx.validate import suggest

WORKER_WAIT_S = 3600.0
"""How long a worker waits for the server's next message (θ or stop) before giving up."""


@dataclass
class Rank:
    """One rank of a job, as its topology sees it: the run's config and experiment, the torchrun environment, the
    config's digest (what every message is bound to), this rank's identity (None without keys), its sealed mesh (a
    topology whose ranks all talk to each other, with keys) and its log."""

    cfg: RunConfig
    exp: Experiment
    renv: RankEnv
    digest: str
    identity: Identity | None
    mesh: Mesh | None
    log: RankLog


@dataclass
class Part:
    """What a rank's training loop runs over: the ``transport``, the callbacks it brings before the run is measured
    (``first``) and after the metric rows are made (``measures``), what the run's transcript records it through
    (``links``: the sealed links or mesh; None without keys) and how the transcript hears its messages (``hear``)."""

    transport: Transport
    first: list[Callback] = field(default_factory=list)
    measures: list[Callback] = field(default_factory=list)
    links: Any = None
    hear: Callable[[Transcript], None] | None = None
    banner: str | None = None
    """The line rank 0 logs about how the ranks are linked (None: the unsealed warning)."""


class Topology(ABC):
    """One way to connect the ranks (see the module's docstring)."""

    name: ClassVar[str] = "topology"
    meshed: ClassVar[bool] = False
    """With keys, its ranks talk over the sealed mesh (:mod:`phalanx.distributed.mesh`), which the worker opens for
    it; otherwise the topology opens its own links."""
    loop_on_every_rank: ClassVar[bool] = False
    """Every rank runs the training loop (rank 0 alone measures and records it); otherwise only rank 0 does."""

    @classmethod
    def runs(cls, algorithm: type[RoundAlgorithm]) -> bool:
        """Whether this topology runs a round of ``algorithm``: by default when the algorithm names it among its
        :attr:`~phalanx.training.algorithms.base.RoundAlgorithm.topologies` (a topology of one's own may accept
        more — e.g. every algorithm that is not decentralized)."""
        return cls.name in algorithm.topologies

    @abstractmethod
    def start(self, rank: Rank) -> Part | None:
        """This rank's part: the transport its loop runs over, or None when it has served its part already."""


def _store(rank: Rank) -> Any:
    """The job's c10d store, for a rank without keys; unless ``insecure``, a rank on another machine than rank 0
    refuses to run here (:func:`~phalanx.distributed.env.check_one_machine`)."""
    store = open_store(rank.renv, WORKER_WAIT_S)
    if not rank.cfg.insecure:
        check_one_machine(store, rank.renv, JOIN_TIMEOUT_S)
    return store


class ServerTopology(Topology):
    """Rank 0 is the server (and worker 0); the other ranks compute their vectors and serve its rounds. With keys,
    over sealed links (two mutual-TLS connections per worker, every vector signed); else through the c10d store."""

    name = "server"

    def start(self, rank: Rank) -> Part | None:
        renv, exp, digest = rank.renv, rank.exp, rank.digest
        if isinstance(exp.algorithm, Asynchronous):
            return start_async(rank)
        if rank.identity is None:
            store = _store(rank)
            if renv.rank != 0:
                ParameterServerWorker(exp, store, renv.rank, digest).run()
                return None
            return Part(ParameterServer(store, digest, rank.cfg.round_timeout, rank.log.say))
        row_bytes = exp.problem.dim * exp.problem.initial_theta().element_size()
        n = processes(rank.cfg)
        # Under torchrun's agent, which holds MASTER_PORT, rank 0 listens on PHALANX_SEALED_PORT (no store read), or
        # on a free port whose number it publishes in the agent's store: the one thing an unauthenticated party can
        # touch, read back as untrusted input (rendezvous.read_port) — a forged number is one line, or makes the
        # workers meet a listener that cannot prove rank 0's key.
        fixed = rendezvous.port_override() if renv.agent_store else None
        store = open_store(renv, WORKER_WAIT_S) if renv.agent_store and fixed is None else None
        host = rendezvous.check_bind_address("MASTER_ADDR", renv.master_addr)
        if renv.rank != 0:
            if store is not None:
                port = rendezvous.read_port(store, JOIN_TIMEOUT_S)
            else:
                port = renv.master_port if fixed is None else fixed
            links = SealedWorkerLinks(rank.identity, host, port, digest, row_bytes, n)
            ParameterServerWorker(exp, links, renv.rank, digest).run()
            return None
        listen = renv.master_port if not renv.agent_store else fixed or 0
        server_links = SealedLinks(rank.identity, host, listen, digest, row_bytes, n,
                                   reports=bool(wire.reporting(exp.stages)))  # (REPORTED_VECTOR frames taken)
        if store is not None:
            store.set(rendezvous.PORT_KEY, str(server_links.port))
        transport = ParameterServer(server_links, digest, rank.cfg.round_timeout, rank.log.say)

        def hear(transcript: Transcript) -> None:
            transport.on_vectors = transcript.vectors

        return Part(transport, links=server_links, hear=hear,
                    banner=f"sealed links: mutual TLS on {renv.master_addr}:{server_links.port}, {n - 1} workers on "
                           f"the allow-list {rank.identity.allow.path}")


def start_async(rank: Rank) -> Part | None:
    """The asynchronous parameter server (:mod:`~phalanx.distributed.async_server`): rank 0 serves, ranks 1 … n−1
    compute at their own pace; through the store without keys, over the sealed links with them."""
    renv, exp, digest, cfg = rank.renv, rank.exp, rank.digest, rank.cfg
    s = exp.algorithm.max_staleness  # type: ignore[attr-defined]
    if rank.identity is None:
        store = _store(rank)
        if renv.rank != 0:
            AsyncWorker(exp, StoreWorkerLinks(store, renv.rank), renv.rank, digest,
                        notify=store_notifier(store, renv.rank)).run()
            return None
        links = StoreLinks(store, vectors_read_once=True)  # (a version within the bound may be older than 16)
        arrivals = StoreArrivals(links, cfg.round_timeout)
        return Part(AsyncServer(links, arrivals, digest, cfg.round_timeout, rank.log.say))
    if renv.agent_store:
        raise ConfigError("MASTER_PORT", renv.master_port, "a keyed asynchronous job under `phalanx launch` (not "
                          "torchrun's agent: not built for the asynchronous server)")
    row_bytes = exp.problem.dim * exp.problem.initial_theta().element_size() + THETA_DIGEST  # (SHA-256(θ) ‖ row)
    host = rendezvous.check_bind_address("MASTER_ADDR", renv.master_addr)
    if renv.rank != 0:
        worker_links = SealedWorkerLinks(rank.identity, host, renv.master_port, digest, row_bytes, cfg.workers)
        AsyncWorker(exp, worker_links, renv.rank, digest, bind_theta=True).run()
        return None
    sealed = SealedLinks(rank.identity, host, renv.master_port, digest, row_bytes, cfg.workers)
    server = AsyncServer(sealed, SealedArrivals(sealed, s), digest, cfg.round_timeout, rank.log.say)

    def hear(transcript: Transcript) -> None:
        server.on_step = transcript.step

    return Part(server, links=sealed, hear=hear,
                banner=f"sealed links: mutual TLS on {renv.master_addr}:{sealed.port}, {cfg.workers - 1} "
                       f"asynchronous workers on the allow-list {rank.identity.allow.path}")


class ServerlessTopology(Topology):
    """Every rank gathers every rank's vector and aggregates them itself (an all-gather)."""

    name = "serverless"
    meshed = True
    loop_on_every_rank = True

    def start(self, rank: Rank) -> Part:
        store = _store(rank) if rank.mesh is None else None
        transport = AllGather(store, rank.renv, rank.digest, rank.cfg.round_timeout, rank.cfg.backend, rank.mesh)

        def hear(transcript: Transcript) -> None:
            transport.on_rows = transcript.rows

        return Part(transport, links=rank.mesh, hear=hear)


class GossipTopology(Topology):
    """A rank per node of the graph; each sends its message to its neighbours and combines theirs."""

    name = "gossip"
    meshed = True
    loop_on_every_rank = True

    def start(self, rank: Rank) -> Part:
        store = _store(rank) if rank.mesh is None else None
        cfg = rank.cfg
        transport = Neighbours(store, rank.renv, rank.digest, cfg.round_timeout, cfg.checkpoint_every, rank.mesh)

        def hear(transcript: Transcript) -> None:
            transport.on_reports = transcript.reports

        # first: every node's rows reach rank 0 before it evaluates or checkpoints; after the metric rows: their
        # count of missing messages
        return Part(transport, first=[transport], measures=[MessageCount(transport)], links=rank.mesh, hear=hear)


def _accept(obj: Any, name: str) -> Any:
    if not (isinstance(obj, type) and issubclass(obj, Topology)):
        raise ConfigError("topology", name, "a subclass of phalanx.distributed.topologies.Topology")
    return obj


_REGISTRY = TOPOLOGIES


def register(cls: type[Topology]) -> type[Topology]:
    """Class decorator: make a topology known under ``cls.name`` (to configs too)."""
    _REGISTRY.register(_accept(cls, getattr(cls, "name", repr(cls))))
    return cls


for _built_in in (ServerTopology, ServerlessTopology, GossipTopology):
    register(_built_in)


def names() -> list[str]:
    """The registered topologies."""
    return sorted(_REGISTRY.names())


def make(name: str) -> Topology:
    """The topology registered as ``name`` (a one-line :class:`~phalanx.errors.ConfigError` otherwise)."""
    if name not in _REGISTRY:
        known = names()
        raise ConfigError("topology", name, "one of " + ", ".join(known), suggest(name, known))
    cls: type[Topology] = _accept(_REGISTRY.get(name, "topology"), name)
    return cls()


def check(cfg: RunConfig) -> Topology:
    """The topology of a torchrun config, checked against its round algorithm before any process starts: a
    registered one (a ``module:attr`` spec or an entry point), that runs the algorithm (:meth:`Topology.runs`)."""
    topology = make(cfg.topology)
    algorithm = builtin.algorithm_class(cfg.algorithm)
    if not topology.runs(algorithm):
        raise ConfigError("topology", cfg.topology, " or ".join(repr(t) for t in algorithm.topologies) + " with "
                          f"algorithm = {cfg.algorithm!r} (the torchrun topologies its rounds run on), or a topology "
                          "whose runs() accepts it; docs/distributed.md")
    return topology
