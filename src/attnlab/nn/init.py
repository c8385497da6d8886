"""Weight initialisation shared by the GPT-2 and BERT families."""

from torch import nn

EMBEDDING_STD = 0.02
"""GPT-2's and BERT's initial spread of weights and embeddings."""


def normal_init(module: nn.Module, std: float = EMBEDDING_STD) -> None:
    """GPT-2's and BERT's initialiser, for `model.apply`: linear and embedding weights from
    N(0, std²) (BERT truncates at 2σ; a plain normal is close enough), zero biases, LayerNorm 1/0."""
    if isinstance(module, nn.Linear):
        nn.init.normal_(module.weight, mean=0.0, std=std)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.Embedding):
        nn.init.normal_(module.weight, mean=0.0, std=std)
    elif isinstance(module, nn.LayerNorm):
        if module.weight is not None:
            nn.init.ones_(module.weight)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
