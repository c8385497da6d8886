"""attnlab.accel.for_decoding: the decoding routes go onto a model's projections in place, with its
parameters and state dict as they were, and nowhere else; the decoders apply it themselves."""

import torch
from torch import nn

from attnlab.accel import for_decoding
from attnlab.accel.decoding import DecodingCrossAttention
from attnlab.accel.projection import Linear
from attnlab.decode import greedy
from attnlab.models import GPT, GPTConfig, Seq2SeqConfig, Seq2SeqTransformer
from attnlab.nn import MultiHeadAttention


def _gpt() -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=31, block_size=16, n_layers=2, n_heads=2, d_model=32)).eval()


def test_the_reference_model_holds_torch_linear_layers_only():
    model = _gpt()
    assert not any(isinstance(m, Linear) for m in model.modules())
    assert type(model.lm_head) is nn.Linear and type(model.blocks[0].attn.in_proj) is nn.Linear


def test_for_decoding_swaps_the_projections_in_place_and_keeps_the_state_dict():
    model = _gpt()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    params = list(model.parameters())
    applied = for_decoding(model)
    assert applied.model is model
    assert set(applied.covered) == {
        f"blocks.{i}.{part}" for i in range(2) for part in ("attn.in_proj", "attn.out_proj", "ffn.fc1", "ffn.fc2")
    } | {"lm_head"}
    assert all(type(dict(model.named_modules())[name]) is Linear for name in applied.covered)
    assert list(model.parameters()) == params
    assert all(torch.equal(model.state_dict()[k], v) for k, v in state.items())
    assert for_decoding(model).covered == applied.covered  # twice is once


def test_the_encoder_decoders_cross_attention_takes_the_decoding_products():
    torch.manual_seed(0)
    config = Seq2SeqConfig(vocab_size=13, d_model=16, n_heads=2, n_encoder_layers=1, n_decoder_layers=1, d_ff=32)
    model = Seq2SeqTransformer(config).eval()
    x = torch.randn(1, 1, 16)
    want = model.decoder[0].cross_attn.project_query(x)
    for_decoding(model)
    block = model.decoder[0]
    assert type(block.cross_attn) is DecodingCrossAttention and type(block.self_attn) is MultiHeadAttention
    assert type(model.output) is Linear and type(block.cross_attn.in_proj) is Linear
    torch.testing.assert_close(block.cross_attn.project_query(x), want)


def test_greedy_decoding_applies_it_and_gives_the_reference_models_tokens():
    reference, model = _gpt(), _gpt()
    prompt = torch.randint(0, 31, (1, 4), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        first = reference(prompt)[:, -1].argmax(-1)  # the first new token, by the reference forward
    got = greedy(model, prompt, 6)
    assert type(model.lm_head) is Linear  # the decoder applied the routes
    assert torch.equal(got[:, 4], first)
    assert torch.equal(got, greedy(model, prompt, 6, use_cache=False))
