"""`attnlab attention VIT_RUN --image SPLIT:INDEX`: the flags checked, then one library call,
`attnlab.viz.images.draw_cls_attention(run, (split, index), out, ...)`, printed."""

import argparse
from pathlib import Path

from attnlab.errors import UserError


def draw_cls_attention(args: argparse.Namespace) -> int:
    from attnlab import load
    from attnlab.device import resolve_device
    from attnlab.viz.figure import check_png_path, png_size
    from attnlab.viz.images import draw_cls_attention

    if args.kind is not None:
        raise UserError("--kind goes with translation runs; a ViT has one kind of attention")
    out = check_png_path(args.out if args.out is not None else Path("attention.png"))
    loaded = load(args.run_dir, device=resolve_device(args.device), checkpoint=args.checkpoint)
    drawn = draw_cls_attention(loaded, args.image, out, layer=args.layer, head=args.head, data_dir=args.data_dir)
    if args.json:
        from attnlab.cli import print_json

        print_json(
            {
                "out": str(drawn.path),
                "label": drawn.label,
                "predicted": drawn.predicted,
                "layer": drawn.layer,
                "head": drawn.head,
                "attention": drawn.attention.tolist(),
            }
        )
        return 0
    width, height = png_size(drawn.path)
    print(f"[CLS] attention ({drawn.title}); {width} x {height} px saved to {drawn.path}")
    return 0
