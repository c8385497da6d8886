"""`train.lora` on the chat task, from a tiny pretrained attnlab run: the chat task adds its two
special tokens to the base's vocabulary, so the base is grown as the task grows it (new rows the
mean row) and the token tables train with the adapters (frozen, both new tokens would stay the
same mean row); nothing else of the base moves, and the checkpoint holds the adapters and the
tables alone. At initialisation a LoRA model is its base (B = 0), so its first loss is full
fine-tuning's: the same conversations, the same tokens trained. The run is served by `attnlab
serve` and answers a chat completion through the openai client, rendered by the run's template,
as the Python API (`attnlab.Chat`) answers."""

import csv
from pathlib import Path

import openai
import pytest
import torch
from safetensors import safe_open

import attnlab
from attnlab.cli import main
from attnlab.data.text import bundled_shakespeare
from attnlab.train.lora import TOKEN_TABLES

pytestmark = pytest.mark.slow

CONVERSATIONS = Path("tests/fixtures/chat/conversations.jsonl").resolve()
BASE_TOML = """task = "lm"
[model]
block_size = 256
n_layers = 2
n_heads = 2
d_model = 32
[data]
path = "{corpus}"
tokenizer = "bpe"
vocab_size = 300
[train]
max_iters = 4
batch_size = 4
eval_interval = 4
eval_iters = 1
"""
CHAT_TOML = """task = "chat"
[data]
path = "{path}"
init_from = "{base}"
val_fraction = 0.25
[train]
max_iters = {steps}
batch_size = 4
learning_rate = 3e-2
eval_interval = 10
eval_iters = 1
log_interval = 1
"""
LORA = """[train.lora]
rank = 4
targets = ["query", "value", "ff-out"]
"""


def train(folder: Path, name: str, toml: str) -> Path:
    (folder / f"{name}.toml").write_text(toml, encoding="utf-8")
    assert main(["train", str(folder / f"{name}.toml"), "--out", str(folder / name), "--quiet"]) == 0
    return folder / name


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("chat_lora")
    (folder / "corpus.txt").write_text(bundled_shakespeare()[:20_000], encoding="utf-8")
    base = train(folder, "base", BASE_TOML.format(corpus=(folder / "corpus.txt").as_posix()))
    chat = CHAT_TOML.format(path=CONVERSATIONS.as_posix(), base=base.as_posix(), steps="{steps}")
    lora = train(folder, "lora", chat.format(steps=20) + LORA)
    full = train(folder, "full", chat.format(steps=1))
    return {"base": base, "lora": lora, "full": full}


def metrics(run_dir: Path) -> list[dict[str, str]]:
    with open(run_dir / "metrics.csv", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def test_only_the_adapters_and_the_token_tables_train(runs):
    base = attnlab.load(runs["base"]).model.state_dict()
    tuned = attnlab.load(runs["lora"], merge_lora=False).model.state_dict()
    adapters = {k for k in tuned if ".lora_" in k}
    assert len(adapters) == 2 * 2 * 3  # 2 blocks, A and B, query, value and ff-out
    assert all(torch.count_nonzero(tuned[k]) > 0 for k in adapters if ".lora_B" in k)  # B trained away from 0
    for name, value in tuned.items():
        if name in adapters or name in TOKEN_TABLES:
            continue
        torch.testing.assert_close(value, base[name.replace(".base.", ".")], rtol=0, atol=0, msg=name)
    # The tables: the base's rows, then the two new tokens' rows, all trained.
    table = tuned["token_embedding.weight"]
    assert table.shape == (base["token_embedding.weight"].size(0) + 2, 32)
    assert not torch.equal(table[:300], base["token_embedding.weight"])
    assert not torch.equal(table[300], table[301])  # <|im_start|> and <|im_end|> became two tokens
    with safe_open(runs["lora"] / "model.safetensors", "pt") as f:
        saved = set(f.keys())
    assert saved == adapters | {"token_embedding.weight"}  # the tied table once; not the base's blocks
    state = torch.load(runs["lora"] / "train_state.pt", weights_only=True)["optimizer"]
    assert len(state["state"]) == len(adapters) + 1  # the adapters and the (tied) table


def test_the_loss_falls(runs):
    losses = [float(r["train_loss"]) for r in metrics(runs["lora"]) if r["kind"] == "train"]
    assert len(losses) == 20 and losses[-1] < losses[0] - 0.5


def test_the_first_loss_is_full_fine_tunings(runs):
    """B = 0: the LoRA model starts as the base, grown as full fine-tuning grows it; the same first
    evaluation means the same conversations and the same trained tokens (the loss mask)."""
    lora, full = (metrics(runs[k])[0] for k in ("lora", "full"))
    assert lora["kind"] == full["kind"] == "eval" and lora["step"] == full["step"] == "0"
    assert (lora["train_loss"], lora["val_loss"]) == (full["train_loss"], full["val_loss"])
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        assert (runs["lora"] / name).read_bytes() == (runs["full"] / name).read_bytes()


@pytest.fixture(scope="module")
def served(runs):
    from attnlab.serve.app import create_app
    from attnlab.serve.registry import load_runs
    from attnlab.serve.server import BackgroundServer

    with BackgroundServer(create_app(load_runs([f"sft={runs['lora']}"]))) as running:
        yield openai.OpenAI(base_url=f"{running.url}/v1", api_key="x", max_retries=0)


def test_the_lora_chat_run_is_served_with_its_template(runs, served):
    ask = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour."}]
    answer = served.chat.completions.create(model="sft", messages=ask, temperature=0, max_tokens=12)
    chat = attnlab.Chat(runs["lora"], system="Be brief.", tools=(), max_new_tokens=12)
    assert answer.choices[0].message.content == chat.say("Name a colour.")
    prompt = chat.template.encode(chat.tokenizer, ask)
    assert answer.usage.prompt_tokens == len(prompt)
    assert chat.tokenizer.decode(prompt).endswith("<|im_start|>assistant\n")
