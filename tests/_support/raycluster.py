"""Test helpers for real Ray processes: free ports, private tokens, stopping only what a test started.

``ray stop`` would kill every Ray on the host (other tests', other users'), so clusters are
started in their own process session and stopped by process group, with a bounded wait.
"""

from __future__ import annotations

import os
import random
import secrets
import socket
import subprocess
import sys
import time
from pathlib import Path

from distmis.cluster import ports
from distmis.cluster.processes import ray_start_env, stop_process_group

VENV_BIN = Path(sys.executable).parent


_handed_out: set[int] = set()


def _reserved_ports() -> list[int]:
    """Ports that neither the kernel's ``bind(0)`` nor the SLURM bootstrapper's blocks draw from.

    The kernel hands out its ephemeral range to every ``bind(0)`` and outgoing connection (Ray,
    MLflow, the OS), and :mod:`distmis.cluster.ports` claims whole 512-port blocks outside it for a
    SLURM job's nodes. What is left is the tail of each non-ephemeral stretch that no block fits
    (32288-32767 and 65096-65535 with Linux's default range): a port handed out from there cannot be
    taken by another process before the test's process binds it, not even by a SLURM job that a
    parallel test worker is starting.
    """
    ephemeral = ports.ephemeral_range()
    covered = {port for base in ports.candidate_bases(ephemeral) for port in range(base, base + ports.BLOCK_SIZE)}
    low, high = ephemeral
    outside = [*range(ports.LOWEST_PORT, low), *range(high + 1, ports.HIGHEST_PORT + 1)]
    return [port for port in outside if port not in covered]


def _worker_share(reserved: list[int]) -> list[int]:
    """This pytest-xdist worker's share of ``reserved``: parallel workers never hand out the same port."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    count = max(int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1), 1)
    index = int(worker) if worker.isdigit() else 0
    return reserved[index % count :: count]


def _bind_any(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def free_port(host: str = "127.0.0.1") -> int:
    """A port on ``host`` that nothing listens on, for a process the test is about to start.

    A port found by ``bind(0)`` and closed again can be given to any other process before ours
    binds it (a clean-clone CI once failed on such a collision), and parallel test workers widen
    that window. So ports come from :func:`_reserved_ports`, split between the pytest-xdist
    workers, and not twice from one process until its whole share has been handed out. On a host
    whose port ranges leave too few such ports, the kernel chooses (``bind(0)``).
    """
    share = _worker_share(_reserved_ports())
    if len(share) < 100:
        return _bind_any(host)
    candidates = [port for port in share if port not in _handed_out]
    if not candidates:  # the whole share was handed out once: those ports' tests are long over
        _handed_out.clear()
        candidates = share
    random.shuffle(candidates)
    for port in candidates:
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    return _bind_any(host)


def write_token(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "auth_token"
    path.write_text(secrets.token_hex(32))
    path.chmod(0o600)
    return path


def clean_env(**extra: str) -> dict[str, str]:
    """The environment of a child process without any Ray address/token of this process."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_AUTH", "RAY_ADDRESS"))}
    env.update(extra)
    return env


def stop_group(proc: subprocess.Popen, timeout: float = 30.0) -> None:
    """SIGTERM the process group of ``proc`` (started with start_new_session), SIGKILL after ``timeout``."""
    stop_process_group(proc, grace=timeout)


class RayHead:
    """``ray start --head --block`` on ``host`` with free ports and its own token."""

    def __init__(self, tmp: Path, host: str = "127.0.0.11", num_cpus: int = 2, resources: str | None = None) -> None:
        self.host = host
        self.token = write_token(tmp / "auth")
        self.gcs_port, self.dashboard_port = free_port(host), free_port(host)
        self.env = clean_env(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(self.token))
        self.log = open(tmp / "ray-head.log", "w")
        self.temp_dir = Path(f"/tmp/dm-{secrets.token_hex(3)}")  # short: AF_UNIX paths <= 107 bytes
        self.nodes: list[subprocess.Popen] = []
        self.proc = subprocess.Popen(
            [
                str(VENV_BIN / "ray"),
                "start",
                "--head",
                "--block",
                f"--node-ip-address={host}",
                f"--port={self.gcs_port}",
                f"--dashboard-host={host}",
                f"--dashboard-port={self.dashboard_port}",
                f"--ray-client-server-port={free_port(host)}",
                "--dashboard-agent-listen-port=0",
                f"--num-cpus={num_cpus}",
                f"--temp-dir={self.temp_dir}",
                "--disable-usage-stats",
                *([f"--resources={resources}"] if resources else []),
            ],
            env=ray_start_env(self.env),
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self._wait_ready(timeout=90)

    @property
    def address(self) -> str:
        return f"{self.host}:{self.gcs_port}"

    @property
    def dashboard(self) -> str:
        return f"http://{self.host}:{self.dashboard_port}"

    def _wait_ready(self, timeout: float) -> None:
        import urllib.error
        import urllib.request

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"ray head exited with {self.proc.returncode}; see {self.log.name}")
            try:
                urllib.request.urlopen(f"{self.dashboard}/api/version", timeout=2)
                return
            except urllib.error.HTTPError:
                return  # the dashboard answered (e.g. 401 without a token): it is up
            except OSError:
                time.sleep(0.5)
        self.stop()
        raise TimeoutError(f"ray head on {self.address} not ready after {timeout}s; see {self.log.name}")

    def add_node(self, host: str, num_cpus: int = 1) -> subprocess.Popen:
        """Join a worker node (its own loopback address) to this head; stopped with the head."""
        log = open(self.log.name.replace("head", host), "w")
        proc = subprocess.Popen(
            [
                str(VENV_BIN / "ray"),
                "start",
                "--block",
                f"--address={self.address}",
                f"--node-ip-address={host}",
                f"--num-cpus={num_cpus}",
                "--dashboard-agent-listen-port=0",
                "--disable-usage-stats",
            ],
            env=ray_start_env(self.env),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.nodes.append(proc)
        return proc

    def alive_nodes(self) -> int:
        out = subprocess.run(
            [
                sys.executable,
                "-c",
                f"import ray; ray.init(address='{self.address}', logging_level='error'); "
                "print(sum(1 for n in ray.nodes() if n['Alive']))",
            ],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        return int(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 else 0

    def available(self) -> dict:
        import json

        out = subprocess.run(
            [
                sys.executable,
                "-c",
                f"import json, ray; ray.init(address='{self.address}', logging_level='error'); "
                "print(json.dumps({'total': ray.cluster_resources(), 'free': ray.available_resources()}))",
            ],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        return json.loads(out.stdout.strip().splitlines()[-1])

    def stop(self) -> None:
        for node in self.nodes:
            stop_group(node)
        stop_group(self.proc)
        self.log.close()
        import shutil

        shutil.rmtree(self.temp_dir, ignore_errors=True)
