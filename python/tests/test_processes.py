"""Clusters of processes: a ps run by actorflow-node in a process of its
own, used from this process as TensorFlow's between-graph scripts use a
remote ps; a session as a client of its own actor system; TF_CONFIG."""
import json
import os
import pathlib
import signal
import subprocess
import sys
import threading
import time

import pytest

import actorflow as af
from conftest import free_ports


def stop_process(proc):
    """SIGSTOPs `proc` and waits (10 s at most) until every thread of it has
    stopped: kill() returns before they have, and a request sent at once
    was sometimes still answered (a test then saw no KeyboardInterrupt)."""
    proc.send_signal(signal.SIGSTOP)
    deadline = time.monotonic() + 10
    while not all(_thread_state(stat) == "T"
                  for stat in pathlib.Path("/proc/%d/task" % proc.pid).glob("*/stat")):
        assert time.monotonic() < deadline, "process %d did not stop within 10 s" % proc.pid
        time.sleep(0.001)


def _thread_state(stat):
    """A thread's state letter from its /proc stat file (T: stopped)."""
    try:
        return stat.read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "T"  # a thread that ended answers nothing


def node_binary():
    # The module is <build>/python/actorflow*.so; actorflow-node is <build>/actorflow-node.
    return pathlib.Path(af.__file__).resolve().parents[1] / "actorflow-node"


@pytest.fixture
def ps_process(tmp_path):
    """An actorflow-node process serving /job:ps/task:0 and a ClusterSpec
    with it and a free worker address; stopped with SIGTERM at the end."""
    binary = node_binary()
    if not binary.exists():
        pytest.skip("%s is not built (ninja actorflow-node)" % binary)
    ps_port, worker_port = free_ports(2)
    jobs = {"ps": ["127.0.0.1:%d" % ps_port], "worker": ["127.0.0.1:%d" % worker_port]}
    config = tmp_path / "cluster.json"
    config.write_text(json.dumps({"cluster": jobs}))
    proc = subprocess.Popen([str(binary), "--config", str(config), "--job", "ps", "--task", "0",
                             "--threads", "2"], stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()  # the node prints its ready line once it serves
        assert "actorflow-node ready" in line, line
        yield af.train.ClusterSpec(jobs), proc
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        proc.stdout.close()


def test_worker_server_uses_a_ps_process(ps_process):
    # Catches: a Server of this process that cannot reach a node of another
    # process (the between-graph script: a worker here, the ps elsewhere).
    spec, _ = ps_process
    worker = af.train.Server(spec, "worker", 0)
    try:
        with af.device("/job:ps/task:0"):
            var = af.Variable(0.0, name="var")
        with af.Session(worker.target) as sess:
            sess.run(af.global_variables_initializer())
            assert [float(sess.run(var.assign_add(1.0))) for _ in range(3)] == [1.0, 2.0, 3.0]
            assert sess.device_of(var) == "/job:ps/replica:0/task:0/device:CPU:0"
    finally:
        worker.stop()
        worker.join()


def test_client_session_of_a_cluster_elsewhere(ps_process):
    # Catches: af.Session(target, cluster=spec) not reaching a node no
    # Server of this process runs (it must connect as a client of its own
    # actor system), or not finding the task by its address.
    spec, _ = ps_process
    ps_target = "actorflow://" + spec.task_address("ps", 0)
    v = af.get_variable("w", [2, 2], initializer=af.constant_initializer(2))
    with af.Session(ps_target, cluster=spec) as sess:
        sess.run(af.global_variables_initializer())
        assert sess.run(v * 3.0).tolist() == [[6.0, 6.0], [6.0, 6.0]]
    with pytest.raises(af.errors.NotFoundError) as e:
        af.Session("actorflow://127.0.0.1:1", cluster=spec)
    assert "127.0.0.1:1" in e.value.message


def test_cluster_spec_from_tf_config(monkeypatch):
    # Catches: TF_CONFIG's cluster read wrongly (TensorFlow's JSON shape).
    monkeypatch.setenv("TF_CONFIG", json.dumps({
        "cluster": {"ps": ["127.0.0.1:3335"], "worker": ["127.0.0.1:3333", "127.0.0.1:3334"]},
        "task": {"type": "worker", "index": 1}}))
    spec = af.train.ClusterSpec.from_tf_config()
    assert spec.as_dict() == {"ps": ["127.0.0.1:3335"],
                              "worker": ["127.0.0.1:3333", "127.0.0.1:3334"]}
    monkeypatch.delenv("TF_CONFIG")
    with pytest.raises(af.errors.NotFoundError):
        af.train.ClusterSpec.from_tf_config()


def interrupt_a_stopped_run(spec, proc, bound):
    """A worker Server of this process runs assign_add on the ps of `spec`
    (process `proc`), SIGSTOPs it, runs again and sends itself SIGINT 0.5 s
    later: the run must raise KeyboardInterrupt within `bound` seconds and
    the session work again once the ps is continued."""
    worker = af.train.Server(spec, "worker", 0)
    try:
        with af.device("/job:ps/task:0"):
            var = af.Variable(0.0, name="var")
        inc = var.assign_add(1.0)
        with af.Session(worker.target, timeout=30.0) as sess:
            sess.run(af.global_variables_initializer())
            assert sess.run(inc) == 1.0
            stop_process(proc)
            try:
                interrupt = threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT))
                interrupt.start()
                began = time.monotonic()
                with pytest.raises(KeyboardInterrupt):
                    sess.run(inc)
                waited = time.monotonic() - began
                interrupt.join()
            finally:
                proc.send_signal(signal.SIGCONT)
            assert waited < bound, waited
            assert float(sess.run(var)) in (1.0, 2.0)  # the abandoned update may have landed
    finally:
        worker.stop()
        worker.join()


def test_ctrl_c_interrupts_a_waiting_run(ps_process):
    # Catches: Ctrl-C ignored while run waits with the GIL released (Python's
    # handler runs only after the run gives up, at the session's timeout),
    # or a session left unusable by the interrupt. The ps is SIGSTOPped, so
    # the run waits; SIGINT comes while it does.
    spec, proc = ps_process
    # Within the 20 ms cancel poll of the signal at 0.5 s (on TCP, on the
    # shared-memory ring, and in the offer of shared memory that the call's
    # fresh connection makes first, which waited its 3.3 s deadline), with a
    # second's margin for a loaded machine.
    interrupt_a_stopped_run(spec, proc, bound=1.5)


def test_ctrl_c_is_not_lost_when_the_run_ends_in_another_error(ps_process):
    # Catches: a Ctrl-C taken by the run's handler, then dropped because the
    # run ended in an error of its own (a wait that does not watch the
    # cancel flag: here making a new variable on the SIGSTOPped ps, which
    # runs out at the session's timeout): the user got DeadlineExceededError
    # instead of KeyboardInterrupt.
    spec, proc = ps_process
    worker = af.train.Server(spec, "worker", 0)
    try:
        with af.device("/job:ps/task:0"):
            af.Variable(0.0, name="a")
        with af.Session(worker.target, timeout=2.0) as sess:
            sess.run(af.global_variables_initializer())
            with af.device("/job:ps/task:0"):
                af.Variable(0.0, name="b")           # made on the ps at the next run
            stop_process(proc)
            try:
                interrupt = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT))
                interrupt.start()
                with pytest.raises(KeyboardInterrupt) as e:
                    sess.run(af.global_variables_initializer())
                interrupt.join()
            finally:
                proc.send_signal(signal.SIGCONT)
            # The run's own end, when it was not the cancel, rides along.
            assert e.value.__context__ is None or isinstance(e.value.__context__, af.errors.OpError)
            sess.run(af.global_variables_initializer())  # usable after it
    finally:
        worker.stop()
        worker.join()


def test_a_traced_run_leaves_its_metadata_alone_until_it_returns(ps_process):
    # Catches: the run's trace written into the RunMetadata by the run's
    # own thread, without the GIL, while Python may read the same object
    # (or another session's traced run may write it): a data race. The
    # metadata was emptied at the start; now the run traces into its own
    # and hands it over once it returns, with the GIL. The ps is
    # SIGSTOPped so that the run waits while this thread reads.
    spec, proc = ps_process
    worker = af.train.Server(spec, "worker", 0)
    try:
        with af.device("/job:ps/task:0"):
            var = af.Variable(0.0, name="var")
        inc = var.assign_add(1.0)
        with af.Session(worker.target, timeout=2.0) as sess:
            sess.run(af.global_variables_initializer())
            md, traced = af.RunMetadata(), af.RunOptions(trace=True)
            sess.run(inc, options=traced, run_metadata=md)
            before = len(md.trace)
            assert before > 0
            stop_process(proc)
            try:
                began, failed = threading.Event(), []

                def waiting_run():
                    began.set()
                    try:
                        sess.run(inc, options=traced, run_metadata=md)
                    except af.errors.OpError as e:
                        failed.append(e)

                thread = threading.Thread(target=waiting_run)
                thread.start()
                began.wait()
                seen = []
                while thread.is_alive():
                    seen.append(len(md.trace))
                    time.sleep(0.01)
                thread.join()
            finally:
                proc.send_signal(signal.SIGCONT)
            assert failed and seen and set(seen) == {before}, (failed, set(seen))
    finally:
        worker.stop()
        worker.join()


def test_ctrl_c_interrupts_a_run_whose_offer_of_shared_memory_waits():
    # Catches: the answer to an offer of shared memory read without looking
    # at the cancel flag. With the ps an af.train.Server of another Python
    # process, the run after SIGSTOP makes that offer, and a Ctrl-C then
    # came only when the offer's wait ran out (about 10 s), past the 50 ms
    # the module promises.
    ps_port, worker_port = free_ports(2)
    jobs = {"ps": ["127.0.0.1:%d" % ps_port], "worker": ["127.0.0.1:%d" % worker_port]}
    code = ("import actorflow as af; s = af.train.Server(%r, 'ps', 0); print('up', flush=True); "
            "s.join()" % jobs)
    env = dict(os.environ, PYTHONPATH=str(pathlib.Path(af.__file__).resolve().parent))
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                            env=env)
    try:
        assert proc.stdout.readline().strip() == "up"
        # The shared-memory ring sees the flag within about 2 s (net/); the
        # offer's wait, which did not, is the channel's 10 s.
        interrupt_a_stopped_run(af.train.ClusterSpec(jobs), proc, bound=6.0)
    finally:
        proc.kill()
        proc.wait(timeout=30)
        proc.stdout.close()


def test_ctrl_c_interrupts_wait_initialized(ps_process):
    # Catches: Session.wait_initialized blocking on each variable's answer
    # without looking at the cancel flag: a Ctrl-C came only at its timeout.
    # Nobody initializes the variable, so the wait lasts; SIGINT comes at 0.5 s.
    spec, _ = ps_process
    worker = af.train.Server(spec, "worker", 0)
    try:
        with af.device("/job:ps/task:0"):
            var = af.Variable(0.0, name="never_initialized")
        with af.Session(worker.target, timeout=30.0) as sess:
            interrupt = threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT))
            interrupt.start()
            began = time.monotonic()
            with pytest.raises(KeyboardInterrupt):
                sess.wait_initialized(timeout=10.0)
            waited = time.monotonic() - began
            interrupt.join()
            assert waited < 1.5, waited  # the wait was 10 s
            # The session works on: the variable is made and initialized now.
            sess.run(af.global_variables_initializer())
            sess.wait_initialized(timeout=10.0)
            assert float(sess.run(var)) == 0.0
    finally:
        worker.stop()
        worker.join()
