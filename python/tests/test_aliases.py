"""TF 1.x's names for the registry's ops (python/ops.cpp): af.nn, af.math
and tf.subtract & co. at the top. Each alias must be the registry op's own
function and build that op's node; an op the registry lacks has none."""
import numpy as np
import pytest

import actorflow as af

# alias -> the registry op (kernels/op_registry.cpp) it names.
ALIASES = {
    "nn.relu": "relu", "nn.sigmoid": "sigmoid", "nn.tanh": "tanh", "nn.softmax": "softmax",
    "nn.log_softmax": "log_softmax", "nn.softplus": "softplus",
    "math.add": "add", "math.subtract": "sub", "math.multiply": "mul", "math.divide": "div",
    "math.negative": "neg", "math.exp": "exp", "math.log": "log", "math.sqrt": "sqrt",
    "math.square": "square", "math.tanh": "tanh", "math.sigmoid": "sigmoid",
    "math.softplus": "softplus", "math.reduce_sum": "sum", "math.reduce_mean": "mean",
    "math.reduce_max": "max", "math.unsorted_segment_sum": "unsorted_segment_sum",
    "subtract": "sub", "multiply": "mul", "divide": "div", "negative": "neg",
}


def resolve(path):
    obj = af
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


def registry_function(op):
    """The module's function of registry op `op` (reduce_sum for "sum")."""
    for name in dir(af):
        fn = getattr(af, name)
        if callable(fn) and (getattr(fn, "__doc__", "") or "").find("registry's op '%s'" % op) >= 0:
            return fn
    raise AssertionError("no function of registry op %r" % op)


@pytest.mark.parametrize("alias", sorted(ALIASES))
def test_each_alias_is_the_registry_op(alias):
    # Catches: an alias missing, or bound to another op than TF's name says.
    op = ALIASES[alias]
    fn = resolve(alias)
    assert fn is registry_function(op)
    x = af.constant(np.ones((2, 3), np.float32))
    inputs = fn.__doc__.split("(", 1)[1].split(", /")[0].split(", ")  # "A, B, /, *, ..."
    args = [x] * len(inputs)
    if op == "unsorted_segment_sum":
        args = [x, af.constant(np.array([0, 1], np.int32)), af.constant(np.int32(2))]
    node = fn(*args)
    assert node.op_name == op


def test_aliases_compute_what_tf_computes(local):
    x = af.constant(np.array([[1.0, -2.0], [3.0, 0.5]], np.float32))
    labels = af.constant(np.array([1, 0], np.int32))
    with af.Session(local.target("local", 0)) as sess:
        got = sess.run({"sub": af.subtract(x, 1.0), "neg": af.math.negative(x),
                        "sum": af.math.reduce_sum(x, axis=1),
                        "xent": af.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=x)})
    v = np.array([[1.0, -2.0], [3.0, 0.5]], np.float32)
    np.testing.assert_allclose(got["sub"], v - 1)
    np.testing.assert_allclose(got["neg"], -v)
    np.testing.assert_allclose(got["sum"], v.sum(axis=1))
    logp = v - np.log(np.exp(v).sum(axis=1, keepdims=True))
    np.testing.assert_allclose(got["xent"], -logp[[0, 1], [1, 0]], rtol=1e-5)


def test_no_alias_for_what_the_registry_lacks():
    # TF's dense-label cross entropy has no registry op (softmax_xent takes
    # class ids): no alias that would build something else.
    assert not hasattr(af.nn, "softmax_cross_entropy_with_logits")
    assert not hasattr(af.math, "concat")  # tf.concat(values, axis) is not the registry's concat(A, B)
