#!/usr/bin/env bash
# Issue-4 round 3: the CPU-sized recipes (post-norm, cased, sinusoid-initialised positions) and
# token dropout; then issue 5's first look at shakespeare-char on the H200 (capped).
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .gpu/whl/*.whl || exit 1
export PYTHONPATH=$PWD/src:/tmp/site PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1
D=$PWD/.gpu/data; R=/tmp/runs; L=$OUT/logs; mkdir -p $R $L
A() { python3 -m attnlab "$@" --quiet --set 'train.dtype="bfloat16"' --set 'train.device="cuda"'; }
E() { python3 -m attnlab eval "$1" --split $2 --json --device cuda > $L/$(basename $1).test.json 2>>$L/$(basename $1).log; }
MLM=(--data-dir $D/wikitext-2 --set train.eval_interval=500 --set 'model.position_init="sinusoidal"' --set data.lowercase=false)
mlm() { n=$1; shift; A train wikitext2-mlm "${MLM[@]}" --out $R/$n "$@" > $L/$n.log 2>&1; }
UD=(--data-dir $D/ud-english-ewt --set train.eval_interval=200)
ud() { n=$1; shift; A train ud-pos "${UD[@]}" --out $R/$n "$@" > $L/$n.log 2>&1; E $R/$n test; }
SST=(--data-dir $D/sst2 --set train.eval_interval=200 --set train.warmup_iters=100)
sst() { n=$1; shift; A train sst2 "${SST[@]}" --out $R/$n "$@" > $L/$n.log 2>&1; E $R/$n dev; }
T0=$(date +%s)
mlm p1-m15-3500 --set train.max_iters=3500 &
mlm p2-m40-3000 --set train.max_iters=3000 --set data.mask_prob=0.4 &
C2K=(--set train.max_iters=2000 --set train.warmup_iters=200 --set data.lowercase=false)
ud u1-td10 "${C2K[@]}" --set data.token_dropout=0.1 &
ud u2-td20 "${C2K[@]}" --set data.token_dropout=0.2 &
ud u3-v2k "${C2K[@]}" --set data.vocab_size=2000 &
ud u4-td15-3k "${C2K[@]}" --set data.token_dropout=0.15 --set train.max_iters=3000 &
ud u5-td20-v4k-sin "${C2K[@]}" --set data.token_dropout=0.2 --set data.vocab_size=4000 --set 'model.position_init="sinusoidal"' &
ud u6-td30 "${C2K[@]}" --set data.token_dropout=0.3 &
wait
echo "phase 1 done in $(( $(date +%s) - T0 )) s"
for m in p1-m15-3500 p2-m40-3000; do
  [ -f $R/$m/config.toml ] || continue
  I=(--init-from $R/$m)
  ud h-ud-$m "${I[@]}" --set train.max_iters=2000 --set train.warmup_iters=200 &
  ud h-ud3k-$m "${I[@]}" --set train.max_iters=3000 --set train.warmup_iters=300 &
  ud h-udtd-$m "${I[@]}" --set train.max_iters=2000 --set train.warmup_iters=200 --set data.token_dropout=0.1 &
  ud h-udlr3-$m "${I[@]}" --set train.max_iters=2000 --set train.warmup_iters=200 --set train.learning_rate=3e-4 &
  sst h-sst-$m "${I[@]}" --set train.max_iters=1000 &
  sst h-ssttd-$m "${I[@]}" --set train.max_iters=1000 --set data.token_dropout=0.1 &
  sst h-sst15-$m "${I[@]}" --set train.max_iters=1500 &
done
wait
echo "all done in $(( $(date +%s) - T0 )) s"
for r in $R/*; do cp $r/metrics.csv $L/$(basename $r).metrics.csv; done
timeout 170 python3 -m attnlab train shakespeare-char --out $R/shakes --set 'train.device="cuda"' > $L/shakes.log 2>&1
tail -4 $L/shakes.log; cp $R/shakes/metrics.csv $L/shakes.metrics.csv
nvidia-smi --query-gpu=name,clocks.sm,memory.used --format=csv
cd $OUT && tar czf sweep.tgz logs && rm -rf logs
