"""attnlab.accel.kernels: the C++ training kernels against independent references.

GELU and attention against PyTorch's operators in float64; a whole pre-norm block (forward,
and the gradients of its input and every parameter) against the same block run through its
modules; a GPT's stack of blocks in one call against its blocks one call each; a GPT's training
steps with the kernels (`attnlab.accel.for_training`) against the same steps without. The
extension is built once per machine (cached by torch.utils.cpp_extension).
"""

import math

import pytest
import torch
import torch.nn.functional as F

from attnlab.accel import for_training, kernels, reference_cross_entropy
from attnlab.accel.training import FusedGPT, FusedPreNormBlock, FusedSelfAttention
from attnlab.models import GPT, GPTConfig
from attnlab.nn import TransformerBlock
from attnlab.nn.attention import MultiHeadAttention
from attnlab.nn.feedforward import FeedForward
from helpers import threads
from tolerance import assert_float32_close

pytestmark = pytest.mark.skipif(kernels.extension() is None, reason="the kernels could not be built here")


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_and_its_gradient_match_pytorch_in_float64(approximate):
    x = (torch.randn(5000, generator=torch.Generator().manual_seed(0)) * 4).requires_grad_()
    grad = torch.randn(5000, generator=torch.Generator().manual_seed(1))
    y = kernels.gelu(x, approximate)
    y.backward(grad)
    x64 = x.detach().double().requires_grad_()
    ref = F.gelu(x64, approximate=approximate)
    ref.backward(grad.double())
    assert y.dtype == torch.float32
    torch.testing.assert_close(y.double(), ref.detach(), atol=2e-6, rtol=2e-6)
    torch.testing.assert_close(x.grad.double(), x64.grad, atol=2e-6, rtol=2e-6)


@pytest.mark.parametrize("activation", ["gelu", "gelu_tanh", "relu"])
def test_the_fused_blocks_activation_and_its_slope_match_pytorch_in_float64(activation):
    """The block's forward keeps act'(h) rather than h, computed with act(h) from the same exp."""
    g = torch.Generator().manual_seed(0)
    x = torch.cat([torch.randn(5000, generator=g) * 4, torch.tensor([-1e4, -90.0, -12.0, 0.0, 12.0, 90.0, 1e4])])
    y, slope = kernels.extension().activation_and_slope(x, kernels.ACTIVATION_CODES[activation])
    x64 = x.double().requires_grad_()
    if activation == "relu":
        ref = F.relu(x64)
    else:
        ref = F.gelu(x64, approximate="tanh" if activation == "gelu_tanh" else "none")
    ref.sum().backward()
    assert y.dtype == slope.dtype == torch.float32
    torch.testing.assert_close(y.double(), ref.detach(), atol=2e-6, rtol=2e-6)
    torch.testing.assert_close(slope.double(), x64.grad, atol=2e-6, rtol=2e-6)


def test_gelu_far_out_in_the_tails_has_no_nan_and_the_limits():
    x = torch.tensor([-1e4, -90.0, -12.0, 0.0, 12.0, 90.0, 1e4], requires_grad=True)
    y = kernels.gelu(x)
    y.sum().backward()
    torch.testing.assert_close(y, F.gelu(x.detach()))
    torch.testing.assert_close(x.grad, torch.tensor([0.0, 0.0, 0.0, 0.5, 1.0, 1.0, 1.0]))


def test_gelu_is_pytorchs_outside_training_and_where_the_kernel_does_not_apply(monkeypatch):
    monkeypatch.setattr(kernels._Gelu, "apply", lambda *a: pytest.fail("kernel used where it must not be"))
    x = torch.randn(2, 10)
    reference = FeedForward(10, 16)  # nn/: reference PyTorch, whatever is built
    torch.testing.assert_close(reference(x), reference.fc2(F.gelu(reference.fc1(x))))
    applied = FeedForward(10, 16)
    for_training(applied)
    applied.eval()(x)  # evaluation: the reference code
    applied.train()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        kernels.gelu(x)  # under autocast: PyTorch's
        applied(x)
    kernels.gelu(x.double())  # not float32: PyTorch's


def _reference_attention(qkv: torch.Tensor, heads: int, causal: bool) -> torch.Tensor:
    """softmax(q kᵀ / √D) v per head, written out in qkv's dtype."""
    b, t, c3 = qkv.shape
    c = c3 // 3
    q, k, v = (z.reshape(b, t, heads, c // heads).transpose(1, 2) for z in qkv.split(c, dim=-1))
    scores = q @ k.transpose(-2, -1) / math.sqrt(c // heads)
    if causal:
        scores = scores.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
    return (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, t, c)


def _reference_and_gradient(
    qkv: torch.Tensor, grad: torch.Tensor, heads: int, causal: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """`_reference_attention` of qkv (in its dtype) and the gradient of qkv from `grad`."""
    qkv = qkv.detach().clone().requires_grad_()
    y = _reference_attention(qkv, heads, causal)
    y.backward(grad.to(qkv.dtype))
    return y.detach(), qkv.grad


def _relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.double() - want).norm() / want.norm()).item()


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize(
    "t, heads, head_dim", [(37, 2, 16), (64, 4, 32), (20, 3, 64), (5, 1, 128), (1, 2, 32), (136, 2, 64)]
)
def test_attention_and_its_gradient_match_the_formula(causal, t, heads, head_dim):
    gen = torch.Generator().manual_seed(t * head_dim)
    qkv = (torch.randn(3, t, 3 * heads * head_dim, generator=gen) * 2).requires_grad_()
    grad = torch.randn(3, t, heads * head_dim, generator=gen)
    y = kernels.self_attention(qkv, heads, causal)
    assert y is not None and y.shape == (3, t, heads * head_dim)
    y.backward(grad)
    ref, ref_grad = _reference_and_gradient(qkv.double(), grad, heads, causal)
    assert_float32_close(y.double(), ref, reduction=max(t, head_dim), depth=3)  # scores, softmax, values
    # The gradient against float64 as accurately as the same formula in float32 through PyTorch's
    # operators, up to 2x (or a few units of float32's rounding where PyTorch's is exact, T = 1).
    # Its largest error on one element is ~1e-5 for both and moves with how GCC tunes the same
    # source (-march=native: 1.4x or 0.75x of a 1e-5 tolerance at T = 136), which a norm does
    # not; a wrong mask, tile or term is an error of 1e-4 or more.
    _, pytorch_grad = _reference_and_gradient(qkv.float(), grad, heads, causal)
    assert _relative_error(qkv.grad, ref_grad) <= 2 * _relative_error(pytorch_grad, ref_grad) + 1e-6


def test_attention_declines_what_it_does_not_cover(monkeypatch):
    assert kernels.self_attention(torch.randn(2, 4, 3 * 2 * 24), 2, True) is None  # head size 24
    assert kernels.self_attention(torch.randn(2, 4, 3 * 32).double(), 1, True) is None
    assert kernels.self_attention(torch.randn(2, 4, 3 * 32), 1, True) is not None
    monkeypatch.setattr(kernels._SelfAttention, "apply", lambda *a: pytest.fail("kernel used where it must not be"))
    x = torch.randn(2, 4, 32)
    MultiHeadAttention(32, 1)(x, causal=True)  # nn/: reference PyTorch, whatever is built
    applied = MultiHeadAttention(32, 1)
    for_training(applied)
    assert type(applied) is FusedSelfAttention
    applied.eval()(x, causal=True)  # evaluation: the reference code


def test_multi_head_attention_module_takes_the_kernel_and_computes_the_same():
    torch.manual_seed(0)
    mha = MultiHeadAttention(64, 4)
    x = torch.randn(2, 9, 64, requires_grad=True)
    ref, _ = mha(x, causal=True)
    ref.sum().backward()
    ref_grads = [x.grad.clone()] + [p.grad.clone() for p in mha.parameters()]
    x.grad = None
    mha.zero_grad()
    calls = []
    original = kernels._SelfAttention.apply
    kernels._SelfAttention.apply = lambda *a: calls.append(1) or original(*a)
    try:
        for_training(mha)
        y, _ = mha(x, causal=True)
    finally:
        kernels._SelfAttention.apply = original
    y.sum().backward()
    assert calls == [1]
    assert_float32_close(y, ref, reduction=64, depth=4)  # q/k/v, scores, values, output
    for got, want in zip([x.grad] + [p.grad for p in mha.parameters()], ref_grads, strict=True):
        assert_float32_close(got, want, reduction=64, depth=8)  # and back through each


def test_feed_forward_names_its_activation():
    assert FeedForward(8, 16, activation="gelu_tanh").activation == "gelu_tanh"


def _block_grads(block: TransformerBlock, x: torch.Tensor, grad: torch.Tensor, causal: bool, on: bool):
    x = x.clone().requires_grad_()
    block.zero_grad(set_to_none=True)
    if on:
        for_training(block)
    y, _ = block(x, causal=causal)
    y.backward(grad)
    return y.detach(), [x.grad] + [p.grad for p in block.parameters()]


@pytest.mark.parametrize(
    "activation, bias, causal, n_threads",
    [
        ("gelu", True, True, 1),
        ("gelu", False, False, 1),
        ("gelu_tanh", True, False, 1),
        ("gelu_tanh", False, True, 1),
        ("relu", True, True, 1),
        ("relu", False, False, 1),
        ("gelu_tanh", True, True, 2),
        ("gelu", False, False, 2),
        ("relu", True, True, 3),  # three parts, one sequence each: two in the scratch sums
    ],
)
def test_fused_pre_norm_block_matches_its_modules(activation, bias, causal, n_threads):
    torch.manual_seed(1)
    block = TransformerBlock(64, 2, 256, activation=activation, bias=bias, norm="pre")
    for p in block.parameters():  # away from LayerNorm's 1 and 0, so a wrong parameter shows
        torch.nn.init.normal_(p, 0.0, 0.3)
    x, grad = torch.randn(3, 21, 64), torch.randn(3, 21, 64)
    ref, ref_grads = _block_grads(block, x, grad, causal, on=False)
    assert block not in kernels._RUNNERS
    with threads(n_threads):
        got, got_grads = _block_grads(block, x, grad, causal, on=True)
    assert block in kernels._RUNNERS  # the fused block ran
    assert_float32_close(got, ref, reduction=256, depth=8)  # one layer of layer_depth's sums
    names = ["x"] + [n for n, _ in block.named_parameters()]
    for name, g, r in zip(names, got_grads, ref_grads, strict=True):
        scale = r.abs().max().item()
        assert (g - r).abs().max().item() <= 1e-5 * max(scale, 1.0), name


def test_fused_block_declines_what_it_does_not_cover():
    x = torch.randn(2, 5, 32)
    post = for_training(TransformerBlock(32, 2, 64, norm="post")).model
    post(x, causal=True)
    dropout = for_training(TransformerBlock(32, 2, 64, dropout=0.1).train()).model
    dropout(x, causal=True)
    masked = for_training(TransformerBlock(32, 2, 64)).model
    masked(x, mask=torch.ones(2, 1, 1, 5, dtype=torch.bool))
    odd_heads = for_training(TransformerBlock(48, 2, 64)).model  # head size 24
    odd_heads(torch.randn(2, 5, 48), causal=True)
    evaluated = for_training(TransformerBlock(32, 2, 64)).model.eval()
    evaluated(x, causal=True)
    reference = TransformerBlock(32, 2, 64)  # never applied: nn/'s reference PyTorch
    reference(x, causal=True)
    for block in (post, dropout, masked, odd_heads, evaluated, reference):
        assert block not in kernels._RUNNERS
    assert type(post) is TransformerBlock and type(dropout) is FusedPreNormBlock
    mixed = TransformerBlock(32, 2, 64)
    mixed.ffn.fc2.bias.data = mixed.ffn.fc2.bias.data.double()  # one parameter not float32
    assert kernels.pre_norm_block(mixed, x, causal=True) is None
    assert kernels.pre_norm_block(TransformerBlock(32, 2, 64), x, causal=True) is not None


def test_fused_block_refuses_a_backward_after_another_forward():
    block = for_training(TransformerBlock(32, 2, 64)).model
    x = torch.randn(2, 5, 32, requires_grad=True)
    first, _ = block(x, causal=True)
    block(x, causal=True)
    with pytest.raises(RuntimeError, match="ran forward again before the backward"):
        first.sum().backward()


def _gpt_loss_and_grads(model: GPT, x: torch.Tensor, y: torch.Tensor, n_threads: int):
    model.zero_grad(set_to_none=True)
    for_training(model)
    with threads(n_threads):
        _, loss = model(x, y)
        loss.backward()
    return loss.detach(), [p.grad for p in model.parameters()]


@pytest.mark.parametrize("bias, n_threads", [(True, 1), (False, 2), (True, 3)])
def test_gpts_fused_stack_computes_what_its_blocks_do_one_at_a_time(bias, n_threads, monkeypatch):
    # The same arithmetic, each thread taking its sequences through every block in turn rather
    # than the threads meeting after each block: equal to the bit, loss and every gradient.
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=30, block_size=16, n_layers=3, n_heads=2, d_model=64, bias=bias)
    model = GPT(config)
    gen = torch.Generator().manual_seed(1)
    x, y = torch.randint(0, 30, (5, 16), generator=gen), torch.randint(0, 30, (5, 16), generator=gen)
    loss, grads = _gpt_loss_and_grads(model, x, y, n_threads)
    assert model.blocks in kernels._RUNNERS and all(b not in kernels._RUNNERS for b in model.blocks)
    monkeypatch.setattr(kernels, "pre_norm_stack", lambda *args, **kwargs: None)
    one_at_a_time_loss, one_at_a_time = _gpt_loss_and_grads(model, x, y, n_threads)
    assert all(b in kernels._RUNNERS for b in model.blocks)  # each block's own kernel ran
    assert torch.equal(loss, one_at_a_time_loss)
    names = [n for n, _ in model.named_parameters()]
    for name, got, want in zip(names, grads, one_at_a_time, strict=True):
        assert torch.equal(got, want), name


def test_fused_stack_declines_blocks_it_does_not_cover():
    x = torch.randn(2, 5, 32)

    def stack(*blocks: TransformerBlock) -> torch.Tensor | None:
        return kernels.pre_norm_stack(torch.nn.ModuleList(blocks), x, causal=True)

    assert stack(TransformerBlock(32, 2, 64), TransformerBlock(32, 2, 64)) is not None
    assert stack() is None
    assert stack(TransformerBlock(32, 2, 64), TransformerBlock(32, 2, 64, norm="post")) is None
    assert stack(TransformerBlock(32, 2, 64), TransformerBlock(32, 2, 64, dropout=0.1).train()) is None
    assert stack(TransformerBlock(32, 2, 64), TransformerBlock(32, 2, 128)) is None  # FFN sizes differ
    assert stack(TransformerBlock(32, 2, 64), TransformerBlock(32, 2, 64, activation="relu")) is None
    assert stack(TransformerBlock(32, 2, 64), TransformerBlock(32, 4, 64)) is None  # heads differ
    shared = TransformerBlock(32, 2, 64)
    assert stack(shared, shared) is None  # one block in two layers: its kernel keeps one layer's activations


def test_fused_stack_refuses_a_backward_after_another_forward():
    model = for_training(GPT(GPTConfig(vocab_size=30, block_size=16, n_layers=2, n_heads=2, d_model=64))).model
    x = torch.randint(0, 30, (2, 16))
    _, first = model(x, x)
    model(x, x)
    assert model.blocks in kernels._RUNNERS
    with pytest.raises(RuntimeError, match="ran forward again before the backward"):
        first.backward()


def test_for_training_swaps_forward_alone_and_says_what_it_covered(monkeypatch):
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=30, block_size=16, n_layers=2, n_heads=2, d_model=64)
    model = GPT(config)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    params = list(model.parameters())
    applied = for_training(model)
    assert applied.model is model and type(model) is FusedGPT and applied.uncovered is None
    assert {"", "blocks.0", "blocks.0.attn", "blocks.0.ffn", "blocks.1"} <= set(applied.covered)
    assert list(model.parameters()) == params and model.state_dict().keys() == state.keys()
    assert all(torch.equal(model.state_dict()[k], v) for k, v in state.items())
    assert for_training(model).covered == applied.covered  # twice is once
    x = torch.randint(0, 30, (2, 16))
    monkeypatch.setattr(kernels, "pre_norm_stack", lambda *a, **k: pytest.fail("a kernel in eval mode"))
    monkeypatch.setattr(kernels, "pre_norm_block", lambda *a, **k: pytest.fail("a kernel in eval mode"))
    reference = GPT(config)
    reference.load_state_dict(state)
    with torch.no_grad():
        assert torch.equal(model.eval()(x), reference.eval()(x))  # evaluation: the reference code
    rope = for_training(
        GPT(GPTConfig(vocab_size=30, block_size=16, n_layers=1, n_heads=2, d_model=64, positions="rope"))
    )
    assert "positions=rope" in rope.uncovered and "blocks.0.attn" not in rope.covered


def test_gpt_training_steps_with_the_kernels_follow_the_same_losses():
    config = GPTConfig(vocab_size=30, block_size=16, n_layers=2, n_heads=2, d_model=64, activation="gelu_tanh")
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randint(0, 30, (4, 16), generator=gen), torch.randint(0, 30, (4, 16), generator=gen)
    losses = {}
    for on in (False, True):
        torch.manual_seed(0)
        model = GPT(config)
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
        losses[on] = []
        for _ in range(5):
            if on:
                for_training(model)
            with threads(2):
                _, loss = model(x, y)
                loss.backward()
            opt.step()
            opt.zero_grad()
            losses[on].append(loss.item())
    assert losses[True][-1] < losses[True][0] - 0.1  # it learns
    torch.testing.assert_close(losses[True], losses[False], atol=1e-4, rtol=1e-4)


def _cross_entropy_case(n: int, v: int, dtype: torch.dtype, seed: int = 0):
    """Logits `(n, v)` in `dtype` spread like a trained head's (a few large, most small), targets
    with every third row ignored (-100), and the loss's float64 reference on the same values."""
    gen = torch.Generator().manual_seed(seed)
    logits = (torch.randn(n, v, generator=gen) * 3).to(dtype).requires_grad_()
    target = torch.randint(0, v, (n,), generator=gen)
    target[::3] = -100
    return logits, target


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
@pytest.mark.parametrize("n_threads", [1, 2])
def test_cross_entropy_and_its_gradient_match_pytorch_in_float64(dtype, smoothing, n_threads):
    logits, target = _cross_entropy_case(37, 1000, dtype)
    with threads(n_threads):
        loss = kernels.cross_entropy(logits, target, label_smoothing=smoothing)
        (loss * 2.5).backward()
    x64 = logits.detach().double().requires_grad_()
    ref = F.cross_entropy(x64, target, label_smoothing=smoothing)
    (ref * 2.5).backward()
    assert loss.dtype == torch.float32 and logits.grad.dtype == dtype
    assert_float32_close(loss.double(), ref.detach(), reduction=1000, depth=2)  # the exponentials' sum, the mean
    # The kernel computes in fp32 and rounds the gradient once to the logits' dtype.
    tol = {"atol": 2e-8, "rtol": 1e-5} if dtype == torch.float32 else {"atol": 1e-7, "rtol": 2**-8}
    torch.testing.assert_close(logits.grad.double(), x64.grad, **tol)
    assert not logits.grad[::3].any()  # ignored rows get no gradient


def test_cross_entropy_of_a_large_vocabulary_in_bf16_matches_pytorchs_fp32_loss():
    """The masked-LM head's shape (a 16k vocabulary), against what the task computed before the
    kernel: PyTorch's loss of the logits copied to fp32."""
    logits, target = _cross_entropy_case(64, 16000, torch.bfloat16, seed=3)
    loss = kernels.cross_entropy(logits, target)
    loss.backward()
    got = logits.grad.clone()
    logits.grad = None
    ref = F.cross_entropy(logits.float(), target)
    ref.backward()
    assert_float32_close(loss, ref, reduction=16000, depth=2)
    torch.testing.assert_close(got.float(), logits.grad.float(), atol=1e-9, rtol=2**-7)  # bf16's rounding


def test_cross_entropy_refuses_a_target_outside_the_vocabulary():
    logits = torch.randn(3, 10)
    with pytest.raises(RuntimeError, match="target 10 is outside"):
        kernels.cross_entropy(logits, torch.tensor([1, 10, 2]))


def test_the_reference_cross_entropy_and_float64_are_pytorchs(monkeypatch):
    monkeypatch.setattr(kernels._CrossEntropy, "apply", lambda *a: pytest.fail("kernel used where it must not be"))
    logits, target = torch.randn(6, 11), torch.randint(0, 11, (6,))
    torch.testing.assert_close(reference_cross_entropy(logits, target), F.cross_entropy(logits, target))
    assert for_training(torch.nn.Linear(2, 2)).cross_entropy is kernels.cross_entropy
    kernels.cross_entropy(logits.double(), target)  # float64: PyTorch's


@pytest.fixture(scope="module")
def narrow_build():
    """The kernels built for SSE4.2 (x86-64-v2: 4-float vectors), beside this CPU's own build (8
    floats with AVX2, 16 with AVX-512): the vector width is a compile-time choice, so the other
    widths' code is only tested where it is built."""
    import platform
    from pathlib import Path

    from attnlab.accel.extensions import build

    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("an x86-64 instruction set")
    ext = build(
        "attnlab_kernels_x86_64_v2",
        Path(kernels.__file__).with_name("kernels.cpp"),
        what="SSE4.2 kernels",
        fallback="skipped",
        march="x86-64-v2",
    )
    if ext is None:
        pytest.skip("the SSE4.2 build failed")
    return ext


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("t, heads, head_dim", [(37, 2, 16), (20, 3, 64), (5, 1, 128)])
def test_the_4_float_build_matches_the_formula_too(narrow_build, monkeypatch, causal, t, heads, head_dim):
    used = []
    monkeypatch.setattr(kernels, "extension", lambda: used.append(1) or narrow_build)
    test_attention_and_its_gradient_match_the_formula(causal, t, heads, head_dim)
    test_gelu_and_its_gradient_match_pytorch_in_float64("tanh")
    assert used  # the narrow build ran, not this CPU's


def test_the_4_float_build_is_the_sse_branch(narrow_build):
    assert narrow_build.vector_floats == 4


def _test_module(relative: str):
    """Another test module of this suite, by path (its tests reused on the narrow build)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).parents[1] / relative
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("kernel", ["block", "stack", "cross_entropy", "adamw"])
def test_the_4_float_build_runs_every_other_kernel_right_too(narrow_build, monkeypatch, kernel):
    """The fused block, the GPT stack, the cross-entropy and the clipping AdamW step, each with
    its own test, on the SSE4.2 build (attention and GELU: above)."""
    used = []
    monkeypatch.setattr(kernels, "extension", lambda: used.append(1) or narrow_build)
    if kernel == "block":
        test_fused_pre_norm_block_matches_its_modules("gelu_tanh", True, True, 2)
    elif kernel == "stack":
        test_gpts_fused_stack_computes_what_its_blocks_do_one_at_a_time(True, 2, monkeypatch)
    elif kernel == "cross_entropy":
        test_cross_entropy_and_its_gradient_match_pytorch_in_float64(torch.float32, 0.1, 2)
    else:
        _test_module("accel/test_clipping_adamw.py").test_steps_match_pytorchs_clipping_and_adamw(2, 1.0)
    assert used  # the narrow build ran, not this CPU's


def test_this_cpus_build_takes_its_widest_branch():
    """The native build's vectors are as wide as this CPU's registers (a build for a named
    instruction set's, as wide as that set's). The AVX-512 branch (16 floats) runs only where the
    CPU has AVX-512: elsewhere this says so, as a skip."""
    import platform

    from attnlab.accel.extensions import default_march
    from attnlab.device import cpu_flags

    flags = cpu_flags()
    if platform.machine() not in ("x86_64", "AMD64") or not flags:
        pytest.skip("an x86-64 CPU listed in /proc/cpuinfo")
    widest = 16 if "avx512f" in flags else 8 if "avx" in flags else 4
    march = default_march()
    if march != "native":  # ATTNLAB_MARCH: the branch of the instruction set built for (`make test-avx2`)
        widest = min(widest, {"x86-64-v4": 16, "x86-64-v3": 8}.get(march, 4))
    assert kernels.extension().vector_floats == widest
    if widest != 16:
        pytest.skip(
            f"the AVX-512 branch of the kernels (16-float vectors) cannot run here (no avx512f in the CPU, or a "
            f"build for {march}); "
            f"tested here: this CPU's {widest}-float build and the 4-float SSE4.2 build"
        )
