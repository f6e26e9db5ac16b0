"""Tensors to and from NumPy: dtypes both ways, no copy on fetch, a clear
error for what cannot map."""
import numpy as np
import pytest

import actorflow as af


@pytest.mark.parametrize("dt", [np.float32, np.float64, np.int32, np.int64])
def test_dtype_round_trip(local, dt):
    # Catches: a dtype mapped to another on the way in or out (int64 fetched
    # as int32, float64 narrowed), or values garbled by wrong strides.
    value = (np.arange(12).reshape(3, 4) * 3 - 7).astype(dt)
    c = af.constant(value)
    assert c.dtype == np.dtype(dt)
    with af.Session(local.target("local", 0)) as sess:
        got = sess.run(c)
    assert got.dtype == np.dtype(dt)
    assert got.shape == (3, 4)
    np.testing.assert_array_equal(got, value)


def test_python_numbers_convert_as_tf():
    # Catches: Python floats becoming float64 and ints int64 (TF makes them
    # float32 and int32; a float64 constant added to a float32 variable fails).
    assert af.constant(1.5).dtype == np.float32
    assert af.constant([1, 2]).dtype == np.int32
    assert af.constant(np.float64(1.5)).dtype == np.float64


def test_python_ints_past_int32_stay_int64(local):
    # Catches: 2**40 narrowed to int32 (silently 0), where TF keeps int64
    # when a value does not fit.
    big = af.constant([1, 2**40])
    assert big.dtype == np.int64
    assert af.constant(-2**31).dtype == np.int32
    with af.Session(local.target("local", 0)) as sess:
        np.testing.assert_array_equal(sess.run(big), [1, 2**40])


def test_unmappable_dtype_is_a_clear_type_error():
    # Catches: float16/bool/complex silently converted or a cryptic failure.
    for bad in [np.zeros(3, np.float16), np.zeros(2, np.complex64), np.zeros(2, np.uint8)]:
        with pytest.raises(TypeError) as e:
            af.constant(bad)
        assert str(bad.dtype) in str(e.value)
        assert "astype" in str(e.value)
    with pytest.raises(TypeError):
        af.placeholder(np.float16)


def test_fetch_is_zero_copy(local):
    # Catches: an extra copy of a fetched tensor into NumPy. The array must be
    # a view over the tensor's buffer (its base the tensor's holder, not data
    # of its own), and a variable of this process fetched twice gives two
    # arrays over the one buffer the variable holds.
    v = af.get_variable("big", [256, 1024], initializer=af.constant_initializer(3))
    with af.Session(local.target("local", 0)) as sess:
        sess.run(af.global_variables_initializer())
        a, b = sess.run([v, v])
        c = sess.run(v)
    assert not a.flags.owndata
    assert np.shares_memory(a, c)
    assert np.shares_memory(a, b)
    # The variable still holds that buffer: the arrays are read-only views.
    assert not a.flags.writeable
    with pytest.raises(ValueError):
        a[0, 0] = 1
    assert float(c[0, 0]) == 3.0


def test_fetched_array_outlives_session_and_cluster():
    # Catches: an array whose buffer is freed with the session or the cluster
    # (the array must keep the tensor alive).
    with af.train.LocalCluster({"local": 1}) as cluster:
        c = af.constant(np.full((64, 64), 7, np.float32)) * 2.0
        with af.Session(cluster.target("local", 0)) as sess:
            got = sess.run(c)
    del cluster, sess
    junk = [np.ones((64, 64), np.float32) for _ in range(64)]  # reuse freed memory
    assert float(got.sum()) == 14.0 * 64 * 64
    del junk


def test_computed_value_is_writable(local):
    # Catches: every fetch made read-only, where nothing else holds the buffer
    # (a computed value is the array's alone, as in TF).
    c = af.constant(np.ones((4,), np.float32)) + 1.0
    with af.Session(local.target("local", 0)) as sess:
        got = sess.run(c)
    got[0] = 5
    assert got[0] == 5.0


def test_feed_converts_to_placeholder_dtype(local):
    # Catches: a feed kept at its own dtype (float64 from a Python list) and
    # refused by a float32 op.
    x = af.placeholder(af.float32, name="x")
    y = x * 2.0
    with af.Session(local.target("local", 0)) as sess:
        got = sess.run(y, feed_dict={x: [[1, 2], [3, 4]]})
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, [[2, 4], [6, 8]])


def test_a_feed_that_does_not_fit_an_integer_placeholder_is_refused_not_wrapped():
    # Catches: NumPy's cast wrapped 2**40 fed to an int32 placeholder to 0 and
    # made NaN the lowest int32, in silence: the step ran on other ids and
    # labels than the caller's.
    with af.Graph().as_default():
        ids = af.placeholder(af.int32, [None], name="ids")
        wide = af.placeholder(af.int64, [None], name="wide")
        out, out_wide = ids + 0, wide + 0
        with af.Session() as sess:
            for value, says in ((np.array([1, 2**40]), "holds 1099511627776, outside int32's range"),
                                ([2**31], "outside int32's range"),
                                (np.array([1.0, np.nan]), "NaN or inf"),
                                (np.array([np.inf]), "NaN or inf"),
                                (np.array([2**63], np.uint64), "outside int32's range")):
                with pytest.raises(ValueError, match=says):
                    sess.run(out, {ids: value})
            with pytest.raises(ValueError, match="outside int64's range"):
                sess.run(out_wide, {wide: np.array([2.0**63])})
            # What fits still converts, fractions truncating as in NumPy and TF.
            assert sess.run(out, {ids: np.array([-2**31, 7], np.int64)}).tolist() == [-2**31, 7]
            assert sess.run(out, {ids: [1.7, -2.0]}).tolist() == [1, -2]
            assert sess.run(out_wide, {wide: np.array([2**40])}).tolist() == [2**40]
            assert sess.run(out, {ids: np.zeros(0)}).tolist() == []
