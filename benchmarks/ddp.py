"""Distributed data parallel on the CPU: tokens/s of 1 process versus 2 (torchrun, gloo), and how
close their loss curves are.

Peers, alternated within one run, each `attnlab train` on the same preset and global batch:
  1proc-1thread   one process, OMP_NUM_THREADS=1
  1proc-2threads  one process, OMP_NUM_THREADS=2 (the single-process default on a 2-core machine)
  2proc-1thread   `--nproc 2`: two processes with one thread each, half the batch each

Throughput is measured from metrics.csv: tokens trained between `--skip` steps (warm-up) and the
last step, over the training time between them (evaluation excluded). Then, once each: the loss
curves of 1 and 2 processes without dropout (same batches: the gap is rounding), and the final
validation loss with dropout 0.1 for 1 process, 2 processes and 1 process with another seed (the
seed-to-seed spread the 2-process gap is to be compared with).

    nice -n -15 python benchmarks/ddp.py --out benchmarks/results/ddp-cpu.json
"""

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PEERS = {
    "1proc-1thread": (1, 1),
    "1proc-2threads": (1, 2),
    "2proc-1thread": (2, 1),
}


def train(out: Path, nproc: int, threads: int, preset: str, sets: list[str]) -> list[dict]:
    """`attnlab train PRESET` into `out` with `nproc` processes of `threads` threads; its metrics rows."""
    command = [sys.executable, "-m", "attnlab", "train", preset, "--out", str(out), "--quiet", "--json"]
    command += [arg for s in sets for arg in ("--set", s)]
    if nproc > 1:
        command += ["--nproc", str(nproc)]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    subprocess.run(command, check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    with open(out / "metrics.csv", newline="") as f:
        return list(csv.DictReader(f))


def tokens_per_sec(rows: list[dict], tokens_per_step: int, skip: int) -> float:
    train_rows = [r for r in rows if r["kind"] == "train"]
    first = next(r for r in train_rows if int(r["step"]) >= skip)
    last = train_rows[-1]
    steps = int(last["step"]) - int(first["step"])
    return steps * tokens_per_step / (float(last["elapsed_sec"]) - float(first["elapsed_sec"]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="shakespeare-char-cpu")
    parser.add_argument("--iters", type=int, default=300, help="training steps per run")
    parser.add_argument("--skip", type=int, default=50, help="warm-up steps left out of the throughput")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/ddp-cpu.json"))
    args = parser.parse_args()

    from attnlab.config import load_preset_or_file

    _, doc = load_preset_or_file(args.preset)
    tokens_per_step = doc["train"]["batch_size"] * doc["model"]["block_size"]
    sets = [f"train.max_iters={args.iters}", f"train.lr_decay_iters={args.iters}", "train.eval_interval=100000"]
    rates: dict[str, list[float]] = {name: [] for name in PEERS}
    curves: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            for name, (nproc, threads) in PEERS.items():
                rows = train(Path(tmp) / f"{name}-{repeat}", nproc, threads, args.preset, sets)
                rates[name].append(tokens_per_sec(rows, tokens_per_step, args.skip))
                curves.setdefault(name, rows)
                print(f"repeat {repeat} {name}: {rates[name][-1]:,.0f} tokens/s", flush=True)
        one = [float(r["train_loss"]) for r in curves["1proc-1thread"] if r["kind"] == "train"]
        two = [float(r["train_loss"]) for r in curves["2proc-1thread"] if r["kind"] == "train"]
        gaps = [abs(a - b) for a, b in zip(one, two, strict=True)]

        dropout = [*sets, "model.dropout=0.1"]
        final_val = {}
        for name, nproc, seed in (("1proc", 1, 1337), ("2proc", 2, 1337), ("1proc-seed2", 1, 2)):
            rows = train(Path(tmp) / f"dropout-{name}", nproc, 1, args.preset, [*dropout, f"train.seed={seed}"])
            final_val[name] = float(rows[-1]["val_loss"])
            print(f"dropout 0.1 {name}: final val loss {final_val[name]:.4f}", flush=True)

    median = {name: sorted(r)[len(r) // 2] for name, r in rates.items()}
    result = {
        "command": "nice -n -15 python benchmarks/ddp.py " + " ".join(sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d"),
        "machine": "2-core CPU, no GPU",
        "preset": args.preset,
        "iters": args.iters,
        "skip": args.skip,
        "tokens_per_step": tokens_per_step,
        "tokens_per_sec": rates,
        "median_tokens_per_sec": median,
        "ratio_2proc_vs_1proc_1thread": median["2proc-1thread"] / median["1proc-1thread"],
        "ratio_2proc_vs_1proc_2threads": median["2proc-1thread"] / median["1proc-2threads"],
        "no_dropout_max_abs_train_loss_gap": max(gaps),
        "no_dropout_final_train_loss": {"1proc": one[-1], "2proc": two[-1]},
        "dropout_0.1_final_val_loss": final_val,
    }
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
