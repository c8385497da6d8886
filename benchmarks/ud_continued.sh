#!/usr/bin/env bash
# The UD tagger from an encoder whose pre-training continued on the treebank's own training text
# (the `ud-mlm` preset), beside the tagger from the WikiText-2 encoder alone, the same fine-tuning
# for both (BENCHMARKS.md, "Continued pre-training on the treebank's text").
#   bash benchmarks/ud_continued.sh ../shared/data runs logs
# Needs $RUNS/wikitext2-mlm (stage 1 of benchmarks/encoder_runs.sh). CONTROL=0 leaves out the
# tagger from the WikiText-2 encoder alone (when encoder_runs.sh has made it already).
set -euo pipefail
DATA=${1:-../shared/data}; RUNS=${2:-runs}; LOGS=${3:-logs}
mkdir -p "$LOGS"
UD=(--data-dir "$DATA/ud-english-ewt")
NICE=(); [ "$(id -u)" = 0 ] && NICE=(nice -n -15)
BF16=(--set 'train.dtype="bfloat16"')  # only where the CPU has bf16 matrix kernels (encoder_runs.sh)
python -c 'import sys; from attnlab.device import cpu_has_bf16_matmul; sys.exit(not cpu_has_bf16_matmul())' || BF16=()

# Continued pre-training on both cores, then the two fine-tunings single-threaded side by side.
OMP_NUM_THREADS=2 "${NICE[@]}" attnlab train ud-mlm "${UD[@]}" --init-from "$RUNS/wikitext2-mlm" \
  --out "$RUNS/ud-mlm" --quiet "${BF16[@]}" > "$LOGS/ud-mlm.log" 2>&1
export OMP_NUM_THREADS=1
TAGGERS=(ud-pos-continued)
attnlab train ud-pos "${UD[@]}" --init-from "$RUNS/ud-mlm" --out "$RUNS/ud-pos-continued" --quiet "${BF16[@]}" \
  > "$LOGS/ud-pos-continued.log" 2>&1 &
if [ "${CONTROL:-1}" != 0 ]; then
  TAGGERS+=(ud-pos-pretrained)
  attnlab train ud-pos "${UD[@]}" --init-from "$RUNS/wikitext2-mlm" --out "$RUNS/ud-pos-pretrained" --quiet \
    "${BF16[@]}" > "$LOGS/ud-pos-pretrained.log" 2>&1 &
fi
wait
for run in "${TAGGERS[@]}"; do
  attnlab eval "$RUNS/$run" --split test --json "${UD[@]}" > "$LOGS/$run-test.json"
done
