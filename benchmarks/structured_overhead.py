"""The cost of structured outputs: tokens/s with every request constrained by a JSON Schema
against the same requests unconstrained, at batch 1 and at 16 requests at once.

Two levels (`--level`):

- `server` (the default): `attnlab serve` in a child process (benchmarks/serve_load.py's `Server`,
  `--max-batch 16`) on the Llama 125M shape with random weights (benchmarks/llamacpp_compare.py's
  folder: 12 layers, width 768, 12 query and 4 key/value heads, vocabulary 32,000; its byte-level
  BPE trained on Tiny Shakespeare with up to `--vocab` tokens) and a chat template, sent the same
  chat request with and without `response_format` json_schema (SCHEMA, a nested object), each
  with `max_tokens` `--tokens` and a seed of its own. Batch 1: `--requests` requests one after
  another; batch 16: 16 requests at once (threads). tokens/s: the completion tokens of `usage`
  over the wall time of the whole round, the median of `--rounds` rounds, the two kinds
  alternating within each round.
- `batcher`: `Batcher` steps alone, every row constrained (`GrammarMask`) or not, on a small
  random-weight GPT with a byte-level BPE of `--vocab` tokens; no HTTP, no tokenizer's decoding.

    python benchmarks/structured_overhead.py [--level server|batcher] [--vocab 32000] [--tokens 64]
        [--rounds 3] [--requests 4] [--threads 1] [--work DIR] [--json F]

SCHEMA's strings are long (`minLength`): no reply can end within `--tokens`, so every request
decodes all its tokens, constrained or not (the counts are printed: a shorter constrained reply
would carry its prefill over fewer tokens). Prints one JSON line per batch size: the median tokens/s
of each kind and their ratio.
"""

import argparse
import json
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from llamacpp_compare import hf_folder  # noqa: E402
from run_info import run_info  # noqa: E402
from serve_load import Server  # noqa: E402

SCHEMA = {
    "type": "object",
    "properties": {
        "place": {
            "type": "object",
            "properties": {"city": {"type": "string", "minLength": 200}, "act": {"type": "integer", "minimum": 1}},
            "required": ["city", "act"],
            "additionalProperties": False,
        },
        "lines": {"type": "array", "items": {"type": "string", "minLength": 200}, "minItems": 2},
    },
    "required": ["place", "lines"],
    "additionalProperties": False,
}
FORMAT = {"type": "json_schema", "json_schema": {"name": "scene", "schema": SCHEMA, "strict": True}}
TEMPLATE = (  # the shape of Zephyr's template
    "{% for m in messages %}{{ '<|' + m['role'] + '|>\n' + m['content'] + eos_token + '\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}"
)
ASK = [{"role": "user", "content": "ROMEO: What say you? Answer in JSON."}]
BATCHES = (1, 16)


def chat_folder(work: Path, vocab: int) -> Path:
    """The Llama 125M shape's random-weight folder with TEMPLATE as its chat template."""
    folder = hf_folder(work, "llama", tokenizer_vocab=vocab)
    config_file = folder / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    config_file.write_text(json.dumps(config | {"chat_template": TEMPLATE}, indent=1) + "\n")
    return folder


def one_request(http: httpx.Client, tokens: int, seed: int, constrained: bool) -> tuple[int, str]:
    """(completion tokens, finish_reason) of one chat request."""
    body = {"model": "lm", "messages": ASK, "max_tokens": tokens, "seed": seed, "temperature": 1.0}
    response = http.post("/v1/chat/completions", json=body | ({"response_format": FORMAT} if constrained else {}))
    response.raise_for_status()
    answer = response.json()
    if constrained and answer["choices"][0]["finish_reason"] == "stop":
        json.loads(answer["choices"][0]["message"]["content"])  # a finished constrained reply is JSON
    return answer["usage"]["completion_tokens"], answer["choices"][0]["finish_reason"]


def server_round(url: str, batch: int, args: argparse.Namespace, constrained: bool) -> tuple[float, list[int]]:
    """(tokens/s, each request's completion tokens) of one round: `--requests` requests one after
    another at batch 1, `batch` at once otherwise."""
    count = args.requests if batch == 1 else batch
    with httpx.Client(base_url=url, timeout=600) as http, ThreadPoolExecutor(batch) as pool:
        start = time.perf_counter()
        done = list(pool.map(lambda i: one_request(http, args.tokens, i, constrained), range(count)))
        elapsed = time.perf_counter() - start
    return sum(n for n, _ in done) / elapsed, [n for n, _ in done]


def measure_server(args: argparse.Namespace) -> list[dict]:
    folder = chat_folder(args.work, args.vocab)
    server = Server(folder, "--max-batch", str(max(BATCHES)), "--threads", str(args.threads))
    rows = []
    try:
        for batch in BATCHES:
            for constrained in (False, True):  # warm up: the first requests compile and allocate
                server_round(server.url, batch, argparse.Namespace(**vars(args) | {"tokens": 4}), constrained)
            rates: dict[bool, list[float]] = {False: [], True: []}
            counts: dict[bool, set[int]] = {False: set(), True: set()}
            for _ in range(args.rounds):
                for constrained in (False, True):
                    rate, n = server_round(server.url, batch, args, constrained)
                    rates[constrained].append(rate)
                    counts[constrained].update(n)
            rows.append(row(batch, rates, counts))
            print(json.dumps(rows[-1]), flush=True)
    finally:
        server.stop()
    return rows


def row(batch: int, rates: dict[bool, list[float]], counts: dict[bool, set[int]]) -> dict:
    plain, schema = statistics.median(rates[False]), statistics.median(rates[True])
    return {
        "batch": batch,
        "plain_tok_s": round(plain, 1),
        "schema_tok_s": round(schema, 1),
        "ratio": round(schema / plain, 3),
        "completion_tokens": {"plain": sorted(counts[False]), "schema": sorted(counts[True])},
    }


# -- Batcher steps alone ------------------------------------------------------------------------


def batcher_rate(batcher, prompts: list[list[int]], tokens: int, masks) -> tuple[float, list[int]]:
    """(tokens/s, each row's tokens) of decoding `prompts` to `tokens` tokens each."""
    from attnlab.decode.batching import Sequence
    from attnlab.decode.sampling import sampling_picker

    seqs = [
        Sequence(list(p), tokens, sampling_picker(1.0, generator=torch.Generator().manual_seed(i)), mask=masks(i))
        for i, p in enumerate(prompts)
    ]
    start = time.perf_counter()
    batcher.join_all(seqs)
    while len(batcher):
        batcher.step()
    elapsed = time.perf_counter() - start
    counts = [len(s.tokens) for s in seqs]
    return sum(counts) / elapsed, counts


def measure_batcher(args: argparse.Namespace) -> list[dict]:
    from attnlab.data.text import bundled_shakespeare
    from attnlab.data.tokenizers import BPETokenizer
    from attnlab.decode.batching import Batcher
    from attnlab.models import GPT, GPTConfig
    from attnlab.serve.structured import GrammarMask, _compile

    tok = BPETokenizer.train([bundled_shakespeare()], args.vocab)
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=tok.vocab_size, block_size=256, n_layers=4, n_heads=4, d_model=256)
    model = GPT(config).eval()
    matcher = _compile(SCHEMA, tok)
    rows = []
    for batch in BATCHES:
        batcher = Batcher(model, batch)
        prompts = [tok.encode("ROMEO: What say you?")] * batch
        batcher_rate(batcher, prompts, 4, lambda i: None)  # warm up
        rates: dict[bool, list[float]] = {False: [], True: []}
        counts: dict[bool, set[int]] = {False: set(), True: set()}
        for _ in range(args.rounds):
            for constrained in (False, True):
                masks = (lambda i: GrammarMask(matcher.deep_copy())) if constrained else (lambda i: None)
                rate, n = batcher_rate(batcher, prompts, args.tokens, masks)
                rates[constrained].append(rate)
                counts[constrained].update(n)
        rows.append(row(batch, rates, counts) | {"vocab": tok.vocab_size})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--level", choices=["server", "batcher"], default="server")
    parser.add_argument("--vocab", type=int, default=32_000, help="the BPE's tokens at most (32000)")
    parser.add_argument("--tokens", type=int, default=64, help="max_tokens of each request (64)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds each way; the median (3)")
    parser.add_argument("--requests", type=int, default=4, help="requests of a batch-1 round (4)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of the model (1)")
    parser.add_argument("--work", type=Path, default=Path("/tmp/attnlab-structured-overhead"))
    parser.add_argument("--json", type=Path, help="write the rows here too")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rows = measure_server(args) if args.level == "server" else measure_batcher(args)
    if args.json:
        args.json.write_text(json.dumps({"level": args.level, "rows": rows, "run": run_info()}, indent=2) + "\n")


if __name__ == "__main__":
    main()
