"""Tabulate hostile-input outcomes per group, before against after.

DISTMIS_ADVERSARIAL_REPORT=after.jsonl python -m pytest tests/adversarial
(cd old-checkout && DISTMIS_ADVERSARIAL_REPORT=before.jsonl .venv/bin/python -m pytest /path/to/tests/adversarial)
python tests/adversarial/summarise.py before.jsonl after.jsonl
"""

from __future__ import annotations

import collections
import json
import sys
from pathlib import Path

GROUPS = ("data-loss", "labels", "late-failure", "traceback", "own-files")


def load(path: Path) -> dict[str, dict]:
    rows = {}
    for line in path.read_text().splitlines():
        row = json.loads(line)
        rows[row["case"]] = row
    return rows


def describe(rows: list[dict]) -> str:
    counts = collections.Counter(r["outcome"] for r in rows)
    return ", ".join(f"{n} {o}" for o, n in counts.most_common())


def main(argv: list[str]) -> int:
    runs = [(Path(p).stem, load(Path(p))) for p in argv]
    cases = sorted({c for _, rows in runs for c in rows})
    print("| group | cases | " + " | ".join(name for name, _ in runs) + " |")
    print("|---|---|" + "---|" * len(runs))
    for group in GROUPS:
        in_group = [c for c in cases if any(rows.get(c, {}).get("group") == group for _, rows in runs)]
        cells = [describe([rows[c] for c in in_group if c in rows]) for _, rows in runs]
        print(f"| {group} | {len(in_group)} | " + " | ".join(cells) + " |")
    total = [describe(list(rows.values())) for _, rows in runs]
    print(f"| all | {len(cases)} | " + " | ".join(total) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
