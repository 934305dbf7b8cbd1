"""``python -m hpclab.cluster srun [FLAVOUR]``: the launch line of a job's MPI program (slurm/common.sh runs it),
``... mpi [auto|FLAVOUR]``: the srun --mpi flavour alone, ``... diagnose JOBID``: why a job failed or waits."""
import shlex
import sys

from hpclab.cluster import jobs, mpi

if len(sys.argv) not in (2, 3) or sys.argv[1] not in ("srun", "mpi", "diagnose") or sys.argv[1:] == ["diagnose"]:
    sys.exit("usage: python -m hpclab.cluster srun [auto|pmi2|pmix|...] | mpi [auto|pmi2|...] | diagnose JOBID")
if sys.argv[1] == "diagnose":
    print(jobs.diagnose(sys.argv[2]))
    sys.exit(0)
try:
    choice = mpi.choose(sys.argv[2] if len(sys.argv) > 2 else "auto")
except (ValueError, RuntimeError) as exc:
    sys.exit(f"hpclab: {exc}")
print(shlex.join(mpi.srun_command(choice.flavour)) if sys.argv[1] == "srun" else choice.flavour)
print(f"hpclab: srun --mpi={choice.flavour}: {choice.reason}", file=sys.stderr)
