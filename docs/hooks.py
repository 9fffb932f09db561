"""mkdocs hook: the configuration reference is generated from the configuration models at build time.

``distmis validate --help`` prints the same lines (``distmis.config.config_reference``), so the
site, the command line and what ``validate`` accepts cannot drift apart.
"""

from __future__ import annotations

from typing import Any

MARKER = "<!-- config-reference -->"


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    if MARKER not in markdown:
        return markdown
    from distmis.config import config_reference

    lines = [line.strip() for line in config_reference()]
    return markdown.replace(MARKER, "```text\n" + "\n".join(lines) + "\n```")
