"""``python -m hpclab.slurm mpi [auto|FLAVOUR]`` (the srun --mpi flavour, used by slurm/common.sh)
and ``python -m hpclab.slurm engines ...`` (MPI engines in a batch job, slurm/ipcluster_engines.sbatch)."""
import sys

USAGE = "usage: python -m hpclab.slurm mpi [auto|pmi2|pmix|...] | engines [--profile P] [--mpi F] [-n N]"


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ("mpi", "engines"):
        print(USAGE, file=sys.stderr)
        return 2
    if argv[0] == "mpi":
        from hpclab.slurm.mpi import main as run
    else:
        from hpclab.slurm.engines import main as run
    return run(argv[1:])


sys.exit(main(sys.argv[1:]))
