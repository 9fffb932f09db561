"""Bring up a Ray cluster inside a SLURM allocation, run one command on it, tear it down.

Run once per node (``srun --ntasks-per-node=1 python -m distmis.cluster.slurm -- CMD ...``).
Node 0 of ``scontrol show hostnames`` is the head; it chooses free ports for every head
component, writes them with a per-job auth token into the job directory on the shared
filesystem (atomically), starts Ray, waits (bounded) until every node has joined, writes
``cluster.json`` and runs CMD with ``RAY_ADDRESS`` set. The other nodes poll for the ports file
and the head's health (bounded), join, and leave when the head says the job is done.

What the prototype's script got wrong and this does not: no fixed port, no ``sleep`` as
synchronisation (every wait is a bounded poll that names the node, address and port it
waited for), a short node-local temp dir (AF_UNIX paths are limited to 107 bytes), a token
per job instead of ``~/.ray/auth_token``, and cleanup that stops only this job's Ray (by
process group; never ``ray stop``, which kills every Ray on the node) on exit and on SIGTERM.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import random
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

from distmis._fsutil import write_json_atomic
from distmis.exceptions import ClusterError

PORTS_FILE = "ray-ports.json"
TOKEN_FILE = "ray-auth-token"
DONE_FILE = "ray-done"
CLUSTER_FILE = "cluster.json"
DRIVER_RESOURCE = "trial_driver"


def log(msg: str) -> None:
    node = os.environ.get("SLURMD_NODENAME", socket.gethostname())
    print(f"[distmis.cluster {node}] {msg}", file=sys.stderr, flush=True)


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
    return infos[0][4][0]


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


# --------------------------------------------------------------------------- ports
def free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def free_port_range(host: str, size: int = 100) -> tuple[int, int]:
    """A block of ``size`` ports that are free right now (checked one by one)."""
    for _ in range(50):
        start = random.randint(20000, 60000 - size)
        try:
            for port in range(start, start + size):
                with socket.socket() as s:
                    s.bind((host, port))
            return start, start + size - 1
        except OSError:
            continue
    raise ClusterError(f"no block of {size} free ports on {host}")


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
    return subprocess.run([ray_bin(), "health-check", "--address", address], env=env,
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode == 0


def alive_nodes(address: str, env: dict[str, str]) -> list[str]:
    code = (f"import json, ray; ray.init(address='{address}', logging_level='error'); "
            "print(json.dumps([n['NodeManagerAddress'] for n in ray.nodes() if n['Alive']]))")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    try:
        return json.loads(out.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        return []


# --------------------------------------------------------------------------- the bootstrap
class Bootstrap:
    def __init__(self, args: argparse.Namespace) -> None:
        self.job = os.environ.get("SLURM_JOB_ID", "local")
        self.nodename = os.environ.get("SLURMD_NODENAME", socket.gethostname())
        self.nodes = hostnames(os.environ["SLURM_JOB_NODELIST"]) if os.environ.get("SLURM_JOB_NODELIST") else [self.nodename]
        self.is_head = self.nodename == self.nodes[0]
        self.job_dir = Path(args.job_dir or f"runs/slurm-{self.job}").resolve()
        self.job_dir.mkdir(parents=True, exist_ok=True)
        self.ip = node_address(self.nodename, args.interface)
        self.cpus, self.gpus = node_resources()
        self.timeout = args.timeout
        # short and node-local: Ray's AF_UNIX socket paths must stay under 107 bytes
        self.temp_dir = Path(args.temp_root) / f"dm-{self.job}-{self.nodes.index(self.nodename)}"
        self.ray_proc: subprocess.Popen | None = None
        self.env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(self.job_dir / TOKEN_FILE)}
        for key in ("RAY_ADDRESS",):
            self.env.pop(key, None)

    # -- lifecycle
    def stop_ray(self, graceful: bool = True) -> None:
        """Stop this node's Ray of this job only (its process group), then remove its temp dir.

        ``graceful=False`` (on SIGTERM from SLURM) kills at once: SLURM sends SIGKILL after
        ``KillWait`` seconds, and Ray started in its own session would outlive this process.
        """
        proc, self.ray_proc = self.ray_proc, None
        if proc is not None:
            steps = ((signal.SIGTERM, 20.0), (signal.SIGKILL, 10.0)) if graceful else ((signal.SIGKILL, 10.0),)
            for sig, wait in steps:
                try:
                    os.killpg(proc.pid, sig)
                except ProcessLookupError:
                    break
                deadline = time.monotonic() + wait
                while time.monotonic() < deadline and _group_alive(proc.pid):
                    proc.poll()
                    time.sleep(0.2)
                if not _group_alive(proc.pid):
                    break
        shutil.rmtree(self.temp_dir, ignore_errors=True)

    def _start_ray(self, args: list[str]) -> None:
        self.temp_dir.mkdir(parents=True, exist_ok=True)
        logf = open(self.job_dir / f"ray-{self.nodename}.log", "w")
        cmd = [ray_bin(), "start", "--block", f"--node-ip-address={self.ip}", f"--num-cpus={self.cpus}",
               f"--num-gpus={self.gpus}", f"--temp-dir={self.temp_dir}", "--disable-usage-stats", *args]
        log(f"starting Ray: {' '.join(cmd)}")
        self.ray_proc = subprocess.Popen(cmd, env=self.env, stdout=logf, stderr=subprocess.STDOUT, start_new_session=True)

    # -- head
    def run_head(self, command: list[str]) -> int:
        token = self.job_dir / TOKEN_FILE
        fd = os.open(token.with_suffix(".tmp"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(secrets.token_hex(32))
        os.replace(token.with_suffix(".tmp"), token)
        (self.job_dir / DONE_FILE).unlink(missing_ok=True)
        lo, hi = free_port_range(self.ip)
        ports = {"gcs": free_port(self.ip), "dashboard": free_port("127.0.0.1"), "client": free_port(self.ip),
                 "node_manager": free_port(self.ip), "object_manager": free_port(self.ip),
                 "min_worker": lo, "max_worker": hi}
        self._start_ray([
            "--head", f"--port={ports['gcs']}", "--dashboard-host=127.0.0.1", f"--dashboard-port={ports['dashboard']}",
            f"--ray-client-server-port={ports['client']}", f"--node-manager-port={ports['node_manager']}",
            f"--object-manager-port={ports['object_manager']}", f"--min-worker-port={lo}", f"--max-worker-port={hi}",
            "--dashboard-agent-listen-port=0", f"--resources={json.dumps({DRIVER_RESOURCE: 1000})}",
        ])
        address = f"{self.ip}:{ports['gcs']}"
        try:
            wait_until(lambda: self.ray_proc.poll() is None and healthy(address, self.env),
                       f"the Ray head on {self.nodename} at {address} to be healthy "
                       f"(log: {self.job_dir / f'ray-{self.nodename}.log'})", self.timeout)
        except ClusterError:
            if self.ray_proc.poll() is not None:
                raise ClusterError(f"Ray head on {self.nodename} exited with {self.ray_proc.returncode}; see "
                                   f"{self.job_dir / f'ray-{self.nodename}.log'}") from None
            raise
        write_json_atomic(self.job_dir / PORTS_FILE, {"job": self.job, "head": self.nodename, "head_ip": self.ip, **ports})
        joined = self.job_dir / "nodes"
        try:
            wait_until(lambda: len(alive_nodes(address, self.env)) >= len(self.nodes),
                       f"{len(self.nodes)} Ray nodes at {address}", self.timeout, interval=1.0)
        except ClusterError:
            seen = {p.stem for p in joined.glob("*.json")} if joined.is_dir() else set()
            missing = [n for n in self.nodes[1:] if n not in seen]
            raise ClusterError(
                f"timed out after {self.timeout:.0f} s waiting for all {len(self.nodes)} nodes to join the Ray head "
                f"{self.nodename} at {address}; alive: {alive_nodes(address, self.env)}; never started: "
                f"{missing or 'none'} (check their srun output and {joined})"
            ) from None
        info = {
            "job_id": self.job, "nodes": self.nodes, "head_node": self.nodename, "head_ip": self.ip,
            "ray_address": address, "dashboard_url": f"http://127.0.0.1:{ports['dashboard']} (on {self.nodename})",
            "dashboard_port": ports["dashboard"], "token_path": str(self.job_dir / TOKEN_FILE), "ports": ports,
            "cpus_per_node": self.cpus, "gpus_per_node": self.gpus,
            "tunnel": f"ssh -N -L 8265:127.0.0.1:{ports['dashboard']} {self.nodename}",
            "submit": (f"RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH={self.job_dir / TOKEN_FILE} "
                       "ray job submit --address http://127.0.0.1:8265 -- distmis tune my_space.yaml"),
        }
        write_json_atomic(self.job_dir / CLUSTER_FILE, info)
        log(f"Ray cluster up: {len(self.nodes)} nodes, {address}; see {self.job_dir / CLUSTER_FILE}")
        if not command:
            return 0
        env = {**self.env, "RAY_ADDRESS": address}
        log(f"running: {' '.join(command)}")
        child = subprocess.Popen(command, env=env)
        self._child = child
        return child.wait()

    # -- worker
    def run_worker(self) -> int:
        ports_file = self.job_dir / PORTS_FILE
        wait_until(ports_file.is_file, f"{ports_file} from head node {self.nodes[0]}", self.timeout)
        ports = json.loads(ports_file.read_text())
        address = f"{ports['head_ip']}:{ports['gcs']}"
        wait_until(lambda: healthy(address, self.env), f"the Ray head {ports['head']} at {address}", self.timeout)
        lo, hi = free_port_range(self.ip)
        self._start_ray([f"--address={address}", f"--node-manager-port={free_port(self.ip)}",
                         f"--object-manager-port={free_port(self.ip)}", f"--min-worker-port={lo}",
                         f"--max-worker-port={hi}", "--dashboard-agent-listen-port=0"])
        write_json_atomic(self.job_dir / "nodes" / f"{self.nodename}.json", {"node": self.nodename, "ip": self.ip})
        # stay until the head says the job is done, or the head is gone for good
        last_ok = time.monotonic()
        while not (self.job_dir / DONE_FILE).exists():
            if self.ray_proc is not None and self.ray_proc.poll() is not None:
                raise ClusterError(f"Ray on {self.nodename} exited with {self.ray_proc.returncode}; see "
                                   f"{self.job_dir / f'ray-{self.nodename}.log'}")
            if healthy(address, self.env):
                last_ok = time.monotonic()
            elif time.monotonic() - last_ok > 60:
                log(f"head {address} unreachable for 60 s: leaving")
                break
            time.sleep(2)
        return 0


def _group_alive(pgid: int) -> bool:
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == pgid and fields[0] != "Z":
                return True
    return False


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m distmis.cluster.slurm", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--job-dir", default=None, help="shared directory for ports, token, cluster.json (default runs/slurm-$SLURM_JOB_ID)")
    ap.add_argument("--interface", default=None, help="network interface whose IPv4 address Ray uses (default: SLURM's NodeAddr)")
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
        child = getattr(boot, "_child", None)
        if child is not None and child.poll() is None:
            child.send_signal(signal.SIGTERM)  # the search checkpoints; --resume continues it after a requeue
            try:
                child.wait(timeout=60)
            except subprocess.TimeoutExpired:
                child.kill()
        if boot is not None:
            boot.stop_ray(graceful=False)
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    if os.environ.get("SLURM_LOCALID", "0") != "0":
        log("error: more than one task on this node; run the bootstrap with --ntasks-per-node=1")
        return 2
    try:
        boot = Bootstrap(args)
        code = boot.run_head(command) if boot.is_head else boot.run_worker()
        if boot.is_head:
            (boot.job_dir / DONE_FILE).touch()
        return code
    except ClusterError as exc:
        log(f"error: {exc}")
        if boot is not None and boot.is_head:
            (boot.job_dir / DONE_FILE).touch()
        return 2
    finally:
        if boot is not None:
            boot.stop_ray()


if __name__ == "__main__":
    sys.exit(main())
