"""Start the MLflow UI over distmis' tracking store (default: the SQLite store in runs/) and print
the runs page of the newest experiment (opened in a browser on a desktop). MLflow 3's home page
is a GenAI welcome screen; a search's runs are one click further, so distmis goes there directly.

Binds 127.0.0.1 by default: MLflow's UI has no authentication unless its auth app is
enabled, so reach it from elsewhere through an SSH tunnel (ssh -L 5000:127.0.0.1:5000 host).
The store's address goes to MLflow through its environment (MLFLOW_BACKEND_STORE_URI), not its
command line, where any user of the host could read its credentials with ps.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from distmis.cli._common import port_number

#: how long the UI may take to answer before distmis stops waiting to open the browser
READY_SECONDS = 60.0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--runs", default="runs", help="directory holding mlflow.db (default runs/)")
    p.add_argument(
        "--tracking-uri",
        default=None,
        help="a tracking store URI instead (default: $MLFLOW_TRACKING_URI, else sqlite:///<runs>/mlflow.db)",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=port_number, default=5000)
    p.add_argument("--no-browser", action="store_true", help="do not open a browser, even on a desktop")


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def store_uri(args: argparse.Namespace) -> str:
    from distmis.exceptions import TrackingError

    uri = args.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
    if not uri:
        db = Path(args.runs) / "mlflow.db"
        if not db.is_file():
            raise TrackingError(f"{db}: no tracking store yet; run `distmis tune` first or pass --tracking-uri")
        uri = f"sqlite:///{db.resolve()}"
    return uri


def newest_experiment(uri: str) -> str | None:
    """The id of the most recently created experiment of the store (the last search), if any."""
    from distmis.tracking import mlflow_client

    try:
        found = mlflow_client(uri).search_experiments(order_by=["creation_time DESC"], max_results=1)
    except Exception:  # noqa: BLE001 - the UI opens on its home page then; MLflow reports the store's problem
        return None
    return found[0].experiment_id if found else None


def command() -> list[str]:
    mlflow = Path(sys.executable).parent / "mlflow"
    return [str(mlflow) if mlflow.exists() else "mlflow", "ui"]


def run(args: argparse.Namespace) -> int:
    from distmis.redact import redact_uri

    uri = store_uri(args)
    if not _is_loopback(args.host):
        print(
            f"distmis: warning: binding {args.host}: MLflow's UI has no authentication unless its auth app is "
            "enabled (mlflow ui --app-name basic-auth); anyone who can reach this port can read and change runs",
            file=sys.stderr,
        )
    base = f"http://{args.host}:{args.port}"
    experiment = newest_experiment(uri)
    page = f"{base}/#/experiments/{experiment}/runs" if experiment else base
    env = {**os.environ, "MLFLOW_BACKEND_STORE_URI": uri}
    proc = subprocess.Popen(
        [*command(), "--host", args.host, "--port", str(args.port)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
    )
    relay = _Relay(proc)
    try:
        if not _answers(f"{base}/health", proc):
            if proc.poll() is not None:
                from distmis.exceptions import TrackingError

                raise TrackingError(
                    f"the MLflow UI over {redact_uri(uri)} exited (code {proc.wait()}) before it answered: "
                    f"{relay.last_line() or 'no output'}"
                )
            print(f"distmis: warning: the MLflow UI has not answered {base} in {READY_SECONDS:.0f} s", file=sys.stderr)
        print(f"distmis: MLflow UI on {page}  (store {redact_uri(uri)})", flush=True)
        relay.start()  # from here MLflow's own lines, redacted, reach the terminal
        if not args.no_browser and _desktop():
            import webbrowser

            webbrowser.open(page)
        return proc.wait()
    finally:
        if proc.poll() is None:  # Ctrl-C or an error: the UI goes with this command
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()


class _Relay:
    """MLflow's output, held back until the UI answers, then passed on redacted: a store URI in a
    traceback or a log line keeps no password."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        import threading

        self._lines: list[str] = []
        self._live = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._read, args=(proc,), name="distmis-ui-relay", daemon=True)
        self._thread.start()

    def _read(self, proc: subprocess.Popen[str]) -> None:
        from distmis.redact import redact

        assert proc.stdout is not None
        for line in proc.stdout:
            with self._lock:
                if self._live.is_set():
                    print(redact(line), end="", flush=True)
                else:
                    self._lines.append(redact(line))

    def last_line(self) -> str:
        with self._lock:
            meaningful = [line.strip() for line in self._lines if line.strip()]
        return meaningful[-1][:300] if meaningful else ""

    def start(self) -> None:
        with self._lock:
            for line in self._lines:
                print(line, end="")
            self._lines.clear()
            self._live.set()


def _desktop() -> bool:
    """Whether a browser can be shown here (a graphical session; not an ssh shell on a cluster node)."""
    return sys.platform == "darwin" or bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))


def _answers(url: str, proc: subprocess.Popen[str]) -> bool:
    """Wait (bounded) until the UI answers ``url``; False if it exits or does not answer in time."""
    deadline = time.monotonic() + READY_SECONDS
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return True
        except OSError:
            time.sleep(0.5)
    return False
