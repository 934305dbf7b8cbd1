#!/usr/bin/env bash
# One hpclab for a whole room, installed once on a shared filesystem (make install-shared PREFIX=DIR):
#
#   DIR/venv/                 the environment (hpclab, JupyterLab, the GPU stack for GPU_STACK, MPI)
#   DIR/workbook/             notebooks/, solutions/, exercises/, slurm/ and docs/, read-only
#   DIR/bin/hpclab-lab        what a learner runs: their own work folder, then JupyterLab on it
#   DIR/modulefiles/hpclab/VERSION.lua   `module use DIR/modulefiles; module load hpclab`
#
# Each learner keeps their own copies of the exercises (HPCLAB_WORK, default ~/hpclab-work/my-work), their own
# IPython profile (~/.ipython: engines, `hpclab cluster init --slurm`) and nothing of theirs in DIR.
#   tools/install_shared.sh DIR [--venv EXISTING]   EXISTING: an environment that already has hpclab (a site's
#                                                   conda environment, say), linked instead of a new one
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
prefix=${1:?usage: tools/install_shared.sh DIR [--venv EXISTING]}
existing=""
[ "${2:-}" = "--venv" ] && existing=${3:?--venv needs the environment}
mkdir -p "$prefix"
prefix=$(cd "$prefix" && pwd)
version=$(sed -n 's/^version = "\(.*\)"/\1/p' "$root/pyproject.toml")
if [ -n "$existing" ]; then
    "$existing/bin/python" -c "import hpclab" || { echo "install-shared: $existing has no hpclab" >&2; exit 2; }
    ln -sfn "$existing" "$prefix/venv"
else
    "${PYTHON:-python3}" "$root/tools/gpu_stack.py" "${GPU_STACK:-auto}" --record "$prefix/.gpu-stack"
    stack=$(cat "$prefix/.gpu-stack")
    "${PYTHON:-python3}" -m venv "$prefix/venv"
    "$prefix/venv/bin/python" -m pip install -q --upgrade pip
    mpi=$(command -v mpiexec > /dev/null || echo ",mpi")
    "$prefix/venv/bin/python" -m pip install -q "$root[lab$mpi$stack]"
fi
rm -rf "$prefix/workbook"
mkdir -p "$prefix/workbook" "$prefix/bin" "$prefix/modulefiles/hpclab"
for part in notebooks solutions exercises slurm docs README.md; do cp -r "$root/$part" "$prefix/workbook/"; done
rm -rf "$prefix/workbook/slurm/logs"
chmod -R a-w,a+rX "$prefix/workbook"
cat > "$prefix/bin/hpclab-lab" <<LAB
#!/usr/bin/env bash
# A learner's JupyterLab on the shared hpclab of $prefix: their own exercises in \$HPCLAB_WORK/my-work and their own
# batch templates in slurm/ (copied once, never overwritten; jobs write slurm/logs/ there), the lessons and
# solutions of the shared workbook beside them, read-only.
#   hpclab-lab [--setup-only] [jupyter lab options]
set -euo pipefail
work=\${HPCLAB_WORK:-\$HOME/hpclab-work}
mkdir -p "\$work/my-work"
for part in notebooks solutions; do ln -sfn "$prefix/workbook/\$part" "\$work/\$part"; done
[ -d "\$work/slurm" ] || { cp -r "$prefix/workbook/slurm" "\$work/slurm"; chmod -R u+w "\$work/slurm"; mkdir -p "\$work/slurm/logs"; }
for nb in "$prefix"/workbook/exercises/*.ipynb; do
    [ -e "\$work/my-work/\$(basename "\$nb")" ] || { cp "\$nb" "\$work/my-work/"; chmod u+w "\$work/my-work/\$(basename "\$nb")"; }
done
echo "hpclab: your work folder is \$work (your exercises in my-work/; lessons and solutions beside them, read-only)"
[ "\${1:-}" = "--setup-only" ] && exit 0
cd "\$work"
export HPCLAB_FIGURES=\${HPCLAB_FIGURES:-\$work/figures}   # (a lesson's own folder is the shared, read-only one)
exec "$prefix/venv/bin/jupyter" lab --ServerApp.root_dir="\$work" "\$@"
LAB
chmod a+rx "$prefix/bin/hpclab-lab"
cat > "$prefix/modulefiles/hpclab/$version.lua" <<MOD
-- hpclab $version: the distributed-GPU-computing workbook (hpclab-lab, hpclab, jupyter)
help([[hpclab-lab starts your JupyterLab on the workbook; hpclab doctor checks the GPU stack and MPI.]])
whatis("Name: hpclab")
whatis("Version: $version")
prepend_path("PATH", "$prefix/venv/bin")
prepend_path("PATH", "$prefix/bin")
setenv("HPCLAB_ENV", "$prefix/venv")
MOD
echo "install-shared: $prefix ready: module use $prefix/modulefiles; module load hpclab; hpclab-lab"
