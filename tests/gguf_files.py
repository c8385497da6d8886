"""GGUF files for tests, written by llama.cpp's own converter and by gguf's writer.

The converter (`convert_hf_to_gguf.py`, its `conversion/` package and its own `gguf-py/`) comes from
llama-cpp-python's source distribution; `make gguf-converter` unpacks it into
`.venv/llama-cpp-converter/` (ATTNLAB_GGUF_CONVERTER names another folder), and the tests that need
it skip, saying so, where it is missing. It converts tiny random-weight Hugging Face folders
(`tests/hf_folders.py`'s tokenizer and models, moved away from their init so that a layout mix-up
shows in the logits). Files of the types the converter does not write (Q4_0, the K-quants) are
its f32 file rewritten with gguf's `GGUFWriter`, tensor by tensor (`rewrite_gguf`).

The references never use attnlab's reader: `stored_to_hf` learns how the converter laid out each
tensor by matching its f32 output against the transformers weights, row by row.
"""

import json
import os
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np
import pytest
import torch

from hf_folders import hf_model, write_tokenizer

ROOT = Path(__file__).parents[1]
CONVERTER = Path(os.environ.get("ATTNLAB_GGUF_CONVERTER", ROOT / ".venv" / "llama-cpp-converter"))

# Runs the converter once per job (folder, outtype, outfile) in one process. Our tokenizer is GPT-2's
# byte-level pre-tokenizer with a vocabulary of its own, which the converter identifies by hashing
# the ids of a test string and refuses as unknown; it is told "gpt-2", as its refusal asks
# ("update get_vocab_base_pre()"). The converter's own gguf-py goes first on sys.path, as it runs by default.
CONVERT = """
import json, runpy, sys
from pathlib import Path
source = Path(sys.argv[1])
sys.path[:0] = [str(source), str(source / "gguf-py")]
import conversion.base
conversion.base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "gpt-2"
for folder, outtype, out in json.loads(sys.argv[2]):
    sys.argv = [str(source / "convert_hf_to_gguf.py"), folder, "--outtype", outtype, "--outfile", out]
    runpy.run_path(sys.argv[0], run_name="__main__")
"""


def converter() -> Path:
    """The converter's folder, or a skip naming how to get it."""
    if not (CONVERTER / "convert_hf_to_gguf.py").is_file():
        pytest.skip(f"llama.cpp's converter is not in {CONVERTER}: run `make gguf-converter`")
    pytest.importorskip("sentencepiece", reason="llama.cpp's converter reads Llama vocabularies with sentencepiece")
    return CONVERTER


def convert(jobs: Sequence[tuple[Path, str, Path]]) -> None:
    """llama.cpp's converter on each (Hugging Face folder, --outtype, output file)."""
    spec = json.dumps([[str(folder), outtype, str(out)] for folder, outtype, out in jobs])
    done = subprocess.run(
        [sys.executable, "-c", CONVERT, str(converter()), spec],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert done.returncode == 0, done.stderr[-4000:]


def spread(model: torch.nn.Module) -> torch.nn.Module:
    """`model` moved away from its init, in place: norm gains off 1, sharper attention (q and k
    scaled up) and logits of order 1, so that a swapped row, head or transpose moves the logits far
    beyond the tolerance (near the init attention is almost uniform and hides q / k mix-ups)."""
    torch.manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or "ln_" in name:
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            elif name.endswith(("q_proj.weight", "k_proj.weight", "c_attn.weight")):
                p.mul_(8.0)
            elif name.endswith(("embed_tokens.weight", "lm_head.weight", "wte.weight")):
                p.mul_(10.0)
            elif name.endswith("bias"):
                p.copy_(0.1 * torch.randn_like(p))
    return model


# The converter's Qwen vocabularies gain one token (its "<|endoftext|>"): the model is that much wider.
EXTRA_TOKENS = {"qwen2": 1, "qwen3": 1}


QWEN_TINY = dict(
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,  # Qwen3's heads sized apart from the width; Qwen2's read it too
    max_position_embeddings=64,
)


def hf_folder(folder: Path, family: str, **config) -> torch.nn.Module:
    """A tokenizer and a `spread` random `family` model ("llama", "gpt2", "qwen2", "qwen3"; or any
    of them with `config` overriding the tiny shape) saved into `folder` as the converter reads it;
    returns the model."""
    folder.mkdir(parents=True)
    tok = write_tokenizer(folder)
    if config or family in EXTRA_TOKENS:
        import transformers

        torch.manual_seed(0)
        vocab = tok.get_vocab_size() + EXTRA_TOKENS.get(family, 0)
        fields = dict(vocab_size=vocab, bos_token_id=0, eos_token_id=1, **(config or QWEN_TINY))
        config_class = transformers.AutoConfig.for_model(family, **fields)
        model = transformers.AutoModelForCausalLM.from_config(config_class).eval()
    else:
        model = hf_model(family, tok.get_vocab_size())
    spread(model).save_pretrained(folder)
    # The converter reads the tokenizer with AutoTokenizer, which takes the file as it is only with
    # this; and GPT-2's context length as n_ctx, which transformers 5 no longer writes.
    tokenizer_config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>"}
    (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    hf_config = json.loads((folder / "config.json").read_text())
    if "n_positions" in hf_config:
        (folder / "config.json").write_text(json.dumps(hf_config | {"n_ctx": hf_config["n_positions"]}))
    return model


def fields(path: Path) -> dict:
    """A GGUF file's metadata: key -> (value, its types), as gguf's reader sees them."""
    from gguf import GGUFReader

    reader = GGUFReader(path)
    return {name: (f.contents(), f.types) for name, f in reader.fields.items()}


def rewrite_gguf(
    source: Path,
    out: Path,
    *,
    architecture: str | None = None,
    drop: Sequence[str] = (),
    tensors: Mapping[str, tuple[np.ndarray, object]] | None = None,
    add: Mapping[str, str | float] | None = None,
) -> None:
    """Copy the GGUF `source` to `out` with gguf's writer: `architecture` in place of its own,
    metadata keys `drop` left out, keys `add` added (a string or a float32), and tensors named in
    `tensors` replaced by (data, GGML type; data as GGUFWriter takes it: float32, or uint8 blocks in
    the type's byte layout)."""
    from gguf import GGUFReader, GGUFValueType, GGUFWriter

    reader = GGUFReader(source)
    name = architecture or reader.fields["general.architecture"].contents()
    writer = GGUFWriter(out, name)
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture" or key in drop:
            continue
        sub_type = field.types[-1] if field.types[0] == GGUFValueType.ARRAY else None
        writer.add_key_value(key, field.contents(), field.types[0], sub_type=sub_type)
    for key, value in (add or {}).items():
        (writer.add_string if isinstance(value, str) else writer.add_float32)(key, value)
    for tensor in reader.tensors:
        data, qtype = (tensors or {}).get(tensor.name, (np.array(tensor.data), tensor.tensor_type))
        writer.add_tensor(tensor.name, data, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def stored_tensors(path: Path) -> dict[str, tuple[np.ndarray, object]]:
    """Every tensor of a GGUF file: name -> (its data as stored, its GGML type)."""
    from gguf import GGUFReader

    return {t.name: (np.array(t.data), t.tensor_type) for t in GGUFReader(path).tensors}


def dequantized(data: np.ndarray, qtype: object) -> torch.Tensor:
    """gguf's own dequantizer on one stored tensor: float32, (rows, columns)."""
    from gguf.quants import dequantize

    return torch.from_numpy(np.array(dequantize(data, qtype), dtype=np.float32))


def stored_to_hf(hf: torch.Tensor, stored: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
    """How the converter laid out transformers' tensor `hf` in its f32 output `stored` (a row
    permutation of it or of its transpose), found by matching rows exactly; returns the map from
    any tensor in the stored layout (a dequantized one) back to transformers' layout."""
    for transposed in (False, True):
        target = hf.t() if transposed else hf
        if target.shape != stored.shape:
            continue
        if torch.equal(target, stored):
            return lambda x, t=transposed: x.t() if t else x
        if stored.dim() == 2:
            order = torch.cdist(stored, target).argmin(dim=1)  # stored row r is target row order[r]
            if torch.equal(target[order], stored) and len(set(order.tolist())) == len(order):
                return lambda x, o=order, t=transposed: unpermuted(x, o, t)
    raise AssertionError(f"the converter's tensor {tuple(stored.shape)} is no row order of {tuple(hf.shape)}")


def unpermuted(x: torch.Tensor, order: torch.Tensor, transposed: bool) -> torch.Tensor:
    """`x` with its row r moved to row order[r], then transposed if `transposed`."""
    rows = torch.empty_like(x).index_copy_(0, order, x)
    return rows.t() if transposed else rows


def gguf_names(model: torch.nn.Module, architecture: str) -> dict[str, str]:
    """transformers tensor name -> its GGUF name, by gguf's own name table (not attnlab's)."""
    import gguf

    arch = next(a for a, name in gguf.MODEL_ARCH_NAMES.items() if name == architecture)
    table = gguf.get_tensor_name_map(arch, model.config.num_hidden_layers)
    names = {}
    for hf in model.state_dict():
        name = table.get_name(hf, try_suffixes=(".weight", ".bias"))
        if name is not None and not hf.endswith(".attn.bias"):  # GPT-2's stored causal mask
            names[hf] = name
    return names


def reference_model(model: torch.nn.Module, f32: Path, quantized: Path, architecture: str) -> torch.nn.Module:
    """A copy of the transformers `model` whose weights are gguf's dequantization of the file
    `quantized`, put back in transformers' layout as the converter's `f32` file of `model` shows."""
    import copy

    plain, stored = stored_tensors(f32), stored_tensors(quantized)
    state, tied = model.state_dict(), set()
    for hf, name in gguf_names(model, architecture).items():
        if name not in stored:  # the tied head, which follows the token embedding
            assert model.config.tie_word_embeddings, f"{quantized} has no {name}"
            tied.add(hf)
            continue
        back = stored_to_hf(state[hf], dequantized(*plain[name]))
        state[hf] = back(dequantized(*stored[name]))
    reference = copy.deepcopy(model)
    missing, _ = reference.load_state_dict({k: v for k, v in state.items() if k not in tied}, strict=False)
    assert set(missing) == tied
    return reference.eval()


# Where each K-quant block keeps its f16 scales, and the scale written there (ggml-common.h:
# block_q4_K {d, dmin, scales[12], qs[128]}, block_q5_K {d, dmin, scales[12], qh[32], qs[128]},
# block_q6_K {ql[128], qh[64], scales[16], d}): byte offset -> value. The scales are chosen so
# that the weights come out of the order of 0.05, like a trained layer's.
K_SCALES = {"Q4_K": {0: 2e-4, 2: 2e-4}, "Q5_K": {0: 1e-4, 2: 1e-4}, "Q6_K": {208: 1e-5}}


def random_blocks(shape: tuple[int, int], qtype_name: str, seed: int) -> tuple[np.ndarray, object]:
    """A (rows, columns) tensor as random blocks of a K-quant type: random codes and sub-block
    scales, fixed f16 super-block scales (`K_SCALES`). gguf cannot quantize to these types; the
    reference and attnlab both read what the blocks decode to."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    qtype = GGMLQuantizationType[qtype_name]
    block, size = GGML_QUANT_SIZES[qtype]
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, size=(shape[0], shape[1] // block, size), dtype=np.uint8)
    for offset, scale in K_SCALES[qtype_name].items():
        blocks[..., offset : offset + 2] = np.frombuffer(np.float16(scale).tobytes(), np.uint8)
    return blocks.reshape(shape[0], -1), qtype
