"""The PEP 517 build backend of `pip install .` (pyproject.toml): it drives
the project's own CMake (the same build as `ninja -C build actorflow_python`,
docs/python.md) and packs the module it builds, with its type stubs
(python/stubs/actorflow-stubs, PEP 561), into a wheel. Standard library
only: Debian 12 has no scikit-build-core, and `pip install
--no-build-isolation --no-index .` must work with no network.

Where it builds, first found:
  pip's --config-settings build-dir=DIR, or $ACTORFLOW_BUILD_DIR: an existing
    CMake build directory of this source tree is reused (only the module
    target is built, a no-op when it is up to date); a new one is configured;
  else build-pip/ in the source tree (configured once, then reused).
A new build directory is configured for the Python running pip
(-DPython3_EXECUTABLE), Release, without the tests, with Ninja and ccache
when they are installed; $ACTORFLOW_CMAKE_ARGS (or config setting
cmake-args) adds arguments, e.g. "-DACTORFLOW_WITH_CUDA=OFF".

`python -m build --sdist` (or this module's build_sdist hook) packs the
source tree into dist/actorflow-VERSION.tar.gz: the files git tracks or would (untracked, not ignored) when
the tree is a git work tree, else every file but build directories (an
unpacked sdist packs itself again), with PKG-INFO. `pip install
--no-build-isolation --no-index DIR` of the unpacked sdist builds the
module as from the git tree.
"""
import base64
import hashlib
import io
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tomllib
import zipfile
from pathlib import Path

SOURCE = Path(__file__).resolve().parents[2]
STUBS = SOURCE / "python" / "stubs" / "actorflow-stubs"
TARGET = "actorflow_python"


def _project():
    with open(SOURCE / "pyproject.toml", "rb") as f:
        project = tomllib.load(f)["project"]
    cmake = (SOURCE / "CMakeLists.txt").read_text()
    version = re.search(r"project\(actorflow VERSION ([0-9.]+)", cmake).group(1)
    return project, version


def _setting(config_settings, key, env):
    value = (config_settings or {}).get(key)
    return value if value else os.environ.get(env, "")


def _build_dir(config_settings):
    given = _setting(config_settings, "build-dir", "ACTORFLOW_BUILD_DIR")
    return Path(given).resolve() if given else SOURCE / "build-pip"


def _run(cmd):
    print("actorflow build:", " ".join(shlex.quote(str(c)) for c in cmd), file=sys.stderr, flush=True)
    subprocess.run([str(c) for c in cmd], check=True, stdout=sys.stderr)


def _configure(build, config_settings):
    cmd = ["cmake", "-S", SOURCE, "-B", build, "-DCMAKE_BUILD_TYPE=Release",
           "-DACTORFLOW_BUILD_TESTS=OFF", "-DPython3_EXECUTABLE=" + sys.executable]
    if shutil.which("ninja"):
        cmd += ["-G", "Ninja"]
    if shutil.which("ccache"):
        cmd.append("-DCMAKE_CXX_COMPILER_LAUNCHER=ccache")
    cmd += shlex.split(_setting(config_settings, "cmake-args", "ACTORFLOW_CMAKE_ARGS"))
    _run(cmd)


def _build_module(config_settings):
    """The module's path, built (or found up to date) by CMake."""
    build = _build_dir(config_settings)
    if not (build / "CMakeCache.txt").exists():
        _configure(build, config_settings)
    _run(["cmake", "--build", build, "--target", TARGET])
    module = build / "python" / ("actorflow" + sysconfig.get_config_var("EXT_SUFFIX"))
    if not module.exists():
        built = sorted(p.name for p in (build / "python").glob("actorflow*.so"))
        raise RuntimeError(
            "%s has no %s after building %s: it is configured for another Python (it built %s) "
            "or without the module (pybind11-dev, python3-dev and NumPy for %s, see its CMake "
            "output); give pip another build-dir, or remove %s/CMakeCache.txt"
            % (build, module.name, TARGET, built or "nothing", sys.executable, build))
    return module


def _wheel_tag():
    impl = "cp%d%d" % sys.version_info[:2]
    platform = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    return "%s-%s-%s" % (impl, impl, platform)


def _metadata(project, version):
    lines = ["Metadata-Version: 2.1", "Name: " + project["name"], "Version: " + version,
             "Summary: " + project.get("description", "")]
    if "requires-python" in project:
        lines.append("Requires-Python: " + project["requires-python"])
    lines += ["Requires-Dist: " + d for d in project.get("dependencies", [])]
    return "\n".join(lines) + "\n"


def _record_line(name, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return "%s,sha256=%s,%d" % (name, digest, len(data))


def _is_git_top(path):
    try:
        top = subprocess.run(["git", "-C", str(path), "rev-parse", "--show-toplevel"],
                             capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return False
    return bool(top) and Path(top).resolve() == path.resolve()


# Not packed when the tree is not a git work tree: what building and testing leave.
_SKIPPED_DIRS = {".git", "__pycache__", ".pytest_cache", "venv", ".venv"}


def _earlier_sdist(rel):
    """Whether `rel` is an sdist an earlier build_sdist left in dist/ (where
    `python -m build --sdist` writes them; dist/ also holds sources): not
    packed, or each sdist held the ones before it."""
    return re.fullmatch(r"dist/[^/]+\.tar\.gz", rel) is not None


def _sdist_files():
    """The source files to pack, relative to SOURCE, sorted."""
    if _is_git_top(SOURCE):
        out = subprocess.run(["git", "-C", str(SOURCE), "ls-files", "-z", "--cached", "--others",
                              "--exclude-standard"], capture_output=True,
                             check=True).stdout.decode()
        return sorted(f for f in out.split("\0")
                      if f and (SOURCE / f).is_file() and not _earlier_sdist(f))
    files = []
    for root, dirs, names in os.walk(SOURCE):
        rel = Path(root).relative_to(SOURCE)
        dirs[:] = [d for d in dirs if d not in _SKIPPED_DIRS
                   and not (rel == Path(".") and d.startswith("build"))]
        files += [str(rel / n) if rel != Path(".") else n for n in names
                  if not n.endswith(".pyc") and n != "PKG-INFO"
                  and not _earlier_sdist(str(rel / n))]
    return sorted(files)


# -- PEP 517 hooks -------------------------------------------------------------

def get_requires_for_build_sdist(config_settings=None):
    return []


def build_sdist(sdist_directory, config_settings=None):
    project, version = _project()
    base = "%s-%s" % (project["name"], version)
    name = base + ".tar.gz"

    def normalized(info):
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        info.mode = 0o755 if info.mode & 0o111 else 0o644
        return info

    with tarfile.open(os.path.join(sdist_directory, name), "w:gz", format=tarfile.PAX_FORMAT) as tar:
        for rel in _sdist_files():
            tar.add(str(SOURCE / rel), arcname=base + "/" + rel, recursive=False, filter=normalized)
        pkg_info = _metadata(project, version).encode()
        info = tarfile.TarInfo(base + "/PKG-INFO")
        info.size = len(pkg_info)
        info.mode = 0o644
        tar.addfile(info, io.BytesIO(pkg_info))
    return name


def get_requires_for_build_wheel(config_settings=None):
    return []


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    project, version = _project()
    module = _build_module(config_settings)
    tag = _wheel_tag()
    dist_info = "%s-%s.dist-info" % (project["name"], version)
    files = [(module.name, module.read_bytes())]
    for stub in sorted(STUBS.glob("*.pyi")):
        files.append(("actorflow-stubs/" + stub.name, stub.read_bytes()))
    files.append((dist_info + "/METADATA", _metadata(project, version).encode()))
    wheel_meta = ("Wheel-Version: 1.0\nGenerator: actorflow_build\nRoot-Is-Purelib: false\n"
                  "Tag: %s\n" % tag)
    files.append((dist_info + "/WHEEL", wheel_meta.encode()))
    record = [_record_line(name, data) for name, data in files] + [dist_info + "/RECORD,,"]
    files.append((dist_info + "/RECORD", ("\n".join(record) + "\n").encode()))
    name = "%s-%s-%s.whl" % (project["name"], version, tag)
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w", zipfile.ZIP_DEFLATED) as whl:
        for arcname, data in files:
            info = zipfile.ZipInfo(arcname, date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = (0o755 if arcname.endswith(".so") else 0o644) << 16
            whl.writestr(info, data, zipfile.ZIP_DEFLATED)
    return name
