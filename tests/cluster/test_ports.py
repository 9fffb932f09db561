"""Port blocks: disjoint by construction, outside the ephemeral range, claimed exclusively per host."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from distmis.cluster.ports import (
    BLOCK_SIZE,
    OFFSETS,
    WORKERS_FROM,
    PortBlock,
    candidate_bases,
    claim_block,
    ephemeral_range,
    preferred_order,
    ray_start_arguments,
)


def test_every_port_of_a_block_is_distinct_and_inside_it() -> None:
    block = PortBlock(20000)
    components = [block.port(name) for name in OFFSETS]
    lo, hi = block.worker_range
    workers = set(range(lo, hi + 1))
    assert len(set(components)) == len(components)
    assert not workers & set(components)  # the overlap that failed a job cannot happen
    assert all(block.base <= p <= block.last for p in [*components, lo, hi])
    assert hi - lo + 1 == BLOCK_SIZE - WORKERS_FROM


@pytest.mark.parametrize("ephemeral", [(32768, 60999), (1024, 65535 - BLOCK_SIZE * 3), (49152, 65535), (20000, 30000)])
def test_blocks_never_touch_the_ephemeral_range(ephemeral: tuple[int, int]) -> None:
    bases = candidate_bases(ephemeral)
    assert bases, ephemeral
    for base in bases:
        last = base + BLOCK_SIZE - 1
        assert last < ephemeral[0] or base > ephemeral[1]
        assert base >= 20000 and last <= 65535
    # blocks do not overlap each other
    spans = sorted((b, b + BLOCK_SIZE - 1) for b in bases)
    assert all(a[1] < b[0] for a, b in zip(spans, spans[1:], strict=False))


def test_the_start_depends_on_job_and_node() -> None:
    bases = candidate_bases((32768, 60999))
    starts = {preferred_order(bases, str(job), node)[0] for job in range(1000, 1010) for node in range(2)}
    assert len(starts) > 5
    assert sorted(preferred_order(bases, "42", 0)) == bases


def test_every_component_gets_its_port(tmp_path: Path) -> None:
    block = PortBlock(candidate_bases(ephemeral_range())[0])
    args = ray_start_arguments(block, head=True)
    given = [int(a.split("=")[1]) for a in args]
    assert len(set(given)) == len(given) and all(block.base <= p <= block.last for p in given)
    assert not [a for a in args if a.endswith("=0")]  # nothing left to chance


def test_claims_are_exclusive_and_stale_ones_are_taken_over(tmp_path: Path) -> None:
    claims = tmp_path / "claims"
    first, claim1 = claim_block("7", 0, claims, host="127.0.0.1")
    second, claim2 = claim_block("7", 0, claims, host="127.0.0.1")  # same job and node: must not share
    assert first.base != second.base and claim1.exists() and claim2.exists()
    # a claim whose process is gone is free again
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    claim1.write_text(json.dumps({"pid": int(dead.stdout), "job": "old", "node_index": 0}))
    third, _ = claim_block("7", 0, claims, host="127.0.0.1")
    assert third.base == first.base


def test_a_port_in_use_moves_the_claim_to_another_block(tmp_path: Path) -> None:
    first, claim = claim_block("8", 1, tmp_path, host="127.0.0.1")
    claim.unlink()
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", first.port("node_manager")))
        busy.listen()
        again, _ = claim_block("8", 1, tmp_path, host="127.0.0.1")
    assert again.base != first.base
