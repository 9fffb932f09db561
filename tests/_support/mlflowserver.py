"""A real ``mlflow server`` on 127.0.0.1 (SQLite backend) for tests; stopped by process group."""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from _support.raycluster import free_port, stop_group


class MlflowServer:
    def __init__(self, root: Path, port: int | None = None) -> None:
        self.root = root
        self.port = port or free_port()
        self.proc: subprocess.Popen | None = None

    @property
    def uri(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 90) -> MlflowServer:
        self.root.mkdir(parents=True, exist_ok=True)
        log = open(self.root / "server.log", "a")
        self.proc = subprocess.Popen(
            [
                str(Path(sys.executable).parent / "mlflow"),
                "server",
                "--backend-store-uri",
                f"sqlite:///{self.root / 'mlflow.db'}",
                "--artifacts-destination",
                str(self.root / "artifacts"),
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--workers",
                "1",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"mlflow server exited with {self.proc.returncode}; see {self.root / 'server.log'}")
            try:
                if urllib.request.urlopen(f"{self.uri}/health", timeout=2).read().strip() == b"OK":
                    return self
            except OSError:
                time.sleep(0.3)
        self.stop()
        raise TimeoutError(f"mlflow server on {self.uri} not healthy after {timeout}s; see {self.root / 'server.log'}")

    def stop(self) -> None:
        if self.proc is not None:
            stop_group(self.proc, timeout=15)
            self.proc = None
