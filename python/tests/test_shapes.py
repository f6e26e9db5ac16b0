"""Static shapes at build time, as TF 1.x's (graph/shapes.hpp): a
placeholder's declared shape, shapes through the registry's ops, an op
whose known shapes cannot fit refused when it is built, and a feed that
does not fit its placeholder refused by Session.run."""
import numpy as np
import pytest

import actorflow as af


def test_a_placeholder_has_its_declared_shape():
    # Catches: Tensor.shape missing, or None dimensions lost.
    x = af.placeholder(af.float32, shape=[None, 3], name="x")
    assert x.shape.as_list() == [None, 3]
    assert x.get_shape() == [None, 3]
    assert x.shape.ndims == 2 and len(x.shape) == 2 and x.shape[1] == 3 and x.shape[0] is None
    assert not x.shape.is_fully_defined()
    assert str(x.shape) == "(?, 3)"
    free = af.placeholder(af.float32)
    assert free.shape.ndims is None and free.shape.dims is None
    with pytest.raises(ValueError, match="unknown TensorShape"):
        free.shape.as_list()
    assert af.placeholder(af.int32, shape=[]).shape.as_list() == []
    assert af.constant(np.zeros((2, 5), np.float32)).shape == (2, 5)
    assert af.Variable(np.zeros(4, np.float32)).shape.is_fully_defined()


def test_shapes_go_through_the_registrys_ops():
    # Catches: an op's static shape that is not its inputs' result (a
    # broadcast, a transpose flag, a reduction's axis, gather's ids).
    x = af.placeholder(af.float32, shape=[None, 3])
    w = af.Variable(np.zeros((3, 5), np.float32))
    b = af.Variable(np.zeros(5, np.float32))
    y = x @ w + b
    assert y.shape.as_list() == [None, 5]
    assert af.matmul(x, af.constant(np.zeros((7, 3), np.float32)), transpose_b=True).shape.as_list() == [None, 7]
    assert af.reduce_sum(y, axis=1).shape.as_list() == [None]
    assert af.reduce_mean(y, axis=-1, keep_dims=True).shape.as_list() == [None, 1]
    assert af.reduce_sum(y).shape.as_list() == []
    assert af.nn.relu(-y).shape.as_list() == [None, 5]
    assert af.nn.softmax(y).shape.as_list() == [None, 5]
    table = af.Variable(np.zeros((10, 4), np.float32))
    ids = af.placeholder(af.int32, shape=[None])
    assert af.nn.embedding_lookup(table, ids).shape.as_list() == [None, 4]
    labels = af.placeholder(af.int32, shape=[8])
    xent = af.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=y)
    assert xent.shape.as_list() == [8]
    assert af.concat(y, af.constant(np.zeros((2, 5), np.float32))).shape.as_list() == [None, 5]
    assert (y * 2.0).shape.as_list() == [None, 5]
    # Unknown where it cannot be inferred: a placeholder without a shape, unique's length.
    free = af.placeholder(af.float32)
    assert (free + 1.0).shape.ndims is None
    assert af.unique(ids).shape.as_list() == [None]


def test_an_op_whose_known_shapes_cannot_fit_is_refused_at_build_time():
    # Catches: a mismatch found only when the step runs (TF refuses it when
    # the graph is built, naming the op and both shapes); the refused op
    # left in the graph.
    x = af.placeholder(af.float32, shape=[None, 3], name="x")
    w = af.Variable(np.zeros((4, 5), np.float32), name="w")
    before = len(af.get_default_graph().get_operations())
    with pytest.raises(ValueError) as e:
        af.matmul(x, w, name="MatMul")
    assert str(e.value) == ("Dimensions must be equal, but are 3 and 4 for 'MatMul' (op: 'matmul') "
                            "with input shapes: [?,3], [4,5].")
    with pytest.raises(ValueError, match=r"but are 3 and 4 for 'matmul'.*\[\?,3\], \[4,5\]"):
        x @ w
    with pytest.raises(ValueError, match=r"but are 3 and 4 for 'add' .*\[\?,3\], \[4\]"):
        x + af.constant(np.zeros(4, np.float32))
    with pytest.raises(ValueError, match="Invalid reduction dimension 2 for input with 2 dimensions"):
        af.reduce_sum(x, axis=2)
    with pytest.raises(ValueError, match="Shape must be rank 2 but is rank 1 for 'matmul'"):
        af.matmul(af.placeholder(af.float32, shape=[3]), w)
    after = af.get_default_graph().get_operations()
    assert len(after) == before + 2  # the constant and the placeholder made above, no op
    # Known shapes that fit still build, and so does what is not known.
    assert af.matmul(af.placeholder(af.float32), w).shape.as_list() == [None, 5]


def test_a_feed_that_does_not_fit_its_placeholder_is_refused_by_run():
    # Catches: a feed of another shape running (or failing in a kernel)
    # rather than TF's sentence naming the placeholder before the step.
    x = af.placeholder(af.float32, shape=[None, 3], name="x")
    y = af.reduce_sum(x * 2.0)
    with af.Session() as sess:
        assert float(sess.run(y, {x: np.ones((2, 3))})) == 12.0
        with pytest.raises(ValueError) as e:
            sess.run(y, {x: np.ones((2, 4))})
        assert str(e.value) == ("Cannot feed value of shape (2, 4) for Tensor 'x:0', which has "
                                "shape '(?, 3)'")
        with pytest.raises(ValueError, match=r"shape \(3,\) for Tensor 'x:0'"):
            sess.run(y, {x: np.ones(3)})
        assert float(sess.run(y, {x: np.ones((5, 3))})) == 30.0


def test_a_slice_of_a_shape_is_a_shape_as_in_tf():
    # Catches: x.shape[1:] a list (x.shape[1:].as_list(), TF's idiom, raised
    # AttributeError), and an unknown rank's x.shape[0] raising "as_list()
    # is not defined" where TF gives an unknown dimension.
    x = af.placeholder(af.float32, shape=[None, 3, 4])
    assert isinstance(x.shape[1:], af.TensorShape)
    assert x.shape[1:].as_list() == [3, 4] and x.shape[:-1] == [None, 3]
    assert x.shape[0] is None and x.shape[-1] == 4
    free = af.placeholder(af.float32)
    assert free.shape[0] is None
    assert free.shape[1:].ndims is None
