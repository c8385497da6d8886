"""The models of the structured-output, chat-logprobs and context tests: byte-level BPE tokenizers,
so that every character of JSON is a token the model can emit (the shared character "lm" run's
vocabulary, Tiny Shakespeare's characters, has no "{").

- `chat_folder`: a random-weight Llama in a Hugging Face folder, with Zephyr's chat template and
  a context of 512 positions (hf_folders' models have 64: too few for a JSON reply after a prompt);
- `json_run`: an attnlab language-model run with a byte-level BPE trained on JSON records beside
  Tiny Shakespeare, trained for a few dozen steps (its replies start to look like the records).
"""

import json
import random
from pathlib import Path

import torch

from attnlab.data.text import bundled_shakespeare
from hf_folders import BOS, EOS, write_tokenizer
from serve.test_chat import chat_config
from serve.test_chat_template import ZEPHYR

CONTEXT = 512
JSON_BLOCK = 128


def chat_folder(folder: Path) -> Path:
    """A random-weight (seed 0) two-layer Llama of CONTEXT positions with a chat template."""
    import transformers

    folder.mkdir(parents=True)
    tok = write_tokenizer(folder)
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=tok.get_vocab_size(),
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=CONTEXT,
        bos_token_id=BOS,
        eos_token_id=EOS,
    )
    transformers.LlamaForCausalLM(config).eval().save_pretrained(folder)
    chat_config(folder, ZEPHYR)
    return folder


def json_records(n: int, seed: int = 0) -> list[str]:
    """n small JSON objects of the shape the tests ask for (names, ages, tags, nested places)."""
    rng = random.Random(seed)
    names = ["Romeo", "Juliet", "Lear", "Hamlet", "Viola", "Puck"]
    records = []
    for _ in range(n):
        record = {
            "name": rng.choice(names),
            "age": rng.randint(1, 99),
            "tags": rng.sample(["king", "lover", "fool", "ghost"], rng.randint(0, 3)),
            "place": {"city": rng.choice(["Verona", "Elsinore", "Athens"]), "act": rng.randint(1, 5)},
        }
        records.append(json.dumps(record))
    return records


def json_run(root: Path) -> Path:
    """A tiny trained attnlab run over JSON records and Shakespeare, with a byte-level BPE."""
    from attnlab.train import resolve, train

    root.mkdir(parents=True)
    corpus = root / "corpus.txt"
    corpus.write_text("\n".join(json_records(400)) + "\n" + bundled_shakespeare()[:10_000], encoding="utf-8")
    doc = {
        "task": "lm",
        "model": {"block_size": JSON_BLOCK, "n_layers": 2, "n_heads": 2, "d_model": 32},
        "data": {"path": str(corpus), "tokenizer": "bpe", "vocab_size": 320},
        "train": {"max_iters": 300, "batch_size": 16, "learning_rate": 1e-2, "warmup_iters": 10, "eval_interval": 300}
        | {"eval_iters": 2, "log_interval": 100},
    }
    train(resolve(doc), root / "run", progress=False)
    return root / "run"
