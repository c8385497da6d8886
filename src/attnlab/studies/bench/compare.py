"""attnlab's GPT beside `transformers`' GPT-2 of the same shape: training steps and greedy generation,
the peers alternating within every repeat so that both see the same machine state."""

import statistics
from collections.abc import Callable
from types import ModuleType

import torch
from torch import nn

from attnlab.accel import for_training
from attnlab.decode import greedy
from attnlab.device import autocast
from attnlab.models import GPT, GPTConfig
from attnlab.studies.bench.cases import PEER, SHAPES, VOCAB, TrainCase
from attnlab.studies.bench.peaks import seconds_per_call
from attnlab.train.guards import grad_norm
from attnlab.train.optim import adamw


def import_transformers() -> ModuleType | None:
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
            n_layer=s["n_layers"],  # GPT-2's own names for the same shape
            n_head=s["n_heads"],
            n_embd=s["d_model"],
        )
        models[PEER] = hf.GPT2LMHeadModel(config)
    return {name: m.to(device) for name, m in models.items()}


def train_step(
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
    if kernel:
        for_training(model)  # its covered modules take the kernels in training mode, in place
    forward = torch.compile(model) if compile and name == "attnlab" else model

    def step() -> None:
        with autocast(device, precision):
            if name == "attnlab":
                _, loss = forward(x, y)
            else:
                loss = model(input_ids=x, labels=y).loss  # shifts the labels inside: same work per token
        loss.backward()
        grad_norm(model, 1.0, opt)  # torch.nn.utils.clip_grad_norm_ but for ClippingAdamW
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def attnlab_generate(
    model: GPT, prompt: torch.Tensor, new_tokens: int, compile: bool = False, fused: bool = False, weights: str = "fp32"
) -> torch.Tensor:
    """attnlab's greedy decoding with its static KV cache: prompt `(B, P)` -> `(B, P + new_tokens)`;
    the one-token step through torch.compile with `compile` (compiled at the warm-up call), or as
    one C++ call with `fused` (built at the warm-up call, when not built before), its weights
    stored as `weights` says (fp32, bf16, int8)."""
    return greedy(model, prompt, new_tokens, compile=compile, fused=fused, weights=weights)


def transformers_generate(model: nn.Module, prompt: torch.Tensor, new_tokens: int) -> torch.Tensor:
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
            samples[name].append(units_per_call / seconds_per_call(fn, calls, device))
    return {name: statistics.median(v) for name, v in samples.items()}


def speed_ratio(ours: float, theirs: float | None) -> float | None:
    return None if theirs is None else ours / theirs
