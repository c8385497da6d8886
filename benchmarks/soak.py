"""Kill-and-resume soak: a real `attnlab train` process, SIGKILLed at random moments and resumed
each time, then run to the end. After every kill each complete checkpoint in the run folder is
verified (checksums, safetensors, `weights_only` train state) and the folder must load; the steps
of work lost per kill are the steps the killed process had logged beyond the checkpoint the
resume starts from. Finally the run's weights are compared with those of an uninterrupted run.

A random moment rarely falls inside a checkpoint write (milliseconds here), so every
`--hooked-every`-th kill is aimed there instead: the writer's test hook (PAUSE_HOOK) holds the
next checkpoint write at a random phase (staging: files written, manifest not; publish: the top-level
model.safetensors replaced, checkpoint.json not) and the kill lands in it.

    python benchmarks/soak.py --kills 20 --out benchmarks/results/soak.json
"""

import argparse
import csv
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import load_file

from attnlab import load
from attnlab.checkpoints import (
    CHECKPOINTS,
    MANIFEST,
    PAUSE_HOOK,
    TRAIN_STATE,
    WEIGHTS,
    complete_steps,
    file_sha256,
    has_checkpoint,
    latest_checkpoint,
    read_manifest,
    step_dir,
)
from attnlab.data.text import bundled_shakespeare

INTERVAL = 10  # steps between checkpoints (train.eval_interval)


def settings(max_iters: int, corpus: Path) -> list[str]:
    return [
        f"data.path={json.dumps(str(corpus))}",
        "model.block_size=32",
        "model.n_layers=2",
        "model.n_heads=2",
        "model.d_model=64",
        "model.dropout=0.1",
        "train.batch_size=8",
        f"train.max_iters={max_iters}",
        f"train.lr_decay_iters={max_iters}",
        f"train.eval_interval={INTERVAL}",
        "train.eval_iters=2",
        "train.log_interval=1",
        "train.device='cpu'",
    ]


def start(run_dir: Path, sets: list[str], resume: bool, hook: str | None = None) -> subprocess.Popen:
    command = [sys.executable, "-m", "attnlab", "train", "shakespeare-char-cpu", "--out", str(run_dir), "--quiet"]
    command += [f"--set={s}" for s in sets] + (["--resume"] if resume else [])
    env = {k: v for k, v in os.environ.items() if k != PAUSE_HOOK} | {"OMP_NUM_THREADS": "1"}
    if hook:
        env[PAUSE_HOOK] = hook
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)


def logged_step(run_dir: Path) -> int:
    """The last step the process logged as done in metrics.csv (0 if none)."""
    path = run_dir / "metrics.csv"
    if not path.exists():
        return 0
    with open(path, newline="") as f:
        steps = [int(r["step"]) for r in csv.DictReader(f) if r["kind"] == "train"]
    return max(steps, default=0)


def drop_rows_after(run_dir: Path, step: int) -> None:
    """What the resumed trainer does first (MetricsLog), done before it starts, so that the rows
    read after the next kill are that process's own and not the killed one's."""
    path = run_dir / "metrics.csv"
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        fields, rows = reader.fieldnames, [r for r in reader if int(r["step"]) <= step]
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fields)
        writer.writeheader()
        writer.writerows(rows)


def verify(run_dir: Path) -> tuple[int, list[str]]:
    """Check every complete step folder; returns (checkpoints checked, problems)."""
    problems = []
    steps = complete_steps(run_dir)
    for step in steps:
        folder = step_dir(run_dir, step)
        try:
            manifest = read_manifest(folder)
            for name, key in ((WEIGHTS, "weights_sha256"), (TRAIN_STATE, "train_state_sha256")):
                if file_sha256(folder / name) != manifest[key]:
                    problems.append(f"{folder / name}: checksum mismatch")
            load_file(folder / WEIGHTS)
            torch.load(folder / TRAIN_STATE, weights_only=True)
        except Exception as e:  # any failure to read a complete checkpoint is a corrupt checkpoint
            problems.append(f"{folder}: {type(e).__name__}: {e}")
    if not has_checkpoint(run_dir):
        return 0, []  # killed before the first checkpoint: --resume starts over
    try:
        run = load(run_dir, checkpoint="last")
        if steps and run.step != steps[-1]:
            problems.append(f"load() gave step {run.step}, the newest complete checkpoint is {steps[-1]}")
    except Exception as e:
        problems.append(f"load({run_dir}) failed: {type(e).__name__}: {e}")
    return len(steps), problems


def mid_write(run_dir: Path, pid: int, newest_before: int) -> str | None:
    """Which part of a checkpoint write the kill of process `pid` interrupted, if any
    (`newest_before`: the newest complete step folder when it started)."""
    if (run_dir / CHECKPOINTS / f".staging-{pid}").exists():  # (an older crash's stays until the next save)
        return "staging"
    steps = complete_steps(run_dir)
    behind = steps and (not (run_dir / MANIFEST).exists() or read_manifest(run_dir)["step"] < steps[-1])
    if behind and steps[-1] > newest_before:
        return "publish"
    return None


def soak(kills: int, hooked_every: int, seed: int, work: Path) -> dict:
    corpus = work / "corpus.txt"
    corpus.write_text(bundled_shakespeare()[:200_000], encoding="utf-8")
    max_iters = INTERVAL * kills * 2
    sets = settings(max_iters, corpus)

    t0 = time.perf_counter()
    reference = start(work / "reference", sets, resume=False)
    while logged_step(work / "reference") == 0 and reference.poll() is None:
        time.sleep(0.02)
    startup = time.perf_counter() - t0
    assert reference.wait() == 0, reference.stderr.read().decode()
    reference_sec = time.perf_counter() - t0
    interval_sec = (reference_sec - startup) / (max_iters / INTERVAL)

    rng = random.Random(seed)
    run_dir, events = work / "run", []
    started = time.perf_counter()
    while len(events) < kills:
        resume = (run_dir / "config.toml").exists()
        resume_step = latest_checkpoint(run_dir).step if has_checkpoint(run_dir) else 0
        newest_before = max(complete_steps(run_dir), default=0)
        if resume:
            drop_rows_after(run_dir, resume_step)
        hook = None
        if hooked_every and (len(events) + 1) % hooked_every == 0:
            hook = f"{rng.choice(['staging', 'publish'])}@{resume_step + INTERVAL}"
        proc = start(run_dir, sets, resume=resume, hook=hook)
        if hook:  # held inside the write: kill it there
            if not any(b"test hook: paused" in line for line in proc.stderr):
                proc.wait()  # (any() stops at the first match)
        else:  # a random moment within 1.5 checkpoint intervals of its first step
            while logged_step(run_dir) <= resume_step and proc.poll() is None:
                time.sleep(0.01)
            time.sleep(rng.uniform(0, 1.5 * interval_sec))
        if proc.poll() is not None:
            break  # finished before the kill
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        reached = logged_step(run_dir)
        where = mid_write(run_dir, proc.pid, newest_before)
        checked, problems = verify(run_dir)
        resumes_from = latest_checkpoint(run_dir).step if has_checkpoint(run_dir) else 0
        events.append(
            {
                "reached_step": reached,
                "resumes_from": resumes_from,
                "steps_lost": reached - resumes_from,
                "mid_checkpoint_write": where,
                "hook": hook,
                "checkpoints_verified": checked,
                "problems": problems,
            }
        )
        print(json.dumps(events[-1]), flush=True)
    proc = start(run_dir, sets, resume=True)
    finished = proc.wait() == 0
    checked, problems = verify(run_dir)
    a, b = load_file(run_dir / WEIGHTS), load_file(work / "reference" / WEIGHTS)
    lost = [e["steps_lost"] for e in events]
    return {
        "kills": len(events),
        "checkpoint_interval": INTERVAL,
        "max_iters": max_iters,
        "seed": seed,
        "corrupt_checkpoints": sum(len(e["problems"]) for e in events) + len(problems),
        "checkpoints_verified": sum(e["checkpoints_verified"] for e in events) + checked,
        "hooked_kills": sum(e["hook"] is not None for e in events),
        "kills_mid_checkpoint_write": {
            phase: sum(e["mid_checkpoint_write"] == phase for e in events) for phase in ("staging", "publish")
        },
        "steps_lost": {"max": max(lost), "mean": sum(lost) / len(lost), "per_kill": lost},
        "final_run_completed": finished and read_manifest(run_dir)["step"] == max_iters,
        "final_weights_equal_uninterrupted_run": a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a),
        "seconds": {
            "uninterrupted_run": round(reference_sec, 1),
            "soak": round(time.perf_counter() - started, 1),
            "checkpoint_interval": round(interval_sec, 2),
        },
        "events": events,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kills", type=int, default=20)
    p.add_argument("--hooked-every", type=int, default=4, help="aim every N-th kill into a checkpoint write (0: none)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as work:
        result = soak(args.kills, args.hooked_every, args.seed, Path(work))
    summary = {k: v for k, v in result.items() if k != "events"}
    print(json.dumps(summary, indent=2))
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
