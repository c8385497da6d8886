#!/usr/bin/env bash
# Issue 4, round 8: how many steps of the preset's pre-training (no dropout, peak 1e-3) clear the
# targets with a margin: 6,000 and 8,000 steps, two pre-training seeds each, each fine-tuned with
# two seeds (UD as the table; SST-2 2,000 steps at 2e-4). Results in $RES (default /tmp/sweep8).
R=/tmp/runs8; RES=${RES:-/tmp/sweep8}; RUN_LIMIT=400
source benchmarks/gpu/sweep_common.sh
SST+=(--set train.max_iters=2000 --set train.learning_rate=2e-4)
export OMP_NUM_THREADS=1
for n in 6000 8000; do for s in 1 2; do
  A train wikitext2-mlm --data-dir $D/wikitext-2 --out $R/p$n-s$s --set train.max_iters=$n --set train.seed=$s > $L/p$n-s$s.log 2>&1 &
done; done
wait; stamp "pre-training done"
for n in 6000 8000; do for s in 1 2; do for f in 1 2; do
  ud u-p$n-s$s-f$f --init-from $R/p$n-s$s --set train.seed=$f &
  sst s-p$n-s$s-f$f --init-from $R/p$n-s$s --set train.seed=$f &
done; done; done
wait; stamp "fine-tuning done"
finish
