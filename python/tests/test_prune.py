"""A run hands the cluster only the nodes its fetches, feeds and requests
need (python/session.cpp's replay), as TF prunes a run to its fetches: a
node for a job the session's cluster lacks fails only the runs that need it."""
import numpy as np
import pytest

import actorflow as af


def test_a_run_that_does_not_need_a_variable_of_a_missing_job_runs(local):
    # Catches: every node of the graph handed over at the first run (the
    # variable on /job:ps, which this one-task cluster lacks, failed runs
    # that fetch only a constant).
    with af.device("/job:ps/task:0"):
        elsewhere = af.Variable(np.float32(1), name="elsewhere")
    with af.device("/job:local/task:0"):
        here = af.Variable(np.float32(2), name="here")
    x = af.placeholder(af.float32, name="x")
    three = af.constant(np.float32(3)) + 0.0
    with af.Session(local.target("local", 0)) as sess:
        assert sess.run(three) == 3.0
        assert sess.run(x * 2.0, feed_dict={x: 4.0}) == 8.0
        assert sess.run(af.group(here.assign(np.float32(2)))) is None  # needs `here` alone
        assert sess.run(here + three) == 5.0
        assert sess.device_of(here) == "/job:local/replica:0/task:0/device:CPU:0"
        # What needs the missing job still fails, and the session stays usable.
        with pytest.raises(af.errors.OpError) as e:
            sess.run(elsewhere + 1.0)
        assert "ps" in str(e.value)
        assert sess.run(here * three) == 6.0
