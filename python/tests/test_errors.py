"""af.errors: the library's error codes as tf.errors' classes, carrying
the library's sentence."""
import numpy as np
import pytest

import actorflow as af
from actorflow import errors


def test_hierarchy_is_tf_errors():
    # Catches: a class missing, or not an OpError (an `except af.errors.OpError`
    # that lets one through).
    for name in ["InvalidArgumentError", "NotFoundError", "DeadlineExceededError",
                 "UnavailableError", "PeerDownError", "ResourceExhaustedError",
                 "FailedPreconditionError", "UnimplementedError", "InternalError",
                 "AbortedError", "CancelledError", "AlreadyExistsError", "UnknownError"]:
        assert issubclass(getattr(errors, name), errors.OpError), name
    assert issubclass(errors.PeerDownError, errors.UnavailableError)


def test_every_tf_errors_class_exists():
    # Catches: a tf.errors name missing: a TF script's
    # `except af.errors.OutOfRangeError:` raised AttributeError while an
    # actorflow error went by, hiding it.
    caught = None
    try:
        try:
            af.device("/job:ps/task:x")
        except errors.OutOfRangeError:
            caught = "wrong"
    except errors.InvalidArgumentError as e:
        caught = e
    assert isinstance(caught, errors.InvalidArgumentError)
    for name in ["OutOfRangeError", "PermissionDeniedError", "UnauthenticatedError",
                 "DataLossError"]:
        assert issubclass(getattr(errors, name), errors.OpError), name


def test_every_library_code_has_its_class():
    # Catches: a code added to the library (af_error::left, a worker its ps
    # took as left) without its class here, raised as UnknownError, which
    # says the error is not one of actorflow's.
    classes = {}
    for code in range(1, errors._max_code + 1):
        with pytest.raises(errors.OpError) as e:
            errors._raise_code(code, "the sentence")
        assert type(e.value) is not errors.UnknownError, e.value.code
        assert e.value.message == "the sentence"
        classes[e.value.code] = type(e.value)
    # A worker taken as left joins again and retries: TF's AbortedError.
    assert classes["left"] is errors.AbortedError


def test_bad_device_is_invalid_argument_with_the_sentence():
    # Catches: a parse error raised as a generic exception, or without the
    # library's reason (the user must see what is wrong with the name).
    with pytest.raises(errors.InvalidArgumentError) as e:
        af.device("/job:ps/task:x")
    assert "/job:ps/task:x" in e.value.message
    assert e.value.code == "invalid_device"


def test_uninitialized_read_is_failed_precondition(local):
    # Catches: the uninitialized code mapped to another class (TF raises
    # FailedPreconditionError for a read before the initializer ran).
    v = af.get_variable("never_initialized", [2], initializer=af.constant_initializer(1))
    with af.Session(local.target("local", 0)) as sess:
        with pytest.raises(errors.FailedPreconditionError) as e:
            sess.run(v)
    assert "never_initialized" in e.value.message


def test_unknown_target_is_not_found():
    # Catches: a Session made against a target nobody serves (a typo)
    # hanging or failing without naming the target.
    with pytest.raises(errors.NotFoundError) as e:
        af.Session("actorflow://127.0.0.1:1")
    assert "actorflow://127.0.0.1:1" in str(e.value)


def test_stopped_ps_is_peer_down(servers):
    # Catches: a node that died reported as a timeout or a generic error
    # (the library says peer_down at once, naming the task).
    with af.device("/job:ps/task:0"):
        v = af.get_variable("v", [], initializer=af.constant_initializer(1))
    # The stopped node's actor system still accepts connections in this
    # process, so the session's one reconnect ping may wait its timeout.
    with af.Session(servers["worker"].target, timeout=2) as sess:
        sess.run(af.global_variables_initializer())
        assert sess.run(v) == 1.0
        servers["ps"].stop()
        servers["ps"].join()
        with pytest.raises(errors.UnavailableError) as e:
            sess.run(v.assign_add(1.0))
    assert isinstance(e.value, errors.PeerDownError), type(e.value)
    assert "ps" in e.value.message


def test_shape_mismatch_is_invalid_argument(local):
    # Catches: a kernel's shape error escaping as UnknownError/RuntimeError.
    # Placeholders of no declared shape: known shapes that cannot fit are
    # refused when the graph is built (ValueError, test_shapes.py).
    a = af.placeholder(af.float32)
    b = af.placeholder(af.float32)
    ones = np.ones((2, 3), np.float32)
    with af.Session(local.target("local", 0)) as sess:
        with pytest.raises(errors.InvalidArgumentError) as e:
            sess.run(a @ b, {a: ones, b: ones})
    assert "matmul" in e.value.message


def test_import_without_numpy_says_what_to_do():
    # Catches: "ImportError: initialization failed" alone, what a pyenv
    # python3 of Debian's version (no NumPy) got for `import actorflow`.
    import subprocess
    import sys
    code = "import sys; sys.modules['numpy'] = None; import actorflow"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    assert "actorflow needs NumPy" in r.stderr and "built for" in r.stderr
