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
