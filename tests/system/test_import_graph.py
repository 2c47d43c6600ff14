"""The import graph of jaxswe/, envs/ and sharding/ runs only downwards and has no cycle.

Every `import` counts, at module level, inside functions and under TYPE_CHECKING. Floors, lowest first:
`sharding` and `envs` (beside, never importing jaxswe), jaxswe's foundation modules, `model`, then
{agent, rollout, train, run, policy} (siblings: may import each other, never in a cycle), `rl`, the stage
entry points (`stages`, the plan command), `cli`. Inside envs, its parts import only parts of lower floors.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

from helpers import ROOT, TESTS

PACKAGES = ("jaxswe", "envs", "sharding")

# package (jaxswe's sub-packages and top-level modules, envs, sharding) -> floor; imports go to floors <= own
FOUNDATION = [
    "errors",
    "distributed",
    "tokenizer",
    "config",
    "config_reference",
    "losses",
    "optim",
    "packing",
]
FLOORS = {
    "sharding": 0,
    "envs": 0,
    "jaxswe": 1,
    **{f"jaxswe.{name}": 1 for name in FOUNDATION},
    "jaxswe.model": 2,
    **{f"jaxswe.{name}": 3 for name in ("agent", "rollout", "train", "run", "policy")},
    "jaxswe.rl": 4,
    **{f"jaxswe.{name}": 5 for name in ("stages", "plan")},
    "jaxswe.cli": 6,
    "jaxswe.__main__": 6,
}
# envs' parts (its sub-packages and top-level modules; `envs` is its __init__) -> floor
ENVS_FLOORS = {
    "envs.errors": 0,
    "envs.base": 0,
    "envs.host_git": 1,
    "envs.toy": 1,
    "envs.sandbox": 1,
    "envs.tasks": 2,
    "envs.provision": 3,
    "envs.grading": 4,
    "envs": 5,
    "envs.__main__": 5,
}


def module_files() -> dict[str, Path]:
    """Dotted module name -> file, for every module of the three packages (not the task repositories
    under envs/tasks/builtin/: their folders are no packages)."""
    modules = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            if all((ROOT.joinpath(*parts[:i]) / "__init__.py").is_file() for i in range(1, len(parts))):
                modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def imported_modules(node: ast.Import | ast.ImportFrom, module: str, modules: dict[str, Path]) -> set[str]:
    """Our modules one import statement reaches: `from a import b` reaches module a.b, else a."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        base = node.module or ""
        if node.level:
            parts = module.split(".")
            parent = parts[: len(parts) - node.level + (modules[module].name == "__init__.py")]
            base = ".".join(parent + ([base] if base else []))
        names = [
            f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names
        ]
    return {owner for owner in map(lambda name: _owner(name, modules), names) if owner}


def _owner(name: str, modules: dict[str, Path]) -> str | None:
    """The innermost module of ours that `name` lies in, None outside the three packages."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


@functools.cache
def import_edges() -> set[tuple[str, str]]:
    """(importer, imported) module pairs inside the three packages."""
    modules = module_files()
    edges = set()
    for module, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                edges |= {
                    (module, target) for target in imported_modules(node, module, modules) if target != module
                }
    return edges


def package_of(module: str) -> str:
    """A module's package: jaxswe's sub-package or top-level module, or the whole of envs/sharding."""
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "jaxswe" else parts[0]


def envs_part(module: str) -> str:
    """An envs module's part: its sub-package or top-level module."""
    return ".".join(module.split(".")[:2])


def cycles(edges: set[tuple[str, str]]) -> list[list[str]]:
    """The strongly connected components with more than one node (Tarjan, iterative)."""
    graph: dict[str, list[str]] = {}
    for a, b in sorted(edges):
        graph.setdefault(a, []).append(b)
        graph.setdefault(b, [])
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(graph[start]))]
        index[start] = low[start] = len(index)
        stack.append(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = stack[stack.index(node) :]
                    del stack[stack.index(node) :]
                    if len(component) > 1:
                        found.append(sorted(component))
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                work.append((child, iter(graph[child])))
            elif child in stack:
                low[node] = min(low[node], index[child])
    return found


def test_every_package_has_a_floor():
    missing = sorted({package_of(m) for m in module_files()} - FLOORS.keys())
    assert not missing, f"packages with no floor in FLOORS: {missing}"


def test_no_import_runs_upwards():
    upward = sorted(
        f"{a} -> {b}"
        for a, b in import_edges()
        if FLOORS.get(package_of(b), 0) > FLOORS.get(package_of(a), 0)
        or (package_of(a) in ("envs", "sharding") and package_of(b) != package_of(a))
    )
    assert not upward, "imports that run upwards:\n" + "\n".join(upward)


def test_every_envs_part_has_a_floor():
    missing = sorted({envs_part(m) for m in module_files() if package_of(m) == "envs"} - ENVS_FLOORS.keys())
    assert not missing, f"envs parts with no floor in ENVS_FLOORS: {missing}"


def test_envs_parts_import_only_lower_floors():
    """Strictly lower, so no cycle can form between envs' parts."""
    upward = sorted(
        f"{a} -> {b}"
        for a, b in import_edges()
        if package_of(a) == package_of(b) == "envs"
        and envs_part(a) != envs_part(b)
        and ENVS_FLOORS.get(envs_part(b), 0) >= ENVS_FLOORS.get(envs_part(a), 0)
    )
    assert not upward, "envs imports that do not run downwards:\n" + "\n".join(upward)


def test_no_cycle_between_packages():
    edges = {(package_of(a), package_of(b)) for a, b in import_edges() if package_of(a) != package_of(b)}
    found = cycles(edges)
    assert not found, f"package cycles: {found}\n" + "\n".join(
        f"{a} -> {b}"
        for a, b in sorted(import_edges())
        if package_of(a) != package_of(b) and {package_of(a), package_of(b)} <= set(sum(found, []))
    )


def test_no_cycle_between_files():
    found = cycles(import_edges())
    assert not found, f"file cycles: {found}"


def test_the_graph_sees_function_and_type_checking_imports():
    edges = import_edges()
    assert ("jaxswe.cli.serve", "jaxswe.rollout.weights") in edges  # inside a function
    assert ("jaxswe.cli.report", "envs.tasks.records") in edges  # under TYPE_CHECKING


def test_no_test_directory_shadows_a_package():
    """tests/ is on sys.path (the shared helpers): a directory there named like a top-level package
    would be imported in its place wherever the checkout's root is not on sys.path."""
    packages = {p.parent.name for p in ROOT.glob("*/__init__.py")}
    assert {"envs", "jaxswe", "sharding"} <= packages
    shadowing = sorted(d.name for d in TESTS.iterdir() if d.is_dir() and d.name in packages)
    assert not shadowing, shadowing
