"""What one `attnlab cost` run measures: the models by name, the lengths, and `CostSettings`."""

import math
from dataclasses import dataclass

MODELS = ("rnn", "rnn-attention", "transformer")
"""The lectures' three models, measured by every run."""
TRANSFORMERS = {"transformer": "full", "transformer-window": "window", "transformer-bigbird": "bigbird"}
"""The GPTs a run can measure, each with its attention pattern (`GPTConfig.attention`)."""
ATTENTION_MODELS = {pattern: model for model, pattern in TRANSFORMERS.items() if pattern != "full"}
"""Attention pattern -> the model that `CostSettings.attention` adds for it."""
ALL_MODELS = (*MODELS, *ATTENTION_MODELS.values())
MODEL_LABELS = {
    "rnn": "RNN",
    "rnn-attention": "RNN+attention",
    "transformer": "Transformer",
    "transformer-window": "Transformer (window)",
    "transformer-bigbird": "Transformer (BigBird)",
}
SHORT_LABELS = {
    "rnn": "RNN",
    "rnn-attention": "RNN+att",
    "transformer": "Transf.",
    "transformer-window": "Window",
    "transformer-bigbird": "BigBird",
}
"""Labels short enough for the column headers of the measurements."""
KINDS = ("train", "generate")
VOCAB = 64
PAGE = 4096  # bytes: the resolution of resident-set readings
WARMUP_TOKENS = 8
CASE_BUDGET_S = 30.0  # a case whose `repeats` timed calls would take longer is timed once
ATTENTION_CHUNK = 64  # query positions per AdditiveAttention call in a training forward

DEFAULT_LENGTHS = (64, 128, 256, 512, 1024)
QUICK_LENGTHS = (8, 16, 32)


# -- settings --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class CostSettings:
    """What one `attnlab cost` run measures. Validated on construction (ValueError)."""

    lengths: tuple[int, ...] = DEFAULT_LENGTHS
    """Sequence lengths t, strictly increasing, each >= 2."""
    width: int = 64
    """Model width k of every model (GRU state, Transformer d_model)."""
    layers: int = 2
    """Number of layers d of every model."""
    heads: int = 4
    """Attention heads of the Transformer; must divide width."""
    repeats: int = 3
    """Timed calls per case after the untimed memory call (a single one when `repeats` calls would
    take over `CASE_BUDGET_S`); the fastest is reported."""
    passes: int = 1
    """Sweeps over all cases; each case keeps its smallest reading. Passes spread a case's samples
    over the run, so a spell of load from other processes hits one of them, not all."""
    max_memory_mib: float = 4096.0
    """Skip a case whose peak, extrapolated quadratically from the model's previous length, would
    exceed this: the machine may be shared, and an out-of-memory kill can hit another process."""
    fit_from: int | None = None
    """Fit exponents on the lengths >= fit_from; None: the larger half of the lengths (at least two)."""
    attention: tuple[str, ...] = ()
    """Attention patterns measured beside the three models, each as a Transformer of that pattern
    (`ATTENTION_MODELS`: "window", "bigbird"); none by default."""
    attention_window: int = 64
    """Window w of "window": a query sees the last w keys, itself included."""
    attention_block: int = 32
    """Block length b of "bigbird"."""
    global_blocks: int = 1
    """BigBird's global blocks at the start of the sequence."""
    random_blocks: int = 1
    """BigBird's random key blocks per query block."""

    def __post_init__(self) -> None:
        if len(self.lengths) < 2:
            raise ValueError(f"lengths: give at least two lengths to fit a slope, got {list(self.lengths)}")
        if any(t < 2 for t in self.lengths):
            raise ValueError(f"lengths must all be >= 2, got {list(self.lengths)}")
        if any(b <= a for a, b in zip(self.lengths, self.lengths[1:], strict=False)):
            raise ValueError(f"lengths must be strictly increasing, got {list(self.lengths)}")
        if not self.max_memory_mib > 0:
            raise ValueError(f"max_memory_mib must be > 0, got {self.max_memory_mib}")
        for name in ("width", "layers", "heads", "repeats", "passes", "attention_window", "attention_block"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("global_blocks", "random_blocks"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        for pattern in self.attention:
            if pattern not in ATTENTION_MODELS:
                # Linformer is a pattern of attnlab.nn.sparse, but not one a language model can use.
                why = " (linformer mixes every position into k rows: no causal model can use it)"
                raise ValueError(
                    f"attention must be among {', '.join(ATTENTION_MODELS)}, got {pattern!r}"
                    + (why if pattern == "linformer" else "")
                )
        if len(set(self.attention)) != len(self.attention):
            raise ValueError(f"attention names a pattern twice: {list(self.attention)}")
        if self.width % self.heads != 0:
            raise ValueError(f"width ({self.width}) must be divisible by heads ({self.heads})")
        if self.fit_from is not None and len(self.fit_lengths) < 2:
            raise ValueError(
                f"fit_from {self.fit_from} leaves fewer than two lengths to fit; lengths are {list(self.lengths)}"
            )

    @property
    def fit_lengths(self) -> tuple[int, ...]:
        """The lengths the exponents are fitted on: overheads that do not grow with t (Python,
        kernel launches, the constant part of memory) dominate the short ones."""
        if self.fit_from is not None:
            return tuple(t for t in self.lengths if t >= self.fit_from)
        n = max(2, math.ceil(len(self.lengths) / 2))
        return self.lengths[-n:]

    @property
    def models(self) -> tuple[str, ...]:
        """The models measured: MODELS, then one Transformer per pattern of `attention`."""
        return MODELS + tuple(ATTENTION_MODELS[pattern] for pattern in self.attention)

    @classmethod
    def from_json(cls, fields: dict) -> "CostSettings":
        """The settings from `dataclasses.asdict` sent through JSON, which turned tuples into lists."""
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()})
