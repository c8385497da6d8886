"""Every position scheme in every family: cached decoding equals recomputation, evaluation past the
training length where the scheme allows it, and the C++ fast paths stepping aside."""

import pytest
import torch

from attnlab.accel import for_training, kernels, uncovered_parts
from attnlab.decode.sampling import generate_tokens, greedy_picker, sampling_picker
from attnlab.decode.seq2seq import beam_search
from attnlab.models import GPT, Bert, BertConfig, GPTConfig, Seq2SeqConfig, Seq2SeqTransformer
from attnlab.nn import POSITIONS

V = 40
SCHEMES = list(POSITIONS)
UNBOUNDED = [s for s in SCHEMES if s != "learned"]


def gpt(positions: str, **overrides) -> GPT:
    torch.manual_seed(0)
    fields = dict(vocab_size=V, block_size=24, n_layers=2, n_heads=2, d_model=16, positions=positions)
    return GPT(GPTConfig(**(fields | overrides))).eval()


@pytest.mark.parametrize("positions", SCHEMES)
def test_gpt_cached_logits_equal_full_recomputation_at_every_step(positions):
    model = gpt(positions)
    torch.manual_seed(1)
    seq = torch.randint(0, V, (3, 20))
    with torch.no_grad():
        full = model(seq)  # (B, T, V): every position from scratch
        cache = model.new_cache(3)
        steps = [model(seq[:, :6], cache=cache)]  # a prompt, then one token at a time
        steps += [model(seq[:, t : t + 1], cache=cache) for t in range(6, 20)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=0, atol=1e-5)


@pytest.mark.parametrize("positions", SCHEMES)
def test_gpt_static_cache_step_equals_full_recomputation(positions):
    # The compiled decoding path: positions as a tensor, the whole preallocated cache attended.
    model = gpt(positions)
    torch.manual_seed(1)
    seq = torch.randint(0, V, (2, 12))
    with torch.no_grad():
        full = model(seq)
        cache = model.new_cache(2)
        out = [model(seq[:, :5], cache=cache, positions=torch.arange(5))]
        out += [model(seq[:, t : t + 1], cache=cache, positions=torch.tensor([t])) for t in range(5, 12)]
    torch.testing.assert_close(torch.cat(out, dim=1), full, rtol=0, atol=1e-5)


@pytest.mark.parametrize("positions", SCHEMES)
@pytest.mark.parametrize("pick", ["greedy", "sample"])
def test_gpt_generation_with_cache_equals_without_token_for_token(positions, pick):
    model = gpt(positions)
    prompt = torch.randint(0, V, (2, 4), generator=torch.Generator().manual_seed(3))

    def run(use_cache: bool) -> list[list[int]]:
        picker = (
            greedy_picker() if pick == "greedy" else sampling_picker(1.0, generator=torch.Generator().manual_seed(7))
        )
        return torch.stack(list(generate_tokens(model, prompt, 30, picker, use_cache=use_cache)), 1).tolist()

    assert run(True) == run(False)  # 30 tokens: past block_size 24, where the window slides


def seq2seq(positions: str) -> Seq2SeqTransformer:
    torch.manual_seed(0)
    config = Seq2SeqConfig(
        vocab_size=V,
        d_model=16,
        n_heads=2,
        n_encoder_layers=2,
        n_decoder_layers=2,
        d_ff=32,
        dropout=0.0,
        positions=positions,
        max_len=32,
    )
    return Seq2SeqTransformer(config).eval()


@pytest.mark.parametrize("positions", SCHEMES)
def test_seq2seq_cached_steps_equal_teacher_forcing(positions):
    model = seq2seq(positions)
    torch.manual_seed(1)
    src, tgt = torch.randint(3, V, (2, 9)), torch.randint(3, V, (2, 8))
    src[1, 6:] = 0  # padding
    with torch.no_grad():
        full = model(src, tgt)
        state = model.start(src, 16)
        steps = [model.step(tgt[:, t], state) for t in range(8)]
    torch.testing.assert_close(torch.stack(steps, 1), full, rtol=0, atol=1e-5)


@pytest.mark.parametrize("positions", SCHEMES)
def test_seq2seq_beam_of_one_equals_greedy_recomputed_in_full(positions):
    model = seq2seq(positions)
    bos, eos = 1, 2
    with torch.no_grad():  # sharper than the initial weights, and eos never the likeliest: long outputs
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.7)
        model.output.weight[eos] = 0.0
    src = torch.randint(3, V, (1, 7), generator=torch.Generator().manual_seed(2))
    found = beam_search(model, src, beam_size=1, bos_id=bos, eos_id=eos, max_len_ratio=1.0)[0]
    with torch.no_grad():
        tgt = [bos]
        while len(tgt) <= len(found) and (len(tgt) == 1 or tgt[-1] != eos):
            logits = model(src, torch.tensor([tgt]))[0, -1]
            logits[[0, bos]] = float("-inf")  # decoders never emit padding or bos
            tgt.append(int(logits.argmax()))
    expected = [t for t in tgt[1:] if t != eos]
    assert len(found) > 3 and found == expected[: len(found)]


@pytest.mark.parametrize("positions", ["learned", "rope", "alibi", "relative", "fourier"])
def test_bert_right_padding_leaves_the_real_tokens_alone(positions):
    torch.manual_seed(0)
    model = Bert(
        BertConfig(
            vocab_size=V,
            max_len=16,
            d_model=16,
            n_heads=2,
            n_layers=2,
            d_ff=32,
            dropout=0.0,
            positions=positions,
            head="none",
        )
    ).eval()
    ids = torch.randint(1, V, (1, 9))
    padded = torch.cat([ids, torch.zeros(1, 4, dtype=torch.long)], dim=1)
    with torch.no_grad():
        torch.testing.assert_close(model(padded)[:, :9], model(ids), rtol=0, atol=1e-5)


@pytest.mark.parametrize("positions", UNBOUNDED)
def test_gpt_evaluates_past_its_training_length_where_the_scheme_allows(positions):
    model = gpt(positions)
    assert model.max_context is None
    seq = torch.randint(0, V, (1, 4 * 24))
    with torch.no_grad():
        logits = model(seq)
    assert logits.shape == (1, 96, V) and torch.isfinite(logits).all()
    # Causal all the same: the first 24 positions do not see what comes after them.
    torch.testing.assert_close(logits[:, :24], model(seq[:, :24]), rtol=0, atol=1e-5)


def test_learned_positions_stop_at_the_table():
    model = gpt("learned")
    assert model.max_context == 24
    with pytest.raises(ValueError, match="longer than block_size 24"):
        model(torch.zeros(1, 25, dtype=torch.long))


@pytest.mark.parametrize("positions", ["rope", "alibi", "relative"])
def test_cpp_training_kernels_step_aside_for_positions_inside_attention(positions):
    model = gpt(positions)
    x = torch.randn(2, 8, 16)
    assert kernels._block_setup(model.blocks[0], x, True) is None
    assert "positions=" + positions in uncovered_parts(model)
    assert uncovered_parts(gpt("learned")) is None
    other = gpt(positions)
    if kernels.is_built():  # whatever builds here, the same result each time, in training too
        for_training(model), for_training(other)
    idx = torch.randint(0, V, (2, 8))
    torch.testing.assert_close(model.train()(idx), other.train()(idx), rtol=0, atol=0)


@pytest.mark.parametrize("positions", ["rope", "alibi", "relative"])
def test_fused_decoding_declines_positions_inside_attention(positions):
    from attnlab.accel.fused import supports, supports_decoder

    model = gpt(positions)
    # The GPT step rotates queries and keys itself; the terms on the scores it does not compute.
    assert supports(model, model.new_cache(1)) == (positions == "rope")
    assert supports(gpt("fourier"), gpt("fourier").new_cache(1))
    assert not supports_decoder(seq2seq(positions))
