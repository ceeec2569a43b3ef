"""How the ranks of a job find each other, with hostile values in the way: a forged ``sealed/port`` or ``sealed/mesh``
in torchrun's store is a one-line error, not a traceback; a wildcard listen address is refused; and whether a job
runs on several machines does not rest on one variable — an unkeyed job whose ``LOCAL_WORLD_SIZE`` was unset is still
refused when ``MASTER_ADDR`` is another machine's, or when the store shows another machine (issue 33)."""

from __future__ import annotations

import pytest

from phalanx.distributed import env as env_module
from phalanx.distributed import rendezvous
from phalanx.distributed.admission import listen_on
from phalanx.distributed.env import RankEnv, address_here, check_one_machine, free_port, open_store
from phalanx.distributed.errors import TransportError
from phalanx.distributed.worker import check_identity
from phalanx.errors import ConfigError
from phalanx.experiments import make_config

TORCHRUN = {"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "MASTER_PORT": "29500"}


@pytest.fixture
def store() -> object:
    return open_store(RankEnv(0, 2, 0, "127.0.0.1", free_port(), agent_store=False, run_id="t.0"), 5.0)


@pytest.mark.parametrize(("value", "message"), [
    (b"abc", "not a TCP port"), (b"99999", "not a TCP port"), (b"-1", "not a TCP port"), (b"\xff\xfe", "not a TCP"),
    (b"1" * 400, "400 bytes"), (b"1e3", "not a TCP port"),
])
def test_a_forged_sealed_port_is_one_line(store: object, value: bytes, message: str) -> None:
    store.set(rendezvous.PORT_KEY, value)  # type: ignore[attr-defined]
    with pytest.raises(TransportError, match=message) as info:
        rendezvous.read_port(store, 2.0)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("value", [b'["evil.example", 1]', b"{}", b"[1, 2, 3]", b'["127.0.0.1", 0]',
                                   b'["127.0.0.1", true]', b'["127.0.0.1", 1e400]', b"NaN", b"not json"])
def test_a_forged_mesh_address_is_one_line(store: object, value: bytes) -> None:
    store.set(rendezvous.ADDRESS_KEY, value)  # type: ignore[attr-defined]
    with pytest.raises(TransportError, match="not \\[address, port\\]") as info:
        rendezvous.read_address(store, 2.0)
    assert "\n" not in str(info.value)


def test_genuine_store_values_are_read(store: object) -> None:
    store.set(rendezvous.PORT_KEY, b"4242")  # type: ignore[attr-defined]
    store.set(rendezvous.ADDRESS_KEY, b'["127.0.0.1", 4243]')  # type: ignore[attr-defined]
    assert rendezvous.read_port(store, 2.0) == 4242
    assert rendezvous.read_address(store, 2.0) == ("127.0.0.1", 4243)
    with pytest.raises(TransportError, match="no 'sealed/mesh-x'"):
        rendezvous._get(store, "sealed/mesh-x", 0.5)


def test_the_sealed_port_variable_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(rendezvous.PORT_VAR, raising=False)
    assert rendezvous.port_override() is None
    monkeypatch.setenv(rendezvous.PORT_VAR, "29501")
    assert rendezvous.port_override() == 29501
    for bad in ("0", "70000", "x"):
        monkeypatch.setenv(rendezvous.PORT_VAR, bad)
        with pytest.raises(ConfigError, match=rendezvous.PORT_VAR):
            rendezvous.port_override()


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "0:0::0", "", "0", "0.0", "0x0", "000.000.000.000",
                                  "::ffff:0.0.0.0"])
def test_listeners_never_bind_a_wildcard(host: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every spelling of the wildcard, the C resolver's too (``0``, ``0.0``, ``0x0``, ``000.000.000.000`` are
    ``INADDR_ANY`` to ``inet_aton``, not addresses to :mod:`ipaddress`: they were taken as host names and bound every
    interface); the listener itself refuses a wildcard it was given (its bound address checked)."""
    with pytest.raises(ConfigError):
        rendezvous.check_bind_address(rendezvous.ADDR_VAR, host)
    monkeypatch.setenv(rendezvous.ADDR_VAR, host or " ")
    one = RankEnv(1, 4, 1, "127.0.0.1", 29500, agent_store=False, run_id="x.0", local_world_size=4)
    if host:
        with pytest.raises(ConfigError, match="not a wildcard"):
            rendezvous.bind_host(one)
    if host and ":" not in host:
        with pytest.raises(ConfigError, match="not a wildcard"):
            listen_on(host, 0).close()
        with pytest.raises(ConfigError, match="not a wildcard"):  # the keyless job's c10d store (a review)
            env_module.listen(host, 0).close()
    assert rendezvous.check_bind_address("MASTER_ADDR", "127.0.0.1") == "127.0.0.1"
    assert rendezvous.check_bind_address("MASTER_ADDR", "localhost") == "localhost"


def test_the_claimed_listen_address_is_the_connections_own() -> None:
    assert rendezvous.claimed_address(["127.0.0.1", 4000], "127.0.0.1") is None
    assert rendezvous.claimed_address(["::1", 4000], "::1") is None
    for listen in (["10.0.0.1", 22], ["127.0.0.2", 4000], ["127.0.0.1", 0], ["127.0.0.1", True], "x", None,
                   ["localhost", 4000]):
        assert rendezvous.claimed_address(listen, "127.0.0.1") is not None, listen


def test_addresses_of_this_machine() -> None:
    assert address_here("127.0.0.1") and address_here("localhost")
    assert not address_here("192.0.2.1")  # TEST-NET-1: no machine's
    assert not address_here("no-such-host.invalid")


@pytest.mark.parametrize(("extra", "several"), [
    ({"MASTER_ADDR": "127.0.0.1", "LOCAL_WORLD_SIZE": "4"}, False),
    ({"MASTER_ADDR": "127.0.0.1"}, False),  # LOCAL_WORLD_SIZE unset, rank 0 here: one machine
    ({"MASTER_ADDR": "127.0.0.1", "LOCAL_WORLD_SIZE": "2"}, True),
    ({"MASTER_ADDR": "127.0.0.1", "GROUP_WORLD_SIZE": "2"}, True),
    ({"MASTER_ADDR": "192.0.2.1"}, True),  # LOCAL_WORLD_SIZE unset, rank 0 elsewhere: the attacker's case
    ({"MASTER_ADDR": "192.0.2.1", "LOCAL_WORLD_SIZE": "4"}, True),  # a lying LOCAL_WORLD_SIZE does not hide it
])
def test_several_machines_does_not_rest_on_one_variable(extra: dict[str, str], several: bool,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("LOCAL_WORLD_SIZE", "GROUP_WORLD_SIZE", "TORCHELASTIC_USE_AGENT_STORE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in {**TORCHRUN, **extra}.items():
        monkeypatch.setenv(name, value)
    renv = RankEnv.from_environ()
    assert renv.several_machines is several
    cfg = make_config({"engine": "torchrun", "workers": 4, "aggregator": "cwtm", "f": 1})
    if several:
        with pytest.raises(ConfigError, match="several machines"):
            check_identity(cfg, renv)
    else:
        assert check_identity(cfg, renv) is None
    if "LOCAL_WORLD_SIZE" not in extra and several:
        assert not 0 < renv.local_world_size < renv.world_size  # the mutant (the variable alone) would let it run


def test_a_rank_on_another_machine_than_rank_0_refuses_without_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every variable says one machine; the store shows two (each rank writes its machine's identity): the rank on
    the other machine refuses in one line. The mutant — no comparison — would run."""
    port = free_port()
    r0 = RankEnv(0, 2, 0, "127.0.0.1", port, agent_store=False, run_id="m.0", local_world_size=2)
    r1 = RankEnv(1, 2, 1, "127.0.0.1", port, agent_store=False, run_id="m.0", local_world_size=2)
    host = open_store(r0, 5.0)
    check_one_machine(host, r0, 5.0)
    client = open_store(r1, 5.0)
    check_one_machine(client, r1, 5.0)  # the same machine: nothing to say
    monkeypatch.setattr(env_module, "machine_id", lambda: "another|machine")
    with pytest.raises(ConfigError, match="rank 1 runs on another machine than rank 0") as info:
        check_one_machine(client, r1, 5.0)
    assert "\n" not in str(info.value) and "insecure=true" in str(info.value)


def test_a_free_port_is_below_the_ephemeral_range() -> None:
    """free_port gives listeners a port no outgoing connection can take as its local port (the OS draws those from
    ip_local_port_range); the old bind-to-0 port was inside that range — the mutant, checked to be so."""
    import socket

    from phalanx.distributed import env as denv

    span = denv.ephemeral_range()
    if span is None or span[0] - 1 <= denv.LOWEST_LISTEN_PORT:
        pytest.skip("no ephemeral range below which to pick")
    ports = [denv.free_port() for _ in range(20)]
    assert all(denv.LOWEST_LISTEN_PORT <= p < span[0] for p in ports), ports
    with socket.socket() as s:  # the mutant: port 0
        s.bind(("127.0.0.1", 0))
        assert span[0] <= s.getsockname()[1] <= span[1]
    with socket.socket() as s:  # and the port is really free: it binds
        s.bind(("127.0.0.1", ports[0]))
