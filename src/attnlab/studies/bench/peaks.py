"""What the machine can do and what a model asks of it: the matmul peak and memory bandwidth, and
the model FLOPs per token (6N + 12·L·T·C; Kaplan et al. 2020, §2.1) and bytes per decoded token.

Legend: T time (block), C model width, L layers, N parameters.
"""

import time
from collections.abc import Callable

import torch

from attnlab.models import GPT


def _sync(device: torch.device) -> None:
    # CUDA kernels run asynchronously: without a sync the clock stops before the GPU has finished.
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def seconds_per_call(fn: Callable[[], object], calls: int, device: torch.device) -> float:
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
    best = min(seconds_per_call(lambda: a @ b, 1, device) for _ in range(2 if quick else repeats))
    return 2 * n**3 / best, str(dtype).removeprefix("torch.")


def memory_bandwidth(device: torch.device, quick: bool = False, repeats: int = 5) -> float:
    """Bytes/s of copying a buffer far larger than any cache (256 MiB on CPU, 1 GiB on GPU; 16 MiB
    with `quick`), counting the read and the write. Best of `repeats`: a peak."""
    n = (4 if quick else (256 if device.type == "cuda" else 64)) * 2**20  # float32 elements
    src = torch.ones(n, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)  # warm-up: pages touched, threads started
    best = min(seconds_per_call(lambda: dst.copy_(src), 1, device) for _ in range(2 if quick else repeats))
    return 2 * n * src.element_size() / best


BYTES_PER_WEIGHT = {"fp32": 4.0, "bf16": 2.0, "int8": 1.0 + 4.0 / 32, "int4": 0.5 + 4.0 / 32, "q4_k": 144 / 256}
"""Bytes a decoding step reads per weight, by `attnlab.accel.fused.WEIGHT_FORMATS` (int8: one byte
and a 4-byte scale per 32 values; int4: half a byte and the same scale; q4_k: Q4_K's 144 bytes per
256 values, a floor: its Q6_K rows read 210)."""


def decode_weight_bytes(model: GPT, weights: str | None = None) -> int:
    """Bytes of weights one decoding step of `model` reads (see GenerateRow.weight_bytes): as they are
    stored, or as the fused step stores them in format `weights`."""
    per = model.lm_head.weight.element_size() if weights is None else BYTES_PER_WEIGHT[weights]
    return int(model.num_parameters() * per)


def flops_per_token(model: GPT, block: int) -> float:
    """Training FLOPs per token: 6N for the weight matmuls (forward 2N, backward 4N) plus 12·L·T·C
    for attention's q·k and weights·v. N excludes position embeddings, as GPT-2 counts."""
    c = model.config
    return 6 * model.num_parameters() + 12 * c.n_layers * block * c.d_model
