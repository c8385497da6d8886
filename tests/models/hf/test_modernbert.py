"""attnlab.models.hf.modernbert: ModernBERT checkpoints saved by transformers give transformers' outputs.

The reference is transformers itself, on the same folder: a tiny random ModernBERT (several shapes,
odd head counts among them; windows far shorter than the texts, so that the local layers differ from
the global ones) saved beside a byte-level BPE tokenizer.json framing texts as "[CLS] text [SEP]"
(nothing is downloaded).
"""

import json
from pathlib import Path

import pytest
import torch

from attnlab.data.tokenizers import EncoderTokenizer
from attnlab.errors import CheckpointError
from attnlab.models.hf.modernbert import load_modernbert
from attnlab.tasks.embeddings import SentenceEncoder, read_pooling
from roberta_folders import TEXTS, train_bpe

pytestmark = pytest.mark.slow

transformers = pytest.importorskip("transformers")

SPECIALS = ("[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]")
UNK, CLS, SEP, PAD, MASK = range(5)
# The local layers' RoPE base, far from the global layers' 160 000 (ModernBERT's own 10 000 is too
# near it for the few positions a tiny window spans: a swap of the two would hide in the tolerance).
LOCAL_THETA = 100.0
SHAPES = {
    "h4": dict(hidden_size=32, num_attention_heads=4, intermediate_size=24, num_hidden_layers=4, local_attention=6),
    "h3": dict(hidden_size=36, num_attention_heads=3, intermediate_size=40, num_hidden_layers=3, local_attention=8),
    "h5": dict(hidden_size=40, num_attention_heads=5, intermediate_size=20, num_hidden_layers=5, local_attention=4),
}


def modernbert_folder(folder: Path, kind: str = "model", shape: str = "h4", **overrides) -> torch.nn.Module:
    """Write a tokenizer and a random ModernBERT of `kind` (model, mlm) into `folder`, with norms
    moved off their init and q, k scaled up so that attention is far from uniform (a head, window or
    RoPE base mix-up shows); returns the transformers model, in eval mode."""
    from tokenizers import processors

    folder.mkdir(parents=True, exist_ok=True)
    tok = train_bpe(SPECIALS)
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", CLS), ("[SEP]", SEP)]
    )
    tok.save(str(folder / "tokenizer.json"))
    torch.manual_seed(0)
    config = transformers.ModernBertConfig(
        vocab_size=tok.get_vocab_size(),
        max_position_embeddings=64,
        pad_token_id=PAD,
        bos_token_id=CLS,
        eos_token_id=SEP,
        cls_token_id=CLS,
        sep_token_id=SEP,
        global_attn_every_n_layers=2,
        global_rope_theta=160_000.0,
        local_rope_theta=LOCAL_THETA,
        **{**SHAPES[shape], **overrides},
    )
    model = (transformers.ModernBertForMaskedLM if kind == "mlm" else transformers.ModernBertModel)(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            elif name.endswith("bias"):
                p.copy_(0.1 * torch.randn_like(p))
            if name.endswith("attn.Wqkv.weight"):  # q and k scaled up: attention far from uniform
                p[: 2 * config.hidden_size].mul_(5.0)
    model.save_pretrained(folder)
    return model


def hf_batch(folder: Path, texts=TEXTS) -> dict[str, torch.Tensor]:
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder))
    tokenizer.pad_token = "[PAD]"
    return tokenizer(list(texts), padding=True, return_tensors="pt")


def both(hf: torch.nn.Module, model: torch.nn.Module, batch: dict[str, torch.Tensor]):
    with torch.no_grad():
        return hf(**batch), model(batch["input_ids"])


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_encoder_matches_transformers(tmp_path, shape):
    hf = modernbert_folder(tmp_path, "model", shape)
    loaded = load_modernbert(tmp_path)
    c = loaded.config
    assert (c.head, c.positions, c.activation, c.bias, c.norm, c.type_vocab_size) == (
        "none",
        "rope",
        "geglu",
        False,
        "pre",
        0,
    )
    assert (
        c.layer_attention[:2] == ("full", "window") and c.attention_window == SHAPES[shape]["local_attention"] // 2 + 1
    )
    assert (c.rope_theta, c.window_rope_theta) == (160_000.0, LOCAL_THETA)
    batch = hf_batch(tmp_path)
    assert (batch["attention_mask"] == 0).any() and batch["input_ids"].size(1) > 3 * SHAPES[shape]["local_attention"]
    theirs, ours = both(hf, loaded.model, batch)
    torch.testing.assert_close(ours, theirs.last_hidden_state, atol=1e-4, rtol=1e-4)


def test_encoder_matches_transformers_without_padding(tmp_path):
    hf = modernbert_folder(tmp_path, "model", "h3")
    batch = hf_batch(tmp_path, TEXTS[:1])
    assert batch["attention_mask"].all()
    theirs, ours = both(hf, load_modernbert(tmp_path).model, batch)
    torch.testing.assert_close(ours, theirs.last_hidden_state, atol=1e-4, rtol=1e-4)


def test_masked_lm_matches_transformers(tmp_path):
    hf = modernbert_folder(tmp_path, "mlm", "h5")
    loaded = load_modernbert(tmp_path)
    # ModernBERT has no pooler, and attnlab's model of it none either (its classifiers read the pooled state).
    assert loaded.config.head == "mlm" and loaded.missing == [] and loaded.model.pooler is None
    assert loaded.model.head.decoder.weight is loaded.model.embeddings.token.weight
    batch = hf_batch(tmp_path)
    theirs, ours = both(hf, loaded.model, batch)
    real = batch["attention_mask"].bool()
    torch.testing.assert_close(ours[real], theirs.logits[real], atol=1e-4, rtol=1e-4)
    assert load_modernbert(tmp_path, head="none").model.head is None


def edit_config(folder: Path, drop: tuple[str, ...] = (), **changes) -> None:
    path = folder / "config.json"
    doc = {k: v for k, v in json.loads(path.read_text()).items() if k not in drop}
    path.write_text(json.dumps({**doc, **changes}))


def test_a_hub_config_without_layer_types_reads_the_same(tmp_path):
    # The Hub's files predate transformers 5: global_attn_every_n_layers and the two rope bases.
    hf = modernbert_folder(tmp_path, "model", "h4")
    old = dict(global_attn_every_n_layers=2, global_rope_theta=160_000.0, local_rope_theta=LOCAL_THETA)
    edit_config(tmp_path, drop=("layer_types", "rope_parameters"), **old)
    loaded = load_modernbert(tmp_path)
    assert loaded.config.layer_attention == ("full", "window", "full", "window")
    theirs, ours = both(hf, loaded.model, hf_batch(tmp_path))
    torch.testing.assert_close(ours, theirs.last_hidden_state, atol=1e-4, rtol=1e-4)


def test_tokenizer_gives_the_ids_of_transformers(tmp_path):
    modernbert_folder(tmp_path)
    ours = load_modernbert(tmp_path).tokenizer
    theirs = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    assert isinstance(ours, EncoderTokenizer)
    assert (ours.pad_id, ours.unk_id, ours.cls_id, ours.sep_id, ours.mask_id) == (PAD, UNK, CLS, SEP, MASK)
    for text in [*TEXTS, "naïve café ✓", ""]:
        assert [ours.cls_id, *ours.encode(text), ours.sep_id] == theirs(text)["input_ids"], text


def test_sentence_vectors_are_mean_pooled_hidden_states(tmp_path):
    hf = modernbert_folder(tmp_path, "model", "h4")
    loaded = load_modernbert(tmp_path)
    batch = hf_batch(tmp_path)
    with torch.no_grad():
        hidden = hf(**batch).last_hidden_state  # (N, T, C)
    mask = batch["attention_mask"].unsqueeze(-1).float()  # (N, T, 1)
    want = (hidden * mask).sum(1) / mask.sum(1)
    got = SentenceEncoder(loaded.model, loaded.tokenizer, read_pooling(tmp_path)).embed_texts(TEXTS)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def test_embed_command_on_a_modernbert_folder(tmp_path, capsys):
    """`attnlab embed FOLDER` goes through the one loader to the same mean-pooled vectors."""
    from attnlab.cli import main

    modernbert_folder(tmp_path / "m", "model", "h4")
    loaded = load_modernbert(tmp_path / "m")
    want = SentenceEncoder(loaded.model, loaded.tokenizer, read_pooling(tmp_path / "m")).embed_texts(TEXTS)
    capsys.readouterr()
    assert main(["embed", str(tmp_path / "m"), *TEXTS, "--json", "--device", "cpu"]) == 0
    torch.testing.assert_close(torch.tensor(json.loads(capsys.readouterr().out)["vectors"]), want)


@pytest.mark.parametrize(
    ("preset", "data", "head", "small"),
    [("sst2", "sst2", "sequence", ["--set=data.val_size=20"]), ("ud-pos", "ud", "token", [])],
)
def test_fine_tuning_starts_from_a_modernbert_folder(tmp_path, preset, data, head, small):
    """Classification and tagging with --init-from a ModernBERT folder: the run's encoder starts as
    the folder's (its first block's attention projection, read back, equals the folder's)."""
    from attnlab import load
    from attnlab.cli import main
    from helpers import FIXTURES

    modernbert_folder(tmp_path / "m", "mlm", "h4")
    out = tmp_path / "run"
    args = ["train", preset, "--data-dir", str(FIXTURES / data), "--init-from", str(tmp_path / "m"), "--out", str(out)]
    steps = ["--set=train.max_iters=2", "--set=train.eval_interval=2", "--set=train.lr_decay_iters=2"]
    steps += [*small, "--set=data.max_tokens=600", "--set=train.device=cpu"]
    tiny = ["--set=train.learning_rate=1e-12", "--set=train.min_lr=0", "--set=train.warmup_iters=0"]  # barely moves
    assert main([*args, *steps, *tiny, "--quiet"]) == 0
    run = load(out, checkpoint="last")
    source = load_modernbert(tmp_path / "m").model
    name = "blocks.0.attn.in_proj.weight"
    assert run.config.model.head == head and run.config.model.window_rope_theta is not None
    torch.testing.assert_close(run.model.state_dict()[name], source.state_dict()[name])


@pytest.mark.parametrize(
    ("changes", "needles"),
    [
        ({"attention_bias": True}, ["attention_bias=true", "biases on the attention projections"]),
        ({"norm_bias": True}, ["norm_bias=true", "a bias in every LayerNorm"]),
        ({"hidden_activation": "silu"}, ['hidden_activation="silu"', "gate function"]),
        ({"layer_types": ["full_attention"]}, ["layer_types must list 4"]),
        (
            {"rope_parameters": {"full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}}},
            ["rope_parameters.full_attention", "'linear'", "rescales"],
        ),
        ({"pad_token_id": 0}, ["pad_token_id=0", "padding token is id 3"]),
    ],
)
def test_unsupported_config_is_one_line_naming_the_field(tmp_path, changes, needles):
    modernbert_folder(tmp_path, "model", "h4")
    edit_config(tmp_path, **changes)
    with pytest.raises(CheckpointError) as e:
        load_modernbert(tmp_path)
    message = str(e.value)
    assert "\n" not in message and "config.json" in message, message
    for needle in needles:
        assert needle in message, message
