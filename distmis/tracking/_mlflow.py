"""MLflow tracking of a search: one parent run per search, one nested child run per trial.

Ray's ``MLflowLoggerCallback`` has no parent/child runs (Ray #19978, #19909) and forgets its
trial-to-run mapping on restore, so distmis keeps its own: a Tune callback in the driver
(so in data-parallel trials only one process ever logs) that writes through ``MlflowClient``.

Robustness, because a search must never die or lose data for its tracking server:

* the trial -> run mapping and the last logged epoch per trial live in ``<out>/mlflow.json``,
  so ``--resume`` reattaches to the same runs and never logs an epoch twice;
* every MLflow call goes through an ordered queue; when the server is unreachable the
  queue is kept in ``<out>/mlflow_pending.json`` (so nothing is lost, even if the driver
  dies), a warning is printed once, training goes on, and the queue is replayed as soon as
  a call succeeds again (and at the end of the search).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

from distmis._fsutil import write_json_atomic
from distmis.exceptions import TrackingError

STATE_FILE = "mlflow.json"
PENDING_FILE = "mlflow_pending.json"
EPOCH_METRICS = ("loss", "dice", "val_loss", "val_dice", "val_iou", "lr", "epoch_seconds", "train_seconds",
                 "samples_per_second")

_log = logging.getLogger(__name__)


def default_tracking_uri(out: Path) -> str:
    """A SQLite store beside the experiment directories (``runs/mlflow.db``): one UI shows every search."""
    return f"sqlite:///{(out.parent / 'mlflow.db').resolve()}"


def resolve_tracking_uri(cli: str | None, config_uri: str | None, out: Path) -> str:
    """``--tracking-uri`` > the YAML's ``tracking.uri`` > ``$MLFLOW_TRACKING_URI`` > the default SQLite store."""
    return cli or config_uri or os.environ.get("MLFLOW_TRACKING_URI") or default_tracking_uri(out)


def _artifact_root(uri: str, experiment: str) -> str | None:
    """For a local SQLite store, artifacts go beside the database (``mlartifacts/<experiment>``)."""
    if uri.startswith("sqlite:///"):
        db = Path(uri.removeprefix("sqlite:///"))
        return (db.parent / "mlartifacts" / experiment).resolve().as_uri()
    return None  # a tracking server decides (``--default-artifact-root`` / ``--serve-artifacts``)


def experiment_id(client: Any, uri: str, name: str) -> str:
    """The id of experiment ``name``, created (artifacts beside a local SQLite store) if missing."""
    exp = client.get_experiment_by_name(name)
    return exp.experiment_id if exp else client.create_experiment(name, artifact_location=_artifact_root(uri, name))


def flatten(prefix: str, value: Any, out: dict[str, str]) -> dict[str, str]:
    """``{"model": {"depth": 3}}`` -> ``{"model.depth": "3"}`` (MLflow params are flat strings)."""
    if isinstance(value, dict):
        for k, v in value.items():
            flatten(f"{prefix}.{k}" if prefix else str(k), v, out)
    else:
        out[prefix] = json.dumps(value) if isinstance(value, (list, tuple)) else str(value)
    return out


class SearchTracker:
    """Parent and child runs of one search; every call is queued, persisted and retried.

    Picklable (Ray Tune pickles callbacks into its experiment state): the MLflow client is
    created lazily and all state lives in files under ``out``.
    """

    def __init__(self, uri: str, experiment: str, out: Path) -> None:
        self.uri = uri
        self.experiment = experiment
        self.out = Path(out)
        self._client = None
        self._state: dict[str, Any] | None = None
        self._queue: list[dict[str, Any]] | None = None
        self._warned = False

    def __getstate__(self) -> dict[str, Any]:
        return {"uri": self.uri, "experiment": self.experiment, "out": str(self.out)}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["uri"], state["experiment"], Path(state["out"]))  # type: ignore[misc]

    # ------------------------------------------------------------------ plumbing
    @property
    def client(self):  # noqa: ANN201
        if self._client is None:
            from mlflow.tracking import MlflowClient

            self._client = MlflowClient(tracking_uri=self.uri)
        return self._client

    @property
    def state(self) -> dict[str, Any]:
        if self._state is None:
            path = self.out / STATE_FILE
            self._state = json.loads(path.read_text()) if path.is_file() else {"trials": {}}
        return self._state

    @property
    def queue(self) -> list[dict[str, Any]]:
        if self._queue is None:
            path = self.out / PENDING_FILE
            self._queue = json.loads(path.read_text()) if path.is_file() else []
        return self._queue

    def _save(self) -> None:
        write_json_atomic(self.out / STATE_FILE, self.state)
        pending = self.out / PENDING_FILE
        if self.queue:
            write_json_atomic(pending, self.queue)
        elif pending.exists():
            pending.unlink()

    def _submit(self, op: dict[str, Any]) -> None:
        self.queue.append(op)
        self.flush()

    def flush(self) -> bool:
        """Replay queued operations in order; returns ``True`` when the queue is empty."""
        while self.queue:
            op = self.queue[0]
            try:
                self._execute(op)
            except Exception as exc:  # noqa: BLE001 - any client/network error: keep the op, go on training
                if not self._warned:
                    print(
                        f"distmis: warning: MLflow at {self.uri} is unreachable ({type(exc).__name__}: "
                        f"{str(exc).splitlines()[0][:200]}); training goes on, tracking is queued in "
                        f"{self.out / PENDING_FILE} and sent when the server is back",
                        file=sys.stderr,
                        flush=True,
                    )
                    self._warned = True
                self._save()
                return False
            self.queue.pop(0)
        if self._warned:
            print(f"distmis: MLflow at {self.uri} reachable again; queued tracking sent", file=sys.stderr, flush=True)
            self._warned = False
        self._save()
        return True

    def _run_id(self, key: str) -> str:
        if key == "parent":
            return self.state["parent_run_id"]
        return self.state["trials"][key]["run_id"]

    def _execute(self, op: dict[str, Any]) -> None:
        from mlflow.entities import Metric, Param, RunTag

        kind = op["op"]
        if kind == "create_child":
            trial = self.state["trials"][op["trial"]]
            if trial.get("run_id"):
                return
            tags = {"mlflow.parentRunId": self.state["parent_run_id"], **op["tags"]}
            run = self.client.create_run(self.state["experiment_id"], run_name=op["name"], tags=tags)
            trial["run_id"] = run.info.run_id
            self._save()  # the mapping first: a crash now must not create the run twice
            params = [Param(k, v[:6000]) for k, v in op["params"].items()]
            for i in range(0, len(params), 100):
                self.client.log_batch(run.info.run_id, params=params[i : i + 100])
        elif kind == "metrics":
            metrics = [Metric(k, float(v), int(op["timestamp"] * 1000), int(op["step"])) for k, v in op["metrics"].items()]
            self.client.log_batch(self._run_id(op["run"]), metrics=metrics)
        elif kind == "tags":
            self.client.log_batch(self._run_id(op["run"]), tags=[RunTag(k, str(v)) for k, v in op["tags"].items()])
        elif kind == "params":
            self.client.log_batch(self._run_id(op["run"]), params=[Param(k, str(v)) for k, v in op["params"].items()])
        elif kind == "artifacts":
            path = Path(op["path"])
            if path.is_dir():
                self.client.log_artifacts(self._run_id(op["run"]), str(path), op.get("artifact_path"))
            elif path.is_file():
                self.client.log_artifact(self._run_id(op["run"]), str(path), op.get("artifact_path"))
        elif kind == "terminate":
            self.client.set_terminated(self._run_id(op["run"]), op["status"])
        else:
            raise ValueError(f"unknown tracking operation {kind!r}")

    # ------------------------------------------------------------------ the search
    def start(self, *, params: dict[str, str], tags: dict[str, str], artifacts: list[Path]) -> str:
        """Create (or on resume, reattach to) the parent run. Fails fast if MLflow is unreachable.

        Raises:
            TrackingError: the tracking store cannot be reached or used, before any training.
        """
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
        if self.state.get("parent_run_id"):
            try:
                self.client.get_run(self.state["parent_run_id"])
            except Exception as exc:  # noqa: BLE001
                raise TrackingError(f"MLflow at {self.uri}: cannot reattach to parent run "
                                    f"{self.state['parent_run_id']}: {str(exc).splitlines()[0][:300]}") from None
            self._submit({"op": "tags", "run": "parent", "tags": {"distmis.resumed_at": time.strftime("%Y-%m-%dT%H:%M:%S")}})
            self.client.update_run(self.state["parent_run_id"], status="RUNNING")
            return self.state["parent_run_id"]
        try:
            exp_id = experiment_id(self.client, self.uri, self.experiment)
            parent = self.client.create_run(exp_id, run_name=self.experiment, tags={"distmis.role": "search", **tags})
        except Exception as exc:  # noqa: BLE001 - the store is down, refuses, or the URI is wrong
            raise TrackingError(
                f"MLflow tracking store {self.uri} is unreachable or unusable: {type(exc).__name__}: "
                f"{str(exc).splitlines()[0][:300]} (set --tracking-uri, tracking.uri or MLFLOW_TRACKING_URI)"
            ) from None
        self.state.update({"tracking_uri": self.uri, "experiment": self.experiment, "experiment_id": exp_id,
                           "parent_run_id": parent.info.run_id})
        self._save()
        self._submit({"op": "params", "run": "parent", "params": params})
        for path in artifacts:
            self._submit({"op": "artifacts", "run": "parent", "path": str(path)})
        return parent.info.run_id

    def trial_started(self, trial_id: str, name: str, params: dict[str, str], tags: dict[str, str]) -> None:
        if trial_id in self.state["trials"]:
            return  # resumed: same child run
        self.state["trials"][trial_id] = {"run_id": None, "last_step": 0}
        self._submit({"op": "create_child", "trial": trial_id, "name": name, "params": params,
                      "tags": {"distmis.trial_id": trial_id, **tags}})

    def trial_result(self, trial_id: str, step: int, metrics: dict[str, float], timestamp: float) -> None:
        trial = self.state["trials"].get(trial_id)
        if trial is None or step <= trial["last_step"]:
            return  # already logged (or queued): never twice
        trial["last_step"] = step
        self._submit({"op": "metrics", "run": trial_id, "step": step, "metrics": metrics, "timestamp": timestamp})

    def trial_finished(self, trial_id: str, *, status: str, tags: dict[str, str], best_dir: Path | None) -> None:
        if trial_id not in self.state["trials"] or self.state["trials"][trial_id].get("finished"):
            return
        self._submit({"op": "tags", "run": trial_id, "tags": tags})
        if best_dir is not None and best_dir.is_dir():
            self._submit({"op": "artifacts", "run": trial_id, "path": str(best_dir), "artifact_path": "best_model"})
        self._submit({"op": "terminate", "run": trial_id, "status": status})
        self.state["trials"][trial_id]["finished"] = True
        self._save()

    def abandon_unknown(self, known_trials: set[str]) -> list[str]:
        """Close the child runs of trials Tune no longer knows (started just before a driver was
        killed and not yet in Tune's snapshot; ``--resume`` samples a new trial instead)."""
        abandoned = [t for t, v in self.state["trials"].items() if t not in known_trials and not v.get("finished")]
        for trial_id in abandoned:
            self._submit({"op": "tags", "run": trial_id, "tags": {"distmis.status": "ABANDONED", "distmis.abandoned": "true"}})
            self._submit({"op": "terminate", "run": trial_id, "status": "KILLED"})
            self.state["trials"][trial_id]["finished"] = True
        self._save()
        return abandoned

    def finish(self, *, metrics: dict[str, float], tags: dict[str, str], plots: list[Path], files: list[Path],
               status: str, wait_seconds: float = 0.0) -> bool:
        """Close the parent run; returns whether everything reached MLflow (else it stays queued).

        While MLflow is unreachable, retries every 2 s for up to ``wait_seconds``.
        """
        clean = {k: float(v) for k, v in metrics.items() if v is not None}
        self._submit({"op": "metrics", "run": "parent", "step": 0, "metrics": clean, "timestamp": time.time()})
        self._submit({"op": "tags", "run": "parent", "tags": tags})
        for path in plots:
            self._submit({"op": "artifacts", "run": "parent", "path": str(path), "artifact_path": "plots"})
        for path in files:
            self._submit({"op": "artifacts", "run": "parent", "path": str(path)})
        self._submit({"op": "terminate", "run": "parent", "status": status})
        deadline = time.monotonic() + wait_seconds
        while not self.flush():
            if time.monotonic() >= deadline:
                return False
            print(f"distmis: waiting up to {max(0, deadline - time.monotonic()):.0f} s for MLflow to send "
                  f"{len(self.queue)} queued operation(s)", file=sys.stderr, flush=True)
            time.sleep(2.0)
        return True
