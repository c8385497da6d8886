#!/usr/bin/env bash
# Issue 4, round 6: round 5's best pre-training (no dropout, peak lr 1e-3: UD 0.9454 after 4,000
# steps) at the step counts a CPU hour holds (3,000 - 4,000), a second seed, a higher peak rate;
# SST-2 fine-tuned gently (lr 2e-4, 2,000 steps: 0.845 - 0.847 in round 5) from each, and from
# scratch with the same budget. Results in $RES (default /tmp/sweep6).
R=/tmp/runs6; RES=${RES:-/tmp/sweep6}; RUN_LIMIT=600
source benchmarks/gpu/sweep_common.sh
SST+=(--set train.max_iters=2000 --set train.learning_rate=2e-4)
export OMP_NUM_THREADS=1
mlm() { n=$1; s=$2; shift 2; A train wikitext2-mlm --data-dir $D/wikitext-2 --out $R/$n --set train.max_iters=$s \
  --set train.eval_interval=500 --set data.mask_prob=0.4 --set model.dropout=0.0 "$@" > $L/$n.log 2>&1; }
LR1=(--set train.learning_rate=1e-3)
mlm n3k 3000 "${LR1[@]}" &
mlm n3500 3500 "${LR1[@]}" &
mlm n4k 4000 "${LR1[@]}" &
mlm n4k-s2 4000 "${LR1[@]}" --set train.seed=2 &
mlm n3k-lr15 3000 --set train.learning_rate=1.5e-3 &
mlm n4k-lr15 4000 --set train.learning_rate=1.5e-3 &
sst s-scratch &
sst s-scratch-s2 --set train.seed=2 &
ud u-scratch --set data.token_dropout=0.2 --set train.learning_rate=1e-3 &
wait; stamp "pre-training done"
for m in n3k n3500 n4k n4k-s2 n3k-lr15 n4k-lr15; do
  ud u-$m --init-from $R/$m &
  sst s-$m --init-from $R/$m &
done
ud u-n4k-ft2 --init-from $R/n4k --set train.seed=2 &
sst s-n4k-ft2 --init-from $R/n4k --set train.seed=2 &
wait; stamp "fine-tuning done"
finish
