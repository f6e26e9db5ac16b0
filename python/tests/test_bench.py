"""python/bench/python_bench.py runs and prints its two lines in
actorflow-bench's format (its figures are read by people, never asserted:
docs/python.md, "Speed")."""
import os
import re
import subprocess
import sys
from pathlib import Path

import actorflow as af

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "python_bench.py"
LINE = r"metric %s ours=[0-9.]+ baseline=[0-9.]+ unit=%s ratio=[0-9.]+$"


def test_bench_prints_both_lines():
    env = dict(os.environ, PYTHONPATH=str(Path(af.__file__).resolve().parent))
    out = subprocess.run([sys.executable, str(SCRIPT), "--ps", "inproc", "--rounds", "2",
                          "--runs", "5", "--fetches", "1"],
                         env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = [l for l in out.stdout.splitlines() if l.startswith("metric ")]
    assert len(lines) == 2, out.stdout
    assert re.match(LINE % ("python_run_overhead", "us"), lines[0]), lines[0]
    assert re.match(LINE % ("python_fetch_64mib", "MiB/s"), lines[1]), lines[1]
