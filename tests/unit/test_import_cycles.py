"""No import cycles in tracelens/: module- and function-level imports (not those under TYPE_CHECKING),
found by parsing every module with `ast`, so a lazy import inside a function counts too."""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[2] / "tracelens"


def _modules(root: Path) -> dict[str, Path]:
    """Module name -> its file: the Python modules, and the compiled ones by their stubs (a `.pyi` without a
    `.py`: `ingest/kineto/_native`), which import nothing of the package."""
    out = {}
    for f in [*root.rglob("*.py"), *(p for p in root.rglob("*.pyi") if not p.with_suffix(".py").exists())]:
        parts = list(f.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = f
    return out


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    """ids of every node inside an `if TYPE_CHECKING:` block."""
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If):
            t = node.test
            name = t.id if isinstance(t, ast.Name) else t.attr if isinstance(t, ast.Attribute) else None
            if name == "TYPE_CHECKING":
                for child in node.body:
                    skip.update(id(n) for n in ast.walk(child))
    return skip


def import_graph(root: Path) -> dict[str, set[str]]:
    """module -> the package modules it imports (anywhere in its code)."""
    mods = _modules(root)
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, f in mods.items():
        tree = ast.parse(f.read_text(), str(f))
        skip = _type_checking_nodes(tree)
        is_pkg = f.name == "__init__.py"
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    pkg = mod.split(".") if is_pkg else mod.split(".")[:-1]
                    pkg = pkg[: len(pkg) - (node.level - 1)]
                    base = ".".join(pkg + ([base] if base else []))
                for a in node.names:
                    sub = f"{base}.{a.name}"
                    targets.append(sub if sub in mods else base)
            for t in targets:
                while t and t not in mods:  # `import a.b.c` of a non-module attribute path
                    t = t.rpartition(".")[0]
                if t and t != mod:
                    graph[mod].add(t)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_finder_sees_a_function_level_cycle_and_ignores_type_checking(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg.sub import b\n")
    (pkg / "sub" / "b.py").write_text("def f():\n    from .. import a\n")
    (pkg / "c.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import a\nimport pkg.sub.b\n"
    )
    g = import_graph(pkg)
    assert g["pkg.a"] == {"pkg.sub.b"} and g["pkg.sub.b"] == {"pkg.a"} and g["pkg.c"] == {"pkg.sub.b"}
    assert cycles(g) == [["pkg.a", "pkg.sub.b"]]


def test_tracelens_has_no_import_cycles() -> None:
    g = import_graph(PKG)
    assert len(g) > 50 and "tracelens.run" in g["tracelens.run_analysis"]
    assert cycles(g) == []


def test_commands_never_import_the_cli() -> None:
    g = import_graph(PKG)
    assert all("tracelens.cli" not in g[m] for m in g if m.startswith("tracelens.commands"))


#: Which parts of tracelens each part may import (its own modules always; docs/architecture.md, "Layers").
#: Data flows one way: schema -> store -> ingest -> analyze -> views / summary -> report; summary.json
#: consumers (`summaries`) read documents, never traces.
LAYERS: dict[str, set[str]] = {
    "tracelens.schema": set(),
    "tracelens.errors": set(),
    "tracelens.thresholds": {"tracelens.errors"},
    "tracelens.store": {"tracelens._version", "tracelens.schema", "tracelens.errors"},
    "tracelens.ingest": {"tracelens.errors", "tracelens.findings", "tracelens.schema", "tracelens.store"},
    "tracelens.models": {"tracelens.errors", "tracelens.findings"},
    "tracelens.analyze": {
        "tracelens.errors",
        "tracelens.findings",
        "tracelens.ingest",
        "tracelens.models",
        "tracelens.schema",
        "tracelens.thresholds",
    },
    "tracelens.engine": {
        "tracelens.analyze",
        "tracelens.errors",
        "tracelens.ingest",
        "tracelens.schema",
        "tracelens.store",
    },
    "tracelens.views": {"tracelens.analyze"},
    "tracelens.summary_check": {"tracelens.errors"},
    "tracelens.result": {"tracelens.errors", "tracelens.summary_check"},
    "tracelens.summaries": {"tracelens.errors", "tracelens.summary_check"},
    "tracelens.report": {
        "tracelens._version",
        "tracelens.outputs",
        "tracelens.policy",
        "tracelens.result",
        "tracelens.store",
        "tracelens.summaries",
    },
}


def _part(module: str) -> str:
    return ".".join(module.split(".")[:2])


def layer_violations(graph: dict[str, set[str]], layers: dict[str, set[str]]) -> list[str]:
    """'a -> b' for each import of a module `a` of a listed part of a module `b` of a part it may not import."""
    out = []
    for mod, targets in sorted(graph.items()):
        part = _part(mod)
        if part not in layers:
            continue
        for t in sorted(targets):
            other = _part(t)
            if other != part and other not in layers[part]:
                out.append(f"{mod} -> {t}")
    return out


def test_the_layer_check_sees_a_lazy_import_against_the_flow(tmp_path: Path) -> None:
    pkg = tmp_path / "tracelens"
    (pkg / "report").mkdir(parents=True)
    (pkg / "analyze" / "efficiency").mkdir(parents=True)
    for f in ("__init__.py", "report/__init__.py", "analyze/__init__.py", "analyze/efficiency/__init__.py"):
        (pkg / f).write_text("")
    (pkg / "analyze" / "efficiency" / "ops.py").write_text("")
    (pkg / "report" / "html.py").write_text("def f():\n    from tracelens.analyze.efficiency import ops\n")
    g = import_graph(pkg)
    assert layer_violations(g, {"tracelens.report": set()}) == [
        "tracelens.report.html -> tracelens.analyze.efficiency.ops"
    ]
    assert layer_violations(g, {"tracelens.report": {"tracelens.analyze"}}) == []


def test_every_part_imports_only_the_parts_below_it() -> None:
    g = import_graph(PKG)
    assert {_part(m) for m in g} >= set(LAYERS)  # (every listed part exists)
    assert layer_violations(g, LAYERS) == []


#: Inside analyze/: which group of analyzers each group may import (docs/architecture.md, "Layers").
ANALYZE_GROUPS: dict[str, set[str]] = {
    "core": set(),
    "rank": {"core"},
    "layout": {"core"},
    "efficiency": {"core", "rank", "layout"},
    "pipeline": {"core", "rank", "layout"},
    "comm": {"core", "rank", "layout", "pipeline"},
    "critical": {"core", "rank", "layout", "pipeline", "comm"},
}


def test_analyzer_groups_import_only_the_groups_below_them() -> None:
    g = import_graph(PKG)
    groups = {m.split(".")[2] for m in g if m.startswith("tracelens.analyze.")}
    assert groups == set(ANALYZE_GROUPS)  # (every module of analyze/ is in a group)
    bad = []
    for mod, targets in sorted(g.items()):
        if not mod.startswith("tracelens.analyze."):
            continue
        own = mod.split(".")[2]
        for t in sorted(targets):
            if t.startswith("tracelens.analyze.") and t.split(".")[2] not in ANALYZE_GROUPS[own] | {own}:
                bad.append(f"{mod} -> {t}")
    assert bad == []
