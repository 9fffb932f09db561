"""The operations an output still owes its MLflow runs (``<out>/mlflow_pending.json``), as one typed model.

The queue outlives the process that wrote it (an outage, a killed driver), and the next command in
the same folder delivers it. Reading it through one model means a hand-edited or truncated queue is
one error naming the file, before anything is sent, never a ``KeyError`` inside the sender thread,
or an unknown operation that blocks the queue for good while it is retried as an outage.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, RootModel, StrictStr

from distmis.documents import load_json_document
from distmis.exceptions import TrackingError
from distmis.schema import RunFile


class _Op(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _OnRun(_Op):
    run: StrictStr  # "parent", a trial's id, or "run-id:<id>"


class CreateChild(_Op):
    op: Literal["create_child"]
    trial: StrictStr
    name: StrictStr
    tags: dict[str, Any]
    params: dict[str, Any]


class LogMetrics(_OnRun):
    op: Literal["metrics"]
    step: int
    metrics: dict[str, float]
    timestamp: float


class SetTags(_OnRun):
    op: Literal["tags"]
    tags: dict[str, Any]


class LogParams(_OnRun):
    op: Literal["params"]
    params: dict[str, Any]


class LogArtifacts(_OnRun):
    op: Literal["artifacts"]
    path: StrictStr
    artifact_path: StrictStr | None = None


class Terminate(_OnRun):
    op: Literal["terminate"]
    status: StrictStr


class UpdateRun(_OnRun):
    op: Literal["update"]
    fields: dict[str, Any]


TrackingOp = Annotated[
    CreateChild | LogMetrics | SetTags | LogParams | LogArtifacts | Terminate | UpdateRun,
    Field(discriminator="op"),
]


class PendingQueue(RootModel[list[TrackingOp]]):
    """The ordered operations not yet delivered."""


def read_pending_queue(out: Path) -> list[dict[str, Any]]:
    """The queued operations in the output directory ``out``, as written (empty when there are none).

    Raises:
        TrackingError: the file exists but is not a queue distmis wrote, naming the file and the entry.
    """
    path = out / RunFile.MLFLOW_PENDING
    if not path.is_file():
        return []
    queue = load_json_document(PendingQueue, path, error=TrackingError, what="distmis's queue of MLflow operations")
    return [op.model_dump(exclude_unset=True) for op in queue.root]


__all__ = ["PendingQueue", "TrackingOp", "read_pending_queue"]
