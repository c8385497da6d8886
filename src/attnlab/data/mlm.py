"""BERT's masked-language-model corruption (Devlin et al. 2019, §3.1 "Task #1: Masked LM", Appendix A.1).

Each ordinary token is chosen for prediction with probability 15%. A chosen token is replaced by
[MASK] 80% of the time, by a random token 10% of the time, and left unchanged 10% of the time; the
model must predict the original token at every chosen position, and nowhere else. The paper gives
the reason for not always using [MASK]: "[MASK] does not appear during fine-tuning", so the model
must keep a good representation of every input token, not only of the masked ones.

Shape legend: B batch, T time.
"""

from collections.abc import Sequence

import torch

IGNORE_INDEX = -100  # the default ignore_index of torch.nn.functional.cross_entropy


def mask_tokens(
    ids: torch.Tensor,
    *,
    mask_id: int,
    vocab_size: int,
    special_ids: Sequence[int],
    generator: torch.Generator,
    mask_prob: float = 0.15,
    replace_prob: float = 0.8,
    random_prob: float = 0.1,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Corrupt a batch for masked-LM training: ids `(B, T)` long -> (inputs `(B, T)`, labels `(B, T)`).

    Every position whose id is not in `special_ids` is chosen with probability `mask_prob`,
    independently (so the number chosen varies from row to row; BERT's own data script fixed it per
    sequence, most reimplementations draw per token). `special_ids` lists what must never be
    chosen (pad, [CLS], [SEP], [MASK]; an unknown token may well be chosen, so leave it out).
    Of the chosen positions, `replace_prob` become `mask_id`, `random_prob` a token drawn uniformly
    from the ids that are neither special nor `mask_id`, and the rest keep their token. A random
    draw may hit the original token, so slightly fewer than `random_prob` of the chosen positions
    actually change that way.

    `labels` holds the original id at chosen positions and IGNORE_INDEX elsewhere, ready for
    `F.cross_entropy(logits.flatten(0, 1), labels.flatten())`. `ids` is not modified. The same
    generator state gives the same result, whatever the content of `ids`: the random draws depend
    only on its shape. The generator must live on `ids.device`.

    Example: ids [[cls, 7, 8, sep]] might give inputs [[cls, mask, 8, sep]], labels [[-100, 7, -100, -100]].
    """
    for name, p in (("mask_prob", mask_prob), ("replace_prob", replace_prob), ("random_prob", random_prob)):
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"{name} must be in [0, 1], got {p}")
    if replace_prob + random_prob > 1.0:
        raise ValueError(
            "replace_prob + random_prob must be at most 1 (the rest stay unchanged), "
            f"got {replace_prob} + {random_prob}"
        )
    if not 0 <= mask_id < vocab_size:
        raise ValueError(f"mask_id must be in [0, vocab_size={vocab_size}), got {mask_id}")
    if ids.dtype != torch.long:
        raise ValueError(f"ids must be a long tensor of token ids, got {ids.dtype}")

    special = torch.tensor(list(special_ids), dtype=torch.long, device=ids.device)
    # mask_id is never a random replacement, even if the caller left it out of special_ids: the
    # random case exists to show the model a real token where it must predict another.
    candidates = torch.arange(vocab_size, device=ids.device)
    candidates = candidates[~torch.isin(candidates, special) & (candidates != mask_id)]
    if random_prob > 0 and len(candidates) == 0:
        raise ValueError(f"no token id in [0, {vocab_size}) is left for random replacement once specials are excluded")

    # Draw every random number up front, for every position: the result then depends on the
    # generator and the shape only, never on which tokens happen to be special.
    choose_draw = torch.rand(ids.shape, generator=generator, device=ids.device)
    how_draw = torch.rand(ids.shape, generator=generator, device=ids.device)
    random_draw = torch.randint(max(len(candidates), 1), ids.shape, generator=generator, device=ids.device)

    chosen = (choose_draw < mask_prob) & ~torch.isin(ids, special)
    to_mask = chosen & (how_draw < replace_prob)
    to_random = chosen & (how_draw >= replace_prob) & (how_draw < replace_prob + random_prob)

    inputs = ids.masked_fill(to_mask, mask_id)  # a new tensor: ids stays as it was
    if len(candidates) > 0:
        inputs = torch.where(to_random, candidates[random_draw], inputs)
    labels = ids.masked_fill(~chosen, IGNORE_INDEX)
    return inputs, labels
