"""Hostile inputs a new user (or an attacker) gives the module: each must be a
Python exception that names the thing and what to do, never a crash."""
import subprocess
import sys

import pytest

import actorflow as af


@pytest.mark.parametrize("cluster, names", [
    (["127.0.0.1:2222"], "dict of job name"),
    ("ps", "dict of job name"),
    ({1: ["127.0.0.1:2222"]}, "job name is a string"),
    ({"ps": "127.0.0.1:2222"}, "job 'ps' is a list"),
    ({"ps": [2222]}, "job 'ps' is a list"),
    ({"ps": {"0": "127.0.0.1:2222"}}, "job 'ps' as a dict"),
    ({"ps": {0: 2222}}, "job 'ps' as a dict"),
])
def test_cluster_spec_of_the_wrong_types_is_a_type_error(cluster, names):
    # Catches: a list or string taken as a dict with no jobs ("the cluster
    # has no jobs"), and a job's value of the wrong type raised as pybind11's
    # RuntimeError "Unable to cast Python instance to C++ type", which names
    # neither the job nor what it takes.
    with pytest.raises(TypeError, match=names):
        af.train.ClusterSpec(cluster)
    assert af.train.ClusterSpec({"ps": ("127.0.0.1:2222",), "worker": {0: "127.0.0.1:2223"}}).as_dict() \
        == {"ps": ["127.0.0.1:2222"], "worker": ["127.0.0.1:2223"]}


def test_tf_config_with_non_ascii_garbage_is_invalid_argument(monkeypatch):
    # Catches: the JSON parser's sentence quoting half of a UTF-8 character
    # ("last read: '\xc3'"), turned into UnicodeDecodeError instead of the
    # library's error.
    monkeypatch.setenv("TF_CONFIG", "\u00ff")
    with pytest.raises(af.errors.InvalidArgumentError, match="TF_CONFIG"):
        af.train.ClusterSpec.from_tf_config()


def test_graph_exit_without_enter_is_an_error_not_a_crash():
    # Catches: Graph.__exit__ popping an empty stack of default graphs
    # (SIGSEGV). In a child process, so that a crash fails the test only.
    code = ("import actorflow as af\n"
            "try:\n"
            "    af.Graph().__exit__(None, None, None)\n"
            "except ValueError as e:\n"
            "    print('ValueError', e)\n"
            "print(af.get_default_graph() is not None)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "ValueError Graph.__exit__ without its __enter__" in r.stdout
    assert r.stdout.strip().endswith("True")


def test_local_cluster_with_too_many_tasks_is_refused_before_starting():
    # Catches: {"worker": 100000} starting nodes until the process ran out
    # of file descriptors (seconds, then UnavailableError or an exit).
    with pytest.raises(af.errors.InvalidArgumentError, match="at most 128"):
        af.train.LocalCluster({"worker": 100000})
    with pytest.raises(af.errors.InvalidArgumentError, match="at most 128"):
        af.train.LocalCluster({"ps": 64, "worker": 65})


def test_a_feed_of_none_is_a_type_error_not_nan(local):
    # Catches: np.asarray(None, float32) is NaN, so a placeholder fed None
    # silently ran on a NaN.
    x = af.placeholder(af.float32)
    with af.Session(local.target("local", 0)) as sess:
        with pytest.raises(TypeError, match="None"):
            sess.run(x * 2.0, {x: None})
        assert float(sess.run(x * 2.0, {x: 1.5})) == 3.0
    with pytest.raises(TypeError, match="None"):
        af.constant(None)


def test_session_and_saver_arguments_of_the_wrong_type_name_themselves(local):
    # Catches: Session(timeout="x") raised pybind11's RuntimeError "Unable to
    # cast Python instance to C++ type", and Saver.save(5, ...) an
    # AttributeError about 'graph'; neither said which argument was wrong.
    with pytest.raises(TypeError, match="timeout"):
        af.Session(local.target("local", 0), timeout="x")
    with af.device("/job:local/task:0"):
        af.Variable(1.0, name="v")
    saver = af.train.Saver()
    with pytest.raises(TypeError, match="af.Session"):
        saver.save(5, "/tmp/never-written", global_step=1)
    with pytest.raises(TypeError, match="af.Session"):
        saver.restore("sess", "/tmp/never-written")


def test_a_job_callback_that_cannot_be_called_is_refused_at_once():
    # Catches: callback=5 taken, the job started, and stopped at its first
    # record with "'int' object is not callable".
    with pytest.raises(TypeError, match="callback"):
        af.train.Job({"mode": "async", "model": "softmax", "steps": 10}, callback=5)


@pytest.mark.parametrize("call, names", [
    (lambda: af.train.LocalCluster({"worker": 2.5}), "task count of job 'worker'"),
    (lambda: af.train.LocalCluster({"worker": "2"}), "task count of job 'worker'"),
    (lambda: af.train.LocalCluster({1: 2}), "job name"),
    (lambda: af.train.LocalCluster([("worker", 2)]), "jobs"),
    (lambda: af.train.create_local_cluster(2.5, 1), "num_workers"),
    (lambda: af.train.create_local_cluster(1, "1"), "num_ps"),
    (lambda: af.train.Server({"ps": ["127.0.0.1:1"]}, "ps", "0"), "task_index"),
    (lambda: af.train.Server({"ps": ["127.0.0.1:1"]}, "ps", 0.0), "task_index"),
    (lambda: af.train.Server({"ps": ["127.0.0.1:1"]}, 0, 0), "job_name"),
    (lambda: af.train.Server({"ps": ["127.0.0.1:1"]}, "ps", 0, threads=1.5), "threads"),
    (lambda: af.train.ClusterSpec({"ps": ["127.0.0.1:1"]}).task_address("ps", "0"), "task_index"),
    (lambda: af.train.ClusterSpec({"ps": ["127.0.0.1:1"]}).num_tasks(1), "job_name"),
    (lambda: af.train.Job({"model": "softmax"}, workers=2.5), "workers"),
    (lambda: af.train.Job({"model": "softmax"}, ps="1"), "ps"),
    (lambda: af.Session(1), "target"),
    (lambda: af.Session("", graph="g"), "graph"),
])
def test_arguments_that_are_not_whole_numbers_or_strs_name_themselves(call, names):
    # Catches: pybind11's "incompatible constructor arguments" (a TypeError
    # listing C++ signatures) for a count of 2.5 or a task_index of "1": the
    # error must name the argument and say what to pass.
    with pytest.raises(TypeError) as e:
        call()
    text = str(e.value)
    assert names in text, text
    assert "incompatible" not in text, text
    assert "give a" in text or "is a dict" in text or "is an af.Graph" in text, text


def test_a_whole_number_out_of_range_is_a_value_error_and_numpy_ints_are_taken():
    # Catches: a negative task count taken (it started no task), and NumPy's
    # integers refused where Python's are taken.
    import numpy as np
    with pytest.raises(ValueError, match="task count of job 'worker' is -1"):
        af.train.LocalCluster({"worker": -1})
    with af.train.LocalCluster({"worker": np.int64(1)}) as cluster:
        assert cluster.target("worker", np.int32(0)).startswith("actorflow://")


def test_wait_and_job_timeouts_of_the_wrong_type_name_themselves(local):
    # Catches: wait_initialized(timeout="1") and Job.result(timeout="1"),
    # pybind11's "incompatible function arguments".
    with pytest.raises(TypeError, match="wait_initialized: timeout"):
        with af.Session(local.target("local", 0)) as sess:
            sess.wait_initialized(timeout="1")
    job = af.train.Job({"mode": "async", "model": "softmax", "steps": 10})
    with pytest.raises(TypeError, match="Job.result: timeout"):
        job.result(timeout="1")
    with pytest.raises(TypeError, match="Job.next: timeout"):
        job.next(timeout=None)


@pytest.mark.parametrize("call, names", [
    (lambda: af.Variable(1.0, name="w\ud800"), "name"),
    (lambda: af.constant(1.0, name="c\udcff"), "name"),
    (lambda: af.Session("actorflow://\ud800:1"), "Session: target"),
    (lambda: af.train.LocalCluster({"\udcff": 1}), "job name"),
    (lambda: af.train.ClusterSpec({"ps": ["\ud800:1"]}), "job 'ps': an address"),
    (lambda: af.train.ClusterSpec({"ps": {0: "\ud800:1"}}), "job 'ps': an address"),
    (lambda: af.train.Job({"mode": "\udcff"}), "mode"),
    (lambda: af.train.Job("\udcff.toml"), "config path"),
])
def test_a_str_that_is_not_unicode_text_names_itself(call, names):
    # Catches: a lone surrogate (os.fsdecode of bytes that are not UTF-8) was
    # pybind11's RuntimeError "Unable to cast Python instance to C++ type",
    # which names neither the argument nor what to pass.
    with pytest.raises(ValueError) as e:
        call()
    text = str(e.value)
    assert names in text and "not valid Unicode text" in text, text


@pytest.mark.parametrize("call, error, names", [
    (lambda: af.group(5), TypeError, "af.group: an input is 5"),
    (lambda: af.get_variable("hostile_shape", 3), TypeError, "get_variable 'hostile_shape': shape"),
    (lambda: af.reduce_sum(af.constant([[1.0]]), axis=2**40), ValueError, "af.reduce_sum: axis"),
    (lambda: af.reduce_sum(af.constant([[1.0]]), axis=[0, 1]), ValueError, "af.reduce_sum: axis"),
    (lambda: af.Session(timeout=object()), TypeError, "Session: timeout"),
])
def test_arguments_pybind11_could_not_cast_name_themselves(call, error, names):
    # Catches: each was RuntimeError "Unable to cast Python instance to C++ type".
    with pytest.raises(error) as e:
        call()
    assert names in str(e.value), str(e.value)


def test_an_index_or_float_that_raises_is_that_error_not_a_cast_error(local):
    # Catches: an object whose __index__ / __float__ raises was swallowed into
    # pybind11's "Unable to cast": the caller's own exception must come through.
    class Hostile:
        def __index__(self):
            raise LookupError("hostile __index__")

        def __float__(self):
            raise LookupError("hostile __float__")

    for call in (lambda: af.get_variable("hostile_dim", [Hostile()]),
                 lambda: af.reduce_sum(af.constant([[1.0]]), axis=Hostile()),
                 lambda: af.Session(timeout=Hostile())):
        with pytest.raises(LookupError, match="hostile"):
            call()


def test_saver_max_to_keep_takes_none_as_tf_does_and_refuses_negatives(tmp_path):
    # Catches: max_to_keep=None (TF: keep every file) and -1 were pybind11's
    # "incompatible constructor arguments".
    with af.Graph().as_default():
        v = af.Variable(1.0, name="kept")
        saver = af.train.Saver([v], max_to_keep=None)
        with pytest.raises(ValueError, match="Saver: max_to_keep is -1"):
            af.train.Saver([v], max_to_keep=-1)
        with af.Session() as sess:
            sess.run(af.global_variables_initializer())
            for step in range(7):
                saver.save(sess, str(tmp_path), global_step=step)
    assert len(list(tmp_path.glob("ckpt-*.afck"))) == 7


def test_stopping_a_server_of_create_local_server_says_how_it_stops():
    # Catches: Server.create_local_server().stop() said "a LocalCluster's task
    # stops with its cluster (LocalCluster.stop())" to a user who made no
    # LocalCluster and has none to stop.
    server = af.train.Server.create_local_server()
    with pytest.raises(af.errors.InvalidArgumentError) as e:
        server.stop()
    assert "create_local_server()" in str(e.value) and "del them" in str(e.value), str(e.value)
    workers, _ = af.train.create_local_cluster(1, 0)
    with pytest.raises(af.errors.InvalidArgumentError, match="create_local_cluster"):
        workers[0].stop()
