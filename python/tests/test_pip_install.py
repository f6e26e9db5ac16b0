"""`pip install .` (pyproject.toml, python/build_backend/actorflow_build.py):
pip builds the module with the project's CMake and installs it with its
type stubs; the installed copy imports and runs on its own. Offline, and
reusing the build directory these tests run from (ACTORFLOW_BUILD_DIR), so
that pip only checks the module is up to date instead of building anew."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

import actorflow as af

SOURCE = Path(__file__).resolve().parents[2]


def test_pip_install_builds_and_installs_the_module(tmp_path):
    build = Path(af.__file__).resolve().parent.parent
    if not (build / "CMakeCache.txt").exists():
        pytest.skip("the module is not imported from a CMake build tree to reuse")
    if subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True).returncode:
        pytest.skip("no pip for " + sys.executable)
    site = tmp_path / "site"
    env = dict(os.environ, ACTORFLOW_BUILD_DIR=str(build), PIP_DISABLE_PIP_VERSION_CHECK="1")
    env.pop("PYTHONPATH", None)
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "--no-build-isolation",
                          "--no-deps", "--no-index", "--target", str(site), str(SOURCE)],
                         env=env, capture_output=True, text=True, timeout=240)
    assert pip.returncode == 0, pip.stdout[-3000:] + pip.stderr[-3000:]
    modules = list(site.glob("actorflow.*.so"))
    assert len(modules) == 1
    assert (site / "actorflow-stubs" / "__init__.pyi").read_text() == \
        (SOURCE / "python" / "stubs" / "actorflow-stubs" / "__init__.pyi").read_text()
    assert len(list(site.glob("actorflow-*.dist-info/RECORD"))) == 1

    script = (
        "import actorflow as af\n"
        "print(af.__file__)\n"
        "with af.train.LocalCluster({'local': 1}) as c:\n"
        "    v = af.Variable(1.0, name='v')\n"
        "    with af.Session(c.target('local', 0)) as s:\n"
        "        s.run(af.global_variables_initializer())\n"
        "        print(s.run(v.assign_add(2.0)))\n")
    env = dict(os.environ, PYTHONPATH=str(site), PYTHONDONTWRITEBYTECODE="1")
    run = subprocess.run([sys.executable, "-c", script], env=env, cwd=str(tmp_path),
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    where, value = run.stdout.split()
    assert Path(where) == modules[0] and float(value) == 3.0
