"""The learning rate of af.train's optimizers as TF's take it: a Python
number, a NumPy scalar or 0-d array, or a scalar float Tensor (a
placeholder fed each step, a variable), read by every update in the graph."""
import numpy as np
import pytest

import actorflow as af


def _one_step(opt_of_lr, lr, feed=None):
    """w after one step of w * w from w = 1 (gradient 2)."""
    w = af.Variable(np.float32(1.0), name="w")
    train = opt_of_lr(lr).minimize(af.square(w))
    with af.Session() as sess:
        sess.run(af.global_variables_initializer())
        sess.run(train, feed or {})
        return float(sess.run(w))


@pytest.mark.parametrize("lr", [0.25, np.float32(0.25), np.float64(0.25), np.array(0.25),
                                np.array(0.25, np.float32), np.int64(0)])
def test_a_number_in_any_of_numpys_forms_is_a_learning_rate(lr):
    # Catches: a NumPy scalar or a 0-d array refused (TypeError) or taken
    # wrongly as a learning rate. (pybind11's float conversion took them
    # before the rate had a conversion of its own; this keeps it so.)
    assert _one_step(af.train.GradientDescentOptimizer, lr) == pytest.approx(1 - 2 * float(lr))


def test_what_is_not_a_number_or_a_scalar_tensor_is_refused():
    # Catches: a string parsed as a number, a 1-element array or a bool taken.
    for bad in ("0.1", np.array([0.1]), True, None, [0.1]):
        with pytest.raises(TypeError, match="learning_rate must be a number"):
            af.train.GradientDescentOptimizer(bad)
    with pytest.raises(ValueError, match="must be a scalar Tensor; 'lr:0' has shape \\[2\\]"):
        af.train.MomentumOptimizer(af.placeholder(af.float32, [2], name="lr"), 0.9)
    with pytest.raises(TypeError, match="float32 or float64 Tensor; 'step:0' is int32"):
        af.train.AdamOptimizer(af.placeholder(af.int32, [], name="step"))


def test_a_placeholder_learning_rate_is_fed_each_step():
    # Catches: a Tensor learning rate refused, or read once when the graph
    # is built instead of at each run.
    lr = af.placeholder(af.float32, [], name="lr")
    w = af.Variable(np.float32(1.0), name="w")
    train = af.train.GradientDescentOptimizer(lr).minimize(af.square(w))
    with af.Session() as sess:
        sess.run(af.global_variables_initializer())
        sess.run(train, {lr: 0.25})
        assert float(sess.run(w)) == pytest.approx(0.5)
        sess.run(train, {lr: 0.0})
        assert float(sess.run(w)) == pytest.approx(0.5)
        sess.run(train, {lr: 0.5})  # w -= 0.5 * 2 * 0.5
        assert float(sess.run(w)) == pytest.approx(0.0)


def test_a_variable_learning_rate_on_the_ps_decays(ps_workers):
    # Catches: a learning rate variable not read where the updates run (each
    # variable's update on the ps, the rate a variable of the ps too).
    with af.device("/job:ps/task:0"):
        w = af.Variable(np.float32(1.0), name="w")
        lr = af.Variable(np.float32(0.25), trainable=False, name="lr")
    with af.device("/job:worker/task:0"):
        loss = af.square(w)
    train = af.train.MomentumOptimizer(lr, 0.0).minimize(loss)
    halve = lr.assign(lr * 0.5)
    with af.Session(ps_workers.target("worker", 0)) as sess:
        sess.run(af.global_variables_initializer())
        sess.run(train)
        assert float(sess.run(w)) == pytest.approx(0.5)   # 1 - 0.25 * 2
        sess.run(halve)
        sess.run(train)
        assert float(sess.run(w)) == pytest.approx(0.375)  # 0.5 - 0.125 * 1


def test_adam_takes_a_tensor_learning_rate():
    # Catches: Adam's bias-corrected rate built from the number only.
    lr = af.placeholder(af.float32, [], name="lr")
    w = af.Variable(np.float32(1.0), name="w")
    train = af.train.AdamOptimizer(lr).minimize(af.square(w))
    with af.Session() as sess:
        sess.run(af.global_variables_initializer())
        sess.run(train, {lr: 0.1})
        # Adam's first step moves by lr (m / sqrt(v) = 1, bias-corrected).
        assert float(sess.run(w)) == pytest.approx(0.9, abs=1e-5)
        sess.run(train, {lr: 0.0})
        assert float(sess.run(w)) == pytest.approx(0.9, abs=1e-5)


def test_a_fed_train_op_sends_no_updated_value_back(ps_workers):
    # Catches: a train op run with a feed (its learning rate, a batch: every
    # TF training loop) fetched each update's new value to the client, as a
    # fetched tensor is: a [1M] variable on the ps came back (4 MiB, the
    # trace's bytes_out of its assign_sub) at every step, 3.5x the step's
    # time. Without a feed it was run as a target and sent nothing back.
    with af.device("/job:ps/task:0"):
        w = af.Variable(np.ones(1 << 20, np.float32), name="w")
    lr = af.placeholder(af.float32, [], name="lr")
    with af.device("/job:worker/task:0"):
        loss = af.reduce_sum(w)
    train = af.train.GradientDescentOptimizer(lr).minimize(loss)
    with af.Session(ps_workers.target("worker", 0)) as sess:
        sess.run(af.global_variables_initializer())
        md = af.RunMetadata()
        assert sess.run(train, {lr: 0.5}, options=af.RunOptions(trace=True), run_metadata=md) is None
        updates = [e for e in md.trace if e.kind == "assign_sub"]
        assert [(e.op, e.bytes_out) for e in updates] == [("w/assign_sub", 0)]
        assert float(sess.run(w)[0]) == pytest.approx(0.5)  # the step did run: 1 - 0.5 * 1
