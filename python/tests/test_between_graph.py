"""examples/python/mnist_replica.py: between-graph training across
processes, one per task (a ps and two workers on free loopback ports), as
TensorFlow's mnist_replica.py was run. Every process must exit 0, the chief
must say a sensible held-out accuracy; every wait is bounded."""
import os
import pathlib
import re
import subprocess
import sys

import actorflow as af
from conftest import free_ports

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "examples" / "python" / "mnist_replica.py"


def test_mnist_replica_trains_across_processes(tmp_path):
    # Catches: a worker process that cannot reach the ps of another process,
    # a non-chief that does not wait for the chief's initialization (its
    # first run fails), a ps that never stops (the bounded wait fails), and
    # updates of one worker lost to the other (the accuracy stays low).
    ps_port, w0_port, w1_port = free_ports(3)
    hosts = ["--ps_hosts=127.0.0.1:%d" % ps_port,
             "--worker_hosts=127.0.0.1:%d,127.0.0.1:%d" % (w0_port, w1_port), "--timeout=90"]
    env = dict(os.environ)
    # The module of this test's own build (the processes run in tmp_path).
    env["PYTHONPATH"] = os.pathsep.join(
        [str(pathlib.Path(af.__file__).resolve().parent)] + env.get("PYTHONPATH", "").split(os.pathsep))
    procs = {}
    try:
        # The workers first: a task must wait for the ps to come up, as the
        # processes of a cluster start in any order.
        for job, task in (("worker", 0), ("worker", 1), ("ps", 0)):
            procs[(job, task)] = subprocess.Popen(
                [sys.executable, str(SCRIPT), *hosts, "--job_name=" + job, "--task_index=%d" % task],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path, env=env)
        outs = {key: p.communicate(timeout=150) for key, p in procs.items()}
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
    for key, p in procs.items():
        assert p.returncode == 0, "%s exited %s:\n%s%s" % (key, p.returncode, *outs[key])
    chief = outs[("worker", 0)][0]
    assert "worker 0 (chief): initialized the variables" in chief
    accuracy = float(re.search(r"test accuracy ([0-9.]+)", chief).group(1))
    assert accuracy > 0.8, chief
    for task in (0, 1):
        out = outs[("worker", task)][0]
        done = re.search(r"worker %d: done after 300 steps .* training loss ([0-9.]+), "
                         r"global step (\d+)" % task, out)
        assert done, out
        assert float(done.group(1)) < 0.5
        assert 300 <= int(done.group(2)) <= 600  # both workers' steps move it (async)
    assert "worker 1: the chief initialized the variables" in outs[("worker", 1)][0]
    assert "ps: every worker is done; stopping" in outs[("ps", 0)][0]
