"""Background work at a lower priority (distmis.waits): MLflow's start and the plots' imports yield
the CPU to Ray's start and to the trials, and only the thread that does them is lowered."""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

import pytest

from distmis.waits import Background


def _own_nice() -> int:
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the nice value is per thread on Linux only")
def test_a_background_call_runs_at_its_nice_value_and_the_rest_of_the_process_does_not() -> None:
    main_before = _own_nice()
    inner: list[int] = []

    def work() -> int:
        child = threading.Thread(target=lambda: inner.append(_own_nice()))  # as MLflow's sender would be
        child.start()
        child.join()
        return _own_nice()

    lowered = Background(work, name="test-nice", nice=10).result()
    assert lowered == max(10, main_before) and inner == [lowered]
    assert _own_nice() == main_before  # the caller keeps its priority
    assert Background(_own_nice, name="test-plain").result() == main_before


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the nice value is per thread on Linux only")
def test_mlflows_sender_keeps_the_process_priority_when_the_run_was_opened_on_a_lowered_thread(tmp_path: Path) -> None:
    """A search opens its MLflow run on a nice-10 thread while Ray starts; the sender that then
    feeds MLflow for the whole search must not inherit that priority (behind every trial)."""
    from mlflow.tracking import MlflowClient

    from distmis.tracking import SearchTracker

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracker = SearchTracker(uri, "nice", tmp_path)
    run_id = Background(
        lambda: tracker.start(params={"lr": "0.001"}, tags={}, artifacts=[]), name="test-open", nice=10
    ).result()
    assert tracker.queue, "the lowered thread sent the parameters itself"
    tracker.send()
    assert tracker.channel.wait_empty(60)
    senders = [t for t in threading.enumerate() if t.name == "distmis-mlflow-sender"]
    assert senders and all(os.getpriority(os.PRIO_PROCESS, t.native_id or 0) == _own_nice() for t in senders)
    assert MlflowClient(tracking_uri=uri).get_run(str(run_id)).data.params == {"lr": "0.001"}
