"""Batch-1 decoding and prompt processing on the CPU: llama.cpp (GGUF f32, bf16, q8_0), attnlab
(its fused decoding step, weights fp32, bf16 and int8) and `transformers`' `generate`, the same
random weights in all three.

Each shape is a random-weight (seed 0) Hugging Face folder written by `transformers`: GPT-2 124M
(`GPT2Config()`'s defaults) and a Llama-shaped model (12 layers, width 768, 12 query and 4
key/value heads, feed-forward 2048, vocabulary 32,000: 125M parameters, the shape of
benchmarks/decode_llama.py). Its tokenizer.json is a byte-level BPE of `TOKENIZER_VOCAB` tokens
trained on the bundled Tiny Shakespeare; the models' vocabularies (50,257 and 32,000 rows) are
padded past it, and llama.cpp's converter names the padding rows `[PAD<id>]`. The benchmark feeds
token ids, so the speed depends on the rows, not on the tokenizer.

llama.cpp's own converter (`convert_hf_to_gguf.py` from llama-cpp-python's source distribution,
run with the `gguf` package of the same source, `gguf-py/`, as it runs by default: the release of
`gguf` on PyPI can lag the converter's needs; it reads Llama vocabularies with `sentencepiece`)
writes the GGUFs: `--outtype f32`, `bf16` and `q8_0` (32 weights and one scale a block; no
`llama-quantize` needed). It identifies a BPE tokenizer's pre-tokenizer by
hashing the ids it gives a test string and refuses one it has not seen; ours is GPT-2's byte-level
pre-tokenizer with a vocabulary of its own, so the converter runs with `get_vocab_base_pre` saying
"gpt-2", which is what its refusal asks for ("update get_vocab_base_pre()"). Nothing else changes.

Measured, for each shape and thread count (`--threads`; torch's intra-op threads and llama.cpp's
`n_threads` and `n_threads_batch` alike), peers alternating within every repeat, medians:
- decoding: a `--prompt`-token prompt, then `--new-tokens` greedy tokens; new tokens/s over the
  whole call (prompt included), as `attnlab bench` counts; attnlab with each of `--weights` (its
  fused step's fp32, bf16 and int8: q8_0's blocks of 32 with an fp32 scale each, the precisions
  matching llama.cpp's three);
- prompt processing: `--prefill` tokens into an empty cache, the next token's logits only;
  tokens/s. attnlab's model forward (fp32: what `greedy` prefills with) and its fused step's C++
  prefill with each of `--weights` (what the server's batcher prefills with);
- the roofline: a decoded token reads every weight once (an embedding table that is only looked up
  reads one row, so it is left out; a tied one is read whole as the head), so tokens/s can be at
  most copy bandwidth / weight bytes; the bandwidth is a 256 MiB torch tensor copy at the same
  thread count, the better of one before and one after the case. Reading alone can go faster
  than a copy's read and write, so a fraction above 1 means the copy underrates the machine.

    python benchmarks/llamacpp_compare.py --llama-cpp DIR [--shapes gpt2 llama] [--precisions f32 bf16 q8_0]
        [--weights fp32 bf16 int8] [--threads 1 2] [--prompt 16] [--new-tokens 128] [--prefill 512]
        [--repeats 3] [--work DIR] [--json F]

DIR is `vendor/llama.cpp` of the unpacked source distribution
(`pip download --no-binary :all: --no-deps llama-cpp-python`); it is needed only to convert, and
GGUFs already in `--work` are reused. Needs the `llamacpp` extra (llama-cpp-python, gguf, sentencepiece) and
attnlab's fused decoding step built (`make`, or `attnlab kernels build`).
"""

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

EXTRA = "pip install 'attnlab[llamacpp]' (llama-cpp-python, gguf, sentencepiece)"
SHAPES = ("gpt2", "llama")
PRECISIONS = ("f32", "bf16", "q8_0")
WEIGHTS = ("fp32", "bf16", "int8")
"""attnlab's formats (`attnlab.accel.fused.WEIGHT_FORMATS`), in the order of llama.cpp's PRECISIONS."""
Q8_BLOCK = 32
TOKENIZER_VOCAB = 4096
CONTEXT = 1024  # positions of both shapes, and llama.cpp's n_ctx: room for the 512-token prefill
CONVERT = """
import runpy, sys
from pathlib import Path
source = Path(sys.argv.pop(1))
sys.path[:0] = [str(source), str(source / "gguf-py")]  # the converter's own gguf, as it runs by default
import conversion.base
conversion.base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "gpt-2"
sys.argv[0] = str(source / "convert_hf_to_gguf.py")
runpy.run_path(sys.argv[0], run_name="__main__")
"""
"""The converter, told that the tokenizer's pre-tokenizer is GPT-2's (the module docstring says why)."""


def fail(message: str) -> None:
    """Bad input: one line on stderr, exit code 2 (the CLI's convention)."""
    sys.stderr.write(f"llamacpp_compare: error: {message}\n")
    raise SystemExit(2)


def require(*modules: str) -> None:
    """The llama.cpp peer's `modules`, or one line naming the extra."""
    for module in modules:
        try:
            __import__(module)
        except ImportError:
            fail(f"the llama.cpp peer needs the {module} module, which is not installed: {EXTRA}")


def ggufs(args: argparse.Namespace) -> dict[tuple[str, str], Path]:
    """The GGUF of every (shape, precision) asked for, in --work: converted where missing (which
    needs --llama-cpp), with the Hugging Face folder it comes from."""
    paths = {(s, p): args.work / f"{s}-{p}.gguf" for s in args.shapes for p in args.precisions}
    missing = [path for path in paths.values() if not path.is_file()]
    if missing:
        require("sentencepiece")  # the converter's reader of Llama vocabularies
    if missing and args.llama_cpp is None:
        fail(f"no GGUF at {missing[0]}: pass --llama-cpp DIR (llama.cpp's source) to convert it; {EXTRA}")
    if missing and not (args.llama_cpp / "convert_hf_to_gguf.py").is_file():
        fail(
            f"no convert_hf_to_gguf.py in {args.llama_cpp}: pass the vendor/llama.cpp folder of "
            "llama-cpp-python's source (pip download --no-binary :all: --no-deps llama-cpp-python)"
        )
    for (shape, precision), path in paths.items():
        if not path.is_file():
            convert(hf_folder(args.work, shape), precision, path, args.llama_cpp)
    return paths


def convert(folder: Path, precision: str, out: Path, source: Path) -> None:
    """llama.cpp's converter: the Hugging Face `folder` -> `out`, weights in `precision`."""
    command = [sys.executable, "-c", CONVERT, str(source), str(folder), "--outtype", precision, "--outfile", str(out)]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        sys.stderr.write(done.stderr[-4000:])
        raise RuntimeError(f"llama.cpp's converter failed on {folder} ({precision}); its output is above")


def hf_config(shape: str):
    """The `transformers` config of `shape`: GPT-2 124M, or issue 48's Llama shape."""
    import transformers

    if shape == "gpt2":
        # n_ctx: the published GPT-2 config.json has it and llama.cpp's converter reads it;
        # transformers 5 no longer writes it unless given
        return transformers.GPT2Config(n_positions=CONTEXT, n_ctx=CONTEXT, bos_token_id=0, eos_token_id=1)
    return transformers.LlamaConfig(
        vocab_size=32000,
        hidden_size=768,
        intermediate_size=2048,
        num_hidden_layers=12,
        num_attention_heads=12,
        num_key_value_heads=4,
        max_position_embeddings=CONTEXT,
        bos_token_id=0,
        eos_token_id=1,
        tie_word_embeddings=False,
    )


def hf_folder(work: Path, shape: str, tokenizer_vocab: int = TOKENIZER_VOCAB) -> Path:
    """`work`/`shape`: the random-weight (seed 0) model and its tokenizer (of at most
    `tokenizer_vocab` tokens), written once."""
    import torch
    import transformers

    folder = work / shape
    if (folder / "model.safetensors").is_file():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    write_tokenizer(folder, tokenizer_vocab)
    torch.manual_seed(0)
    config = hf_config(shape)
    model_class = transformers.GPT2LMHeadModel if shape == "gpt2" else transformers.LlamaForCausalLM
    model_class(config).save_pretrained(folder)
    return folder


def write_tokenizer(folder: Path, vocab_size: int = TOKENIZER_VOCAB) -> None:
    """A byte-level BPE (GPT-2's pre-tokenizer) of `vocab_size` tokens (fewer where the text has no
    more pairs to merge), "<s>" and "</s>" first, trained on the bundled Tiny Shakespeare;
    tokenizer_config.json tells `AutoTokenizer` (the converter's reader) to take it as it is."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from attnlab.data.text import bundled_shakespeare

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([bundled_shakespeare()], trainer=trainer)
    tok.save(str(folder / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>"}
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=1) + "\n")


def gguf_bytes_per_token(path: Path) -> int:
    """Bytes of a GGUF's weights one decoded token reads: every tensor but the tables it only looks
    up (positions; the token embedding where a separate `output.weight` is the head)."""
    from gguf import GGUFReader

    tensors = {t.name: int(t.n_bytes) for t in GGUFReader(path).tensors}
    lookup = {"position_embd.weight"} | ({"token_embd.weight"} if "output.weight" in tensors else set())
    return sum(n for name, n in tensors.items() if name not in lookup)


def torch_bytes_per_token(model, weights: str = "fp32") -> int:
    """The same count for a `transformers` model (attnlab's holds the same tensors), its matrices
    read in attnlab's format `weights`: 4, 2 or 1 + 4/32 bytes a value (an int8 block of 32 has an
    fp32 scale); norms and biases stay fp32."""
    embedding, head = model.get_input_embeddings().weight, model.get_output_embeddings().weight
    per_value = {"fp32": 4.0, "bf16": 2.0, "int8": 1 + 4 / Q8_BLOCK}[weights]
    return round(
        sum(
            p.numel() * (per_value if p.dim() == 2 else 4)
            for name, p in model.named_parameters()  # a tied table once
            if not name.endswith("wpe.weight") and (p is not embedding or embedding is head)
        )
    )


def llamacpp_generate(llm, prompt: list[int], new_tokens: int) -> list[int]:
    """llama.cpp's greedy decoding (its greedy sampler) from an empty cache -> the new tokens."""
    llm.reset()
    llm.eval(prompt)
    out: list[int] = []
    for i in range(new_tokens):
        out.append(llm.sample(temp=0.0))
        if i < new_tokens - 1:
            llm.eval(out[-1:])
    return out


def llamacpp_prefill(llm, prompt: list[int]) -> None:
    llm.reset()  # the next eval drops every cached position
    llm.eval(prompt)


def load_llamacpp(path: Path, threads: int):
    """A llama.cpp model on `threads` threads, context CONTEXT, one batch for the whole prefill."""
    from llama_cpp import Llama

    return Llama(
        str(path),
        n_ctx=CONTEXT,
        n_batch=CONTEXT,
        n_ubatch=CONTEXT,
        n_threads=threads,
        n_threads_batch=threads,
        seed=0,
        verbose=False,
    )


def torch_peers(folder: Path, weights: list[str]):
    """(attnlab's model, its fused step for each of `weights` (format -> step), the `transformers`
    model) of `folder`."""
    import torch
    import transformers

    from attnlab.accel import for_decoding
    from attnlab.accel.fused import extension, gpt_step
    from attnlab.models.hf import load_causal_lm

    if extension() is None:
        fail("attnlab's fused decoding step is not built here: run `make` (or `attnlab kernels build`)")
    ours = load_causal_lm(folder).model.eval()
    for_decoding(ours)  # what `greedy` applies at its first call: the prefill below takes it too
    fused = {w: gpt_step(ours, ours.new_cache(1, CONTEXT), weights=w) for w in weights}
    if any(step is None for step in fused.values()):
        fail(f"attnlab's fused decoding step does not cover the model in {folder}")
    theirs = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    return ours, fused, theirs


def decode_fns(
    ours, theirs, llms: dict, weights: list[str], prompt: list[int], new_tokens: int
) -> dict[str, Callable[[], list[int]]]:
    """Each peer's greedy generation of `new_tokens` after `prompt` -> the new tokens."""
    import torch

    from attnlab.decode import greedy
    from attnlab.studies.bench.compare import transformers_generate

    ids = torch.tensor([prompt])
    fns = {
        f"attnlab {w}": lambda w=w: greedy(ours, ids, new_tokens, fused=True, weights=w)[0, len(prompt) :].tolist()
        for w in weights
    }
    fns["transformers fp32"] = lambda: transformers_generate(theirs, ids, new_tokens)[0, len(prompt) :].tolist()
    for precision, llm in llms.items():
        fns[f"llama.cpp {precision}"] = lambda llm=llm: llamacpp_generate(llm, prompt, new_tokens)
    return fns


def prefill_fns(ours, fused, theirs, llms: dict, prompt: list[int]) -> dict[str, Callable[[], object]]:
    """Each peer's processing of `prompt` into an empty cache, the last position's logits only."""
    import torch

    ids = torch.tensor([prompt])

    def forward(model, **kwargs):
        with torch.inference_mode():
            return model(ids, **kwargs)

    fns = {"attnlab fp32": lambda: forward(ours, cache=ours.new_cache(1, CONTEXT), last_only=True)}
    for w, step in fused.items():
        fns[f"attnlab {w}, fused prefill"] = lambda step=step: step.prefill([prompt], 0)
    fns["transformers fp32"] = lambda: forward(theirs, use_cache=True, logits_to_keep=1)
    for precision, llm in llms.items():
        fns[f"llama.cpp {precision}"] = lambda llm=llm: llamacpp_prefill(llm, prompt)
    return fns


def leading_agreement(a: list[int], b: list[int]) -> int:
    """How many tokens `a` and `b` share before their first difference: [1, 2, 3], [1, 2, 4] -> 2."""
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def measure_case(shape: str, threads: int, peers, paths: dict, args: argparse.Namespace) -> dict:
    """Decoding and prompt processing of one shape at one thread count, every peer."""
    import torch

    from attnlab.studies.bench.compare import compare
    from attnlab.studies.bench.peaks import memory_bandwidth

    ours, fused, theirs = peers
    torch.set_num_threads(threads)
    load_before = os.getloadavg()
    bandwidth = memory_bandwidth(torch.device("cpu"))
    llms = {p: load_llamacpp(paths[shape, p], threads) for p in args.precisions}
    rng = torch.Generator().manual_seed(0)
    vocab = ours.config.vocab_size
    prompt = torch.randint(2, vocab, (args.prompt,), generator=rng).tolist()
    long_prompt = torch.randint(2, vocab, (args.prefill,), generator=rng).tolist()
    tokens: dict[str, list[int]] = {}
    cpu = torch.device("cpu")
    decode = compare(
        decode_fns(ours, theirs, llms, args.weights, prompt, args.new_tokens),
        args.new_tokens,
        1,
        args.repeats,
        cpu,
        tokens.__setitem__,
    )
    prefill = compare(prefill_fns(ours, fused, theirs, llms, long_prompt), args.prefill, 1, args.repeats, cpu)
    bandwidth = max(bandwidth, memory_bandwidth(cpu))  # a peak: the better of before and after
    for llm in llms.values():
        llm.close()
    weight_bytes = {f"llama.cpp {p}": gguf_bytes_per_token(paths[shape, p]) for p in args.precisions}
    weight_bytes |= {f"attnlab {w}": torch_bytes_per_token(theirs, w) for w in args.weights}
    weight_bytes["transformers fp32"] = torch_bytes_per_token(theirs)
    reference = tokens["transformers fp32"]
    return {
        "shape": shape,
        "parameters": sum(p.numel() for p in theirs.parameters()),
        "threads": threads,
        "copy_bandwidth_bytes_per_s": bandwidth,
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "decode": {
            name: {
                "tokens_per_s": round(rate, 2),
                "weight_bytes_per_token": weight_bytes[name],
                "roofline_fraction": round(rate * weight_bytes[name] / bandwidth, 3),
                "leading_tokens_as_transformers": leading_agreement(tokens[name], reference),
            }
            for name, rate in decode.items()
        },
        "prefill_tokens_per_s": {name: round(rate, 1) for name, rate in prefill.items()},
    }


def table(cases: list[dict]) -> str:
    """The Markdown table of the cases: one row a peer, decoding beside prompt processing."""
    lines = [
        "| shape | threads | peer | weight MB read a token | decode tokens/s | of roofline | prompt tokens/s |",
        "|---|---|---|---|---|---|---|",
    ]
    for case in cases:
        names = list(case["decode"]) + [n for n in case["prefill_tokens_per_s"] if n not in case["decode"]]
        for name in names:
            d = case["decode"].get(name)
            cells = (
                [
                    f"{d['weight_bytes_per_token'] / 1e6:.0f}",
                    f"{d['tokens_per_s']:.1f}",
                    f"{d['roofline_fraction']:.0%}",
                ]
                if d
                else ["", "", ""]
            )
            prefill = case["prefill_tokens_per_s"].get(name)
            lines.append(f"| {case['shape']} | {case['threads']} | {name} | {' | '.join(cells)} | {prefill or ''} |")
    return "\n".join(lines)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--llama-cpp", type=Path, help="llama.cpp's source (vendor/llama.cpp of llama-cpp-python's sdist)")
    p.add_argument("--shapes", nargs="+", choices=SHAPES, default=list(SHAPES))
    p.add_argument("--precisions", nargs="+", choices=PRECISIONS, default=list(PRECISIONS), help="llama.cpp's")
    p.add_argument("--weights", nargs="+", choices=WEIGHTS, default=list(WEIGHTS), help="attnlab's")
    p.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    p.add_argument("--prompt", type=int, default=16, help="prompt tokens before decoding")
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--prefill", type=int, default=512, help="prompt processing: tokens")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--work", type=Path, default=Path("/tmp/attnlab-llamacpp"), help="folders and GGUFs")
    p.add_argument("--json", type=Path, help="also write the results here")
    args = p.parse_args()
    if args.prompt + args.new_tokens > CONTEXT or args.prefill > CONTEXT:
        fail(f"--prompt + --new-tokens and --prefill must fit the context of {CONTEXT} positions")
    return args


def main() -> None:
    args = parse_args()
    require("llama_cpp", "gguf")
    paths = ggufs(args)
    sys.path.insert(0, str(Path(__file__).parent))
    from run_info import run_info

    cases = []
    for shape in args.shapes:
        peers = torch_peers(hf_folder(args.work, shape), args.weights)
        cases += [measure_case(shape, threads, peers, paths, args) for threads in args.threads]
    import llama_cpp

    result = {
        **run_info(),
        "llama_cpp_python": llama_cpp.__version__,
        "prompt": args.prompt,
        "new_tokens": args.new_tokens,
        "prefill": args.prefill,
        "repeats": args.repeats,
        "cases": cases,
    }
    print(table(cases))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
