"""Graph building the TF 1.x way: default graph, device scopes, operators,
variables, gradients, and the registry's ops as functions."""
import threading

import numpy as np
import pytest

import actorflow as af


def test_device_scopes_merge_as_tf():
    # Catches: an inner af.device replacing the outer one instead of merging
    # (TF keeps the outer job when the inner names only a device), or a
    # scope not popped on leaving the block.
    with af.device("/job:ps"):
        with af.device("/task:1"):
            a = af.constant(1.0)
        with af.device("/job:worker/cpu:0"):
            b = af.constant(1.0)
        c = af.constant(1.0)
    d = af.constant(1.0)
    assert a.device == "/job:ps/task:1"
    assert b.device == "/job:worker/device:CPU:0"
    assert c.device == "/job:ps"
    assert d.device == ""


def test_graph_as_default_collects_nodes():
    # Catches: nodes going to the process graph inside `with g.as_default()`.
    g = af.Graph()
    with g.as_default():
        x = af.constant(1.0, name="in_g")
    assert x.graph is g or x.graph == g
    assert "in_g" in g.get_operations()
    assert "in_g" not in af.get_default_graph().get_operations()


def test_graph_as_default_is_per_thread():
    # Catches: one process-wide stack of as_default() blocks (TF's is
    # thread-local): another thread's block sent this thread's nodes to its
    # graph.
    g = af.Graph()
    entered, built = threading.Event(), threading.Event()
    seen = {}

    def other():
        with g.as_default():
            entered.set()
            built.wait(30)
            seen["there"] = af.get_default_graph() is g

    t = threading.Thread(target=other)
    t.start()
    assert entered.wait(30)
    x = af.constant(1.0, name="main_thread")
    here = af.get_default_graph()
    built.set()
    t.join(30)
    assert here is not g and "main_thread" not in g.get_operations()
    assert "main_thread" in x.graph.get_operations() and seen["there"]


def test_device_scopes_are_per_thread_on_one_graph():
    # Catches: one process-wide stack of af.device blocks per graph (TF's is
    # per thread): two threads inside blocks at once merged each other's
    # scopes into their nodes, and one's exit popped the other's scope.
    g = af.Graph()
    step = threading.Barrier(2, timeout=30)
    nodes, failed = {}, []

    def build(job, name, leaves_first):
        try:
            with g.as_default():
                with af.device("/job:%s" % job):
                    step.wait()  # both blocks open
                    nodes[name] = af.constant(1.0, name=name)
                    step.wait()  # both built inside their blocks
                    if not leaves_first:
                        step.wait()  # the other has left its block
                        step.wait()  # ... and built outside it
                        nodes[name + "_still"] = af.constant(1.0, name=name + "_still")
                if leaves_first:
                    step.wait()
                    nodes[name + "_after"] = af.constant(1.0, name=name + "_after")
                    step.wait()
        except Exception as e:  # reported by the main thread
            failed.append(e)
            step.abort()

    threads = [threading.Thread(target=build, args=("ps", "a", True)),
               threading.Thread(target=build, args=("worker", "b", False))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not failed and not any(t.is_alive() for t in threads)
    assert nodes["a"].device == "/job:ps"
    assert nodes["b"].device == "/job:worker"
    assert nodes["a_after"].device == ""
    assert nodes["b_still"].device == "/job:worker"
    with g.as_default():
        assert af.constant(1.0).device == ""


def test_operators_and_registry_functions(local):
    # Catches: an operator bound to the wrong op (reflected - and / swapped),
    # or registry functions missing their attributes (axis, transpose_b).
    a = af.constant(np.array([[1.0, 2.0], [3.0, 4.0]], np.float32))
    b = af.constant(np.array([[5.0, 6.0], [7.0, 8.0]], np.float32))
    fetches = {
        "add": a + b, "sub": a - b, "rsub": 10.0 - a, "mul": a * b, "div": a / b,
        "rdiv": 1.0 / a, "matmul": a @ b, "neg": -a,
        "mt": af.matmul(a, b, transpose_b=True), "sum1": af.reduce_sum(a, axis=1),
        "mean": af.reduce_mean(a), "keep": af.reduce_max(a, axis=0, keep_dims=True),
        "relu": af.relu(-a),
    }
    an, bn = np.array([[1, 2], [3, 4]], np.float32), np.array([[5, 6], [7, 8]], np.float32)
    with af.Session(local.target("local", 0)) as sess:
        got = sess.run(fetches)
    np.testing.assert_allclose(got["add"], an + bn)
    np.testing.assert_allclose(got["sub"], an - bn)
    np.testing.assert_allclose(got["rsub"], 10 - an)
    np.testing.assert_allclose(got["mul"], an * bn)
    np.testing.assert_allclose(got["div"], an / bn, rtol=1e-6)
    np.testing.assert_allclose(got["rdiv"], 1 / an, rtol=1e-6)
    np.testing.assert_allclose(got["matmul"], an @ bn)
    np.testing.assert_allclose(got["neg"], -an)
    np.testing.assert_allclose(got["mt"], an @ bn.T)
    np.testing.assert_allclose(got["sum1"], an.sum(axis=1))
    np.testing.assert_allclose(got["mean"], an.mean())
    np.testing.assert_allclose(got["keep"], an.max(axis=0, keepdims=True))
    np.testing.assert_allclose(got["relu"], np.zeros((2, 2)))


def test_python_ids_and_counts_are_integers(local):
    # Catches: a Python value given as an op's ids, labels or count took the
    # dtype of the op's first Tensor (float32 params): af.gather(params,
    # [0, 2]) and af.unsorted_segment_sum(data, ids, 3), as TF programs
    # write them, failed when they ran ("indices must be int32 or int64").
    params = af.constant(np.arange(6, dtype=np.float32).reshape(3, 2))
    logits = af.constant(np.array([[2.0, 0.0], [0.0, 2.0]], np.float32))
    fetches = {
        "gather": af.gather(params, [2, 0]),
        "segments": af.unsorted_segment_sum(params, np.array([1, 0, 1], np.int32), 2),
        "xent": af.softmax_xent(logits, [0, 1]),
        "plus": params + 1,   # a data input still takes the Tensor's dtype
        # N indices, then N data: the second data's Python values are data
        "stitch": af.dynamic_stitch(af.constant(np.array([0], np.int32)), [1],
                                    af.constant(np.array([5.0], np.float32)), [7.0]),
    }
    assert fetches["gather"].dtype == np.float32 and fetches["plus"].dtype == np.float32
    with af.Session(local.target("local", 0)) as sess:
        got = sess.run(fetches)
    p = np.arange(6, dtype=np.float32).reshape(3, 2)
    np.testing.assert_allclose(got["gather"], p[[2, 0]])
    np.testing.assert_allclose(got["segments"], [p[1], p[0] + p[2]])
    np.testing.assert_allclose(got["xent"], np.full(2, np.log(1 + np.exp(-2.0))), rtol=1e-5)
    np.testing.assert_allclose(got["plus"], p + 1)
    np.testing.assert_allclose(got["stitch"], [5.0, 7.0])


def test_a_reduction_takes_tfs_axis_lists(local):
    # Catches: axis=[1] or reduction_indices=[1] (TF 1.x's MNIST tutorial)
    # raising pybind11's "Unable to cast Python instance to C++ type".
    a = af.constant(np.array([[1.0, 2.0], [3.0, 4.0]], np.float32))
    fetches = [af.reduce_sum(a, axis=[1]), af.reduce_mean(a, reduction_indices=[0]),
               af.reduce_max(a, axis=(-1,), keep_dims=True)]
    with af.Session(local.target("local", 0)) as sess:
        got = sess.run(fetches)
    np.testing.assert_allclose(got[0], [3.0, 7.0])
    np.testing.assert_allclose(got[1], [2.0, 3.0])
    np.testing.assert_allclose(got[2], [[2.0], [4.0]])
    with pytest.raises(ValueError, match=r"af.reduce_sum: axis is \[0, 1\]; give one axis"):
        af.reduce_sum(a, axis=[0, 1])
    with pytest.raises(TypeError, match="af.reduce_sum: axis is '1' \\(str\\)"):
        af.reduce_sum(a, axis="1")


def test_every_registry_op_is_a_function():
    # Catches: ops of the registry with no Python function (the list is read
    # from the docstrings the registry generates, so a new op is checked too).
    for name in ["add", "matmul", "relu", "reduce_sum", "reduce_mean", "softmax", "gather",
                 "unsorted_segment_sum", "softmax_xent"]:
        fn = getattr(af, name)
        assert "registry's op" in fn.__doc__, name
    with pytest.raises(TypeError) as e:
        af.relu(af.constant(1.0), af.constant(2.0))
    assert "relu(" in str(e.value)
    with pytest.raises(TypeError) as e:
        af.relu(af.constant(1.0), axis=1)
    assert "axis" in str(e.value)


def test_get_variable_shares_and_variable_uniquifies():
    # Catches: get_variable making a second variable for the same name (TF
    # shares it), or tf.Variable reusing a name (TF appends _1).
    a = af.get_variable("w", [2])
    b = af.get_variable("w", [2])
    assert a == b
    with pytest.raises(af.errors.InvalidArgumentError):
        af.get_variable("w", [3])
    v1 = af.Variable(0.0, name="v")
    v2 = af.Variable(0.0, name="v")
    assert v1.name == "v:0" and v2.name == "v_1:0"


def test_gradients(local):
    # Catches: af.gradients not adding the backward ops to the graph the
    # session runs (the replay of nodes built after the first run).
    w = af.Variable(np.array([1.0, -2.0, 3.0], np.float32), name="w")
    loss = af.reduce_sum(w * w)
    with af.Session(local.target("local", 0)) as sess:
        sess.run(af.global_variables_initializer())
        assert sess.run(loss) == pytest.approx(14.0)
        (grad,) = af.gradients(loss, [w])  # built after the session first ran
        np.testing.assert_allclose(sess.run(grad), [2.0, -4.0, 6.0])


def test_assign_add_needs_a_variable():
    # Catches: assign_add on a computed tensor building a node that fails
    # only when run, without naming the tensor.
    c = af.constant(1.0, name="not_a_var")
    with pytest.raises(af.errors.InvalidArgumentError) as e:
        c.assign_add(1.0)
    assert "not_a_var" in e.value.message


def test_nn_names(local):
    # Catches: tf.nn's keyword-only sparse_softmax_cross_entropy_with_logits
    # passing labels and logits to the op in the wrong order.
    logits = np.array([[2.0, 1.0, 0.1], [0.5, 2.5, 0.3]], np.float32)
    labels = np.array([0, 2], np.int32)
    loss = af.nn.sparse_softmax_cross_entropy_with_logits(labels=af.constant(labels),
                                                          logits=af.constant(logits))
    table = af.constant(np.arange(6, dtype=np.float32).reshape(3, 2))
    rows = af.nn.embedding_lookup(table, af.constant(np.array([2, 0], np.int32)))
    assert af.nn.relu is af.relu
    with af.Session(local.target("local", 0)) as sess:
        got_loss, got_rows = sess.run([loss, rows])
    shifted = logits - logits.max(axis=1, keepdims=True)
    want = -(shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True)))[[0, 1], labels]
    np.testing.assert_allclose(got_loss, want, rtol=1e-5)
    np.testing.assert_array_equal(got_rows, [[4, 5], [0, 1]])


def test_a_device_block_entered_twice_or_closed_out_of_order_leaves_no_scope_open():
    # Catches: `dev = af.device(...)` entered inside itself kept its first
    # scope open for good, and closing an outer block before an inner one
    # popped the inner one's: every node built after was placed on a device
    # no open block named, in silence.
    dev = af.device("/job:ps/task:0")
    with dev:
        with dev:
            assert af.constant(1.0).device == "/job:ps/task:0"
        assert af.constant(1.0).device == "/job:ps/task:0"
    assert af.constant(1.0).device == ""
    outer, inner = af.device("/job:ps/task:0"), af.device("/job:worker/task:1")
    outer.__enter__()
    inner.__enter__()
    with pytest.raises(ValueError, match="reverse order"):
        outer.__exit__(None, None, None)
    assert af.constant(1.0).device == "/job:worker/task:1"
    inner.__exit__(None, None, None)
    outer.__exit__(None, None, None)
    assert af.constant(1.0).device == ""
