"""Measuring one case (a training step or a generation at one length) in a fresh process: the time
of its fastest call and its peak resident memory (`serve_cases` forks one child per case)."""

import dataclasses
import gc
import json
import subprocess
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn

from attnlab.decode import generate_tokens, greedy_picker
from attnlab.studies.bench.memory import child_env, peak_rss_bytes, reset_peak_rss
from attnlab.studies.cost.models import build_model
from attnlab.studies.cost.settings import CASE_BUDGET_S, KINDS, PAGE, VOCAB, WARMUP_TOKENS, CostSettings
from attnlab.train.optim import adamw


def _train_step(model: nn.Module, opt: torch.optim.Optimizer, idx: torch.Tensor) -> None:
    """One optimizer step of next-token prediction on idx `(1, T + 1)`."""
    logits = model(idx[:, :-1])  # (1, T, V)
    loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), idx[:, 1:].reshape(-1))
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def measure_case(model_name: str, kind: str, t: int, settings: CostSettings, threads: int) -> tuple[float, float]:
    """(seconds, peak MiB) of one case in this process: `kind` "train" (one step on t tokens) or
    "generate" (t new tokens after a one-token prompt). Run it in a process of its own
    (`measure_cost` does): the peak is a high-water mark of the whole process.

    The seconds are the fastest of the timed calls: on a shared machine other processes only ever
    add time, so the minimum is the estimate least disturbed by them (as `timeit` advises)."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = build_model(model_name, settings, max_len=t + 1)
    if kind == "train":
        model.train()
        opt = adamw(model, lr=1e-3, betas=(0.9, 0.99), weight_decay=0.1, device=torch.device("cpu"))
        idx = torch.randint(0, VOCAB, (1, t + 1))
        _train_step(model, opt, idx[:, : min(t, WARMUP_TOKENS) + 1])  # creates the optimizer state

        def call() -> None:
            _train_step(model, opt, idx)

    else:
        prompt = torch.randint(0, VOCAB, (1, 1))
        pick = greedy_picker()

        def generate(n: int) -> None:
            # The tokens are streamed out, not collected: what is measured is the model's memory
            # (the lectures' test memory), not a list of t outputs.
            count = sum(1 for _ in generate_tokens(model, prompt, n, pick))
            if count != n:  # a generation that stopped early would look cheap
                raise RuntimeError(f"{model_name} generated {count} tokens, expected {n}")

        generate(min(t, WARMUP_TOKENS))

        def call() -> None:
            generate(t)

    gc.collect()
    reset_peak_rss()
    before = peak_rss_bytes()
    start = time.perf_counter()
    call()  # the memory call; not reported as a time (its first touches of fresh pages cost extra)
    first = time.perf_counter() - start
    peak = max(peak_rss_bytes() - before, PAGE)
    times = []
    for _ in range(settings.repeats if first * settings.repeats <= CASE_BUDGET_S else 1):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return min(times), peak / 2**20


_SERVER = "from attnlab.studies.cost.measure import serve_cases; serve_cases()"


def serve_cases() -> None:
    """The measuring server: read one case per line on stdin (JSON: model, kind, length, settings,
    threads), measure it in a forked child, write one JSON line on stdout: {"seconds", "peak_mib"},
    {"error": traceback} when it raised, or {"died": reason} when it was killed (out of memory).

    This process imports torch and attnlab and runs nothing, so every child starts with the same
    small heap and no thread pool, in milliseconds instead of the seconds an import takes."""
    import os
    import signal
    import traceback

    import torch._dynamo  # noqa: F401  (the optimizer step imports it lazily: once here, not in every child)

    # Everything imported so far out of the garbage collector's sight: a child's gc.collect() then
    # neither spends time on it nor copies its pages.
    gc.freeze()
    for line in sys.stdin:
        case = json.loads(line)
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: measure, report, exit without running the parent's cleanup
            os.close(read_end)
            try:
                settings = CostSettings.from_json(case["settings"])
                seconds, peak = measure_case(case["model"], case["kind"], case["length"], settings, case["threads"])
                reply = {"seconds": seconds, "peak_mib": peak}
            except MemoryError:
                reply = {"died": "MemoryError"}
            except BaseException:
                reply = {"error": traceback.format_exc()}
            with os.fdopen(write_end, "w") as f:
                f.write(json.dumps(reply))
            os._exit(0)
        os.close(write_end)
        with os.fdopen(read_end) as f:
            text = f.read()
        _, status = os.waitpid(pid, 0)
        if not text:
            signum = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
            reason = signal.Signals(signum).name if signum else f"exit status {os.waitstatus_to_exitcode(status)}"
            text = json.dumps({"died": reason})
        sys.stdout.write(text + "\n")
        sys.stdout.flush()


class _Server:
    """The parent's end of `serve_cases`: a Python process of this very attnlab."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _SERVER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            # glibc: a fixed mmap threshold (no dynamic raising), so every allocation of 64 KiB or
            # more is a mapping of its own, returned to the system when freed; the resident set
            # then follows the live tensors, not the fragmentation of a heap. Ignored elsewhere.
            env={**child_env(), "MALLOC_MMAP_THRESHOLD_": str(64 * 1024)},
        )

    def measure(self, model: str, kind: str, t: int, settings: CostSettings, threads: int) -> dict:
        case = dict(model=model, kind=kind, length=t, settings=dataclasses.asdict(settings), threads=threads)
        self.proc.stdin.write(json.dumps(case) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the measuring server exited (status {self.proc.wait()})")
        reply = json.loads(line)
        if "error" in reply:
            raise RuntimeError(f"measuring {model} {kind} t={t} failed:\n{reply['error']}")
        return reply

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait()
