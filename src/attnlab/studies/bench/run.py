"""The whole benchmark run (`run_benchmarks`): the matmul peak before and after the training cases,
the training and generation comparisons, the attention memory."""

import contextlib
import functools
import platform
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date
from types import ModuleType

import torch
from torch import nn

from attnlab.device import cpu_description
from attnlab.studies.bench.cases import (
    GENERATE_BLOCK,
    PEER,
    PROMPT_LEN,
    VOCAB,
    TrainCase,
    attention_lengths,
    generate_cases,
    train_cases,
)
from attnlab.studies.bench.compare import (
    attnlab_generate,
    build_models,
    compare,
    import_transformers,
    speed_ratio,
    train_step,
    transformers_generate,
)
from attnlab.studies.bench.memory import attention_memory
from attnlab.studies.bench.peaks import decode_weight_bytes, flops_per_token, matmul_peak_flops, memory_bandwidth
from attnlab.studies.bench.report import flops_text, progress_line
from attnlab.studies.bench.results import BenchResult, GenerateRow, TrainRow


def _machine(device: torch.device) -> str:
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)}, {platform.machine()} host"
    return f"{platform.machine()}: {cpu_description()}"


def run_benchmarks(
    device: torch.device,
    *,
    quick: bool = False,
    repeats: int | None = None,
    progress: Callable[[str], None] | None = None,
    compile: bool = False,
    fused: bool = False,
    weights: str = "fp32",
) -> BenchResult:
    """Measure everything on `device` (cpu or cuda) -> BenchResult. `repeats` defaults to 5 (1 with
    `quick`, which uses tiny step counts and sizes: a check that everything runs, not a
    measurement). `progress` receives one line per finished case. `compile` runs attnlab's training
    forward and decoding step through torch.compile (the warm-up call compiles, untimed); `fused`
    runs attnlab's training blocks through its C++ kernels (`attnlab.accel.kernels`) and its decoding
    step as one C++ call (`attnlab.accel.fused`), both built at the warm-up call when not before;
    `weights` (fp32, bf16, int8; not fp32 with `fused` alone) is how that step stores its weights."""
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"device must be cpu or cuda, got {device}")
    repeats = (1 if quick else 5) if repeats is None else repeats
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    say = progress or (lambda line: None)
    steps = 2 if quick else 10
    hf = import_transformers()
    if hf is None:
        say("transformers not installed: measuring attnlab alone")
    peak, matmul_dtype = matmul_peak_flops(device, quick)
    say(f"matmul peak: {flops_text(peak, device)} ({matmul_dtype})")
    bandwidth = memory_bandwidth(device, quick)
    say(f"memory bandwidth: {bandwidth / 1e9:,.1f} GB/s")
    plan = _Plan(device, quick, repeats, steps, hf, compile, fused, say, weights)
    measured = _measure_training(plan)
    # The peak once more, the better of the two kept: measured only before the training cases, a
    # slow spell of the machine at that moment put attnlab's MFU above what the step can reach
    # (docs/history.md, "The peak measured twice").
    again, _ = matmul_peak_flops(device, quick)
    peak = max(peak, again)
    say(f"matmul peak after the training cases: {flops_text(again, device)} (kept: {flops_text(peak, device)})")
    train = [_train_row(case, fpt, speed, peak) for case, fpt, speed in measured]
    generate = _measure_generation(plan, bandwidth)

    if device.type == "cuda":
        torch.cuda.empty_cache()
    memory = attention_memory(device, attention_lengths(quick))
    for row in memory:
        say(f"attention memory {row.path} T={row.seq_len}: {row.peak_mib:.1f} MiB")

    return BenchResult(
        date=date.today().isoformat(),
        device=device.type,
        machine=_machine(device),
        threads=torch.get_num_threads(),
        torch=torch.__version__,
        matmul_peak_flops=peak,
        matmul_dtype=matmul_dtype,
        memory_bandwidth=bandwidth,
        quick=quick,
        compiled=compile,
        fused=fused,
        weights=weights,
        repeats=repeats,
        transformers=None if hf is None else hf.__version__,
        train=train,
        generate=generate,
        attention_memory=memory,
    )


@dataclass(frozen=True)
class _Plan:
    """What every case of one `run_benchmarks` call shares (its arguments, resolved)."""

    device: torch.device
    quick: bool
    repeats: int
    steps: int  # training steps timed per call
    hf: ModuleType | None  # transformers, or None when it is not installed
    compile: bool
    fused: bool
    say: Callable[[str], None]
    weights: str = "fp32"  # how attnlab's fused decoding step stores the weights


def _measure_training(plan: _Plan) -> list[tuple[TrainCase, float, dict[str, float]]]:
    """(case, FLOPs per token, tokens/s by name) for each training case."""
    measured = []
    for case in train_cases(plan.device, plan.quick):
        _fresh_compiler(plan.compile)
        models = build_models(case.shape, case.block, plan.device, plan.hf)
        fns = {name: train_step(name, m, case, plan.device, plan.compile, plan.fused) for name, m in models.items()}
        with _quiet(plan.hf):
            speed = compare(fns, case.batch * case.block, plan.steps, plan.repeats, plan.device)
        measured.append((case, flops_per_token(models["attnlab"], case.block), speed))
        plan.say(progress_line(case.label, speed, "tokens/s"))
        del models, fns
    return measured


def _train_row(case: TrainCase, fpt: float, speed: dict[str, float], peak: float) -> TrainRow:
    """One training case's row, its MFU against the matmul `peak`."""
    theirs = speed.get(PEER)
    return TrainRow(
        case=case.label,
        shape=case.shape,
        block=case.block,
        batch=case.batch,
        flops_per_token=fpt,
        attnlab_tokens_per_sec=speed["attnlab"],
        transformers_tokens_per_sec=theirs,
        ratio=speed_ratio(speed["attnlab"], theirs),
        attnlab_mfu=speed["attnlab"] * fpt / peak,
        transformers_mfu=None if theirs is None else theirs * fpt / peak,
    )


def _measure_generation(plan: _Plan, bandwidth: float) -> list[GenerateRow]:
    """One row per generation case, its speed against the bandwidth bound (weights read once a step)."""
    generate = []
    built: dict[str, dict[str, nn.Module]] = {}
    for case in generate_cases(plan.quick):
        _fresh_compiler(plan.compile)
        if case.shape not in built:  # one shape held at a time
            built = {case.shape: build_models(case.shape, GENERATE_BLOCK, plan.device, plan.hf)}
        models = built[case.shape]
        prompt = torch.randint(0, VOCAB, (case.batch, PROMPT_LEN), device=plan.device)
        fns = _generate_fns(models, prompt, case.new_tokens, plan.compile, plan.fused, plan.weights)
        with _quiet(plan.hf):
            check = functools.partial(_check_length, length=PROMPT_LEN + case.new_tokens)
            speed = compare(fns, case.batch * case.new_tokens, 1, plan.repeats, plan.device, check)
        theirs = speed.get(PEER)
        stored = None if plan.weights == "fp32" else plan.weights  # fp32: the model's own dtype (bf16 on a GPU)
        weight_bytes = decode_weight_bytes(models["attnlab"], stored)
        bound = case.batch * bandwidth / weight_bytes
        generate.append(
            GenerateRow(
                case=case.label,
                shape=case.shape,
                batch=case.batch,
                new_tokens=case.new_tokens,
                attnlab_tokens_per_sec=speed["attnlab"],
                transformers_tokens_per_sec=theirs,
                ratio=speed_ratio(speed["attnlab"], theirs),
                weight_bytes=weight_bytes,
                bound_tokens_per_sec=bound,
                attnlab_of_bound=speed["attnlab"] / bound,
                transformers_of_bound=None if theirs is None else theirs / bound,
            )
        )
        plan.say(progress_line(f"{case.label}, {case.new_tokens} new", speed, "new tokens/s"))
    del built
    return generate


def _fresh_compiler(compile: bool) -> None:
    """Each case compiles as a user's only model would. torch.compile keeps one cache per code
    object (GPT.forward) for every model and shape it has seen, and each call first checks the
    entries before its own, which can cost a later case dearly (docs/history.md, "Decoding: stream
    the weights, then fuse the step")."""
    if compile:
        torch.compiler.reset()


def _generate_fns(
    models: dict[str, nn.Module],
    prompt: torch.Tensor,
    new_tokens: int,
    compile: bool = False,
    fused: bool = False,
    weights: str = "fp32",
) -> dict[str, Callable]:
    fns = {"attnlab": lambda: attnlab_generate(models["attnlab"], prompt, new_tokens, compile, fused, weights)}
    if PEER in models:
        models[PEER].eval()
        fns[PEER] = lambda: transformers_generate(models[PEER], prompt, new_tokens)
    return fns


def _check_length(name: str, generated: torch.Tensor, *, length: int) -> None:
    # Both peers must do the same work: a peer that stopped early would look fast.
    got = generated.size(1)
    if got != length:
        raise RuntimeError(f"{name} generated a sequence of {got} tokens, expected {length}")


@contextlib.contextmanager
def _quiet(hf: ModuleType | None):
    """transformers' log warnings (config and generation notices) off for the duration: they would
    interleave with the progress lines and say nothing about speed."""
    if hf is None:
        yield
        return
    level = hf.logging.get_verbosity()
    hf.logging.set_verbosity_error()
    try:
        yield
    finally:
        hf.logging.set_verbosity(level)
