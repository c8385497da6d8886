"""A Hugging Face causal language model folder -> the attnlab `GPT` and tokenizer, whatever its family.

config.json's `model_type` picks the importer (the one field transformers' own `AutoModel` reads
for this); the folder's `tokenizer.json` gives the tokenizer. This is what `attnlab sample FOLDER`
uses on a folder that holds a config.json instead of an attnlab run's config.toml.

The way back, `causal_lm_export(model)`: a `GPT` with GPT-2's parts becomes a GPT-2 checkpoint, one
with Llama's a Llama checkpoint, and one with neither is refused, naming what the nearer of the two
lacks.
"""

import dataclasses
from collections.abc import Callable
from pathlib import Path

import torch

from attnlab.data.tokenizers import BPETokenizer
from attnlab.errors import CheckpointError
from attnlab.models.gpt import GPT
from attnlab.models.hf._common import CONFIG_FILE, HFCheckpoint, read_hf_config, read_lm_tokenizer, refusal
from attnlab.models.hf.gpt2 import gpt2_export, gpt2_export_problems, load_gpt2
from attnlab.models.hf.llama import llama_export, llama_export_problems, load_llama
from attnlab.models.hf.mixtral import load_mixtral

# config.json model_type -> the importer of that family.
CAUSAL_LM_LOADERS: dict[str, Callable[..., GPT]] = {
    "gpt2": load_gpt2,
    "llama": load_llama,
    "mixtral": load_mixtral,
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


def is_hf_folder(path: str | Path) -> bool:
    """Whether `path` is a Hugging Face checkpoint folder (a config.json) rather than an attnlab run."""
    path = Path(path)
    # An attnlab run folder's config is config.toml (attnlab.checkpoints.CONFIG).
    return (path / CONFIG_FILE).is_file() and not (path / "config.toml").is_file()


def load_causal_lm(folder: str | Path, *, dtype: torch.dtype = torch.float32) -> LoadedCausalLM:
    """Load the GPT-2, Llama or Mixtral checkpoint in `folder` (config.json, weights,
    tokenizer.json) with its tokenizer. Raises `CheckpointError` for another model_type or any
    problem with the files."""
    folder = Path(folder)
    config_path, hf_config = read_hf_config(
        folder, "Hugging Face", f"{CONFIG_FILE}, model.safetensors and tokenizer.json"
    )
    model_type = hf_config.get("model_type")
    if model_type not in CAUSAL_LM_LOADERS:
        raise CheckpointError(
            f"{config_path}: model_type is {model_type!r}; attnlab can sample from {sorted(CAUSAL_LM_LOADERS)}"
        )
    model = CAUSAL_LM_LOADERS[model_type](folder, dtype=dtype)
    tokenizer = read_lm_tokenizer(folder, hf_config, str(config_path), model.config.vocab_size)
    return LoadedCausalLM(model=model, tokenizer=tokenizer, model_type=model_type)


# The causal LM families a GPT can be exported as, in order of preference: (name, what it lacks, exporter).
CAUSAL_LM_EXPORTERS: tuple[tuple[str, Callable[..., list[str]], Callable[[GPT], HFCheckpoint]], ...] = (
    ("GPT-2", gpt2_export_problems, gpt2_export),
    ("Llama", llama_export_problems, llama_export),
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
