"""The code's shape, as the storage-engine reshape measured it: what app/ imports of the indexer, the largest classes,
long functions, branches on whether an index is chunked, string-dispatched shard calls, and modules mypy skips.

    .venv/bin/python scripts/code_shape.py [SRC]   # default src/hybrid_retrieval
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parent.parent
CHUNKED_FLAG = re.compile(r"chunking\.enabled|passages is (not )?None|\.chunked\b|chunker is (not )?None")
STRING_DISPATCH = re.compile(r"\.(all|some)\(\s*\"|getattr\(self\.clients|\.call\.remote\(|def __getattr__")


def modules(src: Path) -> dict[str, ast.Module]:
    return {str(path.relative_to(src.parent)): ast.parse(path.read_text(), str(path)) for path in sorted(src.rglob("*.py"))}


def indexer_imports_of_app(trees: dict[str, ast.Module]) -> set[str]:
    found = set()
    for name, tree in trees.items():
        if not name.startswith("hybrid_retrieval/app/"):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("hybrid_retrieval.indexer"):
                found.add(node.module or "")
    return found


def functions(trees: dict[str, ast.Module]) -> list[tuple[int, str]]:
    """(lines, module:qualified name) of every function and method."""
    out = []
    for name, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        item.name = f"{node.name}.{item.name}"
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                out.append(((node.end_lineno or node.lineno) - node.lineno + 1, f"{name}:{node.name}"))
    return sorted(out, reverse=True)


def classes(trees: dict[str, ast.Module]) -> list[tuple[int, int, str]]:
    """(lines, methods, module:class) of every class."""
    out = []
    for name, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                methods = sum(isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) for item in node.body)
                out.append(((node.end_lineno or node.lineno) - node.lineno + 1, methods, f"{name}:{node.name}"))
    return sorted(out, reverse=True)


def grep(src: Path, pattern: re.Pattern[str]) -> list[str]:
    return [
        f"{path.relative_to(src.parent)}:{i}"
        for path in sorted(src.rglob("*.py"))
        for i, line in enumerate(path.read_text().splitlines(), 1)
        if pattern.search(line)
    ]


def main() -> None:
    src = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "src" / "hybrid_retrieval"
    trees = modules(src)
    imported = indexer_imports_of_app(trees)
    print(f"indexer modules imported by app/: {len(imported)} {sorted(imported)}")
    lines, methods, name = classes(trees)[0]
    print(f"largest class: {name}, {lines} lines, {methods} methods")
    sizes = functions(trees)
    for cap in (80, 50):
        over = [f"{name} ({n})" for n, name in sizes if n > cap]
        print(f"functions over {cap} lines: {len(over)}" + (f": {', '.join(over)}" if cap == 80 and over else ""))
    flags = grep(src, CHUNKED_FLAG)
    print(f"branches on chunking: {len(flags)} in {len({f.rsplit(':', 1)[0] for f in flags})} modules")
    print(f"string-dispatched shard calls: {len(grep(src, STRING_DISPATCH))}")
    config = tomllib.loads((src.parent.parent / "pyproject.toml").read_text())
    ignored = [m for o in config["tool"]["mypy"].get("overrides", []) if o.get("ignore_errors") for m in o["module"]]
    print(f"modules under mypy ignore_errors: {len(ignored)} {ignored}")


if __name__ == "__main__":
    main()
