"""Sampling images pixel by pixel in raster order, from any image density model of the images task.

Training sees every pixel at once (one masked pass); sampling cannot: pixel i needs pixels < i,
so an H × W image takes H W steps. PixelCNNs rerun the whole network at every step (their
convolutions have no cache); the GPT reuses its KV cache (`attnlab.decode.generate_tokens`).
Image completion (PixelRNN Figure 1) keeps the first rows of a real image and samples the rest.

Shape legend: B batch, H rows, W columns, V = 256 levels.
"""

import torch
from torch import nn
from tqdm.auto import tqdm

from attnlab.decode.sampling import Picker, generate_tokens
from attnlab.models.gpt import GPT
from attnlab.models.pixelcnn import LEVELS
from attnlab.models.pixels import pixel_logits, start_tokens


def sample_images(
    model: nn.Module,
    labels: torch.Tensor,
    pick: Picker,
    *,
    shape: tuple[int, int] = (28, 28),
    given: torch.Tensor | None = None,
    given_rows: int = 0,
    progress: bool = False,
) -> torch.Tensor:
    """B images `(B, H, W)` uint8 for the classes labels `(B,)` (ignored by unconditional models).

    given `(B, H, W)`, given_rows: keep the first `given_rows` rows of `given` and sample the rest.
    pick: logits `(B, 256)` -> values `(B,)` (e.g. `sampling_picker(1.0, generator=g)`)."""
    h, w = shape
    b = labels.size(0)
    x = torch.zeros(b, h, w, dtype=torch.long, device=labels.device)
    if given_rows:
        x[:, :given_rows] = given[:, :given_rows].long()
    steps = range(given_rows * w, h * w)
    bar = tqdm(total=len(steps), disable=not progress, unit="px", desc="sampling", leave=False)
    was_training = model.training
    model.eval()
    try:
        if isinstance(model, GPT):
            prompt = torch.cat([start_tokens(model.config, labels)[:, None], x.view(b, -1)[:, : steps.start]], dim=1)
            # A pixel is never a start token: those logits are left out before picking.
            tokens = generate_tokens(model, prompt, len(steps), lambda logits: pick(logits[:, :LEVELS]))
            for i, token in zip(steps, tokens, strict=True):
                x.view(b, -1)[:, i] = token
                bar.update(1)
        else:
            with torch.inference_mode():
                for i in steps:
                    r, c = divmod(i, w)
                    x[:, r, c] = pick(pixel_logits(model, x, labels)[:, :, r, c])
                    bar.update(1)
    finally:
        bar.close()
        model.train(was_training)
    return x.to(torch.uint8)
