"""Sessions and clusters: fetch structures, feeds, the tutorial's ps and
two workers, the GIL released while a session waits."""
import collections
import threading

import numpy as np
import pytest

import actorflow as af


def test_fetch_structures(local):
    # Catches: a fetch structure flattened or reordered (TF returns the same
    # lists, tuples and dicts, nested, with the values in place).
    a = af.constant(1.0)
    b = af.constant(2.0)
    with af.Session(local.target("local", 0)) as sess:
        got = sess.run({"x": [a, (b, a)], "y": b})
        single = sess.run(a)
    assert set(got) == {"x", "y"}
    assert isinstance(got["x"], list) and isinstance(got["x"][1], tuple)
    assert got["x"][0] == 1.0 and got["x"][1] == (2.0, 1.0) and got["y"] == 2.0
    assert single == 1.0 and isinstance(single, np.ndarray)


def test_fetch_structures_keep_namedtuple_and_dict_types(local):
    # Catches: a namedtuple given back as a plain tuple (no .field access),
    # an OrderedDict or defaultdict as a plain dict; TF 1.x keeps each type.
    pair = collections.namedtuple("Pair", ["first", "second"])
    a = af.constant(1.0)
    b = af.constant(2.0)
    with af.Session(local.target("local", 0)) as sess:
        got = sess.run(pair(a, [b]))
        ordered = sess.run(collections.OrderedDict([("b", b), ("a", a)]))
        default = sess.run(collections.defaultdict(list, {"a": a}))
    assert isinstance(got, pair) and got.first == 1.0 and got.second == [2.0]
    assert isinstance(ordered, collections.OrderedDict) and list(ordered) == ["b", "a"]
    assert isinstance(default, collections.defaultdict) and default.default_factory is list
    assert default["a"] == 1.0


def test_fetches_that_change_during_run_raise(local):
    # Catches: the fetch structure walked twice (once for what to run, once
    # to put the values back) trusting that it stays the same: a list that
    # grows meanwhile (another thread, while the run waits with the GIL
    # released, or an __iter__ of its own) was read past the values the run
    # made (memory that is not a value: a crash, or garbage as an array).
    a = af.constant(1.0)

    class Growing(list):
        walks = 0

        def __iter__(self):
            Growing.walks += 1
            return iter([a] * (1 if Growing.walks == 1 else 64))

    with af.Session(local.target("local", 0)) as sess:
        with pytest.raises(RuntimeError, match="changed while Session.run ran"):
            sess.run(Growing([a]))
        assert sess.run([a]) == [1.0]  # the session goes on


def test_session_without_target_runs_locally():
    # Catches: af.Session() (TF's local session) needing a cluster.
    with af.device("/cpu:0"):
        w = af.get_variable("w", (2, 2), af.float32, initializer=af.constant_initializer(2))
        b = af.get_variable("b", (2, 2), af.float32, initializer=af.constant_initializer(5))
    with af.device("/gpu:0"):  # soft placement: the CPU when there is no GPU
        addwb = w + b
    with af.Session() as sess:
        sess.run(af.initialize_all_variables())
        np.testing.assert_array_equal(sess.run(addwb), np.full((2, 2), 7, np.float32))


def test_uninitialized_report(local):
    # Catches: report_uninitialized_variables listing initialized variables.
    a = af.get_variable("a", [1])
    b = af.get_variable("b", [1])
    with af.Session(local.target("local", 0)) as sess:
        assert sorted(sess.run(af.report_uninitialized_variables())) == [b"a", b"b"]
        sess.run(af.global_variables_initializer())
        assert list(sess.run(af.report_uninitialized_variables())) == []


def test_ps_and_two_workers_share_the_variable(ps_workers):
    # Catches: each worker's session getting a variable of its own (the
    # variable must live once on the ps, found by name from each worker).
    with af.device("/job:ps/task:0"):
        var = af.Variable(0.0, name="var")
    inc = var.assign_add(1.0)
    s0 = af.Session(ps_workers.target("worker", 0))
    s1 = af.Session(ps_workers.target("worker", 1))
    try:
        s0.run(af.global_variables_initializer())
        s1.wait_initialized(timeout=10)
        values = []
        for _ in range(5):
            values.append(float(s0.run(inc)))
            values.append(float(s1.run(inc)))
        assert values == [float(i) for i in range(1, 11)]
    finally:
        s0.close()
        s1.close()


def test_wait_releases_the_gil(ps_workers):
    # Catches: a session that holds the GIL while it waits on the cluster.
    # The worker waits for the variable that only another Python thread
    # initializes, and that thread can run only if the wait let go of the GIL
    # (else the wait ends in DeadlineExceededError).
    with af.device("/job:ps/task:0"):
        var = af.Variable(1.0, name="gil_var")
    init = af.global_variables_initializer()
    chief = af.Session(ps_workers.target("worker", 0))
    worker = af.Session(ps_workers.target("worker", 1))
    started = threading.Event()

    def initialize():
        started.wait()
        chief.run(init)

    t = threading.Thread(target=initialize)
    t.start()
    try:
        started.set()
        worker.wait_initialized(timeout=5)
        assert worker.run(var) == 1.0
    finally:
        started.set()
        t.join()
        chief.close()
        worker.close()


def test_two_threads_share_a_session(local):
    # Catches: a session used by two threads at once without its lock (the
    # library's session is one thread at a time): corrupt or lost results.
    v = af.get_variable("counter", [], initializer=af.constant_initializer(0))
    inc = v.assign_add(1.0)
    with af.Session(local.target("local", 0)) as sess:
        sess.run(af.global_variables_initializer())

        def work():
            for _ in range(50):
                sess.run(inc)

        threads = [threading.Thread(target=work) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sess.run(v) == 100.0


def test_server_join_returns_after_stop():
    # Catches: Server.join() not returning once its node stops (or holding
    # the GIL so stop() from another thread could not run).
    with af.train.LocalCluster({"local": 1}) as cluster:
        port = cluster.cluster_spec.task_address("local", 0).rsplit(":", 1)[1]
    spec = af.train.ClusterSpec({"ps": ["127.0.0.1:" + port]})  # the port just freed
    server = af.train.Server(spec, "ps", 0)
    assert server.target == "actorflow://127.0.0.1:" + port
    joining = threading.Event()

    def stop_when_joining():
        joining.wait()  # runs once join() lets go of the GIL
        server.stop()

    stopper = threading.Thread(target=stop_when_joining)
    stopper.start()
    joining.set()
    server.join()
    stopper.join()


def test_cluster_spec():
    # Catches: a malformed ClusterSpec accepted (it would fail later, far
    # from the typo).
    spec = af.train.ClusterSpec({"ps": ["127.0.0.1:2222"], "worker": ["127.0.0.1:2223", "127.0.0.1:2224"]})
    assert spec.jobs == ["ps", "worker"]
    assert spec.num_tasks("worker") == 2
    assert spec.as_dict()["worker"][1] == "127.0.0.1:2224"
    with pytest.raises(af.errors.InvalidArgumentError):
        af.train.ClusterSpec({"ps": ["no-port"]})


def test_gradient_descent_minimize_trains(ps_workers):
    # Catches: minimize() updating with the wrong sign or not every variable
    # (the loss would not fall to the planted fit), or an Operation fetch
    # that returns values instead of None.
    rng = np.random.RandomState(0)
    xs = rng.randn(64, 3).astype(np.float32)
    ys = xs @ np.array([[1.0], [-2.0], [0.5]], np.float32) + 0.25
    with af.device("/job:ps/task:0"):
        w = af.get_variable("w", [3, 1])
        b = af.get_variable("b", [1])
    x = af.placeholder(af.float32, name="x")
    y = af.placeholder(af.float32, name="y")
    loss = af.reduce_mean(af.square(x @ w + b - y))
    train_op = af.train.GradientDescentOptimizer(0.1).minimize(loss)
    assert train_op.size == 2
    with af.Session(ps_workers.target("worker", 0)) as sess:
        sess.run(af.global_variables_initializer())
        first = float(sess.run(loss, feed_dict={x: xs, y: ys}))
        for _ in range(200):
            assert sess.run(train_op, feed_dict={x: xs, y: ys}) is None
        last = float(sess.run(loss, feed_dict={x: xs, y: ys}))
        assert sess.run(af.group(w.assign_add(np.zeros((3, 1), np.float32)))) is None
        np.testing.assert_allclose(sess.run(w).ravel(), [1.0, -2.0, 0.5], atol=1e-3)
        np.testing.assert_allclose(sess.run(b), [0.25], atol=1e-3)
    assert last < first * 1e-4


def test_a_feed_of_another_shape_than_its_placeholder_is_refused():
    # Catches: a placeholder's shape ignored (docs/python.md promises that it
    # is checked; a feed of [3] ran through a placeholder of shape [2]).
    p = af.placeholder(af.float32, [2])
    q = af.placeholder(af.float32, [None, 3])
    r = af.placeholder(af.float32)  # no shape: any
    y, z, w = p * 2.0, q + 0.0, r + 0.0
    with af.Session() as sess:
        np.testing.assert_array_equal(sess.run(y, {p: [1, 2]}), [2, 4])
        assert sess.run(z, {q: np.zeros([4, 3])}).shape == (4, 3)
        assert sess.run(w, {r: np.zeros([1, 2, 3])}).shape == (1, 2, 3)
        with pytest.raises(ValueError, match=r"shape \(3,\) for Tensor 'Placeholder:0', which has shape '\(2,\)'"):
            sess.run(y, {p: [1, 2, 3]})
        with pytest.raises(ValueError, match=r"shape \(1, 2\) .* which has shape '\(\?, 3\)'"):
            sess.run(z, {q: [[1, 2]]})
        with pytest.raises(ValueError, match=r"shape \(1, 2\) .* which has shape '\(2,\)'"):
            sess.run(y, {p: [[1, 2]]})


def test_a_placeholder_shape_that_is_not_one_is_refused():
    # Catches: a negative size, a float or a string taken as a shape.
    for bad in ([-5], [1.5], "ab", [True], [2**63]):
        with pytest.raises(ValueError, match="is not a shape"):
            af.placeholder(af.float32, bad)
    af.placeholder(af.float32, (np.int64(2), None, -1))
    af.placeholder(af.float32, 3)


def test_feed_dict_that_is_not_a_dict_is_a_type_error():
    # Catches: a list of pairs iterated as a dict (nothing fed, and the run
    # then said the placeholder needs a value, which it had been given).
    p = af.placeholder(af.float32, [2])
    with af.Session() as sess:
        with pytest.raises(TypeError, match="feed_dict is a dict"):
            sess.run(p + 1.0, feed_dict=[(p, [1, 2])])


def test_fetches_nested_too_deep_raise_recursion_error():
    # Catches: the fetch structure walked recursively in C++ without a bound
    # (200,000 nested lists overflowed the stack: SIGSEGV of the interpreter).
    c = af.constant(1.0)
    deep = c
    for _ in range(200000):
        deep = [deep]
    with af.Session() as sess:
        with pytest.raises(RecursionError):
            sess.run(deep)
        assert sess.run([[[c]]]) == [[[1.0]]]


def test_timeouts_must_be_positive_seconds(local):
    # Catches: NaN, negative or huge timeouts cast to milliseconds unchecked
    # (a wait that gave up at once "after -9223372036854775808 ms").
    v = af.get_variable("v", [1])
    for bad in (float("nan"), -1.0, 0.0, 1e300, float("inf")):
        with pytest.raises(ValueError, match="positive number of seconds"):
            af.Session(local.target("local", 0), timeout=bad)
    with af.Session(local.target("local", 0), timeout=5) as sess:
        sess.run(af.global_variables_initializer())
        for bad in (float("nan"), -1.0, 1e300):
            with pytest.raises(ValueError, match="positive number of seconds"):
                sess.wait_initialized(bad)
        sess.wait_initialized(5, [v])
        with pytest.raises(TypeError, match="var_list holds variables"):
            sess.wait_initialized(5, [3])


def test_a_node_for_another_cluster_fails_only_the_runs_that_need_it(local):
    # Catches: the refusal of a variable the fetches do not need (TF prunes
    # the graph first; so does the session: test_prune.py), or a refusal
    # of one they need that does not say why.
    with af.device("/job:ps/task:0"):
        var = af.Variable(1.0, name="var")
    with af.Session(local.target("local", 0)) as sess:
        assert sess.run(af.constant(3)) == 3
        with pytest.raises(af.errors.InvalidArgumentError) as e:
            sess.run(var)
    assert "job 'ps' is not in the cluster" in str(e.value) and e.value.af_code == "unknown_device"


def test_variables_initializer_and_variable_initializer_initialize_only_theirs(local):
    # Catches: TF 1.x's tf.variables_initializer(var_list) and
    # sess.run(v.initializer) were AttributeErrors, so a script that
    # initializes its variables one set at a time could not run.
    with af.Graph().as_default():
        # Made while the graph has no variable: TF's no-ops, not "every variable" (the
        # library's empty list), so the variables made after them stay uninitialized.
        early_init = af.global_variables_initializer()
        early_report = af.report_uninitialized_variables()
        a = af.Variable(1.0, name="only_a")
        b = af.Variable(2.0, name="only_b")
        c = af.Variable(3.0, name="only_c")
        with af.Session(local.target("local", 0)) as sess:
            assert sess.run(early_init) is None
            assert list(sess.run(early_report)) == []
            assert len(sess.run(af.report_uninitialized_variables())) == 3
            assert sess.run(af.variables_initializer([a])) is None
            assert sorted(sess.run(af.report_uninitialized_variables())) == [b"only_b", b"only_c"]
            sess.run(b.initializer)
            assert sess.run([a, b]) == [1.0, 2.0]
            assert list(sess.run(af.report_uninitialized_variables())) == [b"only_c"]
            sess.run(af.variables_initializer([]))
            with pytest.raises(af.errors.FailedPreconditionError, match="only_c"):
                sess.run(c)
        with pytest.raises(TypeError, match="var_list holds variables"):
            af.variables_initializer([a, a + 1.0])
        with pytest.raises(TypeError, match="var_list is a list of variables"):
            af.variables_initializer(a)
        with pytest.raises(AttributeError, match="is not a variable"):
            (a * 2.0).initializer
    with af.Graph().as_default():
        other = af.Variable(1.0, name="elsewhere")
    with pytest.raises(ValueError, match="two graphs"):
        af.variables_initializer([a, other])


def test_fetches_and_feeds_by_tf_name(local):
    # Catches: TF 1.x scripts feed and fetch by name (feed_dict={"x:0": ...},
    # sess.run("loss:0"), sess.run("train"), graph.get_tensor_by_name); each
    # was a TypeError.
    with af.Graph().as_default() as g:
        x = af.placeholder(af.float32, [None], name="x")
        with af.device("/job:local/task:0"):
            v = af.Variable(0.0, name="v")
        loss = af.reduce_sum(x * 2.0, name="loss")
        bump = v.assign_add(1.0, name="bump")
        assert g.get_tensor_by_name("loss:0").name == "loss:0"
        with af.Session(local.target("local", 0)) as sess:
            sess.run(af.global_variables_initializer())
            feed = {"x:0": np.array([1.0, 2.0], np.float32)}
            assert sess.run("loss:0", feed) == 6.0
            assert sess.run({"l": ["loss:0"], "t": loss}, feed_dict=feed) == {"l": [6.0], "t": 6.0}
            assert sess.run("bump") is None                 # an operation: run, nothing back
            assert sess.run("v:0") == 1.0
            with pytest.raises(KeyError, match="no node 'lost'"):
                sess.run("lost:0")
            with pytest.raises(KeyError, match="one output"):
                sess.run("loss:1")
            with pytest.raises(TypeError, match="refers to an Operation"):
                sess.run(loss, feed_dict={"x": [1.0]})
            with pytest.raises(KeyError, match="no node 'y'"):
                sess.run(loss, feed_dict={"y:0": [1.0]})
        with pytest.raises(ValueError, match="refers to an Operation"):
            g.get_tensor_by_name("loss")
