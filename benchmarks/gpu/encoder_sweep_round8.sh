#!/usr/bin/env bash
# Issue 4, round 8: how many steps of the preset's pre-training (no dropout, peak 1e-3) clear the
# targets with a margin: 6,000 and 8,000 steps, two pre-training seeds each, each fine-tuned with
# two seeds (UD as the table; SST-2 2,000 steps at 2e-4). Results in $RES (default /tmp/sweep8).
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .gpu/whl/*.whl || exit 1
export PYTHONPATH=$PWD/src:/tmp/site PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1
D=$PWD/.gpu/data; R=/tmp/runs8; RES=${RES:-/tmp/sweep8}; L=$RES/logs; mkdir -p $R $L
T0=$(date +%s); stamp() { echo "$1 at $(( $(date +%s) - T0 )) s" >> $RES/progress.txt; }
A() { timeout 400 python3 -m attnlab "$@" --quiet --set 'train.dtype="bfloat16"' --set 'train.device="cuda"'; }
E() { python3 -m attnlab eval "$1" --split $2 --json --device cuda > $L/$(basename $1).test.json 2>>$L/$(basename $1).log; }
UD=(--data-dir $D/ud-english-ewt --set train.eval_interval=200)
ud() { n=$1; shift; A train ud-pos "${UD[@]}" --out $R/$n "$@" > $L/$n.log 2>&1; E $R/$n test; }
SST=(--data-dir $D/sst2 --set train.eval_interval=200 --set train.warmup_iters=100 --set train.max_iters=2000 --set train.learning_rate=2e-4)
sst() { n=$1; shift; A train sst2 "${SST[@]}" --out $R/$n "$@" > $L/$n.log 2>&1; E $R/$n dev; }
for n in 6000 8000; do for s in 1 2; do
  A train wikitext2-mlm --data-dir $D/wikitext-2 --out $R/p$n-s$s --set train.max_iters=$n --set train.seed=$s > $L/p$n-s$s.log 2>&1 &
done; done
wait; stamp "pre-training done"
for n in 6000 8000; do for s in 1 2; do for f in 1 2; do
  ud u-p$n-s$s-f$f --init-from $R/p$n-s$s --set train.seed=$f &
  sst s-p$n-s$s-f$f --init-from $R/p$n-s$s --set train.seed=$f &
done; done; done
wait; stamp "fine-tuning done"
for r in $R/*; do cp $r/metrics.csv $L/$(basename $r).metrics.csv 2>/dev/null; done
stamp done; touch $RES/done
