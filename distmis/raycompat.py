"""The one door to Ray's private code: what distmis does beyond Ray's public API, and only on a Ray it was tested with.

Four things are worth it: a private local Ray without the head API server, which no distmis
command uses but ``ray.init`` waits for; a longer wait for that Ray's raylet on a busy machine;
stopping that Ray without its autoscaler monitor's grace second; and re-reading Ray's token
settings when Ray was imported before distmis chose a private token. Each is done only where
Ray's version is one of :data:`TESTED_MINORS`; on any other version Ray's public behaviour is
used (slower to start and stop, never wrong), so a newer Ray within the declared bound still
works. The layering test keeps every private Ray import in
this module.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator
from functools import cache
from importlib import metadata
from typing import Any

from distmis.waits import retried_until

#: Ray minor versions whose private layout this module was written against and tested with
TESTED_MINORS = ("2.60",)
#: how long a local Ray's start waits for its raylet to register with the GCS: Ray's own 30 s,
#: fixed in ``Node.__init__``, failed starts in CI on a 2-core machine with a load of 9
RAYLET_REGISTRATION_SECONDS = 180.0


def is_tested(version: str) -> bool:
    """Whether a Ray version (``"2.60.0"``) is of a minor release this module was tested with."""
    return ".".join(version.split(".")[:2]) in TESTED_MINORS


@cache
def private_code_usable() -> bool:
    """Whether the installed Ray is one this module's private calls were tested with."""
    try:
        return is_tested(metadata.version("ray"))
    except metadata.PackageNotFoundError:  # pragma: no cover - Ray is a dependency
        return False


def refresh_auth_settings() -> None:
    """Make an imported Ray read its token settings again (they were read at its import).

    Ray's own token set-up does the same (``ray._private.authentication``); without it, a Ray
    imported before distmis set a private token would use the shared one. Nothing to do where
    Ray is not imported yet; on an untested Ray, the settings take effect at Ray's next import.
    """
    if "ray._raylet" not in sys.modules or not private_code_usable():
        return
    from ray._raylet import AuthenticationTokenLoader, Config  # type: ignore[attr-defined]

    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()


def local_system_config() -> dict[str, Any]:
    """Ray's ``_system_config`` for a local Ray that distmis starts: no worker prestarted per CPU.

    By default the raylet starts one idle worker per CPU when the first driver connects and
    ``ray.init`` waits for them, although a search's first trial needs a worker only once Tune
    has started, and starts one itself then. An untested Ray gets its defaults: an unknown key
    there would be an error.
    """
    return {"prestart_worker_first_driver": False} if private_code_usable() else {}


@contextlib.contextmanager
def patient_raylet_registration(seconds: float = RAYLET_REGISTRATION_SECONDS) -> Iterator[None]:
    """A local Ray started inside the block waits up to ``seconds`` for its raylet to register.

    ``Node.__init__`` asks the GCS for its node (``services.get_node``) until 30 s have passed,
    then fails the start, although the raylet is only slow, not dead. Inside the block each of
    those asks itself retries until ``seconds``; a raylet that never registers still fails the
    start, later. On an untested Ray, Ray's own 30 s apply.
    """
    if not private_code_usable():
        yield
        return
    from ray._private import services

    original = services.get_node
    services.get_node = retried_until(seconds, original)
    try:
        yield
    finally:
        services.get_node = original


@contextlib.contextmanager
def without_api_server() -> Iterator[None]:
    """A local Ray started inside the block has no head API server (Ray's dashboard process).

    With ``include_dashboard=False`` Ray 2.60 still starts the dashboard's head process, for its
    usage-statistics module alone, and ``ray.init`` waits for it before it starts the raylet,
    with a second core busy meanwhile. A Ray that distmis starts for itself never uses it (its
    token is private to the command; ``ray status`` asks the GCS). Ray has no switch for it, so
    ``Node.start_api_server`` is a no-op inside the block and restored after it.
    """
    original = None
    if private_code_usable():
        from ray._private.node import Node

        original = Node.__dict__.get("start_api_server")
    if original is None:
        yield
        return

    def skip(self: Any, **_: Any) -> None:
        return None

    Node.start_api_server = skip  # type: ignore[method-assign]
    try:
        yield
    finally:
        Node.start_api_server = original  # type: ignore[method-assign]


def local_monitor_processes() -> list[subprocess.Popen[bytes]]:
    """The running autoscaler monitor of the local Ray this process started; none when it joined
    a cluster, or where Ray is not a tested version.

    Why it is wanted: Ray 2.60's shutdown stops the GCS before the monitor, whose SIGTERM
    handler then waits its whole grace second for the gone GCS. A private local Ray has no
    autoscaler anything waits on, so the caller kills the monitor first.
    """
    if not private_code_usable():
        return []
    from ray._private import ray_constants, worker

    node = worker._global_node
    if node is None:
        return []
    infos = node.all_processes.get(ray_constants.PROCESS_TYPE_MONITOR, [])
    return [info.process for info in infos if info.process.poll() is None]


__all__ = [
    "TESTED_MINORS",
    "is_tested",
    "local_monitor_processes",
    "local_system_config",
    "private_code_usable",
    "refresh_auth_settings",
    "without_api_server",
]
