"""Which MLflow store a search uses, and how its address is shown without its credentials."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from distmis.redact import REDACTED, redact_uri, without_redacted


def default_tracking_uri(out: Path) -> str:
    """A SQLite store beside the experiment directories (``runs/mlflow.db``): one UI shows every search."""
    return f"sqlite:///{(out.parent / 'mlflow.db').resolve()}"


def resolve_tracking_uri(cli: str | None, config_uri: str | None, out: Path) -> str:
    """``--tracking-uri`` > the YAML's ``tracking.uri`` > ``$MLFLOW_TRACKING_URI`` > the default SQLite store."""
    return cli or config_uri or os.environ.get("MLFLOW_TRACKING_URI") or default_tracking_uri(out)


def reattach_uri(recorded: str, cli: str | None, config_uri: str | None, out: Path) -> str:
    """The store to reattach to on ``--resume``: the recorded one, with its credentials given again.

    Credentials are never written to disk, so a recorded address whose credentials were
    removed is completed from ``--tracking-uri`` / ``tracking.uri`` / ``$MLFLOW_TRACKING_URI``
    when that names the same store (MLflow's own ``MLFLOW_TRACKING_USERNAME``/``PASSWORD``
    variables work as well).
    """
    given = resolve_tracking_uri(cli, config_uri, out)
    if redact_uri(given) == recorded:
        return given
    return without_redacted(recorded) if REDACTED in recorded else recorded


def mlflow_client(uri: str) -> Any:
    """An ``MlflowClient`` that does not print run URLs: MLflow writes "View run ... at <uri>"
    to stdout on every run end, credentials in the URI included, and a search ends dozens.

    MLflow's usage telemetry is off unless the user turns it on (``MLFLOW_DISABLE_TELEMETRY=false``).
    Why, beyond compute nodes that have no route out: MLflow 3 starts it at import with a
    thread that fetches its configuration and, when that fails, removes a variable from
    ``os.environ``. A request on another thread (the search's run, opened beside Ray's start)
    that is reading ``os.environ`` for proxies at that moment fails with
    ``KeyError: '_MLFLOW_TELEMETRY_SESSION_ID'``: seen here as "MLflow tracking store ... is
    unreachable or unusable" at a search's start.
    """
    os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
    # a server that does not answer is named within seconds, not after MLflow's minutes of retries
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")  # read when mlflow is imported
    # "Creating initial MLflow database tables..." on every new store: not for the console
    # nor its SQLAlchemy tracebacks when the store's disk is full: the sender retries and warns once
    logging.getLogger("mlflow.store.db.utils").setLevel(logging.CRITICAL)
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri)


def start_run(
    client: Any,
    experiment: str,
    name: str,
    *,
    tags: dict[str, str],
    params: dict[str, str] | None = None,
    parent_run_id: str | None = None,
) -> str:
    """Open a run (nested under ``parent_run_id`` when given) with its tags and parameters; its id.

    Every run distmis opens goes through here: a search's and a compare's parent runs, a trial's,
    finalize's and an evaluation's nested ones, so that nesting and parameters are written alike.
    """
    if parent_run_id:
        tags = {"mlflow.parentRunId": parent_run_id, **tags}
    run_id: str = client.create_run(experiment, run_name=name, tags=tags).info.run_id
    if params:
        log_params(client, run_id, params)
    return run_id


def log_params(client: Any, run_id: str, params: dict[str, Any]) -> None:
    """Parameters in batches of 100, the most MLflow takes in one call; values cut to its 6,000 characters."""
    from mlflow.entities import Param

    items = [Param(k, str(v)[:6000]) for k, v in params.items()]
    for start in range(0, len(items), 100):
        client.log_batch(run_id, params=items[start : start + 100])


def artifact_root(uri: str, experiment: str) -> str | None:
    """For a local SQLite store, artifacts go beside the database (``mlartifacts/<experiment>``)."""
    if uri.startswith("sqlite:///"):
        db = Path(uri.removeprefix("sqlite:///"))
        return (db.parent / "mlartifacts" / experiment).resolve().as_uri()
    return None  # a tracking server decides (``--default-artifact-root`` / ``--serve-artifacts``)


#: MLflow 3's UI opens an experiment on its GenAI overview unless it is marked as model training
EXPERIMENT_KIND = ("mlflow.experimentKind", "custom_model_development")


def experiment_id(client: Any, uri: str, name: str) -> str:
    """The id of experiment ``name``, created (artifacts beside a local SQLite store) if missing,
    and marked as a model-training experiment so the UI opens on its training runs."""
    exp = client.get_experiment_by_name(name)
    if exp is None:
        return client.create_experiment(
            name, artifact_location=artifact_root(uri, name), tags={EXPERIMENT_KIND[0]: EXPERIMENT_KIND[1]}
        )
    if EXPERIMENT_KIND[0] not in (exp.tags or {}):
        client.set_experiment_tag(exp.experiment_id, *EXPERIMENT_KIND)
    return exp.experiment_id


__all__ = [
    "default_tracking_uri",
    "experiment_id",
    "mlflow_client",
    "reattach_uri",
    "redact_uri",
    "resolve_tracking_uri",
]
