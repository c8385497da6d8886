"""What `attnlab bench` measures: the GPT shapes, the training and generation cases, the attention lengths."""

from dataclasses import dataclass

import torch

SHAPES = {
    "4x4x128": dict(n_layers=4, n_heads=4, d_model=128),
    "6x6x384": dict(n_layers=6, n_heads=6, d_model=384),
}
"""GPT shapes by name, "{n_layers}x{n_heads}x{d_model}"."""
VOCAB = 65  # Tiny Shakespeare characters
PROMPT_LEN = 8
GENERATE_BLOCK = 256  # 8 + 200 tokens need more than the 64 positions of the small training block
PEER = "transformers"

ATTENTION_PATHS = ("explicit", "fused")
ATTENTION_HEADS, ATTENTION_HEAD_DIM = 4, 64


@dataclass(frozen=True)
class TrainCase:
    shape: str
    block: int
    batch: int

    @property
    def label(self) -> str:
        return f"train {self.shape} block {self.block} batch {self.batch}"


@dataclass(frozen=True)
class GenerateCase:
    shape: str
    batch: int
    new_tokens: int

    @property
    def label(self) -> str:
        return f"generate {self.shape} batch {self.batch}"


def train_cases(device: torch.device, quick: bool) -> list[TrainCase]:
    """nanoGPT's CPU recipe shape (block 64, batch 12) and the shakespeare-char shape (block 256).
    A GPU gets batch 64 for the larger shape, to give it enough work per step; --quick keeps the
    shapes but shrinks block and batch, since it only checks that everything runs."""
    if quick:
        return [TrainCase("4x4x128", 32, 2), TrainCase("6x6x384", 32, 2)]
    return [TrainCase("4x4x128", 64, 12), TrainCase("6x6x384", 256, 64 if device.type == "cuda" else 12)]


def generate_cases(quick: bool) -> list[GenerateCase]:
    new_tokens = 20 if quick else 200
    return [
        GenerateCase("6x6x384", 1, new_tokens),
        GenerateCase("6x6x384", 8, new_tokens),
        GenerateCase("4x4x128", 1, new_tokens),
    ]


def attention_lengths(quick: bool) -> tuple[int, ...]:
    return (64, 128, 256) if quick else (1024, 2048, 4096)
