"""``hpclab doctor --site --partition P --gpus-per-node G [--reservation R] [--account A] [--qos Q]
[--time T] [--learners L]``: before a workshop day, what the site's Slurm offers the room: the partition
(up, its nodes' GPUs, its time limit), the reservation (when, which nodes, whom it admits), the GPUs the
room needs against those, the accounting limits on GPUs, and whether Slurm would accept one learner's
engines job as ``hpclab cluster init --slurm`` writes it (``sbatch --test-only``). Lines as the doctor's.
"""
from __future__ import annotations

import getpass
import re
import shutil

from hpclab.cli.line import Line
from hpclab.cluster.jobs import run

TRES_GPU = re.compile(r"gres/gpu(?::[\w.-]+)?=(\d+)")


def minutes(limit: str) -> float:
    """A Slurm time ('1-02:00:00', '1-12', '8:00:00', '30:00' minutes:seconds, '45', 'INFINITE') in minutes."""
    if not re.fullmatch(r"[\d:-]+", limit):
        return float("inf")
    days, _, clock = limit.rpartition("-")
    parts = [int(p) for p in clock.split(":")]
    h, m, s = (parts + [0, 0])[:3] if days else {1: [0, parts[0], 0], 2: [0, *parts], 3: parts}[len(parts)]
    return int(days or 0) * 1440 + h * 60 + m + s / 60


def gpus_of(gres: str) -> int:
    """GPUs in a node's GRES ('gpu:4', 'gpu:a100:4(S:0-1),shard:8', '(null)')."""
    return sum(int(n) for n in re.findall(r"gpu(?::[\w.-]+)?:(\d+)", gres))


def partition_line(rows: str, name: str, gpus: int, time: str) -> tuple[Line, dict[str, int]]:
    """From ``sinfo -h -N -p P -o '%N|%G|%T|%a|%l'``: the partition's line, and each usable node's GPUs."""
    nodes = [r.split("|") for r in rows.splitlines() if r.count("|") == 4]
    if not nodes:
        return Line("FAIL", f"partition {name}", "sinfo knows no such partition", "sinfo -o '%P %G %l' lists them"), {}
    if nodes[0][3] != "up":
        return Line("FAIL", f"partition {name}", f"it is {nodes[0][3]}", "ask the admins, or choose another"), {}
    usable = {n: gpus_of(g) for n, g, state, _, _ in nodes if not re.match(r"(down|drain|fail|maint|inval)", state)}
    limit, sizes = nodes[0][4], sorted({gpus_of(g) for _, g, *_ in nodes})
    found = (f"up; {len(nodes)} nodes ({len(usable)} usable) with {'/'.join(map(str, sizes))} GPUs each; "
             f"time limit {limit}")
    if max(sizes) < gpus:
        return Line("FAIL", f"partition {name}", found, f"--gpus-per-node {max(sizes)} at most"), usable
    if minutes(limit) < minutes(time):
        return Line("WARN", f"partition {name}", found, f"--time {limit} at most (the engines job asks {time})"), usable
    return Line("PASS", f"partition {name}", found), usable


def reservation_line(text: str, name: str, partition: str, user: str, account: str) -> tuple[Line, list[str]]:
    """From ``scontrol show reservation -o R``: its line and its nodes (hostlist form, as Slurm wrote it)."""
    if "ReservationName=" not in text:
        return Line("FAIL", f"reservation {name}", text.splitlines()[0] if text else "not found",
                    "scontrol show reservation lists them; ask the admins for it"), []
    f = dict(re.findall(r"(\w+)=(\S*)", text.splitlines()[0]))
    users, accounts = (f.get(k, "(null)").replace("(null)", "") for k in ("Users", "Accounts"))
    found = (f"{f.get('State', '?').lower()}, {f.get('StartTime')} to {f.get('EndTime')} on {f.get('NodeCnt')} "
             f"nodes ({f.get('Nodes')}); admits users {users or 'any'}, accounts {accounts or 'any'}")
    line = Line("PASS", f"reservation {name}", found)
    if f.get("PartitionName", "(null)") not in ("(null)", partition):
        line = Line("FAIL", f"reservation {name}", found + f"; it is in partition {f['PartitionName']}",
                    f"--partition {f['PartitionName']}")
    elif (users or accounts) and user not in users.split(",") and (not account or account not in accounts.split(",")):
        line = Line("WARN", f"reservation {name}", found + f"; not you ({user}, account {account or 'default'})",
                    "run this as a learner would (their account), or ask the admins to add yours")
    return line, ([f["Nodes"]] if f.get("Nodes", "(null)") != "(null)" else [])


def room_line(gpus_per_node: int, learners: int, usable: dict[str, int], where: str) -> Line:
    """The room's GPUs (one engines job of ``gpus_per_node`` GPUs on one node per learner) against ``usable``."""
    need, fits = gpus_per_node * learners, sum(n // gpus_per_node for n in usable.values() if gpus_per_node)
    found = (f"{learners} learners x {gpus_per_node} GPUs = {need}; {where}: {sum(usable.values())} GPUs on "
             f"{len(usable)} usable nodes, room for {fits} such jobs at once")
    if fits >= learners:
        return Line("PASS", "GPUs for the room", found)
    return Line("WARN", "GPUs for the room", found, "learners in pairs (one engines job for two), --gpus-per-node "
                f"{max(1, gpus_per_node // 2)}, or a larger reservation; until then some learners queue")


def limits_line(code: int, assoc: str, qos: str, gpus: int) -> Line:
    """From ``sacctmgr -n -P show assoc`` (Account|Partition|QOS|GrpTRES|MaxTRES|MaxJobs) and ``show qos``
    (Name|MaxTRESPerUser|MaxTRES|MaxJobsPerUser) for this user: per-job and per-user GPU limits."""
    if code != 0:
        return Line("SKIP", "GPU limits", f"no accounting database to ask ({assoc.splitlines()[0][:100]}): "
                    "Slurm enforces no association or QOS limits here")
    mine = [r.split("|") for r in assoc.splitlines() if r.count("|") >= 5]
    names = {q for r in mine for q in r[2].split(",") if q}
    caps = [(f"association {r[0]} {what}", int(m[1])) for r in mine for what, tres in (("GrpTRES", r[3]),
            ("MaxTRES", r[4])) if (m := TRES_GPU.search(tres))]
    caps += [(f"QOS {r[0]} {what}", int(m[1])) for r in (r.split("|") for r in qos.splitlines() if r.count("|") >= 3)
             if r[0] in names for what, tres in (("MaxTRESPerUser", r[1]), ("MaxTRES", r[2]))
             if (m := TRES_GPU.search(tres))]
    if not mine:
        return Line("WARN", "GPU limits", f"no association for {getpass.getuser()}",
                    "ask the admins for an account (each learner needs one)")
    found = "; ".join(f"{what} gres/gpu={n}" for what, n in caps) or f"no GPU limit on {getpass.getuser()}'s "\
        f"associations ({', '.join(sorted({r[0] for r in mine}))}) or their QOS ({', '.join(sorted(names)) or 'none'})"
    low = [what for what, n in caps if n < gpus]
    if low:
        return Line("FAIL", "GPU limits", found, f"--gpus-per-node {min(n for _, n in caps)}, or ask the admins to "
                    f"raise {', '.join(low)} for the day")
    return Line("PASS", "GPU limits", found)


def test_submission_line(code: int, said: str) -> Line:
    """``sbatch --test-only`` of one learner's engines job: when and where Slurm would start it, or why not."""
    said = " ".join(said.replace("sbatch: ", "").split())
    if code == 0 and "to start at" in said:
        return Line("PASS", "engines job", f"Slurm accepts one learner's job: {said}")
    return Line("FAIL", "engines job", f"Slurm refuses one learner's job: {said or 'no answer'}",
                "change the option it names (--partition, --gpus-per-node, --time, --account, --qos, --reservation)")


def checks(a) -> list[Line]:
    """Every line, asking this machine's Slurm (a login node's)."""
    code, ping = run(["scontrol", "ping"])
    if code == 127 or not shutil.which("sbatch"):
        return [Line("FAIL", "Slurm", "scontrol and sbatch are not on PATH", "run this on the cluster's login node")]
    if code != 0 or "UP" not in ping:   # every other line would repeat it
        return [Line("FAIL", "Slurm", (ping or "no answer").splitlines()[0][:160], "ask the admins: slurmctld does "
                     "not answer scontrol ping from here")]
    lines = [Line("PASS", "Slurm", ping.splitlines()[0])]
    line, usable = partition_line(run(["sinfo", "-h", "-N", "-p", a.partition, "-o", "%N|%G|%T|%a|%l"])[1],
                                  a.partition, a.gpus_per_node, a.time)
    lines.append(line)
    where = f"partition {a.partition}"
    if a.reservation:
        line, nodes = reservation_line(run(["scontrol", "show", "reservation", "-o", a.reservation])[1],
                                       a.reservation, a.partition, getpass.getuser(), a.account)
        lines.append(line)
        names = set(run(["scontrol", "show", "hostnames", *nodes])[1].split()) if nodes else set()
        usable, where = {n: g for n, g in usable.items() if n in names}, f"reservation {a.reservation}"
    else:
        lines.append(Line("SKIP", "reservation", "none given: each learner's job queues with everyone else's",
                          "ask the admins for one and pass --reservation"))
    lines.append(room_line(a.gpus_per_node, a.learners, usable, where))
    user = getpass.getuser()
    code, assoc = run(["sacctmgr", "-n", "-P", "show", "assoc", f"user={user}",
                        "format=Account,Partition,QOS,GrpTRES,MaxTRES,MaxJobs"])
    qos = run(["sacctmgr", "-n", "-P", "show", "qos", "format=Name,MaxTRESPerUser,MaxTRES,MaxJobsPerUser"])[1] \
        if code == 0 else ""
    lines.append(limits_line(code, assoc, qos, a.gpus_per_node))
    job = ["sbatch", "--test-only", f"--partition={a.partition}", "--nodes=1", f"--ntasks={a.gpus_per_node}",
           f"--gpus-per-node={a.gpus_per_node}", f"--time={a.time}", "--job-name=hpclab-engines"]
    job += [f"--{k}={getattr(a, k)}" for k in ("reservation", "account", "qos") if getattr(a, k)]
    lines.append(test_submission_line(*run([*job, "--wrap", "true"])))
    return lines


def add_arguments(parser) -> None:
    site = parser.add_argument_group("with --site (the workshop's Slurm, from a login node)")
    site.add_argument("--partition", "-p", help="the GPU partition the engines jobs use")
    site.add_argument("--gpus-per-node", type=int, default=4, help="GPUs per learner's engines job (default 4)")
    site.add_argument("--time", default="08:00:00", help="time limit of a learner's engines job (default 08:00:00)")
    site.add_argument("--learners", type=int, default=20, help="learners in the room (default 20)")
    for option in ("reservation", "account", "qos"):
        site.add_argument(f"--{option}", default="", help=f"sbatch --{option} of the engines jobs")
