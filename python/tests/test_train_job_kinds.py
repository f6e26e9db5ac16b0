"""af.train.Job's sparse and in-graph jobs (python/train_job_run.cpp)
against actorflow-train's runs of the same config: each is run both ways
and the figures actorflow-train prints (progress losses, held-out scores,
the global step) must be Python's, to the digits it prints. Both paths
are seeded and run the same dist/ code, so they agree."""
import pathlib
import re
import subprocess

import pytest

import actorflow as af

# A sparse job that ends in well under a second: 2 ps, 2 workers.
SPARSE = {"mode": "sync", "model": "recommender", "users": 500, "items": 200, "dim": 4,
          "data": "synthetic", "synthetic_examples": 20000, "batch_size": 64, "steps": 100,
          "optimizer": "adam", "learning_rate": 0.01, "log_every": 50}
DENSE = {"mode": "sync", "model": "softmax", "data": "synthetic", "steps": 100,
         "log_every": 50, "learning_rate": 0.1}


def train_binary():
    # The module is <build>/python/actorflow*.so; actorflow-train is <build>/actorflow-train.
    binary = pathlib.Path(af.__file__).resolve().parents[1] / "actorflow-train"
    if not binary.exists():
        pytest.skip("%s is not built (ninja actorflow-train)" % binary)
    return binary


def toml(value):
    return '"%s"' % value if isinstance(value, str) else repr(value)


def run_cli(args, tmp_path, config=None):
    """actorflow-train's stdout: the sparse job from a TOML file whose
    [cluster] gives the shape (2 ps, 2 workers), the dense one by --set."""
    cmd = [str(train_binary())] + args
    if config is not None:
        path = tmp_path / "job.toml"
        path.write_text('[cluster]\nps = ["127.0.0.1:1", "127.0.0.1:2"]\n'
                        'worker = ["127.0.0.1:3", "127.0.0.1:4"]\n\n[train]\n'
                        + "".join("%s = %s\n" % (k, toml(v)) for k, v in config.items()))
        cmd += ["--config", str(path)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout


def same_reports(records, text, digits):
    """The records are the progress lines of `text` (losses printed to `digits` places)."""
    lines = [(int(s), float(l)) for s, l in re.findall(r"^step (\d+)/\d+:? +loss ([\d.]+)", text, re.M)]
    assert len(lines) == 2 and [r.step for r in records] == [s for s, _ in lines]
    for r, (_, loss) in zip(records, lines):
        assert r.loss == pytest.approx(loss, abs=0.51 * 10 ** -digits)


@pytest.mark.parametrize("in_graph", [False, True])
def test_a_sparse_job_from_python_is_actorflow_trains(tmp_path, in_graph):
    # Catches: a sparse job refused (or run by a second runtime), in_graph
    # ignored (between-graph reports the chief's loss, in-graph the
    # replicas' mean: they differ), the sparse outcome not reaching result().
    cli = run_cli(["--in-graph"] if in_graph else [], tmp_path, SPARSE)
    records = []
    res = af.train.run(SPARSE, workers=2, ps=2, in_graph=in_graph, callback=records.append)
    assert res["sparse"] is True and res["in_graph"] is in_graph and res["stopped"] is False
    auc, log_loss = map(float, re.search(r"held-out: auc=([\d.]+) log_loss=([\d.]+)", cli).groups())
    assert res["auc"] == pytest.approx(auc, abs=1e-4)
    assert res["log_loss"] == pytest.approx(log_loss, abs=1e-4)
    assert res["truth_auc"] is not None and res["truth_auc"] > res["auc"]
    done = re.search(r"train done: mode=sync workers=2 global_step=(\d+) .* loss=([\d.e+-]+)", cli)
    assert res["global_step"] == int(done.group(1)) == 100
    assert res["loss"] == pytest.approx(float(done.group(2)), rel=1e-5)
    same_reports(records, cli, 6)
    assert res["bytes_per_step"] > 0 and res["train_examples"] == 16000


def test_a_dense_in_graph_job_from_python_is_actorflow_trains(tmp_path):
    # Catches: in_graph run between-graph (its loss and accuracy differ),
    # the client's reports or outcome not reaching Python.
    cli = run_cli(["--in-graph"] + ["--set=%s=%s" % kv for kv in DENSE.items()], tmp_path)
    job = af.train.Job(DENSE, in_graph=True).start()
    records = list(job)
    res = job.result(timeout=120)
    same_reports(records, cli, 4)  # between-graph's are the chief's own losses: others
    accuracy = float(re.search(r"held-out accuracy: ([\d.]+)", cli).group(1))
    assert res["accuracy"] == pytest.approx(accuracy, abs=1e-4)
    assert res["in_graph"] is True and res["global_step"] == 100 and res["stopped"] is False
    assert records[-1].examples_per_s > 0


def test_in_graph_jobs_stop_and_report_status(tmp_path):
    # Catches: stop() ignored by the in-graph client (it would train 10**8
    # steps), status asking the between-graph aggregators' names.
    job = af.train.Job(dict(DENSE, steps=10**8, log_every=10), in_graph=True).start()
    assert job.next(timeout=60) is not None
    assert "(in-graph client)" in job.status()  # train/in-graph/ps0, not train/ps0
    with pytest.raises(af.errors.UnimplementedError, match="in-graph"):
        job.switch("async")
    job.stop()
    res = job.result(timeout=60)
    assert res["stopped"] is True and 0 < res["global_step"] < 10**8
    job = af.train.Job(dict(SPARSE, steps=10**8, log_every=10), ps=2, in_graph=True).start()
    assert job.next(timeout=60) is not None
    assert "/job:ps/task:1: mode sync" in job.status()  # train/sparse/ps1
    job.stop()
    res = job.result(timeout=60)
    assert res["stopped"] is True and 0 < res["global_step"] < 10**8
    with pytest.raises(af.errors.InvalidArgumentError, match="mode must be sync"):
        af.train.Job(dict(DENSE, mode="async"), in_graph=True)


def test_stop_ends_a_sparse_between_graph_job():
    # Catches: the sparse workers' loop deaf to stop() (it would train 10**8
    # steps: the bounded wait fails), or a stopped sync job whose other
    # worker waits for the stopped one's share.
    job = af.train.Job(dict(SPARSE, steps=10**8, log_every=10), ps=2).start()
    assert job.next(timeout=60) is not None
    job.stop()
    res = job.result(timeout=60)
    assert res["stopped"] is True and 0 < res["global_step"] < 10**8
    assert 0 < res["auc"] <= 1  # scored as at the end


def test_a_sparse_between_graph_job_switches_live():
    # Catches: switch() refusing sparse jobs (it did, UnimplementedError,
    # before the sparse workers could join a round again), the switch asking
    # the dense aggregators' names (not_found), average let through to a
    # sparse job, or a job that no longer reports after a switch into sync.
    job = af.train.Job(dict(SPARSE, steps=10**8, log_every=10), ps=2).start()
    assert job.next(timeout=60) is not None
    said = job.switch("async")
    assert "/job:ps/task:0: now async" in said and "/job:ps/task:1: now async" in said
    assert "/job:ps/task:1: mode async" in job.status()
    with pytest.raises(af.errors.InvalidArgumentError, match="average"):
        job.switch("average")
    said = job.switch("sync")
    assert "/job:ps/task:0: now sync" in said and "/job:ps/task:1: now sync" in said
    at_switch = job.next(timeout=60).step
    assert job.next(timeout=60).step > at_switch  # the round fills: both workers joined again
    assert "/job:ps/task:0: mode sync" in job.status()
    job.stop()
    res = job.result(timeout=60)
    assert res["stopped"] is True and 0 < res["global_step"] < 10**8
