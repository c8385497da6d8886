"""Fixup initialisation (Zhang et al. 2019) and the depth–width shapes of Narang et al. 2021's table."""

import dataclasses

import pytest
import torch

from attnlab.models import GPT, GPTConfig, Seq2SeqConfig, Seq2SeqTransformer
from attnlab.nn import FixupBias, FixupScale, depth_width_shapes, fixup_scale
from attnlab.nn.shapes import block_parameters
from attnlab.studies.ablation import ablation_specs, load_spec, plan
from helpers import FIXTURES, WIKITEXT


def test_fixup_scale_is_the_papers_exponent():
    assert fixup_scale(16, 2) == pytest.approx(16**-0.5)  # L^(-1/(2m-2)), m = 2
    assert fixup_scale(8, 3) == pytest.approx(8**-0.25)
    with pytest.raises(ValueError):
        fixup_scale(4, 1)


def gpt(seed: int, **kw) -> GPT:
    torch.manual_seed(seed)
    return GPT(GPTConfig(vocab_size=30, block_size=8, n_layers=3, n_heads=2, d_model=16, **kw))


@pytest.mark.parametrize("activation", ["relu", "swiglu"])
def test_fixup_rescales_the_branches_zeroes_their_last_layers_and_adds_scalars(activation):
    """Against the same seed's LayerNorm GPT (the same draws: the norms draw nothing): the value rows
    of in_proj and fc1 times L^(-1/2), L = 6 branches; out_proj and fc2 zero; queries and keys as drawn."""
    plain, fix = gpt(0, activation=activation), gpt(0, activation=activation, normalization="fixup")
    scale = 6**-0.5
    for a, b in zip(plain.blocks, fix.blocks, strict=False):
        c = 16
        torch.testing.assert_close(b.attn.in_proj.weight[2 * c :], a.attn.in_proj.weight[2 * c :] * scale)
        torch.testing.assert_close(b.attn.in_proj.weight[: 2 * c], a.attn.in_proj.weight[: 2 * c])
        torch.testing.assert_close(b.ffn.fc1.weight, a.ffn.fc1.weight * scale)
        assert not b.attn.out_proj.weight.any() and not b.ffn.fc2.weight.any()
        assert isinstance(b.norm1, FixupBias) and isinstance(b.gate2, FixupScale)
        assert (b.gate1.scale.item(), b.gate1.bias.item(), b.norm1.bias.item()) == (1.0, 0.0, 0.0)
    assert not any(isinstance(m, torch.nn.LayerNorm) for m in fix.modules())  # no normalisation left


def test_fixup_blocks_start_as_the_identity_and_an_untied_head_at_zero():
    fix = gpt(1, normalization="fixup", tie_weights=False)
    x = torch.randn(2, 8, 16)
    for block in fix.blocks:
        torch.testing.assert_close(block(x, causal=True)[0], x)
    assert not fix.lm_head.weight.any()
    logits = fix(torch.randint(0, 30, (2, 8)))
    assert not logits.any()  # a zero classifier: the uniform distribution, as the paper starts
    tied = gpt(1, normalization="fixup")
    assert tied.lm_head.weight.any()  # the embedding: rule 1 leaves a tied head alone
    _, loss = tied(torch.randint(0, 30, (2, 8)), torch.randint(0, 30, (2, 8)))
    loss.backward()
    assert tied.blocks[0].attn.out_proj.weight.grad.abs().sum() > 0  # zero weights still learn


def test_fixup_in_the_encoder_decoder_counts_three_branches_a_decoder_block():
    torch.manual_seed(2)
    c = Seq2SeqConfig(vocab_size=30, d_model=16, n_heads=2, n_encoder_layers=2, n_decoder_layers=2, d_ff=32)
    plain = Seq2SeqTransformer(c)
    torch.manual_seed(2)
    fix = Seq2SeqTransformer(dataclasses.replace(c, normalization="fixup"))
    scale = (2 * 2 + 3 * 2) ** -0.5
    torch.testing.assert_close(fix.decoder[1].ffn.fc1.weight, plain.decoder[1].ffn.fc1.weight * scale)
    torch.testing.assert_close(
        fix.encoder[0].attn.in_proj.weight[32:], plain.encoder[0].attn.in_proj.weight[32:] * scale
    )
    assert not fix.decoder[0].cross_attn.out_proj.weight.any()
    with pytest.raises(ValueError, match="did you mean 'fixup'"):
        GPTConfig(normalization="fixpu")


BASE = dict(n_layers=3, d_model=96, n_heads=3, ffn_mult=4, bias=False, block_size=64, vocab_size=65)


def block_count(config: GPTConfig) -> int:
    model = GPT(config)
    return sum(p.numel() for b in model.blocks for p in b.parameters())


@pytest.mark.parametrize("bias", [False, True])
def test_depth_width_shapes_hold_the_bases_parameters(bias):
    base = GPTConfig(**{**BASE, "bias": bias})
    assert block_parameters(96, 384, bias=bias) * 3 == block_count(base)
    shapes = depth_width_shapes(3, 96, 3, 384, bias=bias)
    assert [s.n_layers for s in shapes.values()] == [6, 5, 2, 1]  # 24, 18, 8, 6 layers against 12
    assert [s.n_heads for s in shapes.values()] == [1, 2, 4, 6]  # 6, 8, 18, 24 heads against 12
    total = GPT(base).num_parameters()
    for name, s in shapes.items():
        config = dataclasses.replace(base, n_layers=s.n_layers, n_heads=s.n_heads, ffn_hidden=s.ffn_hidden)
        assert block_count(config) == pytest.approx(block_count(base), rel=0.01), name
        assert GPT(config).num_parameters() == pytest.approx(total, rel=0.01), name
    # deeper rows are narrower: the table's trade
    assert [s.ffn_hidden for s in shapes.values()] == sorted(s.ffn_hidden for s in shapes.values())


def test_depth_width_shapes_refuse_a_base_too_small_to_trade():
    with pytest.raises(ValueError, match="no room"):
        depth_width_shapes(3, 96, 3, 4)


ROWS = {
    "untied-embeddings": {"tie_weights": False},
    "factorized-untied": {"embedding_dim": 32, "tie_weights": False},
    "adaptive-input": {"input_embedding": "adaptive", "tie_weights": False},
    "adaptive-softmax": {"softmax": "adaptive", "tie_weights": False},
    "adaptive-softmax-unprojected": {"softmax": "adaptive-unprojected", "tie_weights": False},
    "mos": {"softmax": "mos"},  # four components: the default
    "fixup": {"normalization": "fixup"},
    "block-sharing+factorized": {"block_sharing": "all", "embedding_dim": 32, "tie_weights": False},
    "block-sharing+factorized-shared": {"block_sharing": "all", "embedding_dim": 32},
}


def changed_fields(runs) -> dict[str, dict]:
    vanilla = runs[0].config.model
    return {
        run.name.split("/")[0]: {
            f.name: getattr(run.config.model, f.name)
            for f in dataclasses.fields(vanilla)
            if getattr(run.config.model, f.name) != getattr(vanilla, f.name)
        }
        for run in runs
        if run.name.endswith("seed0")
    }


@pytest.mark.parametrize("spec", ["shakespeare-char", "wikitext2"])
def test_the_language_model_specs_hold_these_rows_and_the_shapes_at_equal_parameters(spec, tmp_path):
    runs = plan(load_spec(spec), tmp_path, seeds=1, data_dir=str(WIKITEXT) if spec == "wikitext2" else None)
    changed = changed_fields(runs)
    for row, fields in ROWS.items():
        assert changed[row] == fields, row
    base = runs[0].config.model
    shapes = depth_width_shapes(base.n_layers, base.d_model, base.n_heads, base.d_ff, bias=base.bias)
    for name, s in shapes.items():
        assert changed[f"shape-{name}"] == {"n_layers": s.n_layers, "n_heads": s.n_heads, "ffn_hidden": s.ffn_hidden}
    for row in [*ROWS, *(f"shape-{n}" for n in shapes)]:
        run = next(r for r in runs if r.name == f"{row}/seed0")
        model = GPT(dataclasses.replace(run.config.model, vocab_size=65))
        x = torch.randint(0, 65, (2, 16))
        _, loss = model(x[:, :-1], x[:, 1:])
        assert torch.isfinite(loss), row


def test_the_multi30k_spec_holds_the_encoder_decoder_rows(tmp_path):
    assert "multi30k" in ablation_specs()
    runs = plan(load_spec("multi30k"), tmp_path, data_dir=str(FIXTURES / "multi30k"))
    assert runs[0].config.model.embedding_ties == "all"
    changed = changed_fields(runs)
    assert {
        "vanilla": {},
        "untied-embeddings": {"tie_embeddings": "none"},
        "tied-encoder-decoder-inputs": {"tie_embeddings": "source-target"},
        "tied-decoder-input-output": {"tie_embeddings": "target-output"},
        "block-sharing": {"block_sharing": "all"},
        "shared-encoder-only": {"block_sharing": "encoder"},
        "shared-decoder-only": {"block_sharing": "decoder"},
        "transparent-attention": {"transparent_attention": True},
    }.items() <= changed.items()
    for run in runs[::2]:
        model = Seq2SeqTransformer(dataclasses.replace(run.config.model, vocab_size=50))
        src, tgt = torch.randint(1, 50, (2, 6)), torch.randint(1, 50, (2, 5))
        assert torch.isfinite(model(src, tgt)).all(), run.name
    assert not any(tmp_path.iterdir())  # planning writes nothing
