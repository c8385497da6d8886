"""Greedy decoding of a Llama-shaped model (or a Mixtral-shaped one): attnlab's fused C++ step, its
PyTorch path and `transformers`' `generate`, side by side in one process.

A random-weight `LlamaForCausalLM` (or `MixtralForCausalLM`) is saved by `transformers` and loaded
by `attnlab.models.hf.load_causal_lm`, so both libraries hold the same weights. Batch 1, a prompt of
`--prompt` tokens, `--new-tokens` new ones, fp32 on the CPU (and the fused step with its weights
stored as bf16 and int8 too, `--weights`); the peers alternate within every repeat
(`attnlab.studies.bench.compare`), medians of new tokens/s. The default shape is issue 48's
Llama-shaped model of about 110M parameters: 12 layers, width 768, 12 query heads and 4 key/value
heads, feed-forward width 2048, vocabulary 32,000.

    python benchmarks/decode_llama.py [--family llama|mixtral] [--shape 12x12x768] [--kv-heads 4]
        [--ffn 2048] [--vocab 32000] [--experts 8] [--threads 1] [--repeats 3] [--weights fp32,bf16,int8]
        [--json F]

Prints one JSON object: the run, the shape, tokens/s per peer ("fused" with fp32 weights,
"fused-bf16", "fused-int8") and the ratios; whether the fused step gave the PyTorch path's tokens,
whether `transformers` gave them too, and how many of the first tokens each stored precision kept
(random weights: close logits, but a near tie may go the other way); the bytes of weights a step
reads in each precision.
"""

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch
import transformers

from attnlab.accel.fused import WEIGHT_FORMATS, extension, supports
from attnlab.models.hf import load_llama, load_mixtral
from attnlab.studies.bench.compare import attnlab_generate, compare, transformers_generate
from attnlab.studies.bench.peaks import BYTES_PER_WEIGHT

sys.path.insert(0, str(Path(__file__).parent))
from run_info import run_info  # noqa: E402


def hf_model(args: argparse.Namespace) -> torch.nn.Module:
    """The random-weight (seed 0) `transformers` model of the shape asked for, in eval mode."""
    layers, heads, width = map(int, args.shape.split("x"))
    torch.manual_seed(0)
    config = dict(
        vocab_size=args.vocab,
        hidden_size=width,
        intermediate_size=args.ffn,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=args.kv_heads,
        max_position_embeddings=args.prompt + args.new_tokens,
        bos_token_id=None,
        eos_token_id=None,
        tie_word_embeddings=False,
    )
    if args.family == "mixtral":
        mixtral = transformers.MixtralConfig(num_local_experts=args.experts, num_experts_per_tok=2, **config)
        return transformers.MixtralForCausalLM(mixtral).eval()
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**config)).eval()


def stored_weights(outputs: dict[str, torch.Tensor], weights: str, prompt: int, model: torch.nn.Module) -> dict:
    """For the fused step with `weights`: its speed-up over fp32's, how many new tokens it kept
    equal to fp32's before the first difference, and the bytes of weights a step reads."""
    fp32, stored = outputs["fused"][0, prompt:], outputs[f"fused-{weights}"][0, prompt:]
    differ = (fp32 != stored).nonzero()
    n = sum(p.numel() for p in model.parameters()) - model.get_input_embeddings().weight.numel()
    return {
        "same_tokens_as_fp32": int(differ[0, 0]) if differ.numel() else fp32.numel(),
        "weight_bytes_read": int(n * BYTES_PER_WEIGHT[weights]),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--family", choices=["llama", "mixtral"], default="llama")
    p.add_argument("--shape", default="12x12x768", help="layers x query heads x width")
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--ffn", type=int, default=2048, help="feed-forward hidden width (each expert's)")
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--experts", type=int, default=8, help="Mixtral's experts a layer (2 a token)")
    p.add_argument("--prompt", type=int, default=16, help="prompt tokens")
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--weights", default="fp32,bf16,int8", help="the fused step's weight formats, comma-separated")
    p.add_argument("--json", type=Path, help="also write the result here")
    args = p.parse_args()
    formats = args.weights.split(",")
    if "fp32" not in formats or not set(formats) <= set(WEIGHT_FORMATS):
        raise SystemExit(f"--weights: fp32 and any of {', '.join(WEIGHT_FORMATS)}, comma-separated")
    torch.set_num_threads(args.threads)
    if extension() is None:
        raise SystemExit("the fused decoding step could not be built here (see the warning above)")
    theirs = hf_model(args)
    with tempfile.TemporaryDirectory() as folder:
        theirs.save_pretrained(folder)
        ours = (load_mixtral if args.family == "mixtral" else load_llama)(folder)
    if not supports(ours, ours.new_cache(1)):
        raise SystemExit("the fused step does not cover this model")
    prompt = torch.randint(0, args.vocab, (1, args.prompt), generator=torch.Generator().manual_seed(0))
    outputs: dict[str, torch.Tensor] = {}
    fns = {
        "fused": lambda: attnlab_generate(ours, prompt, args.new_tokens, fused=True),
        "pytorch": lambda: attnlab_generate(ours, prompt, args.new_tokens),
        "transformers": lambda: transformers_generate(theirs, prompt, args.new_tokens),
    }
    for w in [f for f in formats if f != "fp32"]:
        fns[f"fused-{w}"] = lambda w=w: attnlab_generate(ours, prompt, args.new_tokens, fused=True, weights=w)
    rates = compare(fns, args.new_tokens, 1, args.repeats, torch.device("cpu"), lambda n, out: outputs.update({n: out}))
    result = {
        **run_info(),
        "family": args.family,
        "shape": args.shape,
        "kv_heads": args.kv_heads,
        "ffn": args.ffn,
        "vocab": args.vocab,
        "experts": args.experts if args.family == "mixtral" else 0,
        "parameters": sum(p.numel() for p in theirs.parameters()),
        "prompt": args.prompt,
        "new_tokens": args.new_tokens,
        "tokens_per_s": {name: round(rate, 2) for name, rate in rates.items()},
        "fused_vs_pytorch": round(rates["fused"] / rates["pytorch"], 2),
        "fused_vs_transformers": round(rates["fused"] / rates["transformers"], 2),
        "same_tokens_as_pytorch": torch.equal(outputs["fused"], outputs["pytorch"]),
        "same_tokens_as_transformers": torch.equal(outputs["fused"], outputs["transformers"]),
        "stored_weights": {w: stored_weights(outputs, w, args.prompt, theirs) for w in formats if w != "fp32"},
    }
    print(json.dumps(result, indent=1))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
