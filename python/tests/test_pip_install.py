"""`pip install .` (pyproject.toml, python/build_backend/actorflow_build.py):
pip builds the module with the project's CMake and installs it with its
type stubs; the installed copy imports and runs on its own. Offline, and
reusing the build directory these tests run from (ACTORFLOW_BUILD_DIR), so
that pip only checks the module is up to date instead of building anew.

The sdist (the backend's build_sdist hook, PEP 517): packed, unpacked and
configured by CMake (which refuses a tree that lacks a source it lists)
every time; built and installed by pip from the unpacked tree, a whole
build of the library, only with ACTORFLOW_TEST_SDIST_BUILD=1."""
import importlib.util
import os
import shutil
import subprocess
import sys
import tarfile
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

    _check_installed(site, modules[0], tmp_path)


def _check_installed(site, module, tmp_path):
    """The module installed in `site` imports from there and runs a step."""
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
    assert Path(where) == module and float(value) == 3.0


def _backend():
    path = SOURCE / "python" / "build_backend" / "actorflow_build.py"
    spec = importlib.util.spec_from_file_location("actorflow_build_under_test", path)
    backend = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(backend)
    return backend


def _unpacked_sdist(tmp_path):
    """The sdist the backend's hook makes of this tree, unpacked: its folder."""
    out = tmp_path / "sdist"
    out.mkdir()
    name = _backend().build_sdist(str(out))
    assert name == "actorflow-%s.tar.gz" % _backend()._project()[1]
    with tarfile.open(out / name) as tar:
        members = tar.getnames()
        tar.extractall(tmp_path / "unpacked")
    top = name[:-len(".tar.gz")]
    assert all(m.startswith(top + "/") for m in members)
    return tmp_path / "unpacked" / top, {m[len(top) + 1:] for m in members}


def test_the_sdist_holds_the_tree_and_configures(tmp_path):
    # Catches: no build_sdist hook (python -m build --sdist failed), an sdist
    # missing a file the build needs (a source CMake lists, the backend, the
    # stubs), or one that cannot pack itself again.
    tree, files = _unpacked_sdist(tmp_path)
    for needed in ("PKG-INFO", "pyproject.toml", "CMakeLists.txt", "graph/shapes.cpp",
                   "python/build_backend/actorflow_build.py", "python/stubs/actorflow-stubs/__init__.pyi"):
        assert needed in files, needed
    if shutil.which("git") and (SOURCE / ".git").exists():
        tracked = subprocess.run(["git", "-C", str(SOURCE), "ls-files"], capture_output=True,
                                 text=True, check=True).stdout.split()
        missing = [f for f in tracked if (SOURCE / f).is_file() and f not in files]
        assert not missing, missing[:10]
    assert "Version: " + _backend()._project()[1] in (tree / "PKG-INFO").read_text()
    again = subprocess.run(
        [sys.executable, "-c", "import sys; sys.path.insert(0, 'python/build_backend'); "
         "import actorflow_build as b; print(b.build_sdist(sys.argv[1]))", str(tmp_path)],
        cwd=str(tree), capture_output=True, text=True, timeout=60)
    assert again.returncode == 0, again.stderr
    with tarfile.open(tmp_path / again.stdout.strip()) as tar:
        top = again.stdout.strip()[:-len(".tar.gz")] + "/"
        assert {m[len(top):] for m in tar.getnames()} == files
    if not shutil.which("cmake"):
        pytest.skip("no cmake to configure the unpacked sdist")
    cfg = subprocess.run(["cmake", "-S", str(tree), "-B", str(tmp_path / "b"),
                          "-DACTORFLOW_BUILD_TESTS=OFF", "-DACTORFLOW_WITH_CUDA=OFF",
                          "-DPython3_EXECUTABLE=" + sys.executable],
                         capture_output=True, text=True, timeout=240)
    assert cfg.returncode == 0, cfg.stdout[-3000:] + cfg.stderr[-3000:]
    assert "actorflow: the Python module for" in cfg.stdout


def test_an_sdist_does_not_pack_the_sdists_before_it(tmp_path):
    # Catches: `python -m build --sdist` writes into dist/ of the tree (which
    # holds sources too), and the next sdist packed the one before it: each
    # sdist held every earlier one. The tree is an unpacked sdist (not a git
    # work tree), built from as the docs say.
    tree, files = _unpacked_sdist(tmp_path)
    (tree / "dist" / "actorflow-0.0.1.tar.gz").write_bytes(b"an earlier sdist")
    again = subprocess.run(
        [sys.executable, "-c", "import sys; sys.path.insert(0, 'python/build_backend'); "
         "import actorflow_build as b; print(b.build_sdist('dist'))"],
        cwd=str(tree), capture_output=True, text=True, timeout=60)
    assert again.returncode == 0, again.stderr
    with tarfile.open(tree / "dist" / again.stdout.strip()) as tar:
        top = again.stdout.strip()[:-len(".tar.gz")] + "/"
        packed = {m[len(top):] for m in tar.getnames()}
    assert packed == files, sorted(packed ^ files)


@pytest.mark.skipif(os.environ.get("ACTORFLOW_TEST_SDIST_BUILD") != "1",
                    reason="a whole build of the library: ACTORFLOW_TEST_SDIST_BUILD=1 runs it")
def test_pip_install_of_the_unpacked_sdist_builds_the_module(tmp_path):
    # Catches: an sdist from which pip cannot build the module offline.
    tree, _ = _unpacked_sdist(tmp_path)
    site = tmp_path / "site"
    env = dict(os.environ, PIP_DISABLE_PIP_VERSION_CHECK="1")
    for key in ("PYTHONPATH", "ACTORFLOW_BUILD_DIR"):
        env.pop(key, None)
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "--no-build-isolation",
                          "--no-deps", "--no-index", "--target", str(site),
                          "--config-settings", "cmake-args=-DACTORFLOW_WITH_CUDA=OFF", str(tree)],
                         env=env, capture_output=True, text=True, timeout=7200)
    assert pip.returncode == 0, pip.stdout[-3000:] + pip.stderr[-3000:]
    modules = list(site.glob("actorflow.*.so"))
    assert len(modules) == 1
    _check_installed(site, modules[0], tmp_path)
