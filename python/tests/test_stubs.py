"""The type stubs (python/stubs/actorflow-stubs, PEP 561) against the module:
every public name and every parameter of a function or method the module
has must be in the stubs, and the stubs must name nothing the module lacks.
A binding added or renamed without its stub fails here (docs/python.md)."""
import ast
import inspect
import pydoc
import re
from pathlib import Path

import pytest

import actorflow as af

STUBS = Path(__file__).resolve().parents[1] / "stubs" / "actorflow-stubs"
# Names of the stubs only: type aliases for annotations.
STUB_ONLY = {"TensorLike", "DTypeLike", "Fetches"}
MODULES = {"__init__": af, "train": af.train, "errors": af.errors, "nn": af.nn, "math": af.math}


def public(names):
    return {n for n in names if not n.startswith("_")}


def stub_tree(name):
    return ast.parse((STUBS / (name + ".pyi")).read_text())


def stub_names(tree):
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.AnnAssign):
            names.add(node.target.id)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets)
        elif isinstance(node, ast.ImportFrom):  # a stub re-exports only "import X as X"
            names.update(a.asname for a in node.names if a.asname == a.name)
    return names


def stub_params(fn):
    a = fn.args
    names = [p.arg for p in a.posonlyargs + a.args]
    if a.vararg:
        names.append("*" + a.vararg.arg)
    names += [p.arg for p in a.kwonlyargs]
    return [n for n in names if n != "self"]


def doc_params(obj, name):
    """The parameter names of pybind11's (or ops.cpp's) signature line, or None."""
    first = (getattr(obj, "__doc__", None) or "").split("\n")[0]
    m = re.match(re.escape(name) + r"\((.*)\) ->", first)
    if not m:
        return None
    params, depth, cur = [], 0, ""
    for c in m.group(1) + ",":
        if c == "," and depth == 0:
            params.append(cur.strip())
            cur = ""
            continue
        depth += c in "[(" and 1 or c in "])" and -1 or 0
        cur += c
    names = [re.split(r"[:=]", p)[0].strip() for p in params if p.strip()]
    return [n for n in names if n not in ("self", "/", "*", "")]


@pytest.mark.parametrize("stub", sorted(MODULES))
def test_stub_names_are_the_modules(stub):
    module = MODULES[stub]
    tree = stub_tree(stub)
    in_stub = public(stub_names(tree)) - STUB_ONLY
    in_module = public(n for n in dir(module) if not n.startswith("__"))
    assert in_module - in_stub == set(), "in the module, not in %s.pyi" % stub
    assert in_stub - in_module == set(), "in %s.pyi, not in the module" % stub


@pytest.mark.parametrize("stub", sorted(MODULES))
def test_stub_members_and_parameters_are_the_modules(stub):
    module = MODULES[stub]
    checked = 0
    for node in stub_tree(stub).body:
        if isinstance(node, ast.FunctionDef):
            fn = getattr(module, node.name)
            want = doc_params(fn, node.name)
            if want is not None:
                assert stub_params(node) == want, "%s.%s's parameters" % (stub, node.name)
                checked += 1
        if not isinstance(node, ast.ClassDef):
            continue
        cls = getattr(module, node.name)
        members = {n.name: n for n in node.body if isinstance(n, ast.FunctionDef)}
        members_public = public(members) | {n.target.id for n in node.body if isinstance(n, ast.AnnAssign)}
        in_class = public(vars(cls))
        if cls.__module__.startswith("actorflow") and not issubclass(cls, BaseException):
            assert members_public == in_class, "members of %s.%s" % (stub, node.name)
        for name, fn in members.items():
            if name.startswith("__") and name != "__init__" or not hasattr(cls, name):
                continue
            want = doc_params(getattr(cls, name), name)
            if want is not None and not isinstance(vars(cls).get(name), property):
                assert stub_params(fn) == want, "%s.%s.%s's parameters" % (stub, node.name, name)
                checked += 1
    assert checked > 0 or stub == "errors"


def test_the_build_tree_has_the_stubs_next_to_the_module():
    built = Path(af.__file__).parent / "actorflow-stubs"
    if not (built.parent.parent / "CMakeCache.txt").exists():
        pytest.skip("the module is not imported from a CMake build tree")
    for stub in STUBS.glob("*.pyi"):
        assert (built / stub.name).read_text() == stub.read_text(), stub.name


def test_help_shows_real_signatures():
    run = pydoc.render_doc(af.Session.run)
    assert "run(self: actorflow.Session, fetches: handle, feed_dict: handle = None, " \
           "options: handle = None, run_metadata: handle = None)" in run
    assert "matmul(A, B, /, *, transpose_a: bool = False" in pydoc.render_doc(af.matmul)
    assert "save(self: actorflow.train.Saver, sess: object, save_path: str" in \
        pydoc.render_doc(af.train.Saver)
