"""Transparent attention (Bapna et al. 2018) in the encoder–decoder: each decoder layer's memory is
its softmax-weighted mix of every encoder state, checked against the formula written out, against
the vanilla model where the mix puts all its weight on the last layer, and cached decoding."""

import dataclasses
import math

import pytest
import torch

from attnlab.models import Seq2SeqConfig, Seq2SeqTransformer

V = 30


def model(transparent: bool = True, norm: str = "pre") -> Seq2SeqTransformer:
    torch.manual_seed(0)
    config = Seq2SeqConfig(
        vocab_size=V, d_model=16, n_heads=2, n_encoder_layers=3, n_decoder_layers=2, d_ff=32, dropout=0.0, norm=norm
    )
    return Seq2SeqTransformer(dataclasses.replace(config, transparent_attention=transparent)).eval()


def test_each_decoder_layer_reads_its_own_mix_of_every_encoder_state():
    m = model()
    with torch.no_grad():
        m.transparent.logits.normal_()
        src = torch.randint(3, V, (2, 7))
        # The encoder states written out: x_0 the scaled embedding plus positions, x_i = block_i(x_{i-1}).
        pos = torch.arange(7)
        states = [m.src_embedding(src) * math.sqrt(16) + m.positions(pos)]
        mask = src != m.pad_id
        for block in m.encoder:
            states.append(block(states[-1], mask=mask[:, None, None, :])[0])
        logits = m.transparent.logits  # (N + 1, M)
        state = m.start(src, 8)
        for j, block in enumerate(m.decoder):
            w = [math.exp(logits[i, j]) / sum(math.exp(logits[n, j]) for n in range(4)) for i in range(4)]
            memory = m.encoder_norm(sum(w[i] * states[i] for i in range(4)))
            assert not torch.allclose(memory, m.encoder_norm(states[-1]), atol=1e-3)  # not the last layer's
            want_k, want_v = block.cross_attn.project_memory(memory)
            torch.testing.assert_close(state.memory_kv[j][0], want_k)
            torch.testing.assert_close(state.memory_kv[j][1], want_v)


@pytest.mark.parametrize("norm", ["pre", "post"])
def test_all_weight_on_the_last_layer_is_the_vanilla_model(norm):
    vanilla, transparent = model(False, norm), model(True, norm)
    transparent.load_state_dict(vanilla.state_dict(), strict=False)
    src, tgt = torch.randint(3, V, (2, 7)), torch.randint(3, V, (2, 6))
    with torch.no_grad():
        assert not torch.allclose(transparent(src, tgt), vanilla(src, tgt), atol=1e-3)
        transparent.transparent.logits.zero_()
        transparent.transparent.logits[-1] = 50.0  # softmax: one-hot on the last encoder layer
        torch.testing.assert_close(transparent(src, tgt), vanilla(src, tgt), rtol=0, atol=1e-5)


def test_cached_decoding_equals_teacher_forcing():
    m = model()
    src, tgt = torch.randint(3, V, (2, 9)), torch.randint(3, V, (2, 10))
    with torch.no_grad():
        m.transparent.logits.normal_()
        full = m(src, tgt)
        state = m.start(src, 16)
        steps = torch.stack([m.step(tgt[:, t], state) for t in range(10)], 1)
    torch.testing.assert_close(steps, full, rtol=0, atol=1e-5)


def test_the_mix_is_trained():
    m = model().train()
    src, tgt = torch.randint(3, V, (2, 7)), torch.randint(3, V, (2, 6))
    m(src, tgt).sum().backward()
    assert m.transparent.logits.grad.abs().sum() > 0
