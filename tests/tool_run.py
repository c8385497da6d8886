"""A tiny chat run that has memorized one conversation with a calculator call, trained in the
test (a few seconds): asked "What is 347 * 12?", it calls the calculator with "347 * 12" and, once
the answer 4164 is in its context, says "347 * 12 = 4164." A model whose replies are known, so a
test can check the tool loop around them."""

import json
from pathlib import Path

QUESTION = "What is 347 * 12?"
EXPRESSION = "347 * 12"
ANSWER = "347 * 12 = 4164."
CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "calculator", "arguments": json.dumps({"expression": EXPRESSION})},
}
CONVERSATION = [
    {"role": "user", "content": QUESTION},
    {"role": "assistant", "content": None, "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": "call_1", "content": "4164"},
    {"role": "assistant", "content": ANSWER},
]
TOML = """task = "chat"
[model]
block_size = 256
n_layers = 2
n_heads = 2
d_model = 48
dropout = 0.0
[data]
path = "{path}"
vocab_size = 500
val_fraction = 0.25
[train]
max_iters = {steps}
batch_size = 4
learning_rate = 3e-3
min_lr = 1e-3
warmup_iters = 10
eval_interval = {steps}
eval_iters = 1
log_interval = 50
"""


def train_tool_run(folder: Path, steps: int = 200) -> Path:
    """The run folder of a chat run trained on CONVERSATION alone (copies of one line)."""
    from attnlab.cli import main

    data = folder / "calls.jsonl"
    data.write_text((json.dumps({"messages": CONVERSATION}) + "\n") * 8, encoding="utf-8")
    toml = folder / "calls.toml"
    toml.write_text(TOML.format(path=data.as_posix(), steps=steps), encoding="utf-8")
    assert main(["train", str(toml), "--out", str(folder / "run")]) == 0
    return folder / "run"
