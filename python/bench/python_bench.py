#!/usr/bin/python3
"""The Python module's speed lines of issue 26 (docs/python.md, "Speed"), in
actorflow-bench's format: `metric NAME ours=X baseline=Y unit=U ratio=Z`.

  python_run_overhead  sess.run(var.assign_add(1.0)) of a scalar on a ps,
                       from Python (ours) against the same step run from C++
                       on the same af::session (baseline), microseconds per
                       run; ratio ours/baseline, target <= 1.3.
  python_fetch_64mib   sess.run(var) of a 64 MiB float32 variable on the ps
                       into NumPy (ours) against the same fetch from C++
                       (baseline), MiB/s; ratio ours/baseline, target >= 0.9.

The baseline is Session._bench_cpp_runs: the C++ loop over the session's own
af::session::run, in this process, on the same cluster, so both sides share
everything but the Python layer. Rounds alternate ours and baseline (the
machine is shared and noisy) and each side's figure is the median of its
runs. The ps is an actorflow-node process (--ps process, the default when
it is built; the variable then crosses a socket or the shared-memory ring)
or a task of this process (--ps inproc).

  PYTHONPATH=build/python /usr/bin/python3 python/bench/python_bench.py
"""
import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import actorflow as af


def free_ports(n):
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


class ProcessPs:
    """/job:ps/task:0 as an actorflow-node process, and a worker Server here."""

    def __init__(self, binary):
        ps_port, worker_port = free_ports(2)
        jobs = {"ps": ["127.0.0.1:%d" % ps_port], "worker": ["127.0.0.1:%d" % worker_port]}
        self.dir = tempfile.TemporaryDirectory()
        config = Path(self.dir.name) / "cluster.json"
        config.write_text(json.dumps({"cluster": jobs}))
        self.proc = subprocess.Popen([str(binary), "--config", str(config), "--job", "ps",
                                      "--task", "0", "--threads", "2"],
                                     stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        if "actorflow-node ready" not in line:
            raise RuntimeError("actorflow-node did not start: " + line)
        self.worker = af.train.Server(af.train.ClusterSpec(jobs), "worker", 0)
        self.target = self.worker.target

    def stop(self):
        self.worker.stop()
        self.worker.join()
        self.proc.terminate()
        self.proc.wait(timeout=30)
        self.proc.stdout.close()
        self.dir.cleanup()


class InprocPs:
    def __init__(self):
        self.cluster = af.train.LocalCluster({"ps": 1, "worker": 1})
        self.target = self.cluster.target("worker", 0)

    def stop(self):
        self.cluster.stop()


def python_runs(sess, fetch, n):
    seconds = []
    for _ in range(n):
        start = time.perf_counter()
        sess.run(fetch)
        seconds.append(time.perf_counter() - start)
    return seconds


def alternate(sess, fetch, rounds, per_round):
    """Medians of per-run seconds (ours, baseline), rounds alternating sides."""
    ours, base = [], []
    for r in range(rounds):
        sides = [(ours, lambda: python_runs(sess, fetch, per_round)),
                 (base, lambda: sess._bench_cpp_runs(fetch, per_round))]
        for out, measure in (sides if r % 2 == 0 else sides[::-1]):
            out.extend(measure())
    return statistics.median(ours), statistics.median(base)


def metric(name, ours, baseline, unit, ratio):
    print("metric %s ours=%.3f baseline=%.3f unit=%s ratio=%.3f" % (name, ours, baseline, unit, ratio),
          flush=True)


def main():
    default_node = Path(af.__file__).resolve().parents[1] / "actorflow-node"
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ps", choices=["process", "inproc"],
                        default="process" if default_node.exists() else "inproc")
    parser.add_argument("--node", default=str(default_node), help="the actorflow-node binary")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--runs", type=int, default=2000, help="scalar runs per round and side")
    parser.add_argument("--fetches", type=int, default=10, help="64 MiB fetches per round and side")
    args = parser.parse_args()

    ps = ProcessPs(args.node) if args.ps == "process" else InprocPs()
    try:
        with af.device("/job:ps/task:0"):
            counter = af.Variable(0.0, name="counter")
            big = af.get_variable("big", [16 * 1024 * 1024], af.float32,
                                  initializer=af.constant_initializer(1.0))  # 64 MiB
        inc = counter.assign_add(1.0)
        with af.Session(ps.target) as sess:
            sess.run(af.global_variables_initializer())
            sess.run(inc), sess.run(big)                 # connect, register both steps
            ours, base = alternate(sess, inc, args.rounds, args.runs)
            metric("python_run_overhead", ours * 1e6, base * 1e6, "us", ours / base)
            ours, base = alternate(sess, big, args.rounds, args.fetches)
            metric("python_fetch_64mib", 64.0 / ours, 64.0 / base, "MiB/s", base / ours)
    finally:
        ps.stop()
    print("# ps: %s; %d rounds alternating, medians" % (args.ps, args.rounds), file=sys.stderr)


if __name__ == "__main__":
    main()
