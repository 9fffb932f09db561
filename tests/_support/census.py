"""Counts of what issue-style reviews ask about the code's records and prose, from the code itself.

    python tests/_support/census.py [ROOT]        # ROOT: a checkout (default: this one)

Prints, for ``ROOT/distmis``:
- per record, the modules that spell its name as a string literal (a writer or a parser);
- ``"distmis.`` tag literals outside ``distmis/schema.py``;
- comments and docstrings that carry timings or history, counted by a stated rule: a line of a
  comment or docstring holding a measured duration with a comparison (``3.85 -> 3.05 s``,
  ``0.9 s of``, ``took 1.1 s``, ``median of 6``) or a history phrase (``used to``, ``the first
  version``, ``seen in CI``, ``before:``, ``the prototype``, ``issue #``);
- README lines.

``duplicates --repo ROOT`` (the workplace's tool) counts code written twice; it is not run here.
"""

from __future__ import annotations

import ast
import io
import re
import sys
import tokenize
from pathlib import Path

#: record -> the literal that names it in code
RECORDS = {
    "preprocessing.json": "preprocessing.json",
    "info.json (prepared data)": "info.json",
    "summary.json": "summary.json",
    "results.csv": "results.csv",
    "mlflow.json": "mlflow.json",
    "search.yaml": "search.yaml",
    "metrics.csv": "metrics.csv",
}
TIMING = re.compile(
    r"(\d+(\.\d+)?\s*(s|ms|min)\b.*(->|→|of\b|vs\b))|(took \d)|(median of \d)|(\d+(\.\d+)?\s*->\s*\d+(\.\d+)?\s*s\b)"
)
HISTORY = re.compile(
    r"\b(used to|the first version|seen (once )?in CI|before:|the prototype|issue #?\d+|was measured|we measured)\b",
    re.IGNORECASE,
)


def prose_lines(path: Path) -> list[str]:
    """The comment lines and docstring lines of a Python file."""
    text = path.read_text(encoding="utf-8")
    lines = [tok.string for tok in tokenize.generate_tokens(io.StringIO(text).readline) if tok.type == tokenize.COMMENT]
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                lines += doc.splitlines()
    return lines


def string_literals(path: Path) -> list[str]:
    return [
        n.value
        for n in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(n, ast.Constant) and isinstance(n.value, str)
    ]


def census(root: Path) -> dict[str, object]:
    files = sorted((root / "distmis").rglob("*.py"))
    literals = {f: string_literals(f) for f in files}  # each file parsed once
    owners = {
        name: sorted(str(f.relative_to(root)) for f in files if literal in literals[f])
        for name, literal in RECORDS.items()
    }
    tags = [
        f"{f.relative_to(root)}: {s}"
        for f in files
        if f.name != "schema.py"
        for s in literals[f]
        if re.fullmatch(r"distmis\.[a-z_]+", s) and not s.startswith(("distmis.cli", "distmis.cluster"))
    ]
    prose = [f"{f.relative_to(root)}: {line.strip()}" for f in files for line in prose_lines(f)]
    timed = [p for p in prose if TIMING.search(p) or HISTORY.search(p)]
    readme = root / "README.md"
    return {
        "owners": owners,
        "tag_literals": tags,
        "timing_or_history_lines": timed,
        "readme_lines": len(readme.read_text(encoding="utf-8").splitlines()) if readme.is_file() else 0,
    }


def main() -> int:
    root = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parents[2]).resolve()
    found = census(root)
    print(f"census of {root}")
    for name, modules in found["owners"].items():  # type: ignore[union-attr]
        print(f"  {name}: spelt in {len(modules)} module(s) {', '.join(modules)}")
    print(f'  "distmis.* tag literals outside distmis/schema.py: {len(found["tag_literals"])}')  # type: ignore[arg-type]
    timed = found["timing_or_history_lines"]
    print(f"  comment/docstring lines with timings or history: {len(timed)}")  # type: ignore[arg-type]
    if "-v" in sys.argv:
        for line in timed:  # type: ignore[union-attr]
            print(f"    {line[:160]}")
    print(f"  README lines: {found['readme_lines']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
