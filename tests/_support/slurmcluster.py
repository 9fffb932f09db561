"""A real SLURM (Debian's slurm-wlm 22.05) with 2 simulated nodes on this host, for tests.

Follows ../shared/reference/slurm-on-one-host.md: one munged, one slurmctld and one
``slurmd -N nX`` per node, every node with its own loopback address (127.0.0.11, .12, ...)
because Ray rewrites 127.0.0.1. Everything lives under one directory and is stopped by
process group; nothing else on the host is touched.
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import time
from pathlib import Path

from _support.raycluster import free_port, stop_group


def available() -> bool:
    return all(shutil.which(b) for b in ("slurmctld", "slurmd", "munged", "sbatch", "scontrol"))


class SlurmCluster:
    def __init__(self, root: Path, nodes: int = 2, cpus: int = 2) -> None:
        self.root = root
        self.names = [f"n{i + 1}" for i in range(nodes)]
        self.addrs = [f"127.0.0.{11 + i}" for i in range(nodes)]
        self.procs: list[subprocess.Popen] = []
        host = socket.gethostname().split(".")[0]
        for sub in ("state", "log", "munge", "spool"):
            (root / sub).mkdir(parents=True, exist_ok=True)
        (root / "munge").chmod(0o755)
        key = root / "munge" / "munge.key"
        key.write_bytes(secrets.token_bytes(1024))
        key.chmod(0o400)
        self.socket = root / "munge" / "munge.socket.2"
        ctld_port = free_port()
        node_lines = "\n".join(
            f"NodeName={n} NodeHostname={host} NodeAddr={a} Port={free_port()} CPUs={cpus} RealMemory=4000 State=UNKNOWN"
            for n, a in zip(self.names, self.addrs, strict=False)
        )
        self.conf = root / "slurm.conf"
        self.conf.write_text(f"""ClusterName=distmis
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={self.socket}
CredType=cred/munge
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool/%n
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd-%n.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SchedulerParameters=batch_sched_delay=0
MailProg=/bin/true
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc={root}/log/jobcomp.txt
MinJobAge=600
KillWait=5
ReturnToService=2
{node_lines}
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
""")
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}

    def _spawn(self, cmd: list[str], name: str) -> None:
        log = open(self.root / "log" / f"{name}.out", "w")
        self.procs.append(
            subprocess.Popen(cmd, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        )

    def start(self, timeout: float = 60) -> SlurmCluster:
        self._spawn(
            [
                "munged",
                "-f",
                "-F",
                f"--key-file={self.root / 'munge' / 'munge.key'}",
                f"--socket={self.socket}",
                f"--pid-file={self.root / 'munge' / 'munged.pid'}",
                f"--log-file={self.root / 'log' / 'munged.log'}",
                f"--seed-file={self.root / 'munge' / 'munged.seed'}",
            ],
            "munged",
        )
        self._wait(lambda: self.socket.exists(), "munged socket", timeout)
        self._spawn(["slurmctld", "-D", "-i", "-f", str(self.conf)], "slurmctld")
        for n in self.names:
            self._spawn(["slurmd", "-D", "-N", n, "-f", str(self.conf)], f"slurmd-{n}")
        self._wait(lambda: self.idle_nodes() == len(self.names), "all nodes idle", timeout)
        return self

    def idle_nodes(self) -> int:
        out = subprocess.run(["sinfo", "-h", "-o", "%t %D"], env=self.env, capture_output=True, text=True)
        return sum(int(line.split()[1]) for line in out.stdout.splitlines() if line.split()[0] == "idle")

    def _wait(self, cond, what: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if cond():
                return
            time.sleep(0.2)
        self.stop()
        raise TimeoutError(f"SLURM test cluster: no {what} after {timeout}s; logs in {self.root / 'log'}")

    def sbatch(self, script: Path) -> str:
        out = subprocess.run(
            ["sbatch", "--parsable", str(script)], env=self.env, capture_output=True, text=True, check=True
        )
        return out.stdout.strip().split(";")[0]

    def job_state(self, job_id: str) -> tuple[str, str]:
        out = subprocess.run(["scontrol", "show", "job", job_id, "-o"], env=self.env, capture_output=True, text=True)
        fields = dict(kv.split("=", 1) for kv in out.stdout.split() if "=" in kv)
        return fields.get("JobState", "UNKNOWN"), fields.get("ExitCode", "")

    def wait_job(self, job_id: str, timeout: float) -> tuple[str, str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            state, code = self.job_state(job_id)
            if state in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"):
                return state, code
            time.sleep(0.5)
        subprocess.run(["scancel", job_id], env=self.env)
        raise TimeoutError(f"job {job_id} still {self.job_state(job_id)} after {timeout}s")

    def stop(self) -> None:
        for p in reversed(self.procs):
            stop_group(p, timeout=10)
        self.procs = []
