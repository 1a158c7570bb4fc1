"""The layout shows the architecture (docs/architecture.md): no module imports one of a higher
layer, and no module grows past ~400 lines."""

from __future__ import annotations

import ast
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
    ["step"],
    ["run"],
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
