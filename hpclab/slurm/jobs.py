"""A Slurm job's state in one line, and what to do about it.

    info = job_info("1234")        # state, reason, exit code, nodes, log path
    job_report("1234")             # 'Slurm job 1234 (hpclab-engines) RUNNING on gpu07 for 0:05:12; log: ...'
    diagnose("1234")               # the same, plus the cause (from the state and the log) and the fix

The job is looked up with ``scontrol show job`` (live jobs and jobs that ended
within the last MinJobAge, 5 minutes by default), then ``sacct`` (sites with
accounting). The cause of a failure is read from the job's log where a known
line is there (a wrong ``srun --mpi`` flavour, a missing module, a time limit).
"""
from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

ACTIVE = ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "RESIZING", "REQUEUED")


@dataclass
class JobInfo:
    job_id: str
    state: str                 # RUNNING, PENDING, FAILED, ... (first word of Slurm's state)
    name: str = ""
    reason: str = ""           # why it is pending, or why it ended (Slurm's Reason)
    exit_code: int | None = None
    signal: int | None = None
    nodes: str = ""
    elapsed: str = ""
    time_limit: str = ""
    partition: str = ""
    log: str = ""              # the job's stdout file
    source: str = "scontrol"

    @property
    def active(self) -> bool:
        return self.state in ACTIVE

    @property
    def ended(self) -> bool:
        return not self.active


def _run(cmd: list[str], timeout: float = 20) -> str | None:
    if not shutil.which(cmd[0]):
        return None
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout if proc.returncode == 0 else None


def _exit(text: str) -> tuple[int | None, int | None]:
    m = re.match(r"(\d+):(\d+)", text or "")
    return (int(m.group(1)), int(m.group(2))) if m else (None, None)


def _from_scontrol(job_id: str) -> JobInfo | None:
    out = _run(["scontrol", "show", "job", "-o", str(job_id)])
    if not out or "JobState=" not in out:
        return None
    f = dict(re.findall(r"(\w+)=(\S*)", out.splitlines()[0]))
    code, sig = _exit(f.get("ExitCode", ""))
    nodes = f.get("NodeList", "")
    return JobInfo(job_id=str(job_id), state=f.get("JobState", "UNKNOWN").split()[0], name=f.get("JobName", ""),
                   reason=f.get("Reason", "None"), exit_code=code, signal=sig,
                   nodes="" if nodes in ("(null)", "None") else nodes, elapsed=f.get("RunTime", ""),
                   time_limit=f.get("TimeLimit", ""), partition=f.get("Partition", ""),
                   log=f.get("StdOut", ""))


def _from_sacct(job_id: str) -> JobInfo | None:
    fields = "JobID,JobName,State,ExitCode,NodeList,Elapsed,Timelimit,Partition"
    out = _run(["sacct", "-j", str(job_id), "-X", "-n", "-P", "-o", fields])
    if not out or not out.strip():
        return None
    row = out.strip().splitlines()[0].split("|")
    if len(row) < 8:
        return None
    code, sig = _exit(row[3])
    state = row[2].split()[0] if row[2] else "UNKNOWN"
    return JobInfo(job_id=str(job_id), state=state, name=row[1], exit_code=code, signal=sig,
                   nodes="" if row[4] in ("None assigned", "") else row[4], elapsed=row[5], time_limit=row[6],
                   partition=row[7], source="sacct")


def job_info(job_id: str | int) -> JobInfo | None:
    """The job as Slurm knows it, or None when neither scontrol nor sacct knows it."""
    return _from_scontrol(str(job_id)) or _from_sacct(str(job_id))


def log_tail(path: str, max_bytes: int = 65536) -> list[str]:
    """The last lines of a job's log (empty when it cannot be read from here)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - max_bytes))
            return f.read().decode(errors="replace").splitlines()
    except OSError:
        return []


# A line in the log that names the cause, what it means, and the fix.
KNOWN_LOG_LINES = [
    (r"unsupported PMI version PMIx",
     "the job's MPI (MPICH, e.g. the PyPI mpich wheel) does not speak PMIx but was started with srun --mpi=pmix",
     "use pmi2: `hpclab cluster init --slurm --mpi pmi2 ...` (templates: sbatch --export=ALL,HPCLAB_SRUN_MPI=pmi2)"),
    (r"can ?not load PMIx library|pmix.*(?:failed to load|cannot open shared object)",
     "Slurm's pmix plugin cannot load libpmix on the compute node",
     "with the mpich wheel use pmi2 (`hpclab cluster init --slurm --mpi pmi2 ...`; templates: sbatch "
     "--export=ALL,HPCLAB_SRUN_MPI=pmi2); for pmix, load the site MPI and PMIx that Slurm was built with"),
    (r"PMI2?_Init.*fail|PMI2 init failed|Failed to initialize PMI|pmi2.*not supported",
     "the job's MPI could not talk to Slurm through the chosen srun --mpi flavour",
     "rerun `hpclab cluster init --slurm --mpi auto` in the environment the engines use; it prints the flavour and why"),
    (r"No module named '?([\w.]+)'?",
     "the job's Python has no module {0}: hpclab's environment is not active on the compute node",
     "run `hpclab cluster init --slurm ...` from inside the project's environment (it must be on a filesystem the "
     "nodes see), or add its activation with --setup 'module load ...; source .../bin/activate'"),
    (r"DUE TO TIME LIMIT|time limit exceeded",
     "the job reached its time limit",
     "ask for more time: `hpclab cluster init --slurm --time HH:MM:SS ...` or sbatch --time"),
    (r"oom[-_ ]kill|Out Of Memory|Exceeded job memory limit",
     "the job ran out of memory",
     "ask for more memory (sbatch --mem) or use smaller problem sizes"),
    (r"Cluster is already running at (\S+)",
     "a cluster file left in the profile ({0}) made ipcluster refuse to start",
     "use slurm/ipcluster_engines.sbatch (it clears a stale file), or remove the file if no engines run"),
    (r"engines of job (\d+) are still running",
     "another engine job ({0}) still serves this profile",
     "`scancel {0}`, or submit with HPCLAB_PROFILE=<another profile>"),
    (r"the engines ended with exit code (-?\d+)",
     "the engines died (exit code {0}); their own output is above that line in the log",
     "correct what the engines' output names, then start new engines (sbatch slurm/ipcluster_engines.sbatch)"),
    (r"only (\d+) of (\d+) engines registered",
     "only {0} of {1} engines reached the controller in the job",
     "check that the nodes of one job can reach each other (the controller runs on the first node), "
     "and that every node sees the project's environment"),
    (r"no CUDA device|CUDA_ERROR_NO_DEVICE|cuInit.*(?:failed|error)",
     "the job sees no usable GPU",
     "ask for GPUs on a GPU partition (--gpus-per-node), or run on the simulator with HPCLAB_BACKEND=sim"),
]

# Why a job waits (Slurm's Reason) and what to do.
PENDING_REASONS = {
    "Resources": ("waiting for free GPUs/nodes",
                  "it starts when they free up (`squeue -j {id} --start` estimates when), or ask for fewer"),
    "Priority": ("queued behind jobs of higher priority",
                 "it starts in turn (`squeue -j {id} --start`), or ask for fewer GPUs or less time"),
    "ReqNodeNotAvail": ("the nodes it needs are down or reserved",
                        "choose another partition (`sinfo`), `hpclab cluster init --slurm --partition ...`"),
    "PartitionDown": ("partition {partition} is down", "choose another partition (`sinfo`)"),
    "PartitionInactive": ("partition {partition} is inactive", "choose another partition (`sinfo`)"),
    "PartitionTimeLimit": ("its time limit {time_limit} is longer than partition {partition} allows",
                           "ask for less: `hpclab cluster init --slurm --time ...`"),
    "PartitionNodeLimit": ("it asks for more nodes than partition {partition} allows", "ask for fewer engines"),
    "BadConstraints": ("no node can satisfy the request (GPUs per node, tasks, memory)",
                       "compare with `sinfo -p {partition} -o '%N %G %c'` and ask for what a node has"),
    "JobHeldUser": ("it is held", "`scontrol release {id}`"),
    "JobHeldAdmin": ("an administrator holds it", "ask the site"),
    "Dependency": ("it waits for another job", "see `scontrol show job {id}`"),
    "InvalidAccount": ("the account is not valid here", "pass the right one: `hpclab cluster init --slurm --account ...`"),
    "InvalidQOS": ("the QOS is not valid here", "ask the site which QOS to use"),
}


def _limits_reason(reason: str) -> tuple[str, str] | None:
    if reason.startswith(("AssocGrp", "AssocMax", "QOSGrp", "QOSMax", "MaxGRES", "MaxCpu", "MaxJobs")):
        return (f"a site limit holds it ({reason})",
                "wait for your other jobs to end, or ask for fewer GPUs/less time")
    return None


def describe(info: JobInfo, log: bool = True) -> str:
    """'Slurm job ID (name) STATE ...' with nodes and time (and its log), without cause or fix."""
    head = f"Slurm job {info.job_id}" + (f" ({info.name})" if info.name else "") + f" {info.state}"
    if info.state == "PENDING":
        head += f" ({info.reason})" if info.reason and info.reason != "None" else ""
    elif info.state in ("RUNNING", "COMPLETING", "CONFIGURING"):
        head += (f" on {info.nodes}" if info.nodes else "") + (f" for {info.elapsed}" if info.elapsed else "")
    else:
        if info.exit_code is not None:
            head += f" with exit code {info.exit_code}" + (f" (signal {info.signal})" if info.signal else "")
        if info.elapsed:
            head += f" after {info.elapsed}"
        if info.nodes:
            head += f" on {info.nodes}"
    if log and info.log:
        head += f"; log: {info.log}"
    return head


def job_report(job_id: str | int) -> str:
    """One line: the job's state (PENDING with reason, RUNNING with nodes, ended with exit code) and log."""
    info = job_info(job_id)
    if info is None:
        return f"Slurm job {job_id} is not known to scontrol or sacct (it ended long ago, or this is not its cluster)"
    return describe(info)


def cause_from_log(lines: list[str]) -> tuple[str, str, str] | None:
    """(cause, fix, the log line) for the last known line in a job's log."""
    for line in reversed(lines):
        for pattern, cause, fix in KNOWN_LOG_LINES:
            m = re.search(pattern, line, re.IGNORECASE)
            if m:
                groups = m.groups() or ("",)
                return cause.format(*groups), fix.format(*groups), line.strip()
    return None


def _last_error(lines: list[str]) -> str:
    for line in reversed(lines):
        if re.search(r"error|exception|fatal|abort|killed|failed", line, re.IGNORECASE):
            return line.strip()
    return next((ln.strip() for ln in reversed(lines) if ln.strip()), "")


def diagnose(job_id: str | int, log: str | None = None) -> str:
    """One line naming the job, its state, the cause and the fix (and the log to read)."""
    info = job_info(job_id)
    if info is None:
        return (f"Slurm job {job_id} is not known to scontrol or sacct: it ended more than a few minutes ago on a "
                "site without accounting" + (f"; its log: {log}" if log else "") +
                ". Start new engines.")
    if log and not info.log:
        info.log = log
    head = describe(info, log=False)
    tail = f" Log: {info.log}" if info.log else ""
    fields = {"id": info.job_id, "partition": info.partition or "?", "time_limit": info.time_limit or "?"}
    if info.state == "PENDING":
        cause, fix = PENDING_REASONS.get(info.reason) or _limits_reason(info.reason) or (
            f"Slurm says {info.reason}", "see `scontrol show job {id}`")
        return f"{head}: {cause.format(**fields)}. Fix: {fix.format(**fields)}." + tail
    if info.state in ("RUNNING", "CONFIGURING", "COMPLETING"):
        return f"{head}: the job is running; if its engines do not register, read its log." + tail
    lines = log_tail(info.log) if info.log else []
    known = cause_from_log(lines)
    if known:
        cause, fix, line = known
        return f"{head}: {cause} (log says: {line!r}). Fix: {fix}." + tail
    if info.state == "TIMEOUT":
        return f"{head}: the job reached its time limit {info.time_limit}. Fix: ask for more time (--time)." + tail
    if info.state == "CANCELLED":
        return f"{head}: the job was cancelled (scancel, or the site). Fix: start new engines." + tail
    if info.state == "COMPLETED" and info.exit_code == 0:
        return f"{head}: the job ended normally (its engines were shut down). Fix: start new engines." + tail
    if info.state in ("NODE_FAIL", "BOOT_FAIL"):
        return f"{head}: a node failed. Fix: submit again (the site may need to know)." + tail
    if info.state == "OUT_OF_MEMORY":
        return f"{head}: the job ran out of memory. Fix: ask for more memory (sbatch --mem)." + tail
    last = _last_error(lines)
    said = f" (log says: {last!r})" if last else (" (its log is empty or not readable from here)" if info.log else "")
    return f"{head}: the job's program failed{said}. Fix: read the log, correct the cause, submit again." + tail


def submit_error(batch_file: str | Path) -> str:
    """Why sbatch refuses a batch file, from ``sbatch --test-only`` (empty when it would be accepted)."""
    if not shutil.which("sbatch"):
        return "sbatch is not on PATH"
    try:
        proc = subprocess.run(["sbatch", "--test-only", str(batch_file)], capture_output=True, text=True,
                              timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"sbatch --test-only did not answer ({exc})"
    if proc.returncode == 0:
        return ""
    return " ".join(proc.stderr.strip().splitlines()[-2:]) or f"sbatch exited with {proc.returncode}"


def cancel(job_id: str | int) -> bool:
    """``scancel`` the job; whether scancel accepted it (False when it had ended or there is no scancel)."""
    return _run(["scancel", str(job_id)], timeout=30) is not None
