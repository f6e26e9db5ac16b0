"""examples/python/: the tutorial's examples in Python, each checked
against the lines its REPL twin's examples/*.expected says it must print,
in order (lines of the REPL's own commands -- traces, listings -- are
those of a regular expression, "~ ", and are left to the REPL's test)."""
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


# The examples whose REPL twin's `trace` lists the ops that ran on each
# device (a device line, its ops indented): those lines are left to the
# REPL's test until the module gives a run's trace (af.RunOptions(trace=True)).
TRACED_OPS = {"towers", "model_parallel"}


def expected_lines(name):
    lines = []
    for line in (ROOT / "examples" / (name + ".expected")).read_text().splitlines():
        if line.startswith("#") or line.startswith("~ ") or not line.strip():
            continue
        if name in TRACED_OPS and (line.startswith("/job:") or line.startswith("   ")):
            continue
        lines.append(line)
    return lines


@pytest.mark.parametrize("name", ["single_device", "shared_variable", "ps_workers", "towers",
                                  "model_parallel"])
def test_example_prints_the_tutorials_lines(name):
    # Catches: an example whose values or order differ from the tutorial's
    # (a worker's increment lost, a shared variable not shared).
    script = ROOT / "examples" / "python" / (name + ".py")
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=120, env=dict(os.environ))
    assert out.returncode == 0, out.stderr
    printed = out.stdout.splitlines()
    at = 0
    for want in expected_lines(name):
        while at < len(printed) and printed[at] != want:
            at += 1
        assert at < len(printed), "missing %r after line %d of:\n%s" % (want, at, out.stdout)
        at += 1
