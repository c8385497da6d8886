"""attnlab serve RUN [RUN ...] [--host 127.0.0.1] [--port 8000] [--api-key KEY] [--max-batch N] [--max-queue N]
[--max-tokens N] [--max-n N] [--max-prompt-tokens N] [--no-batching] [--fused | --no-fused]
[--weights fp32|bf16|int8|int4|q4_k] [--threads N] [--cache-memory SIZE]

Calls `attnlab.serve.app.create_app` on the runs of `attnlab.serve.registry.load_runs`."""

import argparse
import dataclasses
import os
import re

from attnlab.cli import positive_int
from attnlab.cli.arguments import (
    add_checkpoint_argument,
    add_device_argument,
    add_weights_argument,
    check_weights_options,
    decoding_weights,
)
from attnlab.cli.chat import add_tools_argument
from attnlab.families import names
from attnlab.sources import TAKES, takes_words

ENV_KEY = "ATTNLAB_API_KEY"
TOOLS_HELP = (
    "tools the server runs itself in chat replies: a reply that calls one is answered and continued, the client "
    "getting the final answer (off by default; a request's own tools turn them off for it)"
)
INSTALL = "attnlab serve needs fastapi and uvicorn: run `make serve` or `pip install 'attnlab[serve]'`"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "serve",
        help="a web page and an OpenAI-compatible API over trained runs and Hugging Face checkpoints",
        description=f"Serve trained runs, Hugging Face folders ({names()}) and GGUF files over "
        "HTTP: a page to talk to them at /, and an API under /v1 (completions and, for a folder with a "
        "chat template, chat completions as OpenAI's API has them; translations, classifications, tags, "
        "attention; documented at /docs). One process serves every run given; concurrent completions of a model "
        "are decoded together. To serve more traffic, start several and put a load balancer in front.",
    )
    p.add_argument(
        "runs",
        nargs="+",
        metavar="RUN",
        help=takes_words(TAKES["serve"]) + ", or NAME=PATH to name the model",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000; 0 picks a free one)")
    p.add_argument(
        "--api-key",
        default=os.environ.get(ENV_KEY),
        help=f"require 'Authorization: Bearer KEY' on /v1 (default ${ENV_KEY}); needed with a --host "
        "other than this machine",
    )
    p.add_argument("--max-batch", type=positive_int, default=32, help="streams decoded together per model (32)")
    p.add_argument("--max-queue", type=positive_int, default=64, help="requests waiting per model; past it: 429 (64)")
    p.add_argument("--max-tokens", type=positive_int, default=1024, help="largest max_tokens of a completion (1024)")
    p.add_argument("--max-n", type=positive_int, default=8, help="most completions per request, n x prompts (8)")
    p.add_argument(
        "--max-prompt-tokens",
        type=positive_int,
        help="longest prompt in tokens (default 4096; a Hugging Face folder's at most its context)",
    )
    p.add_argument("--no-batching", action="store_true", help="decode one request at a time (a baseline)")
    p.add_argument(
        "--fused",
        action=argparse.BooleanOptionalAction,
        help="the language models' decoding step as one C++ call: the default where `attnlab kernels "
        "build` has built it and it covers the model; --fused builds it first if need be, --no-fused "
        "keeps PyTorch's path",
    )
    add_tools_argument(p, TOOLS_HELP)
    add_weights_argument(p)
    p.add_argument(
        "--cache-memory",
        type=memory_size,
        metavar="SIZE",
        help="keys and values of recent prompts each language model keeps, so that a prompt beginning "
        "as an earlier one (a system prompt, a conversation's earlier turns) prefills only the rest: "
        "512MB, 2GB, 1.5GiB; 0 turns prefix caching off (default 1GiB, taken as prompts fill it)",
    )
    p.add_argument(
        "--threads",
        type=positive_int,
        help="torch threads for the models (default: the cores less one, at least one; the other core "
        "streams the tokens)",
    )
    add_checkpoint_argument(p)
    add_device_argument(p)
    p.set_defaults(run=run, check=check)


def check(args: argparse.Namespace) -> None:
    """The server's extra installed, each RUN a path serve takes (`attnlab.sources.refuse`: missing,
    a file or folder of another kind, a family serve does not take) and the weight options, checked
    before PyTorch is imported: a wrong path costs no model loading."""
    from attnlab.errors import UserError
    from attnlab.sources import refuse

    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        raise UserError(INSTALL) from None
    from attnlab.serve.registry import parse_model_spec  # torch-free, beside fastapi's starlette

    for spec in args.runs:
        refuse(parse_model_spec(spec)[1], "serve")
    check_weights_options(args)


def memory_size(text: str) -> int:
    """Bytes of a size such as "512MB", "1.5GiB", "64k" or "0": decimal units (k, M, G, T), binary
    ones with an i (KiB, MiB, GiB, TiB), a trailing B optional."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([kmgt]?)(i?)b?\s*", text, re.IGNORECASE)
    if match is None or (match[3] and not match[2]):
        raise argparse.ArgumentTypeError(f"expected a size such as 512MB, 2GB or 0, got {text!r}")
    power = " kmgt".index(match[2].lower() or " ")  # 0: bytes
    return int(float(match[1]) * (1024 if match[3] else 1000) ** power)


def run(args: argparse.Namespace) -> int:
    import sys

    import torch
    import uvicorn

    from attnlab.device import resolve_device
    from attnlab.serve.app import create_app
    from attnlab.serve.limits import Limits
    from attnlab.serve.registry import load_runs
    from attnlab.serve.server import bind, check_exposure, model_threads, url

    check_exposure(args.host, args.api_key)
    torch.set_num_threads(args.threads or model_threads())
    limits = Limits(
        max_tokens=args.max_tokens,
        max_n=args.max_n,
        max_prompt_tokens=args.max_prompt_tokens,
        max_batch=args.max_batch,
        max_queue=args.max_queue,
        batched=not args.no_batching,
        fused=args.fused,
        weights=args.weights,
        tools=args.tools,
    )
    if args.cache_memory is not None:
        limits = dataclasses.replace(limits, cache_memory=args.cache_memory)
    runs = load_runs(args.runs, device=resolve_device(args.device), checkpoint=args.checkpoint)
    for name, run in runs.items():  # the models that decode with fp32 weights instead say so
        if run.config.task == "language-model" and args.weights != "fp32":
            decoding_weights(run.model, args.weights, f"serve: {name}")
    sock = bind(args.host, args.port)
    app = create_app(runs, api_key=args.api_key, limits=limits)
    names = ", ".join(f"{name} ({run.config.task})" for name, run in runs.items())
    address = url(sock)
    threads = torch.get_num_threads()
    sys.stderr.write(
        f"attnlab serve: {names} on {address}/  (API: {address}/v1, docs: {address}/docs; "
        f"{threads} torch thread{'s' if threads > 1 else ''})\n"
    )
    sys.stderr.flush()
    server = uvicorn.Server(uvicorn.Config(app, log_level="info", timeout_graceful_shutdown=2))
    server.run(sockets=[sock])
    return 0
