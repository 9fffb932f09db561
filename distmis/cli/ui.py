"""Start the MLflow UI over distmis' tracking store (default: the SQLite store in runs/).

Binds 127.0.0.1 by default: MLflow's UI has no authentication unless its auth app is
enabled, so reach it from elsewhere through an SSH tunnel (ssh -L 5000:127.0.0.1:5000 host).
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import sys
from pathlib import Path

from distmis.cli._common import port_number


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--runs", default="runs", help="directory holding mlflow.db (default runs/)")
    p.add_argument(
        "--tracking-uri",
        default=None,
        help="a tracking store URI instead (default: $MLFLOW_TRACKING_URI, else sqlite:///<runs>/mlflow.db)",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=port_number, default=5000)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def command(args: argparse.Namespace) -> list[str]:
    from distmis.exceptions import TrackingError

    uri = args.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
    if not uri:
        db = Path(args.runs) / "mlflow.db"
        if not db.is_file():
            raise TrackingError(f"{db}: no tracking store yet; run `distmis tune` first or pass --tracking-uri")
        uri = f"sqlite:///{db.resolve()}"
    mlflow = Path(sys.executable).parent / "mlflow"
    return [
        str(mlflow) if mlflow.exists() else "mlflow",
        "ui",
        "--backend-store-uri",
        uri,
        "--host",
        args.host,
        "--port",
        str(args.port),
    ]


def run(args: argparse.Namespace) -> int:
    cmd = command(args)
    if not _is_loopback(args.host):
        print(
            f"distmis: warning: binding {args.host}: MLflow's UI has no authentication unless its auth app is "
            "enabled (mlflow ui --app-name basic-auth); anyone who can reach this port can read and change runs",
            file=sys.stderr,
        )
    print(f"distmis: MLflow UI on http://{args.host}:{args.port}  ({cmd[3]})", flush=True)
    os.execv(cmd[0], cmd)
    return 0  # not reached
