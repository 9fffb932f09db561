"""A warm trial process (Tune reuses it trial after trial) keeps nothing of the trials it ran before."""

from __future__ import annotations

import gc
import time
from pathlib import Path

from distmis.tensorflow_env import custom_gradient_names
from distmis.tuning import TrialSession, TrialStart


def _traced_graphs() -> int:
    gc.collect()
    return sum(type(o).__name__ == "FuncGraph" for o in gc.get_objects())


def _settled_graphs(most: int, seconds: float = 60.0) -> int:
    """The traced graphs once they are at most ``most``, or the count after ``seconds``: a finished
    trial's input threads let go of its pipeline's graphs when they exit, which a busy machine
    delays (CI once counted 15 against 13 right after the fourth trial)."""
    deadline = time.monotonic() + seconds
    count = _traced_graphs()
    while count > most and time.monotonic() < deadline:
        time.sleep(0.5)  # polls the state below; the bound is the deadline, not this pause
        count = _traced_graphs()
    return count


def test_a_warm_trial_process_lets_each_finished_trial_s_traced_steps_go(prepared16: Path, tmp_path: Path) -> None:
    """Each trial traces its own train step; TensorFlow registers the optimiser's all-reduce
    gradient for it in a process-wide registry that holds the whole graph. After four trials the
    process holds what one trial holds, not four times as much."""
    doc = {
        "name": "warm",
        "data": {"source": str(prepared16)},
        "train": {"epochs": 1, "batch_size_per_replica": 2, "augment": {"flip": False, "intensity": 0.0}},
        "model": {"depth": 2, "filters": 4},
    }
    slot = TrialSession()
    registered, graphs = [], []
    for i in range(4):
        slot.start(
            TrialStart(doc, {"lr": 10.0 ** -(2 + i)}, str(prepared16), str(tmp_path / f"t{i}"), "val_dice", "max")
        )
        slot.step()
        registered.append(len(custom_gradient_names()))
        graphs.append(_traced_graphs())
    assert registered[0] > 0, "the train step registered no custom gradient: this test no longer sees the leak"
    assert registered == [registered[0]] * 4, registered
    assert _settled_graphs(graphs[0]) <= graphs[0], graphs
