"""The fused step's q4_k weights (`attnlab.accel.fused`'s "q4_k": GGUF's Q4_K and Q6_K super-blocks,
mixed as llama.cpp's Q4_K_M mixes them) and their products.

gguf-py cannot quantize to these types, so `attnlab.accel.blocks`' quantizers are held to two
things: gguf's own dequantizer reads their bytes as attnlab's does, bit for bit, and every value
is within half its sub-block's step of the weight (the format's rounding, the scales read back
from the bytes). The products (`quantizedk.h`) are held to PyTorch's product of gguf's
dequantized weights in float64, as tests/accel/test_q4.py holds Q4_0's: up to 15 rows the
activations are quantized per block of 32 (as for Q4_0) and the integer sums are exact, so the
products equal the dequantized weights times the activations as quantized up to float32's
rounding, and differ from the weights times the activations as they are by at most the
activations' rounding, sum_i |w_ji| e(i) / 2; from 16 rows the weights are widened to fp32. Each
path runs: the vector one this build has (256-bit, with AVX-512 VNNI's sums where the CPU has
them; `make test-avx2` runs this file on the AVX2 build), the plain C++ one, and the x86-64-v4
build (AVX-512 without VNNI) where this CPU runs it.
"""

import numpy as np
import pytest
import torch

from accel.test_fused_int8 import trained_gpt
from accel.test_q4 import (  # noqa: F401 (avx512_build: a fixture)
    assert_extend_is_the_dequantized_model,
    avx512_build,
    dequantized_copy,
    quantized_activations,
)
from attnlab.accel.blocks import (
    Q4_K_BYTES,
    Q6_K_BYTES,
    dequantize_q4_k,
    dequantize_q6_k,
    q4_k_scales,
    quantize_q4_k,
    quantize_q6_k,
    quantize_rows,
)
from attnlab.accel.fused import (
    WEIGHT_FORMATS,
    WeightsShapeError,
    extension,
    q4_k_m_kinds,
    weights_refusal,
)
from attnlab.decode import greedy
from decode.conftest import tiny_gpt
from tolerance import assert_float32_close, float32_factor

gguf = pytest.importorskip("gguf")
pytestmark = pytest.mark.skipif(extension() is None, reason="the fused step could not be built here")

KINDS = ("Q4_K", "Q6_K")
QUANTIZE = {"Q4_K": quantize_q4_k, "Q6_K": quantize_q6_k}
DEQUANTIZE = {"Q4_K": dequantize_q4_k, "Q6_K": dequantize_q6_k}
STREAMED_ROWS = (1, 2, 3, 5, 8, 9, 15)
WIDENED_ROWS = (16, 33)


@pytest.fixture(params=("vector", "portable"))
def path(request):
    """The products' path: the build's vector code, or the plain C++ one on this CPU."""
    ext = extension()
    ext.set_portable_q4(request.param == "portable")
    yield request.param
    ext.set_portable_q4(False)


def gguf_values(blocks: torch.Tensor, kind: str) -> torch.Tensor:
    """gguf's dequantization of super-blocks `(rows, bytes)` of one kind -> float32 `(rows, in)`."""
    qtype = gguf.GGMLQuantizationType[kind]
    return torch.from_numpy(np.array(gguf.quants.dequantize(blocks.numpy(), qtype), dtype=np.float32))


def gguf_rows(values: torch.Tensor, kinds: torch.Tensor) -> torch.Tensor:
    """gguf's dequantization of a q4_k weight `(out, bytes)` whose row j is of kind kinds[j]."""
    width = values.size(1) // (Q6_K_BYTES if (kinds == 1).any() else Q4_K_BYTES) * 256
    out = torch.empty(values.size(0), width)
    for j, kind in enumerate(kinds.tolist()):
        size = width // 256 * (Q4_K_BYTES, Q6_K_BYTES)[kind]
        out[j] = gguf_values(values[j : j + 1, :size], KINDS[kind])[0]
    return out


def awkward_rows() -> torch.Tensor:
    """Rows with what a K-quant's scales must get right: a zero sub-block, one sign only, huge and
    tiny ranges, one outlier beside small values, a constant sub-block."""
    g = torch.Generator().manual_seed(0)
    w = torch.randn(8, 512, generator=g) * 0.05
    w[0, :32] = 0.0
    w[1, 256:] = w[1, 256:].abs()  # no negative values: no mins
    w[2, :256] = -w[2, :256].abs() - 1.0  # all below zero
    w[3] *= 1e3
    w[4] *= 1e-3
    w[5, 40] = 4.0  # one outlier sets the super-block's scales
    w[6, 64:96] = 0.3  # constant
    return w


def steps(blocks: torch.Tensor, kind: str) -> torch.Tensor:
    """Each value's sub-block step, read back from the bytes: d sc_j (Q4_K) or d scale_s (Q6_K)."""
    b = blocks.reshape(blocks.size(0), -1, Q4_K_BYTES if kind == "Q4_K" else Q6_K_BYTES)
    if kind == "Q4_K":
        d = b[..., :2].contiguous().view(torch.float16).double()
        sc, _ = q4_k_scales(b[..., 4:16])
        return (d * sc.double()).repeat_interleave(32, -1).flatten(1)
    d = b[..., 208:].contiguous().view(torch.float16).double()
    scales = b[..., 192:208].contiguous().view(torch.int8).double()
    return (d * scales).repeat_interleave(16, -1).flatten(1)


@pytest.mark.parametrize("kind", KINDS)
def test_gguf_reads_the_blocks_as_attnlab_does(kind):
    w = torch.cat([awkward_rows(), torch.randn(24, 512, generator=torch.Generator().manual_seed(1))])
    blocks = QUANTIZE[kind](w)
    size = Q4_K_BYTES if kind == "Q4_K" else Q6_K_BYTES
    assert blocks.dtype == torch.uint8 and blocks.shape == (32, 2 * size)
    assert torch.equal(DEQUANTIZE[kind](blocks), gguf_values(blocks, kind))


@pytest.mark.parametrize("kind", KINDS)
def test_every_value_is_within_half_its_sub_blocks_step(kind):
    w = torch.cat([awkward_rows(), torch.randn(24, 512, generator=torch.Generator().manual_seed(2))])
    blocks = QUANTIZE[kind](w)
    values, step = gguf_values(blocks, kind).double(), steps(blocks, kind)
    # Q4_K's (d sc) q − dmin m rounds once in float32 (2⁻²⁴ of the value); Q6_K's is exact
    rounding = values.abs() * 2.0**-24 if kind == "Q4_K" else 0.0
    assert ((values - w.double()).abs() <= step / 2 + rounding).all()
    # and the steps are the smallest the scales' bits allow: a sub-block's range over its codes, up
    # to one unit of d (and of dmin, for Q4_K's mins) that the six- or seven-bit scales round up by
    per = 32 if kind == "Q4_K" else 16
    sub = w.double().reshape(w.size(0), -1, per)
    if kind == "Q4_K":
        b = blocks.reshape(w.size(0), -1, Q4_K_BYTES)
        d, dmin = (b[..., i : i + 2].contiguous().view(torch.float16).double()[..., 0] for i in (0, 2))
        spread = sub.amax(-1) - sub.amin(-1).clamp(max=0)
        largest = (spread + dmin.repeat_interleave(8, -1)) / 15 + d.repeat_interleave(8, -1)
    else:
        d = blocks.reshape(w.size(0), -1, Q6_K_BYTES)[..., 208:].contiguous().view(torch.float16).double()[..., 0]
        largest = sub.abs().amax(-1) / 31 + d.repeat_interleave(16, -1)
    # (the bound itself computed in float64, one part in 2⁵⁰ of it allowed for that)
    assert (step.reshape(w.size(0), -1, per)[..., 0] <= largest * (1 + 2.0**-50)).all()


@pytest.mark.parametrize("kind", KINDS)
def test_quantizers_keep_leading_dimensions_and_need_whole_super_blocks(kind):
    w = torch.randn(3, 5, 256, generator=torch.Generator().manual_seed(3))  # a mixture's experts
    assert torch.equal(QUANTIZE[kind](w).reshape(15, -1), QUANTIZE[kind](w.reshape(15, 256)))
    with pytest.raises(ValueError, match="multiple of 256"):
        QUANTIZE[kind](torch.randn(4, 288))


def operands(rows: int, out: int = 24, width: int = 768, seed: int = 0):
    """A random weight in q4_k with its rows' kinds alternating (Q4_K, Q6_K), its values as gguf
    dequantizes them (float64) and rows x (float32). 768 wide: three super-blocks."""
    g = torch.Generator().manual_seed(seed)
    kinds = (torch.arange(out) % 2).to(torch.uint8)
    values = quantize_rows(torch.randn(out, width, generator=g) * 0.05, kinds)
    x = torch.randn(rows, width, generator=g)
    x[0, :32] = 0.0  # an all-zero block of activations: e = 0
    return values, kinds, gguf_rows(values, kinds).double(), x


@pytest.mark.parametrize("rows", STREAMED_ROWS)
def test_streamed_product_sums_the_quantized_activations_exactly(path, rows):
    values, kinds, w, x = operands(rows)
    got = extension().stored_linear(values, kinds, x)
    assert_float32_close(got, (quantized_activations(x).double() @ w.T).float(), reduction=w.size(1))


@pytest.mark.parametrize("rows", STREAMED_ROWS)
def test_streamed_product_is_within_the_activations_rounding(path, rows):
    values, kinds, w, x = operands(rows, seed=1)
    got = extension().stored_linear(values, kinds, x).double()
    want = x.double() @ w.T
    e = x.reshape(rows, -1, 32).abs().amax(-1).repeat_interleave(32, 1) / 127  # each value's block scale
    bound = (e.double() / 2) @ w.abs().T + float32_factor(w.size(1)) * (1 + want.abs())
    assert ((got - want).abs() <= bound).all()
    # a layout mistake moves the products past it: Q4_K's even and odd sub-blocks of the second
    # super-block swapped (its nibbles' halves), Q6_K's codes' top bits of one half shifted
    wrong = values.clone()
    q4 = wrong[0::2, Q4_K_BYTES + 16 : 2 * Q4_K_BYTES]
    wrong[0::2, Q4_K_BYTES + 16 : 2 * Q4_K_BYTES] = (q4 >> 4) | (q4 << 4)
    q6 = wrong[1::2, Q6_K_BYTES + 128 : Q6_K_BYTES + 160]
    wrong[1::2, Q6_K_BYTES + 128 : Q6_K_BYTES + 160] = (q6 >> 2) | (q6 << 6)
    moved = (extension().stored_linear(wrong, kinds, x).double() - want).abs() > bound
    assert moved[:, 0::2].any() and moved[:, 1::2].any()


@pytest.mark.parametrize("rows", WIDENED_ROWS)
def test_widened_product_is_the_dequantized_weights(path, rows):
    values, kinds, w, x = operands(rows, seed=2)
    assert rows >= extension().WIDENED_MIN_ROWS
    got = extension().stored_linear(values, kinds, x)
    assert_float32_close(got, (x.double() @ w.T).float(), reduction=w.size(1))


@pytest.mark.parametrize("rows", (1, 4, 8))
def test_vector_and_portable_paths_agree(rows):
    ext = extension()
    values, kinds, w, x = operands(rows, out=40, width=2048, seed=3)
    vector = ext.stored_linear(values, kinds, x)
    ext.set_portable_q4(True)
    try:
        portable = ext.stored_linear(values, kinds, x)
    finally:
        ext.set_portable_q4(False)
    assert_float32_close(vector, portable, reduction=w.size(1))


@pytest.mark.slow  # builds the step a second time
@pytest.mark.parametrize("rows", (1, 2, 8))
def test_the_avx512_build_without_vnni_sums_the_quantized_activations_exactly(avx512_build, rows):  # noqa: F811
    assert avx512_build.QK_PATH == "avx2"  # the 256-bit code, its sums in AVX2's instructions
    values, kinds, w, x = operands(rows, seed=4)
    want = (quantized_activations(x).double() @ w.T).float()
    assert_float32_close(avx512_build.stored_linear(values, kinds, x), want, reduction=w.size(1))


def test_this_build_takes_its_widest_path():
    from attnlab.accel.extensions import default_march
    from attnlab.device import cpu_flags

    flags, path, march = cpu_flags(), extension().QK_PATH, default_march()
    if march == "native" and {"avx512_vnni", "avx512vl", "avx2", "fma"} <= flags:
        assert path == "avx2-vnni"
    elif march in ("native", "x86-64-v3") and {"avx2", "fma"} <= flags:
        assert path == "avx2"


# -- the GPT step with q4_k weights ------------------------------------------------------------------

LLAMA = dict(normalization="rmsnorm", activation="swiglu", positions="rope", bias=False, n_heads=4, n_kv_heads=2)
ARCHITECTURES = {
    "gpt2": dict(d_model=256),
    "llama": LLAMA | dict(d_model=256, ffn_hidden=256),
    "mixtral": LLAMA | dict(d_model=256, ffn_hidden=256, experts=3, expert_top_k=2),
}


def test_q4_k_m_kinds_are_llama_cpps_choice():
    """llama.cpp's Q4_K_M over 8 layers: use_more_bits picks layers 0 (the first eighth), 7 (the
    last) and 3, 6 (every third from the first eighth on); there attn_v and ffn_down are Q6_K."""
    model = tiny_gpt(n_layers=8, **ARCHITECTURES["llama"])
    kinds = q4_k_m_kinds(model)
    assert len(kinds) == 8 * 4 + 1 and bool((kinds[-1] == 1).all())  # the head
    qk_rows = (4 + 2) * 64  # 4 query and 2 key heads of 64
    for layer in range(8):
        in_proj, out_proj, fc1, fc2 = kinds[4 * layer : 4 * layer + 4]
        six = layer in (0, 3, 6, 7)
        assert in_proj.shape == (qk_rows + 2 * 64,) and not in_proj[:qk_rows].any()
        assert bool((in_proj[qk_rows:] == six).all()) and bool((fc2 == six).all())
        assert not out_proj.any() and not fc1.any()


def dequantized_model(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of the model whose products' weights are their q4_k values (`q4_k_m_kinds`'s rows
    kinds, attnlab's quantizer) as gguf dequantizes them (the embedding kept fp32; a tied head untied)."""
    return dequantized_copy(model, stored_values, q4_k_m_kinds(model))


def stored_values(weight: torch.Tensor, kinds: torch.Tensor) -> torch.Tensor:
    flat = weight.detach().reshape(-1, weight.size(-1))
    values = quantize_rows(flat, kinds.reshape(-1))
    return gguf_rows(values, kinds.reshape(-1)).reshape(weight.shape)


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_a_step_of_many_tokens_is_the_dequantized_model(arch):
    """60 tokens in one call (`extend`) widen the q4_k weights and multiply the tokens as they are:
    the dequantized model's own forward within float32's rounding."""
    model = tiny_gpt(block_size=64, **ARCHITECTURES[arch])
    assert_extend_is_the_dequantized_model(model, dequantized_model(model), "q4_k")


@pytest.fixture(scope="module")
def trained() -> torch.nn.Module:
    return trained_gpt(d_model=256, n_heads=4, ffn_hidden=256)  # every row whole super-blocks


@pytest.mark.slow  # trains a model
def test_a_trained_model_decodes_the_dequantized_models_greedy_tokens(trained, path):
    """Batch-1 steps quantize the activations, so their logits differ from the dequantized model's
    by that rounding: a trained model, whose logits pick confidently, keeps the dequantized model's
    greedy tokens for 64 tokens, several prompts at once."""
    prompt = torch.randint(0, trained.config.vocab_size, (3, 8), generator=torch.Generator().manual_seed(6))
    got = greedy(trained, prompt, 64, fused=True, weights="q4_k")
    dequantized = dequantized_model(trained)
    assert torch.equal(got, greedy(dequantized, prompt, 64))
    # The comparison is with other weights than the model's own (whose greedy tokens the four-bit
    # ones may or may not change, as the CPU's rounding in training has it).
    assert not torch.equal(dequantized.lm_head.weight, trained.lm_head.weight)


def test_q4_k_is_a_weight_format_and_a_command_line_choice():
    from attnlab.cli.arguments import WEIGHTS

    assert "q4_k" in WEIGHT_FORMATS and WEIGHTS == WEIGHT_FORMATS


def test_q4_k_refuses_rows_not_a_multiple_of_256_in_one_line():
    model = tiny_gpt(**LLAMA | dict(d_model=64, ffn_hidden=96))
    with pytest.raises(WeightsShapeError) as e:
        weights_refusal(model, "q4_k")
    message = str(e.value)
    assert "\n" not in message and "64, 96" in message and "256" in message and "int4" in message
    assert weights_refusal(model, "int4") is None  # whole blocks of 32


# -- a GGUF file's Q4_K and Q6_K blocks, used as they are --------------------------------------------

K_LLAMA = dict(
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    hidden_size=256,
    intermediate_size=256,
    max_position_embeddings=128,
    pad_token_id=None,
)
SIX_BITS = ("output.weight", "attn_v.weight", "ffn_down.weight")
"""The tensors the file below stores as Q6_K, as a Q4_K_M file does for its head and (some
layers') attention values and feed-forward outputs; every other matrix is Q4_K."""


@pytest.fixture(scope="module")
def k_file(tmp_path_factory) -> tuple[torch.nn.Module, object, object]:
    """A tiny Llama folder (transformers), llama.cpp's converter's f32 file of it, and that file
    with every matrix rewritten as random Q4_K or Q6_K blocks (tests/gguf_files.py; gguf cannot
    quantize to these types, and no llama-quantize is installed)."""
    from gguf_files import convert, converter, hf_folder, random_blocks, rewrite_gguf, stored_tensors

    converter()
    root = tmp_path_factory.mktemp("q4k")
    model = hf_folder(root / "llama", "llama", **K_LLAMA)
    f32, out = root / "llama-f32.gguf", root / "llama-q4_k.gguf"
    convert([(root / "llama", "f32", f32)])
    tensors = {}
    for i, (name, (data, _)) in enumerate(stored_tensors(f32).items()):
        if data.ndim == 2:
            tensors[name] = random_blocks(data.shape, "Q6_K" if name.endswith(SIX_BITS) else "Q4_K", seed=i)
    rewrite_gguf(f32, out, tensors=tensors)
    return model, f32, out


def file_rows(path) -> list[bytes]:
    """The file's Q4_K and Q6_K rows the products read (all but the token embedding's), each as its
    kind's code and its bytes."""
    reader = gguf.GGUFReader(path)
    rows = []
    for tensor in reader.tensors:
        if tensor.tensor_type.name in KINDS and tensor.name != "token_embd.weight":
            kind = KINDS.index(tensor.tensor_type.name)
            raw = np.array(tensor.data).reshape(-1, int(tensor.shape[0]) // 256 * (Q4_K_BYTES, Q6_K_BYTES)[kind])
            rows += [bytes([kind]) + row.tobytes() for row in raw]
    return rows


def step_rows(weight: torch.Tensor) -> list[bytes]:
    """A product's weight as the q4_k step stores it (`stored_weight`), in `file_rows`' form."""
    from attnlab.accel.fused import stored_weight

    values, kinds = stored_weight(weight, "q4_k")
    values, kinds = values.reshape(-1, values.size(-1)), kinds.reshape(-1)
    n = weight.size(-1) // 256
    sizes = [n * (Q4_K_BYTES, Q6_K_BYTES)[k] for k in kinds.tolist()]
    return [bytes([k]) + v[:size].numpy().tobytes() for v, k, size in zip(values, kinds.tolist(), sizes, strict=True)]


@pytest.mark.slow  # runs llama.cpp's converter
def test_q4_k_step_holds_the_files_blocks_bit_for_bit(k_file):
    from attnlab.accel.fused import product_weights
    from attnlab.tasks.sources import default_weights, load_checkpoint

    path = k_file[2]
    loaded = load_checkpoint(path, command="sample")
    assert loaded.stored_weights == "q4_k"
    assert default_weights(loaded.model, loaded.stored_weights) == "q4_k"  # what sample and serve take
    expected = file_rows(path)
    assert len(set(expected)) == len(expected)  # distinct rows: a sorted comparison misses nothing
    got = [row for weight in product_weights(loaded.model) for row in step_rows(weight)]
    assert sorted(got) == sorted(expected)
    assert {row[0] for row in got} == {0, 1}  # both kinds


@pytest.mark.slow  # runs llama.cpp's converter and transformers
def test_q4_k_file_decodes_gguf_s_dequantized_model_s_greedy_tokens(k_file):
    from accel.test_q4_gguf import reference_greedy
    from attnlab.tasks.sources import load_checkpoint
    from gguf_files import reference_model

    model, f32, path = k_file
    reference = reference_model(model, f32, path, "llama")
    loaded = load_checkpoint(path, command="sample")
    prompt = torch.tensor([[3, 1, 4, 1]])
    got = greedy(loaded.model, prompt, 64, fused=True, weights=loaded.stored_weights)
    want = reference_greedy(reference, prompt, 64)
    assert got.shape == want.shape and torch.equal(got, want), (got, want)


@pytest.mark.slow  # starts the command line's sample
def test_sample_refuses_q4_k_for_rows_not_whole_super_blocks(capsys, tmp_path):
    from gguf_files import hf_folder
    from helpers import cli

    pytest.importorskip("transformers")
    folder = tmp_path / "narrow"
    hf_folder(folder, "llama")  # rows 32 and 48 wide
    capsys.readouterr()
    code, out, err = cli(capsys, "sample", folder, "hello", "-n", "4", "--weights", "q4_k")
    assert code == 2 and "256" in err and "int4" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err
