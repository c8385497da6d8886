"""Lightweight and dynamic convolutions (Wu et al. 2019) against Eq. 2–3 written out one output
at a time, and inside the GPT (cached decoding equals the full forward, no look-ahead) and BERT
(padding ignored)."""

import math

import pytest
import torch
import torch.nn.functional as F

from attnlab.decode import greedy
from attnlab.models import GPT, Bert, BertConfig, GPTConfig
from attnlab.models.seq2seq import Seq2SeqConfig
from attnlab.nn.conv_attention import CONVOLUTIONS, ConvCache, DynamicConv, LightweightConv, build_convolution

C, H = 8, 2


def make(name: str, kernel: int) -> LightweightConv:
    torch.manual_seed(0)
    conv = build_convolution(name, C, H, kernel).eval()
    with torch.no_grad():  # the kernel away from its draw's scale, so that the softmax matters
        for p in conv.parameters():
            p.mul_(2.0)
    return conv


def reference(conv: LightweightConv, x: torch.Tensor, causal: bool) -> torch.Tensor:
    """Eq. 2–3 of Wu et al., one output (batch n, position i, channel c) at a time, 1-indexed taps:
    y[i, c] = Σ_j softmax(W_h)_j · u[i + j − offset, c], h = ⌈c·H / C⌉ (0-indexed: c // (C/H)),
    offset ⌈(k+1)/2⌉ (centred), or k (causal: taps reach back to i − k + 1); u = GLU(x W^I)."""
    k = conv.kernel
    u = F.glu(conv.in_proj(x), dim=-1)
    b, t, _ = u.shape
    offset = k if causal else math.ceil((k + 1) / 2)
    y = torch.zeros_like(u)
    for n in range(b):
        for i in range(t):
            if isinstance(conv, DynamicConv):  # §4: W = W^Q u_i, the kernel of position i alone
                raw = (conv.weight_proj.weight @ u[n, i] + conv.weight_proj.bias).view(H, k)
            else:
                raw = conv.weight
            w = torch.softmax(raw, dim=-1)
            for c in range(C):
                h = c // (C // H)
                for j in range(1, k + 1):
                    src = i + j - offset
                    if 0 <= src < t:
                        y[n, i, c] += w[h, j - 1] * u[n, src, c]
    return conv.out_proj(y)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("kernel", [1, 4, 5])
@pytest.mark.parametrize("name", CONVOLUTIONS)
def test_convolution_equals_the_papers_formula(name, kernel, causal):
    conv = make(name, kernel)
    x = torch.randn(2, 7, C, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        y, weights = conv(x, causal=causal)
        torch.testing.assert_close(y, reference(conv, x, causal), rtol=0, atol=1e-5)
    assert weights is None


@pytest.mark.parametrize("name", CONVOLUTIONS)
def test_kernels_are_normalised_over_their_taps(name):
    conv = make(name, 5)
    u = torch.randn(2, 6, C)
    w = conv.kernels(u)
    assert w.shape == ((H, 5) if name == "lightweight-conv" else (2, 6, H, 5))
    torch.testing.assert_close(w.sum(-1), torch.ones(w.shape[:-1]))
    assert torch.all(w > 0)


def test_dynamic_kernels_change_with_the_input_and_lightweight_ones_do_not():
    light, dynamic = make("lightweight-conv", 3), make("dynamic-conv", 3)
    u1, u2 = torch.randn(1, 4, C), torch.randn(1, 4, C)
    assert torch.equal(light.kernels(u1), light.kernels(u2))
    assert not torch.allclose(dynamic.kernels(u1), dynamic.kernels(u2))


def test_weight_dropout_in_training_only():
    conv = build_convolution("lightweight-conv", C, H, 5, dropout=0.5)
    x = torch.randn(1, 6, C)
    conv.train()
    torch.manual_seed(0)
    assert not torch.allclose(conv(x, causal=True)[0], conv(x, causal=True)[0])
    conv.eval()
    torch.testing.assert_close(conv(x, causal=True)[0], reference(conv, x, causal=True).detach())


@pytest.mark.parametrize("name", CONVOLUTIONS)
def test_cache_holds_the_last_k_minus_one_inputs_and_steps_equal_the_forward(name):
    conv = make(name, 4)
    x = torch.randn(2, 9, C)
    cache = ConvCache(2, 4, C)
    with torch.no_grad():
        full = conv(x, causal=True)[0]
        steps = [conv(x[:, :3], causal=True, cache=cache, positions=0)[0]]  # the caller counts: a model's
        steps += [conv(x[:, t : t + 1], causal=True, cache=cache, positions=t)[0] for t in range(3, 9)]
    assert cache.state.shape == (2, 3, C)
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=0, atol=1e-6)
    cache.select_rows(torch.tensor([1, 1, 0]))
    assert cache.state.shape == (3, 3, C)


def gpt(attention: str, **overrides) -> GPT:
    torch.manual_seed(0)
    fields = dict(vocab_size=V, block_size=16, n_layers=2, n_heads=2, d_model=16, attention=attention, conv_kernel=4)
    return GPT(GPTConfig(**(fields | overrides))).eval()


V = 30


@pytest.mark.parametrize("positions", ["learned", "none"])
@pytest.mark.parametrize("name", CONVOLUTIONS)
def test_gpt_cached_decoding_equals_the_forward_and_never_looks_ahead(name, positions):
    model = gpt(name, positions=positions)
    assert isinstance(model.blocks[0].attn, LightweightConv)
    seq = torch.randint(0, V, (2, 16), generator=torch.Generator().manual_seed(1))
    changed = seq.clone()
    changed[:, 10:] = (changed[:, 10:] + 1) % V
    with torch.no_grad():
        full = model(seq)
        cache = model.new_cache(2)
        assert all(isinstance(layer, ConvCache) for layer in cache)
        steps = [model(seq[:, :5], cache=cache)] + [model(seq[:, t : t + 1], cache=cache) for t in range(5, 16)]
        torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=0, atol=1e-5)
        torch.testing.assert_close(model(changed)[:, :10], full[:, :10], rtol=0, atol=1e-6)


@pytest.mark.parametrize("name", CONVOLUTIONS)
def test_gpt_generation_with_the_cache_equals_recomputation(name):
    model = gpt(name)
    prompt = torch.randint(0, V, (1, 3), generator=torch.Generator().manual_seed(2))
    cached = greedy(model, prompt, 20, use_cache=True)  # past block_size 16 too
    recomputed = greedy(model, prompt, 20, use_cache=False)
    assert torch.equal(cached, recomputed)


@pytest.mark.parametrize("name", CONVOLUTIONS)
def test_gpt_trains_its_kernels(name):
    model = gpt(name).train()
    seq = torch.randint(0, V, (2, 16))
    _, loss = model(seq[:, :-1], seq[:, 1:])
    loss.backward()
    conv = model.blocks[0].attn
    grad = conv.weight.grad if name == "lightweight-conv" else conv.weight_proj.weight.grad
    assert grad is not None and grad.abs().sum() > 0


@pytest.mark.parametrize("name", CONVOLUTIONS)
def test_bert_convolution_ignores_padding(name):
    torch.manual_seed(0)
    fields = dict(vocab_size=V, max_len=16, d_model=16, n_heads=2, n_layers=2, d_ff=32, dropout=0.0, head="none")
    model = Bert(BertConfig(**fields, attention=name, conv_kernel=5)).eval()
    ids = torch.randint(1, V, (1, 9))
    padded = torch.cat([ids, torch.zeros(1, 7, dtype=torch.long)], dim=1)
    with torch.no_grad():
        torch.testing.assert_close(model(padded)[:, :9], model(ids), rtol=0, atol=1e-5)


def test_configs_refuse_what_a_convolution_cannot_do():
    with pytest.raises(ValueError, match="did you mean 'dynamic-conv'"):
        GPTConfig(vocab_size=V, attention="dynamic-cnv")
    with pytest.raises(ValueError, match="conv_kernel must be >= 1"):
        GPTConfig(vocab_size=V, attention="lightweight-conv", conv_kernel=0)
    with pytest.raises(ValueError, match="no keys for 'rope'"):
        GPTConfig(vocab_size=V, attention="lightweight-conv", positions="rope")
    with pytest.raises(ValueError, match="is for GPT and BERT"):
        Seq2SeqConfig(vocab_size=V, attention="dynamic-conv")


def test_continuous_batching_refuses_a_convolution_with_one_line():
    from attnlab.decode.batching import Batcher
    from attnlab.errors import UserError

    with pytest.raises(UserError, match="'dynamic-conv' keeps no key/value slots"):
        Batcher(gpt("dynamic-conv"), 2)


@pytest.mark.parametrize("name", CONVOLUTIONS)
def test_the_tuned_paths_leave_a_convolution_to_pytorch(name):
    from attnlab.accel.coverage import covers_gpt, decodes_gpt

    model = gpt(name)
    assert not decodes_gpt(model) and not covers_gpt(model)
