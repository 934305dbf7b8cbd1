"""Slurm jobs of engines: their state in one line, why one failed or waits, and what to do.

ipyparallel submits and cancels the job (``SlurmEngineSetLauncher``), but its ``poll()`` returns None:
it never knows the job's state, why it failed or waits, or that a wait for its engines is in vain.
"""
from __future__ import annotations

import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from datetime import datetime

ACTIVE = ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "RESIZING", "REQUEUED")
QUEUE_WAIT_S = 600   # default wait for a job's engines: long enough for a short queue
POLL_S = 2           # scontrol at most this often while waiting


@dataclass
class JobInfo:
    job_id: str
    state: str          # first word of Slurm's state: RUNNING, PENDING, FAILED, ...
    name: str = ""
    reason: str = ""    # why it waits, or why it ended
    exit_code: int | None = None
    signal: int | None = None
    nodes: str = ""
    elapsed: str = ""
    time_limit: str = ""
    partition: str = ""
    log: str = ""       # the job's stdout file
    end: str = ""       # when its time limit ends it

    @property
    def active(self) -> bool:
        return self.state in ACTIVE

    def left(self) -> str:
        """Time left before the time limit, for a running job ('' otherwise)."""
        try:
            seconds = max(0, int((datetime.fromisoformat(self.end) - datetime.now()).total_seconds()))
        except ValueError:
            return ""
        return f"{seconds // 3600}:{seconds // 60 % 60:02d} left" if self.state == "RUNNING" else ""


def run(cmd: list[str], timeout: float = 30) -> tuple[int, str]:
    """Exit status and output (stdout, else stderr) of a Slurm command; 127 where it is not on PATH."""
    if not shutil.which(cmd[0]):
        return 127, f"{cmd[0]} is not on PATH"
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return 124, f"{cmd[0]} did not answer in {timeout:g} s" if isinstance(exc, subprocess.TimeoutExpired) else str(exc)
    return proc.returncode, (proc.stdout.strip() or proc.stderr.strip())


def _exit(text: str) -> tuple[int | None, int | None]:
    m = re.match(r"(\d+):(\d+)", text or "")
    return (int(m.group(1)), int(m.group(2))) if m else (None, None)


def info(job_id) -> JobInfo | None:
    """The job as ``scontrol`` (jobs that ended within MinJobAge) or ``sacct`` knows it, else None."""
    code, out = run(["scontrol", "show", "job", "-o", str(job_id)], timeout=20)
    if code == 0 and "JobState=" in out:
        f = dict(re.findall(r"(\w+)=(\S*)", out.splitlines()[0]))
        nodes = f.get("NodeList", "").replace("(null)", "")
        return JobInfo(str(job_id), f["JobState"], f.get("JobName", ""), f.get("Reason", "None"),
                       *_exit(f.get("ExitCode", "")), nodes, f.get("RunTime", ""), f.get("TimeLimit", ""),
                       f.get("Partition", ""), f.get("StdOut", ""), f.get("EndTime", ""))
    code, out = run(["sacct", "-j", str(job_id), "-X", "-n", "-P", "-o",
                     "JobID,JobName,State,ExitCode,NodeList,Elapsed,Timelimit,Partition"], timeout=20)
    row = ((out if code == 0 else "").splitlines() or [""])[0].split("|")
    return JobInfo(str(job_id), (row[2] or "UNKNOWN").split()[0], row[1], "", *_exit(row[3]),
                   row[4].replace("None assigned", ""), *row[5:8]) if len(row) >= 8 else None


def active(job_id) -> bool:
    return getattr(info(job_id), "active", False)


def job_of(cluster=None, raw: dict | None = None) -> str | None:
    """The Slurm job of a cluster (``ipp.Cluster``, or its file as ``raw`` JSON): its newest engine set that
    is a job and still runs (else the newest), else its controller's."""
    if cluster is not None:
        found = [getattr(s, "job_id", "") for s in cluster.engines.values()] or [getattr(cluster.controller, "job_id", "")]
    else:
        found = [s.get("job_id", "") for s in (raw or {}).get("engines", {}).get("sets", {}).values()]
    found = [str(j) for j in found if j]
    return next((j for j in reversed(found) if active(j)), found[-1] if found else None)


def describe(found: JobInfo, log: bool = True) -> str:
    """'Slurm job ID (name) STATE ...' with nodes and times (and its log), no cause or fix."""
    head = f"Slurm job {found.job_id}" + (f" ({found.name})" if found.name else "") + f" {found.state}"
    if found.state == "PENDING":
        head += f" ({found.reason})" if found.reason not in ("", "None") else ""
    elif found.active:
        head += (f" on {found.nodes}" if found.nodes else "") + (f" for {found.elapsed}" if found.elapsed else "")
    else:
        head += f" with exit code {found.exit_code}" if found.exit_code is not None else ""
        head += f" (signal {found.signal})" if found.signal else ""
        head += (f" after {found.elapsed}" if found.elapsed else "") + (f" on {found.nodes}" if found.nodes else "")
    return head + (f"; log: {found.log}" if log and found.log else "")


def report(job_id) -> str:
    found = info(job_id)
    return describe(found) if found else \
        f"Slurm job {job_id} is not known to scontrol or sacct (it ended long ago, or this is not its cluster)"


IN_ALLOCATION = ("run JupyterLab inside an allocation instead (salloc, then `make lab` on the node, or Open "
                 "OnDemand's JupyterLab): connect() then starts the engines in that job")
PMI2 = "use pmi2: `hpclab cluster init --slurm --mpi pmi2 ...` (templates: sbatch --export=ALL,HPCLAB_SRUN_MPI=pmi2)"
KNOWN_LOG_LINES = [  # a line of a job's log that names the cause: (pattern, cause, fix)
    (r"unsupported PMI version PMIx", "the job's MPI (MPICH, e.g. the PyPI mpich wheel) does not speak PMIx but was "
     "started with srun --mpi=pmix", PMI2),
    (r"can ?not load PMIx library|pmix.*(?:failed to load|cannot open shared object)", "Slurm's pmix plugin cannot "
     "load libpmix on the compute node", f"with the mpich wheel {PMI2}; for pmix, load the site MPI and PMIx that "
     "Slurm was built with"),
    (r"PMI2?_Init.*fail|PMI2 init failed|Failed to initialize PMI|pmi2.*not supported", "the job's MPI could not talk "
     "to Slurm through the chosen srun --mpi flavour", "rerun `hpclab cluster init --slurm --mpi auto` in the "
     "environment the engines use; it prints the flavour and why"),
    (r"Registration timed out", "the engines could not reach the controller on the machine of the notebook (a "
     "firewall between the compute nodes and the login node, or an address they cannot reach)", IN_ALLOCATION),
    (r"No module named '?([\w.]+)'?", "the job's Python has no module {0}: hpclab's environment is not active on the "
     "compute node", "run `hpclab cluster init --slurm ...` from inside the project's environment (on a filesystem "
     "the nodes see), or add its activation with --setup 'module load ...; source .../bin/activate'"),
    (r"DUE TO TIME LIMIT|time limit exceeded", "the job reached its time limit",
     "ask for more time: `hpclab cluster init --slurm --time HH:MM:SS ...` or sbatch --time"),
    (r"oom[-_ ]kill|Out Of Memory|Exceeded job memory limit", "the job ran out of memory",
     "ask for more memory (sbatch --mem) or use smaller problem sizes"),
    (r"no CUDA device|CUDA_ERROR_NO_DEVICE|cuInit.*(?:failed|error)", "the job sees no usable GPU",
     "ask for GPUs on a GPU partition (--gpus-per-node), or run on the simulator with HPCLAB_BACKEND=sim"),
]
PENDING_REASONS = {  # why a job waits (Slurm's Reason): (cause, fix)
    "Resources": ("waiting for free GPUs/nodes",
                  "it starts when they free up (`squeue -j {id} --start` estimates when), or ask for fewer"),
    "Priority": ("queued behind jobs of higher priority",
                 "it starts in turn (`squeue -j {id} --start`), or ask for fewer GPUs or less time"),
    "ReqNodeNotAvail": ("the nodes it needs are down or reserved", "choose another partition (`sinfo`)"),
    "Reservation": ("it waits for its reservation to start", "see `scontrol show reservation`"),
    "PartitionDown": ("partition {partition} is down", "choose another partition (`sinfo`)"),
    "PartitionInactive": ("partition {partition} is inactive", "choose another partition (`sinfo`)"),
    "PartitionTimeLimit": ("its time limit {time_limit} is longer than partition {partition} allows",
                           "ask for less: `hpclab cluster init --slurm --time ...`"),
    "PartitionNodeLimit": ("it asks for more nodes than partition {partition} allows", "ask for fewer engines"),
    "BadConstraints": ("no node can satisfy the request (GPUs per node, tasks, memory, --constraint)",
                       "compare with `sinfo -p {partition} -o '%N %G %c %f'` and ask for what a node has"),
    "JobHeldUser": ("it is held", "`scontrol release {id}`"),
    "JobHeldAdmin": ("an administrator holds it", "ask the site"),
    "Dependency": ("it waits for another job", "see `scontrol show job {id}`"),
    "InvalidAccount": ("the account is not valid here", "`hpclab cluster init --slurm --account ...`"),
    "InvalidQOS": ("the QOS is not valid here", "ask the site which QOS to use (`hpclab cluster init --slurm --qos`)"),
}
LIMITS = ("AssocGrp", "AssocMax", "QOSGrp", "QOSMax", "MaxGRES", "MaxCpu", "MaxJobs")
ENDED = {"TIMEOUT": "the job reached its time limit {time_limit}. Fix: ask for more time (--time).",
         "CANCELLED": "the job was cancelled (scancel, or the site). Fix: start new engines.",
         **dict.fromkeys(("NODE_FAIL", "BOOT_FAIL"), "a node failed. Fix: submit again (the site may need to know)."),
         "OUT_OF_MEMORY": "the job ran out of memory. Fix: ask for more memory (sbatch --mem)."}


def read_tail(path: str, size: int = 65536) -> str:
    """The last ``size`` bytes of a log ('' when it cannot be read)."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, 2) - size))
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def diagnose(job_id) -> str:
    """One line naming the job, its state, the cause and the fix (and the log to read)."""
    found = info(job_id)
    if found is None:
        return (f"Slurm job {job_id} is not known to scontrol or sacct: it ended more than a few minutes ago on a "
                "site without accounting. Start new engines.")
    head, tail = describe(found, log=False), (f" Log: {found.log}" if found.log else "")
    fields = {"id": found.job_id, "partition": found.partition or "?", "time_limit": found.time_limit or "?"}
    if found.state == "PENDING":
        limit = (f"a site limit holds it ({found.reason})", "wait for your other jobs to end, or ask for fewer GPUs/less "
                 "time") if found.reason.startswith(LIMITS) else (f"Slurm says {found.reason}", "see `scontrol show job {id}`")
        cause, fix = PENDING_REASONS.get(found.reason, limit)
        return f"{head}: {cause.format(**fields)}. Fix: {fix.format(**fields)}." + tail
    if found.active:
        return f"{head}: the job is running; if its engines do not register, read its log." + tail
    lines = read_tail(found.log).splitlines() if found.log else []
    for line in reversed(lines):
        for pattern, cause, fix in KNOWN_LOG_LINES:
            m = re.search(pattern, line, re.IGNORECASE)
            if m:
                g = m.groups() or ("",)
                return f"{head}: {cause.format(*g)} (log says: {line.strip()!r}). Fix: {fix.format(*g)}." + tail
    if found.state == "COMPLETED" and found.exit_code == 0:
        return f"{head}: the job ended normally (its engines were shut down). Fix: start new engines." + tail
    if found.state in ENDED:
        return f"{head}: {ENDED[found.state].format(**fields)}" + tail
    errors = [ln.strip() for ln in lines if re.search(r"error|exception|fatal|abort|killed|failed", ln, re.I)]
    last = (errors or [ln.strip() for ln in lines if ln.strip()] or [""])[-1]
    said = f" (log says: {last!r})" if last else (" (its log is empty or not readable from here)" if found.log else "")
    return f"{head}: the job's program failed{said}. Fix: read the log, correct the cause, submit again." + tail


def submit_failure(cluster) -> str:
    """Why sbatch refused the cluster's engines job (``sbatch --test-only`` on its batch script)."""
    batch = next((s.batch_file for s in cluster.engines.values() if getattr(s, "batch_file", "")), "")
    proc = subprocess.run(["sbatch", "--test-only", batch], capture_output=True, text=True, timeout=30)
    why = " ".join(proc.stderr.strip().splitlines()[-2:]) if proc.returncode else "sbatch accepts it now; try again"
    return f"sbatch refused the engines job ({why}); the batch script is {batch}"


class JobEnded(RuntimeError):
    """The engines job ended before its engines registered (the message says why and what to do)."""


class EngineJob:
    """The job whose engines a notebook waits for: its state for the progress bar, each change said once,
    and :class:`JobEnded` with the diagnosis as soon as it has ended."""

    def __init__(self, job_id: str, deadline_s: float = QUEUE_WAIT_S):
        self.job_id, self.deadline_s, self._checked, self._seen = str(job_id), deadline_s, 0.0, ("", "")
        self.text = f"Slurm job {self.job_id}"

    @classmethod
    def of(cls, cluster) -> EngineJob | None:
        job = job_of(cluster)
        return cls(job, max(QUEUE_WAIT_S, cluster.engine_timeout or 0)) if job else None

    def check(self) -> str | None:
        """The job's state in one line when it has changed since the last look, else None."""
        if time.monotonic() - self._checked < POLL_S:
            return None
        self._checked = time.monotonic()
        found = info(self.job_id)
        if found is None or not found.active:
            raise JobEnded(diagnose(self.job_id))
        seen = (found.state, found.reason if found.state == "PENDING" and found.reason != "None" else "")
        if seen == self._seen:
            return None
        self._seen, self.text = seen, f"Slurm job {self.job_id} {found.state}" + (f" ({found.reason})" if seen[1] else "")
        return describe(found, log=False)

    def at_deadline(self, what: str) -> str:
        """The message when the engines are not all up in time (asked before the job is cancelled)."""
        return (f"{what}; {diagnose(self.job_id).rstrip('.')}. The job is cancelled now; to wait longer for a "
                "queued job: connect(..., timeout=SECONDS).")
