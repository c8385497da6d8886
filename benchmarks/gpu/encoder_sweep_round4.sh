#!/usr/bin/env bash
# Issue-4 round 4 (fine-tuning settings on the CPU recipe) and issue 5: shakespeare-char on the H200.
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .gpu/whl/*.whl || exit 1
export PYTHONPATH=$PWD/src:/tmp/site PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1
D=$PWD/.gpu/data; R=/tmp/runs; L=$OUT/logs; mkdir -p $R $L
A() { python3 -m attnlab "$@" --quiet --set 'train.dtype="bfloat16"' --set 'train.device="cuda"'; }
E() { python3 -m attnlab eval "$1" --split $2 --json --device cuda > $L/$(basename $1).test.json 2>>$L/$(basename $1).log; }
UD=(--data-dir $D/ud-english-ewt --set train.eval_interval=200)
ud() { n=$1; shift; A train ud-pos "${UD[@]}" --out $R/$n "$@" > $L/$n.log 2>&1; E $R/$n test; }
SST=(--data-dir $D/sst2 --set train.eval_interval=200 --set train.warmup_iters=100 --set train.max_iters=1000)
sst() { n=$1; shift; A train sst2 "${SST[@]}" --out $R/$n "$@" > $L/$n.log 2>&1; E $R/$n dev; }
T0=$(date +%s)
A train wikitext2-mlm --data-dir $D/wikitext-2 --out $R/q0 --set train.max_iters=3000 --set train.eval_interval=500 --set data.mask_prob=0.4 > $L/q0.log 2>&1 &
S=(--set data.token_dropout=0.2)
ud v1 "${S[@]}" &
ud v2-ls "${S[@]}" --set train.label_smoothing=0.1 &
ud v3-lr1e-3 "${S[@]}" --set train.learning_rate=1e-3 &
ud v4-mt2k "${S[@]}" --set data.max_tokens=2048 &
ud v5-td25-3k --set data.token_dropout=0.25 --set train.max_iters=3000 &
ud v7-6l "${S[@]}" --set model.n_layers=6 &
ud v8-drop2 "${S[@]}" --set model.dropout=0.2 &
wait
echo "phase 1 done in $(( $(date +%s) - T0 )) s"
I=(--init-from $R/q0)
ud w1 "${I[@]}" &
ud w2-td20 "${I[@]}" --set data.token_dropout=0.2 &
ud w3-ls "${I[@]}" --set train.label_smoothing=0.1 &
ud w4-lr3e-4 "${I[@]}" --set train.learning_rate=3e-4 &
ud w5-td15-3k "${I[@]}" --set data.token_dropout=0.15 --set train.max_iters=3000 &
ud w6-drop2 "${I[@]}" --set model.dropout=0.2 &
sst x1 "${I[@]}" &
sst x2-lr3e-4 "${I[@]}" --set train.learning_rate=3e-4 &
sst x3-lr2e-4-1500 "${I[@]}" --set train.learning_rate=2e-4 --set train.max_iters=1500 &
sst x4-mt1k "${I[@]}" --set data.max_tokens=1024 &
sst x5-drop2 "${I[@]}" --set model.dropout=0.2 &
sst x6-ls "${I[@]}" --set train.label_smoothing=0.1 &
wait
echo "all done in $(( $(date +%s) - T0 )) s"
for r in $R/*; do cp $r/metrics.csv $L/$(basename $r).metrics.csv; done
cd $OUT && tar czf sweep.tgz logs && rm -rf logs
cd - >/dev/null; mkdir -p $L
unset OMP_NUM_THREADS
for c in true false; do
  t=$(date +%s.%N)
  timeout 140 python3 -m attnlab train shakespeare-char --out $R/shakes-$c --set train.max_iters=2500 --set train.lr_decay_iters=2500 --set train.compile=$c --quiet > $L/shakes-$c.log 2>&1
  echo "shakes compile=$c wall $(python3 -c "import time;print(round(time.time()-$t,1))") s"; tail -2 $L/shakes-$c.log; cp $R/shakes-$c/metrics.csv $L/shakes-$c.metrics.csv
done
cd $OUT && tar czf shakes.tgz logs && rm -rf logs
