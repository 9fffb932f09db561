"""Bring up a Ray cluster inside a SLURM allocation, run one command on it, tear it down.

Run once per node (``srun --ntasks-per-node=1 python -m distmis.cluster.slurm -- CMD ...``).
Node 0 of ``scontrol show hostnames`` is the head: it claims its port block (see
:mod:`distmis.cluster.ports`), writes the ports with a per-job auth token into the job
directory on the shared filesystem (atomically), starts Ray, waits (bounded) until every node
has joined *with every CPU and GPU it was given*, writes ``cluster.json`` and runs CMD with
``RAY_ADDRESS`` set. The other nodes claim their own block, poll for the ports file and the
head's health (bounded), join (again, on a new block, if their Ray exits while the head is
up), and leave when the head says the job is done.

Wall time: the job script turns SLURM's warning signal into a ``stop-requested`` file in the
job directory (a signal sent through ``srun`` would reach every process of the step, Ray's
too, and SIGUSR1 kills them); the head watches for it and sends ``SIGUSR1`` to CMD alone
(``distmis tune`` checkpoints and exits with 75, "interrupted, resumable"). A ``SIGUSR1`` sent
to the head's bootstrap directly does the same. A requeued job (``SLURM_RESTART_COUNT`` > 0) ignores every file the previous
run left: each is tagged with the restart it belongs to.

What the job script must get right: no fixed port and no port drawn by
chance (see :mod:`distmis.cluster.ports`), no ``sleep`` as synchronisation (every wait is a
bounded poll that names the node, address and port it waited for), a short node-local temp
dir (AF_UNIX paths are limited to 107 bytes), a token per job instead of ``~/.ray/auth_token``,
and cleanup that stops only this job's Ray (by process group; never ``ray stop``, which kills
every Ray on the node) on exit and on SIGTERM.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from distmis.cluster.ports import PortBlock, claim_block, ray_start_arguments, release_block
from distmis.cluster.processes import ray_start_env, stop_process_group
from distmis.exceptions import ClusterError
from distmis.exitcodes import USAGE
from distmis.files import ensure_directory, open_nofollow, write_json_atomic, write_secret, write_text_atomic
from distmis.redact import redact_argv

PORTS_FILE = "ray-ports.json"
TOKEN_FILE = "ray-auth-token"
DONE_FILE = "ray-done"
CLUSTER_FILE = "cluster.json"
STOP_FILE = "stop-requested"
NODES_DIR = "nodes"
#: how many times a worker node whose Ray exits while the head is up joins again
RAY_RESTARTS = 3


def log(msg: str) -> None:
    node = os.environ.get("SLURMD_NODENAME", socket.gethostname())
    print(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} [distmis.cluster {node}] {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- SLURM facts
def hostnames(nodelist: str) -> list[str]:
    out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, check=True)
    return out.stdout.split()


def node_address(nodename: str, interface: str | None = None) -> str:
    """This node's IPv4 address: ``--interface``'s, else SLURM's NodeAddr, else the resolved hostname."""
    if interface:
        out = subprocess.run(["ip", "-4", "-o", "addr", "show", "dev", interface], capture_output=True, text=True)
        match = re.search(r"inet (\d+\.\d+\.\d+\.\d+)", out.stdout)
        if not match:
            raise ClusterError(f"--interface {interface}: no IPv4 address on this node")
        return match.group(1)
    out = subprocess.run(["scontrol", "show", "node", nodename, "-o"], capture_output=True, text=True)
    match = re.search(r"NodeAddr=(\S+)", out.stdout)
    if match:
        try:
            return str(ipaddress.IPv4Address(match.group(1)))
        except ValueError:
            nodename = match.group(1)
    infos = socket.getaddrinfo(nodename, None, socket.AF_INET)
    return str(infos[0][4][0])


def node_resources(env: dict[str, str] | None = None) -> tuple[int, int]:
    """CPUs and GPUs SLURM gave this node's task."""
    env = env or dict(os.environ)
    cpus = int(env.get("SLURM_CPUS_ON_NODE") or env.get("SLURM_CPUS_PER_TASK") or os.cpu_count() or 1)
    gpus = env.get("SLURM_GPUS_ON_NODE")
    if gpus is None:
        tres = env.get("SLURM_TRES_PER_TASK", "") + "," + env.get("SLURM_GPUS_PER_NODE", "")
        match = re.search(r"gpu(?::[\w-]+)?[:=](\d+)", tres)
        gpus = match.group(1) if match else "0"
    return cpus, int(gpus)


# --------------------------------------------------------------------------- waiting
def wait_until(check, what: str, timeout: float, interval: float = 0.5) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(interval)
    raise ClusterError(f"timed out after {timeout:.0f} s waiting for {what}")


def ray_bin() -> str:
    candidate = Path(sys.executable).parent / "ray"
    return str(candidate) if candidate.exists() else "ray"


def healthy(address: str, env: dict[str, str]) -> bool:
    return (
        subprocess.run(
            [ray_bin(), "health-check", "--address", address],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        ).returncode
        == 0
    )


# --------------------------------------------------------------------------- the bootstrap
class Bootstrap:
    def __init__(self, args: argparse.Namespace) -> None:
        self.job = os.environ.get("SLURM_JOB_ID", "local")
        self.restart = int(os.environ.get("SLURM_RESTART_COUNT") or 0)
        self.nodename = os.environ.get("SLURMD_NODENAME", socket.gethostname())
        self.nodes = (
            hostnames(os.environ["SLURM_JOB_NODELIST"]) if os.environ.get("SLURM_JOB_NODELIST") else [self.nodename]
        )
        self.index = self.nodes.index(self.nodename)
        self.is_head = self.index == 0
        self.job_dir = Path(args.job_dir or f"runs/slurm-{self.job}").resolve()
        ensure_directory(self.job_dir, what="job directory")
        self.ip = node_address(self.nodename, args.interface)
        self.cpus, self.gpus = node_resources()
        self.timeout = args.timeout
        # short and node-local: Ray's AF_UNIX socket paths must stay under 107 bytes
        self.temp_dir = Path(args.temp_root) / f"dm-{self.job}-{self.index}"
        self.claims_dir = Path(args.temp_root) / "distmis-port-claims"
        self.ray_proc: subprocess.Popen | None = None
        self.block: PortBlock | None = None
        self._claim: Path | None = None
        self.child: subprocess.Popen | None = None
        self.stop_forwarded = False
        self.env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(self.job_dir / TOKEN_FILE)}
        self.env.pop("RAY_ADDRESS", None)

    # -- lifecycle
    def stop_ray(self, graceful: bool = True) -> None:
        """Stop this node's Ray of this job only (its process group), release the port block,
        remove the temp dir. ``graceful=False`` (on SIGTERM from SLURM) kills at once: SLURM
        sends SIGKILL after ``KillWait`` seconds, and Ray started in its own session would
        outlive this process."""
        proc, self.ray_proc = self.ray_proc, None
        if proc is not None:
            sent = stop_process_group(proc, graceful=graceful)
            if graceful and sent == signal.SIGKILL:
                log("Ray did not stop on SIGTERM within the grace period: killed")
            elif sent is not None:
                log(f"Ray stopped ({sent.name})")
        release_block(self._claim)
        self._claim = None
        shutil.rmtree(self.temp_dir, ignore_errors=True)

    def _claim_ports(self) -> PortBlock:
        self.block, self._claim = claim_block(self.job, self.index, self.claims_dir)
        return self.block

    def _start_ray(self, args: list[str]) -> None:
        self.temp_dir.mkdir(parents=True, exist_ok=True)
        cmd = [
            ray_bin(),
            "start",
            "--block",
            f"--node-ip-address={self.ip}",
            f"--num-cpus={self.cpus}",
            f"--num-gpus={self.gpus}",
            f"--temp-dir={self.temp_dir}",
            "--disable-usage-stats",
            *args,
        ]
        log(f"starting Ray: {' '.join(cmd)}")
        with open_nofollow(
            self.job_dir / f"ray-{self.nodename}.log", "a"
        ) as logf:  # the child keeps its own descriptor
            self.ray_proc = subprocess.Popen(
                cmd, env=ray_start_env(self.env), stdout=logf, stderr=subprocess.STDOUT, start_new_session=True
            )

    def _node_record(self) -> dict[str, Any]:
        assert self.block is not None
        return {
            "node": self.nodename,
            "ip": self.ip,
            "cpus": self.cpus,
            "gpus": self.gpus,
            "restart": self.restart,
            "ports": self.block.as_dict(),
        }

    def request_stop(self) -> None:
        """Forward the wall-time warning to the command (once): it checkpoints and exits."""
        if self.child is not None and self.child.poll() is None and not self.stop_forwarded:
            log("wall time near: asking the command to checkpoint and stop (SIGUSR1)")
            self.child.send_signal(signal.SIGUSR1)
            self.stop_forwarded = True

    # -- head
    def _clean_previous_run(self) -> None:
        """A requeued job reuses the job directory: nothing from the previous run may be read."""
        for name in (PORTS_FILE, DONE_FILE, CLUSTER_FILE, STOP_FILE):
            (self.job_dir / name).unlink(missing_ok=True)
        nodes = self.job_dir / NODES_DIR
        if nodes.is_dir():
            for stale in nodes.glob("*.json"):
                try:
                    if json.loads(stale.read_text()).get("restart") != self.restart:
                        stale.unlink()
                except (OSError, ValueError):
                    stale.unlink(missing_ok=True)

    def run_head(self, command: list[str]) -> int:
        self._clean_previous_run()
        write_secret(self.job_dir / TOKEN_FILE, secrets.token_hex(32))
        block = self._claim_ports()
        self._start_ray(["--head", "--dashboard-host=127.0.0.1", *ray_start_arguments(block, head=True)])
        address = f"{self.ip}:{block.port('gcs')}"
        try:
            wait_until(
                lambda: self.ray_proc is not None and self.ray_proc.poll() is None and healthy(address, self.env),
                f"the Ray head on {self.nodename} at {address} to be healthy "
                f"(log: {self.job_dir / f'ray-{self.nodename}.log'})",
                self.timeout,
            )
        except ClusterError:
            if self.ray_proc is not None and self.ray_proc.poll() is not None:
                raise ClusterError(
                    f"Ray head on {self.nodename} exited with {self.ray_proc.returncode}; see "
                    f"{self.job_dir / f'ray-{self.nodename}.log'}"
                ) from None
            raise
        write_json_atomic(
            self.job_dir / PORTS_FILE,
            {"job": self.job, "restart": self.restart, "head": self.nodename, "head_ip": self.ip, **block.as_dict()},
        )
        self._wait_for_every_node(address)
        ports = block.as_dict()
        info = {
            "job_id": self.job,
            "restart": self.restart,
            "nodes": self.nodes,
            "head_node": self.nodename,
            "head_ip": self.ip,
            "ray_address": address,
            "dashboard_url": f"http://127.0.0.1:{ports['dashboard']} (on {self.nodename})",
            "dashboard_port": ports["dashboard"],
            "token_path": str(self.job_dir / TOKEN_FILE),
            "ports": ports,
            "cpus_per_node": self.cpus,
            "gpus_per_node": self.gpus,
            "tunnel": f"ssh -N -L 8265:127.0.0.1:{ports['dashboard']} {self.nodename}",
            "submit": (
                f"RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH={self.job_dir / TOKEN_FILE} "
                "ray job submit --address http://127.0.0.1:8265 -- distmis tune my_space.yaml"
            ),
        }
        write_json_atomic(self.job_dir / CLUSTER_FILE, info)
        log(f"Ray cluster up: {len(self.nodes)} nodes, {address}; see {self.job_dir / CLUSTER_FILE}")
        if not command:
            return 0
        log(f"running: {' '.join(redact_argv(command))}")
        self.child = subprocess.Popen(command, env={**self.env, "RAY_ADDRESS": address})
        stop_file = self.job_dir / STOP_FILE
        while self.child.poll() is None:
            if stop_file.exists():
                self.request_stop()
            time.sleep(0.5)
        return self.child.returncode

    def _wait_for_every_node(self, address: str) -> None:
        """Bounded wait until every node is alive in Ray with the CPUs and GPUs SLURM gave it."""
        expected = {
            "head": {"node": self.nodename, "ip": self.ip, "cpus": self.cpus, "gpus": self.gpus},
            "workers": self.nodes[1:],
        }
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "distmis.cluster.readiness",  # its own process: the bootstrap never becomes a Ray driver
                address,
                str(self.job_dir / NODES_DIR),
                json.dumps(expected),
                str(self.timeout),
                str(self.restart),
            ],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=self.timeout + 120,
        )
        try:
            state = json.loads(out.stdout.strip().splitlines()[-1])
        except (IndexError, ValueError):
            raise ClusterError(f"could not read the Ray cluster at {address}: {out.stderr.strip()[-500:]}") from None
        if state["ready"]:
            return
        problems = []
        if state["missing_registrations"]:
            problems.append(
                f"never started: {state['missing_registrations']} (check their srun output and "
                f"{self.job_dir / NODES_DIR})"
            )
        if state["not_alive"]:
            problems.append(f"registered but not alive in Ray: {state['not_alive']}")
        if state["short"]:
            problems.append(f"missing resources: {state['short']}")
        raise ClusterError(
            f"timed out after {self.timeout:.0f} s waiting for all {len(self.nodes)} nodes to join the Ray head "
            f"{self.nodename} at {address} with their CPUs and GPUs; alive: {state['alive']}; " + "; ".join(problems)
        )

    # -- worker
    def run_worker(self) -> int:
        ports_file = self.job_dir / PORTS_FILE

        def current_ports() -> dict[str, Any] | None:
            try:
                data = json.loads(ports_file.read_text())
            except (OSError, ValueError):
                return None
            return data if data.get("restart") == self.restart else None  # never the previous run's

        wait_until(lambda: current_ports() is not None, f"{ports_file} from head node {self.nodes[0]}", self.timeout)
        ports = current_ports()
        assert ports is not None
        address = f"{ports['head_ip']}:{ports['gcs']}"
        wait_until(lambda: healthy(address, self.env), f"the Ray head {ports['head']} at {address}", self.timeout)
        self._join(address)
        # stay until the head says this run is done, or the head is gone for good
        last_ok = time.monotonic()
        restarts = 0
        while not self._done():
            if self.ray_proc is not None and self.ray_proc.poll() is not None and not self._done():
                code = self.ray_proc.returncode
                if restarts >= RAY_RESTARTS or not healthy(address, self.env):
                    raise ClusterError(
                        f"Ray on {self.nodename} exited with {code}"
                        f"{f' after {restarts} restart(s)' if restarts else ''}; see "
                        f"{self.job_dir / f'ray-{self.nodename}.log'}"
                    )
                restarts += 1
                log(f"Ray on {self.nodename} exited with {code}: joining again ({restarts} of {RAY_RESTARTS})")
                self._join(address, again=True)
            if healthy(address, self.env):
                last_ok = time.monotonic()
            elif time.monotonic() - last_ok > 60:
                log(f"head {address} unreachable for 60 s: leaving")
                break
            time.sleep(2)
        return 0

    def _join(self, address: str, *, again: bool = False) -> None:
        """Start this node's Ray on a port block of its own and join the head at ``address``.

        ``again``: the node's Ray exited (its raylet died, or a port of its block was taken
        between the claim and the start): what is left of it is stopped and it joins on
        another block (the old one is held until the new one is claimed, so it is not drawn
        again), instead of leaving the job one node short for the rest of its wall time.
        """
        old_claim = None
        if again:
            if self.ray_proc is not None:
                stop_process_group(self.ray_proc, graceful=False)
            old_claim, self._claim = self._claim, None
        block = self._claim_ports()
        release_block(old_claim)
        self._start_ray([f"--address={address}", *ray_start_arguments(block, head=False)])
        write_json_atomic(self.job_dir / NODES_DIR / f"{self.nodename}.json", self._node_record())

    def _done(self) -> bool:
        try:
            return int((self.job_dir / DONE_FILE).read_text().strip() or -1) == self.restart
        except (OSError, ValueError):
            return False

    def mark_done(self) -> None:
        write_text_atomic(self.job_dir / DONE_FILE, f"{self.restart}\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m distmis.cluster.slurm",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument(
        "--job-dir",
        default=None,
        help="shared directory for ports, token, cluster.json (default runs/slurm-$SLURM_JOB_ID)",
    )
    ap.add_argument(
        "--interface", default=None, help="network interface whose IPv4 address Ray uses (default: SLURM's NodeAddr)"
    )
    ap.add_argument("--timeout", type=float, default=300, help="bound of every wait in seconds (default 300)")
    ap.add_argument("--temp-root", default="/tmp", help="node-local root of Ray's short temp dir")
    argv = list(sys.argv[1:] if argv is None else argv)
    command: list[str] = []
    if "--" in argv:  # -- CMD ...: run on the head once the cluster is up
        cut = argv.index("--")
        argv, command = argv[:cut], argv[cut + 1 :]
    args = ap.parse_args(argv)
    boot: Bootstrap | None = None

    def on_term(signum: int, _frame: Any) -> None:
        log(f"signal {signum}: stopping this job's Ray on this node")
        child = boot.child if boot is not None else None
        if child is not None and child.poll() is None:
            child.send_signal(signal.SIGTERM)  # the search stops; its state was saved seconds ago
            try:
                child.wait(timeout=60)
            except subprocess.TimeoutExpired:
                child.kill()
        if boot is not None:
            boot.stop_ray(graceful=False)
        sys.exit(128 + signum)

    def on_usr1(_signum: int, _frame: Any) -> None:
        if boot is not None and boot.is_head:
            boot.request_stop()  # workers ignore it and keep Ray up until the head is done

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    signal.signal(signal.SIGUSR1, on_usr1)
    if os.environ.get("SLURM_LOCALID", "0") != "0":
        log("error: more than one task on this node; run the bootstrap with --ntasks-per-node=1")
        return USAGE
    try:
        boot = Bootstrap(args)
        code = boot.run_head(command) if boot.is_head else boot.run_worker()
        if boot.is_head:
            boot.mark_done()
        return code
    except ClusterError as exc:
        log(f"error: {exc}")
        if boot is not None and boot.is_head:
            boot.mark_done()
        return USAGE
    finally:
        if boot is not None:
            boot.stop_ray()


if __name__ == "__main__":
    sys.exit(main())
