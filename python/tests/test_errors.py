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
        assert type(e.value) is not errors.UnknownError, e.value.af_code
        assert e.value.message == "the sentence"
        assert e.value.code == errors.error_code_from_exception_type(type(e.value))
        classes[e.value.af_code] = type(e.value)
    # A worker taken as left joins again and retries: TF's AbortedError.
    assert classes["left"] is errors.AbortedError


def test_bad_device_is_invalid_argument_with_the_sentence():
    # Catches: a parse error raised as a generic exception, or without the
    # library's reason (the user must see what is wrong with the name).
    with pytest.raises(errors.InvalidArgumentError) as e:
        af.device("/job:ps/task:x")
    assert "/job:ps/task:x" in e.value.message
    assert e.value.af_code == "invalid_device"
    assert e.value.code == e.value.error_code == errors.INVALID_ARGUMENT == 3


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


TF_CODES = {"OK": 0, "CANCELLED": 1, "UNKNOWN": 2, "INVALID_ARGUMENT": 3, "DEADLINE_EXCEEDED": 4,
            "NOT_FOUND": 5, "ALREADY_EXISTS": 6, "PERMISSION_DENIED": 7, "RESOURCE_EXHAUSTED": 8,
            "FAILED_PRECONDITION": 9, "ABORTED": 10, "OUT_OF_RANGE": 11, "UNIMPLEMENTED": 12,
            "INTERNAL": 13, "UNAVAILABLE": 14, "DATA_LOSS": 15, "UNAUTHENTICATED": 16}


def test_code_is_tfs_integer_and_af_code_the_librarys_name():
    # Catches: .code a string ("peer_down") where a TF script compares it
    # with tf.errors.NOT_FOUND (5): `e.code == af.errors.NOT_FOUND` was
    # never true. TF's constants and each class's code, as tf.errors has them.
    for name, code in TF_CODES.items():
        assert getattr(errors, name) == code, name
    by_class = {"CancelledError": 1, "UnknownError": 2, "InvalidArgumentError": 3,
                "DeadlineExceededError": 4, "NotFoundError": 5, "AlreadyExistsError": 6,
                "PermissionDeniedError": 7, "ResourceExhaustedError": 8,
                "FailedPreconditionError": 9, "AbortedError": 10, "OutOfRangeError": 11,
                "UnimplementedError": 12, "InternalError": 13, "UnavailableError": 14,
                "DataLossError": 15, "UnauthenticatedError": 16,
                # the library's finer classes have their TF parent's code
                "GoneError": 5, "PeerDownError": 14}
    for name, code in by_class.items():
        cls = getattr(errors, name)
        assert errors.error_code_from_exception_type(cls) == code, name
        if name not in ("GoneError", "PeerDownError"):   # a code's class is TF's
            assert errors.exception_type_from_error_code(code) is cls, name
    # Raised by the library: TF's code, the library's name, no node.
    with pytest.raises(errors.PeerDownError) as e:
        errors._raise_code(_af_code_number("peer_down"), "down")
    assert e.value.code == e.value.error_code == errors.UNAVAILABLE
    assert e.value.af_code == "peer_down"
    assert e.value.op is None and e.value.node_def is None
    with pytest.raises(KeyError):
        errors.exception_type_from_error_code(99)
    with pytest.raises(TypeError):
        errors.error_code_from_exception_type(ValueError)


def _af_code_number(name):
    """The af_error number whose class raises with af_code `name`."""
    for code in range(1, errors._max_code + 1):
        try:
            errors._raise_code(code, "")
        except errors.OpError as e:
            if e.af_code == name:
                return code
    raise AssertionError("no af_error is named " + name)


def test_errors_are_made_as_tf_makes_them_and_pickle():
    # Catches: a TF script's own `raise tf.errors.NotFoundError(None, None,
    # "msg")` (TF's constructor) failing on actorflow's classes, and the
    # attributes lost through pickle (a multiprocessing worker's error).
    import pickle
    e = errors.NotFoundError(None, None, "no such thing")
    assert (e.message, e.code, e.op, e.node_def, e.af_code) == ("no such thing", 5, None, None, None)
    assert str(e) == "no such thing"
    e = errors.OpError("node", "op", "failed", errors.ABORTED)
    assert (e.node_def, e.op, e.message, e.error_code, e.code) == ("node", "op", "failed", 10, 10)
    e = errors.UnavailableError("gone away", af_code="unreachable")
    back = pickle.loads(pickle.dumps(e))
    assert type(back) is errors.UnavailableError
    assert (back.message, back.code, back.af_code) == ("gone away", 14, "unreachable")
