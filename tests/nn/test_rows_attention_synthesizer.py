"""Synthesizer attention (Tay et al. 2021) against its formulas written out one head and one query
at a time, and inside the GPT (cached decoding equals the full forward, no look-ahead) and BERT
(padding ignored)."""

import math

import pytest
import torch

from attnlab.models import GPT, Bert, BertConfig, GPTConfig
from attnlab.nn.sparse import PatternOptions
from attnlab.nn.synthesizer import SYNTHESIZERS, build_synthesizer

H, D, L = 2, 4, 12


def make(name: str):
    torch.manual_seed(0)
    pattern = build_synthesizer(name, PatternOptions(H, D, L, 0, 0, 0, 0, 0, 0))
    with torch.no_grad():  # biases and α away from their zero start, so that the formula checks them
        for p in pattern.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    return pattern


def dense(q_i, w1, b1, w2, b2):
    """Eq. 3 for one query vector: W₂ ReLU(W₁ x + b₁) + b₂ (row-vector convention: x W₁)."""
    return torch.relu(q_i @ w1 + b1) @ w2 + b2


def synthesized_row(p, name: str, h: int, i: int, q_i: torch.Tensor, t: int) -> torch.Tensor:
    """The synthesized logits of head h, query i over keys 0..t-1, from the paper's definitions."""
    if name.startswith("synthesizer-dense"):
        return dense(q_i, p.w1[h], p.b1[h], p.w2[h], p.b2[h])[:t]
    if name == "synthesizer-factorized":
        a = dense(q_i, p.w1a[h], p.b1a[h], p.w2a[h], p.b2a[h])
        b = dense(q_i, p.w1b[h], p.b1b[h], p.w2b[h], p.b2b[h])
        return torch.stack([a[j // len(b)] * b[j % len(b)] for j in range(t)])
    return p.table[h, i, :t]  # random: row i of the learned table


def reference(p, name, q, k, v, causal):
    b, _, t, _ = q.shape
    out = torch.zeros_like(q)
    for n in range(b):
        for h in range(H):
            for i in range(t):
                s = synthesized_row(p, name, h, i, q[n, h, i], t)
                dot = torch.stack([q[n, h, i] @ k[n, h, j] / math.sqrt(D) for j in range(t)])
                if name.endswith("+"):
                    s = s + dot
                elif name.endswith("+alpha"):
                    alpha = 1 / (1 + math.exp(-p.alpha_logit[h].item()))
                    s = alpha * s + (1 - alpha) * dot
                seen = i + 1 if causal else t
                w = torch.softmax(s[:seen], dim=0)
                out[n, h, i] = sum(w[j] * v[n, h, j] for j in range(seen))
    return out


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("name", list(SYNTHESIZERS))
def test_synthesizer_equals_its_formula(name, causal):
    p = make(name)
    q, k, v = torch.randn(3, 2, H, 9, D).unbind(0)
    with torch.no_grad():
        torch.testing.assert_close(p(q, k, v, causal=causal), reference(p, name, q, k, v, causal))


def test_pure_synthesizers_ignore_the_keys_and_plus_variants_read_them():
    q, k, v = torch.randn(3, 1, H, 6, D).unbind(0)
    other_k = torch.randn_like(k)
    with torch.no_grad():
        for name in SYNTHESIZERS:
            p = make(name)
            same = torch.allclose(p(q, k, v, causal=True), p(q, other_k, v, causal=True))
            assert same == ("+" not in name), name


def test_factorized_logits_are_an_outer_product_of_rank_one():
    p = make("synthesizer-factorized")
    assert p.a * p.b == L
    with torch.no_grad():
        s = p.synthesize(torch.randn(1, H, 1, D), torch.arange(1), L)[0, 0, 0]  # (L,)
    assert torch.linalg.matrix_rank(s.view(p.a, p.b)) == 1


def test_random_synthesizer_is_the_same_for_every_input():
    p = make("synthesizer-random")
    with torch.no_grad():
        one = p.synthesize(torch.randn(1, H, 5, D), torch.arange(5), 5)
        two = p.synthesize(torch.randn(1, H, 5, D), torch.arange(5), 5)
    torch.testing.assert_close(one, two)


V = 30


def gpt(attention: str, **overrides) -> GPT:
    torch.manual_seed(0)
    fields = dict(vocab_size=V, block_size=16, n_layers=2, n_heads=2, d_model=16, attention=attention)
    return GPT(GPTConfig(**(fields | overrides))).eval()


@pytest.mark.parametrize("positions", ["learned", "alibi"])
@pytest.mark.parametrize("name", list(SYNTHESIZERS))
def test_gpt_cached_decoding_equals_the_forward_and_never_looks_ahead(name, positions):
    model = gpt(name, positions=positions)
    seq = torch.randint(0, V, (2, 16), generator=torch.Generator().manual_seed(1))
    changed = seq.clone()
    changed[:, 10:] = (changed[:, 10:] + 1) % V
    with torch.no_grad():
        full = model(seq)
        cache = model.new_cache(2)
        steps = [model(seq[:, :5], cache=cache)] + [model(seq[:, t : t + 1], cache=cache) for t in range(5, 16)]
        torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=0, atol=1e-5)
        torch.testing.assert_close(model(changed)[:, :10], full[:, :10], rtol=0, atol=1e-6)
        weights = model.attention_weights(seq)[0]  # (B, H, T, T)
    assert torch.all(weights.triu(diagonal=1) == 0)


def test_gpt_synthesizer_refuses_sequences_longer_than_its_table():
    model = gpt("synthesizer-random", positions="none")
    assert model.max_context == 16
    with pytest.raises(ValueError, match="longer than block_size 16"):
        model(torch.zeros(1, 17, dtype=torch.long))


def test_config_names_a_misspelt_synthesizer():
    with pytest.raises(ValueError, match="did you mean 'synthesizer-dense'"):
        GPTConfig(vocab_size=V, attention="synthesizer-dens")


@pytest.mark.parametrize("name", ["synthesizer-dense+alpha", "synthesizer-random"])
def test_bert_synthesizer_ignores_padding(name):
    torch.manual_seed(0)
    fields = dict(vocab_size=V, max_len=16, d_model=16, n_heads=2, n_layers=2, d_ff=32, dropout=0.0, head="none")
    model = Bert(BertConfig(**fields, attention=name)).eval()
    ids = torch.randint(1, V, (1, 9))
    padded = torch.cat([ids, torch.zeros(1, 7, dtype=torch.long)], dim=1)
    with torch.no_grad():
        torch.testing.assert_close(model(padded)[:, :9], model(ids), rtol=0, atol=1e-5)
