"""af.train.Job: actorflow-train's jobs started, watched, switched and
stopped from Python (python/train_job.cpp), fed from a dict, a TOML file or
NumPy arrays. Each job runs its tasks in this process on free loopback
ports; every wait is bounded."""
import os
import signal
import threading
import time

import numpy as np
import pytest

import actorflow as af

# A small job that ends in well under a second on an idle machine.
SMALL = {"mode": "sync", "model": "softmax", "data": "synthetic", "steps": 200,
         "log_every": 50, "eval_every": 100, "learning_rate": 0.1}
# One that would run for hours: it ends when a test stops it.
ENDLESS = dict(SMALL, steps=10**8, log_every=100, eval_every=0)


def test_job_from_a_dict_gives_progress_records_and_final_metrics():
    # Catches: reports not reaching Python (on_progress not wired), records
    # out of order or without the chief's figures, a result that is not
    # the chief's summary.
    job = af.train.Job(SMALL).start()
    records = list(job)
    res = job.result(timeout=120)
    assert [r.step for r in records] == [50, 100, 150, 200]
    assert all(np.isfinite(r.loss) and r.examples_per_s > 0 for r in records)
    assert records[-1].loss < records[0].loss
    assert records[1].accuracy is not None          # eval_every = 100
    assert records[0].accuracy is None
    assert records[0].mode == "sync"
    assert [w["worker"] for w in records[-1].workers] == [0, 1]
    assert records[-1].workers[1]["pushes"] == 200
    assert res["stopped"] is False
    assert res["global_step"] == 200 and res["mode"] == "sync"
    assert res["loss"] == pytest.approx(records[-1].loss)
    assert 0.5 < res["accuracy"] <= 1.0
    assert res["examples_per_s"] > 0
    assert [w["status"] for w in res["workers"]] == ["done", "done"]


def test_callback_gets_every_record_in_the_waiting_thread():
    # Catches: a callback not called, called twice for one record, or from
    # another thread than the one that waits (Python code on a C++ thread).
    seen = []
    waiting = threading.get_ident()
    res = af.train.run(SMALL, callback=lambda r: seen.append((r.step, threading.get_ident())))
    assert [s for s, _ in seen] == [50, 100, 150, 200]
    assert {t for _, t in seen} == {waiting}
    assert res["global_step"] == 200


def test_job_from_a_toml_file_and_overrides(tmp_path):
    # Catches: a TOML path not read (its [train] table), overrides not
    # applied after it, as actorflow-train --config F --set K=V.
    config = tmp_path / "job.toml"
    config.write_text('[train]\nmode = "async"\nmodel = "softmax"\ndata = "synthetic"\n'
                      'steps = 100\nlog_every = 25\n')
    job = af.train.Job(str(config), overrides={"steps": 60, "log_every": 20}, workers=3)
    assert 'mode = "async"' in job.config and "steps = 60" in job.config
    res = job.start().result(timeout=120)
    assert res["mode"] == "async" and res["workers_count"] == 3
    assert res["global_step"] >= 60
    assert len(res["workers"]) == 3
    res = af.train.run(config)  # a PathLike too
    assert res["global_step"] >= 100


def test_a_bad_option_names_it():
    # Catches: a bad key or value accepted (the job trains with defaults) or
    # refused without saying which.
    with pytest.raises(af.errors.InvalidArgumentError) as e:
        af.train.Job({"lerning_rate": 0.1})
    assert "lerning_rate" in str(e.value) and "learning_rate" in str(e.value)
    with pytest.raises(af.errors.InvalidArgumentError) as e:
        af.train.Job({"mode": "bogus"})
    assert "mode" in str(e.value) and "bogus" in str(e.value)
    with pytest.raises(af.errors.InvalidArgumentError) as e:
        af.train.Job({"batch_size": "big"})
    assert "batch_size" in str(e.value)
    with pytest.raises(af.errors.InvalidArgumentError) as e:
        af.train.Job(SMALL, overrides={"stepz": 3})
    assert "stepz" in str(e.value)
    with pytest.raises(TypeError) as e:
        af.train.Job({"hidden": {"a": 1}})
    assert "hidden" in str(e.value)
    # A task count no process can hold: refused before any node starts.
    with pytest.raises(af.errors.InvalidArgumentError) as e:
        af.train.Job(SMALL, workers=10**6)
    assert "workers=1000000" in str(e.value) and "actorflow-train" in str(e.value)
    with pytest.raises(af.errors.InvalidArgumentError) as e:   # two keys that do not go together
        af.train.Job({"model": "linear", "data": "digits"})
    assert "linear" in str(e.value)


def test_stop_ends_a_running_job_early():
    # Catches: stop() not reaching the workers (the job runs on to its
    # steps: the bounded wait fails), or a stopped job raising instead of
    # saying how far it got.
    job = af.train.Job(ENDLESS).start()
    first = job.next(timeout=120)
    assert first.step == 100
    assert job.running
    job.stop()
    res = job.result(timeout=60)
    assert res["stopped"] is True
    assert 100 <= res["global_step"] < ENDLESS["steps"]
    assert not job.running


def test_switch_changes_the_mode_of_a_running_job():
    # Catches: switch() not reaching the aggregators, or the job not ending
    # after a switch (a client session that kept the cluster from stopping).
    job = af.train.Job(dict(SMALL, steps=3000, log_every=100, eval_every=0)).start()
    assert job.next(timeout=120).mode == "sync"
    said = job.switch("async")
    assert "now async" in said and "/job:ps/task:0" in said
    assert "mode async" in job.status()
    res = job.result(timeout=120)
    assert res["mode"] == "async" and res["switches"] == 1
    with pytest.raises(af.errors.FailedPreconditionError):
        job.switch("sync")                               # it ended


def test_switch_refuses_what_cannot_switch():
    # Catches: allreduce (no ps) or an unknown mode sent to the aggregators.
    job = af.train.Job(dict(ENDLESS, mode="allreduce")).start()
    with pytest.raises(af.errors.UnimplementedError) as e:
        job.switch("sync")
    assert "allreduce" in str(e.value)
    job.stop()
    job.result(timeout=60)
    job = af.train.Job(ENDLESS).start()
    with pytest.raises(af.errors.InvalidArgumentError) as e:
        job.switch("bogus")
    assert "bogus" in str(e.value)
    job.stop()
    job.result(timeout=60)


def test_a_job_stopped_as_it_starts_ends_at_once():
    # Catches: a worker still joining when the chief stopped took the ps's
    # aggregator, gone with the stopped job, for a dead ps and waited its
    # ps_recovery_timeout_ms (60 s) for it to come back (about 1 run in 2).
    for _ in range(5):
        job = af.train.Job(ENDLESS).start()
        job.stop()
        res = job.result(timeout=20)
        assert res["stopped"], res


def test_a_job_fed_from_numpy_arrays_learns_them():
    # Catches: arrays not reaching the job (it would train on the config's
    # data), labels or rows mixed up (no learning), regression targets
    # taken for labels.
    rng = np.random.default_rng(3)
    x = rng.normal(size=(2000, 8)).astype(np.float32)
    y = (x[:, 2] > 0).astype(np.int64)                  # class = sign of feature 2
    res = af.train.run({"model": "softmax", "steps": 300, "learning_rate": 0.5,
                        "data": "digits"}, data=(x, y))
    assert res["accuracy"] > 0.9, res
    flipped = af.train.run({"model": "softmax", "steps": 300, "learning_rate": 0.5},
                           data=(x, 1 - y))
    assert flipped["accuracy"] > 0.9
    # Regression targets: float y, a linear model.
    w = np.arange(1, 9, dtype=np.float32)
    res = af.train.run({"model": "linear", "steps": 400, "learning_rate": 0.05, "eval_every": 0},
                       data=(x, x @ w))
    assert res["test_loss"] is not None and res["test_loss"] < 1.0, res
    x_digits, y_digits = af.train.load_digits()
    assert x_digits.shape == (1797, 64) and y_digits.dtype == np.int32
    res = af.train.run({"model": "softmax", "steps": 300, "learning_rate": 0.5},
                       data=(x_digits, y_digits))
    assert res["accuracy"] > 0.85


def test_numpy_data_of_the_wrong_shape_is_refused():
    x = np.zeros((10, 3), np.float32)
    with pytest.raises(af.errors.InvalidArgumentError) as e:
        af.train.Job(SMALL, data=(x, np.zeros(9, np.int64)))
    assert "one entry per row" in str(e.value)
    with pytest.raises(af.errors.InvalidArgumentError):
        af.train.Job(SMALL, data=(np.zeros(10, np.float32), np.zeros(10, np.int64)))
    with pytest.raises(af.errors.InvalidArgumentError) as e:
        af.train.Job(SMALL, data=(x, np.full(10, -1)))
    assert "y[0]" in str(e.value)
    with pytest.raises(TypeError):
        af.train.Job(SMALL, data=x)
    with pytest.raises(af.errors.NotFoundError) as e:  # a data name no one registered
        af.train.Job(dict(SMALL, data="memory:nobody")).start().result(timeout=60)
    assert "memory:nobody" in str(e.value)


def test_ctrl_c_while_waiting_stops_the_job():
    # Catches: Ctrl-C ignored while result() waits with the GIL released
    # (the job runs on: the test's own bound ends it), or a job left
    # running after the KeyboardInterrupt.
    job = af.train.Job(ENDLESS).start()
    job.next(timeout=120)
    interrupt = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT))
    interrupt.start()
    began = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            job.result(timeout=60)
    finally:
        interrupt.join()
    assert time.monotonic() - began < 10  # the signal at 0.3 s, seen within 50 ms
    res = job.result(timeout=60)
    assert res["stopped"] is True


def test_ctrl_c_during_switch_and_status_leaves_the_job_usable():
    # Catches: switch() and status() waiting for the cluster's answer with
    # no look at signals (the KeyboardInterrupt only once the held call is
    # let go, at 5 s), and a job left unusable by the interrupted call.
    job = af.train.Job(ENDLESS).start()
    job.next(timeout=120)
    for call in (job.status, lambda: job.switch("async")):
        job._hold_clients(True)  # the call waits before asking, as on a ps that does not answer
        interrupt = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT))
        release = threading.Timer(5.0, job._hold_clients, (False,))
        interrupt.start()
        release.start()
        began = time.monotonic()
        try:
            with pytest.raises(KeyboardInterrupt):
                call()
            interrupted = time.monotonic() - began
        finally:
            interrupt.join()
            release.cancel()
        assert interrupted < 3  # the signal at 0.3 s, seen within 50 ms
        job._hold_clients(False)
        assert job.running
    # The interrupted switch had not asked yet: it never does.
    assert "mode sync" in job.status()
    assert "async" in job.switch("async")
    assert "mode async" in job.status()
    job.stop()
    assert job.result(timeout=60)["stopped"] is True


def test_other_threads_run_while_result_waits():
    # Catches: result() holding the GIL while it waits (the other thread,
    # which ends the job, would never run: the bounded wait fails).
    job = af.train.Job(ENDLESS).start()
    job.next(timeout=120)
    ran = []

    def other():
        for i in range(20):
            ran.append(i)
            time.sleep(0.005)
        job.stop()

    thread = threading.Thread(target=other)
    thread.start()
    try:
        res = job.result(timeout=20)
    finally:
        thread.join()
    assert res["stopped"] is True and len(ran) == 20


def test_result_timeout_bounds_the_whole_wait():
    # Catches: a timeout that only bounds each wait for the next record (a
    # job whose records keep coming made result(timeout) wait for ever).
    job = af.train.Job(ENDLESS).start()
    began = time.monotonic()
    with pytest.raises(af.errors.DeadlineExceededError):
        job.result(timeout=1.0)
    assert time.monotonic() - began < 10
    job.stop()
    assert job.result(timeout=60)["stopped"] is True


def test_overrides_must_be_a_dict():
    # Catches: a list or a string of overrides iterated as an empty dict,
    # so that the job ran with none of them and said nothing.
    for bad in ([("steps", 5)], "steps=5"):
        with pytest.raises(TypeError, match="overrides is a dict"):
            af.train.Job(SMALL, overrides=bad)


def test_numpy_scalars_and_int_subclasses_are_numbers_in_a_config():
    # Catches: values written into the config's TOML by their repr, which
    # for an IntEnum is "<E.B: 2>" (a TOML syntax error) and for NumPy's
    # scalars was refused as "a value of type float32".
    import enum
    every = enum.IntEnum("Every", "ONE TWO")
    job = af.train.Job(dict(SMALL, steps=np.int64(70), learning_rate=np.float32(0.25),
                            log_every=every.TWO), overrides={"eval_every": np.uint8(7)})
    lines = job.config.splitlines()
    assert "steps = 70" in lines and "learning_rate = 0.25" in lines
    assert "log_every = 2" in lines and "eval_every = 7" in lines
    # Past TOML's 64 bits: toml11 read 10**30 as 2**63 - 1, in silence.
    for huge in (10**30, -2**64):
        with pytest.raises(af.errors.InvalidArgumentError, match="64-bit"):
            af.train.Job(dict(SMALL, steps=huge))


def test_a_callback_that_raises_stops_the_job():
    # Catches: the callback's exception leaving result() while the job
    # trained on unwatched in its threads (running, until collected).
    def cb(record):
        raise ValueError("from the callback")
    job = af.train.Job(ENDLESS, callback=cb).start()
    with pytest.raises(ValueError, match="from the callback"):
        job.result(timeout=120)
    res = job.result(timeout=120)
    assert res["stopped"] is True and not job.running


def test_exit_from_several_threads_at_once():
    # Catches: two threads joining the job's runner thread at once
    # (undefined for std::thread; it hung), as __exit__ from two threads
    # does.
    job = af.train.Job(ENDLESS).start()
    job.next(timeout=120)
    threads = [threading.Thread(target=job.__exit__, args=(None, None, None), daemon=True)
               for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads)
    assert not job.running


def test_an_infinite_timeout_is_no_bound():
    # Catches: inf (or 1e300) seconds converted to the clock's integer
    # ticks, which overflowed: next() and result() raised
    # DeadlineExceededError after 50 ms instead of waiting.
    quiet = dict(ENDLESS, log_every=10**7)
    for forever in (float("inf"), 1e300):
        job = af.train.Job(quiet).start()
        stopper = threading.Timer(0.3, job.stop)
        stopper.start()
        job.next(timeout=forever)             # the stopped job's last record, or None
        assert job.result(timeout=forever)["stopped"] is True
        stopper.join()
    with pytest.raises(ValueError, match="NaN"):
        job.next(timeout=float("nan"))


def test_a_job_python_never_collects_is_stopped_at_exit():
    # Catches: a job kept alive by a cycle with its callback (never
    # collected, so never stopped by its destructor) still training while
    # the process's static destructors ran: SIGSEGV at exit now and then.
    # atexit now stops and joins every job still held; the script runs
    # Python's exit functions itself to see that the job is stopped then.
    import subprocess
    import sys
    script = (
        "import atexit\n"
        "import actorflow as af\n"
        "job = af.train.Job(%r, callback=lambda r: job)\n"
        "job.start()\n"
        "job.next(timeout=120)\n"
        "atexit._run_exitfuncs()\n"
        "print('running', job.running, flush=True)\n" % (ENDLESS,))
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout == "running False\n"


def test_a_null_byte_in_a_path_or_a_string_value_is_refused(tmp_path):
    # Catches: a NUL byte cutting the path short where the system reads it:
    # Job("a.toml\0x") trained with a.toml's config, and a metrics or
    # checkpoint_dir value with one named another file than Python's.
    config = tmp_path / "job.toml"
    config.write_text("[train]\nsteps = 5\n")
    with pytest.raises(ValueError, match="null byte"):
        af.train.Job(str(config) + "\0x")
    with pytest.raises(ValueError, match="null byte"):
        af.train.Job(dict(SMALL, metrics=str(tmp_path / "m.csv\0x")))
    with pytest.raises(ValueError, match="null byte"):
        af.train.Job(SMALL, overrides={"metrics": str(tmp_path / "m.csv\0x")})
    assert not list(tmp_path.glob("m.csv*"))
