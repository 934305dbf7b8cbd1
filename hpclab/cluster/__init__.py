"""MPI engines for notebooks, on ipyparallel, on a laptop, a GPU node or a Slurm cluster.

    from hpclab import cluster
    session = cluster.connect(n=4)   # claim the profile's shared cluster, or start engines for this notebook
    %%px                             # cells now run on every MPI rank
    session.restart()                # a %%px cell hangs: replace the engines
    session.close()                  # give the engines back (or stop them)

Each module keeps only what ipyparallel lacks and says what that is. docs/cluster.md, "Who owns the engines"
and "Running on a cluster".
"""
from hpclab.cluster.routes import ClusterError
from hpclab.cluster.session import Session, SharedCluster, connect, start_shared

__all__ = ["ClusterError", "Session", "SharedCluster", "connect", "start_shared"]
