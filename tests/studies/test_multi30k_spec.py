"""The multi30k ablation spec, the transfer column of Narang et al. 2021's table (issue 49): its
rows join the language-model column by name, each builds an encoder–decoder that trains, and the
depth–width rows hold the base's parameters."""

import dataclasses
import shutil

import pytest
import torch
import torch.nn.functional as F

from attnlab.config import read_toml
from attnlab.errors import UserError
from attnlab.models import Seq2SeqTransformer
from attnlab.nn import depth_width_shapes
from attnlab.studies.ablation import load_spec, plan
from helpers import FIXTURES

SPECS = FIXTURES.parents[1] / "src" / "attnlab" / "presets" / "ablations"
ENCODER_DECODER_ROWS = {
    "tied-encoder-decoder-inputs",
    "tied-decoder-input-output",
    "shared-encoder-only",
    "shared-decoder-only",
    "funnel",
    "transparent-attention",
    "evolved",  # the Evolved Transformer (So et al. 2019), the spec's last row
}
"""The rows of the encoder–decoder's own, beside the language-model specs' names."""
LEFT_OUT = {
    "factorized-embeddings": "embedding_dim",
    "factorized-untied": "embedding_dim",
    "block-sharing+factorized": "embedding_dim",
    "block-sharing+factorized-shared": "embedding_dim",
    "universal": "universal",
    "weighted-transformer": "branched_attention",
    "lightweight-conv": "convolution",
    "dynamic-conv": "convolution",
}
"""Language-model rows the encoder–decoder refuses, and a word of its refusal."""
SPEC = load_spec("multi30k")
NAMES = [v.name for v in SPEC.variants]


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, object]:
    """Each variant's resolved model config (seed 0), planned on the Multi30k fixture."""
    runs = plan(SPEC, tmp_path_factory.mktemp("multi30k"), seeds=1, data_dir=str(FIXTURES / "multi30k"))
    return {run.name.split("/")[0]: run.config.model for run in runs}


def test_the_rows_join_the_language_model_column_by_name():
    lm_names = set(read_toml(SPECS / "wikitext2.toml")["variants"])
    assert set(NAMES) <= lm_names | ENCODER_DECODER_ROWS
    assert NAMES[0] == "vanilla" and len(set(NAMES)) == len(NAMES)
    # Every language-model row is here, or is one the encoder–decoder refuses (the GPT-only
    # embeddings and softmaxes are not even fields of its config).
    gpt_only = {"adaptive-input", "adaptive-softmax", "adaptive-softmax-unprojected", "mos"}
    assert lm_names - set(NAMES) == set(LEFT_OUT) | gpt_only


@pytest.mark.parametrize("row", sorted(LEFT_OUT))
def test_a_row_left_out_is_one_the_encoder_decoder_refuses(row, models):
    overrides = read_toml(SPECS / "wikitext2.toml")["variants"][row]["set"]
    fields = {k.removeprefix("model."): v for k, v in overrides.items() if k != "model.tie_weights"}
    with pytest.raises(ValueError, match=LEFT_OUT[row]):
        dataclasses.replace(models["vanilla"], **fields)


@pytest.mark.parametrize("row", NAMES)
def test_every_row_builds_an_encoder_decoder_that_takes_a_training_step(row, models):
    torch.manual_seed(0)
    config = models[row]
    small = dict(vocab_size=40, d_model=16, max_len=24)  # the row's own depth, heads and parts
    model = Seq2SeqTransformer(dataclasses.replace(config, **small, d_ff=32))  # ffn_hidden, if set, wins
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    src, tgt = torch.randint(3, 40, (3, 9)), torch.randint(3, 40, (3, 7))
    src[1, 5:] = config.pad_id
    before = [p.detach().clone() for p in model.parameters()]
    logits = model(src, tgt[:, :-1])
    loss = F.cross_entropy(logits.flatten(0, 1), tgt[:, 1:].flatten())
    loss.backward()
    optimizer.step()
    assert torch.isfinite(loss)
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


@pytest.mark.parametrize("row", NAMES)
def test_every_row_trains_and_translates_under_bf16_autocast(row, models):
    """As the trainer runs a translation run on a CPU with bf16 instructions (`train.dtype` auto):
    the step and its evaluation's loss and beam search under bf16 autocast."""
    from attnlab.decode.seq2seq import beam_search

    torch.manual_seed(0)
    config = models[row]
    model = Seq2SeqTransformer(dataclasses.replace(config, vocab_size=40, d_model=16, max_len=24, d_ff=32))
    src, tgt = torch.randint(3, 40, (3, 9)), torch.randint(3, 40, (3, 7))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(src, tgt[:, :-1])
        loss = F.cross_entropy(logits.float().flatten(0, 1), tgt[:, 1:].flatten())
        loss.backward()
        model.eval()
        with torch.inference_mode():
            out = beam_search(model, src[:1], beam_size=2, bos_id=1, eos_id=2)
    assert torch.isfinite(loss)
    assert len(out) >= 1


def test_a_study_given_its_data_folder_relative_resumes_its_runs(tmp_path, monkeypatch):
    """A run folder keeps data.data_dir absolute; the same folder given relative is the same study
    (it was refused), another folder is not."""
    from attnlab.studies.sweep import check_existing
    from attnlab.train.config import absolute_paths, write_config

    monkeypatch.chdir(FIXTURES)
    run = plan(SPEC, tmp_path / "out", seeds=1, data_dir="multi30k")[0]
    assert run.config.data.data_dir == "multi30k"
    run.folder.mkdir(parents=True)
    write_config(run.folder, dataclasses.replace(run.config, data=absolute_paths(run.config.data)))
    check_existing(run)
    shutil.copytree(FIXTURES / "multi30k", tmp_path / "elsewhere")
    moved = plan(SPEC, tmp_path / "out", seeds=1, data_dir=str(tmp_path / "elsewhere"))[0]
    with pytest.raises(UserError, match="holds a run with data.data_dir"):
        check_existing(moved)


def test_the_depth_width_rows_hold_the_bases_parameters(models):
    base = models["vanilla"]
    assert (base.n_encoder_layers, base.n_decoder_layers, base.d_model, base.n_heads) == (3, 3, 128, 4)

    def parameters(config) -> int:  # the embeddings are the same in every row: a small vocabulary
        return Seq2SeqTransformer(dataclasses.replace(config, vocab_size=8)).num_parameters()

    shapes = depth_width_shapes(base.n_encoder_layers, base.d_model, base.n_heads, base.d_ff)
    for name, shape in shapes.items():
        row = models[f"shape-{name}"]
        assert row.n_encoder_layers == row.n_decoder_layers == shape.n_layers, name
        assert row.n_heads == shape.n_heads, name
        # Within one hidden unit of each stack's blocks: 2 d_model + 1 parameters a unit, a stack.
        tolerance = 2 * row.n_encoder_layers * (2 * base.d_model + 1)
        assert abs(parameters(row) - parameters(base)) <= tolerance, name
