#!/bin/bash
# A restructuring's check (issue 59): three presets (a GPT, the translation model, the ViT) trained
# 20 steps on the same seeds by the code of COMMIT and by the working tree; their metrics.csv,
# timings aside, must be identical. PyTorch's path (no C++ kernels), one thread.
#   bash scripts/metrics_identity.sh COMMIT [DATA_ROOT]     (DATA_ROOT: default ../shared/data)
set -e
COMMIT=${1:?usage: scripts/metrics_identity.sh COMMIT [DATA_ROOT]}
DATA=$(realpath "${2:-../shared/data}")
ROOT=$(git rev-parse --show-toplevel)
WORK=$(mktemp -d)
export OMP_NUM_THREADS=1
git -C "$ROOT" worktree add -f "$WORK/before" "$COMMIT" >/dev/null
trap 'git -C "$ROOT" worktree remove --force "$WORK/before"' EXIT
run() {  # label, source folder, preset and its options
  label=$1; src=$2; shift 2
  (cd "$WORK" && PYTHONPATH=$src "$ROOT/.venv/bin/python" -m attnlab train "$@" --set train.fused_kernels=false \
    --set train.max_iters=20 --set train.eval_interval=10 --set train.eval_iters=2 --out "$WORK/$label" >"$WORK/$label.log" 2>&1)
}
for side in "before:$WORK/before/src" "after:$ROOT/src"; do
  name=${side%%:*}; src=${side#*:}
  run "gpt-$name" "$src" shakespeare-char-cpu
  run "mt-$name" "$src" multi30k-de-en --data-dir "$DATA/multi30k"
  run "vit-$name" "$src" fashion-vit --data-dir "$DATA/fashion-mnist"
done
status=0
for m in gpt mt vit; do
  "$ROOT/.venv/bin/python" - "$WORK" "$m" <<'PY' || status=1
import csv, sys
work, m = sys.argv[1:]
def rows(side):
    with open(f"{work}/{m}-{side}/metrics.csv") as f:
        return [{k: v for k, v in r.items() if k not in ("tokens_per_sec", "elapsed_sec")} for r in csv.DictReader(f)]
before, after = rows("before"), rows("after")
print(f"{m}: {len(before)} rows, " + ("identical" if before == after else "DIFFERENT"))
sys.exit(before != after)
PY
done
exit $status
