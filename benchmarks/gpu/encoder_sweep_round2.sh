#!/usr/bin/env bash
# Issue-4 exploration, round 2: sinusoid-initialised learned positions. Issue-5 first look: the
# shakespeare-char preset on the H200 (capped at 200 s).
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .gpu/whl/*.whl || exit 1
export PYTHONPATH=$PWD/src:/tmp/site PYTHONUNBUFFERED=1
D=$PWD/.gpu/data; R=/tmp/runs; L=$OUT/logs; mkdir -p $R $L
python3 -c "import torch; print(torch.__version__, torch.cuda.get_device_name())"
timeout 200 python3 -m attnlab train shakespeare-char --data-dir $D/tinyshakespeare --out $R/shakes --set 'train.device="cuda"' > $L/shakes.log 2>&1
tail -3 $L/shakes.log; cp $R/shakes/metrics.csv $L/shakes.metrics.csv
export OMP_NUM_THREADS=1
A() { python3 -m attnlab "$@" --quiet --set 'train.dtype="bfloat16"' --set 'train.device="cuda"'; }
E() { python3 -m attnlab eval "$1" --split $2 --json --device cuda > $L/$(basename $1).test.json 2>>$L/$(basename $1).log; }
MLM=(--data-dir $D/wikitext-2 --set train.max_iters=4000 --set train.eval_interval=500 --set 'model.position_init="sinusoidal"')
mlm() { n=$1; shift; A train wikitext2-mlm "${MLM[@]}" --out $R/$n "$@" > $L/$n.log 2>&1; }
PRE=(--set 'model.norm="pre"' --set train.learning_rate=1e-3)
T0=$(date +%s)
mlm n1-post-sin &
mlm n2-pre-m40-sin "${PRE[@]}" --set data.mask_prob=0.4 &
mlm n3-pre-m40-lr2e-3-sin --set 'model.norm="pre"' --set train.learning_rate=2e-3 --set data.mask_prob=0.4 &
mlm n4-post-m40-sin --set data.mask_prob=0.4 &
mlm n5-pre-m40-sin-cased "${PRE[@]}" --set data.mask_prob=0.4 --set data.lowercase=false &
mlm n6-pre-sin "${PRE[@]}" &
UD=(--data-dir $D/ud-english-ewt --set train.eval_interval=200)
ud() { n=$1; shift; A train ud-pos "${UD[@]}" --out $R/$n "$@" > $L/$n.log 2>&1; E $R/$n test; }
SST=(--data-dir $D/sst2 --set train.max_iters=1000 --set train.eval_interval=200 --set train.warmup_iters=100)
sst() { n=$1; shift; A train sst2 "${SST[@]}" --out $R/$n "$@" > $L/$n.log 2>&1; E $R/$n dev; }
C2K=(--set train.max_iters=2000 --set train.warmup_iters=200 --set data.lowercase=false --set 'model.position_init="sinusoidal"')
ud t-ud-sin "${C2K[@]}" &
ud t-ud-sin-pre "${C2K[@]}" --set 'model.norm="pre"' &
ud t-ud-sin-drop2 "${C2K[@]}" --set model.dropout=0.2 &
ud t-ud-sin-3k "${C2K[@]}" --set train.max_iters=3000 &
ud t-ud-nosin "${C2K[@]}" --set 'model.position_init="normal"' &
sst t-sst-sin --set 'model.position_init="sinusoidal"' &
wait
echo "phase 1 done in $(( $(date +%s) - T0 )) s"
for m in n1-post-sin n2-pre-m40-sin n3-pre-m40-lr2e-3-sin n4-post-m40-sin n5-pre-m40-sin-cased n6-pre-sin; do
  [ -f $R/$m/config.toml ] || continue
  ud g-ud-$m --set train.max_iters=2000 --set train.warmup_iters=200 --init-from $R/$m &
  sst g-sst-$m --init-from $R/$m &
done
wait
echo "all done in $(( $(date +%s) - T0 )) s"
for r in $R/*; do cp $r/metrics.csv $L/$(basename $r).metrics.csv; done
cd $OUT && tar czf sweep.tgz logs && rm -rf logs
