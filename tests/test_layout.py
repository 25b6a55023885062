"""The package's rooms and the imports each may make (harness/__init__.py draws them): no room imports one above
it, and no module imports the kit inside a function (an import loop dodged that way is still a loop)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from harness import ROOT

#: Each room and the rooms it may import (besides the foundation: harness, files, schema, formatter).
ALLOWED = {
    "intake": set(),
    "hosts": set(),
    "models": {"intake"},
    "store": {"intake"},
    "image": {"intake", "models", "store", "hosts"},
    "analysis": {"intake", "models", "store"},
    "report": {"intake", "models", "store", "analysis"},
    "run": {"intake", "models", "store", "hosts", "image", "analysis"},
    "share": {"intake", "models", "store", "hosts", "image", "analysis", "report", "run"},
}
FOUNDATION = {"files", "schema", "formatter"}


def _modules() -> list[Path]:
    return sorted((ROOT / "harness").rglob("*.py"))


def _room(path: Path) -> str:
    rel = path.relative_to(ROOT / "harness")
    return rel.parts[0] if len(rel.parts) > 1 else "(root)"


def _imported_rooms(node: ast.AST) -> list[tuple[int, str]]:
    out = []
    if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
        parts = node.module.split(".")
        if parts[0] == "harness":
            if len(parts) > 1:
                out.append((node.lineno, parts[1]))
            else:  # `from harness import x`: x is a room or a foundation module, or a name of harness/__init__
                out += [(node.lineno, a.name) for a in node.names if a.name in ALLOWED or a.name in FOUNDATION]
    elif isinstance(node, ast.Import):
        out += [(node.lineno, a.name.split(".")[1]) for a in node.names
                if a.name.startswith("harness.") and len(a.name.split(".")) > 1]
    return out


def test_every_module_is_in_a_room():
    loose = [p.name for p in (ROOT / "harness").glob("*.py")
             if p.stem not in FOUNDATION and p.name != "__init__.py"]
    assert loose == [], f"modules outside any room: {loose}"
    assert {p.name for p in (ROOT / "harness").iterdir() if p.is_dir() and p.name != "__pycache__"} == set(ALLOWED)


def test_no_room_imports_one_it_may_not():
    bad = []
    for path in _modules():
        room = _room(path)
        for node in ast.walk(ast.parse(path.read_text())):
            for line, target in _imported_rooms(node):
                if target in FOUNDATION or target == room:
                    continue
                if room == "(root)" or target not in ALLOWED[room]:
                    bad.append(f"{path.relative_to(ROOT)}:{line} imports harness.{target}")
    assert bad == []


def test_no_import_of_the_kit_inside_a_function():
    bad = []
    for path in _modules():
        tree = ast.parse(path.read_text())
        for fn in ast.walk(tree):
            if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for node in ast.walk(fn):
                if isinstance(node, ast.ImportFrom | ast.Import) and (
                        (isinstance(node, ast.ImportFrom) and (node.module or "").startswith("harness"))
                        or (isinstance(node, ast.Import) and any(a.name.startswith("harness") for a in node.names))):
                    bad.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert bad == []


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    return ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)


def test_no_module_imports_itself_through_others():
    """No loop of imports between the kit's modules, type-only imports included: a loop is a layout that does not
    say which module builds on which."""
    names = {_module_name(p): p for p in _modules()}
    graph: dict[str, set[str]] = {n: set() for n in names}
    for name, path in names.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            graph[name] |= {t for t in targets if t in names and t != name and t != "harness"}
    seen: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(n: str, path: list[str]) -> list[str] | None:
        seen[n] = 1
        for m in sorted(graph[n]):
            if seen.get(m) == 1:
                return path + [n, m]
            if m not in seen and (loop := visit(m, path + [n])):
                return loop
        seen[n] = 2
        return None

    for n in sorted(graph):
        if n not in seen:
            loop = visit(n, [])
            assert loop is None, " -> ".join(loop[loop.index(loop[-1]):])


def _kit_files() -> list[Path]:
    """The kit's own code: the package, the tasks and the bench scripts."""
    return [*_modules(), ROOT / "tasks.py", *sorted((ROOT / "bench").glob("*.py"))]


def test_only_the_hosts_room_speaks_docker():
    """Every container and image goes through the Engine interface: only harness/hosts/ imports the Docker SDK,
    and nothing else reaches for an engine's Docker client."""
    bad = []
    for path in _kit_files():
        if path.is_relative_to(ROOT / "harness" / "hosts"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else [])
            bad += [f"{path.relative_to(ROOT)}:{node.lineno} imports {n}" for n in names
                    if n == "docker" or n.startswith("docker.")]
            if isinstance(node, ast.Attribute) and node.attr == "client" and not (
                    isinstance(node.value, ast.Name) and node.value.id == "http"):
                bad.append(f"{path.relative_to(ROOT)}:{node.lineno} reaches for .client")
    assert bad == []


def test_every_bench_script_starts():
    """Each bench script parses its flags (`--help`): an import it lost in a move shows here, not in a user's hands."""
    for script in sorted((ROOT / "bench").glob("*.py")):
        res = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=120)
        assert res.returncode == 0 and "usage" in res.stdout, (script.name, res.stderr[-400:])
