"""The architecture as a contract: the layers of docs/ARCHITECTURE.md (import-linter, its
configuration in pyproject.toml), imports at module level unless they defer a heavy
dependency, no import cycle, no dead code (vulture), and each unit defined once."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import textwrap
from functools import cache
from pathlib import Path

import pytest

import pipesched

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "src" / "pipesched"
# third-party modules slow to import or optional (extras): imported where they are used
HEAVY = frozenset({"torch", "matplotlib", "ortools", "ray", "playwright"})
# what the command line loads only when a command runs, so that `pipesched --help` starts fast
CLI_DEFERRED = frozenset({"pipesched", "rich", "importlib"})
# the compiler a module that does not load it may defer (0.2 s to import): `pipesched list`
# and `pipesched validate` start without it, and the schedule formats load the communication
# pass only to write csv-comms, `generate` the slot table only to plan frozen stages again
START_UP_DEFERRED = "numba"
# vulture's confidence: 60 % reports every unused function, class, method, attribute and
# variable (100 % only unreachable code, 90 % unused imports)
VULTURE_CONFIDENCE = 60


def _tool(name: str) -> str:
    return shutil.which(name) or str(Path(sys.executable).parent / name)


def _env() -> dict[str, str]:
    """The environment with this checkout's sources first on the import path."""
    path = os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")]))
    return dict(os.environ, PYTHONPATH=path)


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def _modules() -> dict[str, ast.Module]:
    return {_module_name(path): ast.parse(path.read_text(encoding="utf-8"))
            for path in sorted(PACKAGE.rglob("*.py"))}


def _imported(node: ast.Import | ast.ImportFrom) -> list[str]:
    """The modules an import statement loads (a ``from`` import of a submodule loads it)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    found = [node.module or ""]
    found += [f"{node.module}.{alias.name}" for alias in node.names if f"{node.module}.{alias.name}" in _modules()]
    return found


def _is_type_checking(node: ast.If) -> bool:
    return isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"


def _module_level_imports(tree: ast.Module) -> list[str]:
    """What a module imports when it is imported (not under ``if TYPE_CHECKING:``)."""
    found: list[str] = []
    pending: list[ast.stmt] = list(tree.body)
    while pending:
        node = pending.pop()
        if isinstance(node, ast.Import | ast.ImportFrom):
            found += _imported(node)
        elif isinstance(node, ast.If) and not _is_type_checking(node):
            pending += node.body + node.orelse
        elif isinstance(node, ast.Try):
            pending += node.body + node.orelse + node.finalbody + [s for h in node.handlers for s in h.body]
    return found


def _function_level_imports() -> list[tuple[str, int, str]]:
    """(module, line, imported module) of every import inside a function."""
    found = []
    for name, tree in _modules().items():
        for function in ast.walk(tree):
            if isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
                for node in ast.walk(function):
                    if isinstance(node, ast.Import | ast.ImportFrom):
                        found += [(name, node.lineno, imported) for imported in _imported(node)]
    return found


def _loaded_with(module: str) -> set[str]:
    """Every module importing ``module`` loads: its packages and what they import, transitively."""
    seen: set[str] = set()
    pending = [module]
    while pending:
        name = pending.pop()
        parents = [".".join(name.split(".")[:k]) for k in range(1, name.count(".") + 1)]
        for each in [name, *parents]:
            if each not in seen:
                seen.add(each)
                pending += _module_level_imports(_modules()[each]) if each in _modules() else []
    return seen


@cache
def _loaders() -> frozenset[tuple[str, str]]:
    """(module, function) of our functions that import a heavy module when called (the
    guarded ``torch = require_torch()``)."""
    return frozenset((module, function.name) for module, tree in _modules().items() for function in tree.body
                     if isinstance(function, ast.FunctionDef)
                     for node in ast.walk(function) if isinstance(node, ast.Import | ast.ImportFrom)
                     and any(name.split(".")[0] in HEAVY for name in _imported(node)))


def _calls_a_loader(tree: ast.Module) -> bool:
    """Whether a module's top-level code calls one of the ``_loaders`` it imported."""
    imported = {alias.asname or alias.name: (node.module, alias.name) for node in tree.body
                if isinstance(node, ast.ImportFrom) for alias in node.names}
    return any(isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and imported.get(call.func.id) in _loaders()
               for statement in tree.body if not isinstance(statement, ast.FunctionDef | ast.ClassDef)
               for call in ast.walk(statement))


def _heavy(module: str) -> bool:
    """A heavy third-party module, or one of ours that loads one when it is imported."""
    return any(name.split(".")[0] in HEAVY or (name in _modules() and _calls_a_loader(_modules()[name]))
               for name in _loaded_with(module))


def test_the_layers_contract_holds() -> None:
    proc = subprocess.run([_tool("lint-imports"), "--no-cache"], cwd=ROOT, env=_env(), capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]


def test_an_upward_import_breaks_the_contract(tmp_path: Path) -> None:
    """The checker sees an import that runs up the layers (the rules reading the CLI)."""
    (tmp_path / ".importlinter").write_text(textwrap.dedent("""\
        [importlinter]
        root_package = pipesched

        [importlinter:contract:upward]
        name = the CLI above the rules
        type = layers
        layers =
            pipesched.cli
            pipesched.errors
        """), encoding="utf-8")
    package = tmp_path / "pipesched"
    package.mkdir()
    (package / "__init__.py").write_text("", encoding="utf-8")
    (package / "cli.py").write_text("import pipesched.errors\n", encoding="utf-8")
    (package / "errors.py").write_text("import pipesched.cli\n", encoding="utf-8")
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    proc = subprocess.run([_tool("lint-imports"), "--no-cache"], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert proc.returncode == 1
    assert "pipesched.errors is not allowed to import pipesched.cli" in proc.stdout


def _loads(module: str, top: str) -> bool:
    """Whether importing ``module`` loads the third-party package ``top``."""
    return any(name.split(".")[0] == top for name in _loaded_with(module))


def _deferral_allowed(module: str, imported: str) -> bool:
    """A function-level import of ``imported`` in ``module`` keeps a heavy dependency, numba
    from a module that does not load it, or a command's implementation out of start-up."""
    return (_heavy(imported)
            or (_loads(imported, START_UP_DEFERRED) and not _loads(module, START_UP_DEFERRED))
            or (module.startswith("pipesched.cli") and imported.split(".")[0] in CLI_DEFERRED))


@pytest.mark.slow
def test_function_level_imports_only_defer_heavy_modules() -> None:
    """An import inside a function defers a heavy dependency (or, in the command line, a
    command's implementation until it runs); every other import is at module level."""
    found = _function_level_imports()
    misplaced = [f"{module}:{line} imports {imported}" for module, line, imported in found
                 if not _deferral_allowed(module, imported)]
    assert misplaced == []


@pytest.mark.slow
def test_no_import_cycle() -> None:
    """No module imports itself back, through any chain of imports that run when modules are
    imported or their functions called (a package's ``__init__`` importing its own
    submodules aside)."""
    edges: dict[str, set[str]] = {name: set() for name in _modules()}
    for name, tree in _modules().items():
        for imported in _module_level_imports(tree):
            edges[name].add(imported)
    for name, _line, imported in _function_level_imports():
        edges[name].add(imported)
    for name in edges:
        edges[name] = {each for each in edges[name] if each in _modules() and each != name
                       and not (each.startswith(f"{name}.") and name in _packages())}
    cycles = [component for component in _strongly_connected(edges) if len(component) > 1]
    assert cycles == []


@cache
def _packages() -> frozenset[str]:
    return frozenset(_module_name(path) for path in PACKAGE.rglob("__init__.py"))


def _strongly_connected(edges: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components of a directed graph (iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, successors = work[-1]
            step = next(successors, None)
            if step is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    components.append(sorted(component))
            elif step not in index:
                index[step] = low[step] = len(index)
                stack.append(step)
                on_stack.add(step)
                work.append((step, iter(sorted(edges[step]))))
            elif step in on_stack:
                low[node] = min(low[node], index[step])
    return components


@pytest.mark.slow
def test_vulture_finds_no_dead_code() -> None:
    """Every function, class, attribute and variable is used by the package, its tests,
    benchmarks or examples (tests/vulture_whitelist.py names what only Python, typer,
    pytest, asdict or OR-Tools read)."""
    proc = subprocess.run([_tool("vulture"), "src/pipesched", "tests", "benchmarks", "examples",
                           f"--min-confidence={VULTURE_CONFIDENCE}"], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _assigned(tree: ast.Module) -> set[str]:
    """The names a module's top level assigns (``GiB = ...``, ``KB, MB = ...``)."""
    targets = [target for node in tree.body if isinstance(node, ast.Assign) for target in node.targets]
    return {name.id for target in targets for name in ast.walk(target) if isinstance(name, ast.Name)}


def test_units_are_defined_once() -> None:
    """GiB, GB and the other units are named in pipesched.units alone; others import them."""
    units = _assigned(_modules()["pipesched.units"])
    assert {"GiB", "GB", "MiB"} <= units
    again = {name: sorted(_assigned(tree) & units) for name, tree in _modules().items() if name != "pipesched.units"}
    assert {name: names for name, names in again.items() if names} == {}


@pytest.mark.slow
def test_no_submodule_shares_a_public_name() -> None:
    """A submodule once imported is bound over the package's attribute of its name: no
    submodule of pipesched is named like a public name (``pipesched.validate`` stays the
    function when ``pipesched.validation`` is imported)."""
    code = ("import pkgutil, pipesched; "
            "[__import__(f'pipesched.{m.name}') for m in pkgutil.iter_modules(pipesched.__path__)"
            " if m.name not in ('__main__', 'cli')]; "
            "print(','.join(n for n in pipesched.__all__ if type(getattr(pipesched, n)).__name__ == 'module'))")
    proc = subprocess.run([sys.executable, "-c", code], env=_env(), capture_output=True, text=True, check=True)
    assert proc.stdout.strip() == ""
    submodules = {path.stem for path in PACKAGE.glob("*.py")} | {path.parent.name for path in PACKAGE.glob("*/__init__.py")}
    assert submodules.isdisjoint(pipesched.__all__)


@pytest.mark.slow
def test_no_module_imports_another_modules_private_names() -> None:
    """A name with a leading underscore is its module's own: others import public names."""
    private = [f"{name} imports {node.module}.{alias.name}" for name, tree in _modules().items()
               for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("pipesched")
               for alias in node.names if alias.name.startswith("_")]
    assert private == []
