# Sourced by encoder_sweep_round5.sh and later rounds, on the GPU machine from the repository root:
# the wheels, the environment and the run helpers. The caller sets R (run folders) and RES
# (results), and RUN_LIMIT (seconds a run may take, default 600) where it wants another.
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .gpu/whl/*.whl || exit 1
export PYTHONPATH=$PWD/src:/tmp/site PYTHONUNBUFFERED=1
D=$PWD/.gpu/data; L=$RES/logs; mkdir -p "$R" "$L"
T0=$(date +%s)
stamp() { echo "$1 at $(( $(date +%s) - T0 )) s" >> "$RES/progress.txt"; }
A() { timeout "${RUN_LIMIT:-600}" python3 -m attnlab "$@" --quiet --set 'train.dtype="bfloat16"' --set 'train.device="cuda"'; }
E() { python3 -m attnlab eval "$1" --split "$2" --json --device cuda > "$L/$(basename "$1").test.json" 2>>"$L/$(basename "$1").log"; }
UD=(--data-dir "$D/ud-english-ewt" --set train.eval_interval=200)
ud() { n=$1; shift; A train ud-pos "${UD[@]}" --out "$R/$n" "$@" > "$L/$n.log" 2>&1; E "$R/$n" test; }
# SST-2: each round appends its steps and rate to SST.
SST=(--data-dir "$D/sst2" --set train.eval_interval=200 --set train.warmup_iters=100)
sst() { n=$1; shift; A train sst2 "${SST[@]}" --out "$R/$n" "$@" > "$L/$n.log" 2>&1; E "$R/$n" dev; }
finish() {  # every run's metrics next to its log, then the marker the caller waits for
  for r in "$R"/*; do cp "$r/metrics.csv" "$L/$(basename "$r").metrics.csv" 2>/dev/null; done
  stamp done; touch "$RES/done"
}
