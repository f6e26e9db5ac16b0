"""Fixtures of the actorflow module's tests (run by ctest's python-tests:
/usr/bin/python3 -m pytest python/tests, PYTHONPATH=<build>/python).

Every cluster is one of this process on free loopback ports, stopped by
the fixture that started it."""
import random
import socket

import pytest

import actorflow as af


@pytest.fixture(autouse=True)
def fresh_graph():
    """Each test builds in a default graph of its own."""
    af.reset_default_graph()
    yield
    af.reset_default_graph()


@pytest.fixture
def ps_workers():
    """A cluster of 1 ps and 2 workers in this process (the tutorial's)."""
    with af.train.LocalCluster({"ps": 1, "worker": 2}) as cluster:
        yield cluster


@pytest.fixture
def local():
    """A one-task cluster ("local") in this process."""
    with af.train.LocalCluster({"local": 1}) as cluster:
        yield cluster


def free_ports(n):
    """n distinct ports free on 127.0.0.1 now (for af.train.Server, which
    listens on its ClusterSpec's address), drawn below the kernel's ephemeral
    range where there is room, as config/loopback.cpp's free_loopback_port:
    there no bind to port 0 or outgoing connection of any process can be
    given one before its server binds it."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    ports = []
    rng = random.SystemRandom()
    for _ in range(256 * n):
        if len(ports) == n or low - 10000 < 4096:
            break
        port = rng.randrange(10000, low)
        if port in ports:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        ports.append(port)
    if len(ports) == n:
        return ports
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


@pytest.fixture
def servers():
    """A ps and a worker as af.train.Servers of this process (each can be
    stopped alone), by job name; stopped at the end."""
    ps_port, worker_port = free_ports(2)
    spec = af.train.ClusterSpec({"ps": ["127.0.0.1:%d" % ps_port],
                                 "worker": ["127.0.0.1:%d" % worker_port]})
    started = {"ps": af.train.Server(spec, "ps", 0), "worker": af.train.Server(spec, "worker", 0)}
    yield started
    for s in started.values():
        s.stop()
        s.join()
