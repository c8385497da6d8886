#!/usr/bin/env bash
# Issue 4, round 5: how far does pre-training have to go for UD >= 0.945 and SST-2 >= 0.83, and does
# pre-training without dropout (1.18x the steps per CPU hour, benchmarks/mlm_step.py) cost accuracy
# per step? Issue 5: `attnlab bench --device cuda` with 5 repeats, eager and compiled, first, alone on
# the GPU. Everything lands in $RES (default /tmp/sweep5); the caller copies it out.
R=/tmp/runs; RES=${RES:-/tmp/sweep5}; RUN_LIMIT=900
source benchmarks/gpu/sweep_common.sh
SST+=(--set train.max_iters=1000)
for c in "" "--compile"; do
  timeout 180 python3 -m attnlab bench --device cuda --repeats 5 $c --json --out $RES/bench-cuda${c:+-compile}.json > $RES/bench${c:+-compile}.log 2>&1
  stamp "bench $c rc=$?"
done
export OMP_NUM_THREADS=1
# The preset as it was when this ran (dropout 0.1, peak 7e-4), spelled out: it has changed since.
mlm() { n=$1; s=$2; shift 2; A train wikitext2-mlm --data-dir $D/wikitext-2 --out $R/$n --set train.max_iters=$s \
  --set train.eval_interval=500 --set data.mask_prob=0.4 --set model.dropout=0.1 --set train.learning_rate=7e-4 \
  "$@" > $L/$n.log 2>&1; }
D0=(--set model.dropout=0.0)
mlm m3k 3000 &                        # the CPU recipe as it is (dropout 0.1)
mlm m4k-d0 4000 "${D0[@]}" &          # what ~1.3x faster steps would fit in the CPU hour
mlm m6k-d0 6000 "${D0[@]}" &
mlm m8k-d0 8000 "${D0[@]}" &
mlm m4k-d0-lr1e-3 4000 "${D0[@]}" --set train.learning_rate=1e-3 &
mlm m4k-d0-pre 4000 "${D0[@]}" --set 'model.norm="pre"' &
mlm m6k-d0-pre 6000 "${D0[@]}" --set 'model.norm="pre"' &
mlm m4k-d0-v8k 4000 "${D0[@]}" --set data.vocab_size=8000 &
wait; stamp "pre-training done"
for m in m3k m4k-d0 m6k-d0 m8k-d0 m4k-d0-lr1e-3 m4k-d0-pre m6k-d0-pre m4k-d0-v8k; do
  ud u-$m --init-from $R/$m &
  sst s-$m --init-from $R/$m &
done
sst s2k-m6k-d0 --init-from $R/m6k-d0 --set train.learning_rate=2e-4 --set train.max_iters=2000 &
sst s2k-m8k-d0 --init-from $R/m8k-d0 --set train.learning_rate=2e-4 --set train.max_iters=2000 &
wait; stamp "fine-tuning done"
finish
