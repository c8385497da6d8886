"""A GPT as a GGUF file (llama.cpp's format): `write_gguf(model, tokenizer, path, outtype=...)`.

The model becomes a transformers checkpoint first (`causal_lm_export`: GPT-2 or Llama, whichever
has its parts), and that checkpoint goes through the reader's tables (`attnlab.models.hf.gguf`)
backwards: config.json values become `ARCH.*` metadata, tensors take llama.cpp's names and layout
(Llama's q / k rows permuted for llama.cpp's rotary kernel, GPT-2's Conv1D weights transposed to
(out, in)). The weights are stored as `outtype`:
    f32   every tensor as it is;
    bf16  matrices in bfloat16 (gguf's quantizer: rounded to nearest even), vectors in f32;
    q8_0  matrices in blocks of 32 int8 codes and one f16 scale (gguf's quantizer), vectors and
          matrices whose rows are no whole number of blocks in f32.
Vectors (norms, biases) stay f32, as llama.cpp's converter keeps them. Llama 3.1's scaled RoPE is
written as llama.cpp's converter writes it, one f32 tensor of per-pair divisors (rope_freqs); the
other scalings are refused. The tokenizer (a byte-level BPE, GPT-2's pre-tokenizer) is written as
llama.cpp reads one: model "gpt2", pre-tokenizer "gpt-2", tokens in id order (rows past the
vocabulary named "[PAD<id>]", as the converter names them), merges, token types and the bos / eos ids.

References: gguf-py `GGUFWriter` and `quants.quantize`; llama.cpp `convert_hf_to_gguf.py`.
"""

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from attnlab.data.tokenizers import BPETokenizer
from attnlab.errors import ExportError
from attnlab.families import FAMILIES
from attnlab.models.gpt import GPT
from attnlab.models.hf.auto import causal_lm_export
from attnlab.models.hf.gguf import GGUF_ARCHITECTURES, INSTALL, LAYOUTS, ROPE_FREQS, GGUFArchitecture, tensor_names

if TYPE_CHECKING:  # an optional package, imported where it is used
    from gguf import GGUFWriter

OUTTYPES = ("f32", "bf16", "q8_0")
"""The storage types `write_gguf` writes (as llama.cpp's converter's --outtype names them)."""
EXPORTED = tuple(arch for family in FAMILIES if family.gguf_export for arch in family.gguf_architectures)
"""The architectures a GPT is exported as: those of the families `attnlab.families` marks (GPT-2's
and Llama's, the ones `causal_lm_export` writes and the tests read back)."""
# tokenizer.ggml.token_type values (llama.cpp's llama_token_type).
NORMAL, CONTROL, USER_DEFINED, UNUSED = 1, 3, 4, 5


def write_gguf(model: GPT, tokenizer: BPETokenizer, path: Path, *, outtype: str = "f32", name: str = "") -> str:
    """Write `model` (a GPT with GPT-2's or Llama's parts) and its byte-level BPE `tokenizer` as the
    GGUF file `path`, weights as `outtype` (one of `OUTTYPES`); `name` is its general.name.
    Returns the architecture written ("gpt2" or "llama"). Raises `ExportError` naming what GGUF
    (or the nearer transformers family) lacks."""
    try:
        from gguf import GGUFWriter
    except ImportError as e:
        raise ExportError(f"writing GGUF files needs the gguf package: {INSTALL}") from e
    if outtype not in OUTTYPES:
        raise ExportError(f"cannot store weights as {outtype!r}; the GGUF types are {', '.join(OUTTYPES)}")
    checkpoint = causal_lm_export(model)
    arch_name = checkpoint.config["model_type"]
    if arch_name not in EXPORTED:
        raise ExportError(f"GGUF export writes {' and '.join(EXPORTED)} models, not {arch_name}")
    rope_type = checkpoint.config.get("rope_parameters", {}).get("rope_type", "default")
    if rope_type not in ("default", "llama3"):  # the file holds RoPE's base and llama3's divisors alone
        raise ExportError(
            f"GGUF export writes rotary positions unscaled or scaled as Llama 3 does, not rope_type {rope_type!r}"
        )
    tensors = checkpoint.tensors | ({ROPE_FREQS: rope_divisors(model)} if rope_type == "llama3" else {})
    arch = GGUF_ARCHITECTURES[arch_name]
    writer = GGUFWriter(path, arch_name)
    write_metadata(writer, arch_name, arch, checkpoint.config, outtype, name)
    write_vocabulary(writer, tokenizer, checkpoint.config["vocab_size"])
    write_tensors(writer, arch, checkpoint.config, tensors, outtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return arch_name


def rope_divisors(model: GPT) -> torch.Tensor:
    """Llama 3.1's scaled RoPE as llama.cpp's files hold it (the tensor rope_freqs): each pair's
    unscaled frequency over its scaled one, float32 `(D/2,)`."""
    c = model.config
    inv_freq = c.rope_theta ** (-torch.arange(0, c.head_dim, 2, dtype=torch.float32) / c.head_dim)
    return inv_freq / c.rope_scaling_spec().frequencies(inv_freq, theta=c.rope_theta)


def hf_value(config: dict[str, Any], key: str) -> Any:
    """config.json's `key` where the exporters put it: transformers 5 keeps rope_theta inside
    rope_parameters, and GPT-2's n_inner None means 4 × n_embd."""
    if key == "rope_theta" and "rope_parameters" in config:
        return config["rope_parameters"]["rope_theta"]
    if key == "n_inner" and config.get(key) is None:
        return 4 * config["n_embd"]
    return config.get(key)


def write_metadata(
    writer: "GGUFWriter", arch_name: str, arch: GGUFArchitecture, config: dict[str, Any], outtype: str, name: str
) -> None:
    """general.* and `ARCH.*`: the reader's `arch.metadata` backwards. A value llama.cpp computes one
    way only (`arch.fixed`) must be that value."""
    from gguf import GGML_QUANT_VERSION, LlamaFileType

    wrong = [
        f"{k} = {config.get(k)!r} (llama.cpp's {arch_name} has {v!r})"
        for k, v in arch.fixed.items()
        if config.get(k) != v
    ]
    if wrong:
        raise ExportError(f"cannot export to GGUF {arch_name}: " + "; ".join(wrong))
    writer.add_name(name or arch_name)
    file_types = {"f32": LlamaFileType.ALL_F32, "bf16": LlamaFileType.MOSTLY_BF16, "q8_0": LlamaFileType.MOSTLY_Q8_0}
    writer.add_file_type(file_types[outtype])
    writer.add_quantization_version(GGML_QUANT_VERSION)
    for key in arch.metadata:
        value = hf_value(config, key.hf)
        if value is None and not key.required:
            continue
        add = writer.add_uint32 if key.kind is int else writer.add_float32
        add(f"{arch_name}.{key.gguf}", key.kind(value))


def write_tensors(
    writer: "GGUFWriter", arch: GGUFArchitecture, config: dict[str, Any], tensors: dict[str, torch.Tensor], outtype: str
) -> None:
    """Every tensor under its llama.cpp name, in llama.cpp's layout, stored as `outtype` (`stored`)."""
    n_layers = config[next(key.hf for key in arch.metadata if key.gguf == "block_count")]
    to_gguf = {hf: (ours, layout) for ours, (hf, layout) in tensor_names(arch, n_layers).items()}
    for hf, tensor in tensors.items():
        ours, layout = to_gguf[hf]
        weight = tensor.detach().to("cpu", torch.float32)
        weight = LAYOUTS[layout][1](weight, config) if layout else weight
        data, qtype = stored(weight.contiguous().numpy(), outtype)
        writer.add_tensor(ours, data, raw_dtype=qtype)


def stored(weight: np.ndarray, outtype: str) -> tuple[np.ndarray, Any]:
    """`weight` (float32, (rows, columns) or a vector) as GGUFWriter takes it, and its GGML type:
    vectors and rows that are no whole number of q8_0 blocks stay F32 (see the module docstring)."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
    from gguf.quants import quantize

    qtype = GGMLQuantizationType[outtype.upper()]  # F32, BF16, Q8_0
    block = GGML_QUANT_SIZES[qtype][0]
    if qtype == GGMLQuantizationType.F32 or weight.ndim == 1 or weight.shape[-1] % block:
        return weight, GGMLQuantizationType.F32
    return quantize(weight, qtype), qtype


def write_vocabulary(writer: "GGUFWriter", tokenizer: BPETokenizer, vocab_size: int) -> None:
    """tokenizer.ggml.*: `tokenizer` (a byte-level BPE with GPT-2's pre-tokenizer) as llama.cpp's
    "gpt2" model, `vocab_size` tokens long; whether it adds bos / eos is read off its encoding."""
    spec = json.loads(tokenizer.tokenizer.to_str()) if isinstance(tokenizer, BPETokenizer) else None
    if spec is None or not is_gpt2_byte_level(spec):
        raise ExportError(
            'a GGUF file holds a byte-level BPE with GPT-2\'s pre-tokenizer (what `data.tokenizer = "bpe"` trains); '
            f"this run's tokenizer is a {type(tokenizer).__name__} of another kind"
        )
    if tokenizer.vocab_size > vocab_size:
        raise ExportError(f"the tokenizer has {tokenizer.vocab_size} tokens, more than the model's {vocab_size} rows")
    tokens, types = [f"[PAD{i}]" for i in range(vocab_size)], [UNUSED] * vocab_size
    for token, i in tokenizer.tokenizer.get_vocab(with_added_tokens=True).items():
        tokens[i], types[i] = token, NORMAL
    for added in spec.get("added_tokens", []):
        types[added["id"]] = CONTROL if added["special"] else USER_DEFINED
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-2")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    for special, add_id, add_flag in (
        (tokenizer.bos_id, writer.add_bos_token_id, writer.add_add_bos_token),
        (tokenizer.eos_id, writer.add_eos_token_id, writer.add_add_eos_token),
    ):
        if special is not None:
            add_id(special)
            add_flag(adds(tokenizer, special))


def is_gpt2_byte_level(spec: dict[str, Any]) -> bool:
    """Whether a tokenizer.json (as a dict) is what llama.cpp's "gpt2" model with the "gpt-2"
    pre-tokenizer computes: BPE, no normalizer, GPT-2's byte-level split without a prefix space."""
    pre = spec.get("pre_tokenizer") or {}
    plain_split = pre.get("type") == "ByteLevel" and not pre.get("add_prefix_space") and pre.get("use_regex", True)
    return spec["model"]["type"] == "BPE" and not spec.get("normalizer") and plain_split


def adds(tokenizer: BPETokenizer, token_id: int) -> bool:
    """Whether encoding with `tokenizer` puts `token_id` around every text (what its post-processor does)."""
    plain = tokenizer.tokenizer.encode("a", add_special_tokens=False).ids
    return token_id in tokenizer.encode("a") and token_id not in plain
