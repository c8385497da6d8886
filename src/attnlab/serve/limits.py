"""The caps a server enforces on every request, so no request can hold a model for long or grow a
pile of work without bound. A request past a cap gets a 400 naming the field and the cap; a model
whose queue is full answers 429 with Retry-After."""

from dataclasses import dataclass, fields


@dataclass(frozen=True)
class Limits:
    """Per-request caps and per-model queue bounds of `attnlab serve` (its command-line flags)."""

    max_tokens: int = 1024
    """Most new tokens one completion may ask for (`max_tokens`)."""
    max_n: int = 8
    """Most completions one request may ask for: `n` times the number of prompts."""
    max_prompt_tokens: int | None = None
    """Longest prompt in tokens; None: the worker's default. A prompt past the model's context is
    only echoed (max_tokens 0), unless `past_context`."""
    max_text_chars: int = 20_000
    """Longest text in characters, in any field, checked before tokenizing."""
    max_body_bytes: int = 4_000_000
    """Largest request body (its Content-Length); past it: 413."""
    max_inputs: int = 64
    """Most texts in one classification or tagging request."""
    max_beam: int = 16
    """Largest beam of a translation or of the translation behind a cross-attention map."""
    max_attention_tokens: int = 128
    """Longest text whose attention maps are sent (the maps grow with the square of its length)."""
    max_batch: int = 32
    """Streams one language model decodes together (one batched forward per step)."""
    max_queue: int = 64
    """Requests that may wait for one model, beyond those running; past it: 429."""
    batched: bool = True
    """False decodes one request at a time (the baseline of the batching benchmark)."""
    fused: bool | None = None
    """The language models' decoding step as one C++ call (`attnlab.accel.fused`); None: where it
    is built and covers the model, as `attnlab sample` does."""
    weights: str | None = "fp32"
    """How the fused step stores the language models' weights (`attnlab.accel.fused.WEIGHT_FORMATS`);
    None: each model's checkpoint decides (a Q8_0 GGUF file's int8, fp32 elsewhere:
    `attnlab.tasks.sources.default_weights`). A model the step does not cover decodes with fp32."""
    cache_memory: int = 1 << 30
    """Bytes of recent prompts' keys and values each language model keeps, in blocks found again by
    their token prefix (`attnlab.decode.prefix_cache`), so that a prompt beginning as an earlier one
    did prefills only the rest; taken as blocks are stored. 0: no prefix cache."""
    tools: tuple[str, ...] = ()
    """The tools the server answers itself in chat replies (`attnlab.serve.server_tools`: the
    calculator), by name; () none."""
    past_context: bool = False
    """False: a completion stops where its prompt and its tokens fill the model's context
    (finish_reason "length"), and a prompt that fills it alone is refused. True: a language model
    goes on past its context, each token read from the last block_size before it, as `attnlab
    sample` does (a toy model's long samples). A window-attention model whose cache rolls has no
    such end either way."""

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            low = 0 if f.name == "cache_memory" else 1
            if isinstance(value, int) and not isinstance(value, bool) and value < low:
                raise ValueError(f"{f.name} must be >= {low}, got {value}")
