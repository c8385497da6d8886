"""The checkpoint families attnlab reads: the one table a new family registers in.

Each row names a family as people call it ("Qwen3"), the `model_type` values of its config.json
(transformers' names), the `general.architecture` of its GGUF files (llama.cpp's names) and what
kind of model it is. The help texts and refusals of every command that takes a checkpoint are
written from this table (`names`), never by hand (`tests/test_families.py` fails on a help text
that lists families itself), and the importers (`attnlab.models.hf.auto.CAUSAL_LM_LOADERS`,
`attnlab.models.hf.auto.ENCODER_LOADERS`) must cover exactly its rows.

It imports nothing but the standard library: the command line reads it before PyTorch is imported.
"""

from dataclasses import dataclass

CAUSAL_LM = "causal-lm"
"""A decoder-only language model: sample, serve, eval, attention, train --init-from, export."""
ENCODER = "encoder"
"""A bidirectional encoder (BERT's kind): embed, serve (embeddings), attention, train --init-from."""
KINDS = (CAUSAL_LM, ENCODER)


@dataclass(frozen=True)
class Family:
    """One family of published checkpoints."""

    name: str
    """As people write it: "Llama", "Qwen3"."""
    model_types: tuple[str, ...]
    """config.json's `model_type` values that are this family (transformers' own names)."""
    kind: str
    """One of `KINDS`."""
    gguf_architectures: tuple[str, ...] = ()
    """GGUF `general.architecture` values read as this family (llama.cpp's names); empty: no GGUF."""
    gguf_export: bool = False
    """Whether `attnlab export --to gguf` writes runs of this family's parts."""


FAMILIES: tuple[Family, ...] = (
    Family("GPT-2", ("gpt2",), CAUSAL_LM, ("gpt2",), gguf_export=True),
    Family("Llama", ("llama",), CAUSAL_LM, ("llama",), gguf_export=True),
    Family("Mixtral", ("mixtral",), CAUSAL_LM),
    Family("Mistral", ("mistral",), CAUSAL_LM),
    Family("Qwen2", ("qwen2",), CAUSAL_LM, ("qwen2",)),
    Family("Qwen3", ("qwen3",), CAUSAL_LM, ("qwen3",)),
    Family("Qwen3-MoE", ("qwen3_moe",), CAUSAL_LM),
    Family("SmolLM3", ("smollm3",), CAUSAL_LM, ("smollm3",)),
    Family("Gemma 3", ("gemma3_text",), CAUSAL_LM, ("gemma3",)),
    Family("Phi-3", ("phi3",), CAUSAL_LM, ("phi3",)),
    Family("BERT", ("bert",), ENCODER),
    Family("RoBERTa", ("roberta",), ENCODER),
    Family("ModernBERT", ("modernbert",), ENCODER),
)


def of_kind(kind: str) -> tuple[Family, ...]:
    """The families of one kind, in the table's order."""
    return tuple(f for f in FAMILIES if f.kind == kind)


def names(kind: str | None = None) -> str:
    """The families' names as a sentence's list: "GPT-2, Llama or Mixtral" (all kinds when None)."""
    chosen = [f.name for f in (FAMILIES if kind is None else of_kind(kind))]
    return chosen[0] if len(chosen) == 1 else ", ".join(chosen[:-1]) + " or " + chosen[-1]


def by_model_type(model_type: object) -> Family | None:
    """The family whose config.json says this `model_type`; None for one attnlab does not read."""
    return next((f for f in FAMILIES if model_type in f.model_types), None)


def by_gguf_architecture(architecture: object) -> Family | None:
    """The family of a GGUF file's `general.architecture`; None for one attnlab does not read."""
    return next((f for f in FAMILIES if architecture in f.gguf_architectures), None)


def model_types(kind: str | None = None) -> list[str]:
    """Every model_type of the families of `kind` (all when None), sorted."""
    return sorted(t for f in FAMILIES if kind is None or f.kind == kind for t in f.model_types)
