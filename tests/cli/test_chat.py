"""attnlab chat through a pseudo-terminal, on a tiny run trained with task chat: replies stream
back, /save writes the history as JSONL, /reset forgets it, Ctrl-C stops a reply without leaving,
Ctrl-D leaves with status 0; a model without a chat template is one line and status 2."""

import json
import os
import pty
import select
import sys
import time

import pytest

from attnlab.cli import main

pytestmark = pytest.mark.slow

TOML = """task = "chat"
[model]
block_size = 128
n_layers = 1
n_heads = 2
d_model = 16
[data]
path = "{path}"
vocab_size = 400
val_fraction = 0.2
[train]
max_iters = 3
batch_size = 4
eval_interval = 3
eval_iters = 1
log_interval = 1
"""


@pytest.fixture(scope="module")
def chat_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("chat")
    toml = folder / "chat.toml"
    toml.write_text(TOML.format(path=os.path.abspath("tests/fixtures/chat/conversations.jsonl")), encoding="utf-8")
    assert main(["train", str(toml), "--out", str(folder / "run")]) == 0
    return folder / "run"


def read_until(fd: int, marker: bytes, timeout: float = 60) -> bytes:
    out, end = b"", time.monotonic() + timeout
    while marker not in out:
        assert time.monotonic() < end, f"no {marker!r} in {out!r}"
        if select.select([fd], [], [], 0.5)[0]:
            try:
                out += os.read(fd, 4096)
            except OSError:
                break
    return out


def test_a_conversation_through_a_terminal(chat_run, tmp_path):
    saved = tmp_path / "talk.jsonl"
    pid, fd = pty.fork()
    if pid == 0:  # the child: attnlab chat on the pseudo-terminal
        os.execv(
            sys.executable,
            [
                sys.executable,
                "-m",
                "attnlab",
                "chat",
                str(chat_run),
                "--system",
                "Be brief.",
                "-n",
                "100000",
                "--temperature",
                "1",
                "--seed",
                "0",
            ],
        )
    read_until(fd, b">>> ")
    os.write(fd, b"Say hello.\n")
    streamed = read_until(fd, b"Say hello.").partition(b"Say hello.")[2]
    while not streamed.strip():  # the reply has begun (a loaded machine may take a while): stop it
        assert select.select([fd], [], [], 60)[0], "no reply streamed within a minute"
        streamed += os.read(fd, 4096)
    os.write(fd, b"\x03")
    out = read_until(fd, b">>> ")
    # Ctrl-C stops the reply, or (a tiny model's reply may end first) lands at the prompt: either way it stays
    assert b"(stopped)" in out or b"Use Ctrl-D or /bye to leave." in out
    os.write(fd, f"/save {saved}\n".encode())
    assert b"(saved 3 messages" in read_until(fd, b">>> ")
    doc = json.loads(saved.read_text(encoding="utf-8"))
    assert [m["role"] for m in doc["messages"]] == ["system", "user", "assistant"]
    assert doc["messages"][1]["content"] == "Say hello." and doc["messages"][2]["content"]
    os.write(fd, b"/reset\n")
    assert b"forgotten" in read_until(fd, b">>> ")
    os.write(fd, b"\x04")  # Ctrl-D
    _, status = os.waitpid(pid, 0)
    os.close(fd)
    assert os.WEXITSTATUS(status) == 0


def test_a_run_without_a_chat_template_is_one_line(tiny_toml, tmp_path, capsys):
    assert main(["train", str(tiny_toml), "--out", str(tmp_path / "lm")]) == 0
    capsys.readouterr()
    assert main(["chat", str(tmp_path / "lm")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "has no chat template" in err and "chat-sft" in err


def test_the_chat_sft_preset_trains_on_a_jsonl_and_asks_for_one(tmp_path, capsys):
    conversations = os.path.abspath("tests/fixtures/chat/conversations.jsonl")
    assert main(["train", "chat-sft", "--out", str(tmp_path / "none")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "data.path is empty" in err and not (tmp_path / "none").exists()
    small = ["model.block_size=128", "model.n_layers=1", "model.d_model=16", "model.n_heads=2", "data.vocab_size=400"]
    steps = ["train.max_iters=2", "train.eval_interval=2", "train.eval_iters=1", f'data.path="{conversations}"']
    args = [arg for pair in zip(["--set"] * 9, small + steps, strict=True) for arg in pair]
    assert main(["train", "chat-sft", "--out", str(tmp_path / "run"), *args]) == 0
    assert (tmp_path / "run" / "chat_template.jinja").is_file()


def test_data_dir_reads_a_folders_train_and_val_files(tmp_path, capsys):
    lines = open("tests/fixtures/chat/conversations.jsonl", encoding="utf-8").read().splitlines()
    folder = tmp_path / "conversations"
    folder.mkdir()
    (folder / "train.jsonl").write_text("\n".join(lines[:9]) + "\n", encoding="utf-8")
    (folder / "val.jsonl").write_text("\n".join(lines[9:]) + "\n", encoding="utf-8")
    small = ["model.block_size=128", "model.n_layers=1", "model.d_model=16", "model.n_heads=2", "data.vocab_size=400"]
    steps = ["train.max_iters=1", "train.eval_interval=1", "train.eval_iters=1"]
    args = [arg for pair in zip(["--set"] * 8, small + steps, strict=True) for arg in pair]
    out = tmp_path / "run"
    assert main(["train", "chat-sft", "--data-dir", str(folder), "--out", str(out), *args]) == 0
    import tomllib

    data = tomllib.loads((out / "config.toml").read_text(encoding="utf-8"))["data"]
    assert data["data_dir"] == str(folder)
