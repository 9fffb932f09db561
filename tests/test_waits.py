"""Background work at a lower priority (distmis.waits): MLflow's start and the plots' imports yield
the CPU to Ray's start and to the trials, and only the thread that does them is lowered."""

from __future__ import annotations

import os
import sys
import threading

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
