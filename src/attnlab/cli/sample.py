"""attnlab sample RUN|HF_FOLDER|GGUF [PROMPT | -p/--prompt TEXT] [-n/--max-new-tokens N --temperature T --top-k K
--top-p P --seed S] [--compile | --fused | --no-fused] [--weights fp32|bf16|int8|int4|q4_k]
[--draft RUN_OR_FOLDER | --prompt-lookup [N]] [--draft-k K]
attnlab sample IMAGE_RUN --out FILE.png [--class C] [--num-samples N] [--complete SPLIT:INDEX]
attnlab sample WAVENET_RUN --digit D --out FILE.wav [--seconds S] [--speaker NAME] [--naive]

Language models: `attnlab.decode.stream_text` (from Python also `attnlab.decode.sample`; speculative decoding:
`attnlab.decode.speculative`, its statistics on stderr at the end); image and WaveNet
runs: see cli/sample_media.py (`attnlab.viz.sample_image_grid`, `attnlab.tasks.media.sample_run_audio`)."""

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from attnlab.cli import non_negative_int, positive_int
from attnlab.cli.arguments import (
    add_data_dir_argument,
    add_device_argument,
    add_json_argument,
    add_seed_argument,
    add_weights_argument,
    check_weights_options,
    decoding_weights,
    split_index,
)
from attnlab.errors import UserError
from attnlab.families import CAUSAL_LM
from attnlab.sources import takes_words

if TYPE_CHECKING:
    from attnlab.accel.plan import DecodePlan


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "sample",
        help="generate text, images or audio from a trained model",
        description="Continue a prompt with a trained language model; sample images (a PNG grid) from an image "
        "density run (PixelCNN, Gated PixelCNN, pixel GPT), or complete the bottom half of a real image; "
        "generate a spoken digit (a WAV file) from a WaveNet run.",
    )
    p.add_argument(
        "run_dir",
        metavar="RUN",
        help=takes_words((CAUSAL_LM,)),
    )
    p.add_argument("prompt_text", nargs="?", metavar="PROMPT", help="text to continue (or --prompt)")
    p.add_argument("-p", "--prompt", help="text to continue (default: start from nothing)")
    p.add_argument(
        "-n", "--max-new-tokens", type=non_negative_int, default=500, help="tokens to generate (default 500)"
    )
    p.add_argument(
        "--temperature",
        type=float,
        help="softmax temperature; 0 = greedy (default 0.8 for text, 1 for images and audio)",
    )
    p.add_argument("--top-k", type=positive_int, help="sample among the k most likely tokens")
    p.add_argument("--top-p", type=float, help="nucleus sampling: smallest set with probability >= p")
    add_seed_argument(p)
    p.add_argument(
        "--num-samples", type=positive_int, help="independent samples (default 1; 16 images; WAVs: FILE_1.wav, ...)"
    )
    p.add_argument("--stop", action="append", default=[], metavar="TEXT", help="stop before this text (repeatable)")
    p.add_argument("--stream", action="store_true", help="print tokens as they are generated")
    p.add_argument(
        "--compile",
        action="store_true",
        help="run the decoding step through torch.compile (compiles first: pays off on long generations)",
    )
    p.add_argument(
        "--fused",
        action=argparse.BooleanOptionalAction,
        help="run the decoding step as one C++ call (pre-norm fp32 GPTs on a CPU): the default where "
        "`attnlab kernels build` has built it; --fused builds it first if need be (~1 minute), "
        "--no-fused keeps PyTorch's path",
    )
    add_weights_argument(p)
    _add_speculation_arguments(p)
    _add_media_arguments(p)
    add_device_argument(p)
    add_json_argument(p, '{"samples": [...]}')
    p.set_defaults(run=run, check=check)


def _add_speculation_arguments(p: argparse.ArgumentParser) -> None:
    """Speculative decoding's options, in their own group of the help."""
    spec = p.add_argument_group(
        "speculative decoding",
        "a drafter proposes tokens that the model checks in one step; the output is what the model alone "
        "gives (greedy: token for token; sampling: the same distribution)",
    )
    spec.add_argument(
        "--draft",
        metavar="RUN_OR_FOLDER",
        help="a smaller language model with the same tokenizer drafts (a run folder, Hugging Face folder or GGUF "
        "file); --fused/--no-fused choose its step and the target's, which checks the drafts in one call",
    )
    spec.add_argument(
        "--prompt-lookup",
        type=positive_int,
        nargs="?",
        const=PROMPT_LOOKUP_NGRAM,
        metavar="N",
        help="draft by copying what followed the latest earlier occurrence of the last N..1 tokens "
        f"(default N {PROMPT_LOOKUP_NGRAM}); no second model: for outputs that repeat their prompt",
    )
    spec.add_argument(
        "--draft-k",
        type=int,
        metavar="K",
        help=f"tokens drafted per step, 1 to {MAX_DRAFT_TOKENS} (default {DRAFT_K})",
    )


PROMPT_LOOKUP_NGRAM = 3
DRAFT_K = 4
MAX_DRAFT_TOKENS = 16
"""`attnlab.decode.speculative.MAX_DRAFT_TOKENS`, repeated so that parsing imports no PyTorch
(tests/cli/test_sample_conventions.py checks that the two agree)."""


def check(args: argparse.Namespace) -> None:
    """The prompt given once (PROMPT or --prompt) and the speculation options, checked before
    PyTorch is imported."""
    from attnlab.sources import refuse

    if args.prompt_text is not None and args.prompt is not None:
        raise UserError("give the prompt once: as PROMPT or with -p/--prompt, not both")
    args.prompt = args.prompt_text if args.prompt_text is not None else (args.prompt or "")
    if args.draft is not None and args.prompt_lookup is not None:
        raise UserError("--draft and --prompt-lookup are two drafters; pick one")
    speculating = args.draft is not None or args.prompt_lookup is not None
    if args.draft_k is not None and not speculating:
        raise UserError("--draft-k sets how many tokens a drafter proposes: add --draft RUN or --prompt-lookup")
    if args.draft_k is not None and not 1 <= args.draft_k <= MAX_DRAFT_TOKENS:
        raise UserError(f"--draft-k must be from 1 to {MAX_DRAFT_TOKENS}, got {args.draft_k}")
    if speculating and (args.compile or args.weights not in (None, "fp32")):
        raise UserError("speculative decoding checks the drafts with PyTorch's step: leave out --compile and --weights")
    if args.prompt_lookup is not None and args.fused:
        raise UserError("--fused runs a draft model's steps, and prompt lookup has none: leave out --fused")
    if args.draft is not None:
        refuse(args.draft, "sample")


def _add_media_arguments(p: argparse.ArgumentParser) -> None:
    """The options of image and WaveNet runs, in their own group of the help."""
    media = p.add_argument_group("images and audio")
    media.add_argument("--out", type=Path, help="the picture (.png, image runs) or the sound (.wav, WaveNet runs)")
    media.add_argument("--class", dest="label", type=int, metavar="C", help="image runs: sample images of class C")
    media.add_argument(
        "--complete",
        type=split_index,
        metavar="SPLIT:INDEX",
        help="image runs: keep the top half of that image (e.g. test:5) and sample the rest, --num-samples times",
    )
    add_data_dir_argument(media, "with --complete: the image to complete")
    media.add_argument("--digit", type=int, help="WaveNet runs: the digit to say (0-9)")
    media.add_argument("--speaker", help="WaveNet runs conditioned on the speaker: whose voice")
    media.add_argument("--seconds", type=float, default=0.5, help="WaveNet runs: length of the sound (default 0.5)")
    media.add_argument(
        "--naive",
        action="store_true",
        help="WaveNet runs: rerun the receptive field for every sample instead of the per-layer cache (the reference)",
    )


MEDIA_TASKS = ("image-density", "audio-density", "image-classification")


def _media_flags(args: argparse.Namespace) -> dict[str, object]:
    return {
        "--out": args.out is not None,
        "--class": args.label is not None,
        "--complete": args.complete,
        "--data-dir": args.data_dir,
        "--digit": args.digit is not None,
        "--speaker": args.speaker,
        "--naive": args.naive,
    }


def run(args: argparse.Namespace) -> int:
    import torch

    from attnlab.cli.kinds import require_kind
    from attnlab.decode import encode_prompt, sampling_picker
    from attnlab.device import resolve_device
    from attnlab.sources import PUBLISHED, what_is
    from attnlab.train.load import load_any

    device = resolve_device(args.device)
    media = [flag for flag, value in _media_flags(args).items() if value]
    # A Hugging Face folder or a GGUF file is a language model: its options are checked before the
    # (long) load; a run is loaded first, since its task says which options it takes.
    published = what_is(args.run_dir).form in PUBLISHED
    loaded = None if published else load_any(args.run_dir, command="sample", device=device)
    if loaded is not None and loaded.task in MEDIA_TASKS:
        from attnlab.cli.sample_media import sample_media

        if args.draft is not None or args.prompt_lookup is not None:
            raise UserError(
                f"--draft and --prompt-lookup go with language models; {args.run_dir} is a {loaded.task!r} run"
            )

        return sample_media(args, loaded.run)
    if media and (published or loaded.task == "language-model"):
        raise UserError(f"{', '.join(media)} go with image and WaveNet runs, not with a language model")
    if loaded is not None and loaded.task != "language-model":
        require_kind(args.run_dir, loaded.run.config, "sample")
    _text_options(args)
    if loaded is None:
        loaded = load_any(args.run_dir, command="sample", device=device)
    model, tokenizer = loaded.model, loaded.tokenizer
    # Without --weights: a Q8_0 GGUF's own int8 blocks, where the fused step may run (not beside
    # --no-fused, --compile, or a drafter, whose drafts PyTorch's step checks).
    speculating = args.draft is not None or args.prompt_lookup is not None
    fusable = args.fused is not False and not args.compile and not speculating
    args.weights = decoding_weights(model, args.weights, "sample", loaded.stored_weights, fusable)
    speculation = _speculation(args, loaded, device)
    # Decided once, here (no flag: the C++ step where it is built, or bf16/int8/int4 weights, and it
    # covers the model); with speculation, the target checks the drafts on it.
    from attnlab.accel.plan import plan_decoding

    plan = plan_decoding(model, fused=args.fused, weights=args.weights, compile=args.compile)
    prompt_ids = encode_prompt(tokenizer, args.prompt, device)
    generator = torch.Generator(device=device).manual_seed(args.seed)
    pick = sampling_picker(args.temperature, args.top_k, args.top_p, generator)
    samples = _sample_texts(args, model, tokenizer, prompt_ids, pick, plan, speculation)
    result: dict[str, object] = {"prompt": args.prompt, "samples": samples}
    if speculation is not None:
        sys.stderr.write(f"attnlab sample: {speculation.stats.summary()}\n")
        result["speculation"] = dataclasses.asdict(speculation.stats) | {
            "tokens_per_step": round(speculation.stats.tokens_per_step, 4)
        }
    if args.json:
        from attnlab.cli import print_json

        print_json(result)
    return 0


def _speculation(args: argparse.Namespace, target, device):
    """The drafter the options ask for (`attnlab.decode.Speculation`), or None. A draft model is
    loaded by the one loader and must share the target's tokenizer; one not smaller is warned of.
    --fused/--no-fused choose the draft model's step (by default the fused one where it covers the
    model and is built), as they choose the target's."""
    from attnlab.decode import ModelDrafter, PromptLookup, Speculation

    k = DRAFT_K if args.draft_k is None else args.draft_k
    if args.prompt_lookup is not None:
        return Speculation(PromptLookup(max_ngram=args.prompt_lookup), k)
    if args.draft is None:
        return None
    from attnlab.decode.speculative import check_draft_model
    from attnlab.train.load import load_any

    draft = load_any(args.draft, command="sample", device=device)
    if draft.task is not None and draft.task != "language-model":
        raise UserError(f"--draft {args.draft} is a {draft.task!r} run: a drafter is a language model")
    warning = check_draft_model(target.model, draft.model, target.tokenizer, draft.tokenizer)
    if warning is not None:
        sys.stderr.write(f"attnlab sample: warning: {warning}\n")
    # the draft model's one-token steps, decided once for it (no flag: the C++ step where it is built and covers it)
    from attnlab.accel.plan import plan_decoding

    plan = plan_decoding(draft.model, fused=args.fused)
    return Speculation(ModelDrafter(draft.model, fused=plan.fused), k)


def _text_options(args: argparse.Namespace) -> None:
    """Fill in the text defaults (temperature 0.8, one sample) and check the sampling options."""
    args.temperature = 0.8 if args.temperature is None else args.temperature
    args.num_samples = args.num_samples or 1
    if args.temperature < 0:
        raise UserError(f"--temperature must be >= 0, got {args.temperature}")
    if args.top_p is not None and not 0.0 < args.top_p <= 1.0:
        raise UserError(f"--top-p must be in (0, 1], got {args.top_p}")
    if args.compile and args.fused:
        raise UserError("--compile and --fused are two ways to run the decoding step; pick one")
    check_weights_options(args)


def _sample_texts(
    args: argparse.Namespace, model, tokenizer, prompt_ids, pick, plan: "DecodePlan", speculation=None
) -> list[str]:
    """Generate `args.num_samples` continuations of the prompt, printing them as they come (or
    streaming their tokens with --stream) unless --json; returns those not streamed."""
    from attnlab.decode import stream_text

    samples = []
    for i in range(args.num_samples):
        pieces = stream_text(
            model,
            tokenizer,
            prompt_ids,
            args.max_new_tokens,
            pick,
            stop=args.stop,
            plan=plan,
            speculation=speculation,
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
    return samples
