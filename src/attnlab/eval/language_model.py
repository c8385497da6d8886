"""A causal language model ready to score and continue text, whatever it was loaded from: what
perplexity (`attnlab.eval.perplexity`) and lm-evaluation-harness (`attnlab.eval.harness`) evaluate.
Loading one (a run folder, a Hugging Face causal-LM folder or a GGUF file) is
`attnlab.studies.language_model.load_language_model`, above the tasks and training it reads through.
"""

from dataclasses import dataclass
from pathlib import Path

from attnlab.data.tokenizers import BPETokenizer, Tokenizer
from attnlab.models import GPT


@dataclass
class LanguageModel:
    """A causal language model ready to score and continue text."""

    path: Path
    model: GPT
    """In eval mode, on the device asked for."""
    tokenizer: Tokenizer
    context: int
    """The context it was trained or published with: block_size, or a Hugging Face config's
    n_positions / max_position_embeddings."""
    max_context: int | None
    """The most tokens it may read at once: `context` for a Hugging Face folder (its config says
    so), the position scheme's limit for a run (None: computed positions run past training)."""
    source: str
    """"run", a Hugging Face folder's model_type ("llama") or a GGUF file's general.architecture."""


def encode(tokenizer: Tokenizer, text: str, *, special: bool | None = None) -> list[int]:
    """text -> token ids. special: None encodes as the tokenizer does by default (a Hugging Face
    tokenizer.json's post-processor adds Llama's "<s>"), False without the special tokens a
    post-processor adds, True with them. Tokenizers without special tokens ignore it."""
    if special is None or not isinstance(tokenizer, BPETokenizer):
        return tokenizer.encode(text)
    return tokenizer.tokenizer.encode(text, add_special_tokens=special).ids
