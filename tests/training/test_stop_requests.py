"""A SIGTERM that lands in a finalizer of a trial process prints no traceback.

Ray's worker answers SIGTERM by raising ``SystemExit`` wherever its main thread is; a search that
stops (on a full disk, say) tears its trials down while TensorFlow's finalizers run, and Python
printed the ``SystemExit`` it could not raise there as an "Exception ignored" traceback, which
Ray forwarded to the search's console. The test runs real Ray actors with Ray's own handler and
sends the signal from inside a finalizer, so it lands there every time; an actor without
distmis's TensorFlow set-up shows that the traceback is still what Python does by default.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

SCRIPT = r"""
import json, os, signal, sys
from pathlib import Path
import ray
from distmis.raysession import init_ray, shutdown_ray

@ray.remote(max_restarts=0)
class Trial:
    def __init__(self, log, configured):
        sys.stderr = open(log, "w", buffering=1)  # what Python prints for an unraisable exception
        if configured:
            from distmis.training import configure_tensorflow
            configure_tensorflow(1)

    def tear_down(self):
        class Graph:
            def __del__(self):
                os.kill(os.getpid(), signal.SIGTERM)  # Ray's handler raises SystemExit in here
        Graph()
        return signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL

out = Path(sys.argv[1])
init_ray(None, num_cpus=1)
try:
    result = {}
    for configured in (False, True):
        log = out / f"configured-{configured}.err"
        trial = Trial.remote(str(log), configured)
        result[str(configured)] = {"python_handler": ray.get(trial.tear_down.remote(), timeout=240),
                                   "stderr": log.read_text()}
        ray.kill(trial)
    (out / "result.json").write_text(json.dumps(result))
finally:
    shutdown_ray()
"""


def test_a_sigterm_in_a_finalizer_of_a_trial_process_prints_no_traceback(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path)], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    result = json.loads((tmp_path / "result.json").read_text())
    bare, configured = result["False"], result["True"]
    assert bare["python_handler"] and configured["python_handler"], result
    assert "SystemExit" in bare["stderr"] and "Exception ignored" in bare["stderr"], bare["stderr"]
    assert configured["stderr"] == "", configured["stderr"]
