"""Speed and memory on this machine: attnlab beside `transformers`, measured side by side in one run.

Four measurements in one run. The speeds are medians of `repeats`, and within every repeat the
peers alternate, so both see the same machine state (clock, other processes, caches):

1. The matmul peak: an fp32 2048³ GEMM on CPU, a bf16 8192³ GEMM on GPU (best of a few, before
   and again after the training cases, the better kept).
2. Training tokens/s of full optimizer steps (forward, backward, clip_grad_norm 1.0, AdamW),
   attnlab `GPT` versus `transformers.GPT2LMHeadModel` of the same shape, and the MFU of both.
3. Greedy generation: new tokens/s, 200 new tokens after an 8-token prompt, each with its KV cache.
4. Peak memory of one causal attention forward + backward: the explicit path, which materialises
   the (T, T) weights, versus the fused kernel, at three sequence lengths.

MFU (model FLOPs utilisation): model FLOPs per token, 6N + 12·L·T·C (Kaplan et al. 2020, §2.1;
PaLM appendix B; the nanoGPT `estimate_mfu`), times tokens/s, divided by the peak of (1).

Legend: B batch, T time (block), H heads, D head dim, C model width, L layers, N parameters.

    from attnlab.bench import run_benchmarks, format_table
    print(format_table(run_benchmarks(torch.device("cpu"), quick=True)))
"""

import contextlib
import dataclasses
import functools
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from types import ModuleType

import torch
import torch.nn.functional as F
from torch import nn

from attnlab.decode import greedy
from attnlab.device import autocast, cpu_description
from attnlab.models import GPT, GPTConfig
from attnlab.nn import causal_mask, kernels, scaled_dot_product_attention
from attnlab.train.guards import grad_norm
from attnlab.train.optim import adamw

SHAPES = {
    "4x4x128": dict(n_layer=4, n_head=4, n_embd=128),
    "6x6x384": dict(n_layer=6, n_head=6, n_embd=384),
}
"""GPT shapes by name, "{n_layer}x{n_head}x{n_embd}"."""
VOCAB = 65  # Tiny Shakespeare characters
PROMPT_LEN = 8
GENERATE_BLOCK = 256  # 8 + 200 tokens need more than the 64 positions of the small training block
PEER = "transformers"

ATTENTION_PATHS = ("explicit", "fused")
ATTENTION_HEADS, ATTENTION_HEAD_DIM = 4, 64


@dataclass(frozen=True)
class TrainCase:
    shape: str
    block: int
    batch: int

    @property
    def label(self) -> str:
        return f"train {self.shape} block {self.block} batch {self.batch}"


@dataclass(frozen=True)
class GenerateCase:
    shape: str
    batch: int
    new_tokens: int

    @property
    def label(self) -> str:
        return f"generate {self.shape} batch {self.batch}"


def train_cases(device: torch.device, quick: bool) -> list[TrainCase]:
    """nanoGPT's CPU recipe shape (block 64, batch 12) and the shakespeare-char shape (block 256).
    A GPU gets batch 64 for the larger shape, to give it enough work per step; --quick keeps the
    shapes but shrinks block and batch, since it only checks that everything runs."""
    if quick:
        return [TrainCase("4x4x128", 32, 2), TrainCase("6x6x384", 32, 2)]
    return [TrainCase("4x4x128", 64, 12), TrainCase("6x6x384", 256, 64 if device.type == "cuda" else 12)]


def generate_cases(quick: bool) -> list[GenerateCase]:
    new_tokens = 20 if quick else 200
    return [
        GenerateCase("6x6x384", 1, new_tokens),
        GenerateCase("6x6x384", 8, new_tokens),
        GenerateCase("4x4x128", 1, new_tokens),
    ]


def attention_lengths(quick: bool) -> tuple[int, ...]:
    return (64, 128, 256) if quick else (1024, 2048, 4096)


# -- results ---------------------------------------------------------------------------------------
@dataclass
class TrainRow:
    case: str
    shape: str
    block: int
    batch: int
    flops_per_token: float
    """6N + 12·L·T·C of the attnlab model; both peers have the same shape, so the same FLOPs."""
    attnlab_tokens_per_sec: float
    transformers_tokens_per_sec: float | None
    ratio: float | None
    """attnlab / transformers; above 1 means attnlab is faster."""
    attnlab_mfu: float
    transformers_mfu: float | None


@dataclass
class GenerateRow:
    case: str
    shape: str
    batch: int
    new_tokens: int
    attnlab_tokens_per_sec: float
    transformers_tokens_per_sec: float | None
    ratio: float | None
    weight_bytes: int
    """Bytes of weights one decoding step reads: every parameter once (shared ones once), whatever
    the batch; position embeddings excluded (a step reads one row)."""
    bound_tokens_per_sec: float
    """batch × memory bandwidth / weight_bytes: the most new tokens/s a decoder can reach when its
    weights stream from memory at every step, as they must once they outgrow the last-level cache."""
    attnlab_of_bound: float
    transformers_of_bound: float | None


@dataclass
class MemoryRow:
    path: str
    """"explicit" (attnlab.nn.scaled_dot_product_attention) or "fused" (F.scaled_dot_product_attention)."""
    seq_len: int
    peak_mib: float
    """Peak memory of one forward + backward above what the inputs hold, in MiB."""
    growth_per_doubling: float | None
    """peak_mib / peak_mib at half the length: about 4 for memory quadratic in T, 2 for linear."""
    dtype: str


@dataclass
class BenchResult:
    date: str
    device: str
    machine: str
    threads: int
    torch: str
    matmul_peak_flops: float
    matmul_dtype: str
    memory_bandwidth: float
    """Bytes/s of a large tensor copy (read + write), best of the repeats: the decoding roofline."""
    quick: bool
    compiled: bool
    """Whether attnlab's training forward and decoding step ran through torch.compile."""
    fused: bool
    """Whether attnlab's decoding step ran as one C++ call (`attnlab.decode.fused`) and its training
    blocks through its C++ kernels (`attnlab.nn.kernels`)."""
    repeats: int
    transformers: str | None
    """The version of `transformers` measured, None when it is not installed (no peer columns)."""
    train: list[TrainRow]
    generate: list[GenerateRow]
    attention_memory: list[MemoryRow]

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


# -- the pieces ------------------------------------------------------------------------------------
def _sync(device: torch.device) -> None:
    # CUDA kernels run asynchronously: without a sync the clock stops before the GPU has finished.
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _seconds_per_call(fn: Callable[[], object], calls: int, device: torch.device) -> float:
    _sync(device)
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    _sync(device)
    return (time.perf_counter() - start) / calls


def matmul_peak_flops(device: torch.device, quick: bool = False, repeats: int = 5) -> tuple[float, str]:
    """The best FLOP/s of a square GEMM -> (FLOP/s, dtype name): fp32 2048³ on CPU, bf16 8192³ on GPU
    (the precision training runs in there). Best of `repeats`, not the median: a peak."""
    if device.type == "cuda":
        n, dtype = (2048 if quick else 8192), torch.bfloat16
    else:
        n, dtype = (1024 if quick else 2048), torch.float32
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    a @ b  # warm-up: thread pool, kernel selection
    best = min(_seconds_per_call(lambda: a @ b, 1, device) for _ in range(2 if quick else repeats))
    return 2 * n**3 / best, str(dtype).removeprefix("torch.")


def memory_bandwidth(device: torch.device, quick: bool = False, repeats: int = 5) -> float:
    """Bytes/s of copying a buffer far larger than any cache (256 MiB on CPU, 1 GiB on GPU; 16 MiB
    with `quick`), counting the read and the write. Best of `repeats`: a peak."""
    n = (4 if quick else (256 if device.type == "cuda" else 64)) * 2**20  # float32 elements
    src = torch.ones(n, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)  # warm-up: pages touched, threads started
    best = min(_seconds_per_call(lambda: dst.copy_(src), 1, device) for _ in range(2 if quick else repeats))
    return 2 * n * src.element_size() / best


def decode_weight_bytes(model: GPT) -> int:
    """Bytes of weights one decoding step of `model` reads (see GenerateRow.weight_bytes)."""
    return model.num_parameters() * model.lm_head.weight.element_size()


def flops_per_token(model: GPT, block: int) -> float:
    """Training FLOPs per token: 6N for the weight matmuls (forward 2N, backward 4N) plus 12·L·T·C
    for attention's q·k and weights·v. N excludes position embeddings, as GPT-2 counts."""
    c = model.config
    return 6 * model.num_parameters() + 12 * c.n_layer * block * c.n_embd


def _import_transformers() -> ModuleType | None:
    """`transformers`, or None when it is not installed (it is an optional extra)."""
    try:
        import transformers
    except ImportError:
        return None
    return transformers


def build_models(shape: str, block: int, device: torch.device, hf: ModuleType | None) -> dict[str, nn.Module]:
    """attnlab GPT and, when `hf` is the transformers module, GPT2LMHeadModel with the same config:
    GPT-2's tanh GELU, biases, tied embeddings, no dropout, vocab 65."""
    s = SHAPES[shape]
    torch.manual_seed(0)
    models: dict[str, nn.Module] = {
        "attnlab": GPT(GPTConfig(vocab_size=VOCAB, block_size=block, bias=True, activation="gelu_tanh", **s))
    }
    if hf is not None:
        torch.manual_seed(0)
        config = hf.GPT2Config(
            vocab_size=VOCAB,
            n_positions=block,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            bos_token_id=None,
            eos_token_id=None,
            **s,
        )
        models[PEER] = hf.GPT2LMHeadModel(config)
    return {name: m.to(device) for name, m in models.items()}


def _train_step(
    name: str,
    model: nn.Module,
    case: TrainCase,
    device: torch.device,
    compile: bool = False,
    fused: bool = False,
) -> Callable[[], None]:
    """One full optimizer step on a fixed random batch: forward, backward, clip, AdamW; attnlab's
    forward through torch.compile with `compile` (the trainer's train.compile), or its blocks
    through attnlab's C++ kernels with `fused` (train.fused_kernels)."""
    # The trainer's optimizer for both peers: PyTorch's fused AdamW (where this build has it), or
    # with `fused` attnlab's ClippingAdamW for attnlab, as train.fused_kernels runs it.
    kernel = fused and name == "attnlab"
    opt = adamw(model, lr=1e-3, betas=(0.9, 0.99), weight_decay=0.1, device=device, kernel=kernel)
    x = torch.randint(0, VOCAB, (case.batch, case.block), device=device)
    y = torch.randint(0, VOCAB, (case.batch, case.block), device=device)
    precision = "bfloat16" if device.type == "cuda" else "float32"
    model.train()
    forward = torch.compile(model) if compile and name == "attnlab" else model

    def step() -> None:
        with autocast(device, precision), kernels.enabled(kernel):
            if name == "attnlab":
                _, loss = forward(x, y)
            else:
                loss = model(input_ids=x, labels=y).loss  # shifts the labels inside: same work per token
        loss.backward()
        grad_norm(model, 1.0, opt)  # torch.nn.utils.clip_grad_norm_ but for ClippingAdamW
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def _attnlab_generate(
    model: GPT, prompt: torch.Tensor, new_tokens: int, compile: bool = False, fused: bool = False
) -> torch.Tensor:
    """attnlab's greedy decoding with its static KV cache: prompt `(B, P)` -> `(B, P + new_tokens)`;
    the one-token step through torch.compile with `compile` (compiled at the warm-up call), or as
    one C++ call with `fused` (built at the warm-up call, when not built before)."""
    return greedy(model, prompt, new_tokens, compile=compile, fused=fused)


def _transformers_generate(model: nn.Module, prompt: torch.Tensor, new_tokens: int) -> torch.Tensor:
    """transformers' greedy `generate` with its KV cache, forced to exactly `new_tokens` new tokens."""
    with torch.inference_mode():
        return model.generate(
            prompt,
            attention_mask=torch.ones_like(prompt),
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            pad_token_id=0,
        )


def compare(
    fns: dict[str, Callable[[], object]],
    units_per_call: float,
    calls: int,
    repeats: int,
    device: torch.device,
    check: Callable[[str, object], None] | None = None,
) -> dict[str, float]:
    """Median units/s of each peer over `repeats`, after one warm-up call each, whose result
    `check(name, result)` inspects when given. Peers alternate within every repeat, so a slow
    spell of the machine hits both, not one."""
    for name, fn in fns.items():
        result = fn()  # lazy initialisation, allocator growth, kernel selection
        if check is not None:
            check(name, result)
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            samples[name].append(units_per_call / _seconds_per_call(fn, calls, device))
    return {name: statistics.median(v) for name, v in samples.items()}


def _ratio(ours: float, theirs: float | None) -> float | None:
    return None if theirs is None else ours / theirs


# -- attention memory ------------------------------------------------------------------------------
def _attention_inputs(seq_len: int, device: torch.device, dtype: torch.dtype) -> list[torch.Tensor]:
    """q, k, v `(1, H, T, D)` that require gradients."""
    shape = (1, ATTENTION_HEADS, seq_len, ATTENTION_HEAD_DIM)
    return [torch.randn(shape, device=device, dtype=dtype, requires_grad=True) for _ in range(3)]


def _attention_forward_backward(path: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    if path == "explicit":
        # The causal mask is built inside: a (T, T) bool tensor is part of what this path costs.
        out, _ = scaled_dot_product_attention(q, k, v, causal_mask(q.size(-2), device=q.device))
    elif path == "fused":
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    else:
        raise ValueError(f"path must be one of {ATTENTION_PATHS}, got {path!r}")
    out.sum().backward()


def peak_rss_bytes() -> int:
    """This process's peak resident memory. On Linux that is VmHWM, not ru_maxrss: a child's
    ru_maxrss starts at its parent's peak (the kernel carries it over at fork and exec), so a child of
    a process that holds models would report nothing below that."""
    try:
        with open("/proc/self/status") as f:
            kib = next(line.split()[1] for line in f if line.startswith("VmHWM:"))
        return int(kib) * 1024
    except (OSError, StopIteration):
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return rss if sys.platform == "darwin" else rss * 1024  # bytes on macOS, KiB elsewhere


def reset_peak_rss() -> None:
    """Lower the peak to the current resident memory (Linux >= 4.0), so that transient memory of
    the imports does not hide a smaller case. Elsewhere the peak stays as it is."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def attention_memory_case(path: str, seq_len: int, *, threads: int | None = None) -> float:
    """MiB that one causal forward + backward of `path` ("explicit" or "fused") adds to this
    process's peak resident memory, fp32 on CPU, B=1, H=4, D=64.

    The peak is a high-water mark over the life of the process, so each case needs a process of its
    own (`cpu_attention_memory` starts one); PyTorch's CPU allocator is invisible to tracemalloc."""
    if threads is not None:
        torch.set_num_threads(threads)
    torch.manual_seed(0)
    # A tiny warm-up first, so kernel code and thread pools are paged in before the baseline.
    _attention_forward_backward(path, *_attention_inputs(8, torch.device("cpu"), torch.float32))
    q, k, v = _attention_inputs(seq_len, torch.device("cpu"), torch.float32)
    reset_peak_rss()
    before = peak_rss_bytes()
    _attention_forward_backward(path, q, k, v)
    return (peak_rss_bytes() - before) / 2**20


_MEMORY_CHILD = (
    "import sys; from attnlab.bench import attention_memory_case; "
    "print(attention_memory_case(sys.argv[1], int(sys.argv[2]), threads=int(sys.argv[3])))"
)


def child_env() -> dict[str, str]:
    """The environment for a child Python process that imports this very attnlab, installed or not."""
    here = str(Path(__file__).resolve().parents[1])
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p)}


def cpu_attention_memory(path: str, seq_len: int) -> float:
    """`attention_memory_case` in a fresh Python process -> MiB."""
    proc = subprocess.run(
        [sys.executable, "-c", _MEMORY_CHILD, path, str(seq_len), str(torch.get_num_threads())],
        capture_output=True,
        text=True,
        env=child_env(),
    )
    if proc.returncode != 0:
        raise RuntimeError(f"attention memory case {path} T={seq_len} failed:\n{proc.stderr}")
    return float(proc.stdout.split()[-1])


def cuda_attention_memory(path: str, seq_len: int, device: torch.device, dtype: torch.dtype) -> float:
    """MiB above the inputs that one causal forward + backward of `path` allocates on the GPU."""
    # Warm-up: library workspaces (cuBLAS) stay allocated once made; they are not attention's cost.
    _attention_forward_backward(path, *_attention_inputs(8, device, dtype))
    q, k, v = _attention_inputs(seq_len, device, dtype)
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    held = torch.cuda.memory_allocated(device)
    _attention_forward_backward(path, q, k, v)
    torch.cuda.synchronize(device)
    return (torch.cuda.max_memory_allocated(device) - held) / 2**20


def attention_memory(device: torch.device, lengths: tuple[int, ...]) -> list[MemoryRow]:
    """Both attention paths at every length (doubling), with the growth from the previous length.
    bf16 on GPU, where the fused path needs half precision for its flash kernels; fp32 on CPU."""
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    rows = []
    for path in ATTENTION_PATHS:
        previous = None
        for seq_len in lengths:
            if device.type == "cuda":
                peak = cuda_attention_memory(path, seq_len, device, dtype)
            else:
                peak = cpu_attention_memory(path, seq_len)
            # None after a non-positive peak: RSS is too coarse at that size to divide by it.
            growth = peak / previous if previous is not None and previous > 0 else None
            rows.append(MemoryRow(path, seq_len, peak, growth, str(dtype).removeprefix("torch.")))
            previous = peak
    return rows


# -- the whole run ---------------------------------------------------------------------------------
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
) -> BenchResult:
    """Measure everything on `device` (cpu or cuda) -> BenchResult. `repeats` defaults to 5 (1 with
    `quick`, which uses tiny step counts and sizes: a check that everything runs, not a
    measurement). `progress` receives one line per finished case. `compile` runs attnlab's training
    forward and decoding step through torch.compile (the warm-up call compiles, untimed); `fused`
    runs attnlab's training blocks through its C++ kernels (`attnlab.nn.kernels`) and its decoding
    step as one C++ call (`attnlab.decode.fused`), both built at the warm-up call when not before."""
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"device must be cpu or cuda, got {device}")
    repeats = (1 if quick else 5) if repeats is None else repeats
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    say = progress or (lambda line: None)
    steps = 2 if quick else 10
    hf = _import_transformers()
    if hf is None:
        say("transformers not installed: measuring attnlab alone")

    peak, matmul_dtype = matmul_peak_flops(device, quick)
    say(f"matmul peak: {_flops_text(peak, device)} ({matmul_dtype})")
    bandwidth = memory_bandwidth(device, quick)
    say(f"memory bandwidth: {bandwidth / 1e9:,.1f} GB/s")

    measured = []
    for case in train_cases(device, quick):
        _fresh_compiler(compile)
        models = build_models(case.shape, case.block, device, hf)
        fns = {name: _train_step(name, m, case, device, compile, fused) for name, m in models.items()}
        with _quiet(hf):
            speed = compare(fns, case.batch * case.block, steps, repeats, device)
        measured.append((case, flops_per_token(models["attnlab"], case.block), speed))
        say(_progress_line(case.label, speed, "tokens/s"))
        del models, fns
    # The peak once more, the better of the two kept: measured only before the training cases, a
    # slow spell of the machine at that moment put attnlab's MFU at 104% (bench-cpu-fused-28).
    again, _ = matmul_peak_flops(device, quick)
    peak = max(peak, again)
    say(f"matmul peak after the training cases: {_flops_text(again, device)} (kept: {_flops_text(peak, device)})")
    train = []
    for case, fpt, speed in measured:
        theirs = speed.get(PEER)
        train.append(
            TrainRow(
                case=case.label,
                shape=case.shape,
                block=case.block,
                batch=case.batch,
                flops_per_token=fpt,
                attnlab_tokens_per_sec=speed["attnlab"],
                transformers_tokens_per_sec=theirs,
                ratio=_ratio(speed["attnlab"], theirs),
                attnlab_mfu=speed["attnlab"] * fpt / peak,
                transformers_mfu=None if theirs is None else theirs * fpt / peak,
            )
        )

    generate = []
    built: dict[str, dict[str, nn.Module]] = {}
    for case in generate_cases(quick):
        _fresh_compiler(compile)
        if case.shape not in built:
            built = {case.shape: build_models(case.shape, GENERATE_BLOCK, device, hf)}  # one shape held at a time
        models = built[case.shape]
        prompt = torch.randint(0, VOCAB, (case.batch, PROMPT_LEN), device=device)
        fns = _generate_fns(models, prompt, case.new_tokens, compile, fused)
        with _quiet(hf):
            check = functools.partial(_check_length, length=PROMPT_LEN + case.new_tokens)
            speed = compare(fns, case.batch * case.new_tokens, 1, repeats, device, check)
        theirs = speed.get(PEER)
        weight_bytes = decode_weight_bytes(models["attnlab"])
        bound = case.batch * bandwidth / weight_bytes
        generate.append(
            GenerateRow(
                case=case.label,
                shape=case.shape,
                batch=case.batch,
                new_tokens=case.new_tokens,
                attnlab_tokens_per_sec=speed["attnlab"],
                transformers_tokens_per_sec=theirs,
                ratio=_ratio(speed["attnlab"], theirs),
                weight_bytes=weight_bytes,
                bound_tokens_per_sec=bound,
                attnlab_of_bound=speed["attnlab"] / bound,
                transformers_of_bound=None if theirs is None else theirs / bound,
            )
        )
        say(_progress_line(f"{case.label}, {case.new_tokens} new", speed, "new tokens/s"))
    del built

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
        repeats=repeats,
        transformers=None if hf is None else hf.__version__,
        train=train,
        generate=generate,
        attention_memory=memory,
    )


def _fresh_compiler(compile: bool) -> None:
    """Each case compiles as a user's only model would. torch.compile keeps one cache per code
    object (GPT.forward) for every model and shape it has seen, and each call first checks the
    entries before its own (an ad-hoc run after the training cases once found 4×4×128 decoding
    halved by them; `benchmarks/decode_ab.py reset`, with one other model's entries, finds no cost)."""
    if compile:
        torch.compiler.reset()


def _generate_fns(
    models: dict[str, nn.Module], prompt: torch.Tensor, new_tokens: int, compile: bool = False, fused: bool = False
) -> dict[str, Callable]:
    fns = {"attnlab": lambda: _attnlab_generate(models["attnlab"], prompt, new_tokens, compile, fused)}
    if PEER in models:
        models[PEER].eval()
        fns[PEER] = lambda: _transformers_generate(models[PEER], prompt, new_tokens)
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


# -- text ------------------------------------------------------------------------------------------
def _flops_text(flops: float, device: torch.device) -> str:
    return f"{flops / 1e12:,.1f} TFLOP/s" if device.type == "cuda" else f"{flops / 1e9:,.1f} GFLOP/s"


def _progress_line(label: str, speed: dict[str, float], unit: str) -> str:
    line = f"{label}: attnlab {speed['attnlab']:,.0f} {unit}"
    if PEER in speed:
        line += f", transformers {speed[PEER]:,.0f} {unit}, ratio {speed['attnlab'] / speed[PEER]:.2f}x"
    return line


def optional_number(value: float | None, spec: str, suffix: str = "") -> str:
    """`value` formatted with `spec` (and `suffix`), or "-" for a missing value."""
    return "-" if value is None else f"{value:{spec}}{suffix}"


def format_table(result: BenchResult) -> str:
    """A fixed-width table: a header line, then one line per case."""
    device = torch.device(result.device)
    lines = [
        f"attnlab bench on {result.device} ({result.machine}), {result.threads} CPU thread"
        f"{'s' if result.threads != 1 else ''}, torch {result.torch}, "
        f"{result.date}; {result.matmul_dtype} matmul peak {_flops_text(result.matmul_peak_flops, device)}, "
        f"memory bandwidth {result.memory_bandwidth / 1e9:,.1f} GB/s",
        f"medians of {result.repeats} repeats, peers alternating"
        + ("; attnlab through torch.compile" if result.compiled else "")
        + ("; attnlab training with its C++ kernels, decoding with the fused step" if result.fused else "")
        + ("; --quick: a check that everything runs, not a measurement" if result.quick else ""),
    ]
    if result.transformers is None:
        lines.append("transformers not installed: the peer columns are empty (pip install transformers)")
    header = f"{'case':<40} {'attnlab':>12} {'transformers':>12} {'ratio':>7} {'MFU attnlab':>12} {'MFU transf.':>12}"
    lines += ["", header, "-" * len(header)]
    for r in result.train:
        lines.append(
            f"{r.case + ' (tokens/s)':<40} {r.attnlab_tokens_per_sec:>12,.0f} "
            f"{optional_number(r.transformers_tokens_per_sec, ',.0f'):>12} {optional_number(r.ratio, '.2f', 'x'):>7} "
            f"{r.attnlab_mfu:>12.2%} {optional_number(r.transformers_mfu, '.2%'):>12}"
        )
    # Decoding reads every weight once per step: its roofline is memory bandwidth, not FLOPs.
    header = f"{'generation (greedy)':<40} {'attnlab':>12} {'transformers':>12} {'ratio':>7}"
    header += f" {'of bandwidth':>12} {'bound':>12}"
    lines += ["", header, "-" * len(header)]
    for r in result.generate:
        label = f"{r.case}, {r.new_tokens} new (tok/s)"
        lines.append(
            f"{label:<40} {r.attnlab_tokens_per_sec:>12,.0f} "
            f"{optional_number(r.transformers_tokens_per_sec, ',.0f'):>12} {optional_number(r.ratio, '.2f', 'x'):>7} "
            f"{r.attnlab_of_bound:>12.1%} {r.bound_tokens_per_sec:>12,.0f}"
        )
    dtype = result.attention_memory[0].dtype if result.attention_memory else ""
    title = f"attention fwd+bwd peak, causal, {dtype}"
    header = f"{title:<40} {'explicit MiB':>12} {'growth':>7} {'fused MiB':>12} {'growth':>7}"
    lines += ["", header, "-" * len(header)]
    by_case = {(r.path, r.seq_len): r for r in result.attention_memory}
    for seq_len in sorted({r.seq_len for r in result.attention_memory}):
        explicit, fused = by_case.get(("explicit", seq_len)), by_case.get(("fused", seq_len))
        label = f"B=1 H={ATTENTION_HEADS} D={ATTENTION_HEAD_DIM} T={seq_len}"
        lines.append(
            f"{label:<40} {optional_number(explicit and explicit.peak_mib, ',.1f'):>12} "
            f"{optional_number(explicit and explicit.growth_per_doubling, '.1f', 'x'):>7} "
            f"{optional_number(fused and fused.peak_mib, ',.1f'):>12} "
            f"{optional_number(fused and fused.growth_per_doubling, '.1f', 'x'):>7}"
        )
    return "\n".join(lines)
