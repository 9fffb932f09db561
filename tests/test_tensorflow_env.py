"""distmis's TensorFlow environment: oneDNN CPU kernels on unless the user says otherwise, no banner."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from distmis.tensorflow_env import DEFAULTS, tensorflow_env

# reports what TensorFlow itself decided, after distmis set the process up as a trial does
PROBE = """
from distmis.training import configure_tensorflow
configure_tensorflow(1)
from distmis.tensorflow_env import onednn_enabled
print("onednn", onednn_enabled())
"""


def _probe(**env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if k not in DEFAULTS}
    return subprocess.run(
        [sys.executable, "-c", PROBE], env={**clean, **env}, capture_output=True, text=True, timeout=120, check=True
    )


def test_onednn_is_on_by_default_and_its_import_banner_is_not_shown() -> None:
    out = _probe()
    assert "onednn True" in out.stdout
    assert "oneDNN custom operations" not in out.stderr
    assert "absl::InitializeLog" not in out.stderr


def test_the_users_own_setting_wins() -> None:
    assert "onednn False" in _probe(TF_ENABLE_ONEDNN_OPTS="0").stdout
    # asking for TensorFlow's info logs shows the banner again: nothing is hidden from a user who wants it
    shown = _probe(TF_CPP_MIN_LOG_LEVEL="0")
    assert "onednn True" in shown.stdout
    assert "oneDNN custom operations are on" in shown.stderr


def test_ray_workers_and_child_processes_get_the_values_in_force(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TF_ENABLE_ONEDNN_OPTS", "0")
    monkeypatch.delenv("TF_CPP_MIN_LOG_LEVEL", raising=False)
    assert tensorflow_env() == {"TF_ENABLE_ONEDNN_OPTS": "0", "TF_CPP_MIN_LOG_LEVEL": "2"}


@pytest.mark.parametrize("setting", ["", "0", "1"])
def test_doctor_reports_what_tensorflow_decided_not_the_variable(setting: str) -> None:
    # an empty value leaves the choice to TensorFlow (off on CPUs without AVX-512 VNNI/AMX): a
    # doctor that read the variable by hand called it "on"
    decided = {"onednn True": "on", "onednn False": "off"}[_probe(TF_ENABLE_ONEDNN_OPTS=setting).stdout.strip()]
    clean = {k: v for k, v in os.environ.items() if k not in DEFAULTS}
    doctor = subprocess.run(
        [sys.executable, "-m", "distmis", "doctor"],
        env={**clean, "TF_ENABLE_ONEDNN_OPTS": setting},
        capture_output=True,
        text=True,
        timeout=300,
    )
    line = next(line for line in doctor.stdout.splitlines() if "oneDNN CPU kernels" in line)
    assert f"oneDNN CPU kernels: {decided} (TF_ENABLE_ONEDNN_OPTS={setting!r};" in line


# what a trial process does: TensorFlow first; then (the driver's plots) matplotlib and scikit-learn
LEAN = """
import sys, threading
from distmis.tensorflow_env import import_tensorflow
seen = {}
def other_thread():  # imports matplotlib while TensorFlow loads on the main thread
    import matplotlib
    seen["other"] = matplotlib.__name__
thread = threading.Thread(target=other_thread)
thread.start()
import_tensorflow()
thread.join()
print("during", "sklearn" in sys.modules, seen.get("other"))
import keras
print("keras", keras.layers.Conv3D(2, 3)(keras.Input((8, 8, 8, 1))).shape)
import matplotlib.pyplot, sklearn.base
print("after", matplotlib.pyplot.__name__, sklearn.base.__name__)
"""


def test_tensorflow_is_imported_without_keras_optional_packages_which_stay_importable() -> None:
    # Keras imports scikit-learn and pyplot when installed (3.5 s of every worker's start on 2 cores)
    out = subprocess.run([sys.executable, "-c", LEAN], capture_output=True, text=True, timeout=120, check=True)
    assert "during False matplotlib" in out.stdout, out.stdout + out.stderr  # the other thread was not affected
    assert "keras (None, 6, 6, 6, 2)" in out.stdout
    assert "after matplotlib.pyplot sklearn.base" in out.stdout
