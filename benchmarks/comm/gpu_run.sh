#!/usr/bin/env bash
# GPU communication on one multi-GPU node: correctness of every backend op, the all-reduce
# benchmark for every backend (4 B .. 1 GiB) with a raw-NCCL baseline in the same run,
# workshop Exercises 3 and 4, and the collectives program over NCCL.
#
#   OUT=/path/to/results bash benchmarks/comm/gpu_run.sh      (from the repository root)
#
# Writes to $OUT: allreduce.json (the benchmark's JSON), checks.jsonl (one JSON line per
# correctness run), summary.txt (what is printed at the end). Each step is logged and
# time-limited; a failing step does not stop the others. About 2 minutes on 2 x H200.
set -u
OUT=${OUT:-/tmp/hpclab-comm}
mkdir -p "$OUT"
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD
export HPCLAB_BACKEND=gpu NCCL_NVLS_ENABLE=0
NGPU=$(nvidia-smi -L 2>/dev/null | wc -l)
[ "$NGPU" -ge 1 ] || { echo "no GPU visible (nvidia-smi -L is empty)"; NGPU=1; }
MPI="mpirun --allow-run-as-root --oversubscribe -x PYTHONPATH -x NCCL_NVLS_ENABLE -x HPCLAB_BACKEND"
CHECKS=$OUT/checks.jsonl
: > "$CHECKS"
SIZES=4,64,1K,4K,16K,64K,256K,1M,4M,16M,64M,256M,1G
status=()

step() {  # step NAME TIMEOUT_S COMMAND... : log, time limit, stdout also to $OUT/NAME.log
    local name=$1 limit=$2; shift 2
    echo; echo "=== [$(date +%T)] $name: $*"
    local t0=$SECONDS
    timeout "$limit" "$@" | tee "$OUT/$name.log"
    local rc=${PIPESTATUS[0]}
    echo "=== $name: exit $rc after $((SECONDS - t0)) s"
    status+=("$name: exit $rc")
}

last_json() {  # keep the last JSON line of a log, tagged with the step name
    python3 - "$1" "$2" >> "$CHECKS" <<'PY'
import json, sys
lines = [l for l in open(sys.argv[1]) if l.startswith("{")]
for l in (lines if sys.argv[2] == "ops" else lines[-1:]):
    d = json.loads(l); d["step"] = sys.argv[2]; print(json.dumps(d))
PY
}

echo "hpclab GPU communication run: $(date -u +%FT%TZ), $NGPU GPU(s)"
nvidia-smi -L
nvidia-smi topo -m 2>/dev/null | head -n $((NGPU + 1))
step info 60 $MPI -n 1 python3 -m hpclab info

# 1. every operation of every backend against NumPy (mpi-cuda is skipped by auto/all when
#    MPI is not CUDA-aware; asking for it explicitly would be refused, which is tested on CI)
step ops 120 $MPI -n "$NGPU" python3 tests/mpi_scripts/comm_ops.py mpi-host,nccl,auto
last_json "$OUT/ops.log" ops

# 2. the all-reduce benchmark: every backend that runs here + raw NCCL, interleaved per size
step bench 240 $MPI -n "$NGPU" python3 -m hpclab bench allreduce --backend all --sizes "$SIZES" --json
grep '^{' "$OUT/bench.log" | tail -n 1 > "$OUT/allreduce.json"

# 3. Exercise 3: one process drives every GPU (ncclCommInitAll)
step exercise3 90 $MPI -n 1 python3 -m hpclab run pi-nccl-node --json
last_json "$OUT/exercise3.log" exercise3

# 4. Exercise 4: one rank per GPU, MPI bootstraps NCCL
step exercise4 90 $MPI -n "$NGPU" python3 -m hpclab run pi-nccl-mpi --json
last_json "$OUT/exercise4.log" exercise4

# 5. Exercise 0 (collectives) on GPU data through NCCL
step collectives 90 $MPI -n "$NGPU" python3 -m hpclab run collectives --backend nccl --json
last_json "$OUT/collectives.log" collectives
rm -f "$OUT"/*.log  # at most 3 files come back

# 6. summary
python3 - "$OUT/allreduce.json" "$CHECKS" "$NGPU" <<'PY' | tee "$OUT/summary.txt"
import json, sys
bench_file, checks_file, ngpu = sys.argv[1], sys.argv[2], int(sys.argv[3])
print(f"\n===== SUMMARY ({ngpu} GPUs) =====")
for line in open(checks_file):
    d = json.loads(line)
    if d["step"] == "ops":
        bad = [k for k, v in d["results"].items() if not v]
        print(f"ops {d['requested']:>8} -> {d['backend']:<8}: {len(d['results']) - len(bad)}/{len(d['results'])} ok {bad or ''}")
    else:
        r = d.get("result", {})
        print(f"{d['step']:<12} passed={d['passed']} pi={r.get('pi')} hits={r.get('hits')} "
              f"timings={ {k: round(v, 6) for k, v in d.get('timings', {}).items()} }")
try:
    b = json.load(open(bench_file))
except Exception as exc:  # noqa: BLE001
    print(f"no benchmark JSON ({exc})"); sys.exit(0)
print(f"all-reduce benchmark passed={b['passed']} ({b['ranks']} ranks, {b['gpu']}, {b['dtype']})")
rows = {(r["backend"], r["size_bytes"]): r for r in b["rows"]}
sizes = sorted({r["size_bytes"] for r in b["rows"]})
names = [n for n in ("mpi-host", "mpi-cuda", "nccl", "raw-nccl") if any(k[0] == n for k in rows)]
print(f"{'size':>10} " + " ".join(f"{n + ' us':>14} {'busbw':>8}" for n in names) + "   nccl/raw busbw  time")
for s in sizes:
    cells = []
    for n in names:
        r = rows.get((n, s))
        cells.append(f"{r['time_us']:>14.2f} {r['busbw_GBps']:>8.2f}" if r else f"{'-':>14} {'-':>8}")
    rat = next((x for x in b["ratios"] if x["size_bytes"] == s), None)
    tail = f"   {100 * rat['busbw_ratio']:6.1f} %  x{rat['time_ratio']:.2f}" if rat else ""
    print(f"{s:>10} " + " ".join(cells) + tail)
for k, t in b.get("targets", {}).items():
    print(f"target {k}: {t['ratio']:.3f} vs {t['target']} at {t['size_bytes']} B -> {'MET' if t['met'] else 'NOT MET'}")
host, nccl = rows.get(("mpi-host", 256 << 20)), rows.get(("nccl", 256 << 20))
if host and nccl:
    print(f"256 MiB all-reduce: host-staged MPI {host['time_us'] / 1e3:.1f} ms vs hpclab nccl "
          f"{nccl['time_us'] / 1e3:.3f} ms ({host['time_us'] / nccl['time_us']:.0f}x)")
for n in b.get("notes", []):
    print(f"note: {n}")
PY
echo; echo "steps:"; printf '  %s\n' "${status[@]}"
ls -l "$OUT"
