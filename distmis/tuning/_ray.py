"""Connecting to Ray: an existing cluster, or a private local one.

Ray 2.60 enables token authentication and by default keeps the token in ``~/.ray/auth_token``,
shared by every Ray user of the machine. A local cluster that distmis starts gets its own
token in a private (0700) temporary directory instead, removed at exit. When connecting to an
existing cluster (``--address`` / ``RAY_ADDRESS``) the user's ``RAY_AUTH_*`` settings are used.
"""

from __future__ import annotations

import atexit
import os
import secrets
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from distmis.exceptions import ClusterError


def use_private_token(address: str | None) -> None:
    """Give a local cluster that distmis starts its own token file (not the shared ``~/.ray/auth_token``)."""
    if address or os.environ.get("RAY_ADDRESS"):
        return  # an existing cluster: its token comes from the user's environment
    if os.environ.get("RAY_AUTH_MODE") or os.environ.get("RAY_AUTH_TOKEN_PATH") or os.environ.get("RAY_AUTH_TOKEN"):
        return  # the user chose; respect it
    directory = Path(tempfile.mkdtemp(prefix="distmis-ray-auth-"))
    os.chmod(directory, 0o700)
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


def init_ray(
    address: str | None,
    *,
    num_cpus: int | None = None,
    resources: dict[str, float] | None = None,
    env_vars: dict[str, str] | None = None,
    include_dashboard: bool = False,
) -> dict[str, Any]:
    """Start or connect to Ray; returns the cluster's total resources.

    Raises:
        ClusterError: when the given address cannot be reached.
    """
    use_private_token(address)
    import ray

    address = address or os.environ.get("RAY_ADDRESS")
    runtime_env = {"env_vars": env_vars} if env_vars else None
    if ray.is_initialized():
        return ray.cluster_resources()
    if address:
        try:
            ray.init(address=address, runtime_env=runtime_env, logging_level="warning", log_to_driver=True)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise ClusterError(f"cannot connect to the Ray cluster at {address}: {exc}") from None
    else:
        ray.init(
            num_cpus=num_cpus,
            resources=resources,
            runtime_env=runtime_env,
            logging_level="warning",
            include_dashboard=include_dashboard,
        )
    return ray.cluster_resources()
