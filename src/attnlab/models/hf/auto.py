"""A Hugging Face causal language model folder -> the attnlab `GPT` and tokenizer, whatever its family.

config.json's `model_type` picks the importer (the one field transformers' own `AutoModel` reads
for this); the folder's `tokenizer.json` gives the tokenizer. This is what `attnlab sample FOLDER`
uses on a folder that holds a config.json instead of an attnlab run's config.toml.

The way back, `causal_lm_export(model)`: a `GPT` with GPT-2's parts becomes a GPT-2 checkpoint, one
with Llama's a Llama checkpoint, and one with neither is refused, naming what the nearer of the two
lacks.
"""

import dataclasses
import functools
from collections.abc import Callable
from pathlib import Path

import torch

import attnlab.families as families
from attnlab.data.tokenizers import BPETokenizer
from attnlab.errors import CheckpointError
from attnlab.models.gpt import GPT
from attnlab.models.hf._common import (
    HFCheckpoint,
    HFSource,
    as_source,
    read_lm_tokenizer,
    refusal,
)
from attnlab.models.hf.bert import load_bert
from attnlab.models.hf.decoders import GEMMA3, LLAMA, MISTRAL, PHI3, QWEN2, QWEN3, QWEN3_MOE, SMOLLM3, export_decoder
from attnlab.models.hf.gemma import load_gemma3
from attnlab.models.hf.gpt2 import gpt2_export, gpt2_export_problems, load_gpt2
from attnlab.models.hf.llama import load_llama
from attnlab.models.hf.mistral import load_mistral, load_smollm3
from attnlab.models.hf.mixtral import load_mixtral
from attnlab.models.hf.modernbert import load_modernbert
from attnlab.models.hf.phi3 import load_phi3
from attnlab.models.hf.qwen import load_qwen2, load_qwen3, load_qwen3_moe
from attnlab.models.hf.roberta import load_roberta

# The Llama-shaped export targets, in the order `causal_lm_export` tries them.
DECODER_SHAPES = (LLAMA, QWEN2, QWEN3, QWEN3_MOE, MISTRAL, SMOLLM3, GEMMA3, PHI3)

# config.json model_type -> the importer of that family: every model_type of `attnlab.families`'
# causal LMs (tests/test_families.py checks that the two agree).
CAUSAL_LM_LOADERS: dict[str, Callable[..., GPT]] = {
    "gpt2": load_gpt2,
    "llama": load_llama,
    "mixtral": load_mixtral,
    "mistral": load_mistral,
    "qwen2": load_qwen2,
    "qwen3": load_qwen3,
    "qwen3_moe": load_qwen3_moe,
    "smollm3": load_smollm3,
    "gemma3_text": load_gemma3,
    "phi3": load_phi3,
}
# The same for the encoders (BERT's kind): model_type -> the importer of a `LoadedBert`.
ENCODER_LOADERS: dict[str, Callable[..., object]] = {
    "bert": load_bert,
    "roberta": load_roberta,
    "modernbert": load_modernbert,
}


@dataclasses.dataclass
class LoadedCausalLM:
    """A Hugging Face causal language model checkpoint as attnlab objects."""

    model: GPT
    """In eval mode."""
    tokenizer: BPETokenizer
    """The folder's tokenizer.json, with config.json's bos / eos ids; it adds what the file's
    post-processor adds when encoding (Llama's "<s>")."""
    model_type: str
    """config.json's model_type: one of `CAUSAL_LM_LOADERS`."""
    chat_template: str | None = None
    """The Jinja chat template the checkpoint carries (a GGUF file's `tokenizer.chat_template`);
    None where it has none, or where it is read from the folder's files by the caller."""
    origin: str = ""
    """Where the model came from, in words: the folder or file read."""


def causal_lm_model(folder: str | Path | HFSource, *, dtype: torch.dtype = torch.float32) -> GPT:
    """The model alone of a causal LM checkpoint (`folder`, or a config and tensors read from
    another file), built by its family's importer. Raises `CheckpointError` for a model_type that is
    not a causal LM of `attnlab.families`, or any problem with the files."""
    source = as_source(folder, "Hugging Face")
    model_type = source.config.get("model_type")
    if model_type not in CAUSAL_LM_LOADERS:
        family = families.by_model_type(model_type)
        kind = (
            f"is a {family.name} ({family.kind}), not a causal language model"
            if family
            else "is not one attnlab builds"
        )
        raise CheckpointError(
            f"{source.config_path}: model_type {model_type!r} {kind}; attnlab reads causal language models of "
            f"{families.names(families.CAUSAL_LM)}"
        )
    return CAUSAL_LM_LOADERS[model_type](source, dtype=dtype)


def load_causal_lm(folder: str | Path, *, dtype: torch.dtype = torch.float32) -> LoadedCausalLM:
    """Load the causal LM checkpoint in `folder` (config.json, weights, tokenizer.json; any causal
    family of `attnlab.families`) with its tokenizer. Raises `CheckpointError` for another model_type
    or any problem with the files."""
    source = as_source(folder, "Hugging Face")
    model = causal_lm_model(source, dtype=dtype)
    tokenizer = read_lm_tokenizer(Path(folder), source.config, str(source.config_path), model.config.vocab_size)
    return LoadedCausalLM(model=model, tokenizer=tokenizer, model_type=source.config["model_type"], origin=str(folder))


# The causal LM families a GPT can be exported as, in order of preference: (name, what it lacks, exporter).
CAUSAL_LM_EXPORTERS: tuple[tuple[str, Callable[..., list[str]], Callable[[GPT], HFCheckpoint]], ...] = (
    ("GPT-2", gpt2_export_problems, gpt2_export),
    *((shape.name, shape.problems, functools.partial(export_decoder, shape=shape)) for shape in DECODER_SHAPES),
)


def causal_lm_export(model: GPT) -> HFCheckpoint:
    """`model` as the first family of `CAUSAL_LM_EXPORTERS` that has all its parts. Raises
    `ExportError` naming what the nearest family (the one lacking fewest parts) lacks.
    Example: a GPT with ALiBi -> "cannot export to transformers GPT-2: positions = 'alibi' (...)"."""
    problems = {name: lacks(model.config) for name, lacks, _ in CAUSAL_LM_EXPORTERS}
    for name, _, export in CAUSAL_LM_EXPORTERS:
        if not problems[name]:
            return export(model)
    nearest = min(problems, key=lambda name: len(problems[name]))  # the first of equals: GPT-2
    raise refusal(problems[nearest], nearest)
