"""ClippingAdamW: the gradient clipping and the AdamW step through attnlab's C++ kernel, against
PyTorch's own `clip_grad_norm_` and `torch.optim.AdamW` on the same parameters and gradients."""

import copy
import io

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from attnlab.accel import kernels
from attnlab.accel.projection import MKLDNN, Linear
from attnlab.train.guards import grad_norm
from attnlab.train.optim import ClippingAdamW, adamw
from helpers import threads
from tolerance import assert_float32_close

built = pytest.mark.skipif(kernels.extension() is None, reason="the kernels could not be built here")


def _model() -> nn.Module:
    """Tensors of every kind the kernel meets: an embedding, weights across several 8192-element
    chunks, sizes that are not multiples of 16, 1-element biases."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Embedding(37, 24), nn.Linear(24, 700), nn.GELU(), nn.Linear(700, 13), nn.Linear(13, 1))


def _groups(model: nn.Module) -> list[dict]:
    """Two groups that differ in every setting the kernel takes per tensor."""
    decay = [p for n, p in model.named_parameters() if n.endswith("weight") and not n.startswith("0.")]
    rest = [p for n, p in model.named_parameters() if not (n.endswith("weight") and not n.startswith("0."))]
    return [
        {"params": decay, "weight_decay": 0.1, "lr": 3e-3, "betas": (0.9, 0.99), "eps": 1e-8},
        {"params": rest, "weight_decay": 0.0, "lr": 1e-3, "betas": (0.8, 0.95), "eps": 1e-6},
    ]


def _gradients(model: nn.Module, step: int) -> list[torch.Tensor]:
    """Step `step`'s gradients: large in the even steps (clipped to 1.0), small in the odd ones (not)."""
    g = torch.Generator().manual_seed(step)
    size = 0.003 if step % 2 else 0.05  # global norms ~8 and ~0.5
    return [torch.randn(p.shape, generator=g) * size for p in model.parameters()]


def _run(model: nn.Module, optimizer: torch.optim.Optimizer, steps: range, clip: float) -> list[float]:
    norms = []
    for step in steps:
        for p, g in zip(model.parameters(), _gradients(model, step), strict=True):
            p.grad = g.to(p.dtype)
        norms.append(float(grad_norm(model, clip, optimizer)))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return norms


def _reference(model: nn.Module, optimizer: torch.optim.Optimizer, steps: range, clip: float) -> list[float]:
    """`_run` written with PyTorch's own calls: clip_grad_norm_ (or the norm alone) and step."""
    norms = []
    for step in steps:
        for p, g in zip(model.parameters(), _gradients(model, step), strict=True):
            p.grad = g.to(p.dtype)
        if clip > 0:
            norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), clip)))
        else:
            norms.append(float(torch.nn.utils.get_total_norm([p.grad for p in model.parameters()])))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return norms


def _clipping_adamw(model: nn.Module) -> ClippingAdamW:
    """ClippingAdamW on `_groups(model)`, whose own settings override the defaults given here."""
    return ClippingAdamW(_groups(model), lr=0.0, betas=(0.0, 0.0), weight_decay=0.0)


def _assert_same(got: nn.Module, want: nn.Module, got_opt, want_opt) -> None:
    for p, q in zip(got.parameters(), want.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
        s, t = got_opt.state[p], want_opt.state[q]
        assert s["step"].dtype == t["step"].dtype == torch.float32 and float(s["step"]) == float(t["step"])
        torch.testing.assert_close(s["exp_avg"], t["exp_avg"], rtol=1e-5, atol=1e-7)
        torch.testing.assert_close(s["exp_avg_sq"], t["exp_avg_sq"], rtol=1e-5, atol=1e-9)


@built
@pytest.mark.parametrize("n_threads", [1, 2])
@pytest.mark.parametrize("clip", [1.0, 0.0])
def test_steps_match_pytorchs_clipping_and_adamw(n_threads, clip):
    want = _model()
    got = copy.deepcopy(want)
    want_opt = torch.optim.AdamW(_groups(want), fused=True)
    got_opt = _clipping_adamw(got)
    with threads(n_threads):
        got_norms = _run(got, got_opt, range(6), clip)
    want_norms = _reference(want, want_opt, range(6), clip)
    assert got_norms == pytest.approx(want_norms, rel=1e-6)
    if clip > 0:
        assert min(got_norms[::2]) > clip > max(got_norms[1::2])  # both branches of the clipping ran
    _assert_same(got, want, got_opt, want_opt)


@built
def test_the_clipping_leaves_the_gradients_to_the_step(monkeypatch):
    model = _model()
    optimizer = adamw(model, lr=1e-3, betas=(0.9, 0.99), weight_decay=0.1, device=torch.device("cpu"), kernel=True)
    calls = []
    step = kernels.extension().adamw_step
    monkeypatch.setattr(kernels.extension(), "adamw_step", lambda *a: calls.append(a[-1]) or step(*a))
    for p, g in zip(model.parameters(), _gradients(model, 0), strict=True):
        p.grad = g.clone()
    before = [p.grad.clone() for p in model.parameters()]
    norm = float(optimizer.clip_grad_norm_(1.0))
    assert norm > 1.0
    assert all(torch.equal(p.grad, b) for p, b in zip(model.parameters(), before, strict=True))
    optimizer.step()
    assert calls == [pytest.approx(1.0 / (norm + 1e-6), rel=1e-6)]


@built
def test_global_norm_does_not_depend_on_the_threads():
    grads = _gradients(_model(), 0)
    with threads(1):
        one = kernels.extension().global_norm(grads)
    with threads(2):
        two = kernels.extension().global_norm(grads)
    assert one == two  # the chunks' sums are added in order
    # squares summed in float32 lanes, each chunk's lanes then in double
    assert one == pytest.approx(torch.cat([g.flatten() for g in grads]).double().norm().item(), rel=1e-6)


@built
def test_a_skipped_step_forgets_its_clipping():
    model = _model()
    optimizer = _clipping_adamw(model)
    reference = copy.deepcopy(model)
    ref_opt = torch.optim.AdamW(_groups(reference), fused=True)
    for p, g in zip(model.parameters(), _gradients(model, 0), strict=True):
        p.grad = g.clone()
    optimizer.clip_grad_norm_(1e-3)  # a factor far below 1, then the step is skipped, as the guard does
    optimizer.zero_grad(set_to_none=True)
    for m in (model, reference):
        for p, g in zip(m.parameters(), _gradients(m, 1), strict=True):
            p.grad = g.clone()
    optimizer.step()  # without a clipping of its own: the gradients as they are
    ref_opt.step()
    _assert_same(model, reference, optimizer, ref_opt)


@pytest.mark.parametrize("why", ["float64", "unbuilt"])
def test_where_the_kernel_does_not_apply_it_is_pytorchs_clipping_and_step(why, monkeypatch):
    want = _model()
    if why == "float64":
        want = want.double()
    else:
        monkeypatch.setattr(kernels, "extension", lambda: None)
    got = copy.deepcopy(want)
    got_opt = _clipping_adamw(got)
    want_opt = torch.optim.AdamW(_groups(want), fused=True)
    got_norms = _run(got, got_opt, range(4), 1.0)
    want_norms = _reference(want, want_opt, range(4), 1.0)
    # the same operators, on the parameters in the groups' order rather than the model's
    torch.testing.assert_close(torch.tensor(got_norms), torch.tensor(want_norms))
    for p, q in zip(got.parameters(), want.parameters(), strict=True):
        torch.testing.assert_close(p, q)


def _saved(optimizer: torch.optim.Optimizer) -> dict:
    """The state dict as a checkpoint gives it back (load_state_dict alone would share its tensors)."""
    buffer = io.BytesIO()
    torch.save(optimizer.state_dict(), buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


@built
def test_a_state_dict_moves_between_the_kernel_and_pytorch():
    """A run resumed with or without train.fused_kernels continues the same optimizer state."""
    first = _model()
    first_opt = _clipping_adamw(first)
    _run(first, first_opt, range(3), 1.0)
    plain = copy.deepcopy(first)
    plain_opt = torch.optim.AdamW(_groups(plain), fused=True)
    plain_opt.load_state_dict(_saved(first_opt))
    again = copy.deepcopy(first)
    again_opt = _clipping_adamw(again)
    again_opt.load_state_dict(_saved(plain_opt))
    _run(first, first_opt, range(3, 6), 1.0)
    _run(plain, plain_opt, range(3, 6), 1.0)
    _run(again, again_opt, range(3, 6), 1.0)
    _assert_same(first, plain, first_opt, plain_opt)
    _assert_same(again, plain, again_opt, plain_opt)


@pytest.mark.skipif(kernels.extension() is None or not MKLDNN, reason="the kernel or oneDNN is not here")
def test_a_kernel_step_is_seen_by_the_copies_kept_per_weight_version():
    """The reordered weights of attnlab's Linear (and the fused decoding steps) are remade when a
    weight's version moves; the kernel's in-place update must move it, or inference after training
    in the same process computes with the weights from before the step."""
    torch.manual_seed(0)
    layer = Linear(256, 256)
    x = torch.randn(4, 256)  # a few rows in inference: the reordered route
    with torch.no_grad():
        before = layer(x)
    optimizer = ClippingAdamW(layer.parameters(), lr=1e-2, betas=(0.9, 0.99), weight_decay=0.0)
    layer(torch.randn(8, 256)).square().sum().backward()
    optimizer.step()
    with torch.no_grad():
        after = layer(x)
    assert_float32_close(after, F.linear(x, layer.weight, layer.bias), reduction=256, depth=2)
    assert not torch.allclose(after, before, atol=1e-3)


@pytest.mark.skipif(not MKLDNN, reason="oneDNN is not here")
@pytest.mark.parametrize("make", ["adamw", "adam_l2"])
def test_pytorchs_fused_step_is_seen_by_the_copies_kept_per_weight_version(make):
    """PyTorch's fused Adam and AdamW (what the trainer takes where attnlab's kernels are not built)
    update weights in place without moving their versions: the optimizers attnlab builds move them
    after every step, or evaluation and beam search during training, through the reordered copies,
    compute with the weights from before the step (a translation run scored BLEU 0 that way)."""
    from attnlab.train.optim import adam_l2

    torch.manual_seed(0)
    layer = Linear(256, 256)
    x = torch.randn(4, 256)  # a few rows in inference: the reordered route
    with torch.no_grad():
        before = layer(x)
    settings = dict(lr=1e-2, betas=(0.9, 0.99), weight_decay=0.0)
    if make == "adamw":
        optimizer = adamw(nn.Sequential(layer), device=torch.device("cpu"), **settings)
    else:
        optimizer = adam_l2(nn.Sequential(layer), **settings)
    assert optimizer.defaults.get("fused")  # the in-place route that does not move versions
    layer(torch.randn(8, 256)).square().sum().backward()
    optimizer.step()
    with torch.no_grad():
        after = layer(x)
    assert_float32_close(after, F.linear(x, layer.weight, layer.bias), reduction=256, depth=2)
    assert not torch.allclose(after, before, atol=1e-3)
