"""The fused step's int4 weights (`attnlab.accel.fused`'s "int4": GGUF's Q4_0 blocks) and their products.

`quantize_q4_0` is held to gguf's own quantizer (llama.cpp's reference, in numpy) bit for bit. The
products (`quantized4.h`) are held to PyTorch's product of the dequantized weights, d (q − 8), in
float64, two ways:

- Up to 15 rows the C++ side quantizes the activations per block of 32 as well (e = max |x| / 127,
  p = round(x / e)) and sums integers, as ggml's vec_dot_q4_0_q8_0. Against the weights times the
  activations as quantized here (written out below), the two differ by float32's rounding of the
  sums alone (`tests/tolerance.py`): the integer sums are exact. Against the weights times the
  activations as they are, each activation moves by at most e / 2 in its rounding, so output j
  moves by at most sum_i |w_ji| e(i) / 2 (plus float32's rounding of it): that bound is the
  activations' own 8-bit quantization, and a layout mistake (a nibble or a block out of place)
  moves the products by the order of the products themselves, far past it.
- From 16 rows on the weights are widened to fp32 for a matrix product with the rows as they are:
  float32's rounding alone.

Each path is run here: the vector one this build has (AVX-512 with VNNI where the CPU has it;
`make test-avx2` runs this file on the AVX2 build) and the plain C++ one (`set_portable_q4`).
"""

from collections.abc import Callable

import numpy as np
import pytest
import torch

from accel.test_fused_int8 import trained_gpt
from attnlab.accel.fused import (
    WEIGHT_FORMATS,
    FusedStep,
    WeightsShapeError,
    dequantize_q4_0,
    extension,
    quantize_q4_0,
    weights_refusal,
)
from attnlab.decode import greedy
from decode.conftest import tiny_gpt
from tolerance import assert_float32_close, float32_factor, gpt_sums

gguf = pytest.importorskip("gguf")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(extension() is None, reason="the fused step could not be built here"),
]

PATHS = ("vector", "portable")
STREAMED_ROWS = (1, 2, 3, 5, 8, 9, 15)  # up to 15: streamed in groups of 8 (every group size's code)
WIDENED_ROWS = (16, 33)


@pytest.fixture(params=PATHS)
def path(request):
    """The products' path: the build's vector code, or the plain C++ one on this CPU."""
    ext = extension()
    ext.set_portable_q4(request.param == "portable")
    yield request.param
    ext.set_portable_q4(False)


def gguf_q4_0(w: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """gguf's Q4_0 of w `(rows, in)`: per row its 16-byte nibble blocks and its fp16 scales widened."""
    blocks = gguf.quants.quantize(w.numpy(), gguf.GGMLQuantizationType.Q4_0).reshape(w.size(0), -1, 18)
    scales = blocks[..., :2].copy().view(np.float16).astype(np.float32)[..., 0]
    return blocks[..., 2:].reshape(w.size(0), -1), scales


def awkward_rows() -> torch.Tensor:
    """Rows with what Q4_0's rounding must get right: ± ties for the largest magnitude, a zero
    block, values halfway between codes, huge and tiny ranges, a block of one sign."""
    g = torch.Generator().manual_seed(0)
    w = torch.randn(8, 96, generator=g)
    w[0, :32] = 0.0  # d = 0: every code 8
    w[1, 3], w[1, 7] = 2.5, -2.5  # equal magnitudes: the first one sets d's sign
    w[2, :32] = (torch.arange(32) - 16.0) * 0.125 + 0.0625  # w / d halfway between codes
    w[3] *= 1e4
    w[4] *= 1e-4
    w[5, 32:64] = w[5, 32:64].abs()  # one sign: codes 0..8 only
    w[6, 64:] = -w[6, 64:].abs()
    return w


def test_quantize_q4_0_is_ggufs_bit_for_bit():
    w = torch.cat([awkward_rows(), torch.randn(40, 96, generator=torch.Generator().manual_seed(1))])
    nibbles, scales = quantize_q4_0(w)
    file_nibbles, file_scales = gguf_q4_0(w)
    assert nibbles.dtype == torch.uint8 and nibbles.shape == (48, 48) and scales.shape == (48, 3)
    assert np.array_equal(nibbles.numpy(), file_nibbles)
    assert np.array_equal(scales.numpy(), file_scales)
    # and the values: gguf's dequantizer on its own blocks
    q4 = gguf.GGMLQuantizationType.Q4_0
    values = gguf.quants.dequantize(gguf.quants.quantize(w.numpy(), q4), q4)
    assert np.array_equal(dequantize_q4_0(nibbles, scales).numpy(), values)


def test_quantize_q4_0_keeps_leading_dimensions():
    w = torch.randn(3, 5, 64, generator=torch.Generator().manual_seed(2))  # a mixture's experts
    nibbles, scales = quantize_q4_0(w)
    flat_nibbles, flat_scales = quantize_q4_0(w.reshape(15, 64))
    assert torch.equal(nibbles.reshape(15, 32), flat_nibbles) and torch.equal(scales.reshape(15, 2), flat_scales)


def test_q4_0_needs_whole_blocks():
    with pytest.raises(ValueError, match="multiple of 32"):
        quantize_q4_0(torch.randn(4, 40))


def quantized_activations(x: torch.Tensor) -> torch.Tensor:
    """x `(R, in)` as the int4 products quantize it, written out: per block of 32 values e = max |x|
    / 127, p = round(x · (1 / e)) (float32 operations, ties to even), and back: e p."""
    blocks = x.reshape(x.size(0), -1, 32)
    e = blocks.abs().amax(-1, keepdim=True) / 127
    inverse = torch.where(e > 0, 1 / e, torch.zeros_like(e))
    return (torch.round(blocks * inverse) * e).reshape_as(x)


def operands(rows: int, out: int = 72, width: int = 160, seed: int = 0):
    """A random weight's Q4_0 (nibbles, scales), its dequantized values (float64) and rows x (float32).
    160 wide: five blocks, an odd number (AVX-512's two-block loop and its one-block tail)."""
    g = torch.Generator().manual_seed(seed)
    nibbles, scales = quantize_q4_0(torch.randn(out, width, generator=g) * 0.05)
    x = torch.randn(rows, width, generator=g)
    x[0, :32] = 0.0  # an all-zero block of activations: e = 0
    return nibbles, scales, dequantize_q4_0(nibbles, scales).double(), x


@pytest.mark.parametrize("rows", STREAMED_ROWS)
def test_streamed_product_sums_the_quantized_activations_exactly(path, rows):
    nibbles, scales, w, x = operands(rows)
    got = extension().stored_linear(nibbles, scales, x)
    want = (quantized_activations(x).double() @ w.T).float()
    assert_float32_close(got, want, reduction=w.size(1))


@pytest.mark.parametrize("rows", STREAMED_ROWS)
def test_streamed_product_is_within_the_activations_rounding(path, rows):
    nibbles, scales, w, x = operands(rows, seed=1)
    got = extension().stored_linear(nibbles, scales, x).double()
    want = x.double() @ w.T
    e = x.reshape(rows, -1, 32).abs().amax(-1).repeat_interleave(32, 1) / 127  # each value's block scale
    bound = (e.double() / 2) @ w.abs().T  # sum_i |w_ji| e(i) / 2
    bound += float32_factor(w.size(1)) * (1 + want.abs())  # and float32's rounding of the sums
    assert ((got - want).abs() <= bound).all()
    # the bound is the activations' rounding, not room for a mistake: one block's nibbles swapped
    # (low and high; the third block, the first being zeros in row 0) moves the products past it
    swapped = nibbles.clone()
    swapped[:, 32:48] = (nibbles[:, 32:48] >> 4) | (nibbles[:, 32:48] << 4)
    wrong = extension().stored_linear(swapped, scales, x).double()
    assert ((wrong - want).abs() > bound).any()


@pytest.mark.parametrize("rows", WIDENED_ROWS)
def test_widened_product_is_the_dequantized_weights(path, rows):
    nibbles, scales, w, x = operands(rows, seed=2)
    assert rows >= extension().WIDENED_MIN_ROWS
    got = extension().stored_linear(nibbles, scales, x)
    assert_float32_close(got, (x.double() @ w.T).float(), reduction=w.size(1))


@pytest.mark.parametrize("rows", (1, 4, 8))
def test_vector_and_portable_paths_agree(rows):
    ext = extension()
    nibbles, scales, w, x = operands(rows, out=40, width=1024, seed=3)  # 32 blocks: the unrolled loops
    vector = ext.stored_linear(nibbles, scales, x)
    ext.set_portable_q4(True)
    try:
        portable = ext.stored_linear(nibbles, scales, x)
    finally:
        ext.set_portable_q4(False)
    assert_float32_close(vector, portable, reduction=w.size(1))


# -- the GPT step with int4 weights -----------------------------------------------------------------

LLAMA = dict(normalization="rmsnorm", activation="swiglu", positions="rope", bias=False, n_heads=4, n_kv_heads=2)
ARCHITECTURES = {
    "gpt2": dict(d_model=64),
    "llama": LLAMA | dict(d_model=64, ffn_hidden=96),
    "mixtral": LLAMA | dict(d_model=64, ffn_hidden=96, experts=3, expert_top_k=2),
}


def dequantized_copy(
    model: torch.nn.Module,
    values: Callable[[torch.Tensor, torch.Tensor | None], torch.Tensor],
    kinds: list[torch.Tensor] | None = None,
) -> torch.nn.Module:
    """A copy of the model whose products' weights (`product_weights`) are `values(weight, rows)`:
    what a format stores them as, dequantized (the embedding kept fp32; a tied head untied). kinds:
    each product's row kinds, passed on as `rows` (None: None for each)."""
    import copy

    from attnlab.accel.fused import product_weights

    ref = copy.deepcopy(model)
    originals, copies = product_weights(model), product_weights(ref)
    kinds = [None] * len(originals) if kinds is None else kinds
    with torch.no_grad():
        for original, copied, rows in zip(originals[:-1], copies[:-1], kinds[:-1], strict=True):
            copied.copy_(values(original, rows))
        ref.lm_head.weight = torch.nn.Parameter(values(originals[-1], kinds[-1]))
    return ref.eval()


def gguf_q4_0_values(weight: torch.Tensor, rows: None = None) -> torch.Tensor:
    """gguf's own Q4_0 quantizer and dequantizer on a weight `(..., in)`, not attnlab's."""
    flat = weight.detach().reshape(-1, weight.size(-1)).numpy()
    raw = gguf.quants.quantize(flat, gguf.GGMLQuantizationType.Q4_0)
    values = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType.Q4_0)
    return torch.from_numpy(np.array(values, dtype=np.float32)).reshape(weight.shape)


def dequantized_model(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of the model whose products' weights are their Q4_0 values, computed with gguf's
    quantizer and dequantizer, not attnlab's."""
    return dequantized_copy(model, gguf_q4_0_values)


def assert_extend_is_the_dequantized_model(model: torch.nn.Module, reference: torch.nn.Module, weights: str) -> None:
    """60 tokens in one call (`extend`, the logits after each) with `weights` equal `reference`'s
    own forward within float32's rounding. (60: a mixture's experts each see 16 tokens or more of
    them, and widen too.)"""
    prompt = torch.randint(model.config.vocab_size, (1, 60), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        step = FusedStep(model, extension(), model.new_cache(1), weights=weights)
        got = step.extend(prompt[0], 0)  # (60, V)
        want = reference(prompt)[0]
    assert_float32_close(got, want, **gpt_sums(model.config))


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_a_step_of_many_tokens_is_the_dequantized_model(arch):
    """60 tokens in one call (`extend`, the logits after each) widen the int4 weights and multiply
    the tokens as they are: the dequantized model's own forward within float32's rounding. (60: a
    mixture's experts each see 16 tokens or more of them, and widen too.)"""
    model = tiny_gpt(block_size=64, **ARCHITECTURES[arch])
    assert_extend_is_the_dequantized_model(model, dequantized_model(model), "int4")


@pytest.fixture(scope="module")
def trained() -> torch.nn.Module:
    return trained_gpt(ffn_hidden=192)  # SwiGLU's hidden width in whole blocks


def test_a_trained_model_decodes_the_dequantized_models_greedy_tokens(trained, path):
    """Batch-1 steps quantize the activations (as llama.cpp's Q4_0 products do), so their logits
    differ from the dequantized model's by that rounding: a trained model, whose logits pick
    confidently, keeps the dequantized model's greedy tokens, several prompts at once. (A random
    model's near-ties can flip on that rounding, as they can on any change of the sums.)"""
    prompt = torch.randint(0, trained.config.vocab_size, (3, 8), generator=torch.Generator().manual_seed(6))
    got = greedy(trained, prompt, 48, fused=True, weights="int4")
    assert torch.equal(got, greedy(dequantized_model(trained), prompt, 48))
    assert not torch.equal(got, greedy(trained, prompt, 48))  # the four-bit weights changed the model


def test_int4_is_a_weight_format_and_a_command_line_choice():
    from attnlab.cli.arguments import WEIGHTS

    assert "int4" in WEIGHT_FORMATS and WEIGHTS == WEIGHT_FORMATS


def test_int4_refuses_rows_not_a_multiple_of_32_in_one_line():
    model = tiny_gpt(**LLAMA | dict(d_model=40, n_heads=2, n_kv_heads=1))
    with pytest.raises(WeightsShapeError) as e:
        weights_refusal(model, "int4")
    message = str(e.value)
    assert "\n" not in message and "40" in message and "int8" in message
    assert weights_refusal(model, "int8") is None  # any width


# -- AVX-512 without VNNI ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def avx512_build():
    """The fused step built for x86-64-v4 (AVX-512 without VNNI: its byte products are AVX-512
    BW's), where this CPU runs it. The other paths are covered elsewhere: this CPU's own build and
    the plain C++ path above, the AVX2 build by `make test-avx2` (this file is on its list)."""
    import platform

    from attnlab.accel.extensions import build
    from attnlab.accel.fused import NAME, SOURCE
    from attnlab.device import cpu_flags

    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("an x86-64 instruction set")
    if not {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512cd"} <= cpu_flags():
        pytest.skip("this CPU runs no x86-64-v4 build")
    ext = build(f"{NAME}_x86_64_v4", SOURCE, what="x86-64-v4 step", fallback="skipped", march="x86-64-v4")
    if ext is None:
        pytest.skip("the x86-64-v4 build failed")
    return ext


@pytest.mark.parametrize("rows", (1, 2, 8))
def test_the_avx512_build_without_vnni_sums_the_quantized_activations_exactly(avx512_build, rows):
    assert avx512_build.Q4_PATH == "avx512"
    nibbles, scales, w, x = operands(rows, seed=4)
    want = (quantized_activations(x).double() @ w.T).float()
    assert_float32_close(avx512_build.stored_linear(nibbles, scales, x), want, reduction=w.size(1))


def test_this_build_takes_its_widest_path():
    from attnlab.accel.extensions import default_march
    from attnlab.device import cpu_flags

    flags, path, march = cpu_flags(), extension().Q4_PATH, default_march()
    if march == "native" and {"avx512f", "avx512bw"} <= flags:
        assert path == ("avx512-vnni" if "avx512_vnni" in flags else "avx512")
    elif march in ("native", "x86-64-v3") and {"avx2", "fma"} <= flags:
        assert path == "avx2"  # `make test-avx2`'s build
