"""The Evolved Transformer's cells (So et al. 2019, Figure 3) against their sub-blocks written out
with plain tensor operations on the same weights (each convolution as a sum over shifted copies of
its input, so that the padding is checked tap by tap), their parameter count against a formula,
and inside the GPT and the encoder–decoder: no look-ahead, cached decoding equal to the forward,
training, and the configs' one-line refusals."""

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F

from attnlab.decode import greedy
from attnlab.decode.seq2seq import beam_search, greedy_translate
from attnlab.models import GPT, Bert, BertConfig, GPTConfig
from attnlab.models.seq2seq import Seq2SeqConfig, Seq2SeqTransformer
from attnlab.nn.evolved import EvolvedCache, EvolvedDecoderCell, EvolvedEncoderCell, TimeConv

D, H, V = 16, 2, 30


def perturbed(module: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """The module in eval mode with every parameter moved off its initial value (norm gains off 1,
    biases off 0), so that a wrong weight in the reference shows."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.2 * torch.randn_like(p))
    return module.eval()


# --- the formulas, written out -------------------------------------------------------------------


def ln(x, norm):
    return F.layer_norm(x, (x.size(-1),), norm.weight, norm.bias, norm.eps)


def lin(x, layer):
    return x @ layer.weight.T + (0 if layer.bias is None else layer.bias)


def shifted(x, s):
    """x `(B, T, C)` read s positions later: out[:, t] = x[:, t + s], zeros outside 0 … T − 1."""
    out = torch.zeros_like(x)
    t = x.size(1)
    for i in range(t):
        if 0 <= i + s < t:
            out[:, i] = x[:, i + s]
    return out


def conv_ref(x, conv: TimeConv, before: int):
    """y[t] = Σ_j W_j · x[t + j − before] over the K taps j (zeros outside the sequence): a full
    convolution (W_j `(C_out, C_in)`, plus its bias) or a depthwise one per channel followed by the
    pointwise linear map."""
    k = conv.kernel
    if hasattr(conv, "conv"):
        w = conv.conv.weight  # (C_out, C_in, K)
        return sum(shifted(x, j - before) @ w[:, :, j].T for j in range(k)) + conv.conv.bias
    w = conv.depthwise.weight[:, 0]  # (C, K)
    return lin(sum(shifted(x, j - before) * w[:, j] for j in range(k)), conv.pointwise)


def attention_ref(x, attn, memory=None, *, causal=False, key_mask=None):
    """softmax(q kᵀ / √D) v per head, q = x W_Q, k, v from x (or memory), then W_O."""
    d, h = attn.d_model, attn.n_heads
    w, b = attn.in_proj.weight, attn.in_proj.bias
    src = x if memory is None else memory
    q, k, v = x @ w[:d].T + b[:d], src @ w[d : 2 * d].T + b[d : 2 * d], src @ w[2 * d :].T + b[2 * d :]

    def heads(t):
        return t.view(t.size(0), t.size(1), h, d // h).transpose(1, 2)

    scores = heads(q) @ heads(k).transpose(-1, -2) / math.sqrt(d // h)
    if causal:
        t = x.size(1)
        scores = scores.masked_fill(~torch.ones(t, t, dtype=torch.bool).tril(), float("-inf"))
    if key_mask is not None:
        scores = scores.masked_fill(~key_mask, float("-inf"))
    y = (scores.softmax(-1) @ heads(v)).transpose(1, 2).reshape(x.shape[0], x.shape[1], d)
    return lin(y, attn.out_proj)


def pad_to(x, width):
    return torch.cat([x, torch.zeros(*x.shape[:-1], width - x.size(-1))], dim=-1)


def sub_block(x, norm, f, pre):
    return x + f(ln(x, norm)) if pre else ln(x + f(x), norm)


def encoder_ref(cell: EvolvedEncoderCell, x, mask, pre):
    d = x.size(-1)
    keep = mask[:, 0, 0, :, None].float()

    def glu(h):
        a = lin(h, cell.glu)
        return a[..., :d] * torch.sigmoid(a[..., d:])

    def branches(h):
        h = h * keep
        left = torch.relu(lin(h, cell.wide))  # d -> 4d
        right = torch.relu(conv_ref(h, cell.conv3, before=1))  # 3x1, d -> d/2, centred
        h = ln(left + pad_to(right, 4 * d), cell.branch_norm) * keep
        return pad_to(conv_ref(h, cell.sep9, before=4), d)  # 9x1 separable, 4d -> d/2, centred

    x = sub_block(x, cell.norm1, glu, pre)
    x = sub_block(x, cell.norm2, branches, pre)
    x = sub_block(x, cell.norm3, lambda h: attention_ref(h, cell.attn, key_mask=mask), pre)
    return sub_block(x, cell.norm4, lambda h: lin(torch.relu(lin(h, cell.ffn.fc1)), cell.ffn.fc2), pre)


def decoder_ref(cell: EvolvedDecoderCell, x, memory, memory_mask, pre):
    d = x.size(-1)

    def first(h):
        a = attention_ref(h, cell.wide_attn, causal=True)  # 2H heads
        if memory is None:
            return a
        return a + attention_ref(h, cell.first_cross_attn, memory, key_mask=memory_mask)

    def branches(h):
        left = torch.relu(conv_ref(h, cell.sep11, before=10))  # 11x1 separable, d -> 2d, causal
        right = conv_ref(h, cell.sep7, before=6)  # 7x1 separable, d -> d/2, causal
        h = ln(left + pad_to(right, 2 * d), cell.branch_norm)
        return conv_ref(h, cell.sep7_out, before=6)  # 7x1 separable, 2d -> d, causal

    def ffn(h):
        hidden = F.silu(lin(h, cell.ffn.fc1))  # swish, 4d
        return lin(ln(hidden, cell.ffn.hidden_norm), cell.ffn.fc2)

    x = sub_block(x, cell.norm1, first, pre)
    x = sub_block(x, cell.norm2, branches, pre)
    x = sub_block(x, cell.norm3, lambda h: attention_ref(h, cell.attn, causal=True), pre)
    if memory is not None:
        x = sub_block(x, cell.norm4, lambda h: attention_ref(h, cell.cross_attn, memory, key_mask=memory_mask), pre)
    return sub_block(x, cell.norm5, ffn, pre)


# --- the cells against the formulas ---------------------------------------------------------------


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("kernel", [1, 3, 4, 9])
@pytest.mark.parametrize("separable", [True, False])
def test_time_convolution_reads_the_taps_the_padding_says(kernel, causal, separable):
    conv = perturbed(TimeConv(6, 5, kernel, causal=causal, separable=separable))
    x = torch.randn(2, 7, 6)
    before = kernel - 1 if causal else kernel // 2
    with torch.no_grad():
        torch.testing.assert_close(conv(x), conv_ref(x, conv, before), rtol=0, atol=1e-5)
    # and against PyTorch's own convolution with explicit zero padding
    if not separable:
        padded = F.pad(x.transpose(1, 2), (before, kernel - 1 - before))
        want = F.conv1d(padded, conv.conv.weight, conv.conv.bias).transpose(1, 2)
        torch.testing.assert_close(conv(x).detach(), want.detach(), rtol=0, atol=1e-5)


@pytest.mark.parametrize("norm", ["pre", "post"])
def test_encoder_cell_equals_its_four_sub_blocks_written_out(norm):
    cell = perturbed(EvolvedEncoderCell(D, H, norm=norm))
    x = torch.randn(2, 9, D)
    mask = torch.ones(2, 1, 1, 9, dtype=torch.bool)
    mask[1, ..., 6:] = False  # the second sentence padded after 6 tokens
    with torch.no_grad():
        got, _ = cell(x, mask=mask)
        torch.testing.assert_close(got, encoder_ref(cell, x, mask, norm == "pre"), rtol=0, atol=2e-5)


@pytest.mark.parametrize("norm", ["pre", "post"])
@pytest.mark.parametrize("cross", [True, False])
def test_decoder_cell_equals_its_sub_blocks_written_out(cross, norm):
    cell = perturbed(EvolvedDecoderCell(D, H, cross=cross, norm=norm))
    assert cell.wide_attn.n_heads == 2 * H and cell.attn.n_heads == H
    x, memory = torch.randn(2, 13, D), torch.randn(2, 5, D)  # 13 > 11: the widest kernel slides
    memory_mask = torch.tensor([[True] * 5, [True] * 3 + [False] * 2])[:, None, None, :]
    with torch.no_grad():
        if cross:
            got, _ = cell(x, cell.project_memory(memory), memory_mask=memory_mask)
            want = decoder_ref(cell, x, memory, memory_mask, norm == "pre")
        else:
            got, _ = cell(x)
            want = decoder_ref(cell, x, None, None, norm == "pre")
    torch.testing.assert_close(got, want, rtol=0, atol=2e-5)


def test_encoder_cell_ignores_padding():
    cell = perturbed(EvolvedEncoderCell(D, H))
    x = torch.randn(1, 6, D)
    padded = torch.cat([x, torch.randn(1, 4, D)], dim=1)  # whatever sits at the padded positions
    mask = torch.tensor([[True] * 6 + [False] * 4])[:, None, None, :]
    with torch.no_grad():
        torch.testing.assert_close(cell(padded, mask=mask)[0][:, :6], cell(x)[0], rtol=0, atol=1e-5)


@pytest.mark.parametrize("cross", [True, False])
def test_decoder_cell_steps_with_its_cache_equal_the_forward(cross):
    cell = perturbed(EvolvedDecoderCell(D, H, cross=cross))
    x, memory = torch.randn(3, 14, D), torch.randn(3, 4, D)
    memory_kv = cell.project_memory(memory) if cross else None
    cache = cell.new_cache(3, 14)
    with torch.no_grad():
        full = cell(x, memory_kv)[0]
        steps = [cell(x[:, :4], memory_kv, cache=cache, positions=0)[0]]  # the caller counts: a model's
        steps += [cell(x[:, t : t + 1], memory_kv, cache=cache, positions=t)[0] for t in range(4, 14)]
    assert isinstance(cache, EvolvedCache)
    assert [c.state.shape for c in cache.convs] == [(3, 10, D), (3, 6, D), (3, 6, 2 * D)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=0, atol=1e-5)


def layer_norm_params(width: int) -> int:
    return 2 * width


def attention_params(d: int) -> int:
    return 4 * d * d + 4 * d  # in_proj (3d × d + 3d), out_proj (d × d + d), whatever the heads


def sep_params(d_in: int, d_out: int, k: int) -> int:
    return d_in * k + d_in * d_out + d_out  # depthwise (no bias), pointwise with bias


def encoder_cell_params(d: int) -> int:
    """4 norms; GLU d → 2d; wide d → 4d; conv 3×1 d → d/2; the branch norm (4d); SepConv 9×1 4d →
    d/2; attention; feed-forward d → 4d → d."""
    return (
        4 * layer_norm_params(d)
        + (2 * d * d + 2 * d)
        + (4 * d * d + 4 * d)
        + (3 * d * d // 2 + d // 2)
        + layer_norm_params(4 * d)
        + sep_params(4 * d, d // 2, 9)
        + attention_params(d)
        + (8 * d * d + 5 * d)
    )


def decoder_cell_params(d: int, cross: bool) -> int:
    """5 norms (4 without the cross-attention); 2 attentions (4 with it); SepConv 11×1 d → 2d,
    7×1 d → d/2, the branch norm (2d), 7×1 2d → d; feed-forward d → 4d → d with a norm over 4d."""
    return (
        (5 if cross else 4) * layer_norm_params(d)
        + (4 if cross else 2) * attention_params(d)
        + sep_params(d, 2 * d, 11)
        + sep_params(d, d // 2, 7)
        + layer_norm_params(2 * d)
        + sep_params(2 * d, d, 7)
        + (8 * d * d + 5 * d + layer_norm_params(4 * d))
    )


@pytest.mark.parametrize("d", [16, 32])
def test_parameter_counts_follow_the_formula(d):
    def count(m):
        return sum(p.numel() for p in m.parameters())

    assert count(EvolvedEncoderCell(d, 2)) == encoder_cell_params(d)
    assert count(EvolvedDecoderCell(d, 2, cross=True)) == decoder_cell_params(d, True)
    assert count(EvolvedDecoderCell(d, 4, cross=False)) == decoder_cell_params(d, False)
    gpt = GPT(GPTConfig(vocab_size=V, block_size=8, n_layers=3, n_heads=2, d_model=d, block="evolved"))
    # tied embedding V × d, the cells, the final LayerNorm (learned positions not counted)
    assert gpt.num_parameters() == V * d + 3 * decoder_cell_params(d, False) + 2 * d
    s2s = seq2seq(d_model=d)
    assert s2s.num_parameters() == V * d + 2 * encoder_cell_params(d) + 2 * decoder_cell_params(d, True) + 4 * d


# --- inside the models ----------------------------------------------------------------------------


def gpt(**overrides) -> GPT:
    torch.manual_seed(0)
    fields = dict(vocab_size=V, block_size=16, n_layers=2, n_heads=H, d_model=D, block="evolved")
    return GPT(GPTConfig(**(fields | overrides))).eval()


def seq2seq(**overrides) -> Seq2SeqTransformer:
    torch.manual_seed(0)
    fields = dict(vocab_size=V, d_model=D, n_heads=H, n_encoder_layers=2, n_decoder_layers=2, d_ff=32)
    fields |= dict(dropout=0.0, max_len=32, block="evolved", norm="pre")
    return Seq2SeqTransformer(Seq2SeqConfig(**(fields | overrides))).eval()


@pytest.mark.parametrize("positions", ["learned", "rope"])
def test_gpt_cached_decoding_equals_the_forward_and_never_looks_ahead(positions):
    model = gpt(positions=positions)
    assert all(isinstance(b, EvolvedDecoderCell) and b.cross_attn is None for b in model.blocks)
    seq = torch.randint(0, V, (2, 16), generator=torch.Generator().manual_seed(1))
    changed = seq.clone()
    changed[:, 10:] = (changed[:, 10:] + 1) % V
    with torch.no_grad():
        full = model(seq)
        cache = model.new_cache(2)
        steps = [model(seq[:, :5], cache=cache)] + [model(seq[:, t : t + 1], cache=cache) for t in range(5, 16)]
        torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=0, atol=1e-5)
        torch.testing.assert_close(model(changed)[:, :10], full[:, :10], rtol=0, atol=1e-6)
        assert not torch.allclose(model(changed)[:, 10:], full[:, 10:])


def test_gpt_generation_with_the_cache_equals_recomputation():
    model = gpt()
    prompt = torch.randint(0, V, (2, 3), generator=torch.Generator().manual_seed(2))
    assert torch.equal(greedy(model, prompt, 20, use_cache=True), greedy(model, prompt, 20, use_cache=False))


def test_encoder_decoder_steps_equal_teacher_forcing_and_never_look_ahead():
    model = seq2seq()
    assert all(isinstance(b, EvolvedEncoderCell) for b in model.encoder)
    src = torch.randint(1, V, (2, 7), generator=torch.Generator().manual_seed(3))
    src[1, 5:] = 0  # padding
    tgt = torch.randint(1, V, (2, 12), generator=torch.Generator().manual_seed(4))
    changed = tgt.clone()
    changed[:, 8:] = (changed[:, 8:] + 1) % V
    with torch.no_grad():
        full = model(src, tgt)
        state = model.start(src, 12)
        steps = torch.stack([model.step(tgt[:, t], state) for t in range(12)], dim=1)
        torch.testing.assert_close(steps, full, rtol=0, atol=1e-5)
        torch.testing.assert_close(model(src, changed)[:, :8], full[:, :8], rtol=0, atol=1e-6)
        # beam search reorders the rows of the state: both cross-attentions' memories and every cache
        state = model.start(src, 12)
        for t in range(6):
            model.step(tgt[:, t], state)
        state.select(torch.tensor([1, 0, 1]))
        got = model.step(tgt[[1, 0, 1], 6], state)
        torch.testing.assert_close(got, full[[1, 0, 1], 6], rtol=0, atol=1e-5)


def test_greedy_translation_with_the_cache_equals_recomputation_and_beams_run():
    model = seq2seq()
    src = torch.randint(3, V, (2, 6), generator=torch.Generator().manual_seed(5))
    got = greedy_translate(model, src, bos_id=1, eos_id=2, max_len_extra=4, max_len_ratio=1.0)
    for row, ids in enumerate(got):  # each token the argmax of a full forward over the prefix
        prefix = [1]
        for token in ids:
            with torch.no_grad():
                logits = model(src[row : row + 1], torch.tensor([prefix]))[0, -1]
            logits[[0, 1]] = float("-inf")  # never <pad> or <bos>, as decoding rules out
            assert token == int(logits.argmax())
            prefix.append(token)
    beams = beam_search(model, src, beam_size=3, bos_id=1, eos_id=2, max_len_extra=4, max_len_ratio=1.0)
    assert len(beams) == 2


def test_tiny_models_train():
    for model, batch in (
        (gpt(), lambda m, seq: m(seq[:, :-1], seq[:, 1:])[1]),
        (seq2seq(), lambda m, seq: F.cross_entropy(m(seq, seq[:, :-1]).reshape(-1, V), seq[:, 1:].reshape(-1))),
    ):
        model.train()
        seq = torch.randint(1, V, (4, 12), generator=torch.Generator().manual_seed(6))
        opt = torch.optim.Adam(model.parameters(), lr=3e-3)
        losses = []
        for _ in range(20):
            loss = batch(model, seq)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        assert losses[-1] < 0.85 * losses[0], losses
        conv = (model.blocks if isinstance(model, GPT) else model.decoder)[0].sep11.depthwise
        assert conv.weight.grad is not None and conv.weight.grad.abs().sum() > 0


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (
            dict(block="evolvd"),
            r"block must be one of 'transformer', 'evolved', got 'evolvd' \(did you mean 'evolved'\?\)",
        ),
        (dict(block="evolved", d_model=12, n_heads=4), r"2 × n_heads = 8 heads, which must divide d_model \(12\)"),
        (dict(block="evolved", normalization="rezero"), "takes normalization 'layernorm' or 'rmsnorm'"),
        (dict(block="evolved", attention="window"), "runs full attention"),
        (dict(block="evolved", experts=4), "leave experts unset"),
    ],
)
def test_configs_refuse_what_an_evolved_block_cannot_take(fields, message):
    with pytest.raises(ValueError, match=message):
        GPTConfig(vocab_size=V, **fields)


def test_bert_and_the_seq2seq_refuse_in_one_line():
    with pytest.raises(ValueError, match="built in GPT and the encoder–decoder"):
        BertConfig(vocab_size=V, block="evolved")
    with pytest.raises(ValueError, match="which must divide d_model"):
        Seq2SeqConfig(vocab_size=V, d_model=24, n_heads=8, block="evolved")
    assert Bert  # the family itself is untouched: its default block builds as before


def test_the_tuned_paths_leave_the_cells_to_pytorch():
    from attnlab.accel.coverage import covers_decoder_block, covers_gpt, decodes_gpt, uncovered_parts
    from attnlab.accel.fused import supports_decoder

    model = gpt()
    assert not covers_gpt(model) and not decodes_gpt(model)
    assert "block=evolved" in uncovered_parts(model)
    s2s = seq2seq()
    assert not any(covers_decoder_block(b) for b in s2s.decoder) and not supports_decoder(s2s)


@pytest.mark.parametrize("spec", ["shakespeare-char", "wikitext2", "multi30k"])
def test_the_specs_hold_the_row_at_about_the_baselines_parameters(spec, tmp_path):
    from attnlab.studies.ablation import load_spec, plan
    from helpers import FIXTURES, WIKITEXT

    data = {"wikitext2": str(WIKITEXT), "multi30k": str(FIXTURES / "multi30k")}.get(spec)
    runs = {r.name.split("/")[0]: r.config.model for r in plan(load_spec(spec), tmp_path, data_dir=data, seeds=1)}
    vanilla, evolved = runs["vanilla"], runs["evolved"]
    assert evolved.block == "evolved" and vanilla.block == "transformer"
    if spec == "multi30k":
        models = [Seq2SeqTransformer(dataclasses.replace(m, vocab_size=8000)) for m in (vanilla, evolved)]
        embedding = 8000 * vanilla.d_model
        counts = [m.num_parameters() - embedding for m in models]
    else:
        counts = [GPT(dataclasses.replace(m, vocab_size=65)).num_parameters() for m in (vanilla, evolved)]
    assert 0.75 < counts[1] / counts[0] < 1.25, counts  # the depth halved, as the paper does


def test_continuous_batching_refuses_the_cells_with_one_line():
    from attnlab.decode.batching import Batcher
    from attnlab.errors import UserError

    with pytest.raises(UserError, match="block 'evolved' keeps no key/value slots"):
        Batcher(gpt(), 2)


def test_export_to_transformers_refuses_the_cells():
    from attnlab.models.hf.gpt2 import gpt2_export_problems
    from attnlab.models.hf.marian import marian_export_problems

    assert "block = 'evolved' (GPT-2 has the Transformer's blocks" in " ".join(gpt2_export_problems(gpt().config))
    assert any(p.startswith("block = 'evolved'") for p in marian_export_problems(seq2seq().config))
    assert not any(p.startswith("block") for p in gpt2_export_problems(GPTConfig(vocab_size=V)))


def test_gpt_static_decoding_path_equals_the_forward():
    """Positions as a tensor (compiled decoding's path): the attentions read the whole preallocated
    cache masked up to the position, the convolutions their registers."""
    model = gpt()
    seq = torch.randint(0, V, (2, 12), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        full = model(seq)
        cache = model.new_cache(2)
        steps = [model(seq[:, :4], cache=cache, positions=torch.arange(4))]
        steps += [model(seq[:, t : t + 1], cache=cache, positions=torch.tensor([t])) for t in range(4, 12)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=0, atol=1e-5)
