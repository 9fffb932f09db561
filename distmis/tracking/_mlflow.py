"""MLflow tracking of a search: one parent run per search, one nested child run per trial.

Ray's ``MLflowLoggerCallback`` has no parent/child runs (Ray #19978, #19909) and forgets its
trial-to-run mapping on restore, so distmis keeps its own: a Tune callback in the driver
(so in data-parallel trials only one process ever logs) that writes through ``MlflowClient``.

Robustness, because a search must never die, slow down or lose data for its tracking server:

* nothing talks to MLflow on the driver's critical path: the callback only appends to an
  ordered queue, and a background sender thread delivers it, with exponential back-off while
  the server is unreachable or hangs (a host that accepts connections and never answers
  would otherwise stall Tune's scheduling for a timeout per call);
* the queue is kept on disk (``<out>/mlflow_pending.json``) until each operation is
  delivered, so nothing is lost even if the driver dies; a warning is printed once;
* the trial -> run mapping and the last logged epoch per trial live in ``<out>/mlflow.json``,
  so ``--resume`` reattaches to the same runs and never logs an epoch twice;
* credentials in the tracking URI never reach the console, tags or files on disk.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from distmis.console import notify
from distmis.exceptions import TrackingError
from distmis.files import write_json_atomic
from distmis.redact import redact, redact_uri
from distmis.schema import RunFile, Tag
from distmis.tracking._queue import read_pending_queue
from distmis.tracking._state import read_tracking_state
from distmis.tracking._uri import experiment_id, log_params, mlflow_client, start_run
from distmis.waits import call_within, priority_lowered

#: back-off between delivery attempts while MLflow does not answer (seconds, doubling)
BACKOFF_START, BACKOFF_MAX = 1.0, 30.0
#: retry interval while the end of a search waits for the queue (seconds)
HURRY_RETRY = 1.0
#: how long a search waits for its tracking store to answer at the start (an HTTP server gets
#: MLflow's own 10 s timeout and one retry; a database that accepts and never answers gets this)
START_SECONDS = 45.0
#: the same for a local SQLite file: no network can hang there, but its first use creates MLflow's
#: schema (tens of seconds of migrations), at nice 10 beside Ray's start and whatever else the
#: machine runs, so a bound sized for a silent server would fail a search on a busy node
LOCAL_START_SECONDS = 300.0

_log = logging.getLogger(__name__)


def flatten(prefix: str, value: Any, out: dict[str, str]) -> dict[str, str]:
    """``{"model": {"depth": 3}}`` -> ``{"model.depth": "3"}`` (MLflow params are flat strings)."""
    if isinstance(value, dict):
        for k, v in value.items():
            flatten(f"{prefix}.{k}" if prefix else str(k), v, out)
    else:
        out[prefix] = json.dumps(value) if isinstance(value, (list, tuple)) else str(value)
    return out


class _Channel:
    """The queue of one search's MLflow operations and the thread that delivers it.

    One per search directory and process: Tune may copy the callback (and with it the
    tracker), and every copy must feed the same queue, in order, through one sender.
    """

    _registry: dict[str, _Channel] = {}
    _registry_lock = threading.Lock()

    @classmethod
    def of(cls, uri: str, out: Path) -> _Channel:
        key = str(Path(out).resolve())
        with cls._registry_lock:
            channel = cls._registry.get(key)
            if channel is None or channel.uri != uri:
                channel = cls._registry[key] = cls(uri, Path(out))
            return channel

    def close(self) -> None:
        """Stop using ``out``: its directory is about to be replaced. Whatever is still queued stays
        in memory only, and nothing is written there again (the sender stops at its next step)."""
        self.closed = True
        with self._registry_lock:
            if self._registry.get(str(self.out.resolve())) is self:
                del self._registry[str(self.out.resolve())]

    def __init__(self, uri: str, out: Path) -> None:
        self.uri, self.out = uri, out
        self.closed = False
        self.lock = threading.RLock()
        self._send_lock = threading.Lock()
        self._wake = threading.Event()
        # set while someone waits for the queue to empty (the end of a search): the sender
        # then retries at once and every HURRY_RETRY seconds instead of its long back-off
        self._hurry = threading.Event()
        self._thread: threading.Thread | None = None
        self._client: Any = None
        self._warned = False
        self._save_warned = False
        self.backoff = 0.0
        self.blocked_seconds = 0.0  # time callers spent waiting on this channel (should stay ~0)
        recorded = read_tracking_state(out)
        self.state: dict[str, Any] = recorded.model_dump() if recorded else {"trials": {}}
        self.queue: list[dict[str, Any]] = read_pending_queue(out)

    @property
    def client(self) -> Any:
        if self._client is None:
            self._client = mlflow_client(self.uri)
        return self._client

    def save(self) -> None:
        """Persist the run mapping and the queue; a full disk does not stop the search (they stay in
        memory, said once) and is retried at the next save."""
        with self.lock:
            if self.closed:
                return
            try:
                write_json_atomic(self.out / RunFile.MLFLOW_STATE, self.state)
                pending = self.out / RunFile.MLFLOW_PENDING
                if self.queue:
                    write_json_atomic(pending, self.queue)
                elif pending.exists():
                    pending.unlink()
            except OSError as exc:
                if not self._save_warned:
                    notify(
                        f"distmis: warning: cannot write the tracking state in {self.out} ({exc.strerror}); "
                        "it is kept in memory and written again once there is room"
                    )
                    self._save_warned = True
                return
            self._save_warned = False

    def submit(self, op: dict[str, Any]) -> None:
        """Queue ``op`` (persisted at once) and wake the sender; never waits for MLflow."""
        start = time.monotonic()
        with self.lock:
            self.queue.append(op)
            self.save()
        self.blocked_seconds += time.monotonic() - start
        self.wake()

    def wake(self) -> None:
        """Start the sender if it is not running, and have it send what is queued now."""
        self._ensure_sender()
        self._wake.set()

    def _ensure_sender(self) -> None:
        if priority_lowered():
            # the sender would run at this thread's lowered priority for the whole search (a
            # search's start opens its run on such a thread): the next call from a thread at
            # the process's priority starts it; the operations wait, persisted, until then
            return
        with self.lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._send_loop, name="distmis-mlflow-sender", daemon=True)
                self._thread.start()

    def _send_loop(self) -> None:
        while not self.closed:
            self._wake.wait(timeout=5.0)
            self._wake.clear()
            if self.flush():
                self.backoff = 0.0
                continue
            self.backoff = min(BACKOFF_MAX, max(BACKOFF_START, self.backoff * 2))
            # back off (new operations only queue up meanwhile), unless a final flush is
            # waiting: a server that came back must not sit idle for the rest of a 30 s back-off
            # while the search's bounded wait for it runs out
            if self._hurry.wait(timeout=self.backoff):
                time.sleep(HURRY_RETRY)

    def flush(self) -> bool:
        """Deliver queued operations in order until one fails; ``True`` when the queue is empty."""
        with self._send_lock:
            while True:
                with self.lock:
                    if not self.queue:
                        break
                    op = self.queue[0]
                try:
                    self.execute(op)
                except Exception as exc:  # noqa: BLE001 - any client/network error: keep the op, go on training
                    if not self._warned:
                        notify(
                            f"distmis: warning: MLflow at {redact_uri(self.uri)} is unreachable "
                            f"({type(exc).__name__}: {redact(str(exc).splitlines()[0][:200] if str(exc) else '')}); "
                            f"training goes on, tracking is queued in {self.out / RunFile.MLFLOW_PENDING} and sent when the "
                            "server is back"
                        )
                        self._warned = True
                    self.save()
                    return False
                with self.lock:
                    if self.queue and self.queue[0] is op:
                        self.queue.pop(0)
            if self._warned:
                notify(f"distmis: MLflow at {redact_uri(self.uri)} reachable again; queued tracking sent")
                self._warned = False
            self.save()
            return True

    def wait_empty(self, seconds: float) -> bool:
        """Wait until the sender has delivered everything; ``True`` if it did.

        ``seconds`` bounds the time *without progress* (an unreachable or hung server), not
        the whole wait: a reachable server still receiving a long queue (every epoch of the
        trials that ran during an outage, their models) is never abandoned half-way.
        """
        self._hurry.set()
        self.wake()
        try:
            return self._wait_progress(seconds)
        finally:
            self._hurry.clear()

    def _wait_progress(self, seconds: float) -> bool:
        started = time.monotonic()
        deadline = started + seconds
        announced = 0.0
        with self.lock:
            last_left = len(self.queue)
        while True:
            with self.lock:
                left = len(self.queue)
            if not left:
                return True
            now = time.monotonic()
            if left < last_left:  # delivering: the bound restarts
                last_left, deadline = left, now + seconds
            if now >= deadline:
                return False
            if now - started > 2 and now - announced > 10:
                notify(
                    f"distmis: waiting up to {deadline - now:.0f} s more for MLflow to receive {left} queued "
                    "operation(s)"
                )
                announced = now
            self.wake()
            time.sleep(0.2)

    def record_run(self, experiment: str, experiment_id: str, run_id: str) -> None:
        """Remember the output's own run (``parent``), written at once: a command taken up again
        reattaches to it. The address is stored without credentials: a resume asks for them again."""
        with self.lock:
            self.state.update(
                {
                    "tracking_uri": redact_uri(self.uri),
                    "experiment": experiment,
                    "experiment_id": experiment_id,
                    "parent_run_id": run_id,
                }
            )
            self.save()

    def run_id(self, key: str) -> str:
        with self.lock:
            if key.startswith(RUN_ID_PREFIX):  # a run that is not this output's own (a compared search's)
                return key.removeprefix(RUN_ID_PREFIX)
            if key == "parent":
                return self.state["parent_run_id"]
            return self.state["trials"][key]["run_id"]

    def execute(self, op: dict[str, Any]) -> None:
        from mlflow.entities import Metric, RunTag

        kind = op["op"]
        if kind == "create_child":
            with self.lock:
                trial = self.state["trials"][op["trial"]]
                run_id = trial.get("run_id")
                parent, exp = self.state["parent_run_id"], self.state["experiment_id"]
            if not run_id:
                run_id = start_run(self.client, exp, op["name"], tags=op["tags"], parent_run_id=parent)
                with self.lock:
                    trial["run_id"] = run_id
                    self.save()  # the mapping first: a retry or a crash now must not create the run twice
            # on a retry (the server went away after the run was created) the params are sent
            # again: logging a param with the value it already has is allowed by MLflow
            log_params(self.client, run_id, op["params"])
        elif kind == "metrics":
            metrics = [
                Metric(k, float(v), int(op["timestamp"] * 1000), int(op["step"])) for k, v in op["metrics"].items()
            ]
            self.client.log_batch(self.run_id(op["run"]), metrics=metrics)
        elif kind == "tags":
            self.client.log_batch(self.run_id(op["run"]), tags=[RunTag(k, str(v)) for k, v in op["tags"].items()])
        elif kind == "params":
            log_params(self.client, self.run_id(op["run"]), op["params"])
        elif kind == "artifacts":
            path = Path(op["path"])
            if path.is_dir():
                self.client.log_artifacts(self.run_id(op["run"]), str(path), op.get("artifact_path"))
            elif path.is_file():
                self.client.log_artifact(self.run_id(op["run"]), str(path), op.get("artifact_path"))
        elif kind == "terminate":
            self.client.set_terminated(self.run_id(op["run"]), op["status"])
        elif kind == "update":
            self.client.update_run(self.run_id(op["run"]), **op["fields"])
        else:
            raise ValueError(f"unknown tracking operation {kind!r}")


def start_seconds(uri: str) -> float:
    """How long the start of a command waits for the tracking store at ``uri`` to answer."""
    return LOCAL_START_SECONDS if uri.startswith("sqlite:") else START_SECONDS


def _open_within(uri: str, create: Callable[[], tuple[str, str]], hint: str = "") -> tuple[str, str]:
    """(experiment id, run id) of a run ``create`` opens, within :func:`start_seconds`.

    Raises:
        TrackingError: the store is down, hangs, refuses, or the URI is wrong: before any work.
    """
    try:
        return call_within(start_seconds(uri), create, name="distmis-mlflow-start")
    except Exception as exc:  # noqa: BLE001 - any store or network error is the same refusal
        raise TrackingError(
            f"MLflow tracking store {redact_uri(uri)} is unreachable or unusable: {type(exc).__name__}: "
            f"{redact(str(exc).splitlines()[0][:300] if str(exc) else '')}{hint}"
        ) from None


#: an operation's ``run`` that names a run by its id rather than by its role in this output
RUN_ID_PREFIX = "run-id:"


def metrics_op(metrics: Mapping[str, float | None], *, step: int = 0) -> dict[str, Any]:
    """The queued operation logging ``metrics`` on an output's own run (a value of ``None`` is left out)."""
    clean = {k: float(v) for k, v in metrics.items() if v is not None}
    return {"op": "metrics", "run": "parent", "step": step, "metrics": clean, "timestamp": time.time()}


_LIVE_URIS: dict[str, str] = {}  # redacted address -> the address with credentials, this process only


class SearchTracker:
    """Parent and child runs of one search; every call is queued, persisted and sent in the background.

    Picklable (Ray Tune pickles callbacks into its experiment state): the queue, the sender
    and the MLflow client live in a per-search channel created lazily, and all state is in
    files under ``out``.
    """

    def __init__(self, uri: str, experiment: str, out: Path) -> None:
        self.uri = uri
        self.experiment = experiment
        self.out = Path(out)
        _LIVE_URIS[redact_uri(uri)] = uri

    def __getstate__(self) -> dict[str, Any]:
        # Tune writes its callbacks into tuner.pkl: the credentials must not go with them
        return {"uri": redact_uri(self.uri), "experiment": self.experiment, "out": str(self.out)}

    def __setstate__(self, state: dict[str, Any]) -> None:
        # in this process (Tune's own copies, or a ``--resume`` that was given them again)
        # the address gets its credentials back; elsewhere MLflow's own variables supply them
        uri = _LIVE_URIS.get(state["uri"], state["uri"])
        self.__init__(uri, state["experiment"], Path(state["out"]))  # type: ignore[misc]

    @property
    def channel(self) -> _Channel:
        return _Channel.of(self.uri, self.out)

    @property
    def client(self) -> Any:
        return self.channel.client

    @property
    def state(self) -> dict[str, Any]:
        return self.channel.state

    @property
    def queue(self) -> list[dict[str, Any]]:
        return self.channel.queue

    def _submit(self, op: dict[str, Any]) -> None:
        self.channel.submit(op)

    def flush(self) -> bool:
        """Deliver what is queued now, in this thread; ``True`` when the queue is empty."""
        return self.channel.flush()

    def send(self) -> None:
        """Start sending what is queued, in the background (from a thread at the process's priority)."""
        self.channel.wake()

    # ------------------------------------------------------------------ the search
    def start(
        self, *, params: dict[str, str], tags: dict[str, str], artifacts: list[Path], run_name: str | None = None
    ) -> str:
        """Create (or on resume, reattach to) the parent run. Fails fast if MLflow is unreachable.

        Raises:
            TrackingError: the tracking store cannot be reached or used, before any training.
        """
        if self.state.get("parent_run_id"):
            try:
                call_within(start_seconds(self.uri), lambda: self.client.get_run(self.state["parent_run_id"]))
            except Exception as exc:  # noqa: BLE001 - unreachable, refused, or the run is gone
                raise TrackingError(
                    f"MLflow at {redact_uri(self.uri)}: cannot reattach to parent run "
                    f"{self.state['parent_run_id']}: {redact(str(exc).splitlines()[0][:300])}"
                ) from None
            self._submit({"op": "tags", "run": "parent", "tags": {Tag.RESUMED_AT: time.strftime("%Y-%m-%dT%H:%M:%S")}})
            self._submit({"op": "update", "run": "parent", "fields": {"status": "RUNNING"}})
            return self.state["parent_run_id"]

        def create() -> tuple[str, str]:
            exp_id = experiment_id(self.client, self.uri, self.experiment)
            name = run_name or self.experiment
            return exp_id, start_run(self.client, exp_id, name, tags={Tag.ROLE: "search", **tags})

        exp_id, parent = _open_within(
            self.uri, create, hint=" (set --tracking-uri, tracking.uri or MLFLOW_TRACKING_URI)"
        )
        self.channel.record_run(self.experiment, exp_id, parent)
        self._submit({"op": "params", "run": "parent", "params": params})
        for path in artifacts:
            self._submit({"op": "artifacts", "run": "parent", "path": str(path)})
        return parent

    def trial_started(self, trial_id: str, name: str, params: dict[str, str], tags: dict[str, str]) -> None:
        with self.channel.lock:
            if trial_id in self.state["trials"]:
                return  # resumed: same child run
            self.state["trials"][trial_id] = {"run_id": None, "last_step": 0}
        self._submit(
            {
                "op": "create_child",
                "trial": trial_id,
                "name": name,
                "params": params,
                "tags": {Tag.TRIAL_ID: trial_id, **tags},
            }
        )

    def trial_result(self, trial_id: str, step: int, metrics: dict[str, float], timestamp: float) -> None:
        with self.channel.lock:
            trial = self.state["trials"].get(trial_id)
            if trial is None or step <= trial["last_step"]:
                return  # already logged (or queued): never twice
            trial["last_step"] = step
        self._submit({"op": "metrics", "run": trial_id, "step": step, "metrics": metrics, "timestamp": timestamp})

    def last_logged_epoch(self, trial_id: str) -> int | None:
        """The last epoch logged (or queued) to a trial's run; ``None`` for a trial without a run."""
        trial = self.state["trials"].get(trial_id)
        return None if trial is None else int(trial["last_step"])

    def trial_tags(self, trial_id: str, tags: dict[str, str]) -> None:
        if trial_id in self.state["trials"]:
            self._submit({"op": "tags", "run": trial_id, "tags": tags})

    def trial_finished(self, trial_id: str, *, status: str, tags: dict[str, str], best_dir: Path | None) -> None:
        if trial_id not in self.state["trials"] or self.state["trials"][trial_id].get("finished"):
            return
        self._submit({"op": "tags", "run": trial_id, "tags": tags})
        if best_dir is not None and best_dir.is_dir():
            self._submit({"op": "artifacts", "run": trial_id, "path": str(best_dir), "artifact_path": "best_model"})
        self._submit({"op": "terminate", "run": trial_id, "status": status})
        with self.channel.lock:
            self.state["trials"][trial_id]["finished"] = True
            self.channel.save()

    def abandon_unknown(self, known_trials: set[str]) -> list[str]:
        """Close the child runs of trials Tune no longer knows (started just before a driver was
        killed and not yet in Tune's snapshot; ``--resume`` samples a new trial instead)."""
        abandoned = [t for t, v in self.state["trials"].items() if t not in known_trials and not v.get("finished")]
        for trial_id in abandoned:
            self._submit({"op": "tags", "run": trial_id, "tags": {Tag.STATUS: "ABANDONED", Tag.ABANDONED: "true"}})
            self._submit({"op": "terminate", "run": trial_id, "status": "KILLED"})
            with self.channel.lock:
                self.state["trials"][trial_id]["finished"] = True
        self.channel.save()
        return abandoned

    def finish(
        self,
        *,
        metrics: dict[str, float],
        tags: dict[str, str],
        plots: list[Path],
        files: list[Path],
        status: str,
        wait_seconds: float = 0.0,
    ) -> bool:
        """Close the parent run; returns whether everything reached MLflow (else it stays queued).

        Waits (bounded by ``wait_seconds``) for the background sender to deliver everything.
        """
        self._submit(metrics_op(metrics))
        self._submit({"op": "tags", "run": "parent", "tags": tags})
        for path in plots:
            self._submit({"op": "artifacts", "run": "parent", "path": str(path), "artifact_path": "plots"})
        for path in files:
            self._submit({"op": "artifacts", "run": "parent", "path": str(path)})
        self._submit({"op": "terminate", "run": "parent", "status": status})
        return self.channel.wait_empty(wait_seconds)


class RunWriter:
    """One MLflow run that is not a search's (a comparison's, an evaluation's), written as a search's
    runs are: opened at once, so that its id can be recorded and runs nested under it, then every
    metric, tag, file and its end queued in ``out`` (``mlflow_pending.json``) and delivered by the
    background sender. An outage delays them; it never loses them, and a command taken up again in
    ``out`` sends what is left.
    """

    def __init__(self, uri: str, out: Path) -> None:
        self.uri, self.out = uri, Path(out)

    @property
    def channel(self) -> _Channel:
        return _Channel.of(self.uri, self.out)

    @property
    def run_id(self) -> str | None:
        return self.channel.state.get("parent_run_id")

    def open(
        self,
        experiment: str,
        name: str,
        *,
        tags: dict[str, str],
        params: dict[str, Any] | None = None,
        parent_run_id: str | None = None,
        run_id: str | None = None,
        experiment_id_known: str | None = None,
    ) -> str:
        """Open the run (``run_id``: reattach to it) within :func:`start_seconds`; its id.
        ``experiment_id_known``: the experiment's id as a parent run recorded it (not looked up by name).

        Raises:
            TrackingError: the store cannot be reached or used.
        """

        def create() -> tuple[str, str]:
            client = self.channel.client  # it imports the store's driver: a missing one is an unusable store
            exp_id = experiment_id_known or experiment_id(client, self.uri, experiment)
            if run_id:
                client.update_run(run_id, status="RUNNING")
                return exp_id, run_id
            return exp_id, start_run(client, exp_id, name, tags=tags, params=params, parent_run_id=parent_run_id)

        exp_id, opened = _open_within(self.uri, create)
        self.channel.record_run(experiment, exp_id, opened)
        self.channel.wake()  # what an earlier, interrupted command left queued
        return opened

    def log_metrics(self, metrics: dict[str, float], *, step: int = 0) -> None:
        self.channel.submit(metrics_op(metrics, step=step))

    def set_tags(self, tags: dict[str, str], *, run_id: str | None = None) -> None:
        """Tags on this run, or on another run by its id (a compared search's parent run)."""
        target = f"{RUN_ID_PREFIX}{run_id}" if run_id else "parent"
        self.channel.submit({"op": "tags", "run": target, "tags": tags})

    def log_files(self, paths: list[Path], artifact_path: str | None = None) -> None:
        for path in paths:
            self.channel.submit({"op": "artifacts", "run": "parent", "path": str(path), "artifact_path": artifact_path})

    def deliver(self, wait_seconds: float) -> bool:
        """Send what is queued (an earlier command's too), waiting ``wait_seconds`` without progress at most."""
        return self.channel.wait_empty(wait_seconds)

    def pending(self) -> int:
        """Operations still queued for the run (an earlier command's left in ``out`` included)."""
        with self.channel.lock:
            return len(self.channel.queue)

    def release(self) -> None:
        """Let go of ``out`` before its directory is replaced: nothing is written there again."""
        self.channel.close()

    def close(self, status: str, wait_seconds: float) -> bool:
        """End the run; waits (``wait_seconds`` without progress at most) until everything is
        delivered, and says where it stays queued when not."""
        self.channel.submit({"op": "terminate", "run": "parent", "status": status})
        delivered = self.deliver(wait_seconds)
        if not delivered:
            notify(
                f"distmis: warning: MLflow at {redact_uri(self.uri)} did not receive everything within "
                f"{wait_seconds:g} s; the rest is kept in {self.out / RunFile.MLFLOW_PENDING}"
            )
        return delivered
