"""A Q4_0 GGUF decodes on the fused step's int4 format with the file's own blocks, by default.

The files are llama.cpp's converter's f32 files of tiny random Hugging Face folders with every
matrix of whole 32-value blocks rewritten as Q4_0 by gguf's own quantizer (tests/gguf_files.py).
The int4 step's weights (`attnlab.accel.fused.stored_weight` of the loaded, dequantized model) are
compared with the file's blocks read raw ([f16 d, 16 bytes of nibbles] a block), bit for bit, as
tests/models/hf/test_gguf_q8_blocks.py does for Q8_0; and greedy decoding with them is compared with
transformers running gguf's dequantization of the same file, for 64 tokens.
"""

from pathlib import Path

import numpy as np
import pytest
import torch

from attnlab.accel.fused import extension, stored_weight
from attnlab.decode import greedy
from attnlab.tasks.sources import default_weights, load_checkpoint
from gguf_files import convert, converter, hf_folder, reference_model
from helpers import cli
from models.hf.test_gguf import Converted, quantized_copy
from models.hf.test_gguf_q8_blocks import PARTS, products

gguf = pytest.importorskip("gguf")
pytest.importorskip("transformers")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(extension() is None, reason="the fused step could not be built here"),
]

LONG = dict(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
FOLDERS = {  # every matrix in whole blocks, and room for a prompt and 64 tokens
    "gpt2": ("gpt2", dict(n_embd=32, n_layer=2, n_head=4, n_positions=128)),
    "llama": ("llama", dict(LONG, hidden_size=32, intermediate_size=64, pad_token_id=None)),
}
NEW_TOKENS = 64


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> tuple[Converted, dict[str, Path]]:
    """The converted folders, and name -> the Q4_0 rewrite of each one's f32 file."""
    converter()
    root = tmp_path_factory.mktemp("q4")
    models = {name: hf_folder(root / name, family, **config) for name, (family, config) in FOLDERS.items()}
    converted = Converted(root, models)
    convert([(root / name, "f32", converted.path(name, "f32")) for name in FOLDERS])
    q4 = {name: quantized_copy(converted, name, "Q4_0", root / f"{name}-q4_0.gguf") for name in FOLDERS}
    return converted, q4


def file_rows(tensor) -> list[bytes]:
    """A Q4_0 tensor's rows as stored: per row, its nibbles then its scales widened to fp32."""
    assert tensor.tensor_type.name == "Q4_0"
    raw = np.array(tensor.data).reshape(-1, 18)  # blocks: 2 bytes of f16 d, 16 bytes of nibbles
    n_blocks = int(tensor.shape[0]) // 32  # ggml's shape lists the row length first
    nibbles = raw[:, 2:].reshape(-1, n_blocks * 16)
    scales = raw[:, :2].copy().view(np.float16).astype(np.float32).reshape(-1, n_blocks)
    return [n.tobytes() + s.tobytes() for n, s in zip(nibbles, scales, strict=True)]


def step_rows(weight: torch.Tensor) -> list[bytes]:
    """A product's weight as the int4 step stores it (`stored_weight`), in `file_rows`' form."""
    nibbles, scales = stored_weight(weight, "int4")
    nibbles, scales = nibbles.reshape(-1, nibbles.size(-1)).numpy(), scales.reshape(-1, scales.size(-1)).numpy()
    return [n.tobytes() + s.tobytes() for n, s in zip(nibbles, scales, strict=True)]


@pytest.mark.parametrize("name", FOLDERS)
def test_int4_step_holds_the_files_blocks_bit_for_bit(files, name):
    path = files[1][name]
    tensors = {t.name: t for t in gguf.GGUFReader(path).tensors}
    loaded = load_checkpoint(path, command="sample")
    assert loaded.stored_weights == "int4"
    assert default_weights(loaded.model, loaded.stored_weights) == "int4"  # what sample and serve take
    for key, weight in products(loaded.model):
        if key == "head":
            stored = [tensors.get("output.weight", tensors["token_embd.weight"])]
        else:
            pattern, product = key.split(":")
            stored = [tensors[n] for p in PARTS[product] if (n := pattern.format(part=p)) in tensors]
        expected = [row for t in stored for row in file_rows(t)]
        assert len(set(expected)) == len(expected)  # distinct rows: a set comparison misses nothing
        assert sorted(step_rows(weight)) == sorted(expected), key


def reference_greedy(model: torch.nn.Module, prompt: torch.Tensor, n: int) -> torch.Tensor:
    """n greedy tokens of a transformers model, each from the whole sequence's forward."""
    ids = prompt
    with torch.no_grad():
        for _ in range(n):
            ids = torch.cat([ids, model(ids).logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    return ids


@pytest.mark.parametrize("name", FOLDERS)
def test_q4_0_file_decodes_gguf_s_dequantized_model_s_greedy_tokens(files, name):
    converted, q4 = files
    reference = reference_model(converted.models[name], converted.path(name, "f32"), q4[name], FOLDERS[name][0])
    loaded = load_checkpoint(q4[name], command="sample")
    prompt = torch.tensor([[3, 1, 4, 1]])
    got = greedy(loaded.model, prompt, NEW_TOKENS, fused=True, weights=loaded.stored_weights)
    want = reference_greedy(reference, prompt, NEW_TOKENS)
    assert got.shape == want.shape and torch.equal(got, want), (got, want)


def test_sample_refuses_int4_for_rows_not_whole_blocks(files, capsys, tmp_path):
    # a Llama whose feed-forward rows are 48 wide
    folder = tmp_path / "narrow"
    hf_folder(folder, "llama")
    capsys.readouterr()  # the folder's writing
    code, out, err = cli(capsys, "sample", folder, "hello", "-n", "4", "--weights", "int4")
    assert code == 2 and "48" in err and "int8" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err
