# SPDX-License-Identifier: Apache-2.0
"""The package's import layering: each module imports only its own layer or lower, and no module imports
another in a circle.

Every ``dspark`` import of every module under ``python/dspark`` is read with :mod:`ast`: top-level ones and
those inside functions, ``import x`` and ``from x import y``, relative ones, and ones under ``TYPE_CHECKING``
(a type-only dependency is a dependency too). ``from pkg import name`` counts as an import of the submodule
``pkg.name`` when one exists, else of ``pkg`` itself (its ``__init__``).

Package ``__init__`` modules take part in the cycle check with the imports they write (their re-exports): a
submodule that imports its own package's ``__init__`` while that ``__init__`` imports it is a real circle.
What is left out is the implicit import of parent packages that Python performs before every submodule: it
would tie every module to ``dspark/__init__.py`` and carries no dependency the code chose.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

PACKAGE_DIR = Path(__file__).resolve().parents[1] / "python" / "dspark"

# Layers, low to high. A module belongs to the entry naming it or the package above it (the longest match);
# "dspark" alone is the top package's __init__ (the public API).
LAYERS: dict[str, int] = {
    "dspark._C": 0,  # the compiled extension (no Python source)
    "dspark._version": 0,
    "dspark.host_sync": 0,
    "dspark.ops": 0,
    "dspark.prompts": 0,
    "dspark.reference": 0,  # oracles for tests and benchmarks; product code never imports them
    "dspark.kv": 1,
    "dspark.models": 2,
    "dspark.decoding": 3,
    "dspark.calibration": 4,
    "dspark.profiling": 4,
    "dspark.training": 4,
    "dspark.cli": 5,
    "dspark.demo": 5,
    "dspark": 5,
}

# Modules that exist without a .py file.
EXTENSION_MODULES = frozenset({"dspark._C"})

# Within one layer, a group (an entry of LAYERS) may import another group only where listed here. The three
# layer-4 packages (calibration, profiling, training) do not import one another: what they share lives lower.
SAME_LAYER_IMPORTS: frozenset[tuple[str, str]] = frozenset(
    {
        ("dspark.ops", "dspark._C"),
        ("dspark.ops", "dspark.host_sync"),
        ("dspark.reference", "dspark.ops"),
        ("dspark.cli", "dspark"),
        ("dspark.cli", "dspark.demo"),
        ("dspark.demo", "dspark"),
    }
)

ORACLES = "dspark.reference"


def discover(root: Path = PACKAGE_DIR) -> dict[str, tuple[str, bool]]:
    """Every module under ``root``: dotted name -> (source, is a package ``__init__``)."""
    found: dict[str, tuple[str, bool]] = {}
    for path in sorted(root.rglob("*.py")):
        parts = ("dspark", *path.relative_to(root).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        name = ".".join(parts[:-1] if is_package else parts)
        found[name] = (path.read_text(encoding="utf-8"), is_package)
    return found


def _resolve_relative(module: str, is_package: bool, level: int, target: str | None) -> str:
    package = module if is_package else module.rpartition(".")[0]
    for _ in range(level - 1):
        package = package.rpartition(".")[0]
    return f"{package}.{target}" if target else package


def imports_of(module: str, source: str, is_package: bool, known: Iterable[str]) -> set[str]:
    """The ``dspark`` modules that ``module`` imports anywhere in ``source`` (itself excluded)."""
    known = set(known)
    out: set[str] = set()
    for node in ast.walk(ast.parse(source, filename=module)):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = (
                _resolve_relative(module, is_package, node.level, node.module) if node.level else node.module
            )
            for a in node.names:
                sub = f"{base}.{a.name}"
                out.add(sub if sub in known else base)
    return {m for m in out if (m == "dspark" or m.startswith("dspark.")) and m != module}


def import_graph(modules: Mapping[str, tuple[str, bool]]) -> dict[str, set[str]]:
    """Module -> the ``dspark`` modules it imports."""
    known = set(modules) | EXTENSION_MODULES
    return {name: imports_of(name, src, pkg, known) for name, (src, pkg) in modules.items()}


def group_of(module: str, layers: Mapping[str, int] = LAYERS) -> str | None:
    """The LAYERS entry a module belongs to (None when there is none)."""
    if module == "dspark":
        return "dspark" if "dspark" in layers else None
    matches = [k for k in layers if k != "dspark" and (module == k or module.startswith(k + "."))]
    return max(matches, key=len) if matches else None


def layer_violations(
    graph: Mapping[str, set[str]],
    layers: Mapping[str, int] = LAYERS,
    same_layer: frozenset[tuple[str, str]] = SAME_LAYER_IMPORTS,
) -> list[str]:
    """Imports of a higher layer, of an unlisted same-layer group, of an unknown module, or of the oracles."""
    known = set(graph) | EXTENSION_MODULES
    problems = []
    for module, targets in sorted(graph.items()):
        src = group_of(module, layers)
        if src is None:
            problems.append(f"{module}: not in LAYERS (give it a layer)")
            continue
        for t in sorted(targets):
            dst = group_of(t, layers)
            if t not in known or dst is None:
                problems.append(f"{module} imports {t}, which is no module with a layer")
            elif dst == ORACLES and src != ORACLES:
                problems.append(f"{module} imports {t}: the oracles are for tests and benchmarks only")
            elif layers[dst] > layers[src]:
                problems.append(f"{module} (layer {layers[src]}) imports {t} (layer {layers[dst]}): upward")
            elif layers[dst] == layers[src] and dst != src and (src, dst) not in same_layer:
                problems.append(f"{module} imports {t}: sibling groups of layer {layers[src]}")
    return problems


def oracle_attribute_uses(modules: Mapping[str, tuple[str, bool]]) -> list[str]:
    """Product modules that reach the oracles as an attribute (``dspark.reference.x`` after ``import dspark``)."""
    out = []
    for name, (src, _) in sorted(modules.items()):
        if group_of(name) == ORACLES:
            continue
        for node in ast.walk(ast.parse(src, filename=name)):
            if (
                isinstance(node, ast.Attribute)
                and node.attr == "reference"
                and isinstance(node.value, ast.Name)
                and node.value.id == "dspark"
            ):
                out.append(f"{name}:{node.lineno} uses dspark.reference")
    return out


def import_cycles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return import_graph(discover())


def test_the_tree_is_found(graph):
    assert {"dspark", "dspark.cli", "dspark.decoding.planner", "dspark.ops"} <= set(graph)


def test_every_module_imports_only_its_layer_or_lower(graph):
    assert layer_violations(graph) == []


def test_no_import_cycles(graph):
    assert import_cycles(graph) == []


def test_product_code_never_uses_the_oracles(graph):
    users = sorted(
        m for m, ts in graph.items() if group_of(m) != ORACLES and any(group_of(t) == ORACLES for t in ts)
    )
    assert users == []
    assert oracle_attribute_uses(discover()) == []


# ---- the checker can fail: synthetic trees ----------------------------------------------------------------


def _synthetic(modules: dict[str, str]) -> dict[str, set[str]]:
    # a name with modules below it is a package
    return import_graph({n: (src, any(m.startswith(n + ".") for m in modules)) for n, src in modules.items()})


def test_negative_control_upward_imports_are_reported():
    graph = _synthetic(
        {
            "dspark.kv": "",
            "dspark.kv.pool": "def f():\n    from dspark.decoding.planner import Planner\n",  # inside a function
            "dspark.decoding": "",
            "dspark.decoding.planner": "from ..profiling import table\n",  # relative, to layer 4
            "dspark.profiling.table": "import dspark.cli\n",  # plain import, to the top
            "dspark.cli": "",
        }
    )
    assert graph["dspark.decoding.planner"] == {"dspark.profiling.table"}
    found = layer_violations(graph)
    assert any(p.startswith("dspark.kv.pool (layer 1) imports dspark.decoding.planner") for p in found)
    assert any(
        p.startswith("dspark.decoding.planner (layer 3) imports dspark.profiling.table") for p in found
    )
    assert any(p.startswith("dspark.profiling.table (layer 4) imports dspark.cli") for p in found)
    assert len(found) == 3


def test_negative_control_siblings_oracles_and_unknowns_are_reported():
    graph = _synthetic(
        {
            "dspark.training.data": "",
            "dspark.calibration.cli": "from dspark.training.data import read_prompt_file\n",
            "dspark.reference": "",
            "dspark.reference.plan_verify": "",
            "dspark.cli": "from dspark import reference\n",
            "dspark.tools": "",  # no layer
            "dspark.decoding.decoder": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import dspark.gone\n",
        }
    )
    found = layer_violations(graph)
    assert "dspark.calibration.cli imports dspark.training.data: sibling groups of layer 4" in found
    assert any(p.startswith("dspark.cli imports dspark.reference: the oracles") for p in found)
    assert "dspark.tools: not in LAYERS (give it a layer)" in found
    assert "dspark.decoding.decoder imports dspark.gone, which is no module with a layer" in found
    assert len(found) == 4
    attribute = {"dspark.cli": ("import dspark\n\ndspark.reference.sps_ceil_ref([1], [1.0], 1)\n", False)}
    assert oracle_attribute_uses(attribute) == ["dspark.cli:3 uses dspark.reference"]


def test_negative_control_cycles_are_reported():
    graph = _synthetic(
        {
            "dspark.decoding": "from dspark.decoding.planner import Planner\n",  # the package re-exports
            "dspark.decoding.planner": "def f():\n    from dspark.decoding import tables\n",
            "dspark.decoding.tables": "from dspark.decoding import Planner\n",  # through the __init__
            "dspark.kv.pool": "from dspark.kv.index import x\n",
            "dspark.kv.index": "from dspark.kv.pool import y\n",
            "dspark.models.a": "import dspark.kv.pool\n",
        }
    )
    assert import_cycles(graph) == [
        ["dspark.decoding", "dspark.decoding.planner", "dspark.decoding.tables"],
        ["dspark.kv.index", "dspark.kv.pool"],
    ]
    assert layer_violations(graph) == []  # all within a layer or downward: only the cycle check catches them
