"""af.train.replica_device_setter and af.device(None), as TF 1.x's
between-graph scripts use them (mnist_replica.py):
`with tf.device(tf.train.replica_device_setter(cluster=spec, worker_device=...))`."""
import numpy as np
import pytest

import actorflow as af

SPEC = {"ps": ["127.0.0.1:1", "127.0.0.1:2"], "worker": ["127.0.0.1:3", "127.0.0.1:4"]}


def test_variables_go_round_robin_over_the_ps_and_the_rest_to_the_worker():
    # Catches: every variable on one ps (no round robin), the worker's ops
    # on the ps, a reused get_variable taking a ps turn (TF makes no new
    # variable then), or an explicit inner af.device losing to the setter.
    setter = af.train.replica_device_setter(cluster=af.train.ClusterSpec(SPEC),
                                            worker_device="/job:worker/task:1")
    assert setter.ps_tasks == 2
    with af.device(setter):
        v = [af.get_variable("v%d" % i, [2]) for i in range(3)]
        again = af.get_variable("v0", [2])
        w = af.Variable([1.0, 2.0])
        with af.device("/job:ps/task:0"):
            pinned = af.get_variable("pinned", [1])
        total = v[0] + v[1]
    assert [x.device for x in v] == ["/job:ps/task:0", "/job:ps/task:1", "/job:ps/task:0"]
    assert again.device == "/job:ps/task:0"
    assert w.device == "/job:ps/task:1"
    assert pinned.device == "/job:ps/task:0"
    assert total.device == "/job:worker/task:1"
    after = af.get_variable("after", [1])
    assert after.device == ""  # the setter's block is closed


def test_no_ps_task_gives_none_and_device_none_ignores_the_blocks_outside():
    # Catches: a setter for a cluster without ps (TF returns None), or
    # af.device(None) refused or merging with the blocks outside it (TF's
    # ignores them).
    assert af.train.replica_device_setter() is None
    assert af.train.replica_device_setter(cluster={"worker": ["127.0.0.1:3"]}) is None
    with af.device("/job:worker/task:0"):
        with af.device(af.train.replica_device_setter(cluster={"worker": ["127.0.0.1:3"]})):
            free = af.constant(1.0)
            v = af.get_variable("v", [1])
        inside = af.constant(2.0)
    assert free.device == "" and v.device == ""
    assert inside.device == "/job:worker/task:0"


def test_ps_tasks_without_a_cluster_and_what_is_not_supported():
    # Catches: ps_tasks ignored without a cluster, a ps_device of the
    # setter's own ignored, or TF's other arguments silently dropped.
    with af.device(af.train.replica_device_setter(ps_tasks=3, ps_device="/job:param")):
        names = [af.get_variable("p%d" % i, [1]).device for i in range(4)]
    assert names == ["/job:param/task:0", "/job:param/task:1", "/job:param/task:2",
                     "/job:param/task:0"]
    for bad in (dict(merge_devices=False), dict(ps_strategy=len), dict(ps_ops=["Variable"])):
        with pytest.raises(ValueError, match=next(iter(bad))):
            af.train.replica_device_setter(ps_tasks=1, **bad)
    with pytest.raises(TypeError, match="ps_tasks"):
        af.train.replica_device_setter(ps_tasks=1.5)
    with pytest.raises(af.errors.InvalidArgumentError, match="worker_device"):
        af.train.replica_device_setter(ps_tasks=1, worker_device="/job:worker/nonsense:3")
    with pytest.raises(TypeError, match="af.device"):
        af.device(3)


def test_a_between_graph_step_over_two_ps_placed_by_the_setter():
    # Catches: variables the setter placed not living on their ps (each
    # worker's session would make its own), or the step's ops not running
    # on the worker: the trace names the device each node ran on.
    with af.train.LocalCluster({"ps": 2, "worker": 1}) as cluster:
        with af.device(af.train.replica_device_setter(cluster=cluster.cluster_spec,
                                                      worker_device="/job:worker/task:0")):
            a = af.get_variable("a", [2], initializer=1.0)
            b = af.get_variable("b", [2], initializer=2.0)
            bump = a.assign_add(b * 3.0)
        sess = af.Session(cluster.target("worker", 0))
        try:
            sess.run(af.global_variables_initializer())
            md = af.RunMetadata()
            got = sess.run(bump, options=af.RunOptions(trace=True), run_metadata=md)
            np.testing.assert_allclose(got, [7.0, 7.0])
            ran = md.by_device()  # each device, then the nodes that ran on it
            for where in ("/job:ps/replica:0/task:0", "/job:ps/replica:0/task:1",
                          "/job:worker/replica:0/task:0"):
                assert where in ran, ran
            assert a.device == "/job:ps/task:0" and b.device == "/job:ps/task:1"
        finally:
            sess.close()
