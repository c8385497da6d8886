"""One benchmark run's results: a row per training, generation and attention-memory case."""

import dataclasses
from dataclasses import dataclass


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
    """Whether attnlab's decoding step ran as one C++ call (`attnlab.accel.fused`) and its training
    blocks through its C++ kernels (`attnlab.accel.kernels`)."""
    repeats: int
    transformers: str | None
    """The version of `transformers` measured, None when it is not installed (no peer columns)."""
    train: list[TrainRow]
    generate: list[GenerateRow]
    attention_memory: list[MemoryRow]
    weights: str = "fp32"
    """How attnlab's fused decoding step stored the weights of the generation cases (fp32, bf16, int8)."""

    def to_json(self) -> dict:
        return dataclasses.asdict(self)
