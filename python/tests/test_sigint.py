"""SIGINT outside a run, once Session.run has installed its handler (which
stays, handing the signal to Python's between runs: python/session.cpp).
A run during Ctrl-C is test_processes.py's test_ctrl_c_interrupts_a_waiting_run."""
import os
import signal

import pytest

import actorflow as af


def test_ctrl_c_between_runs_is_pythons_keyboard_interrupt(local):
    with af.device("/job:local/task:0"):
        var = af.Variable(0.0, name="v")
    inc = var.assign_add(1.0)
    with af.Session(local.target("local", 0)) as sess:
        sess.run(af.global_variables_initializer())
        assert sess.run(inc) == 1.0                  # the module's handler is installed now
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(1000):                    # Python raises at its next check
                pass
        assert sess.run(inc) == 2.0                  # the next run does not see it

        # A handler of the program's own gets the signal, and runs leave it alone.
        got = []
        previous = signal.signal(signal.SIGINT, lambda *_: got.append(1))
        try:
            assert sess.run(inc) == 3.0
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(1000):
                pass
            assert got == [1]
        finally:
            signal.signal(signal.SIGINT, previous)
        assert sess.run(inc) == 4.0                  # and Python's default comes back
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(1000):
                pass
