"""Secrets never reach a terminal, a log, a file or a tag: the one helper that takes them out.

A tracking URI may carry credentials (``postgresql://user:password@db/mlflow``,
``https://user:token@mlflow.example.org``); so may the command line of a job and the text of an
error raised by a library that echoes the address it failed on. Everything distmis shows that can
contain a URI or a command line goes through :func:`redact`, which replaces every
``user:password@`` (or ``user@``) of every ``scheme://`` in the text by ``***@``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

REDACTED = "***"
# scheme://user:password@host -> scheme://***@host, anywhere in a text (the user part alone too)
_CREDENTIALS = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.\-]*://)(?P<auth>[^@/?#\s'\"]*)@")


def redact(text: str | None) -> str:
    """``text`` with the credentials of every URI in it replaced by ``***``."""
    if not text:
        return text or ""
    return _CREDENTIALS.sub(lambda m: f"{m.group('scheme')}{REDACTED}@", text)


def redact_uri(uri: str | None) -> str:
    """A URI for printing, tags and files on disk (see :func:`redact`)."""
    return redact(uri)


def redact_argv(argv: Iterable[str]) -> list[str]:
    """A command line for printing or logging, every argument redacted."""
    return [redact(a) for a in argv]


def has_credentials(text: str) -> bool:
    return redact(text) != text


__all__ = ["REDACTED", "has_credentials", "redact", "redact_argv", "redact_uri"]
