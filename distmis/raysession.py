"""Connecting to Ray: an existing cluster, or a private local one.

Ray 2.60 enables token authentication and by default keeps the token in ``~/.ray/auth_token``,
shared by every Ray user of the machine. A local cluster that distmis starts gets its own
token in a private (0700) temporary directory instead, removed at exit. When connecting to an
existing cluster (``--address`` / ``RAY_ADDRESS``) the user's ``RAY_AUTH_*`` settings are used.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import os
import secrets
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from distmis.exceptions import ClusterError
from distmis.raycompat import (
    local_monitor_processes,
    local_system_config,
    patient_raylet_registration,
    refresh_auth_settings,
    without_api_server,
)
from distmis.waits import WaitExpired, call_within


def use_private_token(address: str | None) -> None:
    """Give a local cluster that distmis starts its own token file (not the shared ``~/.ray/auth_token``)."""
    if address or os.environ.get("RAY_ADDRESS"):
        return  # an existing cluster: its token comes from the user's environment
    if os.environ.get("RAY_AUTH_MODE") or os.environ.get("RAY_AUTH_TOKEN_PATH") or os.environ.get("RAY_AUTH_TOKEN"):
        return  # the user chose; respect it
    directory = Path(tempfile.mkdtemp(prefix="distmis-ray-auth-"))
    directory.chmod(0o700)
    token = directory / "auth_token"
    fd = os.open(token, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(secrets.token_hex(32))
    os.environ["RAY_AUTH_MODE"] = "token"
    os.environ["RAY_AUTH_TOKEN_PATH"] = str(token)
    atexit.register(shutil.rmtree, directory, True)
    refresh_auth_settings()  # Ray may have read the shared token's settings at its import


#: how long distmis waits for an existing Ray cluster to answer before it says so (seconds); a
#: stale RAY_ADDRESS otherwise left ``distmis tune`` waiting for minutes with only Ray's own
#: "Failed to connect" line every 40 s
CONNECT_SECONDS = 30.0
#: a refused connection (nothing listens) is retried this long: a head that is just starting
REFUSED_GRACE_SECONDS = 3.0


def init_ray(
    address: str | None,
    *,
    num_cpus: int | None = None,
    resources: dict[str, float] | None = None,
    env_vars: dict[str, str] | None = None,
    include_dashboard: bool = False,
) -> dict[str, Any]:
    """Start a private local Ray, or connect (bounded) to the cluster at ``address`` / ``RAY_ADDRESS``;
    returns the cluster's total resources.

    Raises:
        ClusterError: the cluster does not answer within :data:`CONNECT_SECONDS`, naming the
            address, where it came from and how long was waited.
    """
    use_private_token(address)
    import ray

    source = "--address" if address else "RAY_ADDRESS"
    address = address or os.environ.get("RAY_ADDRESS")
    runtime_env = {"env_vars": env_vars} if env_vars else None
    if ray.is_initialized():
        return ray.cluster_resources()
    if address:
        _connect(address, source, runtime_env)
    else:
        with contextlib.nullcontext() if include_dashboard else without_api_server(), patient_raylet_registration():
            ray.init(
                num_cpus=num_cpus,
                resources=resources,
                runtime_env=runtime_env,
                logging_level="warning",
                include_dashboard=include_dashboard,
                _system_config=local_system_config(),
            )
    return ray.cluster_resources()


class RaySession:
    """The Ray a command runs on: its resources, and its end (see :func:`ray_session`)."""

    def __init__(self, resources: dict[str, float], *, connected_here: bool) -> None:
        self.resources = resources
        self._connected_here = connected_here

    def close(self) -> None:
        """Disconnect, stopping a local Ray this session started; a second call does nothing.

        A search calls it as soon as its trials end, while Ray's output still goes to the
        search's log: Ray forwards the workers' last lines until this process disconnects.
        """
        import ray

        if self._connected_here and ray.is_initialized():
            shutdown_ray()
        self._connected_here = False


@contextlib.contextmanager
def ray_session(
    address: str | None, *, env_vars: dict[str, str] | None = None, num_cpus: int | None = None
) -> Iterator[RaySession]:
    """A private local Ray, or the cluster at ``address`` / ``RAY_ADDRESS``; yields the session.

    Disconnects at the end when this call connected (a caller's own session is left alone); a
    local Ray it started stops with it.
    """
    use_private_token(address)  # before Ray is imported anywhere in this process
    import ray

    connected_here = not ray.is_initialized()
    session = RaySession(init_ray(address, env_vars=env_vars, num_cpus=num_cpus), connected_here=connected_here)
    try:
        yield session
    finally:
        session.close()


def shutdown_ray() -> None:
    """Disconnect from Ray; a local Ray this process started stops with it.

    Its autoscaler monitor is killed first (see :func:`~distmis.raycompat.local_monitor_processes`):
    otherwise Ray's shutdown waits a second for it at the end of every command.

    The garbage collector is off while Ray shuts down: Ray marks the driver disconnected before
    it shuts its core worker down, and an ObjectRef freed in between (one in a garbage cycle, as
    a killed trial's error leaves them) makes Ray quick-exit the process with status 1, a
    finished search without its summary. Once the core worker is gone, freeing one is harmless.
    """
    import ray

    for process in local_monitor_processes():
        process.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=1.0)
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        ray.shutdown()
    finally:
        if was_enabled:
            gc.enable()


def _failure(address: str, source: str, start: float) -> Any:
    hint = "unset RAY_ADDRESS to start a local Ray" if source == "RAY_ADDRESS" else "check the address"

    def fail(reason: str) -> ClusterError:
        return ClusterError(
            f"cannot reach the Ray cluster at {address} (from {source}): {reason} after "
            f"{time.monotonic() - start:.1f} s; {hint}, or start the cluster first"
        )

    return fail


def probe_address(address: str | None) -> None:
    """Fail early, before anything is written (tracking, output), when ``--address`` or
    ``RAY_ADDRESS`` names a host and port where nothing listens; no-op for a local Ray.

    Raises:
        ClusterError: naming the address, where it came from and how long was waited.
    """
    source = "--address" if address else "RAY_ADDRESS"
    address = address or os.environ.get("RAY_ADDRESS")
    if address:
        start = time.monotonic()
        _probe(address, start, _failure(address, source, start))


def _connect(address: str, source: str, runtime_env: dict[str, Any] | None) -> None:
    """``ray.init(address=...)`` within :data:`CONNECT_SECONDS`, after a TCP probe of the address."""
    import ray

    start = time.monotonic()
    fail = _failure(address, source, start)
    _probe(address, start, fail)
    left = CONNECT_SECONDS - (time.monotonic() - start)
    try:
        call_within(
            left,
            lambda: ray.init(address=address, runtime_env=runtime_env, logging_level="warning", log_to_driver=True),
            name="distmis-ray-connect",
        )
    except WaitExpired:
        raise fail("it accepts connections but does not answer as a Ray cluster") from None
    except (ConnectionError, RuntimeError, ValueError, TimeoutError) as exc:
        text = str(exc).strip()
        raise fail(text.splitlines()[0][:300] if text else type(exc).__name__) from None


def _probe(address: str, start: float, fail: Any) -> None:
    """A TCP connection to the address's host and port, retried within the bound."""
    import socket

    # scheme://user:password@host:port/path -> host:port (Ray's client and dashboard addresses)
    target = address.split("://", 1)[-1].split("/", 1)[0].rpartition("@")[2]
    if target in ("auto", "local") or ":" not in target:
        return  # Ray finds the address itself (the session on this node), or names its own error
    host, _, port_text = target.rpartition(":")
    try:
        port = int(port_text)
    except ValueError:
        raise fail(f"{port_text!r} is not a port number") from None
    host = host.strip("[]")
    while True:
        left = CONNECT_SECONDS - (time.monotonic() - start)
        try:
            with socket.create_connection((host, port), timeout=max(0.5, min(5.0, left))):
                return
        except ConnectionRefusedError:
            if time.monotonic() - start > REFUSED_GRACE_SECONDS:
                raise fail("connection refused (nothing listens there)") from None
        except OSError as exc:
            if time.monotonic() - start > CONNECT_SECONDS:
                raise fail(exc.strerror or type(exc).__name__) from None
        time.sleep(0.5)
