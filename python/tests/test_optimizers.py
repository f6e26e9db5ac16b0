"""af.train's optimizers (python/optimizers.cpp): MomentumOptimizer and
AdamOptimizer against a NumPy reference of TF 1.x's update kernels
(ApplyMomentum, ApplyAdam), their slots on their variable's device, and
compute_gradients / apply_gradients. Each step's gradients are fetched in
the run that applies them, so the reference applies the very same ones."""
import numpy as np
import pytest

import actorflow as af

XS = np.array([[1, 2, 0.5], [0, -1, 2], [3, 1, -1], [2, 0, 1]], np.float32)
YS = (XS @ np.array([[1.0], [-2.0], [0.5]], np.float32) + 0.25).astype(np.float32)


def _model(device=None):
    def build():
        w = af.Variable(np.full((3, 1), 0.1, np.float32), name="w")
        b = af.Variable(np.zeros(1, np.float32), name="b")
        return w, b
    if device:
        with af.device(device):
            w, b = build()
    else:
        w, b = build()
    x = af.placeholder(af.float32, name="x")
    y = af.placeholder(af.float32, name="y")
    loss = af.reduce_mean(af.square(x @ w + b - y))
    return w, b, {x: XS, y: YS}, loss


class MomentumRef:
    """TF 1.x's ApplyMomentum: accum = accum * momentum + g; var -= accum * lr
    (Nesterov: var -= g * lr + accum * momentum * lr)."""

    def __init__(self, lr, momentum, nesterov):
        self.lr, self.mom, self.nesterov = np.float32(lr), np.float32(momentum), nesterov
        self.accum = {}

    def update(self, name, var, g):
        a = self.accum.get(name, np.zeros_like(var)) * self.mom + g
        self.accum[name] = a
        if self.nesterov:
            return var - (g * self.lr + a * self.mom * self.lr)
        return var - a * self.lr

    def next_step(self):
        pass


class AdamRef:
    """TF 1.x's ApplyAdam: lr_t = lr * sqrt(1 - beta2^t) / (1 - beta1^t);
    m += (g - m) * (1 - beta1); v += (g * g - v) * (1 - beta2);
    var -= m * lr_t / (sqrt(v) + epsilon), in float32."""

    def __init__(self, lr, beta1, beta2, epsilon):
        f = np.float32
        self.lr, self.b1, self.b2, self.eps = f(lr), f(beta1), f(beta2), f(epsilon)
        self.p1, self.p2 = f(1), f(1)
        self.slots = {}
        self.next_step()

    def update(self, name, var, g):
        one = np.float32(1)
        lr_t = self.lr * np.sqrt(one - self.p2) / (one - self.p1)
        m, v = self.slots.get(name, (np.zeros_like(var), np.zeros_like(var)))
        m = m + (g - m) * (one - self.b1)
        v = v + (g * g - v) * (one - self.b2)
        self.slots[name] = (m, v)
        return var - (m * lr_t) / (np.sqrt(v) + self.eps)

    def next_step(self):
        self.p1, self.p2 = self.p1 * self.b1, self.p2 * self.b2


def _check_steps(sess, opt, w, b, feed, loss, ref, steps):
    grads_and_vars = opt.compute_gradients(loss)
    assert [v.name for _, v in grads_and_vars] == ["w:0", "b:0"]
    train_op = opt.apply_gradients(grads_and_vars)
    sess.run(af.global_variables_initializer())
    want = {"w": sess.run(w), "b": sess.run(b)}
    for _ in range(steps):
        gw, gb, _ = sess.run([grads_and_vars[0][0], grads_and_vars[1][0], train_op], feed_dict=feed)
        want["w"] = ref.update("w", want["w"], gw)
        want["b"] = ref.update("b", want["b"], gb)
        ref.next_step()
        np.testing.assert_allclose(sess.run(w), want["w"], rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(sess.run(b), want["b"], rtol=1e-6, atol=1e-7)
    return sess.run(loss, feed_dict=feed)


@pytest.mark.parametrize("nesterov", [False, True])
def test_momentum_steps_match_tf_momentum_update(local, nesterov):
    # Catches: momentum as plain SGD, Nesterov ignored, the slot not kept
    # between runs (each step's accum would start at 0 again).
    w, b, feed, loss = _model()
    opt = af.train.MomentumOptimizer(0.05, 0.9, use_nesterov=nesterov)
    with af.Session(local.target("local", 0)) as sess:
        sess.run(af.global_variables_initializer())
        first = sess.run(loss, feed_dict=feed)
        last = _check_steps(sess, opt, w, b, feed, loss, MomentumRef(0.05, 0.9, nesterov), 6)
    assert last < first
    names = [v.name[:-2] for v in af.global_variables()]
    assert "w/Momentum" in names and "b/Momentum" in names


def test_adam_steps_match_tf_adam_update(local):
    # Catches: no bias correction, the powers not advancing each run, m and
    # v's formulas swapped or not kept between runs.
    w, b, feed, loss = _model()
    opt = af.train.AdamOptimizer(0.1, beta1=0.8, beta2=0.95, epsilon=1e-6)
    with af.Session(local.target("local", 0)) as sess:
        sess.run(af.global_variables_initializer())
        first = sess.run(loss, feed_dict=feed)
        last = _check_steps(sess, opt, w, b, feed, loss, AdamRef(0.1, 0.8, 0.95, 1e-6), 5)
    assert last < first
    names = {v.name[:-2] for v in af.global_variables()}
    assert {"w/Adam", "w/Adam_1", "b/Adam", "b/Adam_1", "beta1_power", "beta2_power"} <= names
    assert af.train.AdamOptimizer().minimize(loss).size == 2
    # A second Adam gets slots of its own, as TF's do.
    names = {v.name[:-2] for v in af.global_variables()}
    assert {"beta1_power_1", "w/Adam_2", "w/Adam_1_1"} <= names


def test_slots_live_on_the_ps_and_the_updates_run_there(ps_workers):
    # Catches: slot variables placed where the optimizer was made (the
    # worker) instead of with their variable, as TF's slot_creator does.
    w, b, feed, loss = _model("/job:ps/task:0")
    with af.device("/job:worker/task:0"):
        global_step = af.Variable(np.float32(0), name="global_step")
        train_op = af.train.AdamOptimizer(0.05).minimize(loss, global_step=global_step)
    slots = {v.name[:-2]: v for v in af.global_variables()}
    ps = "/job:ps/replica:0/task:0/device:CPU:0"
    with af.Session(ps_workers.target("worker", 0)) as sess:
        sess.run(af.global_variables_initializer())
        first = sess.run(loss, feed_dict=feed)
        md = af.RunMetadata()
        sess.run(train_op, feed_dict=feed, options=af.RunOptions(trace=True), run_metadata=md)
        for _ in range(20):
            sess.run(train_op, feed_dict=feed)
        for name in ["w/Adam", "w/Adam_1", "b/Adam", "b/Adam_1", "beta1_power", "beta2_power"]:
            assert sess.device_of(slots[name]) == ps, name
        assert sess.device_of(global_step).startswith("/job:worker/")
        assert sess.run(global_step) == 21
        assert sess.run(loss, feed_dict=feed) < first
        updates = [e for e in md.trace if e.kind in ("assign", "assign_sub")]
        assert {e.op.split("/")[0] for e in updates} >= {"w", "b", "beta1_power", "beta2_power"}
        assert {e.device for e in updates} == {ps}
        m = sess.run(slots["w/Adam"])
    assert np.any(m != 0)
    # Worker 1 reads the slot the ps holds.
    with af.Session(ps_workers.target("worker", 1)) as other:
        np.testing.assert_array_equal(other.run(slots["w/Adam"]), m)


def test_apply_gradients_takes_gradients_given_by_the_caller(local):
    w = af.Variable(np.ones(2, np.float32), name="w")
    step = af.Variable(np.int32(0), name="step")
    op = af.train.MomentumOptimizer(0.5, 0.5).apply_gradients(
        [(np.array([1.0, 2.0], np.float32), w)], global_step=step)
    with af.Session(local.target("local", 0)) as sess:
        sess.run(af.global_variables_initializer())
        sess.run(op)
        np.testing.assert_allclose(sess.run(w), [0.5, 0.0])  # accum = g
        sess.run(op)
        np.testing.assert_allclose(sess.run(w), [-0.25, -1.5])  # accum = 1.5 g
        assert sess.run(step) == 2
    with pytest.raises(af.errors.InvalidArgumentError, match="not a variable"):
        af.train.AdamOptimizer().apply_gradients([(1.0, w + 1.0)])
    with pytest.raises(af.errors.InvalidArgumentError, match="no \\(gradient, variable\\)"):
        af.train.AdamOptimizer().apply_gradients([])


def test_optimizers_take_tf_argument_order_and_name(local):
    # Catches: use_nesterov as MomentumOptimizer's third positional argument
    # (TF's is use_locking: MomentumOptimizer(lr, m, True) is not Nesterov),
    # and name= refused or not naming the slots, as TF's does.
    w = af.Variable(np.ones(2, np.float32), name="w")
    op = af.train.MomentumOptimizer(0.5, 0.5, True, "Mom").apply_gradients(
        [(np.array([1.0, 2.0], np.float32), w)])
    af.train.AdamOptimizer(0.1, 0.9, 0.999, 1e-8, False, "MyAdam").apply_gradients(
        [(np.array([1.0, 2.0], np.float32), w)])
    af.train.GradientDescentOptimizer(0.1, use_locking=True, name="sgd")
    names = {v.name[:-2] for v in af.global_variables()}
    assert {"w/Mom", "w/MyAdam", "w/MyAdam_1"} <= names
    with af.Session(local.target("local", 0)) as sess:
        sess.run(af.global_variables_initializer())
        sess.run(op)
        sess.run(op)
        np.testing.assert_allclose(sess.run(w), [-0.25, -1.5])  # plain momentum, not Nesterov


def test_trainable_false_is_not_trained(local):
    # Catches: trainable= refused (TF's global_step idiom,
    # af.Variable(0, trainable=False, name="global_step")), or a
    # non-trainable variable on the loss's path updated by minimize().
    w = af.Variable(np.float32(1), name="w")
    scale = af.Variable(np.float32(2), trainable=False, name="scale")
    frozen = af.get_variable("frozen", [], initializer=3.0, trainable=False)
    global_step = af.Variable(0, trainable=False, name="global_step")
    loss = af.square(w * scale * frozen)
    assert [v.name for v in af.trainable_variables()] == ["w:0"]
    assert len(af.global_variables()) == 4
    train_op = af.train.GradientDescentOptimizer(0.01).minimize(loss, global_step=global_step)
    with af.Session(local.target("local", 0)) as sess:
        sess.run(af.global_variables_initializer())
        sess.run(train_op)
        assert sess.run(scale) == 2 and sess.run(frozen) == 3
        assert sess.run(w) < 1 and sess.run(global_step) == 1


def test_a_variable_off_the_loss_path_gets_a_none_gradient(local):
    # Catches: compute_gradients raising for a var_list variable the loss
    # does not depend on (TF gives (None, var)), and apply_gradients
    # refusing the None that TF skips.
    w = af.Variable(np.float32(1), name="w")
    other = af.Variable(np.float32(5), name="other")
    opt = af.train.GradientDescentOptimizer(0.25)
    gv = opt.compute_gradients(af.square(w), var_list=[w, other])
    assert gv[1][0] is None and gv[1][1].name == "other:0"
    op = opt.apply_gradients(gv)
    with pytest.raises(ValueError, match="no gradients provided"):
        opt.apply_gradients([(None, other)])
    with af.Session(local.target("local", 0)) as sess:
        sess.run(af.global_variables_initializer())
        sess.run(op)
        assert sess.run(w) == 0.5 and sess.run(other) == 5
