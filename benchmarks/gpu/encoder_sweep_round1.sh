#!/usr/bin/env bash
# Issue-4 exploration on the GPU: which MLM recipe escapes the frequent-word plateau within the
# CPU step budget, and which fine-tuning settings matter. Same steps/batches as the CPU runs.
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .gpu/whl/*.whl || exit 1
export PYTHONPATH=$PWD/src:/tmp/site OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1
D=$PWD/.gpu/data; R=/tmp/runs; L=$OUT/logs; mkdir -p $R $L
A() { python3 -m attnlab "$@" --quiet --set 'train.dtype="bfloat16"' --set 'train.device="cuda"'; }
MLM=(--data-dir $D/wikitext-2 --set train.max_iters=${MLM_STEPS:-4000} --set train.eval_interval=500)
mlm() { n=$1; shift; A train wikitext2-mlm "${MLM[@]}" --out $R/$n "$@" > $L/$n.log 2>&1; }
nvidia-smi --query-gpu=name,memory.used --format=csv
T0=$(date +%s)
mlm m1-base &
mlm m2-mask40 --set data.mask_prob=0.4 &
mlm m3-pre --set 'model.norm="pre"' --set train.learning_rate=1e-3 &
mlm m4-pre-mask40 --set 'model.norm="pre"' --set train.learning_rate=1e-3 --set data.mask_prob=0.4 &
mlm m5-lr3e-4 --set train.learning_rate=3e-4 --set train.warmup_iters=400 &
mlm m6-pre-mask40-cased --set 'model.norm="pre"' --set train.learning_rate=1e-3 --set data.mask_prob=0.4 --set data.lowercase=false &
# from-scratch taggers meanwhile
UD=(--data-dir $D/ud-english-ewt --set train.eval_interval=200)
ud() { n=$1; shift; A train ud-pos "${UD[@]}" --out $R/$n "$@" > $L/$n.log 2>&1; A eval $R/$n --split test --json > $L/$n.test.json 2>>$L/$n.log; }
SST=(--data-dir $D/sst2 --set train.max_iters=1000 --set train.eval_interval=200 --set train.warmup_iters=100)
sst() { n=$1; shift; A train sst2 "${SST[@]}" --out $R/$n "$@" > $L/$n.log 2>&1; A eval $R/$n --split dev --json > $L/$n.test.json 2>>$L/$n.log; }
ud s-ud-lc-600 --set train.max_iters=600 --set train.warmup_iters=60 &
ud s-ud-cased-600 --set train.max_iters=600 --set train.warmup_iters=60 --set data.lowercase=false &
ud s-ud-cased-2000 --set train.max_iters=2000 --set train.warmup_iters=200 --set data.lowercase=false &
ud s-ud-cased-2000-drop3 --set train.max_iters=2000 --set train.warmup_iters=200 --set data.lowercase=false --set model.dropout=0.3 &
ud s-ud-cased-2000-pre --set train.max_iters=2000 --set train.warmup_iters=200 --set data.lowercase=false --set 'model.norm="pre"' &
ud s-ud-cased-2000-small --set train.max_iters=2000 --set train.warmup_iters=200 --set data.lowercase=false --set model.n_layers=2 --set model.dropout=0.2 &
ud s-ud-cased-4k-2000 --set train.max_iters=2000 --set train.warmup_iters=200 --set data.lowercase=false --set data.vocab_size=4000 &
sst s-sst-600 &
sst s-sst-pre --set 'model.norm="pre"' &
wait
echo "phase 1 done in $(( $(date +%s) - T0 )) s"
for m in m1-base m2-mask40 m3-pre m4-pre-mask40 m5-lr3e-4 m6-pre-mask40-cased; do
  [ -f $R/$m/config.toml ] || continue
  ud f-ud-$m --set train.max_iters=600 --set train.warmup_iters=60 --init-from $R/$m &
  ud f-ud2k-$m --set train.max_iters=2000 --set train.warmup_iters=200 --init-from $R/$m &
  sst f-sst-$m --init-from $R/$m &
done
wait
echo "all done in $(( $(date +%s) - T0 )) s"
for r in $R/*; do echo "== $(basename $r)"; cp $r/metrics.csv $L/$(basename $r).metrics.csv; done
cd $OUT && tar czf sweep.tgz logs && rm -rf logs
