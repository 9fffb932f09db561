"""Wait until every node of a SLURM job's Ray cluster is alive with all its CPUs and GPUs.

Run as its own process by the bootstrap (``python -m distmis.cluster.readiness ADDRESS NODES_DIR
EXPECTED TIMEOUT RESTART``), because connecting to Ray makes a process a Ray driver, and the
bootstrap must stay the process that starts and stops Ray, not one of its clients. Prints one JSON
line (``ready`` and what is missing) and exits 0 when ready, 1 at the deadline.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from distmis.waits import retried_until


def registered_nodes(nodes_dir: Path, restart: int) -> dict[str, dict[str, Any]]:
    """The worker nodes that wrote their registration for this start of the job."""
    registered = {}
    for path in nodes_dir.glob("*.json"):
        try:
            registration = json.loads(path.read_text())
        except ValueError:
            continue  # a registration being written
        if registration.get("restart") == restart:
            registered[registration["node"]] = registration
    return registered


def cluster_state(
    expected: dict[str, Any], registered: dict[str, dict[str, Any]], alive: dict[str, dict[str, float]]
) -> dict[str, Any]:
    """What keeps the cluster from being ready: unregistered workers, nodes not alive, resources short."""
    want = [expected["head"], *[registered[n] for n in expected["workers"] if n in registered]]
    short = [
        f"{w['node']} ({w['ip']}): {k} {alive[w['ip']].get(k, 0):g} of {w[k.lower() + 's']}"
        for w in want
        if w["ip"] in alive
        for k in ("CPU", "GPU")
        if alive[w["ip"]].get(k, 0) + 1e-9 < w[k.lower() + "s"]
    ]
    state = {
        "missing_registrations": [n for n in expected["workers"] if n not in registered],
        "not_alive": [f"{w['node']} ({w['ip']})" for w in want if w["ip"] not in alive],
        "short": short,
        "alive": sorted(alive),
    }
    return {"ready": not state["missing_registrations"] and not state["not_alive"] and not short, **state}


def connect(address: str, deadline: float) -> None:
    """Join the job's cluster as a driver, trying again until ``deadline``.

    ``ray health-check`` answers once the head's GCS does; a driver also needs the head's raylet
    registered there, and Ray gives that up after its own 60 s. On a busy node the raylet took
    longer, so one refusal must not fail a job that the deadline still allows.
    """
    import ray

    retried_until(
        max(0.0, deadline - time.monotonic()),
        lambda: ray.init(address=address, logging_level="error"),
        retry_on=ConnectionError,
        between=ray.shutdown,
        interval=1.0,
    )()


def main(argv: list[str] | None = None) -> int:
    import ray

    address, nodes_dir, expected_text, timeout, restart = argv or sys.argv[1:]
    expected = json.loads(expected_text)
    deadline = time.monotonic() + float(timeout)
    connect(address, deadline)
    while True:
        alive = {n["NodeManagerAddress"]: n["Resources"] for n in ray.nodes() if n["Alive"]}
        state = cluster_state(expected, registered_nodes(Path(nodes_dir), int(restart)), alive)
        if state["ready"] or time.monotonic() > deadline:
            print(json.dumps(state), flush=True)
            return 0 if state["ready"] else 1
        time.sleep(0.5)  # a poll of Ray's node table, bounded by the deadline above


if __name__ == "__main__":
    sys.exit(main())
