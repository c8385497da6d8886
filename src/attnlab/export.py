"""A trained run folder as a Hugging Face `transformers` folder: `attnlab export RUN --to hf OUT_DIR`.

Which transformers class a run becomes depends on its task and its model's parts:
    lm, GPT with GPT-2's parts (learned positions, LayerNorm, GELU / ReLU)       -> GPT2LMHeadModel
    lm, GPT with Llama's parts (rotary positions, RMSNorm, SwiGLU, no biases)      -> LlamaForCausalLM
    mlm / classification / tagging, BERT   -> BertForMaskedLM / ...ForSequenceClassification / ...ForTokenClassification
        (RoBERTa's positions: RobertaFor...; rotary positions: ModernBertFor..., whose classifiers
        need the run's head to be ModernBERT's, as a run fine-tuned from a ModernBERT folder has)
    translation, the encoder–decoder Transformer (post-norm, sinusoids, shared vocabulary) -> MarianMTModel
A run with a part its family's transformers class does not have (ALiBi, relative positions,
ReZero, a mixture of experts, a sparse attention pattern, shared blocks ...) or of a task no
transformers class covers here (RNNs, images, audio, graphs) is refused with an `ExportError`
naming the part. The folder holds config.json, model.safetensors and the tokenizer's files
(`attnlab.models.hf.tokenizer_export`): `from_pretrained(OUT_DIR)` loads it offline, and attnlab's own
importers (`load_causal_lm`, `load_bert`, `load_marian`) read it back.

Layer: beside train/ (it reads a run folder through `train.load.load_run`); the `export`
command calls `export_run`. The conversions themselves live in `attnlab.models.hf`.

A LoRA run (`train.lora`) exports as its base with the adapters merged into the weights; with
`adapter` (`--adapter`), as a peft adapter folder for the base instead (`attnlab.models.hf.peft`).

`--to gguf` writes a language-model run (a GPT with GPT-2's or Llama's parts, a byte-level BPE) as one
llama.cpp file instead, weights as --outtype f32, bf16 or q8_0 (`attnlab.models.hf.gguf_export`).

Writes are atomic: the folder is built under a temporary name beside OUT_DIR and renamed into place,
so OUT_DIR is either absent, as before, or complete.
"""

import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from safetensors.torch import save_file

from attnlab.errors import ExportError, UserError
from attnlab.models.bert import Bert
from attnlab.models.gpt import GPT
from attnlab.models.hf._common import HFCheckpoint, save_hf_checkpoint
from attnlab.models.hf.auto import causal_lm_export
from attnlab.models.hf.bert import bert_export
from attnlab.models.hf.marian import marian_export
from attnlab.models.hf.modernbert import is_modernbert, modernbert_export
from attnlab.models.hf.peft import ADAPTER_CONFIG, ADAPTER_WEIGHTS, peft_adapter
from attnlab.models.hf.roberta import is_roberta, roberta_export
from attnlab.models.hf.tokenizer_export import special_token_ids, tokenizer_files
from attnlab.models.seq2seq import Seq2SeqTransformer
from attnlab.tasks.encoder import read_labels
from attnlab.train.load import Run, load_run

EXPORT_FORMATS = ("hf", "gguf")
"""What `export_run` writes: "hf", a Hugging Face transformers folder; "gguf", one llama.cpp file."""
ENCODER_TASKS = ("masked-lm", "text-classification", "token-classification")


@dataclass(frozen=True)
class Exported:
    """What `export_run` wrote."""

    folder: Path
    architecture: str
    """The transformers class, e.g. "GPT2LMHeadModel" (config.json's `architectures`)."""
    step: int
    """The training step of the exported weights."""
    files: list[str]


def hf_checkpoint_of_run(run: Run) -> tuple[HFCheckpoint, int]:
    """The transformers checkpoint of a loaded run, and the model's longest input (for the
    tokenizer's `model_max_length`). Raises `ExportError` naming what transformers lacks."""
    task, model = run.config.task, run.model
    if task == "language-model" and isinstance(model, GPT):
        checkpoint = causal_lm_export(model)
        checkpoint.config |= special_token_ids(run.tokenizer)
        return checkpoint, model.config.block_size
    if task in ENCODER_TASKS and isinstance(model, Bert):
        labels = read_labels(run.path) if model.config.head in ("sequence", "token") else None
        if is_modernbert(model.config):
            return modernbert_export(model, labels, run.tokenizer), model.config.max_len
        export = roberta_export if is_roberta(model.config) else bert_export
        return export(model, labels), model.config.max_len
    if task == "translation" and isinstance(model, Seq2SeqTransformer):
        tokenizer = run.tokenizer
        return marian_export(model, bos_id=tokenizer.bos_id, eos_id=tokenizer.eos_id), model.config.max_len
    kind = getattr(run.config.model, "kind", None) or type(model).__name__
    raise ExportError(
        f"task {task!r} with model {kind!r} has no transformers counterpart here; attnlab exports GPT language "
        "models, BERT encoders (masked-lm, text-classification, token-classification) and encoder–decoder Transformers "
        "(translation)"
    )


def export_run(
    run_dir: str | Path,
    out_dir: str | Path,
    *,
    to: str = "hf",
    force: bool = False,
    checkpoint: str = "best",
    adapter: bool = False,
    outtype: str = "f32",
) -> Exported:
    """Write the run in `run_dir` (its `checkpoint` weights: "best" or "last") as a transformers
    folder `out_dir` (see the module docstring); a LoRA run's adapters merged into the weights,
    or with `adapter`, alone as a peft adapter folder (`export_adapter`). With `to="gguf"`,
    `out_dir` is the one GGUF file written instead, weights stored as `outtype` (`export_gguf`).
    An existing non-empty `out_dir` is replaced only with `force`. Raises `UserError` (an
    `ExportError` for a part transformers lacks) naming the run, the part or the folder, and the fix."""
    if to not in EXPORT_FORMATS:
        raise UserError(f"cannot export to {to!r}; the formats are {', '.join(EXPORT_FORMATS)}")
    run_dir, out_dir = Path(run_dir), Path(out_dir)
    if to == "gguf":
        if adapter:
            raise UserError("--adapter writes a peft folder; a GGUF file holds the merged model, export without it")
        return export_gguf(run_dir, out_dir, force=force, checkpoint=checkpoint, outtype=outtype)
    if adapter:
        return export_adapter(run_dir, out_dir, force=force, checkpoint=checkpoint)
    run = load_run(run_dir, checkpoint=checkpoint)
    try:
        hf, max_length = hf_checkpoint_of_run(run)
    except ExportError as e:
        raise ExportError(f"{run_dir}: {e}") from None
    files = tokenizer_files(run.tokenizer, max_length=max_length)

    def write(folder: Path) -> list[str]:
        names = save_hf_checkpoint(hf, folder)
        for name, text in files.items():
            (folder / name).write_text(text, encoding="utf-8")
        return [*names, *files]

    written = write_folder_atomically(out_dir, write, force=force, keep=run_dir)
    return Exported(out_dir, hf.config["architectures"][0], run.step, written)


def export_gguf(
    run_dir: Path, out: Path, *, force: bool = False, checkpoint: str = "best", outtype: str = "f32"
) -> Exported:
    """A language-model run's GPT (GPT-2's or Llama's parts) and byte-level BPE tokenizer as the
    GGUF file `out` (`attnlab.models.hf.gguf_export`), written under a temporary name and renamed
    into place; an existing `out` is replaced only with `force`."""
    from attnlab.models.hf.gguf_export import write_gguf

    if out.is_dir():
        raise UserError(f"{out} is a folder; --to gguf writes one file, give its path (e.g. model.gguf)")
    if out.exists() and not force:
        raise UserError(f"{out} already exists; pass --force to replace it, or choose another file")
    run = load_run(run_dir, checkpoint=checkpoint)
    if run.config.task != "language-model" or not isinstance(run.model, GPT):
        raise ExportError(f"{run_dir}: GGUF holds GPT language models; this run's task is {run.config.task!r}")
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = out.with_name(f".{out.name}.export-{os.getpid()}")
    try:
        architecture = write_gguf(run.model, run.tokenizer, staging, outtype=outtype, name=run_dir.name)
        os.replace(staging, out)
    except ExportError as e:
        raise ExportError(f"{run_dir}: {e}") from None
    finally:
        staging.unlink(missing_ok=True)  # left only when writing failed
    return Exported(out, f"GGUF {architecture} ({outtype})", run.step, [out.name])


def export_adapter(run_dir: Path, out_dir: Path, *, force: bool = False, checkpoint: str = "best") -> Exported:
    """A LoRA run's adapters (and new head) as a peft adapter folder `out_dir` (adapter_config.json,
    adapter_model.safetensors): `peft.PeftModel.from_pretrained(base, out_dir)` on the transformers
    model of the run's base (`attnlab export BASE --to hf`, or the Hugging Face folder it started
    from) computes what the run computes."""
    run = load_run(run_dir, checkpoint=checkpoint, merge_lora=False)
    lora = run.config.train.lora
    if lora is None:
        raise UserError(f"{run_dir} is not a LoRA run (it has no train.lora); export it without --adapter")
    try:
        config, tensors = peft_adapter(run.model, dropout=lora.dropout, base=getattr(run.config.data, "init_from", ""))
    except ExportError as e:
        raise ExportError(f"{run_dir}: {e}") from None

    def write(folder: Path) -> list[str]:
        (folder / ADAPTER_CONFIG).write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
        save_file(tensors, str(folder / ADAPTER_WEIGHTS), metadata={"format": "pt"})
        return [ADAPTER_CONFIG, ADAPTER_WEIGHTS]

    written = write_folder_atomically(out_dir, write, force=force, keep=run_dir)
    return Exported(out_dir, f"peft LoRA adapter ({config['task_type']})", run.step, written)


def write_folder_atomically(
    out_dir: Path, write: Callable[[Path], list[str]], *, force: bool, keep: Path | None = None
) -> list[str]:
    """Fill a fresh temporary folder beside `out_dir` with `write(folder) -> file names`, then
    rename it to `out_dir`. A non-empty `out_dir` is refused unless `force`, and a folder holding
    `keep` (the run itself) always is. Returns what `write` returned."""
    if out_dir.exists() and not out_dir.is_dir():
        raise UserError(f"{out_dir} is a file, not a folder; give a folder to export into")
    if keep is not None and keep.resolve().is_relative_to(out_dir.resolve()):
        raise UserError(f"{out_dir} holds the run {keep} itself; export into another folder")
    if out_dir.is_dir() and any(out_dir.iterdir()) and not force:
        raise UserError(
            f"{out_dir} already exists and is not empty; pass --force to replace it, or choose another folder"
        )
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = _fresh_folder(out_dir, "export")
    try:
        names = write(staging)
        if out_dir.is_dir() and any(out_dir.iterdir()):
            # Move the old folder aside first: a rename cannot replace a non-empty folder.
            old = out_dir.with_name(f".{out_dir.name}.old-{os.getpid()}")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(out_dir, old)
            os.replace(staging, out_dir)
            shutil.rmtree(old)
        else:
            os.replace(staging, out_dir)  # replaces an empty folder in one step
    finally:
        shutil.rmtree(staging, ignore_errors=True)  # left only when writing failed
    return names


def _fresh_folder(beside: Path, what: str) -> Path:
    """An empty folder `.NAME.WHAT-PID` beside `beside`, made with the user's umask (as OUT_DIR
    would be); one left by an earlier crash of this pid is removed first."""
    folder = beside.with_name(f".{beside.name}.{what}-{os.getpid()}")
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir()
    return folder
