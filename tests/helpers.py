"""Helpers shared by test modules (importable because pyproject puts tests/ on pytest's pythonpath)."""

import contextlib
import csv
import re
from html.parser import HTMLParser
from pathlib import Path

import torch

from attnlab.cli import main
from attnlab.config import merge, parse_overrides, read_toml
from attnlab.train import RunConfig, resolve

FIXTURE = Path(__file__).parent / "fixtures" / "multi30k"
SPLITS = ("train", "val", "test_2016_flickr", "test_2017_flickr")


def cli(capsys, *args: str) -> tuple[int, str, str]:
    """Run `attnlab ARGS` in this process; returns (exit code, stdout, stderr)."""
    try:
        code = main([str(a) for a in args])
    except SystemExit as e:  # argparse usage errors and --help
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


def run_config(toml: Path, *overrides: str) -> RunConfig:
    """The run configuration of a TOML file with `section.key=value` overrides, as `attnlab train`
    builds it."""
    return resolve(merge(read_toml(toml), parse_overrides(list(overrides))))


def losses(run_dir: Path) -> list[tuple[str, str]]:
    """(train_loss, val_loss) of each metrics.csv row of a run, as written ("" where a row has none)."""
    with open(run_dir / "metrics.csv", newline="") as f:
        return [(r["train_loss"], r["val_loss"]) for r in csv.DictReader(f)]


def assert_user_error(result: tuple[int, str, str], *fragments: str) -> None:
    code, _, err = result
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


MODELS = {
    "transformer": {
        "kind": "transformer",
        "d_model": 64,
        "n_heads": 4,
        "n_encoder_layers": 2,
        "n_decoder_layers": 2,
        "d_ff": 128,
        "dropout": 0.0,
    },
    "rnn": {"kind": "rnn", "emb_dim": 64, "hidden_size": 128, "dropout": 0.0},
    "rnn-attention": {"kind": "rnn-attention", "emb_dim": 64, "hidden_size": 96, "dropout": 0.0},
}


def translation_doc(data_dir: Path, kind: str = "transformer", **train) -> dict:
    return {
        "task": "translation",
        "model": dict(MODELS[kind]),
        "data": {"data_dir": str(data_dir), "vocab_size": 500, "max_tokens": 4000},
        "train": {
            "max_iters": 150,
            "learning_rate": 3e-3,
            "min_lr": 3e-4,
            "warmup_iters": 20,
            "eval_interval": 150,
            "log_interval": 50,
            "weight_decay": 0.0,
            **train,
        },
    }


# -- encoder tasks: masked LM, classification, tagging -----------------------------------------
FIXTURES = Path(__file__).parent / "fixtures"
SST2 = FIXTURES / "sst2"
UD = FIXTURES / "ud"
WIKITEXT = FIXTURES / "wikitext"

ENCODERS = {
    "bert": {"kind": "bert", "max_len": 64, "d_model": 32, "n_heads": 2, "n_layers": 2, "d_ff": 64, "dropout": 0.0},
    "bilstm": {"kind": "bilstm", "d_embed": 32, "hidden": 32, "n_layers": 1, "dropout": 0.0},
}
ENCODER_DATA = {
    "mlm": {"vocab_size": 400},
    "classification": {"vocab_size": 400, "val_size": 40, "max_tokens": 600},
    "tagging": {"vocab_size": 400, "max_tokens": 600},
}


def encoder_doc(task: str, data_dir: Path, kind: str = "bert", data: dict | None = None, **train) -> dict:
    """A tiny config of an encoder task ("mlm", "classification" or "tagging") on a fixture folder."""
    return {
        "task": task,
        "model": dict(ENCODERS[kind]),
        "data": {"data_dir": str(data_dir), **ENCODER_DATA[task], **(data or {})},
        "train": {
            "max_iters": 40,
            "batch_size": 16,
            "learning_rate": 3e-3,
            "min_lr": 3e-4,
            "warmup_iters": 5,
            "eval_interval": 20,
            "eval_iters": 2,
            "log_interval": 10,
            "weight_decay": 0.0,
            "device": "cpu",
            **train,
        },
    }


def conllu_words(path: Path) -> list[list[list[str]]]:
    """The integer-ID lines of a CoNLL-U file as fields, grouped by sentence (an independent reader)."""
    sentences: list[list[list[str]]] = [[]]
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            if sentences[-1]:
                sentences.append([])
            continue
        fields = line.split("\t")
        if not line.startswith("#") and fields[0].isdigit():
            sentences[-1].append(fields)
    return [s for s in sentences if s]


_SHARED: dict[str, Path] = {}


def write_fifty_pairs(folder: Path) -> Path:
    """A Multi30k-shaped `folder` whose every split is the same 50 real training pairs."""
    import gzip

    folder.mkdir(parents=True, exist_ok=True)
    for lang in ("de", "en"):
        lines = gzip.decompress((FIXTURE / f"train.{lang}.gz").read_bytes()).decode("utf-8").splitlines()[:50]
        for split in SPLITS:
            (folder / f"{split}.{lang}.gz").write_bytes(gzip.compress(("\n".join(lines) + "\n").encode("utf-8")))
    return folder


# Translation runs that train in a few seconds: 4 steps, greedy validation decoding, small vocabulary.
TINY_MT = {
    "transformer": {"d_model": 32, "n_heads": 2, "d_ff": 64, "n_encoder_layers": 1, "n_decoder_layers": 2},
    "rnn-attention": {"emb_dim": 16, "hidden_size": 16},
}


def _tiny_doc(name: str, folder: Path) -> dict:
    if name == "lm":  # the first 20,000 characters of Tiny Shakespeare
        from attnlab.data.text import bundled_shakespeare

        corpus = folder / "corpus.txt"
        corpus.write_text(bundled_shakespeare()[:20_000], encoding="utf-8")
        return {
            "task": "lm",
            "model": {"block_size": 16, "n_layers": 2, "n_heads": 2, "d_model": 32},
            "data": {"path": str(corpus), "tokenizer": "char"},
            "train": {
                "max_iters": 8,
                "batch_size": 4,
                "warmup_iters": 2,
                "eval_interval": 4,
                "eval_iters": 2,
                "log_interval": 2,
            },
        }
    if name.startswith("mt-"):
        kind = name.removeprefix("mt-")
        doc = translation_doc(write_fifty_pairs(folder / "data"), kind, max_iters=4, eval_interval=4, warmup_iters=1)
        doc["model"].update(TINY_MT[kind])
        doc["data"].update(vocab_size=300, eval_beam=1)
        return doc
    if name == "mlm":
        return encoder_doc("mlm", WIKITEXT)
    if name == "sst2-bert":
        return encoder_doc("classification", SST2, max_iters=100, learning_rate=1e-3, warmup_iters=10, eval_interval=50)
    if name == "sst2-bilstm":
        return encoder_doc("classification", SST2, "bilstm", learning_rate=1e-2)
    if name in ("pos-bert", "pos-bilstm"):
        return encoder_doc("tagging", UD, name.split("-")[1], learning_rate=3e-3 if name == "pos-bert" else 1e-2)
    raise KeyError(name)


def shared(tmp_path_factory, name: str) -> Path:
    """A tiny run trained once per test session, whichever module asks first: "mlm" (WikiText
    fixture), "sst2-bert", "sst2-bilstm" (SST-2 fixture), "pos-bert", "pos-bilstm" (UD fixture),
    "lm" (a character GPT on Tiny Shakespeare), "mt-transformer", "mt-rnn-attention" (50 Multi30k
    pairs). Tests must only read it."""
    if name not in _SHARED:
        from attnlab.train import resolve, train

        folder = tmp_path_factory.mktemp(name)
        run_dir = folder / "run"
        train(resolve(_tiny_doc(name, folder)), run_dir, progress=False)
        _SHARED[name] = run_dir
    return _SHARED[name]


ONE_LAYER_LM = """
task = "lm"
[model]
block_size = 16
n_layers = 1
n_heads = 2
d_model = 32
[data]
path = "{corpus}"
tokenizer = "char"
[train]
max_iters = 16
batch_size = 4
learning_rate = 3e-3
min_lr = 3e-4
warmup_iters = 2
eval_interval = 4
eval_iters = 2
log_interval = 5
device = "cpu"
"""
"""A one-layer character LM of 16 steps, as a TOML text: the base of the sweep and study tests
(`.format(corpus=PATH)`)."""


HF_SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def hf_bert_folder(folder: Path, seed: int = 0) -> Path:
    """A tiny random Hugging Face `BertForMaskedLM` saved with `save_pretrained`, beside a vocab.txt of
    the five BERT specials and the 300 most frequent words of the SST-2 fixture (nothing downloaded)."""
    import collections

    import torch
    import transformers

    counts = collections.Counter((SST2 / "train.tsv").read_text(encoding="utf-8").lower().split())
    words = [w for w, _ in counts.most_common() if w not in ("sentence", "label", "0", "1")][:300]
    vocab = HF_SPECIAL + sorted(words)
    torch.manual_seed(seed)
    config = transformers.BertConfig(
        vocab_size=len(vocab),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
        pad_token_id=0,
    )
    transformers.BertForMaskedLM(config).save_pretrained(folder)
    (folder / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    return folder


# -- HTML pages (attention view, report) ------------------------------------------------------------
VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}
# Anything that could make a page load from elsewhere; `data:` URIs are inside the page.
EXTERNAL = re.compile(r"https?:|//cdn|@import|url\(|\b(src|href)\s*=\s*(?![\"']?data:)", re.IGNORECASE)


class Page(HTMLParser):
    """A strict reading of a page: every element closed in order, the data scripts and the options
    of each `<select>` collected."""

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []
        self.errors: list[str] = []
        self.doctype = ""
        self.json_scripts: dict[str, str] = {}
        self.selects: dict[str, list[tuple[str, str, bool]]] = {}
        self._script_id: str | None = None
        self._select: str | None = None
        self._option: tuple[str, bool] | None = None
        self.feed(text)
        self.close()
        if self.stack:
            self.errors.append(f"unclosed: {self.stack}")

    def handle_decl(self, decl: str) -> None:
        self.doctype = decl

    def handle_starttag(self, tag: str, attrs: list) -> None:
        a = dict(attrs)
        if tag not in VOID:
            self.stack.append(tag)
        if tag == "script" and a.get("type") == "application/json":
            self._script_id = a["id"]
        if tag == "select":
            self._select = a.get("class") or a.get("id")
            self.selects[self._select] = []
        if tag == "option":
            self._option = (a["value"], "selected" in a)

    def handle_endtag(self, tag: str) -> None:
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes {self.stack[-1:] or 'nothing'}")
        else:
            self.stack.pop()
        if tag == "script":
            self._script_id = None
        if tag == "select":
            self._select = None

    def handle_data(self, data: str) -> None:
        if self._script_id is not None:
            self.json_scripts[self._script_id] = self.json_scripts.get(self._script_id, "") + data
        if self._option is not None and self._select is not None:
            value, selected = self._option
            self.selects[self._select].append((value, data, selected))
            self._option = None


def read_page(path) -> Page:
    text = path.read_text(encoding="utf-8")
    page = Page(text)
    assert page.errors == []
    assert page.doctype.lower() == "doctype html"
    assert EXTERNAL.search(text) is None, EXTERNAL.search(text)
    return page


@contextlib.contextmanager
def threads(n: int):
    """n intra-op threads inside the block. The suite runs single-threaded (conftest); attnlab's C++
    kernels share their work between threads (the fused block gives each thread its own sequences
    and adds up their parameter gradients; the optimizer step, chunks of the parameters): tests
    check that too."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


FIXTURES = Path(__file__).parent / "fixtures"
MEDIA_SHORT = [
    *("--set", "train.max_iters=2", "--set", "train.eval_interval=2", "--set", "train.log_interval=1"),
    "--quiet",
]
MEDIA_IMAGE_DATA = [
    "--data-dir",
    str(FIXTURES / "fashion-mnist"),
    "--set",
    "data.val_size=20",
    "--set",
    "data.eval_images=20",
]
MEDIA_RUNS = {
    "pixelcnn": ["fashion-pixelcnn", *MEDIA_IMAGE_DATA, "--set", "model.hidden=4", "--set", "model.n_layers=1"],
    "gated": ["fashion-gated-pixelcnn", *MEDIA_IMAGE_DATA, "--set", "model.hidden=4", "--set", "model.n_layers=2"],
    "igpt": ["fashion-igpt", *MEDIA_IMAGE_DATA, "--set", "model.n_layers=1", "--set", "model.d_model=16"],
    "vit": [
        "fashion-vit",
        *MEDIA_IMAGE_DATA,
        "--set",
        "model.n_layers=1",
        "--set",
        "model.d_model=16",
        "--set",
        "model.d_ff=16",
    ],
    "hybrid": [
        *("fashion-vit-hybrid", *MEDIA_IMAGE_DATA),
        *("--set", "model.n_layers=1", "--set", "model.stem_channels=[4,8,8]"),
    ],
    "cnn": ["fashion-cnn", *MEDIA_IMAGE_DATA, "--set", "model.hidden=8"],
    "wavenet": [
        "fsdd-wavenet",
        "--data-dir",
        str(FIXTURES / "fsdd"),
        *("--set", "data.val_size=4", "--set", "data.eval_clips=2", "--set", "data.segment=300"),
        *("--set", "model.layers_per_block=3", "--set", "model.residual_channels=4", "--set", "model.skip_channels=4"),
        *("--set", "data.condition_on_speaker=true"),
    ],
}


def train_media_runs(root: Path, names: tuple[str, ...] | None = None) -> dict[str, Path]:
    """Tiny image and audio runs (two training steps each, on the fixture slices), trained as a user
    trains them, into `root`/NAME: `names` of MEDIA_RUNS, or all of them."""
    names = tuple(MEDIA_RUNS) if names is None else names
    for name in names:
        assert main(["train", *MEDIA_RUNS[name], *MEDIA_SHORT, "--out", str(root / name)]) == 0
    return {name: root / name for name in names}
