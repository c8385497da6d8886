#!/bin/bash
# Issue 30's measurements, one after another (about 6 hours on the 2-core CPU): the three image
# density models at the same budget (~60 min each), WaveNet at two receptive fields, ViT against
# the CNN (~30 min each), sampling times, and the counted receptive-field table. Results (JSON)
# go to benchmarks/results/beyond/, pictures and sounds to docs/. Run from the repository root:
#   bash benchmarks/beyond_text.sh [DATA_DIR] [images|audio|all]   (default ../shared/data all)
# The two parts share nothing but the result folder: on two cores, run them side by side with
# OMP_NUM_THREADS=1 each.
# Each step is skipped when its result exists, so a stopped series continues where it was.
# A smaller budget for one preset: ITERS_<preset, dashes as underscores>=N sets its train.max_iters,
# e.g. ITERS_fashion_igpt=2500 (the JSON records the steps and the time).
set -euo pipefail
DATA=${1:-../shared/data}
PART=${2:-all}
OUT=benchmarks/results/beyond
RUNS=runs/beyond
mkdir -p "$OUT" "$RUNS/generated" docs
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}

iters() {  # iters PRESET: the --set that gives PRESET the ITERS_ budget asked for, if any
  local var="ITERS_${1//-/_}"
  [ -n "${!var:-}" ] && echo "--set train.max_iters=${!var}" || true
}

step() {  # step NAME COMMAND...: run COMMAND, its JSON (stdout) into $OUT/NAME.json, once
  local name=$1; shift
  [ -s "$OUT/$name.json" ] && { echo "skip $name"; return; }
  echo "== $name: $*"
  "$@" > "$OUT/$name.json.tmp" && mv "$OUT/$name.json.tmp" "$OUT/$name.json"
}

images() {
  for preset in fashion-pixelcnn fashion-gated-pixelcnn fashion-igpt fashion-vit fashion-vit-hybrid fashion-cnn; do
    step "$preset-train" attnlab train $preset --data-dir "$DATA/fashion-mnist" --out "$RUNS/$preset" $(iters $preset) --json
    step "$preset-test" attnlab eval "$RUNS/$preset" --split test --json
  done
  # Sampling: 16 images per model (the time is in the JSON) and a completion.
  step fashion-pixelcnn-sample attnlab sample "$RUNS/fashion-pixelcnn" --out docs/fashion-pixelcnn.png --num-samples 16 --json
  step fashion-gated-pixelcnn-sample attnlab sample "$RUNS/fashion-gated-pixelcnn" --out docs/fashion-gated-pixelcnn.png \
    --num-samples 16 --class 7 --json
  step fashion-igpt-sample attnlab sample "$RUNS/fashion-igpt" --out docs/fashion-igpt.png --num-samples 16 --class 7 --json
  step fashion-completion attnlab sample "$RUNS/fashion-gated-pixelcnn" --out docs/fashion-completion.png --num-samples 8 \
    --complete test:5 --json
  step vit-attention attnlab attention "$RUNS/fashion-vit" --image test:5 --out docs/vit-attention.png --json
  step autoregressive-cost attnlab cost --autoregressive --json
}

audio() {
  step fsdd-wavenet-train attnlab train fsdd-wavenet --data-dir "$DATA/fsdd" --out "$RUNS/fsdd-wavenet" \
    $(iters fsdd-wavenet) --json
  step fsdd-wavenet-test attnlab eval "$RUNS/fsdd-wavenet" --split test --json
  # The second receptive field: dilations 1..32 twice (127 samples instead of 511).
  step fsdd-wavenet-rf127-train attnlab train fsdd-wavenet --data-dir "$DATA/fsdd" --out "$RUNS/fsdd-wavenet-rf127" \
    --set model.layers_per_block=6 $(iters fsdd-wavenet) --json
  step fsdd-wavenet-rf127-test attnlab eval "$RUNS/fsdd-wavenet-rf127" --split test --json

  # A spoken seven, with the cache and without (the time is in the JSON).
  step fsdd-seven-cached attnlab sample "$RUNS/fsdd-wavenet" --digit 7 --out docs/fsdd-seven.wav --seconds 0.5 --json
  step fsdd-seven-naive attnlab sample "$RUNS/fsdd-wavenet" --digit 7 --out "$RUNS/seven-naive.wav" --seconds 0.5 --naive --json
  # Are the generated digits recognizable? A classifier trained on real recordings, scored on real test
  # recordings and on 100 WaveNet samples of each digit (0.5 s each).
  step fsdd-digits-train attnlab train fsdd-digits --data-dir "$DATA/fsdd" --out "$RUNS/fsdd-digits" $(iters fsdd-digits) --json
  step fsdd-digits-test attnlab eval "$RUNS/fsdd-digits" --split test --json
  for digit in 0 1 2 3 4 5 6 7 8 9; do
    step "fsdd-generate-$digit" attnlab sample "$RUNS/fsdd-wavenet" --digit $digit --num-samples 100 --seconds 0.5 \
      --out "$RUNS/generated/${digit}_wavenet.wav" --json
  done
  step fsdd-digits-generated attnlab eval "$RUNS/fsdd-digits" --split all --data-dir "$RUNS/generated" --json
}

case $PART in
  images) images ;;
  audio) audio ;;
  all) images; audio ;;
  *) echo "PART must be images, audio or all, not $PART" >&2; exit 2 ;;
esac
