"""Ports of a per-job Ray cluster: one block per node, chosen once, where nothing else draws.

The first bootstrap drew every port independently (``bind(0)`` for each component, a random
free range for workers) from ranges that overlapped each other and the kernel's ephemeral
range. A node-manager port could then fall inside the worker range just checked and
released, and Ray refused to start (``worker_ports is trying to use a port number ... used
by other components``): a job failed by chance.

Here each node takes one contiguous block of :data:`BLOCK_SIZE` ports:

* **outside the ephemeral range** (``/proc/sys/net/ipv4/ip_local_port_range``): the kernel
  never hands those out for ``bind(0)`` or outgoing connections, and the ports Ray still picks
  itself come from there, so they cannot land in the block;
* **derived from the job id and node index**, so concurrent jobs start their search at
  different blocks;
* **claimed on the host** with an exclusive file under the node-local temp directory, so two
  jobs (or two simulated nodes on one host) can never take the same block even when they
  start in the same instant; a claim whose process is gone is taken over;
* **checked by binding** every port of the block before it is used.

Every component's port and the worker range are fixed offsets inside the block
(:data:`OFFSETS`): they cannot overlap by construction.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import socket
from dataclasses import dataclass
from pathlib import Path

from distmis.exceptions import ClusterError

#: component -> offset in the block; workers take the rest ([WORKERS_FROM, BLOCK_SIZE))
OFFSETS = {
    "gcs": 0,
    "dashboard": 1,
    "client": 2,
    "node_manager": 3,
    "object_manager": 4,
    "dashboard_agent_grpc": 5,
    "dashboard_agent_listen": 6,
    "runtime_env_agent": 7,
    "metrics_export": 8,
}
WORKERS_FROM = 16
#: 16 component slots + 496 worker ports: one per Ray worker process a node can hold at once
BLOCK_SIZE = 512
#: below this live well-known services and Ray's own defaults (6379, 8265, 10001, 10002-19999)
LOWEST_PORT = 20000
HIGHEST_PORT = 65535


@dataclass(frozen=True)
class PortBlock:
    """One node's block: ``base`` .. ``base + BLOCK_SIZE - 1``."""

    base: int
    size: int = BLOCK_SIZE

    def port(self, component: str) -> int:
        return self.base + OFFSETS[component]

    @property
    def worker_range(self) -> tuple[int, int]:
        return self.base + WORKERS_FROM, self.base + self.size - 1

    @property
    def last(self) -> int:
        return self.base + self.size - 1

    def as_dict(self) -> dict[str, int]:
        lo, hi = self.worker_range
        return {
            **{name: self.port(name) for name in OFFSETS},
            "min_worker": lo,
            "max_worker": hi,
            "block_first": self.base,
            "block_last": self.last,
            "block_size": self.size,
        }


def ephemeral_range(path: str = "/proc/sys/net/ipv4/ip_local_port_range") -> tuple[int, int]:
    """The kernel's ephemeral port range (Linux default 32768-60999 where unreadable)."""
    try:
        lo, hi = (int(x) for x in Path(path).read_text().split()[:2])
        return lo, hi
    except (OSError, ValueError):
        return 32768, 60999


def candidate_bases(ephemeral: tuple[int, int], size: int = BLOCK_SIZE) -> list[int]:
    """Every block start that lies wholly outside the ephemeral range (and above well-known ports)."""
    lo, hi = ephemeral
    bases = []
    for start, end in ((LOWEST_PORT, lo - 1), (hi + 1, HIGHEST_PORT)):
        base = start
        while base + size - 1 <= end:
            bases.append(base)
            base += size
    return bases


def preferred_order(bases: list[int], job: str, node_index: int) -> list[int]:
    """``bases`` rotated to start where the job id and node index hash to."""
    if not bases:
        return []
    digest = int(hashlib.sha256(f"{job}/{node_index}".encode()).hexdigest(), 16)
    first = digest % len(bases)
    return bases[first:] + bases[:first]


def block_is_free(block: PortBlock, host: str = "0.0.0.0") -> bool:
    """Every port of the block can be bound now (``0.0.0.0``: also free on every address)."""
    for port in range(block.base, block.last + 1):
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                return False
    return True


def _claim_alive(path: Path) -> bool:
    try:
        pid = int(json.loads(path.read_text())["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def claim_block(
    job: str, node_index: int, claims_dir: Path, *, host: str = "0.0.0.0", ephemeral: tuple[int, int] | None = None
) -> tuple[PortBlock, Path]:
    """Claim a free block for this node: exclusive on the host, bind-checked.

    Returns the block and its claim file (remove it with :func:`release_block` when the node's
    Ray is stopped; a claim left by a dead process is taken over).

    Raises:
        ClusterError: no block is free (naming the ranges looked at).
    """
    ephemeral = ephemeral or ephemeral_range()
    bases = preferred_order(candidate_bases(ephemeral), job, node_index)
    claims_dir.mkdir(parents=True, exist_ok=True)
    record = json.dumps({"pid": os.getpid(), "job": job, "node_index": node_index})
    for base in bases:
        claim = claims_dir / f"ports-{base}.claim"
        try:
            fd = os.open(claim, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            if _claim_alive(claim):
                continue
            with contextlib.suppress(FileNotFoundError):
                claim.unlink()  # its owner is gone: the block is free to claim again
            try:
                fd = os.open(claim, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                continue  # someone else took it over first
        with os.fdopen(fd, "w") as fh:
            fh.write(record)
        block = PortBlock(base)
        if block_is_free(block, host):
            return block, claim
        claim.unlink(missing_ok=True)  # used by something that does not claim: try the next
    raise ClusterError(
        f"no free block of {BLOCK_SIZE} ports outside the ephemeral range {ephemeral[0]}-{ephemeral[1]} "
        f"(looked at {len(bases)} blocks in {LOWEST_PORT}-{ephemeral[0] - 1} and {ephemeral[1] + 1}-{HIGHEST_PORT})"
    )


def release_block(claim: Path | None) -> None:
    if claim is not None:
        with contextlib.suppress(FileNotFoundError):
            claim.unlink()


def ray_start_arguments(block: PortBlock, *, head: bool) -> list[str]:
    """``ray start`` options putting every component this node runs on its port in ``block``."""
    lo, hi = block.worker_range
    args = [
        f"--node-manager-port={block.port('node_manager')}",
        f"--object-manager-port={block.port('object_manager')}",
        f"--dashboard-agent-grpc-port={block.port('dashboard_agent_grpc')}",
        f"--dashboard-agent-listen-port={block.port('dashboard_agent_listen')}",
        f"--runtime-env-agent-port={block.port('runtime_env_agent')}",
        f"--metrics-export-port={block.port('metrics_export')}",
        f"--min-worker-port={lo}",
        f"--max-worker-port={hi}",
    ]
    if head:
        args += [
            f"--port={block.port('gcs')}",
            f"--dashboard-port={block.port('dashboard')}",
            f"--ray-client-server-port={block.port('client')}",
        ]
    return args


__all__ = [
    "BLOCK_SIZE",
    "OFFSETS",
    "WORKERS_FROM",
    "PortBlock",
    "block_is_free",
    "candidate_bases",
    "claim_block",
    "ephemeral_range",
    "preferred_order",
    "ray_start_arguments",
    "release_block",
]
