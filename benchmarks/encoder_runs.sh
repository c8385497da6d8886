#!/usr/bin/env bash
# The runs behind the encoder table in BENCHMARKS.md, two single-threaded chains side by side on a
# 2-core machine (one thread each: two 2-thread pools on 2 cores would stall each other).
#   bash benchmarks/encoder_runs.sh ../shared/data runs logs
# Chain A: masked-LM pre-training on WikiText-2, then the two pre-trained fine-tunings.
# Chain B: the same encoder from random initialisation (same vocabulary, same steps), and the BiLSTM.
set -euo pipefail
DATA=${1:-../shared/data}; RUNS=${2:-runs}; LOGS=${3:-logs}
mkdir -p "$RUNS" "$LOGS"
export OMP_NUM_THREADS=1
BF16=(--set 'train.dtype="bfloat16"')
UD=(--data-dir "$DATA/ud-english-ewt" --set train.max_iters=600 --set train.eval_interval=100 --set train.warmup_iters=60)
SST=(--data-dir "$DATA/sst2" --set train.max_iters=1000 --set train.eval_interval=200 --set train.warmup_iters=100)
VOCAB=(--set "data.tokenizer=\"$RUNS/wikitext2-mlm\"")

chain_a() {
  attnlab train wikitext2-mlm --data-dir "$DATA/wikitext-2" --out "$RUNS/wikitext2-mlm" --quiet "${BF16[@]}"
  attnlab train ud-pos "${UD[@]}" --init-from "$RUNS/wikitext2-mlm" --out "$RUNS/ud-pos-pretrained" --quiet "${BF16[@]}"
}
chain_b() {
  until [ -f "$RUNS/wikitext2-mlm/tokenizer.json" ]; do sleep 5; done
  attnlab train ud-pos "${UD[@]}" "${VOCAB[@]}" --out "$RUNS/ud-pos-scratch" --quiet "${BF16[@]}"
  attnlab train sst2 "${SST[@]}" "${VOCAB[@]}" --out "$RUNS/sst2-scratch" --quiet "${BF16[@]}"
  attnlab train ud-pos-bilstm "${UD[@]}" "${VOCAB[@]}" --out "$RUNS/ud-pos-bilstm" --quiet
  attnlab train sst2-bilstm "${SST[@]}" "${VOCAB[@]}" --out "$RUNS/sst2-bilstm" --quiet
  # chain A has moved on to fine-tuning: the pre-training run is complete
  until [ -f "$RUNS/ud-pos-pretrained/config.toml" ]; do sleep 5; done
  attnlab train sst2 "${SST[@]}" --init-from "$RUNS/wikitext2-mlm" --out "$RUNS/sst2-pretrained" --quiet "${BF16[@]}"
}
chain_a > "$LOGS/encoders-chain-a.log" 2>&1 &
chain_b > "$LOGS/encoders-chain-b.log" 2>&1 &
wait
