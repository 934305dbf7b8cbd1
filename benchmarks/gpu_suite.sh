#!/usr/bin/env bash
# Run several topics' GPU scripts in one job on a GPU node, from the repository root:
#   OUT=results bash benchmarks/gpu_suite.sh pi matmul comm
# Each topic's files go to $OUT/<topic>/, the whole log to $OUT/suite.log, and
# everything is also packed into $OUT/results.tgz.
set -u
OUT=${OUT:-build/gpu}; mkdir -p "$OUT"
source benchmarks/offline_env.sh
echo "hpclab GPU suite $(date -u +%FT%TZ) on $(hostname): $(nvidia-smi -L | wc -l) GPU(s)" | tee "$OUT/suite.log"
nvidia-smi -L | tee -a "$OUT/suite.log"
for topic in "$@"; do
    mkdir -p "$OUT/$topic"
    echo "##### $topic $(date +%T)" | tee -a "$OUT/suite.log"
    OUT="$OUT/$topic" bash "benchmarks/$topic/gpu_run.sh" 2>&1 | tee -a "$OUT/suite.log"
    echo "##### $topic done $(date +%T) rc=${PIPESTATUS[0]}" | tee -a "$OUT/suite.log"
done
tar czf "$OUT/results.tgz" -C "$OUT" "$@" suite.log
