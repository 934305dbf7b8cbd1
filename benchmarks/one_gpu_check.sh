#!/usr/bin/env bash
# One GPU, several ranks: every `hpclab run` program with 1, 2 and 4 ranks, the notebooks on
# 1, 2 or 4 GPU engines, and `make test-gpu`, on whatever GPUs this machine has (one, to check
# the shared-GPU path). From the repository root, after `source benchmarks/offline_env.sh`:
#
#   OUT=/path bash benchmarks/one_gpu_check.sh PART [PART ...]
#
# PART: programs | notebooks:N (N engines; notebooks/ and solutions/, or $NOTEBOOKS) | suite
# (make test-gpu) | suite:tests and suite:notebooks (the same suite in two halves: tests/, and
# notebooks/ + solutions/ on max(2, GPUs) engines; run together they take the longer half's time).
# Parts joined by '+' run at the same time (e.g. notebooks:1+notebooks:4): their seconds then
# include waiting for each other and count as upper bounds; pass/fail is unaffected.
# BUDGET (seconds, default 520) bounds the whole call: a part still running then is stopped with
# SIGINT (pytest prints what it has), and whatever did not start is listed as not run.
# Writes to $OUT: summary.md (tables: program x ranks, notebook x engines, suite counts) and one
# log per part (programs.log, notebooks-N.log, suite.log).
set -u
set -m   # parts run in the background keep SIGINT (else ignored), so pytest can stop with its summary
OUT=${OUT:-build/one_gpu_check}
mkdir -p "$OUT"
BUDGET=${BUDGET:-520}
START=$SECONDS
PY=${PYTHON_RUN:-python3}
LAUNCH=${HPCLAB_MPIEXEC:-${MPIRUN:-mpiexec}}
export HPCLAB_BACKEND=${HPCLAB_BACKEND:-gpu} NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0} PYTHONUNBUFFERED=1
# Open MPI binds the ranks of every job to the same first cores: jobs side by side would share them.
export OMPI_MCA_hwloc_base_binding_policy=${OMPI_MCA_hwloc_base_binding_policy:-none}
SUMMARY=$OUT/summary.md
WORK=$(mktemp -d)

left() { echo $(( BUDGET - (SECONDS - START) )); }

{
    echo "# hpclab one-GPU check, $(date -u +%FT%TZ), $(hostname)"
    nvidia-smi -L 2>/dev/null || echo "(nvidia-smi lists no GPU)"
    echo "launcher: $LAUNCH | python: $($PY -c 'import sys; print(sys.executable)') | parts: $* | budget ${BUDGET} s"
} > "$SUMMARY"

# ---------------------------------------------------------------- programs x ranks
# Small but real GPU sizes: each run takes seconds. Results that must not depend on the rank
# count are compared across 1, 2 and 4 ranks afterwards (hits, checksums, digests, losses).
# PROGRAMS_OVERRIDE="name|args;name|args" replaces the list (e.g. simulator sizes).
PROGRAMS=(
    "collectives|"
    "pi-midpoint|--bins 1e10"
    "pi-mc|--samples 1e10 --seed 7"
    "pi-nccl-node|--samples 1e9"
    "pi-nccl-mpi|--samples 1e10"
    "matmul-reduce|"
    "matmul|--n 2048 --kernel fast"
    "conv-halo|--layer c2 --repeats 1"
    "ddp-mlp|--global-batch 32"
    "ddp-digits|"
)

if [ -n "${PROGRAMS_OVERRIDE:-}" ]; then IFS=';' read -r -a PROGRAMS <<< "$PROGRAMS_OVERRIDE"; fi

part_programs() {
    local log=$OUT/programs.log rows=$WORK/programs.jsonl
    : > "$log"; : > "$rows"
    $PY -m hpclab info >> "$log" 2>&1
    timeout 60 $LAUNCH -n 2 $PY -m hpclab info >> "$log" 2>&1
    for entry in "${PROGRAMS[@]}"; do
        local name=${entry%%|*} args=${entry#*|}
        for n in 1 2 4; do
            local limit; limit=$(left)
            if [ "$limit" -lt 20 ]; then
                echo "{\"program\": \"$name\", \"ranks\": $n, \"status\": \"not run (budget)\"}" >> "$rows"
                continue
            fi
            [ "$limit" -gt 240 ] && limit=240
            echo "===== [$(date +%T)] $name -n $n $args" >> "$log"
            local t0=$SECONDS
            # shellcheck disable=SC2086
            timeout "$limit" $LAUNCH -n "$n" $PY -m hpclab run "$name" $args --json > "$WORK/out" 2> "$WORK/err"
            local rc=$? secs=$(( SECONDS - t0 ))
            cat "$WORK/out" "$WORK/err" >> "$log"
            echo "===== rc=$rc after ${secs} s" >> "$log"
            $PY - "$name" "$n" "$rc" "$secs" "$WORK/out" "$WORK/err" >> "$rows" <<'PY'
import json, sys
name, n, rc, secs, out, err = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), *sys.argv[5:]
rec = next((json.loads(l) for l in reversed(open(out).read().splitlines()) if l.startswith("{")), None)
err_text = open(err).read()
row = {"program": name, "ranks": n, "rc": rc, "seconds": secs}
if name == "pi-nccl-node" and n > 1 and "ONE process" in err_text:
    row["status"] = "refused (one process by design)"
elif rec:
    row.update(passed=rec["passed"], ranks_per_gpu=rec.get("ranks_per_gpu"), result=rec["result"])
    row["status"] = "PASS" if rc == 0 and rec["passed"] else "FAIL"
else:
    row["status"] = "TIMEOUT" if rc in (124, 130) else "FAIL"
    row["error"] = next((l for l in err_text.splitlines() if "error" in l.lower()), err_text[-300:])[:300]
print(json.dumps(row, default=str))
PY
        done
    done
    if [ "$(left)" -gt 90 ]; then
        # NCCL asked for on ranks that share a GPU: refused on every rank, before NCCL is touched
        echo "===== [$(date +%T)] refusal: collectives --backend nccl -n 2" >> "$log"
        timeout 60 $LAUNCH -n 2 $PY -m hpclab run collectives --backend nccl >> "$log" 2>&1
        echo "===== rc=$? (non-zero expected, with the ranks, the GPU and the alternatives on every rank)" >> "$log"
        echo "===== [$(date +%T)] bench allreduce --backend all -n 2" >> "$log"
        timeout "$(( $(left) > 90 ? 90 : $(left) ))" $LAUNCH -n 2 $PY -m benchmarks allreduce --backend all \
            --sizes 4,1M,64M >> "$log" 2>&1
        echo "===== rc=$?" >> "$log"
    fi
    $PY - "$rows" >> "$SUMMARY" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
names = list(dict.fromkeys(r["program"] for r in rows))
print("\n## Programs x ranks (one GPU: 2 and 4 ranks share it)\n")
print("| program | 1 rank | 2 ranks | 4 ranks | same result on 1, 2, 4 |\n|---|---|---|---|---|")
def key(name, res):
    """What must not depend on the rank count, and the equality it should meet."""
    if not res:
        return None, None
    if name in ("pi-mc", "pi-nccl-mpi", "pi-nccl-node"):
        return res.get("hits"), "exact"                       # integer hit counts
    if name == "pi-midpoint":
        return [res.get("pi")], 1e-12                          # float64 sums in another order
    if name == "matmul":
        return res.get("c_checksum"), "exact"                  # each element computed alike
    if name == "conv-halo":
        return sorted((v, d["digest"]) for v, d in res.get("versions", {}).items()), "exact"
    if name == "ddp-mlp":
        return res.get("losses"), 1e-9                         # gradient sums in another order
    if name == "collectives":
        return res.get("ring_matches_mpi"), "exact"
    return None, None
def same(values, how):
    if how == "exact":
        return all(v == values[0] for v in values)
    return all(len(v) == len(values[0]) and all(abs(a - b) <= how * max(abs(b), 1e-300)
                                                for a, b in zip(v, values[0])) for v in values)
for name in names:
    mine = {r["ranks"]: r for r in rows if r["program"] == name}
    cells = []
    for n in (1, 2, 4):
        r = mine.get(n, {"status": "-"})
        extra = f", {r['seconds']} s" if "seconds" in r else ""
        if (r.get("ranks_per_gpu") or 1) > 1:
            extra += f", {r['ranks_per_gpu']}/GPU"
        cells.append(f"{r['status']}{extra}")
    keyed = [key(name, r.get("result")) for n, r in sorted(mine.items()) if r.get("result")]
    values = [k for k, how in keyed if k is not None]
    how = next((h for _, h in keyed if h), None)
    verdict = "-" if len(values) < 2 else (f"yes ({how if how == 'exact' else f'rel. {how:g}'})"
                                           if same(values, how) else f"NO: {values}")
    print(f"| {name} | {' | '.join(cells)} | {verdict} |")
for r in rows:
    if r.get("error"):
        print(f"\n- {r['program']} -n {r['ranks']}: {r['error']}")
PY
}

# ---------------------------------------------------------------- notebooks x engines
part_notebooks() {
    local n=$1 limit; limit=$(left)
    local log=$OUT/notebooks-$n.log xml=$WORK/notebooks-$n.xml
    if [ "$limit" -lt 60 ]; then
        printf '\n## Notebooks on %s engine(s): not run (budget)\n' "$n" >> "$SUMMARY"; return
    fi
    local t0=$SECONDS
    IPYTHONDIR=$(mktemp -d) HPCLAB_ENGINES=$n timeout -s INT -k 30 "$limit" $PY -m pytest -v -p no:cacheprovider \
        --nbval-lax --nbval-cell-timeout=600 --junitxml="$xml" ${NOTEBOOKS:-notebooks solutions} > "$log" 2>&1
    local rc=$?
    echo "exit $rc after $(( SECONDS - t0 )) s" >> "$log"
    $PY - "$n" "$xml" "$log" "$rc" >> "$SUMMARY" <<'PY'
import sys, xml.etree.ElementTree as ET
n, xml, log, rc = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
stopped = " — stopped by the budget: what is not listed did not run" if rc == "124" else ""
print(f"\n## Notebooks on {n} GPU engine(s) (exit {rc}{stopped})\n")
try:
    cases = ET.parse(xml).getroot().iter("testcase")
except (OSError, ET.ParseError):
    print(f"no junit report; see notebooks-{n}.log"); sys.exit(0)
books = {}
for c in cases:
    book = c.get("classname")                 # e.g. notebooks.05_gpu_communication.ipynb
    if not book:
        continue                              # the session's own entry (e.g. interrupted)
    b = books.setdefault(book, {"cells": 0, "failed": 0, "seconds": 0.0})
    b["cells"] += 1
    b["seconds"] += float(c.get("time", 0))
    b["failed"] += any(x.tag in ("failure", "error") for x in c)
print("| notebook | cells | result | seconds |\n|---|---|---|---|")
for book, b in books.items():
    print(f"| {book} | {b['cells']} | {'pass' if not b['failed'] else str(b['failed']) + ' FAILED'} | {b['seconds']:.1f} |")
tail = [l for l in open(log).read().splitlines() if " passed" in l or " failed" in l][-1:]
print("\n" + (tail[0] if tail else "(no pytest summary line: stopped by the budget?)"))
PY
}

# ---------------------------------------------------------------- make test-gpu
part_suite() {   # part_suite [tests|notebooks]: the whole suite, or one half of it
    local half=${1:-} limit; limit=$(left)
    local label=suite${half:+-$half} t0=$SECONDS paths=""
    local log=$OUT/$label.log
    case $half in tests) paths="tests" ;; notebooks) paths="notebooks solutions" ;; esac
    if [ "$limit" -lt 60 ]; then printf '\n## %s: not run (budget)\n' "$label" >> "$SUMMARY"; return; fi
    if command -v make > /dev/null; then
        IPYTHONDIR=$(mktemp -d) HPCLAB_TEST_PATHS=$paths timeout -s INT -k 30 "$limit" \
            make test-gpu PYTHON_RUN="$PY" > "$log" 2>&1
    else   # what the make target runs
        IPYTHONDIR=$(mktemp -d) HPCLAB_TEST_PATHS=$paths PYTHON_RUN="$PY" timeout -s INT -k 30 "$limit" \
            bash benchmarks/test_gpu.sh > "$log" 2>&1
    fi
    local rc=$?
    echo "exit $rc after $(( SECONDS - t0 )) s" >> "$log"
    {
        printf '\n## make test-gpu%s (exit %s%s, %s s)\n\n' "${half:+, $half only}" "$rc" \
            "$([ "$rc" = 124 ] && echo ': stopped by the budget')" "$(( SECONDS - t0 ))"
        grep -E '^(=+ )?[0-9]+ (passed|failed)|^make test-gpu: [0-9]|^FAILED|^ERROR|KeyboardInterrupt' "$log" | tail -n 40
        echo; echo "skipped, by reason:"
        grep '^SKIPPED' "$log" | sed -E 's/^SKIPPED \[([0-9]+)\] ([^ :]+:[0-9]+: )?/\1x /' | sort -rn | head -n 20
        echo; echo "slowest:"; sed -n '/slowest .*durations/,/^$/p' "$log" | head -n 22
    } >> "$SUMMARY"
}

run_part() {
    case $1 in
        programs) part_programs ;;
        notebooks:*) part_notebooks "${1#notebooks:}" ;;
        suite) part_suite ;;
        suite:tests) part_suite tests ;;
        suite:notebooks) part_suite notebooks ;;
        *) echo "unknown part $1 (programs | notebooks:N | suite)" | tee -a "$SUMMARY"; return 2 ;;
    esac
}

for group in "$@"; do
    echo "[$(date +%T)] $group ($(left) s of the budget left)"
    IFS=+ read -r -a parts <<< "$group"
    pids=()
    for part in "${parts[@]}"; do
        run_part "$part" & pids+=($!)
    done
    for pid in "${pids[@]}"; do wait "$pid"; done
done
printf '\ntotal %s s\n' "$(( SECONDS - START ))" >> "$SUMMARY"
rm -rf "$WORK"
cat "$SUMMARY"
ls -l "$OUT"
