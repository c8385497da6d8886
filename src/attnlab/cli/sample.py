"""attnlab sample RUN|HF_FOLDER --prompt TEXT [--max-new-tokens N --temperature T --top-k K --top-p P --seed S]
[--compile | --fused]"""

import argparse
import sys

from attnlab.cli import non_negative_int, positive_int


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "sample",
        help="generate text from a trained language model",
        description="Continue a prompt with a trained language model.",
    )
    p.add_argument(
        "run_dir",
        metavar="RUN",
        help="a run folder written by `attnlab train`, or a Hugging Face GPT-2, Llama or Mixtral folder "
        "(config.json, model.safetensors, tokenizer.json)",
    )
    p.add_argument("--prompt", default="", help="text to continue (default: start from nothing)")
    p.add_argument("--max-new-tokens", type=non_negative_int, default=500, help="tokens to generate (default 500)")
    p.add_argument("--temperature", type=float, default=0.8, help="softmax temperature; 0 = greedy (default 0.8)")
    p.add_argument("--top-k", type=positive_int, help="sample among the k most likely tokens")
    p.add_argument("--top-p", type=float, help="nucleus sampling: smallest set with probability >= p")
    p.add_argument("--seed", type=int, default=1337, help="random seed (default 1337)")
    p.add_argument("--num-samples", type=positive_int, default=1, help="independent samples (default 1)")
    p.add_argument("--stop", action="append", default=[], metavar="TEXT", help="stop before this text (repeatable)")
    p.add_argument("--stream", action="store_true", help="print tokens as they are generated")
    p.add_argument(
        "--compile",
        action="store_true",
        help="run the decoding step through torch.compile (compiles first: pays off on long generations)",
    )
    p.add_argument(
        "--fused",
        action="store_true",
        help="run the decoding step as one C++ call (pre-norm GPTs on a CPU; built on first use, ~1 minute)",
    )
    p.add_argument("--device", default="cpu", help="cpu, cuda or auto (default cpu)")
    p.add_argument("--json", action="store_true", help='print {"samples": [...]} as JSON')
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    import torch

    from attnlab import load
    from attnlab.cli.kinds import require_kind
    from attnlab.decode import encode_prompt, sampling_picker, stream_text
    from attnlab.device import resolve_device
    from attnlab.errors import UserError
    from attnlab.models.hf.auto import is_hf_folder, load_causal_lm

    if args.temperature < 0:
        raise UserError(f"--temperature must be >= 0, got {args.temperature}")
    if args.top_p is not None and not 0.0 < args.top_p <= 1.0:
        raise UserError(f"--top-p must be in (0, 1], got {args.top_p}")
    if args.compile and args.fused:
        raise UserError("--compile and --fused are two ways to run the decoding step; pick one")
    device = resolve_device(args.device)
    if is_hf_folder(args.run_dir):
        loaded = load_causal_lm(args.run_dir)
        model, tokenizer = loaded.model.to(device), loaded.tokenizer
    else:
        run = load(args.run_dir, device=device)
        require_kind(args.run_dir, run.config, "sample")
        model, tokenizer = run.model, run.tokenizer
    prompt_ids = encode_prompt(tokenizer, args.prompt, device)
    generator = torch.Generator(device=device).manual_seed(args.seed)
    pick = sampling_picker(args.temperature, args.top_k, args.top_p, generator)
    samples = []
    for i in range(args.num_samples):
        pieces = stream_text(
            model,
            tokenizer,
            prompt_ids,
            args.max_new_tokens,
            pick,
            stop=args.stop,
            compile=args.compile,
            fused=args.fused,
        )
        if args.stream and not args.json:
            sys.stdout.write(args.prompt)
            for piece in pieces:
                sys.stdout.write(piece)
                sys.stdout.flush()
            sys.stdout.write("\n")
        else:
            text = "".join(pieces)
            samples.append(text)
            if not args.json:
                print(args.prompt + text)
        if args.num_samples > 1 and not args.json and i < args.num_samples - 1:
            print("---------------")
    if args.json:
        from attnlab.cli import print_json

        print_json({"prompt": args.prompt, "samples": samples})
    return 0
