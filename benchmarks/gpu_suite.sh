#!/usr/bin/env bash
# Run several topics' GPU scripts in one job on a GPU node, from the repository root:
#   OUT=results bash benchmarks/gpu_suite.sh pi matmul comm
# Each topic's files are packed into $OUT/results.tgz (as <topic>/...), and the
# whole log is $OUT/suite.log.
set -u
OUT=${OUT:-build/gpu}; mkdir -p "$OUT"
WORK=$(mktemp -d)
source benchmarks/offline_env.sh
echo "hpclab GPU suite $(date -u +%FT%TZ) on $(hostname): $(nvidia-smi -L | wc -l) GPU(s)" | tee "$OUT/suite.log"
nvidia-smi -L | tee -a "$OUT/suite.log"
for topic in "$@"; do
    mkdir -p "$WORK/$topic"
    echo "##### $topic $(date +%T)" | tee -a "$OUT/suite.log"
    OUT="$WORK/$topic" bash "benchmarks/$topic/gpu_run.sh" 2>&1 | tee -a "$OUT/suite.log"
    echo "##### $topic done $(date +%T) rc=${PIPESTATUS[0]}" | tee -a "$OUT/suite.log"
    # pack after every topic, so a job stopped at its time limit keeps what finished
    tar czf "$OUT/results.tgz" -C "$WORK" .
done
