"""The layout shows the architecture (docs/architecture.md): no module imports one of a higher
layer, and no module grows past ~400 lines."""

from __future__ import annotations

import ast
import os
from pathlib import Path

import llmrl

ROOT = Path(llmrl.__file__).parent
# bottom to top; a module may import its own room and any room below it
LAYERS = [
    ["errors", "ops"],
    ["config", "algos"],
    ["losses", "corrections", "estimators", "kl_control"],
    ["models"],
    ["tasks", "rewards", "envs"],
    ["parallel"],
    ["engines"],
    ["memory"],
    ["step"],
    ["run"],
    ["reward_model"],
    ["compare", "export", "model_eval"],
    ["cli", "__main__", "__init__"],
]
RANK = {name: i for i, names in enumerate(LAYERS) for name in names}


def _room(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _imports(path: Path) -> list[tuple[str, int]]:
    """The llmrl modules `path` imports, absolute, with their line."""
    rel = path.relative_to(ROOT.parent).with_suffix("")
    module = ".".join(rel.parts)
    package = module.removesuffix(".__init__") if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            target = ".".join(base + ([node.module] if node.module else []))
            names = [target] if node.module else [f"{target}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        found += [(n, node.lineno) for n in names if n.startswith("llmrl.")]
    return found


def test_every_room_is_in_a_layer() -> None:
    rooms = {p.stem if p.is_file() else p.name for p in ROOT.iterdir() if p.suffix == ".py" or (p / "__init__.py").exists()}
    assert rooms <= set(RANK), sorted(rooms - set(RANK))


def test_no_import_runs_against_the_layering() -> None:
    bad = []
    for path in sorted(ROOT.rglob("*.py")):
        module = ".".join(path.relative_to(ROOT.parent).with_suffix("").parts)
        here = _room(module.removesuffix(".__init__")) if module != "llmrl.__init__" else "__init__"
        for target, line in _imports(path):
            there = _room(target)
            if there != here and RANK[there] > RANK[here]:
                bad.append(f"{path.relative_to(ROOT.parent)}:{line} ({here}) imports {target} ({there})")
    assert not bad, "\n".join(bad)


def test_no_module_is_over_400_lines() -> None:
    long = {str(p.relative_to(ROOT.parent)): n for p in ROOT.rglob("*.py") if (n := len(p.read_text().splitlines())) > 400}
    assert not long, long


# ---- no import circle in llmrl/ or bench/ --------------------------------------------------------------
REPO = ROOT.parent
SCANNED = ("llmrl", "bench")


def _module_files() -> dict[str, Path]:
    """Dotted module name → file, for every .py under llmrl/ and bench/ (hidden folders such as
    bench/.trl-1.12 and __pycache__ left out)."""
    files: dict[str, Path] = {}
    for top in SCANNED:
        for folder, dirs, names in os.walk(REPO / top):
            dirs[:] = sorted(d for d in dirs if not d.startswith((".", "__")))
            for name in names:
                if name.endswith(".py"):
                    parts = (Path(folder) / name).relative_to(REPO).with_suffix("").parts
                    files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = Path(folder) / name
    return files


def _import_graph(files: dict[str, Path]) -> dict[str, dict[str, int]]:
    """module → {module it imports: line}, from the AST: every import statement, at the top or inside a
    function. `from P import n` is an import of P.n when that is a module, else of P; a bench script's
    plain `import x` is also looked up beside the script (its folder is sys.path[0] when run)."""
    graph: dict[str, dict[str, int]] = {}
    for module, path in files.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        beside = ".".join(path.relative_to(REPO).parent.parts)

        def known(name: str) -> str | None:
            for candidate in (name, f"{beside}.{name}" if module.startswith("bench") else None):
                if candidate in files:
                    return candidate
            return None

        edges: dict[str, int] = {}
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
                target = ".".join(base + ([node.module] if node.module else []))
                subs = [known(f"{target}.{a.name}") for a in node.names]
                found = [s for s in subs if s] + ([known(target)] if None in subs or not node.names else [])
            elif isinstance(node, ast.Import):
                found = [known(a.name) for a in node.names]
            else:
                continue
            for target in found:
                if target and target != module:
                    edges.setdefault(target, node.lineno)
        graph[module] = edges
    return graph


def _cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def test_the_cycle_finder_finds_a_circle() -> None:
    graph = {"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 1}, "d": {"a": 1}, "e": {}}
    assert _cycles(graph) == [["a", "b", "c"]]
    assert _cycles({"a": {"b": 1}, "b": {}}) == []


def test_the_import_graph_sees_function_level_and_script_imports() -> None:
    graph = _import_graph(_module_files())
    assert "llmrl.engines.hf_turns" in graph["llmrl.engines.hf"]  # top level
    assert "llmrl.algos" in graph["llmrl.config.load"]  # inside a function
    assert "llmrl.rewards.builtin" in graph["bench.contenders.trl_grpo"]  # inside a function, absolute
    assert "bench.rg_learning" in graph["bench.dtype_runs"]  # a script's sibling


def test_no_import_circle_in_llmrl_or_bench() -> None:
    files = _module_files()
    graph = _import_graph(files)
    circles = [" ↔ ".join(c) + ": " + "; ".join(f"{files[m].relative_to(REPO)}:{graph[m][n]} imports {n}"
                                               for m in c for n in sorted(graph[m]) if n in c)
               for c in _cycles(graph)]
    assert not circles, "import circles:\n" + "\n".join(circles)
