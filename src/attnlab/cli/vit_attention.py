"""`attnlab attention VIT_RUN --image SPLIT:INDEX`: where [CLS] looks in one image (Dosovitskiy et
al. 2020, Figure 6 draws the same from attention rollout; here one layer's weights, as they are)."""

import argparse
import dataclasses
from pathlib import Path

from attnlab.errors import UserError


def draw_cls_attention(args: argparse.Namespace) -> int:
    from attnlab import load
    from attnlab.data.images import FASHION_CLASSES
    from attnlab.device import resolve_device
    from attnlab.fileio import check_writable
    from attnlab.models.vit import ViT
    from attnlab.tasks.images import SPLITS
    from attnlab.tasks.vision import ImageClassification
    from attnlab.viz.figure import check_png_path, png_size
    from attnlab.viz.images import plot_cls_attention

    if args.kind is not None:
        raise UserError("--kind goes with translation runs; a ViT has one kind of attention")
    path = check_png_path(args.out if args.out is not None else Path("attention.png"))
    check_writable(path)
    split, sep, index = args.image.partition(":")
    if not sep or split not in SPLITS or not index.isdigit():
        raise UserError(f"--image takes SPLIT:INDEX with SPLIT one of {', '.join(SPLITS)}, got {args.image!r}")
    device = resolve_device(args.device)
    loaded = load(args.run_dir, device=device, checkpoint=args.checkpoint)
    if not isinstance(loaded.model, ViT):
        what = f"{loaded.config.task!r} run" + (f" ({loaded.config.model.kind})" if loaded.config.task != "lm" else "")
        raise UserError(f"--image draws a ViT's [CLS] attention; {args.run_dir} is a {what}")
    c = loaded.config.model
    for flag, value, count in (("--layer", args.layer, c.n_layers), ("--head", args.head, c.n_heads)):
        if value is not None and value >= count:
            raise UserError(f"{flag} {value}: the model has {count} ({flag[2:]}s 0-{count - 1})")
    data = loaded.config.data
    if args.data_dir:
        data = dataclasses.replace(data, data_dir=args.data_dir)
    task = ImageClassification(data, c, loaded.path, resume=True, splits=(split,))
    image, label = task.image(split, int(index))
    weights = loaded.model.cls_attention(image[None].to(device))[0].cpu()  # (layers, heads, G, G)
    layer = c.n_layers - 1 if args.layer is None else args.layer
    shown = weights[layer].mean(0) if args.head is None else weights[layer, args.head]
    predicted = int(loaded.model(image[None].to(device)).argmax(-1))
    names = FASHION_CLASSES if c.n_classes == len(FASHION_CLASSES) else [str(i) for i in range(c.n_classes)]
    heads = "mean of the heads" if args.head is None else f"head {args.head}"
    title = f"{split} image {index}: {names[label]}, predicted {names[predicted]}; layer {layer}, {heads}"
    plot_cls_attention(image.numpy(), shown.numpy(), path, title=title, tokens=loaded.model.patch_embed.tokens)
    width, height = png_size(path)
    if args.json:
        from attnlab.cli import print_json

        print_json(
            {
                "out": str(path),
                "label": label,
                "predicted": predicted,
                "layer": layer,
                "head": args.head,
                "attention": shown.tolist(),
            }
        )
        return 0
    print(f"[CLS] attention ({title}); {width} x {height} px saved to {path}")
    return 0
