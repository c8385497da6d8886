#!/usr/bin/env bash
# Issue 4, round 7: fine-tuning settings on the new preset's encoder (4,000 steps, no dropout, peak
# 1e-3; UD 0.9443 - 0.9454 with the table's fine-tuning in rounds 5-6), two seeds each; SST-2 from
# scratch at the rate the CPU chain uses (5e-4, 2,000 steps). Results in $RES (default /tmp/sweep7).
R=/tmp/runs7; RES=${RES:-/tmp/sweep7}; RUN_LIMIT=500
source benchmarks/gpu/sweep_common.sh
SST+=(--set train.max_iters=2000)
export OMP_NUM_THREADS=1
A train wikitext2-mlm --data-dir $D/wikitext-2 --out $R/p > $L/p.log 2>&1 &   # the preset as it is now
for s in 1 2; do
  sst s-scratch-lr5e-4-s$s --set train.seed=$s &
  ud u-scratch-3k-s$s --set data.token_dropout=0.2 --set train.learning_rate=1e-3 --set train.max_iters=3000 --set train.seed=$s &
done
wait; stamp "pre-training done"
I=(--init-from $R/p)
for s in 1 2; do
  S=(--set train.seed=$s)
  ud u-base-s$s "${I[@]}" "${S[@]}" &
  ud u-td15-s$s "${I[@]}" "${S[@]}" --set data.token_dropout=0.15 &
  ud u-td20-s$s "${I[@]}" "${S[@]}" --set data.token_dropout=0.2 &
  ud u-lr3e-4-s$s "${I[@]}" "${S[@]}" --set train.learning_rate=3e-4 &
  ud u-lr7e-4-s$s "${I[@]}" "${S[@]}" --set train.learning_rate=7e-4 &
  ud u-3k-s$s "${I[@]}" "${S[@]}" --set train.max_iters=3000 &
  ud u-drop2-s$s "${I[@]}" "${S[@]}" --set model.dropout=0.2 &
  ud u-ls-s$s "${I[@]}" "${S[@]}" --set train.label_smoothing=0.1 &
  sst s-lr2e-4-s$s "${I[@]}" "${S[@]}" --set train.learning_rate=2e-4 &
  sst s-lr1e-4-s$s "${I[@]}" "${S[@]}" --set train.learning_rate=1e-4 &
done
wait; stamp "fine-tuning done"
finish
