"""The tests' own layout: what test modules share comes from tests.support, so that moving or
deleting a test module never breaks another (docs/testing.md, "Where tests and their helpers
live")."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def imported_modules(path: Path) -> set[str]:
    """Every module ``path`` imports from, relative imports resolved against its package."""
    package = path.relative_to(TESTS.parent).with_suffix("").parts[:-1]
    found: list[str] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else ()
            module = ".".join((*base, *([node.module] if node.module else [])))
            found += [f"{module}.{a.name}" if not node.module else module for a in node.names]
    return set(found)


def test_tests_import_shared_code_from_tests_support_only() -> None:
    offenders = [
        f"{path.relative_to(TESTS.parent)} imports {module}"
        for path in sorted(TESTS.rglob("*.py"))
        for module in sorted(imported_modules(path))
        if module.startswith("tests.") and not module.startswith("tests.support")
    ]
    assert offenders == []
