"""The Weighted Transformer's branched attention (Ahmed et al. 2017, Eq. 3–4) against its formula
written out branch by branch, and inside the GPT and BERT."""

import math

import pytest
import torch

from attnlab.accel import uncovered_parts
from attnlab.models import GPT, Bert, BertConfig, GPTConfig, Seq2SeqConfig
from attnlab.nn.weighted import BranchedAttention

C, H, F = 12, 3, 24


def reference(attn: BranchedAttention, x: torch.Tensor) -> torch.Tensor:
    """Σ_i α_i FFN_i(κ_i · head_i W_O^i), head_i = softmax(q_i k_iᵀ / √D + causal mask) v_i."""
    d = C // H
    q, k, v = attn.in_proj(x).split(C, dim=-1)  # (B, T, C) each
    t = x.size(1)
    future = torch.ones(t, t).triu(1).bool()
    branches = attn.out_proj
    kappa = torch.exp(branches.kappa_logits) / torch.exp(branches.kappa_logits).sum()
    alpha = torch.exp(branches.alpha_logits) / torch.exp(branches.alpha_logits).sum()
    out = torch.zeros_like(x)
    for i in range(H):
        cols = slice(i * d, (i + 1) * d)
        scores = (q[..., cols] @ k[..., cols].transpose(1, 2) / math.sqrt(d)).masked_fill(future, -math.inf)
        head = torch.softmax(scores, dim=-1) @ v[..., cols]  # (B, T, D)
        z = kappa[i] * (head @ branches.w_o[i] + branches.b_o[i])
        ffn = torch.relu(z @ branches.w1[i] + branches.b1[i]) @ branches.w2[i] + branches.b2[i]
        out += alpha[i] * ffn
    return out


def test_branched_attention_equals_its_formula():
    torch.manual_seed(0)
    attn = BranchedAttention(C, H, F, activation="relu")
    with torch.no_grad():  # κ and α away from uniform, biases away from zero
        for p in attn.out_proj.parameters():
            p.add_(torch.randn_like(p))
        x = torch.randn(2, 7, C)
        got, _ = attn(x, causal=True)
        torch.testing.assert_close(got, reference(attn, x))


def test_branch_weights_are_each_a_distribution_and_the_parameters_those_of_a_dense_block():
    torch.manual_seed(0)
    attn = BranchedAttention(C, H, F, activation="relu")
    assert math.isclose(attn.out_proj.kappa.sum().item(), 1.0) and math.isclose(attn.out_proj.alpha.sum().item(), 1.0)
    per_branch = {name: tuple(p.shape) for name, p in attn.out_proj.named_parameters()}
    # H projections W_O^i (D, C) are one W_O (C, C); H hidden widths F / H are one of width F.
    assert per_branch["w_o"] == (H, C // H, C) and per_branch["w1"] == (H, C, F // H)


V = 30


def gpt(**overrides) -> GPT:
    torch.manual_seed(0)
    fields = dict(vocab_size=V, block_size=16, n_layers=2, n_heads=2, d_model=16, branched_attention=True)
    return GPT(GPTConfig(**(fields | overrides))).eval()


@pytest.mark.parametrize("norm", ["pre", "post"])
def test_gpt_weighted_decodes_with_a_cache_as_it_computes_the_whole_sequence(norm):
    model = gpt(norm=norm, positions="rope")
    assert all(block.ffn is None and isinstance(block.attn, BranchedAttention) for block in model.blocks)
    seq = torch.randint(0, V, (2, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full = model(seq)
        cache = model.new_cache(2)
        steps = [model(seq[:, :4], cache=cache)] + [model(seq[:, t : t + 1], cache=cache) for t in range(4, 16)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=0, atol=1e-5)
    vanilla = gpt(branched_attention=False)
    # Same parameters as the vanilla GPT, but for the κ, α logits and the per-branch biases.
    assert abs(model.num_parameters() - vanilla.num_parameters()) < 0.02 * vanilla.num_parameters()


def test_the_kernels_step_aside_for_branched_attention():
    assert uncovered_parts(gpt()) is not None


def test_bert_weighted_ignores_padding():
    torch.manual_seed(0)
    fields = dict(vocab_size=V, max_len=16, d_model=16, n_heads=2, n_layers=2, d_ff=32, dropout=0.0, head="none")
    model = Bert(BertConfig(**fields, branched_attention=True)).eval()
    ids = torch.randint(1, V, (1, 9))
    padded = torch.cat([ids, torch.zeros(1, 7, dtype=torch.long)], dim=1)
    with torch.no_grad():
        torch.testing.assert_close(model(padded)[:, :9], model(ids), rtol=0, atol=1e-5)


@pytest.mark.parametrize(
    ("make", "fragment"),
    [
        (lambda: GPTConfig(vocab_size=V, branched_attention=True, activation="swiglu"), "dense activation"),
        (lambda: Seq2SeqConfig(vocab_size=V, branched_attention=True), "GPT and BERT"),
    ],
)
def test_config_refuses_branches_where_they_cannot_be_built(make, fragment):
    with pytest.raises(ValueError, match=fragment):
        make()
