"""Helpers shared by test modules (importable because pyproject puts tests/ on pytest's pythonpath)."""

from pathlib import Path

from attnlab.cli import main

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


def _tiny_doc(name: str) -> dict:
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
    fixture), "sst2-bert", "sst2-bilstm" (SST-2 fixture), "pos-bert", "pos-bilstm" (UD fixture).
    Tests must only read it."""
    if name not in _SHARED:
        from attnlab.train import resolve, train

        run_dir = tmp_path_factory.mktemp(name) / "run"
        train(resolve(_tiny_doc(name)), run_dir, progress=False)
        _SHARED[name] = run_dir
    return _SHARED[name]


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
