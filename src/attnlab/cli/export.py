"""attnlab export RUN --to hf OUT_DIR [--adapter] [--force] [--checkpoint best|last] [--json]
attnlab export RUN --to gguf OUT.gguf [--outtype f32|bf16|q8_0] [--force] [--checkpoint best|last] [--json]

Calls `attnlab.export.export_run`."""

import argparse

import attnlab.families as families
from attnlab.cli.arguments import add_checkpoint_argument, add_json_argument
from attnlab.sources import listed

# `attnlab.models.hf.gguf_export.OUTTYPES`, spelled out: the command line is read before PyTorch is
# imported (tests/models/hf/test_gguf.py checks that the two agree).
GGUF_OUTTYPES = ("f32", "bf16", "q8_0")

# The transformers Auto class that loads each exported architecture, for the closing hint.
AUTO_CLASSES = {
    "GPT2LMHeadModel": "AutoModelForCausalLM",
    "LlamaForCausalLM": "AutoModelForCausalLM",
    "BertForMaskedLM": "AutoModelForMaskedLM",
    "BertForSequenceClassification": "AutoModelForSequenceClassification",
    "BertForTokenClassification": "AutoModelForTokenClassification",
    "BertModel": "AutoModel",
    "MarianMTModel": "AutoModelForSeq2SeqLM",
}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "export",
        help="write a trained run as a Hugging Face transformers folder or a GGUF file",
        description="Write a run as a folder that transformers' from_pretrained loads offline (config.json, "
        "model.safetensors, tokenizer files): a GPT becomes the first causal-LM family whose parts it all has, "
        "a BERT run BertForMaskedLM / "
        "BertForSequenceClassification / BertForTokenClassification, a translation Transformer MarianMTModel. "
        "A run with a part transformers lacks (ALiBi, ReZero, experts, ...) is refused, naming it. A LoRA run "
        "exports with its adapters merged, or with --adapter as a peft adapter folder.",
    )
    p.add_argument("run_dir", metavar="RUN", help="a run folder written by `attnlab train`")
    p.add_argument(
        "--to",
        required=True,
        choices=["hf", "gguf"],
        help="the format: hf (a Hugging Face transformers folder) or gguf (one llama.cpp file, a GPT with the parts "
        f"of {listed([f.name for f in families.FAMILIES if f.gguf_export])})",
    )
    p.add_argument(
        "out_dir", metavar="OUT_DIR", help="the folder to write (must not exist or be empty); with --to gguf, the file"
    )
    p.add_argument(
        "--outtype",
        choices=GGUF_OUTTYPES,
        default="f32",
        help="--to gguf: how the weights are stored (f32; bf16; q8_0: blocks of 32 int8 codes and a scale)",
    )
    p.add_argument("--force", action="store_true", help="replace OUT_DIR when it exists and is not empty")
    p.add_argument(
        "--adapter",
        action="store_true",
        help="a LoRA run: write its adapters alone as a peft adapter folder (adapter_config.json, "
        "adapter_model.safetensors) for the base, instead of the base with the adapters merged in",
    )
    add_checkpoint_argument(p)
    add_json_argument(p, "what was written")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from attnlab.cli import print_json
    from attnlab.export import export_run

    exported = export_run(
        args.run_dir,
        args.out_dir,
        to=args.to,
        force=args.force,
        checkpoint=args.checkpoint,
        adapter=args.adapter,
        outtype=args.outtype,
    )
    if args.json:
        print_json(
            {
                "folder": str(exported.folder),
                "architecture": exported.architecture,
                "step": exported.step,
                "files": exported.files,
            }
        )
        return 0
    if args.to == "gguf":
        print(f"exported {args.run_dir} (step {exported.step}) as a {exported.architecture} file {exported.folder}")
        print(f"load it with attnlab.models.hf.gguf.load_gguf({str(exported.folder)!r}) or llama.cpp")
        return 0
    if args.adapter:
        print(
            f"exported the LoRA adapters of {args.run_dir} (step {exported.step}) as a peft adapter folder "
            f"{exported.folder}: {', '.join(exported.files)}"
        )
        print(f"put it on the base with peft.PeftModel.from_pretrained(base_model, {str(exported.folder)!r})")
        return 0
    print(
        f"exported {args.run_dir} (step {exported.step}) as a transformers {exported.architecture} to "
        f"{exported.folder}: {', '.join(exported.files)}"
    )
    auto = AUTO_CLASSES.get(exported.architecture, "AutoModel")
    print(f"load it with transformers.{auto}.from_pretrained({str(exported.folder)!r}) and AutoTokenizer")
    return 0
