"""A real single-node Slurm on loopback only, for the Slurm test tier.

    slurm = LocalSlurm.create()        # or pytest.skip(LocalSlurm.unavailable())
    slurm.start()
    job = slurm.sbatch(["slurm/ex0_collectives.sbatch"], env=...)
    slurm.wait(job)                    # {'JobState': 'COMPLETED', 'ExitCode': '0:0', ...}
    slurm.stop()                       # scancel every job, stop every daemon by PID

Everything lives in one private folder and two network namespaces joined by a
veth pair and nothing else: the first (``lo`` and 10.67.0.1) holds slurmctld, a private munged with its own key and socket, and every client
command (run through ``nsenter --net``) and the node ``node1``; the second
(10.67.0.2) holds the node ``node2``, whose slurmd and jobs also have their own host name and /dev/shm, as a
second machine would. Nothing listens outside them, and two runs never meet.
``node1`` has 32 CPUs and 8 GPUs, ``node2`` 16 and 4, faked through GRES
(``/dev/tty0..7``), so jobs that ask for GPUs are accepted (a job asking for 4 sees
``CUDA_VISIBLE_DEVICES=0,1,2,3``) and two 4-GPU jobs can run at once. Partition
``gpu`` (the default) is ``node1`` alone; ``two`` is both nodes; ``far`` is ``node2`` alone
(whose jobs cannot reach a controller on the first namespace's loopback, as compute nodes cannot
reach a firewalled login node).

Needs root and Slurm's Debian packages; ``install()`` runs ``apt-get install -y
slurm-wlm munge`` only when ``slurmctld``/``slurmd``/``munged`` are missing.
Run by hand: ``python -m tests.slurm_local`` starts one and prints how to use
it, and stops it on Enter.
"""
from __future__ import annotations

import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

PACKAGES = ["slurm-wlm", "munge"]
DAEMONS = ["slurmctld", "slurmd", "munged", "sbatch"]
GPUS = 8

SLURM_CONF = """\
ClusterName=hpclab
FirstJobId={first_job_id}
SlurmctldHost=localhost({addr1})
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={root}/munge/munge.socket
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool/%n
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd-%n.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
ReturnToService=2
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
GresTypes=gpu
MinJobAge=600
KillWait=5
SlurmdTimeout=10
InactiveLimit=0
NodeName=node1 NodeAddr={addr1} CPUs=32 RealMemory=20000 Gres=gpu:{gpus1} State=UNKNOWN
NodeName=node2 NodeAddr={addr2} CPUs=16 RealMemory=10000 Gres=gpu:{gpus2} State=UNKNOWN
PartitionName=gpu Nodes=node1 Default=YES MaxTime=INFINITE State=UP
PartitionName=two Nodes=node1,node2 MaxTime=INFINITE State=UP
PartitionName=far Nodes=node2 MaxTime=INFINITE State=UP
"""

GRES_CONF = """\
AutoDetect=off
NodeName=node1 Name=gpu File={files1}
NodeName=node2 Name=gpu File={files2}
"""
ADDR1, ADDR2 = "10.67.0.1", "10.67.0.2"
TASK_PROLOG = """#!/bin/sh
if [ "$(hostname)" = node2 ] && [ -n "${{CUDA_VISIBLE_DEVICES:-}}" ]; then
    echo "export CUDA_VISIBLE_DEVICES=$(echo "$CUDA_VISIBLE_DEVICES" | awk -F, '{{for (i = 1; i <= NF; i++) printf "%s%d", (i > 1 ? "," : ""), $i + {offset}}}')"
fi
"""


class SlurmUnavailable(RuntimeError):
    """This machine cannot run the local Slurm (the reason is the message)."""


def unavailable() -> str | None:
    """Why a local Slurm cannot run here (one line), or None when it can."""
    if os.environ.get("HPCLAB_SLURM_TIER", "1") == "0":
        return "the Slurm tier is turned off here (HPCLAB_SLURM_TIER=0, e.g. by make test-gpu on a GPU node)"
    if not sys.platform.startswith("linux"):
        return f"the Slurm tier needs Linux (this is {sys.platform})"
    if os.geteuid() != 0:
        return "the Slurm tier needs root (it runs slurmctld, slurmd and munged in a network namespace)"
    for tool in ("ip", "nsenter"):
        if not shutil.which(tool):
            return f"the Slurm tier needs `{tool}` (iproute2 / util-linux)"
    if not _installed() and not shutil.which("apt-get"):
        return "Slurm is not installed and there is no apt-get to install slurm-wlm and munge"
    return None


def _installed() -> bool:
    return all(shutil.which(d) or os.path.exists(f"/usr/sbin/{d}") for d in DAEMONS)


def install(timeout: float = 600) -> str:
    """Install slurm-wlm and munge with apt-get unless they are there; says what it did."""
    if _installed():
        return "Slurm already installed"
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    t0 = time.monotonic()
    for cmd in (["apt-get", "update", "-q"],
                ["apt-get", "install", "-y", "-q", "--no-install-recommends", *PACKAGES]):
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
        if proc.returncode != 0:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
            raise SlurmUnavailable(f"`{' '.join(cmd)}` failed ({proc.returncode}): {tail[0]}")
    if not _installed():
        raise SlurmUnavailable(f"apt-get installed {' '.join(PACKAGES)} but {DAEMONS} are not all there")
    return f"installed {' '.join(PACKAGES)} in {time.monotonic() - t0:.0f} s"


def version() -> str:
    return subprocess.run(["sinfo", "--version"], capture_output=True, text=True).stdout.strip()


def real_gpus() -> int:
    """The NVIDIA GPUs of this machine (/dev/nvidia0, 1, ...), 0 without any."""
    return len([d for d in os.listdir("/dev") if re.fullmatch(r"nvidia\d+", d)]) if os.path.isdir("/dev") else 0


class LocalSlurm:
    def __init__(self, root: Path, netns: str, gpus: int = 0):
        self.root, self.gpus = root, gpus
        # With real GPUs only: where this machine cannot make network namespaces, one node on its own loopback
        # (two slurmd cannot share one network), and without PID namespaces if it cannot make those either.
        self.host = self.two_nodes_why = ""
        self.netns, self.netns2 = netns, f"{netns}-n2"
        self.conf = root / "slurm.conf"
        self.procs: dict[str, subprocess.Popen] = {}

    @classmethod
    def create(cls, gpus: int = 0) -> "LocalSlurm":
        """With ``gpus``, the machine's real GPUs as GRES: node1 has all of them and node2 the second half of
        them again (two "nodes" of one machine: a two-node job takes node1's first half and node2's half,
        distinct GPUs, as long as nothing else runs)."""
        root = Path(tempfile.mkdtemp(prefix="hpclab-slurm-"))
        return cls(root, f"hpclab-slurm-{os.getpid()}", gpus)

    # ------------------------------------------------------------ running commands in the namespace
    def env(self, **extra) -> dict:
        e = dict(os.environ)
        for k in [k for k in e if k.startswith(("SLURM_", "SBATCH_", "SRUN_"))]:
            del e[k]  # a test run inside someone's allocation must not leak into ours
        e["SLURM_CONF"] = str(self.conf)
        # The two nodes share a kernel (one boot id), so UCX, the mpich wheel's default network layer, takes
        # them for one machine and tries shared memory or loopback between them, which their separate /dev/shm
        # and PIDs refuse (and a second MPI step of a job then sends Slurm's PMI2 garbage). Between nodes the
        # ranks use the wheel's other network layer, libfabric's TCP on eth0, as between machines (within a
        # node MPICH uses its own shared memory either way).
        e.update(MPIR_CVAR_CH4_NETMOD="ofi", FI_PROVIDER="tcp", FI_TCP_IFACE="eth0")
        e.update({k: str(v) for k, v in extra.items()})
        return e

    def wrap(self, cmd: list[str]) -> list[str]:
        """``cmd`` run inside the namespace (nsenter execs it: same PID)."""
        return cmd if self.host else ["nsenter", f"--net=/run/netns/{self.netns}", *cmd]

    def run(self, cmd: list[str], env: dict | None = None, timeout: float = 60, check: bool = False,
            **kwargs) -> subprocess.CompletedProcess:
        return subprocess.run(self.wrap(cmd), capture_output=True, text=True, timeout=timeout,
                              env=env or self.env(), check=check, **kwargs)

    def popen(self, cmd: list[str], env: dict | None = None, **kwargs) -> subprocess.Popen:
        return subprocess.Popen(self.wrap(cmd), env=env or self.env(), **kwargs)

    # ------------------------------------------------------------ start / stop
    def start(self, timeout: float = 90) -> None:
        try:
            try:
                self._network()
            except SlurmUnavailable as exc:
                if not self.gpus:
                    raise
                for netns in (self.netns, self.netns2):
                    self._sh_quiet(["ip", "netns", "del", netns])
                self.host, self.two_nodes_why = "127.0.0.1", f"this machine cannot make network namespaces ({exc})"
            self._munge()
            self._write_config()
            self._daemon("slurmctld", ["slurmctld", "-D", "-i", "-f", str(self.conf)])
            self._node1()
            if not self.host:
                # node2: another machine as far as its jobs can tell (network, host name, PIDs, /dev/shm)
                self._daemon("slurmd2", ["nsenter", f"--net=/run/netns/{self.netns2}", "unshare", "--pid", "--fork",
                                         "--mount-proc", "--uts", "--kill-child=SIGTERM", "sh", "-c",
                                         "hostname node2 && mount -t tmpfs tmpfs /dev/shm && exec slurmd -D -N node2 "
                                         f"-f {self.conf}"])
            self._wait_idle(timeout)
        except BaseException:
            self.stop()
            raise

    def _node1(self) -> None:
        # slurmd and its jobs get their own PID namespace, as on a compute node: PIDs written by a
        # job (ipyparallel's cluster file) mean nothing to the login side, as on a real cluster.
        pid_ns = ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child=SIGTERM"]
        if self.host and subprocess.run([*pid_ns, "true"], capture_output=True).returncode != 0:
            pid_ns = []
        self._daemon("slurmd", [*pid_ns, "slurmd", "-D", "-N", "node1", "-f", str(self.conf)])

    def _sh_quiet(self, cmd: list[str]) -> None:
        subprocess.run(cmd, capture_output=True, timeout=30)

    def lose_node1(self) -> None:
        """node1 dies as a machine does: slurmd and every process of its jobs end at once (SIGKILL to the init of
        its PID namespace); slurmctld marks it DOWN and its jobs NODE_FAIL after SlurmdTimeout."""
        proc = self.procs.pop("slurmd")
        top = psutil.Process(proc.pid)
        for process in [*top.children(recursive=True), top]:
            try:
                process.kill()
            except psutil.NoSuchProcess:
                pass
        proc.wait(timeout=15)

    def restore_node1(self, timeout: float = 120) -> None:
        """node1 back: a new slurmd registers, and ReturnToService=2 puts it back in service."""
        self._node1()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            state = self.run(["sinfo", "-h", "-n", "node1", "-o", "%t"], timeout=20).stdout.strip()
            if state in ("idle", "mix", "alloc"):
                return
            time.sleep(1)
        raise SlurmUnavailable(f"node1 did not come back in {timeout:.0f} s: {self.log('slurmd')}")

    def _sh(self, cmd: list[str]) -> None:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
        if proc.returncode != 0:
            raise SlurmUnavailable(f"`{' '.join(cmd)}` failed: {(proc.stderr or proc.stdout).strip()}")

    def _network(self) -> None:
        self._sh(["ip", "netns", "add", self.netns])
        ns = ["ip", "-n", self.netns]
        self._sh([*ns, "link", "set", "lo", "up"])
        # Slurm resolves its host with AI_ADDRCONFIG, which ignores 127.0.0.1 when it is the only
        # address: slurmctld then fails with `Unable to resolve "127.0.0.1"`.
        self._sh([*ns, "addr", "add", "127.0.0.2/32", "dev", "lo"])
        self._sh(["ip", "netns", "add", self.netns2])
        self._sh(["ip", "-n", self.netns2, "link", "set", "lo", "up"])
        a, b = f"h{os.getpid() % 100000}a", f"h{os.getpid() % 100000}b"
        self._sh([*ns, "link", "add", a, "type", "veth", "peer", "name", b, "netns", self.netns2])
        for netns, dev, addr in ((self.netns, a, ADDR1), (self.netns2, b, ADDR2)):  # eth0 on both, as machines
            self._sh(["ip", "-n", netns, "link", "set", dev, "name", "eth0"])
            self._sh(["ip", "-n", netns, "addr", "add", f"{addr}/24", "dev", "eth0"])
            self._sh(["ip", "-n", netns, "link", "set", "eth0", "up"])

    def _munge(self) -> None:
        d = self.root / "munge"
        d.mkdir()
        os.chmod(self.root, 0o755)  # munged wants its socket's folders searchable by everyone
        os.chmod(d, 0o755)
        key = self.root / "munge.key"
        self._sh(["mungekey", "-c", "-k", str(key)] if shutil.which("mungekey")
                 else ["dd", "if=/dev/urandom", f"of={key}", "bs=1", "count=1024"])
        os.chmod(key, 0o600)
        self._daemon("munged", ["munged", "-F", f"--socket={d}/munge.socket", f"--key-file={key}",
                                f"--pid-file={d}/munged.pid", f"--seed-file={d}/munged.seed",
                                f"--log-file={self.root}/log/munged.log"])
        deadline = time.monotonic() + 15
        while not (d / "munge.socket").exists():
            if time.monotonic() > deadline:
                raise SlurmUnavailable(f"munged did not start: {self.log('munged')}")
            time.sleep(0.1)

    def _write_config(self) -> None:
        for sub in ("state", "spool", "log"):
            (self.root / sub).mkdir(exist_ok=True)
        # Job ids never seen on this machine before: MPICH names its node-local shared-memory segment
        # after the PMI job id (the Slurm step), and a segment left in /dev/shm by a killed step of an
        # earlier Slurm with the same ids makes MPI_Init of the new step hang or fail.
        first = 1000 + random.randrange(1 << 25)
        if self.gpus:
            half = self.gpus // 2
            gpus1, gpus2 = self.gpus, self.gpus - half
            files1, files2 = f"/dev/nvidia[0-{self.gpus - 1}]", f"/dev/nvidia[{half}-{self.gpus - 1}]"
        else:
            gpus1, gpus2, files1, files2 = GPUS, 4, f"/dev/tty[0-{GPUS - 1}]", "/dev/tty[0-3]"
        conf = SLURM_CONF.format(root=self.root, gpus1=gpus1, gpus2=gpus2, first_job_id=first,
                                 addr1=self.host or ADDR1, addr2=ADDR2)
        gres = GRES_CONF.format(files1=files1, files2=files2)
        if self.gpus and not self.host:
            # node2 stands for a second machine holding this one's GPUs half..N-1, which Slurm numbers 0, 1, ...
            # there; its tasks must name them as this machine's CUDA does: a task prolog adds the offset.
            prolog = self.root / "task_prolog.sh"
            prolog.write_text(TASK_PROLOG.format(offset=half))
            prolog.chmod(0o755)
            conf += f"TaskProlog={prolog}\n"
        if self.host:       # node1 alone
            conf = "\n".join(ln for ln in conf.splitlines() if "node2" not in ln) + "\n"
            gres = "\n".join(ln for ln in gres.splitlines() if "node2" not in ln) + "\n"
        self.conf.write_text(conf)
        (self.root / "gres.conf").write_text(gres)
        if self.gpus:   # GPU machines run cgroup v2 without systemd's dbus: slurmd makes its cgroup scope itself
            try:
                os.makedirs("/sys/fs/cgroup/system.slice", exist_ok=True)
                cgroup = "IgnoreSystemd=yes\nIgnoreSystemdOnFailure=yes\n"
            except OSError:
                cgroup = "CgroupPlugin=cgroup/v1\n"
            (self.root / "cgroup.conf").write_text(cgroup)

    def _daemon(self, name: str, cmd: list[str]) -> None:
        (self.root / "log").mkdir(exist_ok=True)
        out = open(self.root / "log" / f"{name}.out", "w")
        self.procs[name] = self.popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    def _wait_idle(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        state = ""
        while time.monotonic() < deadline:
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    raise SlurmUnavailable(f"{name} exited with {proc.returncode}: {self.log(name)}")
            state = self.run(["sinfo", "-h", "-N", "-o", "%t"], timeout=20).stdout.split()
            if len(state) >= (1 if self.host else 2) and set(state) <= {"idle", "mix", "alloc"}:
                return
            time.sleep(0.5)
        raise SlurmUnavailable(f"the node did not become idle in {timeout:.0f} s (sinfo: {state!r}); "
                               f"slurmd: {self.log('slurmd')}")

    def log(self, name: str, lines: int = 8) -> str:
        text = ""
        for suffix in (".log", ".out", "-node1.log", "-node2.log"):
            path = self.root / "log" / f"{name}{suffix}"
            if path.exists():
                text += path.read_text(errors="replace")
        return " | ".join(text.strip().splitlines()[-lines:]) or "(no log)"

    def jobs(self) -> list[str]:
        proc = self.run(["squeue", "-h", "-o", "%i"], timeout=20)
        return proc.stdout.split() if proc.returncode == 0 else []

    def stop(self) -> None:
        """scancel every job, wait for them to end, then stop the daemons by PID and remove the namespace."""
        if "slurmctld" in self.procs and self.procs["slurmctld"].poll() is None:
            try:
                jobs = self.jobs()
                if jobs:
                    self.run(["scancel", *jobs], timeout=20)
                deadline = time.monotonic() + 30
                while self.jobs() and time.monotonic() < deadline:
                    time.sleep(0.5)
            except subprocess.TimeoutExpired:
                pass
        for name in ("slurmd", "slurmd2", "slurmctld", "munged"):
            proc = self.procs.pop(name, None)
            if proc is None or proc.poll() is not None:
                continue
            # unshare ignores SIGTERM: signal slurmd, its child (the namespace's init; when it ends,
            # every process left in the namespace ends with it).
            targets = [c.pid for c in psutil.Process(proc.pid).children()] if name.startswith("slurmd") else [proc.pid]
            for sig in (signal.SIGTERM, signal.SIGKILL):
                for pid in targets:
                    try:
                        os.kill(pid, sig)
                    except ProcessLookupError:
                        pass
                try:
                    proc.wait(timeout=15)
                    break
                except subprocess.TimeoutExpired:
                    continue
        for netns in () if self.host else (self.netns, self.netns2):  # (the veth pair goes with them)
            subprocess.run(["ip", "netns", "del", netns], capture_output=True, timeout=30)

    # ------------------------------------------------------------ jobs
    def sbatch(self, args: list[str], env: dict | None = None, cwd: Path | str | None = None) -> str:
        proc = self.run(["sbatch", "--parsable", *args], env=env, cwd=cwd, timeout=30)
        if proc.returncode != 0:
            raise RuntimeError(f"sbatch {' '.join(args)} failed: {proc.stderr.strip()}")
        return proc.stdout.strip().split(";")[0]

    def job(self, job_id: str) -> dict[str, str]:
        """``scontrol show job`` as a dict (finished jobs stay for MinJobAge)."""
        out = self.run(["scontrol", "show", "job", "-o", str(job_id)], timeout=20).stdout
        return dict(re.findall(r"(\w+)=(\S*)", out))

    def wait(self, job_id: str, timeout: float = 300) -> dict[str, str]:
        """Wait until the job has ended; its scontrol record."""
        deadline = time.monotonic() + timeout
        while True:
            info = self.job(job_id)
            state = info.get("JobState", "")
            if state and state not in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED"):
                return info
            if time.monotonic() > deadline:
                self.run(["scancel", str(job_id)])
                raise TimeoutError(f"job {job_id} still {state} after {timeout:.0f} s")
            time.sleep(1)


def main() -> int:
    reason = unavailable()
    if reason:
        print(reason)
        return 1
    print(install())
    slurm = LocalSlurm.create()
    slurm.start()
    print(f"{version()} up in {slurm.root}\n"
          f"  export SLURM_CONF={slurm.conf}\n"
          f"  nsenter --net=/run/netns/{slurm.netns} sinfo")
    try:
        input("Enter stops it ")
    finally:
        slurm.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
