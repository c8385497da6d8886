"""Read GGUF files (llama.cpp's format) as attnlab models: `load_gguf(path)`.

A GGUF file is one binary file: a header, metadata (typed key/value pairs: `general.architecture`,
`llama.block_count`, the tokenizer's vocabulary and merges, the chat template) and tensors, each
stored in one of ggml's types (F32, F16, BF16, or blocks of quantized weights such as Q8_0: 32
int8 codes and one f16 scale a block). The reader turns one into what the Hugging Face importers
already take, an `HFSource`: the metadata becomes a config.json dict (per architecture, the small
tables of `GGUF_ARCHITECTURES`), and the tensors are dequantized to float32 once (`dequantize`),
renamed from llama.cpp's names (`blk.0.attn_q.weight`) back to transformers' names
(`model.layers.0.self_attn.q_proj.weight`) and put back in transformers' layout (`LAYOUTS`). The
family's importer (`attnlab.models.hf.auto.causal_lm_model`) then builds the `GPT` and checks every
shape. The tokenizer is rebuilt from the vocabulary as a `tokenizers.Tokenizer` (`gguf_tokenizer`).

Two layout changes llama.cpp's converter (`convert_hf_to_gguf.py`) makes are undone here (Qwen2's and
Qwen3's files are not permuted: llama.cpp rotates their halves, as transformers does):
- Llama's q and k rows are permuted (`LlamaModel.permute`): llama.cpp's rotary kernel rotates
  adjacent pairs (2j, 2j+1) of a head, Meta's original layout, while transformers and attnlab pair
  j with j + D/2 (`rotate_half`). Within each head, GGUF row 2j + s holds transformers' row
  s·D/2 + j (s = 0, 1); `rope_rows_to_hf` reads them back. The key heads are the kv heads.
- GPT-2's Conv1D weights ((in, out) in transformers) are stored as (out, in), like every other
  linear weight in a GGUF; they are transposed back.
- Gemma 3's norm gains are stored as 1 + w (`Gemma3Model.norm_shift`); 1 is taken off again.
SmolLM3 is permuted as Llama is; Gemma 3 and Phi-3 are not. Llama 3.1's scaled RoPE is one tensor,
rope_freqs, of per-pair divisors of the frequencies (the converter writes none of its settings), read
as attnlab's rope_scaling "factors" (`llama_with_rope_factors`). The converter writes Mistral and Mixtral
as "llama" (Mixtral with `llama.expert_count` and its experts stacked per block, read as Mixtral:
`GGUFArchitecture.experts`), Phi-3's LongRoPE factors as two tensors (`phi3_complete`), and leaves
some settings to llama.cpp's code, which the tables here fix as llama.cpp does (Gemma 3's pattern of
window layers and score scale, `gemma3_complete`; SmolLM3's NoPE interval of 4).

A GGUF tensor's shape lists the fastest-varying dimension first (ggml's `ne`); `gguf`'s reader
already hands out the data in PyTorch's (rows, columns) order, which is what is used here.

The way back, a GPT as a GGUF file, is `attnlab.models.hf.gguf_export`, from the same tables.

References:
- the GGUF format: ggml's `docs/gguf.md`; gguf-py (`GGUFReader`, `quants.py`: one dequantizer per type).
- llama.cpp `convert_hf_to_gguf.py` (`LlamaModel.permute`, `GPT2Model.modify_tensors`,
  `Gemma3Model`, `Phi3MiniModel`): the files tests/models/hf/test_gguf.py reads are its output;
  llama.cpp `src/models/gemma3.cpp`, `phi3.cpp`, `smollm3.cpp` (what each file leaves to the code).
"""

import dataclasses
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from attnlab.data.tokenizers import BPETokenizer
from attnlab.errors import CheckpointError
from attnlab.families import FAMILIES, by_gguf_architecture
from attnlab.models.gpt import GPT, GPTConfig
from attnlab.models.hf._common import HFSource
from attnlab.models.hf.auto import LoadedCausalLM, causal_lm_model
from attnlab.models.hf.llama import (
    LLAMA_DEFAULTS,
    LLAMA_FIXED_SWITCHES,
    llama_ffn,
    llama_like_config,
    load_llama_like,
    rope_fields_from_hf,
)
from attnlab.sources import GGUF_MAGIC

if TYPE_CHECKING:  # optional packages, imported where they are used
    from gguf import GGUFReader, ReaderTensor
    from tokenizers import Tokenizer
    from tokenizers.processors import TemplateProcessing

INSTALL = "pip install 'attnlab[gguf]'"


@dataclasses.dataclass(frozen=True)
class MetadataKey:
    """One config.json value stored as GGUF metadata `ARCH.gguf`."""

    gguf: str
    """The key after the architecture's prefix: "attention.head_count"."""
    hf: str
    """config.json's key: "num_attention_heads"."""
    kind: type
    """int or float: what config.json holds (GGUF stores UINT32 or FLOAT32)."""
    required: bool = True
    """Whether a file without it is refused; an optional key left out takes transformers' default."""


@dataclasses.dataclass(frozen=True)
class GGUFArchitecture:
    """How one `general.architecture` maps to a transformers config.json and tensor names."""

    model_type: str
    """config.json's model_type (one of its family's in `attnlab.families`)."""
    metadata: tuple[MetadataKey, ...]
    fixed: Mapping[str, Any]
    """config.json values the format does not store because llama.cpp computes them one way only
    (GPT-2's activation is always the tanh GELU); a model with another value cannot be exported."""
    inference: Mapping[str, Any]
    """config.json values a GGUF has no place for, set for inference: no dropout."""
    tensors: Mapping[str, str]
    """GGUF name -> transformers name; "{i}" stands for the block index in both."""
    layouts: Mapping[str, str] = dataclasses.field(default_factory=dict)
    """transformers name (with "{i}") -> the name of its change of layout in `LAYOUTS`."""
    head: str = "output.weight"
    """The output head's GGUF name: absent when the head is tied to the token embedding."""
    joins: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    """transformers name (with "{i}") -> the names of `tensors` stacked along their rows into it
    (Mixtral's experts: gate and up, one GGUF tensor each, are transformers' one gate_up_proj)."""
    complete: "Callable[[GGUFReader, str, dict[str, Any], dict[str, torch.Tensor], Path], None] | None" = None
    """What the architecture's files say beyond `metadata`, put into the config.json dict (and
    tensors that are settings, not weights, moved into it): (reader, name, config, tensors, path)."""
    experts: "GGUFArchitecture | None" = None
    """The mapping of this architecture's files that hold `ARCH.expert_count` (llama.cpp writes
    Mixtral as "llama" with experts)."""


# The keys every Llama-shaped architecture stores (llama.cpp's `TextModel.set_gguf_parameters`).
LLAMA_METADATA = (
    MetadataKey("context_length", "max_position_embeddings", int),
    MetadataKey("embedding_length", "hidden_size", int),
    MetadataKey("block_count", "num_hidden_layers", int),
    MetadataKey("feed_forward_length", "intermediate_size", int),
    MetadataKey("attention.head_count", "num_attention_heads", int),
    MetadataKey("attention.head_count_kv", "num_key_value_heads", int, required=False),
    MetadataKey("attention.key_length", "head_dim", int, required=False),
    MetadataKey("rope.freq_base", "rope_theta", float, required=False),
    MetadataKey("attention.layer_norm_rms_epsilon", "rms_norm_eps", float),
)
LLAMA_TENSORS = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
    "blk.{i}.attn_norm.weight": "model.layers.{i}.input_layernorm.weight",
    "blk.{i}.attn_q.weight": "model.layers.{i}.self_attn.q_proj.weight",
    "blk.{i}.attn_k.weight": "model.layers.{i}.self_attn.k_proj.weight",
    "blk.{i}.attn_v.weight": "model.layers.{i}.self_attn.v_proj.weight",
    "blk.{i}.attn_output.weight": "model.layers.{i}.self_attn.o_proj.weight",
    "blk.{i}.ffn_norm.weight": "model.layers.{i}.post_attention_layernorm.weight",
    "blk.{i}.ffn_gate.weight": "model.layers.{i}.mlp.gate_proj.weight",
    "blk.{i}.ffn_up.weight": "model.layers.{i}.mlp.up_proj.weight",
    "blk.{i}.ffn_down.weight": "model.layers.{i}.mlp.down_proj.weight",
}
LLAMA_FIXED = {"hidden_act": "silu"}
LLAMA_INFERENCE = {"attention_dropout": 0.0}
GPT2_CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")

LLAMA_LAYOUTS = {
    "model.layers.{i}.self_attn.q_proj.weight": "rope_q",
    "model.layers.{i}.self_attn.k_proj.weight": "rope_k",
}
LLAMA_DENSE_FFN = tuple(f"blk.{{i}}.ffn_{part}.weight" for part in ("gate", "up", "down"))
EXPERTS = "model.layers.{i}.mlp.experts."
# Mixtral as llama.cpp's converter writes it: "llama" with the experts of each block stacked into
# one (E, rows, columns) tensor per projection and the router as ffn_gate_inp; read in
# transformers 5's fused layout (gate and up stacked into gate_up_proj).
MIXTRAL = GGUFArchitecture(
    "mixtral",
    (
        *LLAMA_METADATA,
        MetadataKey("expert_count", "num_local_experts", int),
        MetadataKey("expert_used_count", "num_experts_per_tok", int),
    ),
    LLAMA_FIXED,
    LLAMA_INFERENCE,
    {
        **{ours: hf for ours, hf in LLAMA_TENSORS.items() if ours not in LLAMA_DENSE_FFN},
        "blk.{i}.ffn_gate_inp.weight": "model.layers.{i}.mlp.gate.weight",
        "blk.{i}.ffn_gate_exps.weight": EXPERTS + "gate_proj",
        "blk.{i}.ffn_up_exps.weight": EXPERTS + "up_proj",
        "blk.{i}.ffn_down_exps.weight": EXPERTS + "down_proj",
    },
    layouts=LLAMA_LAYOUTS,
    joins={EXPERTS + "gate_up_proj": (EXPERTS + "gate_proj", EXPERTS + "up_proj")},
)


def gemma3_complete(
    reader: "GGUFReader", name: str, config: dict[str, Any], tensors: dict[str, torch.Tensor], path: Path
) -> None:
    """Gemma 3's settings that llama.cpp reads or fixes outside the common keys (its
    `llama_model_gemma3::load_arch_hparams`): the window and which layers have it (every sixth
    layer global unless `attention.sliding_window_pattern` says otherwise), the local layers' RoPE
    base, the scores' scale (1/√head_dim, the 27B's 62 blocks 1/√(width / heads)) and the logits' cap."""
    window = metadata(reader, f"{name}.attention.sliding_window", path, required=False)
    n = config["num_hidden_layers"]
    if window:
        pattern = metadata(reader, f"{name}.attention.sliding_window_pattern", path, required=False)
        every = 6 if pattern is None else pattern  # llama.cpp's `set_swa_pattern`: 0 makes every layer local
        local = pattern if isinstance(pattern, list) else [every == 0 or i % every < every - 1 for i in range(n)]
        config["sliding_window"] = window
        config["layer_types"] = ["sliding_attention" if is_local else "full_attention" for is_local in local]
    else:  # no window: every layer global, with the global base
        config["layer_types"] = ["full_attention"] * n
    config["rope_local_base_freq"] = metadata(reader, f"{name}.rope.freq_base_swa", path, required=False) or 10000.0
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    config["query_pre_attn_scalar"] = config["hidden_size"] // config["num_attention_heads"] if n == 62 else head_dim
    cap = metadata(reader, f"{name}.final_logit_softcapping", path, required=False)
    config["final_logit_softcapping"] = float(cap) if cap else None


def phi3_complete(
    reader: "GGUFReader", name: str, config: dict[str, Any], tensors: dict[str, torch.Tensor], path: Path
) -> None:
    """Phi-3's LongRoPE, stored as two tensors of per-pair divisors (rope_factors_long / _short)
    beside its pre-training context and attention factor in the metadata; its window (0: none)."""
    window = metadata(reader, f"{name}.attention.sliding_window", path, required=False)
    config["sliding_window"] = window or None
    original = metadata(reader, f"{name}.rope.scaling.original_context_length", path, required=False)
    if original is not None:
        config["original_max_position_embeddings"] = original
    factors = {key: tensors.pop(f"rope_factors_{key}", None) for key in ("long", "short")}
    if factors["long"] is None and factors["short"] is None:
        return
    if factors["long"] is None or factors["short"] is None or original is None:
        raise CheckpointError(
            f"{path}: LongRoPE needs rope_factors_long, rope_factors_short and {name}.rope.scaling."
            "original_context_length; the file has only some of them"
        )
    attention = metadata(reader, f"{name}.rope.scaling.attn_factor", path, required=False)
    config["rope_scaling"] = {
        "rope_type": "longrope",
        "long_factor": factors["long"].tolist(),
        "short_factor": factors["short"].tolist(),
        **({} if attention is None else {"attention_factor": float(attention)}),
    }


GEMMA3_NORMS = {
    "attn_norm": "input_layernorm",
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
}
GEMMA3 = GGUFArchitecture(
    "gemma3_text",
    LLAMA_METADATA,
    {"hidden_activation": "gelu_pytorch_tanh"},  # ggml's GELU is the tanh approximation
    LLAMA_INFERENCE,
    {
        **{ours: hf for ours, hf in LLAMA_TENSORS.items() if "norm" not in ours},
        "output_norm.weight": "model.norm.weight",
        **{f"blk.{{i}}.{ours}.weight": f"model.layers.{{i}}.{hf}.weight" for ours, hf in GEMMA3_NORMS.items()},
    },
    # llama.cpp's converter stores each Gemma norm's gain 1 + w (`Gemma3Model.norm_shift`), ggml's
    # RMSNorm multiplying by the gain as stored; transformers stores w.
    layouts={
        "model.norm.weight": "offset_norm",
        **{f"model.layers.{{i}}.{hf}.weight": "offset_norm" for hf in GEMMA3_NORMS.values()},
    },
    complete=gemma3_complete,
)
PHI3 = GGUFArchitecture(
    "phi3",
    LLAMA_METADATA,
    LLAMA_FIXED,
    LLAMA_INFERENCE,
    {
        **{ours: hf for ours, hf in LLAMA_TENSORS.items() if not ours.startswith(("blk.{i}.attn_", "blk.{i}.ffn_"))},
        "blk.{i}.attn_norm.weight": "model.layers.{i}.input_layernorm.weight",
        "blk.{i}.attn_qkv.weight": "model.layers.{i}.self_attn.qkv_proj.weight",
        "blk.{i}.attn_output.weight": "model.layers.{i}.self_attn.o_proj.weight",
        "blk.{i}.ffn_norm.weight": "model.layers.{i}.post_attention_layernorm.weight",
        "blk.{i}.ffn_up.weight": "model.layers.{i}.mlp.gate_up_proj.weight",  # rows [gate; up]
        "blk.{i}.ffn_down.weight": "model.layers.{i}.mlp.down_proj.weight",
        "rope_factors_long.weight": "rope_factors_long",  # settings, moved into the config (phi3_complete)
        "rope_factors_short.weight": "rope_factors_short",
    },
    complete=phi3_complete,
)

# Llama 3.1's scaled RoPE as llama.cpp's converter writes it: no metadata, one tensor of per-pair
# divisors (`LlamaModel.generate_extra_tensors`), a setting kept under this name for `load_gguf`
# (and written from it by `gguf_export`).
ROPE_FREQS = "rope_freqs"

GGUF_ARCHITECTURES: dict[str, GGUFArchitecture] = {
    "llama": GGUFArchitecture(
        "llama",
        LLAMA_METADATA,
        LLAMA_FIXED,
        LLAMA_INFERENCE,
        {**LLAMA_TENSORS, "rope_freqs.weight": ROPE_FREQS},
        layouts=LLAMA_LAYOUTS,
        experts=MIXTRAL,
    ),
    "gpt2": GGUFArchitecture(
        "gpt2",
        (
            MetadataKey("context_length", "n_positions", int),
            MetadataKey("embedding_length", "n_embd", int),
            MetadataKey("block_count", "n_layer", int),
            MetadataKey("feed_forward_length", "n_inner", int),
            MetadataKey("attention.head_count", "n_head", int),
            MetadataKey("attention.layer_norm_epsilon", "layer_norm_epsilon", float),
        ),
        {"activation_function": "gelu_new"},  # ggml's GELU is the tanh approximation, GPT-2's own
        {"resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0},
        {
            "token_embd.weight": "transformer.wte.weight",
            "position_embd.weight": "transformer.wpe.weight",
            "output_norm.weight": "transformer.ln_f.weight",
            "output_norm.bias": "transformer.ln_f.bias",
            "output.weight": "lm_head.weight",
            **{
                f"blk.{{i}}.{ours}.{part}": f"transformer.h.{{i}}.{hf}.{part}"
                for ours, hf in {
                    "attn_norm": "ln_1",
                    "attn_qkv": "attn.c_attn",
                    "attn_output": "attn.c_proj",
                    "ffn_norm": "ln_2",
                    "ffn_up": "mlp.c_fc",
                    "ffn_down": "mlp.c_proj",
                }.items()
                for part in ("weight", "bias")
            },
        },
        layouts={f"transformer.h.{{i}}.{name}": "conv1d" for name in GPT2_CONV1D},
    ),
    # Qwen2 is Llama with biases on q, k and v, and its converter does not permute q and k.
    "qwen2": GGUFArchitecture(
        "qwen2",
        LLAMA_METADATA,
        LLAMA_FIXED,
        LLAMA_INFERENCE,
        {
            **LLAMA_TENSORS,
            **{f"blk.{{i}}.attn_{p}.bias": f"model.layers.{{i}}.self_attn.{p}_proj.bias" for p in "qkv"},
        },
    ),
    # Qwen3: no biases, an RMSNorm over each head of q and k.
    "qwen3": GGUFArchitecture(
        "qwen3",
        LLAMA_METADATA,
        LLAMA_FIXED,
        LLAMA_INFERENCE,
        {
            **LLAMA_TENSORS,
            "blk.{i}.attn_q_norm.weight": "model.layers.{i}.self_attn.q_norm.weight",
            "blk.{i}.attn_k_norm.weight": "model.layers.{i}.self_attn.k_norm.weight",
        },
    ),
    # SmolLM3: Llama's, with no rotary positions in every fourth layer, which llama.cpp fixes
    # (`n_no_rope_layer_step = 4`) and the file does not store.
    "smollm3": GGUFArchitecture(
        "smollm3",
        LLAMA_METADATA,
        {**LLAMA_FIXED, "no_rope_layer_interval": 4},
        LLAMA_INFERENCE,
        LLAMA_TENSORS,
        layouts=LLAMA_LAYOUTS,
    ),
    "gemma3": GEMMA3,
    "phi3": PHI3,
}
"""`general.architecture` -> its mapping. A family of `attnlab.families` with a GGUF architecture
needs a row here; adding one is a `GGUFArchitecture` of a few lines."""


# -- layouts: GGUF's (rows, columns) -> transformers' and back ----------------------------------------


def rope_rows_to_hf(weight: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Undo llama.cpp's q / k row permutation: (H·D, C) with each head's rows in pairs
    [0, D/2, 1, D/2 + 1, ...] -> rows [0, 1, ..., D - 1] (see the module docstring)."""
    d = weight.size(0) // n_heads
    return weight.reshape(n_heads, d // 2, 2, *weight.shape[1:]).transpose(1, 2).reshape(weight.shape)


def rope_rows_to_gguf(weight: torch.Tensor, n_heads: int) -> torch.Tensor:
    """`rope_rows_to_hf` backwards: transformers' q / k rows (H·D, C) in llama.cpp's order."""
    d = weight.size(0) // n_heads
    return weight.reshape(n_heads, 2, d // 2, *weight.shape[1:]).transpose(1, 2).reshape(weight.shape)


def _kv_heads(config: Mapping[str, Any]) -> int:
    return config.get("num_key_value_heads") or config["num_attention_heads"]


# name -> (GGUF -> transformers, transformers -> GGUF), each given the config.json dict.
Layout = Callable[[torch.Tensor, Mapping[str, Any]], torch.Tensor]
LAYOUTS: dict[str, tuple[Layout, Layout]] = {
    "conv1d": (lambda w, c: w.t(), lambda w, c: w.t()),
    "rope_q": (
        lambda w, c: rope_rows_to_hf(w, c["num_attention_heads"]),
        lambda w, c: rope_rows_to_gguf(w, c["num_attention_heads"]),
    ),
    "rope_k": (lambda w, c: rope_rows_to_hf(w, _kv_heads(c)), lambda w, c: rope_rows_to_gguf(w, _kv_heads(c))),
    "offset_norm": (lambda w, c: w - 1.0, lambda w, c: w + 1.0),
}


def tensor_names(arch: GGUFArchitecture, n_layers: int) -> dict[str, tuple[str, str | None]]:
    """Every GGUF tensor name an `n_layers`-block model of `arch` may hold -> (transformers name,
    its layout or None). Example: "blk.0.attn_q.weight" -> ("model.layers.0.self_attn.q_proj.weight", "rope_q")."""
    names = {}
    for ours, hf in arch.tensors.items():
        for i in range(n_layers) if "{i}" in ours else (None,):
            names[ours.format(i=i)] = (hf.format(i=i), arch.layouts.get(hf))
    return names


# -- reading --------------------------------------------------------------------------------------


def open_gguf(path: Path) -> "GGUFReader":
    """`gguf.GGUFReader` over `path` (memory-mapped), or a one-line `CheckpointError` for a missing
    file, one that is not GGUF, or one whose header, metadata or tensor table cannot be parsed."""
    try:
        from gguf import GGUFReader
    except ImportError as e:
        raise CheckpointError(f"{path}: reading GGUF files needs the gguf package: {INSTALL}") from e
    if not path.is_file():
        raise CheckpointError(f"{path} not found; pass the path of a .gguf file")
    with path.open("rb") as f:
        magic = f.read(len(GGUF_MAGIC))
    if magic != GGUF_MAGIC:
        raise CheckpointError(f"{path} is not a GGUF file (it starts with {magic!r}, not {GGUF_MAGIC!r})")
    try:
        reader = GGUFReader(path)
    # The reader parses untrusted bytes with numpy: a truncated or corrupt file surfaces as whichever
    # exception the first bad offset meets (ValueError, IndexError, KeyError, OverflowError ...); a
    # tensor whose data is cut short fails its reshape, so no tensor is handed out short.
    except Exception as e:  # noqa: BLE001
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointError(
            f"{path} is a truncated or corrupt GGUF file ({reason}); download or convert it again"
        ) from e
    return reader


def metadata(reader: "GGUFReader", key: str, path: Path, *, required: bool = True) -> Any:
    """The value of metadata `key` (a Python int, float, bool, str or list), None when absent and not `required`."""
    field = reader.fields.get(key)
    if field is None:
        if required:
            raise CheckpointError(f"{path}: metadata key {key} is missing; the file is incomplete or not a model")
        return None
    return field.contents()


def architecture(reader: "GGUFReader", path: Path) -> tuple[str, GGUFArchitecture]:
    """`general.architecture` and its mapping; an architecture attnlab does not build is refused by name."""
    name = metadata(reader, "general.architecture", path)
    family = by_gguf_architecture(name)
    if family is None or name not in GGUF_ARCHITECTURES:
        readable = sorted(a for f in FAMILIES for a in f.gguf_architectures if a in GGUF_ARCHITECTURES)
        what = "is not one attnlab builds" if family is None else f"({family.name}) has no GGUF mapping in attnlab yet"
        raise CheckpointError(
            f"{path}: general.architecture {name!r} {what}; it reads GGUF files of {', '.join(readable)}"
        )
    arch = GGUF_ARCHITECTURES[name]
    if metadata(reader, f"{name}.expert_count", path, required=False):
        if arch.experts is None:
            raise CheckpointError(f"{path}: attnlab reads {name} files without experts only; this one has experts")
        arch = arch.experts
    return name, arch


def metadata_number(value: Any, key: MetadataKey, full_key: str, path: Path) -> int | float:
    """A metadata value checked to be `key.kind`. A FLOAT32 is given its shortest decimal form
    (1e-06, not 9.99999997e-07), the value config.json held before conversion."""
    if key.kind is int and (not isinstance(value, int) or isinstance(value, bool)):
        raise CheckpointError(f"{path}: metadata {full_key} must be an integer, got {value!r}")
    if key.kind is float:
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise CheckpointError(f"{path}: metadata {full_key} must be a number, got {value!r}")
        value = float(str(np.float32(value)))
    return value


def hf_config(reader: "GGUFReader", name: str, arch: GGUFArchitecture, path: Path) -> dict[str, Any]:
    """The config.json (as a dict) of the file's model, from its metadata: `arch.metadata` under the
    prefix `name.`, `arch.fixed`, RoPE's variants and the tokenizer's bos / eos ids. The tensors
    add `vocab_size` and `tie_word_embeddings` (`read_tensors`)."""
    config: dict[str, Any] = {"model_type": arch.model_type, **arch.fixed, **arch.inference}
    for key in arch.metadata:
        full_key = f"{name}.{key.gguf}"
        value = metadata(reader, full_key, path, required=key.required)
        if value is not None:
            config[key.hf] = metadata_number(value, key, full_key, path)
    config |= rope_variants(reader, name, config, path)
    for key in ("bos_token_id", "eos_token_id"):
        value = metadata(reader, f"tokenizer.ggml.{key}", path, required=False)
        if value is not None:
            config[key] = value
    return config


# rope.scaling.KEY -> rope_parameters' key, for YaRN (llama.cpp's converter writes them from the
# latter); an extrapolation factor other than 1 is left for the importer to refuse by name.
YARN_METADATA = {
    "original_context_length": "original_max_position_embeddings",
    "yarn_beta_fast": "beta_fast",
    "yarn_beta_slow": "beta_slow",
    "yarn_attn_factor": "attention_factor",
    "yarn_ext_factor": "extrapolation_factor",
}


def rope_variants(reader: "GGUFReader", name: str, config: Mapping[str, Any], path: Path) -> dict[str, Any]:
    """What the file says of RoPE beyond its base, in config.json's words, so that the importer
    refuses by name what attnlab's rotary positions do not compute: scaled angles (`rope_scaling`)
    and rotating only part of each head (`partial_rotary_factor`)."""
    extra: dict[str, Any] = {}
    scaling = metadata(reader, f"{name}.rope.scaling.type", path, required=False)
    if scaling not in (None, "none"):
        # The stretch travels with the type: "linear" without its factor would be no scaling at all.
        keys = {"factor": "factor"} | (YARN_METADATA if scaling == "yarn" else {})
        values = {
            hf: metadata(reader, f"{name}.rope.scaling.{ours}", path, required=False) for ours, hf in keys.items()
        }
        if values.get("extrapolation_factor") == 1.0:  # llama.cpp's default, which transformers computes
            del values["extrapolation_factor"]
        extra["rope_scaling"] = {"rope_type": scaling, **{k: v for k, v in values.items() if v is not None}}
    rotated = metadata(reader, f"{name}.rope.dimension_count", path, required=False)
    if rotated is not None:
        head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
        if rotated != head_dim:
            extra["partial_rotary_factor"] = rotated / head_dim
    return extra


def dequantize(tensor: "ReaderTensor", path: Path) -> torch.Tensor:
    """One tensor of the file (a `gguf.ReaderTensor`) as float32 in PyTorch's order (rows, columns):
    F32 as stored, F16 and BF16 widened, blocks (Q8_0, Q4_0, Q4_K, Q5_K, Q6_K, ...) decoded by
    gguf's reference dequantizers. The one place the file's storage types are decoded (the fused
    step's q4_k finds Q4_K and Q6_K rows' blocks by these values: `attnlab.accel.gguf_blocks`). A
    type gguf cannot decode is refused by name.

    Q8_0 needs no block path: the fused step's int8 format (`attnlab.accel.fused.quantize_q8_0`) of
    a dequantized Q8_0 row gives back the file's codes and scales bit for bit. ggml stores a block
    as d (f16) and q = round(x / (max|x| / 127)), so its largest |q| is 127 and its values are d·q;
    then max|d·q| / 127 = d and d·q / d = q exactly in fp32 (d has 11 significant bits, q 7). An
    all-zero block is d = 0, q = 0 both ways; a block whose d underflows f16 to 0 reads back q = 0,
    the same zero weights. tests/models/hf/test_gguf_q8_blocks.py checks it on the converter's files.
    So does Q4_0 for the int4 format (`attnlab.accel.fused.quantize_q4_0`): a block's values are
    d·(q − 8) with q in 0..15, and the largest magnitude is the code 0's −8·d (the block's largest
    value, which ggml codes 0), so requantizing finds d = −8·d / −8 exactly and every code back;
    tests/accel/test_q4_gguf.py checks it."""
    from gguf import quants

    shape = tuple(int(n) for n in reversed(tensor.shape.tolist()))  # ggml lists the columns first
    try:
        values = quants.dequantize(tensor.data, tensor.tensor_type)
    except NotImplementedError:
        raise CheckpointError(
            f"{path}: tensor {tensor.name} is stored as {tensor.tensor_type.name}, which attnlab cannot read; "
            "it reads F32, F16, BF16 and the block types gguf dequantizes (Q8_0, Q4_0, Q4_K, Q5_K, Q6_K, ...)"
        ) from None
    return torch.from_numpy(np.array(values, dtype=np.float32).reshape(shape))  # a copy: the file is mapped


def read_tensors(
    reader: "GGUFReader", arch: GGUFArchitecture, config: dict[str, Any], path: Path
) -> dict[str, torch.Tensor]:
    """Every tensor of the file under its transformers name, in transformers' layout, as float32.
    Sets `config`'s `vocab_size` (the token embedding's rows) and `tie_word_embeddings` (no output
    head stored). A tensor the architecture does not have is refused by name."""
    n_layers = config[next(key.hf for key in arch.metadata if key.gguf == "block_count")]
    names = tensor_names(arch, n_layers)
    tensors: dict[str, torch.Tensor] = {}
    for tensor in reader.tensors:
        if tensor.name not in names:
            raise CheckpointError(
                f"{path}: tensor {tensor.name} has no place in a {arch.model_type} model of {n_layers} blocks; "
                "attnlab cannot represent what it computes"
            )
        hf, layout = names[tensor.name]
        weight = dequantize(tensor, path)
        tensors[hf] = LAYOUTS[layout][0](weight, config) if layout else weight
    join_tensors(arch, n_layers, tensors)
    embedding = arch.tensors["token_embd.weight"]
    if embedding not in tensors:
        raise CheckpointError(f"{path}: no token_embd.weight tensor; the file is incomplete")
    config["vocab_size"] = tensors[embedding].size(0)
    config["tie_word_embeddings"] = arch.tensors[arch.head] not in tensors
    return tensors


def join_tensors(arch: GGUFArchitecture, n_layers: int, tensors: dict[str, torch.Tensor]) -> None:
    """Stack the parts of each of `arch.joins` along their rows (dim −2) into one tensor, in place:
    Mixtral's gate (E, F, C) and up (E, F, C) -> gate_up_proj (E, 2F, C). Parts absent: nothing."""
    for joined, parts in arch.joins.items():
        for i in range(n_layers):
            names = [part.format(i=i) for part in parts]
            if all(name in tensors for name in names):
                tensors[joined.format(i=i)] = torch.cat([tensors.pop(name) for name in names], dim=-2)


# -- the tokenizer --------------------------------------------------------------------------------

# tokenizer.ggml.token_type values (llama.cpp's llama_token_type, gguf's TokenType).
CONTROL, USER_DEFINED = 3, 4
# Pre-tokenizers that are GPT-2's own split (tokenizers' ByteLevel with its regex). Another one
# (Llama 3's, Qwen2's) is the split pattern transformers' GGUF support names for it.
GPT2_PRE_TOKENIZERS = (None, "default", "gpt-2")


def gguf_tokenizer(reader: "GGUFReader", name: str, path: Path) -> BPETokenizer:
    """The file's tokenizer, giving the ids the source folder's tokenizer.json gave, with its bos /
    eos ids and llama.cpp's rule for adding them."""
    tokens = metadata(reader, "tokenizer.ggml.tokens", path)
    model = metadata(reader, "tokenizer.ggml.model", path)
    pre = metadata(reader, "tokenizer.ggml.pre", path, required=False)
    if model == "gpt2":
        merges = metadata(reader, "tokenizer.ggml.merges", path)
        types = metadata(reader, "tokenizer.ggml.token_type", path, required=False) or [1] * len(tokens)
        tokenizer = byte_level_bpe(tokens, merges, types, split_pattern(pre, path), path)
    else:
        tokenizer = transformers_tokenizer(reader, name, path)
    bos, eos = (metadata(reader, f"tokenizer.ggml.{k}_token_id", path, required=False) for k in ("bos", "eos"))
    # Where the file does not say, llama.cpp adds BOS to sentencepiece ("llama") vocabularies only.
    add_bos = metadata(reader, "tokenizer.ggml.add_bos_token", path, required=False)
    add_bos = model == "llama" if add_bos is None else add_bos
    add_eos = bool(metadata(reader, "tokenizer.ggml.add_eos_token", path, required=False))
    for key, i in (("bos", bos), ("eos", eos)):
        if i is not None and not 0 <= i < len(tokens):
            raise CheckpointError(f"{path}: tokenizer.ggml.{key}_token_id={i} is not one of its {len(tokens)} tokens")
    before = [(tokens[bos], bos)] if add_bos and bos is not None else []
    after = [(tokens[eos], eos)] if add_eos and eos is not None else []
    tokenizer.post_processor = surround(before, after)
    return BPETokenizer(tokenizer, bos_id=bos, eos_id=eos, add_special_tokens=True)


def split_pattern(pre: str | None, path: Path) -> str | None:
    """The regular expression that splits text before byte-level BPE for llama.cpp's pre-tokenizer
    `pre` (tokenizer.ggml.pre); None for GPT-2's own, which tokenizers' ByteLevel applies itself."""
    if pre in GPT2_PRE_TOKENIZERS:
        return None
    try:
        from transformers.integrations.gguf.gguf_tokenizer_mapping import GGUF_PRE_TOKENIZER_SPLITS
    except ImportError as e:
        raise CheckpointError(
            f"{path}: its pre-tokenizer {pre!r} is read with transformers 5's GGUF support: pip install 'attnlab[hf]'"
        ) from e
    if pre not in GGUF_PRE_TOKENIZER_SPLITS:
        raise CheckpointError(f"{path}: tokenizer.ggml.pre {pre!r} is a pre-tokenizer attnlab does not know")
    return GGUF_PRE_TOKENIZER_SPLITS[pre]


def byte_level_bpe(
    tokens: list[str], merges: list[str], types: list[int], split: str | None, path: Path
) -> "Tokenizer":
    """A `tokenizers.Tokenizer` for a GPT-2-style byte-level BPE vocabulary: `tokens` (id order, in
    GPT-2's byte alphabet), `merges` ("Ġ t", best first), text split by the pattern `split` (GPT-2's
    own when None), control tokens kept whole as special."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

    vocab = {token: i for i, token in enumerate(tokens)}
    if len(vocab) != len(tokens):
        raise CheckpointError(f"{path}: tokenizer.ggml.tokens lists a token twice; the vocabulary is corrupt")
    pairs = [tuple(merge.split(" ")) for merge in merges]
    if any(len(pair) != 2 for pair in pairs):
        raise CheckpointError(f"{path}: tokenizer.ggml.merges holds an entry that is not two tokens")
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=pairs))
    # add_prefix_space=False: llama.cpp splits the text as it is, with no space put in front.
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    if split is not None:
        isolated = pre_tokenizers.Split(Regex(split), behavior="isolated")
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
            [isolated, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
        )
    tokenizer.decoder = decoders.ByteLevel()
    kept = [(t, kind == CONTROL) for t, kind in zip(tokens, types, strict=True) if kind in (CONTROL, USER_DEFINED)]
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t, special in kept if special])
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t, special in kept if not special])
    return tokenizer


def transformers_tokenizer(reader: "GGUFReader", name: str, path: Path) -> "Tokenizer":
    """Any vocabulary but byte-level BPE (sentencepiece's, "llama"; T5's unigram) built by
    transformers' GGUF support from the same metadata."""
    try:
        from transformers.integrations.gguf import convert_gguf_tokenizer
    except ImportError as e:
        raise CheckpointError(
            f"{path}: its tokenizer (tokenizer.ggml.model {metadata(reader, 'tokenizer.ggml.model', path)!r}) is "
            "rebuilt by transformers' GGUF support, which needs transformers 5: pip install 'attnlab[hf]'"
        ) from e
    keys = {"model": "tokenizer_type", "pre": "pre_tokenizer_type", "tokens": "tokens", "scores": "scores"}
    keys |= {"token_type": "token_type", "merges": "merges", "add_space_prefix": "add_prefix_space"}
    fields = {ours: metadata(reader, f"tokenizer.ggml.{key}", path, required=False) for key, ours in keys.items()}
    tokenizer, _ = convert_gguf_tokenizer(name, {k: v for k, v in fields.items() if v is not None})
    return tokenizer


def surround(before: list[tuple[str, int]], after: list[tuple[str, int]]) -> "TemplateProcessing | None":
    """The post-processor that puts the special tokens `before` and `after` (token, id) around every
    text (around each of a pair: what llama.cpp does with add_bos / add_eos); None when both are empty."""
    from tokenizers import processors

    if not before and not after:
        return None
    words = lambda seq: " ".join([t for t, _ in before] + [seq] + [t for t, _ in after])  # noqa: E731
    return processors.TemplateProcessing(
        single=words("$A"), pair=f"{words('$A')} {words('$B:1')}", special_tokens=sorted(set(before + after))
    )


# -- the file as an attnlab model -----------------------------------------------------------------


def read_gguf(path: str | Path) -> tuple[HFSource, BPETokenizer, str | None]:
    """The GGUF file at `path` as the Hugging Face importers take it: its config.json and float32
    tensors under transformers' names (an `HFSource`), its tokenizer and
    its chat template (`tokenizer.chat_template`, None without one). Raises a one-line
    `CheckpointError` naming the file and the reason for a file that is not GGUF, is truncated or
    corrupt, of an architecture attnlab does not build, with a tensor type it cannot read, or with
    missing metadata."""
    source, tokenizer, template, _ = _read(Path(path))
    return source, tokenizer, template


def _read(path: Path) -> tuple[HFSource, BPETokenizer, str | None, str | None]:
    """`read_gguf`'s three, and the products' stored format (`stored_weights`)."""
    reader = open_gguf(path)
    name, arch = architecture(reader, path)
    config = hf_config(reader, name, arch, path)
    tensors = read_tensors(reader, arch, config, path)
    if arch.complete is not None:
        arch.complete(reader, name, config, tensors, path)
    tokenizer = gguf_tokenizer(reader, name, path)
    template = metadata(reader, "tokenizer.chat_template", path, required=False)
    return HFSource(path, config, path, tensors), tokenizer, template, stored_weights(reader, arch)


# The fused step's weight format (`attnlab.accel.fused.WEIGHT_FORMATS`) that holds a GGUF type's
# values exactly, as `dequantize`'s docstring shows for Q8_0 and Q4_0.
STORED_FORMATS = {"Q8_0": "int8", "Q4_0": "int4"}
# The types of the q4_k format's rows: a file whose matrices are all of them (a Q4_K_M file of
# whole super-blocks) decodes with its own blocks (`attnlab.accel.gguf_blocks`).
K_QUANT_ROWS = {"Q4_K", "Q6_K"}
# Matrices no product reads: looked up (the position and token-type embeddings), or a mixture's
# router, which the fused step keeps in fp32 (llama.cpp's converter keeps them in float too).
LOOKED_UP = ("position_embd.weight", "token_types.weight")
ROUTER = "ffn_gate_inp.weight"


def stored_weights(reader: "GGUFReader", arch: GGUFArchitecture) -> str | None:
    """The fused step's format (`STORED_FORMATS`; q4_k for `K_QUANT_ROWS`) in which the file stores
    every matrix the step's products read (attention's, the feed-forward layers' and experts', the head's: the token
    embedding where no head is stored); None where some of them are of another type (a Q8_0
    file keeps rows not a multiple of 32 wide in F16) or the type has no such format."""
    names = {tensor.name for tensor in reader.tensors}
    tied = arch.head not in names
    types = {
        tensor.tensor_type.name
        for tensor in reader.tensors
        if len(tensor.shape) >= 2
        and tensor.name not in LOOKED_UP
        and not tensor.name.endswith(ROUTER)
        and (tied or tensor.name != "token_embd.weight")
    }
    if types and types <= K_QUANT_ROWS:
        return "q4_k"
    return STORED_FORMATS.get(types.pop()) if len(types) == 1 else None


@dataclasses.dataclass
class LoadedGGUF(LoadedCausalLM):
    """A GGUF file's causal LM (`load_gguf`)."""

    stored_weights: str | None = None
    """`stored_weights`: the fused step's format that holds the products' weights as the file stores
    them ("int8" for Q8_0, "int4" for Q4_0, "q4_k" for Q4_K and Q6_K), which `attnlab sample` and
    `serve` decode with by default."""


def load_gguf(path: str | Path, *, dtype: torch.dtype = torch.float32) -> LoadedGGUF:
    """The GGUF file at `path` as an attnlab `GPT` (eval mode, parameters in `dtype`) with its
    tokenizer, chat template (`read_gguf`, then the family's importer) and its products' stored
    format (`stored_weights`). Raises `CheckpointError`."""
    path = Path(path)
    source, tokenizer, template, stored = _read(path)
    if ROPE_FREQS in source.tensors:
        model = llama_with_rope_factors(source, dtype=dtype)
    else:
        model = causal_lm_model(source, dtype=dtype)
    if tokenizer.vocab_size > model.config.vocab_size:
        raise CheckpointError(
            f"{path}: the tokenizer has {tokenizer.vocab_size} tokens but the token embedding "
            f"{model.config.vocab_size} rows; the vocabulary belongs to another model"
        )
    model_type = source.config["model_type"]
    return LoadedGGUF(model, tokenizer, model_type, chat_template=template, origin=str(path), stored_weights=stored)


def llama_with_rope_factors(file: HFSource, *, dtype: torch.dtype) -> GPT:
    """A Llama file whose RoPE frequencies are divided pair by pair by its rope_freqs tensor
    (θ_i = base^(−2i/D) / rope_freqs[i], llama.cpp's `ggml_rope_ext` with freq_factors): Llama's
    importer with attnlab's rope_scaling "factors" in place of config.json's RoPE. The tensor holds
    the divisors of Llama 3.1's scaling, whose own settings the converter does not write."""
    path, config = file.weights_path, file.config
    factors = tuple(file.tensors.pop(ROPE_FREQS).tolist())
    if "rope_scaling" in config:  # llama.cpp would apply both; attnlab's RoPE has one scaling
        raise CheckpointError(
            f"{path}: rope_freqs.weight (per-pair RoPE divisors) together with rope.scaling.type "
            f"{config['rope_scaling']['rope_type']!r}; attnlab reads one or the other"
        )
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    if 2 * len(factors) != head_dim:
        raise CheckpointError(f"{path}: rope_freqs.weight holds {len(factors)} divisors for heads of {head_dim}")

    def config_from_hf(hf: Mapping[str, Any], *, dropout: float, source: str) -> GPTConfig:
        rope = rope_fields_from_hf(hf, LLAMA_DEFAULTS["rope_theta"], source)  # the base; unscaled otherwise
        rope |= {"rope_scaling": "factors", "rope_long_factor": factors}
        switches = LLAMA_FIXED_SWITCHES
        return llama_like_config(hf, LLAMA_DEFAULTS, switches, "Llama", dropout=dropout, source=source, **rope)

    return load_llama_like(file, "Llama", config_from_hf, llama_ffn, dtype=dtype, dropout=0.0)
