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
for folder, outtype, out, *flags in json.loads(sys.argv[2]):
    sys.argv = [str(source / "convert_hf_to_gguf.py"), folder, "--outtype", outtype, "--outfile", out, *flags]
    runpy.run_path(sys.argv[0], run_name="__main__")
"""


def converter() -> Path:
    """The converter's folder, or a skip naming how to get it."""
    if not (CONVERTER / "convert_hf_to_gguf.py").is_file():
        pytest.skip(f"llama.cpp's converter is not in {CONVERTER}: run `make gguf-converter`")
    pytest.importorskip("sentencepiece", reason="llama.cpp's converter reads Llama vocabularies with sentencepiece")
    return CONVERTER


def convert(jobs: Sequence[tuple]) -> None:
    """llama.cpp's converter on each (Hugging Face folder, --outtype, output file, its other flags...)."""
    spec = json.dumps([[str(folder), outtype, str(out), *flags] for folder, outtype, out, *flags in jobs])
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


def hf_folder(
    folder: Path, family: str, *, tokenizer_class: str = "PreTrainedTokenizerFast", **config
) -> torch.nn.Module:
    """A tokenizer and a `spread` random `family` model ("llama", "gpt2", "qwen2", "qwen3"; or any
    model_type with `config` its shape) saved into `folder` as the converter reads it; returns the
    model. `tokenizer_class` is what tokenizer_config.json names (Phi-3's converter reads a
    byte-level BPE only where it says "GPT2Tokenizer", sentencepiece otherwise)."""
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
    tokenizer_config = {"tokenizer_class": tokenizer_class, "bos_token": "<s>", "eos_token": "</s>"}
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


def reference_model(
    model: torch.nn.Module,
    f32: Path,
    quantized: Path,
    architecture: str,
    joins: Mapping[str, Sequence[str]] | None = None,
) -> torch.nn.Module:
    """A copy of the transformers `model` whose weights are gguf's dequantization of the file
    `quantized`, put back in transformers' layout as the converter's `f32` file of `model` shows.
    `joins` names the transformers tensors the converter splits (Mixtral's fused experts' gate_up_proj)
    -> the GGUF tensors whose rows make it. A tensor the quantized file stores as the f32 file does
    (norms, kept in F32) keeps transformers' value: the converter may shift it (Gemma's 1 + w)."""
    import copy

    plain, stored = stored_tensors(f32), stored_tensors(quantized)
    state, tied = model.state_dict(), set()
    names = {
        hf: [name if name in stored or name.endswith(".weight") else name + ".weight"]
        for hf, name in gguf_names(model, architecture).items()
    }
    for hf, parts in {**names, **{hf: list(parts) for hf, parts in (joins or {}).items()}}.items():
        if parts[0] not in stored:  # the tied head, which follows the token embedding
            assert model.config.tie_word_embeddings, f"{quantized} has no {parts[0]}"
            tied.add(hf)
            continue
        if all(np.array_equal(stored[p][0], plain[p][0]) for p in parts):
            continue
        back = stored_to_hf(state[hf], torch.cat([dequantized(*plain[p]) for p in parts], dim=-2))
        state[hf] = back(torch.cat([dequantized(*stored[p]) for p in parts], dim=-2))
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


# Llama 3.1's RoPE scaling as Llama 3.2's config.json writes it, over a pre-training context of 32
# and a small base, so that a tiny model's 24 tokens feel it: of 8-wide heads' 4 pairs (wavelengths
# 6.3, 20, 63 and 200 positions) one is kept, one on the ramp and two divided by the factor.
LLAMA3_ROPE = dict(
    rope_type="llama3",
    rope_theta=100.0,
    factor=4.0,
    low_freq_factor=1.0,
    high_freq_factor=4.0,
    original_max_position_embeddings=32,
)

# -- attnlab runs to export ------------------------------------------------------------------------

TWO_STEPS = dict(max_iters=2, eval_interval=2, eval_iters=1, warmup_iters=1, log_interval=1, batch_size=4)
# Widths of whole q8_0 blocks (32) for most matrices; Llama's SwiGLU width is not one, which
# leaves its down projection in f32 (the rule `gguf_export.stored` follows).
EXPORTED_RUNS = {
    "gpt2": dict(activation="gelu_tanh"),  # llama.cpp's GPT-2 GELU is the tanh one
    "llama": dict(positions="rope", normalization="rmsnorm", activation="swiglu", bias=False, n_kv_heads=2),
    "exact-gelu": dict(),  # attnlab's default GELU (erf), which llama.cpp's GPT-2 does not compute
}
RUN_CONTEXT = 16
"""The runs' block_size: GPT-2's learned positions stop there."""


def tiny_runs(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """name -> the run folder of EXPORTED_RUNS[name] (a byte-level BPE of 300 tokens, 2 training
    steps on Shakespeare), trained on first use."""
    from attnlab.data.text import bundled_shakespeare
    from attnlab.train import resolve, train

    made: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in made:
            folder = tmp_path_factory.mktemp(name)
            (folder / "corpus.txt").write_text(bundled_shakespeare()[:5_000], encoding="utf-8")
            model = dict(block_size=RUN_CONTEXT, n_layers=2, n_heads=4, d_model=64, **EXPORTED_RUNS[name])
            data = dict(path=str(folder / "corpus.txt"), tokenizer="bpe", vocab_size=300)
            train(resolve(dict(task="lm", model=model, data=data, train=TWO_STEPS)), folder / "run", progress=False)
            made[name] = folder / "run"
        return made[name]

    return get


def llama3_gpt(folder: Path) -> tuple[torch.nn.Module, object]:
    """A Llama-shaped attnlab GPT with Llama 3.1's RoPE (LLAMA3_ROPE's settings, heads of 8) and the
    tiny tokenizer written into `folder`, moved from its init as `spread` moves transformers' models
    (q, k, v scaled up, embeddings of order 1, norm gains off 1) so that the scaling shows."""
    from attnlab.data.tokenizers import load_tokenizer
    from attnlab.models.gpt import GPT, GPTConfig

    write_tokenizer(folder)
    tokenizer = load_tokenizer(folder / "tokenizer.json")
    rope = dict(rope_scaling="llama3", rope_theta=LLAMA3_ROPE["rope_theta"], rope_factor=LLAMA3_ROPE["factor"])
    rope |= dict(rope_original_context=LLAMA3_ROPE["original_max_position_embeddings"])
    llama = dict(positions="rope", normalization="rmsnorm", activation="swiglu", bias=False, n_heads=4, n_kv_heads=2)
    config = GPTConfig(vocab_size=tokenizer.vocab_size, block_size=64, n_layers=2, d_model=32, **llama, **rope)
    torch.manual_seed(0)
    model = GPT(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            elif name.endswith(("attn.in_proj.weight", "token_embedding.weight")):
                p.mul_(10.0)
    return model, tokenizer
