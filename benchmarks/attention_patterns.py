"""Time and peak memory of attention patterns as the sequence grows: how each scales with T.

One forward and backward of self-attention over one sequence (B 1, H 4, D 32, fp32, bidirectional
unless --causal) for T from 512 to 16384, for
  full-formula  softmax(q kᵀ / √D) v with the (T, T) weights written out (attnlab.nn.scaled_dot_product_attention)
  full-fused    torch.nn.functional.scaled_dot_product_attention (the flash kernel on a CPU: O(T) memory, O(T²) time)
  window        attnlab.nn.sparse.WindowAttention(128)
  bigbird       attnlab.nn.sparse.BigBirdAttention(block 64, 1 global, 1 random)
  linformer     attnlab.nn.sparse.LinformerAttention(max_len T, k 128) (bidirectional only)
Each case runs in its own subprocess: peak memory is that process's ru_maxrss minus the ru_maxrss of
a baseline process that imports the same and makes the same inputs at the same T; time is the median
of --repeats steps after one warm-up. A case whose estimated memory exceeds --max-gib is skipped.
The exponent a of time ∝ T^a (and of memory) is fitted by least squares on log-log. Some 30 MiB of
fixed cost survive the baseline (full-fused's memory barely moves with T), which flattens the memory
exponents at small T: read them from runs that reach the larger T. Times on a shared machine are
steadier with --threads 1.

    python benchmarks/attention_patterns.py [--max-t 16384] [--repeats 3] [--threads N] [--causal] [--out FILE.json]
"""

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

# Imported here, not in the step, so that the baseline process's memory includes them too.
from attnlab.nn import scaled_dot_product_attention
from attnlab.nn.sparse import BigBirdAttention, LinformerAttention, WindowAttention

HEADS, HEAD_DIM, WINDOW, BLOCK, LINFORMER_K = 4, 32, 128, 64, 128
LENGTHS = (512, 1024, 2048, 4096, 8192, 16384)
PATTERNS = ("full-formula", "full-fused", "window", "bigbird", "linformer")


def estimated_bytes(pattern: str, t: int) -> float:
    """A generous guess at the peak memory of one forward and backward, to skip cases that would not fit:
    about six fp32 copies of the largest per-query tensor (scores, weights, their gradients)."""
    keys_per_query = {
        "full-formula": t,
        "full-fused": HEAD_DIM,
        "window": 3 * WINDOW,
        "bigbird": 5 * BLOCK + BLOCK,  # 3 window + 1 global + 1 random blocks; the global rows
        "linformer": LINFORMER_K,
    }[pattern]
    return 6 * 4 * HEADS * t * keys_per_query


def make_step(pattern: str, t: int, causal: bool):
    """The function one step calls: (q, k, v) -> y."""
    if pattern == "full-formula":
        mask = torch.ones(t, t, dtype=torch.bool).tril() if causal else None
        return lambda q, k, v: scaled_dot_product_attention(q, k, v, mask)[0]
    if pattern == "full-fused":
        return lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    module = {
        "window": lambda: WindowAttention(WINDOW),
        "bigbird": lambda: BigBirdAttention(BLOCK, 1, 1),
        "linformer": lambda: LinformerAttention(t, LINFORMER_K),
    }[pattern]()
    return lambda q, k, v: module(q, k, v, causal=causal)


def worker(pattern: str, t: int, causal: bool, repeats: int, threads: int | None) -> dict[str, float]:
    """Run in a subprocess: median seconds of one forward and backward, and the process's ru_maxrss.
    pattern "baseline" makes the inputs and runs one tiny step (T = 8), which loads and sets up what
    every step needs (autograd, the matrix-product libraries), so that their memory cancels out."""
    if threads:
        torch.set_num_threads(threads)
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, HEADS, t, HEAD_DIM, generator=gen).requires_grad_() for _ in range(3))
    grad = torch.randn(1, HEADS, t, HEAD_DIM, generator=gen)
    if pattern == "baseline":
        tiny = [x[:, :, :8].detach().requires_grad_() for x in (q, k, v)]
        F.scaled_dot_product_attention(*tiny).sum().backward()
        scaled_dot_product_attention(*tiny)[0].sum().backward()
        return {"seconds": float("nan"), "maxrss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}
    attend = make_step(pattern, t, causal)
    times = []
    for _ in range(repeats + 1):  # the first is a warm-up
        start = time.perf_counter()
        attend(q, k, v).backward(grad)
        times.append(time.perf_counter() - start)
        q.grad = k.grad = v.grad = None
    seconds = statistics.median(times[1:])
    return {"seconds": seconds, "maxrss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}


def run_case(pattern: str, t: int, causal: bool, repeats: int, threads: int | None) -> dict[str, float]:
    """`worker` in a fresh Python process (so that ru_maxrss is this case's alone)."""
    command = [sys.executable, __file__, "--worker", pattern, "--t", str(t), "--repeats", str(repeats)]
    command += ["--causal"] if causal else []
    command += ["--threads", str(threads)] if threads else []
    # A fixed mmap threshold: glibc otherwise raises it as large blocks are freed, and keeps later ones in
    # its heap, so that ru_maxrss would depend on the order of allocations rather than on the live tensors.
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(1 << 20)}
    done = subprocess.run(command, check=True, capture_output=True, text=True, env=env)
    return json.loads(done.stdout.strip().splitlines()[-1])


def fits_of(rows: list[dict], patterns: list[str], fit_from: int) -> dict[str, dict]:
    """Each pattern's exponents of time and memory in T (`attnlab.studies.cost.fit_exponent`), fitted on
    the lengths >= fit_from that ran: the fixed costs (Python, ~30 MiB of process) flatten the
    short ones."""
    from attnlab.studies.cost import fit_exponent

    fits = {}
    for pattern in patterns:
        ran = [r for r in rows if r["pattern"] == pattern and not r["skipped"] and r["T"] >= fit_from]
        ts = [r["T"] for r in ran]
        enough = len(ran) >= 2
        fits[pattern] = {
            "time_exponent": fit_exponent(ts, [r["seconds"] for r in ran]) if enough else None,
            "memory_exponent": fit_exponent(ts, [max(r["peak_mib"], 1e-3) for r in ran]) if enough else None,
            "fit_lengths": ts,
        }
    return fits


def plot(rows: list[dict], patterns: list[str], path: Path) -> None:
    """Time and peak memory against T on log-log axes, one line per pattern."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for pattern in patterns:
        ran = [r for r in rows if r["pattern"] == pattern and not r["skipped"]]
        ts = [r["T"] for r in ran]
        left.plot(ts, [r["seconds"] for r in ran], marker="o", label=pattern)
        right.plot(ts, [r["peak_mib"] for r in ran], marker="o", label=pattern)
    for ax, what in ((left, "seconds, forward + backward"), (right, "peak memory above baseline, MiB")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length T")
        ax.set_ylabel(what)
        ax.grid(alpha=0.3, which="both")
    left.set_title("time: full grows as T², the patterns as T")
    right.set_title("memory: only the written-out weights grow as T²")
    left.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def markdown_table(rows: list[dict], lengths: list[int], fits: dict[str, dict]) -> str:
    header = "| pattern | " + " | ".join(f"T={t}" for t in lengths) + " | time ∝ T^a | memory ∝ T^b |"
    lines = [header, "|" + " --- |" * (len(lengths) + 3)]
    for pattern in fits:
        cells = []
        for t in lengths:
            row = next((r for r in rows if r["pattern"] == pattern and r["T"] == t), None)
            if row is None:
                cells.append("—")
            elif row["skipped"]:
                cells.append("skipped")
            else:
                cells.append(f"{1e3 * row['seconds']:.1f} ms, {row['peak_mib']:.0f} MiB")
        a, b = fits[pattern]["time_exponent"], fits[pattern]["memory_exponent"]
        fmt = lambda e: "—" if e is None else f"{e:.2f}"  # noqa: E731
        lines.append(f"| {pattern} | " + " | ".join(cells) + f" | {fmt(a)} | {fmt(b)} |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--max-t", type=int, default=LENGTHS[-1], help="the longest sequence to run")
    p.add_argument("--repeats", type=int, default=3, help="timed steps per case (after one warm-up)")
    p.add_argument("--max-gib", type=float, default=12.0, help="skip a case estimated to need more memory")
    p.add_argument("--causal", action="store_true", help="causal attention (linformer is then left out)")
    p.add_argument("--patterns", default=",".join(PATTERNS), help="comma-separated, from " + ", ".join(PATTERNS))
    p.add_argument("--threads", type=int, help="intra-op threads (default torch's; 1 on a busy machine)")
    p.add_argument("--out", type=Path, help="write the results as JSON here")
    p.add_argument("--fit-from", type=int, default=2048, help="fit the exponents on T >= this (default 2048)")
    p.add_argument("--plot", type=Path, help="draw time and memory against T into this PNG")
    p.add_argument("--report", type=Path, help="no measuring: print (and plot) the results of an earlier --out")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--t", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.t, args.causal, args.repeats, args.threads)))
        return

    from run_info import run_info

    if args.report:
        saved = json.loads(args.report.read_text())
        patterns = list(saved["fits"])
        lengths = sorted({r["T"] for r in saved["rows"]})
        print(markdown_table(saved["rows"], lengths, fits_of(saved["rows"], patterns, args.fit_from)))
        if args.plot:
            plot(saved["rows"], patterns, args.plot)
        return

    lengths = [t for t in LENGTHS if t <= args.max_t]
    patterns = [name for name in args.patterns.split(",") if not (args.causal and name == "linformer")]
    unknown = set(patterns) - set(PATTERNS)
    if unknown:
        p.error(f"unknown patterns {sorted(unknown)}; choose from {', '.join(PATTERNS)}")

    def case(pattern: str, t: int) -> dict[str, float]:
        return run_case(pattern, t, args.causal, args.repeats, args.threads)

    baseline = {t: case("baseline", t)["maxrss_kib"] for t in lengths}
    rows = []
    for pattern in patterns:
        for t in lengths:
            row = {"pattern": pattern, "T": t, "estimated_gib": estimated_bytes(pattern, t) / 2**30}
            row["skipped"] = row["estimated_gib"] > args.max_gib
            if not row["skipped"]:
                got = case(pattern, t)
                row |= {"seconds": got["seconds"], "peak_mib": (got["maxrss_kib"] - baseline[t]) / 1024}
            rows.append(row)
            print(f"{pattern:<13}T={t:<6}", "skipped" if row["skipped"] else f"{row['seconds']:.4f} s", flush=True)
    fits = fits_of(rows, patterns, args.fit_from)
    mode = "causal" if args.causal else "bidirectional"
    threads = args.threads or torch.get_num_threads()
    print(f"\nforward + backward, B 1, H {HEADS}, D {HEAD_DIM}, fp32, {mode}, {threads} threads")
    print(markdown_table(rows, lengths, fits))
    if args.out:
        meta = {
            **run_info(),
            "threads": threads,
            "repeats": args.repeats,
            "causal": args.causal,
            "heads": HEADS,
            "head_dim": HEAD_DIM,
        }
        args.out.write_text(json.dumps({**meta, "rows": rows, "fits": fits}, indent=1) + "\n")
    if args.plot:
        plot(rows, patterns, args.plot)


if __name__ == "__main__":
    main()
