"""A Q8_0 GGUF decodes on the fused step's int8 format with the file's own blocks, by default.

The fused step's int8 weights (`attnlab.accel.fused.quantize_q8_0` of the loaded, dequantized
model) are compared with the blocks as llama.cpp's converter wrote them, read raw with gguf's
reader ([f16 scale, 32 int8 codes] a block), bit for bit. The layouts the converter changes (Llama's
rotary row order, q/k/v and gate/up stacked into one product) move whole rows, so each product's
rows are compared as a set with the rows of the file tensors it is made of (the row order is what
tests/models/hf/test_gguf.py's logits check).
"""

from pathlib import Path

import numpy as np
import pytest
import torch

from attnlab.accel.fused import quantize_q8_0, stored_weight
from attnlab.tasks.sources import load_checkpoint
from gguf_files import convert, converter, hf_folder
from helpers import cli

pytestmark = pytest.mark.slow

gguf = pytest.importorskip("gguf")
pytest.importorskip("transformers")

SMALL = dict(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
SMALL |= dict(pad_token_id=None, num_hidden_layers=2)
FOLDERS = {
    "gpt2": ("gpt2", {}),
    "qwen3": ("qwen3", dict(SMALL, intermediate_size=64, head_dim=16)),
    "llama": ("llama", {}),  # its 48-wide down_proj rows are not whole blocks: the converter writes F16
    "mixtral": ("mixtral", dict(SMALL, intermediate_size=64, num_local_experts=3, num_experts_per_tok=2)),
}
# Each product of the fused step (`FusedStep._bind`'s order) and the file tensors it is made of.
PARTS = {
    "in_proj": ("attn_q", "attn_k", "attn_v", "attn_qkv"),
    "out_proj": ("attn_output",),
    "fc1": ("ffn_gate", "ffn_up", "ffn_gate_exps", "ffn_up_exps"),
    "fc2": ("ffn_down", "ffn_down_exps"),
}


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    """name -> the converter's Q8_0 file of a tiny random folder of that family."""
    converter()
    root = tmp_path_factory.mktemp("q8")
    for name, (family, config) in FOLDERS.items():
        hf_folder(root / name, family, **config)
    convert([(root / name, "q8_0", root / f"{name}.gguf") for name in FOLDERS])
    return {name: root / f"{name}.gguf" for name in FOLDERS}


def file_rows(tensor) -> list[bytes]:
    """A Q8_0 tensor's rows as stored: per row, its int8 codes then its scales widened to fp32."""
    assert tensor.tensor_type.name == "Q8_0"
    raw = np.array(tensor.data).reshape(-1, 34)  # blocks: 2 bytes of f16 scale, 32 int8 codes
    n_blocks = int(tensor.shape[0]) // 32  # ggml's shape lists the row length first
    codes = raw[:, 2:].copy().view(np.int8).reshape(-1, n_blocks * 32)
    scales = raw[:, :2].copy().view(np.float16).astype(np.float32).reshape(-1, n_blocks)
    return [c.tobytes() + s.tobytes() for c, s in zip(codes, scales, strict=True)]


def step_rows(weight: torch.Tensor) -> list[bytes]:
    """A product's weight as the int8 step stores it (`stored_weight`), in `file_rows`' form."""
    codes, scales = stored_weight(weight, "int8")
    codes, scales = codes.reshape(-1, codes.size(-1)).numpy(), scales.reshape(-1, scales.size(-1)).numpy()
    return [c.tobytes() + s.tobytes() for c, s in zip(codes, scales, strict=True)]


def products(model: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    """(the file tensors' names with "{part}", the weight) of every product the fused step stores."""
    out = []
    for i, block in enumerate(model.blocks):
        ffn = block.ffn
        dense = hasattr(ffn, "fc1")
        weights = {"in_proj": block.attn.in_proj.weight, "out_proj": block.attn.out_proj.weight}
        weights |= {"fc1": ffn.fc1.weight, "fc2": ffn.fc2.weight} if dense else {}
        weights |= {} if dense else {"fc1": ffn.experts.fc1, "fc2": ffn.experts.fc2}
        out += [(f"blk.{i}.{{part}}.weight:{name}", w) for name, w in weights.items()]
    return out + [("head", model.lm_head.weight)]


@pytest.mark.parametrize("name", ["gpt2", "qwen3", "mixtral"])
def test_int8_step_holds_the_files_blocks_bit_for_bit(files, name):
    tensors = {t.name: t for t in gguf.GGUFReader(files[name]).tensors}
    model = load_checkpoint(files[name], command="sample").model
    for key, weight in products(model):
        if key == "head":
            stored = [tensors.get("output.weight", tensors["token_embd.weight"])]
        else:
            pattern, product = key.split(":")
            stored = [tensors[n] for p in PARTS[product] if (n := pattern.format(part=p)) in tensors]
        expected = [row for t in stored for row in file_rows(t)]
        assert len(set(expected)) == len(expected)  # distinct rows: a set comparison misses nothing
        assert sorted(step_rows(weight)) == sorted(expected), key


def test_requantizing_ggml_blocks_gives_them_back():
    """gguf's numpy q8_0 (ggml's reference rounding) of blocks with ties (x / d halfway between two
    codes), all-zero blocks, tiny and huge ranges: quantize_q8_0 of the dequantized values gives the
    same codes and scales; a block whose scale underflows f16 to 0 gives the same (zero) weights."""
    from gguf.quants import dequantize, quantize

    rng = np.random.default_rng(0)
    ranges = np.array([[1], [1e-3], [1e3], [0], [1], [1e-7]], np.float32)  # row 3 zeros; row 5's d underflows
    x = rng.standard_normal((6, 64)).astype(np.float32) * ranges
    x[4, :32] = np.concatenate([[127.0], np.arange(31) + 0.5]) * 0.01  # d = 0.01: x / d halfway between codes
    q8 = gguf.GGMLQuantizationType.Q8_0
    blocks = quantize(x, q8)
    codes, scales = quantize_q8_0(torch.from_numpy(np.array(dequantize(blocks, q8), dtype=np.float32)))
    raw = blocks.reshape(-1, 34)
    file_codes = torch.from_numpy(raw[:, 2:].copy().view(np.int8).reshape(6, 64))
    file_scales = torch.from_numpy(raw[:, :2].copy().view(np.float16).astype(np.float32).reshape(6, 2))
    assert torch.equal(scales, file_scales)
    assert torch.equal(codes[:5], file_codes[:5])
    assert not file_scales[5].any() and file_codes[5].any()  # the underflow case is there
    assert torch.equal(codes * scales.repeat_interleave(32, 1), file_codes * file_scales.repeat_interleave(32, 1))


def test_a_q8_0_file_says_int8_and_others_none(files, tmp_path):
    assert {name: load_checkpoint(path, command="sample").stored_weights for name, path in files.items()} == {
        "gpt2": "int8",
        "qwen3": "int8",
        "llama": None,  # an F16 down_proj: int8 would round its values
        "mixtral": "int8",
    }


@pytest.fixture
def fused_formats(monkeypatch) -> list[str]:
    """The format of every fused step made (`attnlab.accel.fused.gpt_step`'s result), in order."""
    from attnlab.accel import fused

    if fused.extension() is None:
        pytest.skip("the fused step could not be built here")
    made, make = [], fused.gpt_step

    def recording(*args, **kwargs):
        step = make(*args, **kwargs)
        made.append(None if step is None else step.format)
        return step

    monkeypatch.setattr(fused, "gpt_step", recording)
    return made


def greedy_json(capsys, path: Path, *flags: str) -> str:
    code, out, err = cli(capsys, "sample", path, "hello", "-n", "24", "--temperature", "0", "--json", *flags)
    assert code == 0, err
    return out


@pytest.mark.parametrize("name", ["gpt2", "mixtral"])  # the fused step does not cover Qwen3's q/k norms
def test_sampling_a_q8_0_file_takes_int8_by_default(files, capsys, fused_formats, name):
    default = greedy_json(capsys, files[name])
    assert fused_formats == ["int8"]
    assert default == greedy_json(capsys, files[name], "--weights", "int8")
    assert greedy_json(capsys, files[name], "--weights", "fp32") and fused_formats[-1] == "fp32"
    made = len(fused_formats)
    assert greedy_json(capsys, files[name], "--no-fused") and len(fused_formats) == made  # no int8 without it


def test_sampling_other_files_keeps_fp32(files, capsys, fused_formats):
    greedy_json(capsys, files["llama"], "--fused")
    assert fused_formats == ["fp32"]


def test_serving_a_q8_0_file_takes_int8_unless_told(files):
    pytest.importorskip("fastapi")
    from attnlab.serve.registry import load_runs, served_models

    runs = load_runs([f"m={files['gpt2']}"])
    for asked, used in ((None, "int8"), ("fp32", "fp32")):
        served = served_models(runs, worker_options=dict(fused=True, weights=asked))
        assert served["m"].worker.batcher.runner.fused.format == used
