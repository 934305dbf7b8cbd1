"""MPI engines for notebooks, on ipyparallel, on a laptop, a GPU node or a Slurm cluster.

    from hpclab import cluster
    session = cluster.connect(n=4)   # claim the profile's shared cluster, or start engines for this notebook
    %%px                             # cells now run on every MPI rank
    session.restart()                # a %%px cell hangs: replace the engines
    session.close()                  # give the engines back (or stop them)

Modules, each keeping only what ipyparallel lacks: session (connect, start_shared, Session: owners,
restart), files (cluster and owner files of a profile, stale clusters), owner (runs on the engines),
reaper (ends a cluster with its kernel, or when idle), px (%%px errors once for all ranks), routes
(where the engines come from: a Slurm job, this allocation, this machine; the login-node rule), jobs
(Slurm job state and diagnosis), mpi (the srun --mpi flavour and line), profile (hpclab cluster init
--slurm), command (hpclab cluster ...). README, "Who owns the engines" and "Running on a cluster".
"""
from hpclab.cluster.mpi import choose as srun_flavour, srun_command
from hpclab.cluster.routes import ClusterError
from hpclab.cluster.session import Session, SharedCluster, connect, start_shared

__all__ = ["ClusterError", "Session", "SharedCluster", "connect", "srun_command", "srun_flavour", "start_shared"]
