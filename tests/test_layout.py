"""The package's rooms and the imports each may make (harness/__init__.py draws them): no room imports one above
it, and no module imports the kit inside a function (an import loop dodged that way is still a loop)."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

from harness import ROOT

#: Each room and the rooms it may import (besides the foundation: harness, files, schema, formatter).
ALLOWED = {
    "intake": set(),
    "hosts": set(),
    "models": {"intake"},
    "store": {"intake", "models"},
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


#: A format spec that turns a number into text: precision, grouping, sign, or a number type (f, g, e, %, d, n).
NUMBER_SPEC = re.compile(r"^[^}]*?([+\- ]?[#0]?\d*[,_]?(\.\d+)?[fFgGeE%dn]|[,_]|\.\d+)$")


def _number_specs(path: Path, root: Path = ROOT) -> list[str]:
    """Every f-string field of a file whose format spec formats a number (`{x:.2f}`, `{n:,}`, `{v:g}`), and every
    `format(x, spec)` call with such a literal spec."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.FormattedValue) and isinstance(node.format_spec, ast.JoinedStr):
            spec = "".join(v.value for v in node.format_spec.values if isinstance(v, ast.Constant))
            if NUMBER_SPEC.match(spec):
                out.append(f"{path.relative_to(root)}:{node.lineno} {{…:{spec}}}")
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "format"
              and len(node.args) == 2 and isinstance(node.args[1], ast.Constant)
              and NUMBER_SPEC.match(str(node.args[1].value))):
            out.append(f"{path.relative_to(root)}:{node.lineno} format(…, {node.args[1].value!r})")
    return out


def test_numbers_become_text_only_in_the_formatter():
    """How a number is written (precision, grouping, percent) is decided in harness/formatter.py alone, so one
    figure reads the same in RESULTS.md, the terminal and a log line."""
    bad = [x for p in _modules() if p != ROOT / "harness" / "formatter.py" for x in _number_specs(p)]
    assert bad == [], "\n".join(bad)


def test_the_number_format_check_sees_what_it_should(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text('a, n, s = 1.5, 3, "x"\nf"{a:.2f} {n:,} {a:g} {a:.0%} {a:+.1f} {n:5d} {s:>8} {s!r} {s[:3]}"\n'
                      'format(a, ".1f")\n')
    found = sorted(x.split(" ", 1)[1] for x in _number_specs(sample, tmp_path))
    assert found == sorted(["{…:.2f}", "{…:,}", "{…:g}", "{…:.0%}", "{…:+.1f}", "{…:5d}", "format(…, '.1f')"])


#: A repository path as the kit's own text names one (`harness/run/plan.py`, `docker/Dockerfile`).
REPO_PATH = re.compile(r"(?<![\w./-])((?:harness|docker|schemas|manifests|tests|bench|\.ci)/"
                       r"[A-Za-z0-9_./-]*[A-Za-z0-9_])")
#: Examples the README makes up to show an error message.
MADE_UP = {"manifests/x.yaml"}
#: The base recipes' bytes are digested into the base images' tags (image/bases.py, image/cuda_base.py): a comment
#: changed there makes every base image anew, so their text is corrected with their next real change.
HASHED = ("docker/base/",)


def _named_paths(text: str) -> set[str]:
    return {m.group(1).rstrip(".") for m in REPO_PATH.finditer(text)} - MADE_UP


def test_every_repository_path_the_kits_text_names_exists():
    """A file or folder named in the kit's code, recipes, schemas, bench scripts, CI script or README exists (a
    name with a wildcard or a placeholder is a pattern, not a path)."""
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    sources = [f for f in tracked if (f.startswith(("harness/", "docker/", "schemas/", "bench/", ".ci/"))
                                      or f in ("README.md", "tasks.py"))
               and not f.startswith(HASHED) and not f.endswith((".png", ".gguf"))]
    missing = sorted(f"{src}: {p}" for src in sources for p in _named_paths((ROOT / src).read_text())
                     if not any(c in p for c in "*{}<>") and not (ROOT / p).exists())
    assert missing == [], "\n".join(missing)


def test_the_path_check_sees_what_it_should():
    found = _named_paths("see harness/run/plan.py, (docker/Dockerfile) and `schemas/x.json`. not my/harness/a.py "
                         "nor manifests/x.yaml")
    assert found == {"harness/run/plan.py", "docker/Dockerfile", "schemas/x.json"}


def _aliases(paths: list[Path]) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """What each `from harness.x import y as z` calls its module, and what each alias names."""
    by_name: dict[str, set[str]] = {}
    by_alias: dict[str, set[str]] = {}
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([(f"{node.module}.{a.name}", a.asname) for a in node.names]
                     if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("harness")
                     else [(a.name, a.asname) for a in node.names if a.name.startswith("harness")]
                     if isinstance(node, ast.Import) else [])
            for name, alias in names:
                if alias:
                    by_name.setdefault(name, set()).add(alias)
                    by_alias.setdefault(alias, set()).add(name)
    return by_name, by_alias


def test_one_alias_per_module_and_one_module_per_alias():
    """`md` is the models' ensure wherever it is read, in the kit, its tasks, its tests and its bench scripts."""
    tracked = subprocess.run(["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.split()
    by_name, by_alias = _aliases([ROOT / f for f in tracked])
    assert len(by_name) > 30  # the check reads the imports it should
    assert {n: a for n, a in by_name.items() if len(a) > 1} == {}
    assert {a: n for a, n in by_alias.items() if len(n) > 1} == {}


def test_typed_records_mark_optional_keys_where_python_reads_them():
    """A TypedDict's NotRequired keys are optional only where its annotations are evaluated: under `from __future__
    import annotations` Python 3.11 counts them as required, so such modules split required and optional keys
    (total=False) instead. The typed records' tests compare required keys with the schemas."""
    import importlib
    import typing

    offenders, checked = [], 0
    for path in _modules():
        text = path.read_text()
        module = importlib.import_module(".".join(path.relative_to(ROOT).with_suffix("").parts))
        for name, obj in vars(module).items():
            if typing.is_typeddict(obj) and obj.__module__ == module.__name__:
                checked += 1
                said = {k for k, v in obj.__annotations__.items() if "NotRequired[" in str(v)}
                if said - obj.__optional_keys__:
                    offenders.append(f"{path.relative_to(ROOT)}: {name} {sorted(said - obj.__optional_keys__)}")
        if "from __future__ import annotations" in text and "NotRequired[" in text:
            offenders.append(f"{path.relative_to(ROOT)}: NotRequired under postponed annotations")
    assert checked > 60
    assert offenders == []


#: Modules the type checker holds (pyproject.toml's [tool.mypy] files): the list only grows.
TYPED_AT_LEAST = 76


def test_the_typed_modules_pass_the_type_checker():
    """mypy, with the project's settings, over the modules pyproject.toml lists: every listed file exists, the list
    has not shrunk, and none of them has a type error."""
    import tomllib
    listed = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]["files"]
    assert len(listed) >= TYPED_AT_LEAST and len(set(listed)) == len(listed)
    assert [f for f in listed if not (ROOT / f).is_file()] == []
    res = subprocess.run([sys.executable, "-m", "mypy", "--no-incremental"], cwd=ROOT, capture_output=True,
                         text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
    assert f"no issues found in {len(listed)} source files" in res.stdout
