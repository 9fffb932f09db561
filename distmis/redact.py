"""Secrets never reach a terminal, a log, a file or a tag: the one helper that takes them out.

A tracking URI may carry credentials (``postgresql://user:password@db/mlflow``,
``https://user:token@mlflow.example.org``, ``postgresql://db/mlflow?password=...``,
``https://host/?token=...``); so may the command line of a job and the text of an error raised by a
library that echoes the address it failed on; and MLflow and database drivers read secrets from
the environment (``MLFLOW_TRACKING_PASSWORD``, ``MLFLOW_TRACKING_TOKEN``, ``PGPASSWORD``), whose
values a library may echo too. Everything distmis shows or writes that can contain such text goes
through :func:`redact`, which replaces

* every ``user:password@`` (or ``user@``) of every ``scheme://`` by ``***@``;
* the value of every query or ``key=value`` parameter whose name says it is a secret (password,
  token, secret, key, signature, credential, auth) by ``***``;
* every value of such an environment variable of this process, wherever it appears.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable

REDACTED = "***"
# scheme://user:password@host -> scheme://***@host, anywhere in a text (the user part alone too)
_CREDENTIALS = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.\-]*://)(?P<auth>[^@/?#\s'\"]*)@")
#: how the name of a parameter or variable that holds a secret is spelt (any case, any prefix)
_SECRET_WORDS = (
    r"(?:password|passwd|pwd|token|secret|api_?key|access_?key|private_?key|sig|signature|credentials?|auth)"
)
# ?password=x, &access_token=x, ;sslpassword=x, PGPASSWORD=x, --token=x: the value goes
_SECRET_PARAMETER = re.compile(
    rf"(?P<name>(?:^|(?<=[?&;\s'\"=-]))[A-Za-z0-9_.\-]*{_SECRET_WORDS}[0-9]*=)(?P<value>[^&#\s'\";,]+)",
    re.IGNORECASE,
)
#: environment variables whose values are secrets (MLflow's, databases', clouds'); PWD is a directory
_SECRET_VARIABLE = re.compile(
    r"(PASSWORD|PASSWD|_PWD|TOKEN|SECRET|ACCESS_KEY|API_KEY|PRIVATE_KEY|CONNECTION_STRING)", re.IGNORECASE
)
#: shorter values are not replaced wherever they appear: they would mangle ordinary words
_MIN_SECRET_LENGTH = 6


def _secret_values() -> list[str]:
    values = {
        value
        for name, value in os.environ.items()
        if _SECRET_VARIABLE.search(name) and len(value) >= _MIN_SECRET_LENGTH and name not in ("PWD", "OLDPWD")
    }
    return sorted(values, key=len, reverse=True)


def redact(text: str | None) -> str:
    """``text`` with every credential in it replaced by ``***`` (see the module docstring)."""
    if not text:
        return text or ""
    text = _CREDENTIALS.sub(lambda m: f"{m.group('scheme')}{REDACTED}@", text)
    text = _SECRET_PARAMETER.sub(lambda m: f"{m.group('name')}{REDACTED}", text)
    for value in _secret_values():
        text = text.replace(value, REDACTED)
    return text


def without_redacted(uri: str) -> str:
    """A redacted URI made usable again: its ``***@`` and its ``name=***`` parameters dropped (the
    secrets then come from MLflow's or the database's own variables, or are given again)."""
    uri = uri.replace(f"://{REDACTED}@", "://", 1)
    uri = re.sub(rf"(?<=[?&;])[^&#=]+={re.escape(REDACTED)}(?:&|(?=#)|$)", "", uri)
    return uri.rstrip("?&;")


def redact_uri(uri: str | None) -> str:
    """A URI for printing, tags and files on disk (see :func:`redact`)."""
    return redact(uri)


def redact_argv(argv: Iterable[str]) -> list[str]:
    """A command line for printing or logging, every argument redacted."""
    return [redact(a) for a in argv]


def has_credentials(text: str) -> bool:
    return redact(text) != text


__all__ = ["REDACTED", "has_credentials", "redact", "redact_argv", "redact_uri", "without_redacted"]
