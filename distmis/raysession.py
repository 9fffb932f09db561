"""Connecting to Ray: an existing cluster, or a private local one.

Ray 2.60 enables token authentication and by default keeps the token in ``~/.ray/auth_token``,
shared by every Ray user of the machine. A local cluster that distmis starts gets its own
token in a private (0700) temporary directory instead, removed at exit. When connecting to an
existing cluster (``--address`` / ``RAY_ADDRESS``) the user's ``RAY_AUTH_*`` settings are used.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from distmis.exceptions import ClusterError
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
    if "ray._raylet" in sys.modules:
        # Ray read its auth settings when it was imported: refresh them, as Ray's own
        # token set-up does (ray._private.authentication.authentication_token_setup).
        from ray._raylet import AuthenticationTokenLoader, Config  # type: ignore[attr-defined]

        Config.initialize("")
        AuthenticationTokenLoader.instance().reset_cache()


#: Ray settings for a local Ray that distmis starts (not for a cluster it joins).
#: ``prestart_worker_first_driver`` off: by default the raylet starts one idle worker per CPU
#: when the first driver connects and ``ray.init`` waits for them,
#: although a search's first trial needs a worker only once Tune has started, and starts one
#: itself then (``benchmarks/tune_overhead.py`` measures the start-up).
LOCAL_RAY_SYSTEM_CONFIG: dict[str, Any] = {"prestart_worker_first_driver": False}

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
        with contextlib.nullcontext() if include_dashboard else _without_api_server():
            ray.init(
                num_cpus=num_cpus,
                resources=resources,
                runtime_env=runtime_env,
                logging_level="warning",
                include_dashboard=include_dashboard,
                _system_config=LOCAL_RAY_SYSTEM_CONFIG,
            )
    return ray.cluster_resources()


@contextlib.contextmanager
def _without_api_server() -> Iterator[None]:
    """A local Ray started inside the block has no head API server (Ray's dashboard process).

    Why: with ``include_dashboard=False`` Ray 2.60 still starts the dashboard's head process, with
    its usage-statistics module alone, and ``ray.init`` waits for it to publish its URL before it
    starts the raylet: 0.9 s of a 2.5 s start here, with a second core busy meanwhile, before
    every search, ``predict`` and ``compare``. Nothing uses it on a Ray that distmis starts for
    itself: its token is private to the command, and distmis calls neither the job nor the state
    API (``ray status``, which asks the GCS, still works). Ray has no switch for it, so Ray's
    ``Node.start_api_server`` is a no-op for the duration of the block and restored after it;
    where it is not found (another Ray version), Ray starts as usual. A test pins the method's
    place and that no dashboard process is started.
    """
    try:
        from ray._private.node import Node
    except ImportError:  # pragma: no cover - another Ray layout: start as usual
        yield
        return
    original = Node.__dict__.get("start_api_server")
    if original is None:  # pragma: no cover - another Ray version: start as usual
        yield
        return

    def skip(self: Any, **_: Any) -> None:
        return None

    Node.start_api_server = skip  # type: ignore[method-assign]
    try:
        yield
    finally:
        Node.start_api_server = original  # type: ignore[method-assign]


def shutdown_ray() -> None:
    """Disconnect from Ray; a local Ray this process started stops with it.

    Why not ``ray.shutdown()`` alone: Ray 2.60 stops a local Ray's processes one kind at a time,
    the GCS before the autoscaler monitor, and gives each 1 s to exit on SIGTERM. The monitor's
    SIGTERM handler reports its end to the GCS, which is gone by then, so it is killed only when
    that second is up: 1.0 of the 1.1 s ``ray.shutdown()`` took here, at the end of every
    command. A private local Ray has no autoscaler that anything waits on, so its monitor is
    killed first (its handler, which would tell the still-connected driver that "the
    autoscaler failed", never runs). Ray's process table is read defensively: where it is not
    found (another Ray version), this is ``ray.shutdown()``.
    """
    import ray

    for process in local_monitor_processes():
        process.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=1.0)
    ray.shutdown()


def local_monitor_processes() -> list[subprocess.Popen[bytes]]:
    """The running autoscaler monitor of the local Ray this process started (none when it joined a cluster)."""
    try:
        from ray._private import ray_constants, worker

        table = worker._global_node.all_processes  # type: ignore[union-attr]  # None: no local Ray
        infos = table.get(ray_constants.PROCESS_TYPE_MONITOR, [])
        return [info.process for info in infos if info.process.poll() is None]
    except (AttributeError, ImportError):
        return []


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
