"""A report a person opens: the same headlines, table, notes and pictures as Markdown and as one
self-contained HTML file (the pictures inlined), written atomically. ``distmis compare`` and
``distmis finalize`` write theirs with it."""

from __future__ import annotations

import base64
import html
from pathlib import Path

from distmis.files import write_text_atomic
from distmis.schema import RunFile

_STYLE = (
    "body{font-family:sans-serif;max-width:1100px;margin:2em auto}table{border-collapse:collapse;font-size:13px}"
    "td,th{border:1px solid #ccc;padding:4px 6px;text-align:right}th{background:#f3f3f3}img{max-width:100%}"
)


def write_report(
    out: Path,
    *,
    title: str,
    headlines: list[str],
    columns: list[str] | tuple[str, ...],
    rows: list[list[str]],
    notes: list[str],
    plots: list[Path],
) -> tuple[Path, Path]:
    """Write ``out/report.md`` and ``out/report.html``; returns both paths.

    ``headlines`` may use Markdown bold (``**x**``); HTML shows it plain. Pictures are linked
    from the Markdown by their path relative to ``out`` and inlined in the HTML.
    """
    md = [f"# {title}", "", *[f"- {h}" for h in headlines], ""]
    md += ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    md += ["| " + " | ".join(r) + " |" for r in rows]
    md += ["", *[f"- {n}" for n in notes], ""]
    md += [f"![{p.stem}]({_relative(p, out)})" for p in plots]
    md_path = out / RunFile.REPORT
    write_text_atomic(md_path, "\n".join(md) + "\n")

    esc = html.escape
    table = (
        "<table><tr>"
        + "".join(f"<th>{esc(c)}</th>" for c in columns)
        + "</tr>"
        + "".join("<tr>" + "".join(f"<td>{esc(v)}</td>" for v in r) + "</tr>" for r in rows)
        + "</table>"
    )
    items = "".join(f"<li>{esc(h).replace('**', '')}</li>" for h in headlines)
    note_items = "".join(f"<li>{esc(n)}</li>" for n in notes)
    images = "".join(_figure(p) for p in plots)
    doc = (
        f'<!doctype html><html><head><meta charset="utf-8"><title>{esc(title)}</title><style>{_STYLE}</style>'
        f"</head><body><h1>{esc(title)}</h1>\n<ul>{items}</ul>\n{table}<ul>{note_items}</ul>\n{images}</body></html>\n"
    )
    html_path = out / "report.html"
    write_text_atomic(html_path, doc)
    return md_path, html_path


def _relative(path: Path, out: Path) -> str:
    try:
        return str(path.relative_to(out))
    except ValueError:
        return str(path)


def _figure(path: Path) -> str:
    data = base64.b64encode(path.read_bytes()).decode()
    return f'<figure><img alt="{path.stem}" src="data:image/png;base64,{data}"><figcaption>{path.stem}</figcaption></figure>'


__all__ = ["write_report"]
