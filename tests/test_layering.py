"""The package's imports point one way: model <- twin <- scheduling <- {rl, serving, ...}
<- bench <- cli, lazy imports (inside functions) included.

Walks every module's syntax tree (no import is executed), maps each
``smartsched.<pkg>`` import to its top-level package and fails on any import
from a lower layer to a higher one, and on any cycle between packages of the
same layer. A new top-level package must be placed in ``LAYERS`` on purpose.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "platform" / "smartsched"

# Lowest first. A package may import its own layer's packages (without cycles) and
# every layer below it, never one above.
LAYERS: tuple[frozenset[str], ...] = (
    # ray_local: how SmartSched starts Ray itself (imports nothing of SmartSched).
    # listen: where a service may listen (model's errors only).
    # pool: independent jobs across processes (imports nothing of SmartSched).
    # outputs: where a command may write a report (imports nothing of SmartSched).
    frozenset({"paths", "model", "ray_local", "listen", "pool", "outputs"}),
    # Sources of pods, and the load forecaster: a model the twin runs with (the run
    # builder attaches it), importing only model. audit: the tamper-evident decision
    # log, which every driver above writes to. carbon: grid-intensity forecasts and
    # temporal shifting of deferrable jobs (model only).
    frozenset({"workloads", "forecast", "audit", "carbon"}),
    frozenset({"twin"}),
    frozenset({"scheduling"}),
    # optimize: the annealing window placer and its exact reference (over profiles).
    frozenset({"objectives", "prometheus", "perception", "rl", "serving", "k8s",
               "federation", "tuning", "client", "optimize"}),
    frozenset({"bench"}),
    frozenset({"cli", "__main__"}),
)
RANK = {pkg: i for i, layer in enumerate(LAYERS) for pkg in layer}


def _package_of(path: Path) -> str:
    rel = path.relative_to(ROOT)
    return rel.parts[0].removesuffix(".py") if len(rel.parts) > 1 else rel.stem


def _imported_packages(path: Path) -> list[tuple[int, str]]:
    return _packages_in(path.read_text(), _package_of(path))


def _packages_in(source: str, own: str) -> list[tuple[int, str]]:
    """(line, top-level smartsched package) of every import in ``source``, lazy ones too."""
    tree = ast.parse(source)
    out: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against the file's own package
                names = [f"smartsched.{own}"]
            elif node.module == "smartsched":
                names = [f"smartsched.{a.name}" for a in node.names]
            elif node.module:
                names = [node.module]
        for name in names:
            parts = name.split(".")
            if parts[0] == "smartsched" and len(parts) > 1:
                out.append((node.lineno, parts[1]))
    return out


def _modules() -> list[Path]:
    return sorted(p for p in ROOT.rglob("*.py") if p.name != "__init__.py" or p.parent != ROOT)


def test_every_package_has_a_layer() -> None:
    unplaced = {_package_of(p) for p in _modules()} - set(RANK)
    assert not unplaced, f"place these packages in LAYERS: {sorted(unplaced)}"


def test_no_import_points_up() -> None:
    back: list[str] = []
    for path in _modules():
        own = _package_of(path)
        for line, pkg in _imported_packages(path):
            if pkg != own and pkg in RANK and RANK[pkg] > RANK.get(own, len(LAYERS)):
                back.append(f"{path.relative_to(ROOT.parent)}:{line} imports {pkg}")
    assert not back, "imports against the layering:\n" + "\n".join(back)


def test_no_cycle_within_a_layer() -> None:
    edges: dict[str, set[str]] = defaultdict(set)
    for path in _modules():
        own = _package_of(path)
        for _, pkg in _imported_packages(path):
            if pkg != own and RANK.get(pkg) == RANK.get(own):
                edges[own].add(pkg)

    def reaches(src: str, dst: str) -> bool:
        seen, todo = set(), [src]
        while todo:
            cur = todo.pop()
            for nxt in edges[cur]:
                if nxt == dst:
                    return True
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return False

    cycles = sorted({tuple(sorted((a, b))) for a in list(edges) for b in list(edges[a])
                     if reaches(b, a)})
    assert not cycles, f"packages importing each other: {cycles}"


@pytest.mark.parametrize("source, expected", [
    ("from smartsched.bench.simulate import simulate\n", ["bench"]),
    ("def f():\n    import smartsched.rl.env\n", ["rl"]),
    ("from smartsched import cli\n", ["cli"]),
    ("from . import engine\n", ["twin"]),
])
def test_the_walker_sees_lazy_aliased_and_relative_imports(source: str,
                                                           expected: list[str]) -> None:
    # The checker itself must not miss the forms a back edge would take.
    assert [pkg for _, pkg in _packages_in(source, "twin")] == expected
