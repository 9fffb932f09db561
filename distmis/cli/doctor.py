"""Check this node for what breaks distributed runs, and print what was checked.

Ports (can a free port be bound on the node address), Ray's temp dir and socket path length
(AF_UNIX paths must stay under 107 bytes), GPUs visible to TensorFlow, the TensorFlow/Keras
pairing, the Ray auth token file's mode, and the Ray and SLURM versions. A ``RAY_ADDRESS`` or an
HTTP ``MLFLOW_TRACKING_URI`` left in the environment is probed within a bound: on clusters a
stale one from an earlier job is common, and every later command would fail on it.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import stat
import subprocess
from collections.abc import Callable
from pathlib import Path


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default="127.0.0.1", help="address to test port binding on (default 127.0.0.1)")
    p.add_argument("--temp-dir", default="/tmp", help="root of Ray's temp dir (default /tmp)")


def run(args: argparse.Namespace) -> int:
    from distmis.redact import redact
    from distmis.tensorflow_env import onednn_enabled
    from distmis.training import configure_tensorflow

    results: list[tuple[str, bool, str]] = []

    def check(name: str, ok: bool, detail: str) -> None:
        detail = redact(detail)  # every line: a library's error may echo an address with its password
        results.append((name, ok, detail))
        print(f"[{'ok' if ok else 'FAIL'}] {name}: {detail}", flush=True)

    try:
        with socket.socket() as s:
            s.bind((args.host, 0))
            check("ports", True, f"a free port can be bound on {args.host} ({s.getsockname()[1]})")
    except OSError as exc:
        check("ports", False, f"cannot bind on {args.host}: {exc}")
    temp = Path(args.temp_dir)
    if not temp.is_dir():
        check("temp dir", False, f"{temp} does not exist (Ray's temp dir goes below it: create it or pick another)")
    elif not os.access(temp, os.W_OK | os.X_OK):
        check("temp dir", False, f"{temp} is not writable by you (Ray's temp dir goes below it)")
    else:
        check("temp dir", True, f"{temp} exists and is writable")
    sample = temp / "dm-1234567-0" / "session_2026-01-01_00-00-00_000000_12345" / "sockets" / "plasma_store"
    check("temp path length", len(str(sample)) < 107, f"{len(str(sample))} bytes for Ray's longest socket path (< 107)")
    _check_tracking_store(check)
    _check_ray_address(check)

    configure_tensorflow(None)
    import keras
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    onednn = onednn_enabled()
    state = {True: "on", False: "off", None: "unknown to this TensorFlow"}[onednn]
    setting = os.environ.get("TF_ENABLE_ONEDNN_OPTS")
    check(
        "oneDNN CPU kernels",
        True,
        f"{state} (TF_ENABLE_ONEDNN_OPTS={'unset' if setting is None else repr(setting)}; "
        "distmis turns them on unless you set it: Conv3D on the CPU is several times faster)",
    )
    check("GPUs visible to TensorFlow", True, f"{len(gpus)} {[g.name for g in gpus]}")
    pair_ok = keras.__version__.startswith("3.") and tf.__version__.startswith("2.2")
    check(
        "TensorFlow/Keras",
        pair_ok,
        f"tensorflow {tf.__version__}, keras {keras.__version__} (need TF >= 2.16 with Keras 3)",
    )
    token = os.environ.get("RAY_AUTH_TOKEN_PATH")
    if token and Path(token).exists():
        mode = stat.S_IMODE(Path(token).stat().st_mode)
        check("Ray token file", mode & 0o077 == 0, f"{token} mode {oct(mode)} (must be readable by you only)")
    else:
        check("Ray token file", True, "RAY_AUTH_TOKEN_PATH not set: a local Ray started by distmis gets a private one")
    import ray

    check("Ray", True, _ray_line(ray.__version__))
    if shutil.which("sinfo"):
        out = subprocess.run(["sinfo", "--version"], capture_output=True, text=True)
        if out.returncode == 0:
            check("SLURM", True, out.stdout.strip())
        else:  # installed, but this node reaches no slurm.conf / controller
            check("SLURM", True, f"installed, no cluster configured here ({out.stderr.strip().splitlines()[0][:120]})")
    else:
        check("SLURM", True, "not installed on this node (only needed for sbatch)")
    return 0 if all(ok for _, ok, _ in results) else 1


#: how long doctor waits for a tracking server's /health (seconds)
TRACKING_PROBE_SECONDS = 5.0


def _tracking_server_problem(uri: str) -> str | None:
    """None when the MLflow server at ``uri`` answers its ``/health`` within the bound, else why not."""
    import base64
    import urllib.error
    import urllib.parse
    import urllib.request

    from distmis.redact import redact_uri

    parts = urllib.parse.urlsplit(uri)
    # user:password@host is the server's basic auth, not part of the host urllib should resolve
    request = urllib.request.Request(
        parts._replace(netloc=parts.netloc.rpartition("@")[2]).geturl().rstrip("/") + "/health"
    )
    if parts.username is not None:
        credentials = f"{urllib.parse.unquote(parts.username)}:{urllib.parse.unquote(parts.password or '')}"
        request.add_header("Authorization", "Basic " + base64.b64encode(credentials.encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=TRACKING_PROBE_SECONDS) as response:
            return None if response.status == 200 else f"/health answered HTTP {response.status}"
    except urllib.error.HTTPError as exc:
        return f"/health answered HTTP {exc.code}"
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        return redact_uri(str(reason)) or type(exc).__name__


def _check_tracking_store(check: Callable[[str, bool, str], None]) -> None:
    """The store ``MLFLOW_TRACKING_URI`` names; a tracking server must answer (within the bound)."""
    from distmis.redact import redact_uri

    store = os.environ.get("MLFLOW_TRACKING_URI")
    if store and store.startswith(("http://", "https://")):
        reason = _tracking_server_problem(store)
        check(
            "MLflow tracking store",
            reason is None,
            f"{redact_uri(store)} (MLFLOW_TRACKING_URI) "
            + ("answers" if reason is None else f"does not answer: {reason}; start the server or unset it"),
        )
    else:
        check(
            "MLflow tracking store",
            True,
            f"{redact_uri(store)} (MLFLOW_TRACKING_URI)"
            if store
            else "MLFLOW_TRACKING_URI unset: each search uses the SQLite store beside its --out (runs/mlflow.db)",
        )


def _check_ray_address(check: Callable[[str, bool, str], None]) -> None:
    """A ``RAY_ADDRESS`` in the environment must answer: every command would otherwise connect to it."""
    from distmis.exceptions import ClusterError
    from distmis.raysession import probe_address
    from distmis.redact import redact_uri

    address = os.environ.get("RAY_ADDRESS")
    if not address:
        check("Ray address", True, "RAY_ADDRESS unset: each command starts a private local Ray")
        return
    try:
        probe_address(None)
    except ClusterError as exc:
        check("Ray address", False, str(exc))
    else:
        check("Ray address", True, f"RAY_ADDRESS={redact_uri(address)} accepts connections")


def _ray_line(version: str) -> str:
    """Any Ray the package's pin allows works; only distmis's few private calls wait for a tested minor."""
    from distmis.raycompat import TESTED_MINORS, is_tested

    if is_tested(version):
        return f"ray {version}"
    return f"ray {version} (private calls tested on {', '.join(TESTED_MINORS)} only: distmis goes without them here)"
