"""af.RunOptions(trace=True) / af.RunMetadata (the library's run_trace) and
af.train.Saver (the library's checkpoints) from Python (docs/python.md)."""
import json
import os

import numpy as np
import pytest

import actorflow as af


def test_traced_run_records_where_each_op_ran(ps_workers, tmp_path):
    with af.device("/job:ps/task:0"):
        var = af.Variable(np.zeros(4, np.float32), name="var")
    with af.device("/job:worker/task:0"):
        doubled = var * 2.0
    inc = var.assign_add(np.ones(4, np.float32))
    with af.Session(ps_workers.target("worker", 0)) as sess:
        sess.run(af.global_variables_initializer())
        md = af.RunMetadata()
        assert len(md) == 0
        sess.run(inc, options=af.RunOptions(trace=True), run_metadata=md)
        (update,) = [e for e in md.trace if e.kind == "assign_add"]
        assert update.op == "var/assign_add"
        assert update.device == "/job:ps/replica:0/task:0/device:CPU:0"
        assert update.node == ps_workers.cluster_spec.task_address("ps", 0)
        assert 0 < update.start_ns <= update.end_ns and update.duration_ns >= 0

        sess.run(doubled, options=af.RunOptions(trace_level=af.RunOptions.FULL_TRACE),
                 run_metadata=md)
        kinds = {e.kind for e in md.trace}
        assert "assign_add" not in kinds  # a traced run replaces the last one's entries
        (mul,) = [e for e in md.trace if e.kind == "mul"]
        assert mul.device == "/job:worker/replica:0/task:0/device:CPU:0"
        assert md.step_stats[0].op == md.trace[0].op
        assert "/job:worker/replica:0/task:0/device:CPU:0" in md.by_device()

        chrome = json.loads(md.chrome_json())
        spans = [e for e in chrome["traceEvents"] if e.get("ph") == "X"]
        assert len(spans) == len(md) and any(e["name"] == mul.op for e in spans)
        path = tmp_path / "step.json"
        md.save_chrome_trace(str(path))
        assert json.loads(path.read_text()) == chrome


def test_untraced_runs_leave_the_metadata_alone(local):
    with af.device("/job:local/task:0"):
        var = af.Variable(1.0, name="v")
    with af.Session(local.target("local", 0)) as sess:
        sess.run(af.global_variables_initializer())
        md = af.RunMetadata()
        sess.run(var + 1.0, options=af.RunOptions(trace=True), run_metadata=md)
        traced = len(md)
        assert traced > 0
        sess.run(var + 1.0, run_metadata=md)                     # no options: no trace
        sess.run(var + 1.0, options=af.RunOptions(), run_metadata=md)
        assert len(md) == traced
        with pytest.raises(TypeError, match="af.RunOptions"):
            sess.run(var, options={"trace": True})
        with pytest.raises(TypeError, match="af.RunMetadata"):
            sess.run(var, options=af.RunOptions(trace=True), run_metadata=[])
    with pytest.raises(af.errors.InvalidArgumentError, match="cannot write"):
        md.save_chrome_trace("/nonexistent-dir/step.json")


def _model():
    with af.device("/job:ps/task:0"):
        w = af.get_variable("w", [2, 3], af.float32,
                            initializer=af.random_normal_initializer(seed=3))
        k = af.Variable(np.int64(5), name="k")
    return w, k


def test_saver_round_trip_across_two_clusters(tmp_path):
    w, k = _model()
    bump = [w.assign_add(np.ones((2, 3), np.float32)), k.assign_add(np.int64(1))]
    with af.train.LocalCluster({"ps": 1, "worker": 1}) as cluster:
        with af.Session(cluster.target("worker", 0)) as sess:
            sess.run(af.global_variables_initializer())
            sess.run(bump)
            saved_w, saved_k = sess.run([w, k])
            saver = af.train.Saver(max_to_keep=2)
            path = saver.save(sess, str(tmp_path), global_step=7)
            assert path == os.path.join(str(tmp_path), "ckpt-7.afck")
            assert af.train.latest_checkpoint(str(tmp_path)) == path
            sess.run(bump)                                    # moves on after the save
    # A fresh cluster: its variables have no value until the restore gives them one.
    with af.train.LocalCluster({"ps": 1, "worker": 1}) as cluster:
        with af.Session(cluster.target("worker", 0)) as sess:
            assert sorted(sess.run(af.report_uninitialized_variables())) == [b"k", b"w"]
            af.train.Saver().restore(sess, path)
            got_w, got_k = sess.run([w, k])
            np.testing.assert_array_equal(got_w, saved_w)
            assert got_k == saved_k and got_k.dtype == np.int64
            assert len(sess.run(af.report_uninitialized_variables())) == 0
            sess.run(bump)                                    # and a directory's latest
            af.train.Saver().restore(sess, str(tmp_path))
            np.testing.assert_array_equal(sess.run(w), saved_w)


def test_saver_refuses_what_does_not_fit(tmp_path, local):
    with af.device("/job:local/task:0"):
        v = af.Variable(np.zeros(3, np.float32), name="v")
    with af.Session(local.target("local", 0)) as sess:
        sess.run(af.global_variables_initializer())
        path = af.train.Saver({"renamed": v}).save(sess, str(tmp_path / "a"))
        with pytest.raises(af.errors.NotFoundError, match="no variable 'v'"):
            af.train.Saver().restore(sess, path)
        assert af.train.Saver({"renamed": v}).names == ["renamed"]
        with pytest.raises(af.errors.NotFoundError, match="holds no checkpoint"):
            af.train.Saver().restore(sess, str(tmp_path))
        assert af.train.latest_checkpoint(str(tmp_path)) is None
    af.reset_default_graph()
    with af.device("/job:local/task:0"):
        af.Variable(np.zeros(4, np.float32), name="renamed")
    with af.Session(local.target("local", 0)) as sess:
        with pytest.raises(af.errors.InvalidArgumentError, match=r"\(4,\) float32 here and \(3,\)"):
            af.train.Saver().restore(sess, path)
    with pytest.raises(ValueError, match="No variables to save"):
        af.train.Saver(var_list=[])


def test_saver_global_step_is_a_whole_number_or_the_step_tensor(tmp_path, local):
    # Catches: global_step cast straight to uint64 (RuntimeError "Unable to
    # cast Python instance" for -1 or 2**70, and for TF's idiom of passing
    # the global step variable itself), and a path with a NUL byte that
    # made the directory before the NUL and failed on a confusing sentence.
    with af.device("/job:local/task:0"):
        v = af.Variable(np.zeros(3, np.float32), name="v")
        step = af.Variable(np.int64(42), name="global_step")
    saver = af.train.Saver([v])
    with af.Session(local.target("local", 0)) as sess:
        sess.run(af.global_variables_initializer())
        assert saver.save(sess, str(tmp_path), global_step=step).endswith("ckpt-42.afck")
        assert saver.save(sess, str(tmp_path), global_step=np.int32(7)).endswith("ckpt-7.afck")
        for bad in (-1, 2**70):
            with pytest.raises(ValueError, match="is not a step"):
                saver.save(sess, str(tmp_path), global_step=bad)
        with pytest.raises(TypeError, match="whole number"):
            saver.save(sess, str(tmp_path), global_step=1.5)
        with pytest.raises(ValueError, match="null byte"):
            saver.save(sess, str(tmp_path / "a\0b"), global_step=1)
        assert not (tmp_path / "a").exists()
        with pytest.raises(ValueError, match="null byte"):
            saver.restore(sess, str(tmp_path) + "\0x")
        with pytest.raises(ValueError, match="null byte"):
            af.train.latest_checkpoint(str(tmp_path) + "\0x")
