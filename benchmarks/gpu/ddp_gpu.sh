#!/usr/bin/env bash
# Issue 6 on the GPU machine (one GPU): the nccl path of distributed training, and fp16.
#   1. shakespeare-char, 500 steps, bf16: one plain process vs `--nproc 1` (torchrun, nccl, one
#      rank, DDP wrapper): tokens/s of each and the largest train-loss gap (dropout 0: same batches).
#   2. fp16 with the gradient scaler, `--nproc 1`: 250 steps, then --resume to 500; the scaler's
#      state must be in train_state.pt and the losses finite.
# Run from the repository root as one device call (the tomli_w wheel in .gpu/whl/, as the other scripts):
#   bash benchmarks/gpu/ddp_gpu.sh          # $OUT set by the tool; results in $OUT/ddp-gpu.json
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .gpu/whl/*.whl || exit 1
export PYTHONPATH=$PWD/src:/tmp/site PYTHONUNBUFFERED=1
R=/tmp/runs; L=$OUT/logs; mkdir -p $R $L
S=(--quiet --set train.max_iters=500 --set train.lr_decay_iters=500 --set train.eval_interval=250
   --set train.eval_iters=20 --set model.dropout=0.0 --set 'train.device="cuda"')
nvidia-smi --query-gpu=name,memory.used --format=csv
python3 -m attnlab train shakespeare-char "${S[@]}" --out $R/plain > $L/plain.log 2>&1 || echo "plain failed"
python3 -m attnlab train shakespeare-char "${S[@]}" --out $R/nccl1 --nproc 1 > $L/nccl1.log 2>&1 || echo "nccl1 failed"
F=(--set 'train.dtype="float16"' --nproc 1)
python3 -m attnlab train shakespeare-char "${S[@]}" "${F[@]}" --out $R/fp16 --set train.max_iters=250 > $L/fp16.log 2>&1 \
  && python3 -m attnlab train shakespeare-char "${S[@]}" "${F[@]}" --out $R/fp16 --resume >> $L/fp16.log 2>&1 \
  || echo "fp16 failed"
for r in plain nccl1 fp16; do cp $R/$r/metrics.csv $L/$r.csv 2>/dev/null; done
python3 - <<'PY'
import csv, json, math, os, torch
R, out = "/tmp/runs", os.environ["OUT"]
def rows(run):
    with open(f"{R}/{run}/metrics.csv") as f:
        return [r for r in csv.DictReader(f) if r["kind"] == "train"]
def rate(rs):  # tokens/s after the first 100 steps (compilation of kernels, allocator warm-up)
    a, b = next(r for r in rs if int(r["step"]) >= 100), rs[-1]
    return (int(b["step"]) - int(a["step"])) * 64 * 256 / (float(b["elapsed_sec"]) - float(a["elapsed_sec"]))
res = {}
try:
    p, n = rows("plain"), rows("nccl1")
    res["tokens_per_sec"] = {"plain": rate(p), "nccl_1proc": rate(n)}
    res["max_abs_train_loss_gap_plain_vs_nccl1"] = max(abs(float(a["train_loss"]) - float(b["train_loss"])) for a, b in zip(p, n))
except Exception as e:
    res["error_ddp"] = repr(e)
try:
    f = rows("fp16")
    state = torch.load(f"{R}/fp16/train_state.pt", map_location="cpu", weights_only=True)
    res["fp16"] = {"steps": int(f[-1]["step"]), "final_train_loss": float(f[-1]["train_loss"]),
                   "all_finite": all(math.isfinite(float(r["train_loss"])) for r in f),
                   "grad_scaler_state": {k: v for k, v in state["grad_scaler"].items()}}
except Exception as e:
    res["error_fp16"] = repr(e)
print(json.dumps(res, indent=2))
open(f"{out}/ddp-gpu.json", "w").write(json.dumps(res, indent=2) + "\n")
PY
