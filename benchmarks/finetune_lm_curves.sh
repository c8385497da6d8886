#!/usr/bin/env bash
# The fine-tuning figure of BENCHMARKS.md ("Fine-tuning a language model") and docs/finetuning.md:
# a GPT pre-trained by attnlab on WikiText-2, fine-tuned on Tiny Shakespeare in full and with LoRA,
# against the same model trained from scratch on Tiny Shakespeare for the same steps with the same
# tokenizer (data.tokenizer_file), so that the validation losses per token compare.
#   bash benchmarks/finetune_lm_curves.sh ../shared/data runs/finetune-lm docs/finetune-lm.png
# PRE_STEPS (default 2000) pre-training steps, STEPS (default 600) steps on Tiny Shakespeare.
# Finished runs are kept (a second call only draws the figure).
set -euo pipefail
DATA=${1:-../shared/data}; RUNS=${2:-runs/finetune-lm}; FIGURE=${3:-docs/finetune-lm.png}
PRE_STEPS=${PRE_STEPS:-2000}; STEPS=${STEPS:-600}
mkdir -p "$RUNS"

train() {  # OUT ARGS...: train into OUT (its result in OUT.json) unless OUT.json says it finished
    local out=$1; shift
    if [ -f "$out.json" ]; then return; fi
    local resume=(); [ -f "$out/config.toml" ] && resume=(--resume)
    attnlab train "$@" --out "$out" "${resume[@]}" --quiet --json > "$out.json.part"
    mv "$out.json.part" "$out.json"
}

# 1. Pre-training: shakespeare-char-cpu's 4 x 128 GPT with a byte-level BPE of 4,096 tokens, 128-token blocks.
train "$RUNS/wikitext2-pre" shakespeare-char-cpu --set "data.path=\"$DATA/wikitext-2/train.txt\"" \
    --set 'data.tokenizer="bpe"' --set data.vocab_size=4096 --set model.block_size=128 \
    --set train.max_iters="$PRE_STEPS" --set train.lr_decay_iters="$PRE_STEPS" --set train.eval_interval=250

# 2. Tiny Shakespeare (the bundled copy): the same steps, batch and blocks for the three runs.
SAME=(--set train.max_iters="$STEPS" --set train.lr_decay_iters="$STEPS" --set train.eval_interval=50
      --set train.eval_iters=20 --set train.batch_size=12 --set train.gradient_accumulation_steps=1
      --set model.block_size=128 --set train.warmup_iters=30)
train "$RUNS/full" finetune-lm --init-from "$RUNS/wikitext2-pre" "${SAME[@]}" \
    --set train.learning_rate=3e-4 --set train.min_lr=3e-5
train "$RUNS/lora" finetune-lm --init-from "$RUNS/wikitext2-pre" "${SAME[@]}" \
    --set train.learning_rate=2e-3 --set train.min_lr=2e-4 --set train.lora.rank=8 \
    --set "train.lora.targets=['query','key','value','output','ff-in','ff-out']"
train "$RUNS/scratch" shakespeare-char-cpu --set "data.tokenizer_file=\"$RUNS/wikitext2-pre/tokenizer.json\"" \
    "${SAME[@]}"

python - "$RUNS" "$FIGURE" <<'PY'
import sys
from attnlab.viz import plot_curves
runs, figure = sys.argv[1], sys.argv[2]
labels = ["full fine-tuning", "LoRA (r = 8, every linear layer)", "from scratch"]
plot_curves([f"{runs}/{n}" for n in ("full", "lora", "scratch")], ["val_loss"], figure, labels=labels,
            title="Tiny Shakespeare after WikiText-2 pre-training (validation loss per BPE token)")
print(f"saved {figure}")
PY
