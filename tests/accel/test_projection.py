"""attnlab.accel.projection: the decoding routes of a linear map compute x Wᵀ + b, written out here.

The reference is the formula `x @ weight.T + bias` (and `torch.nn.Linear` for the module); each
route is first checked to be the one taken, so a test cannot pass by falling back to F.linear.
"""

import copy

import pytest
import torch
from torch._inductor.utils import run_and_get_code

import attnlab.accel.projection as projection
from attnlab.accel.projection import Linear, linear
from attnlab.decode import greedy
from attnlab.models import GPT, GPTConfig
from tolerance import assert_float32_close

BIG = (768, 384)  # 294,912 elements: above GEMV_MIN_WEIGHT
SMALL = (64, 32)
PRODUCT = {"reduction": 768, "depth": 2}
"""The float32 bound of this file's comparisons: the longest sum is 768 terms (an input or, for an
input's gradient, the outputs), then the bias or the loss's square."""


def weights(out: int, inp: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(out, inp, generator=g) / inp**0.5, torch.randn(out, generator=g)


def formula(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    y = x @ w.T
    return y if b is None else y + b


@pytest.mark.parametrize("shape", [(384,), (1, 384), (1, 1, 384)])
@pytest.mark.parametrize("with_bias", [True, False])
def test_one_row_takes_the_streaming_route_and_equals_the_formula(shape, with_bias):
    w, b = weights(*BIG)
    b = b if with_bias else None
    x = torch.randn(shape)
    assert projection.streams_as_gemv(x, w)
    y = linear(x, w, b)
    assert y.shape == (*shape[:-1], BIG[0])
    assert_float32_close(y, formula(x, w, b), **PRODUCT)


def test_streaming_route_gradients_equal_the_formula():
    w, b = weights(*BIG)
    x = torch.randn(1, 384)
    leaves = [t.clone().requires_grad_() for t in (x, w, b)]
    linear(*leaves).pow(2).sum().backward()
    ref = [t.clone().requires_grad_() for t in (x, w, b)]
    formula(*ref).pow(2).sum().backward()
    for got, want in zip(leaves, ref, strict=True):
        assert_float32_close(got.grad, want.grad, **PRODUCT)


@pytest.mark.parametrize(
    "x, w",
    [
        (torch.randn(1, SMALL[1]), torch.randn(*SMALL)),  # stays in cache: gemv is faster
        (torch.randn(4, 384), torch.randn(*BIG)),  # several rows
        (torch.randn(1, 384), torch.randn(769, 384)),  # odd number of output rows
        (torch.randn(1, 384, dtype=torch.float64), torch.randn(*BIG)),  # dtypes differ
        (torch.randn(1, 768), torch.randn(384, 768 * 2)[:, ::2]),  # weight not contiguous
    ],
)
def test_other_products_go_to_f_linear(x, w):
    assert not projection.streams_as_gemv(x, w)
    if x.dtype == w.dtype:
        assert_float32_close(linear(x, w), formula(x, w, None), **PRODUCT)


def test_module_has_torch_linear_parameters_and_state_dict():
    torch.manual_seed(0)
    ours = Linear(*BIG[::-1])
    theirs = torch.nn.Linear(*BIG[::-1])
    theirs.load_state_dict(ours.state_dict())
    assert ours.state_dict().keys() == theirs.state_dict().keys()
    x = torch.randn(3, 5, BIG[1])
    torch.testing.assert_close(ours(x), theirs(x))


@pytest.mark.parametrize("rows", [2, 5, projection.PACKED_MAX_ROWS])
def test_few_rows_in_inference_use_the_reordered_weight(rows):
    torch.manual_seed(0)
    layer = Linear(*BIG[::-1])
    x = torch.randn(rows, 1, BIG[1])
    assert not projection.has_reordered_weight(layer.weight)
    with torch.inference_mode():
        y = layer(x)
    assert projection.has_reordered_weight(layer.weight)
    assert_float32_close(y, formula(x, layer.weight.detach(), layer.bias.detach()), **PRODUCT)


def test_reordered_weight_follows_an_optimizer_step():
    torch.manual_seed(0)
    layer = Linear(*BIG[::-1])
    x = torch.randn(4, BIG[1])
    with torch.inference_mode():
        before = layer(x)
    opt = torch.optim.SGD(layer.parameters(), lr=1.0)
    layer(torch.randn(4, BIG[1])).sum().backward()  # autograd on: the plain route
    opt.step()
    with torch.inference_mode():
        after = layer(x)
    assert not torch.allclose(before, after)
    assert_float32_close(after, formula(x, layer.weight.detach(), layer.bias.detach()), **PRODUCT)


def test_training_never_uses_the_reordered_weight_and_copies_do_not_share_it():
    torch.manual_seed(0)
    layer = Linear(*BIG[::-1])
    layer(torch.randn(4, BIG[1])).sum().backward()
    assert not projection.has_reordered_weight(layer.weight) and layer.weight.grad is not None
    with torch.inference_mode():
        layer(torch.randn(4, BIG[1]))
    assert projection.has_reordered_weight(layer.weight)
    clone = copy.deepcopy(layer)
    assert not projection.has_reordered_weight(clone.weight)
    with torch.no_grad():
        clone.weight.mul_(-1.0)  # a clone reusing the original's reordered copy would miss this
    x = torch.randn(4, BIG[1])
    with torch.inference_mode():
        expected = formula(x, clone.weight.detach(), clone.bias.detach())
        assert_float32_close(clone(x), expected, **PRODUCT)


def test_reordered_copy_goes_with_its_weight():
    layer = Linear(*BIG[::-1])
    with torch.inference_mode():
        layer(torch.randn(3, BIG[1]))
    before = len(projection._REORDERED)
    del layer
    assert len(projection._REORDERED) == before - 1


@pytest.mark.parametrize("rows", [1, 3])
def test_compiled_code_calls_the_route_operators_and_equals_the_formula(rows):
    """Under torch.compile the one-row and few-row products are the attnlab operators (the
    compiler's own code for them streams the weights slowly); the results are the formula's."""
    torch.manual_seed(0)
    layer = Linear(*BIG[::-1])
    x = torch.randn(rows, BIG[1])
    torch._dynamo.reset()
    with torch.inference_mode():
        y, code = run_and_get_code(torch.compile(layer, dynamic=False), x)
    op = "streamed_product" if rows == 1 else "packed_product"
    assert f"torch.ops.attnlab.{op}" in "\n".join(code)
    assert_float32_close(y, formula(x, layer.weight.detach(), layer.bias.detach()), **PRODUCT)


@pytest.mark.parametrize("rows", [1, 3])
def test_route_operators_equal_the_formula(rows):
    w, _ = weights(*BIG)
    x = torch.randn(rows, BIG[1])
    op = torch.ops.attnlab.streamed_product if rows == 1 else torch.ops.attnlab.packed_product
    assert_float32_close(op(x, w), formula(x, w, None), **PRODUCT)


@pytest.mark.parametrize("batch", [1, 3])
def test_wide_gpt_cached_decoding_matches_full_recomputation(batch):
    """A model wide enough for both decoding routes (one row per step at batch 1, the reordered
    weight at batch 3): the cached greedy tokens equal those of recomputing every window."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=97, block_size=32, n_layers=2, n_heads=6, d_model=384))
    assert projection.streams_as_gemv(torch.randn(1, 384), model.blocks[0].ffn.fc1.weight)
    prompt = torch.randint(0, 97, (batch, 5), generator=torch.Generator().manual_seed(1))
    cached = greedy(model, prompt, 40)
    assert projection.has_reordered_weight(model.blocks[0].ffn.fc1.weight)  # the 5-row prefill, or 3-row steps
    uncached = greedy(model, prompt, 40, use_cache=False)
    assert torch.equal(cached, uncached)
