"""The shape of the code, drawn from its imports and definitions: private imports across packages,
upward imports between layers, and functions too long to read at once.

Every import counts, the ones inside functions too: a lazy import hides a dependency from a
reader, not from this check.

    python tests/_support/layering.py          # prints every finding and the layer graph; exit 1 if any

``tests/test_layering.py`` runs the same checks in the suite.
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = "distmis"
#: the longest function (or method) allowed in the package, in lines
MAX_FUNCTION_LINES = 80

#: the package's rooms, lowest first; a room may import its own floor and the floors below it.
#: Rooms on one floor do not import each other unless named in SIDEWAYS.
LAYERS: list[tuple[str, ...]] = [
    ("__init__", "exceptions", "exitcodes", "schema"),
    ("links", "waits"),
    ("console", "documents", "tensorflow_env", "redact", "metrics", "locks", "raycompat"),
    ("files",),
    ("labels", "space", "raysession", "reports", "search_summary", "recipes"),
    ("config",),
    ("data", "model"),
    ("training", "tracking", "preflight"),
    ("tuning", "inference"),
    ("compare", "finalize", "simulate"),
    ("cluster",),
    ("cli", "__main__"),
]
#: allowed imports between rooms on one floor
SIDEWAYS: set[tuple[str, str]] = {("__main__", "cli")}


def _room(module: str) -> str | None:
    """``distmis.tuning._search`` -> ``tuning``; ``distmis`` -> ``__init__``; not ours -> None."""
    parts = module.split(".")
    if parts[0] != PACKAGE:
        return None
    return parts[1] if len(parts) > 1 else "__init__"


def _floor(room: str) -> int | None:
    return next((i for i, rooms in enumerate(LAYERS) if room in rooms), None)


@dataclass(frozen=True)
class Import:
    file: Path
    line: int
    module: str  # the module imported from, absolute


def _module_of(path: Path) -> str:
    rel = path.relative_to(REPO).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def imports_of(path: Path) -> list[Import]:
    tree = ast.parse(source_of(path), filename=str(path))
    found: list[Import] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [Import(path, node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append(Import(path, node.lineno, node.module))
            # ``from distmis.tuning import _keys`` imports a private module as a name
            found += [
                Import(path, node.lineno, f"{node.module}.{alias.name}")
                for alias in node.names
                if alias.name.startswith("_") and not alias.name.startswith("__")
            ]
    return found


def python_files(*roots: str) -> list[Path]:
    files: list[Path] = []
    for root in roots:
        base = REPO / root
        if base.is_dir():
            files += sorted(p for p in base.rglob("*.py") if ".venv" not in p.parts)
            files += sorted(p for p in base.rglob("*.ipynb") if ".venv" not in p.parts)
    return files


def source_of(path: Path) -> str:
    """A Python file's text, or a notebook's code cells joined (magics and shell lines dropped)."""
    text = path.read_text(encoding="utf-8")
    if path.suffix != ".ipynb":
        return text
    import json

    cells = json.loads(text).get("cells", [])
    code = ["".join(c.get("source", [])) for c in cells if c.get("cell_type") == "code"]
    return "\n".join(line for cell in code for line in cell.splitlines() if not line.lstrip().startswith(("%", "!")))


def private_imports(files: list[Path]) -> list[str]:
    """``from distmis.X._y import ...`` outside ``distmis/X/`` (a private module of another package)."""
    bad = []
    for path in files:
        here = _module_of(path)
        for imp in imports_of(path):
            parts = imp.module.split(".")
            if parts[0] != PACKAGE:
                continue
            for i, part in enumerate(parts[1:], start=1):
                if part.startswith("_") and not part.startswith("__"):
                    owner = ".".join(parts[:i])  # the package the private module belongs to
                    if not (here == owner or here.startswith(owner + ".")):
                        bad.append(f"{path.relative_to(REPO)}:{imp.line}: imports {imp.module} (private to {owner})")
                    break
    return bad


def upward_imports(files: list[Path]) -> list[str]:
    """Imports of a room on a higher floor, or of another room on the same floor."""
    bad = []
    for path in files:
        src = _room(_module_of(path))
        if src is None:
            continue
        for imp in imports_of(path):
            dst = _room(imp.module)
            if dst is None or dst == src:
                continue
            fs, fd = _floor(src), _floor(dst)
            if fs is None or fd is None:
                bad.append(f"{path.relative_to(REPO)}:{imp.line}: {src} -> {dst}: a room missing from LAYERS")
            elif fd > fs or (fd == fs and (src, dst) not in SIDEWAYS):
                bad.append(f"{path.relative_to(REPO)}:{imp.line}: {src} (floor {fs}) imports {dst} (floor {fd})")
    return bad


def long_functions(files: list[Path], limit: int = MAX_FUNCTION_LINES) -> list[str]:
    bad = []
    for path in files:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno is not None:
                lines = node.end_lineno - node.lineno + 1
                if lines > limit:
                    bad.append(f"{path.relative_to(REPO)}:{node.lineno}: {node.name} is {lines} lines")
    return bad


#: metric names every part of distmis spells the same way: written out only in distmis/metrics.py
METRIC_NAMES = ("val_dice", "val_loss", "val_iou")
METRICS_MODULE = Path(PACKAGE) / "metrics.py"


def metric_literals(files: list[Path]) -> list[str]:
    """String literals (f-string parts too) that spell a validation metric's name outside metrics.py."""
    bad = []
    for path in files:
        if path.relative_to(REPO) == METRICS_MODULE:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                text = node.value
                if text in METRIC_NAMES or text.startswith(tuple(f"{m}_" for m in ("val_dice", "val_iou"))):
                    bad.append(f"{path.relative_to(REPO)}:{node.lineno}: {text!r}")
    return bad


#: the one module allowed to import Ray's private code (see its docstring)
RAY_COMPAT_MODULE = Path(PACKAGE) / "raycompat.py"
#: Ray's modules that are not its public API: a ``_``-prefixed part, or Tune's execution internals
RAY_PRIVATE_PREFIXES = ("ray.tune.execution",)


def _is_ray_private(module: str) -> bool:
    parts = module.split(".")
    if parts[0] != "ray":
        return False
    return any(p.startswith("_") and not p.startswith("__") for p in parts) or module.startswith(RAY_PRIVATE_PREFIXES)


def ray_private_imports(files: list[Path]) -> list[str]:
    """Imports of Ray's private modules anywhere but :data:`RAY_COMPAT_MODULE` (tests included:
    no test asserts Ray's private layout)."""
    bad = []
    for path in files:
        if path.relative_to(REPO) == RAY_COMPAT_MODULE:
            continue
        bad += [
            f"{path.relative_to(REPO)}:{i.line}: imports {i.module}"
            for i in imports_of(path)
            if _is_ray_private(i.module)
        ]
    return bad


#: where the names other modules read back are spelt (MLflow tags, files of distmis's directories)
SCHEMA_MODULE = Path(PACKAGE) / "schema.py"


def schema_literals(files: list[Path]) -> list[str]:
    """String literals equal to a tag name or a record's file name of :data:`SCHEMA_MODULE`, outside it."""
    sys.path.insert(0, str(REPO))
    from distmis.schema import RunFile, Tag

    names = {v for k, v in vars(Tag).items() if k.isupper()}
    # folder names ("tune", "trials") are ordinary words elsewhere: only file names are checked
    names |= {v for k, v in vars(RunFile).items() if k.isupper() and "." in v}
    bad = []
    for path in files:
        if path.relative_to(REPO) == SCHEMA_MODULE:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names:
                bad.append(f"{path.relative_to(REPO)}:{node.lineno}: {node.value!r}")
    return bad


def room_graph(files: list[Path]) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for path in files:
        src = _room(_module_of(path))
        if src is None:
            continue
        for imp in imports_of(path):
            dst = _room(imp.module)
            if dst is not None and dst != src:
                graph.setdefault(src, set()).add(dst)
    return graph


def main() -> int:
    package = python_files(PACKAGE)
    everything = python_files(PACKAGE, "tests", "benchmarks", "docs", "notebooks")
    findings = {
        "private imports across packages": private_imports(everything),
        "upward or sideways imports": upward_imports(package),
        f"functions over {MAX_FUNCTION_LINES} lines": long_functions(package),
        f"metric names spelt outside {METRICS_MODULE}": metric_literals(package),
        f"Ray's private modules imported outside {RAY_COMPAT_MODULE}": ray_private_imports(everything),
        f"tag and file names spelt outside {SCHEMA_MODULE}": schema_literals(package),
    }
    for title, rows in findings.items():
        print(f"{title}: {len(rows)}")
        for row in rows:
            print(f"  {row}")
    print("rooms and what they import:")
    for room, deps in sorted(room_graph(package).items(), key=lambda kv: (_floor(kv[0]) or -1, kv[0])):
        print(f"  {room} (floor {_floor(room)}): {', '.join(sorted(deps))}")
    return 1 if any(findings.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
