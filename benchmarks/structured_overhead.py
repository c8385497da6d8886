"""The cost of structured outputs in continuous batching: tokens/s of `Batcher` steps with every
row constrained by a JSON Schema (`attnlab.serve.structured.GrammarMask`, llguidance) against the
same rows unconstrained, at batch 1 and at 16 rows, on a random-weight GPT with a byte-level BPE
of `--vocab` tokens trained on Tiny Shakespeare.

    python benchmarks/structured_overhead.py [--vocab 8192] [--tokens 64] [--rounds 3] [--threads 1]

The schema is an array of at least 1000 strings: it never ends within `--tokens`, so every row
decodes all its tokens, constrained or not. Prints one JSON line per batch size: the median
tokens/s of each and their ratio.
"""

import argparse
import json
import statistics
import time

import torch

SCHEMA = {"type": "array", "items": {"type": "string"}, "minItems": 1000}


def tokens_per_second(batcher, prompts: list[list[int]], tokens: int, masks) -> float:
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
    return sum(len(s.tokens) for s in seqs) / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

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
    for batch in (1, 16):
        batcher = Batcher(model, batch)
        prompts = [tok.encode("ROMEO: What say you?")] * batch
        tokens_per_second(batcher, prompts, 4, lambda i: None)  # warm up
        plain, constrained = [], []
        for _ in range(args.rounds):
            plain.append(tokens_per_second(batcher, prompts, args.tokens, lambda i: None))
            constrained.append(
                tokens_per_second(batcher, prompts, args.tokens, lambda i: GrammarMask(matcher.deep_copy()))
            )
        p, c = statistics.median(plain), statistics.median(constrained)
        row = {"batch": batch, "vocab": tok.vocab_size, "plain_tok_s": round(p, 1), "schema_tok_s": round(c, 1)}
        print(json.dumps(row | {"ratio": round(c / p, 3)}))


if __name__ == "__main__":
    main()
