"""attnlab attention RUN|HF_FOLDER|GGUF --text TEXT [--layer L] [--head H] [--kind self|cross]
[--out FILE.png|FILE.html]
attnlab attention RUN --node ID [--out FILE.png]  (a GAT run)
attnlab attention RUN --image SPLIT:INDEX [--layer L] [--head H] [--out FILE.png]  (a ViT run)

--text: `attnlab.viz.attention_maps` (of what `attnlab.train.load.load_any` loads: a run, a
Hugging Face folder, a GGUF file), drawn by `attnlab.viz.plot_attention` or `write_attention_html`; --node:
`attnlab.viz.graph_attention.draw_node_attention`; --image: `attnlab.viz.images.draw_cls_attention`."""

import argparse
from pathlib import Path

from attnlab.cli import non_negative_int, positive_int
from attnlab.cli.arguments import (
    add_checkpoint_argument,
    add_data_dir_argument,
    add_device_argument,
    add_json_argument,
    split_index,
)
from attnlab.families import names
from attnlab.sources import TAKES, takes_words


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "attention",
        help="draw a trained model's attention weights for a text",
        description="Draw the attention weights of a trained run for --text: every head of one layer in a grid, "
        "or one head (PNG), or all layers and heads with a layer/head picker and the exact weight under the "
        "pointer (one self-contained HTML page). Language models show causal self-attention, BERT models "
        "bidirectional self-attention, translation models the decoder's cross-attention from the translation "
        "of --text to --text (--kind self: the encoder's self-attention). "
        f"A Hugging Face {names()} folder (config.json, the weights, tokenizer.json) or a GGUF file is drawn as "
        "a run of its kind. A GAT run (node classification) takes --node ID "
        "instead: the node's neighbourhood with each edge weighted by each head's attention, and "
        "histograms of every layer's attention entropy against uniform attention (PNG). A ViT run takes --image "
        "SPLIT:INDEX: the attention from [CLS] to each patch drawn over the image (the last layer's, averaged over "
        "heads, unless --layer and --head say otherwise).",
    )
    p.add_argument(
        "run_dir",
        metavar="RUN",
        help=takes_words(TAKES["attention"]),
    )
    p.add_argument("--text", help="the text to look at (translation: the source sentence)")
    p.add_argument("--node", type=int, metavar="ID", help="a GAT run: the node whose neighbourhood to draw")
    p.add_argument(
        "--image", type=split_index, metavar="SPLIT:INDEX", help="a ViT run: the image to look at, e.g. test:5"
    )
    add_data_dir_argument(p, "with --node or --image")
    p.add_argument("--layer", type=non_negative_int, help="layer to draw, from 0 (default the last)")
    p.add_argument("--head", type=non_negative_int, help="one head of the layer (default: all heads in a grid)")
    p.add_argument("--kind", choices=["self", "cross"], help="translation: cross (default) or encoder self-attention")
    p.add_argument("--beam", type=positive_int, default=5, help="translation: beam size; 1 = greedy (default 5)")
    p.add_argument("--out", type=Path, help="FILE.png or FILE.html (default attention.html; attention.png with --node)")
    add_checkpoint_argument(p)
    add_device_argument(p)
    add_json_argument(p, "what was drawn")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from attnlab.errors import UserError
    from attnlab.sources import HF_FOLDER, PUBLISHED, what_is
    from attnlab.viz.maps import attention_maps

    if sum(x is not None for x in (args.text, args.node, args.image)) != 1:
        raise UserError("give --text TEXT (a text model), --node ID (a GAT run) or --image SPLIT:INDEX (a ViT run)")
    form = what_is(args.run_dir).form
    if form in PUBLISHED and args.text is None:
        what = "a Hugging Face folder" if form == HF_FOLDER else "a GGUF file"
        raise UserError(f"{args.run_dir} is {what}: draw its attention for --text TEXT")
    if args.node is not None:
        return _node(args)
    if args.image is not None:
        from attnlab.cli.vit_attention import draw_cls_attention

        return draw_cls_attention(args)
    if args.data_dir:
        raise UserError("--data-dir goes with --node (a graph run) or --image (a ViT run); a text model reads --text")
    path = _check_out(args.out if args.out is not None else Path("attention.html"))
    maps = attention_maps(_load_text_model(args), args.text, kind=args.kind, beam=args.beam)
    maps.check(args.layer, args.head)
    layer = maps.n_layers - 1 if args.layer is None else args.layer
    if path.suffix.lower() == ".png":
        from attnlab.viz.attention import plot_attention
        from attnlab.viz.figure import png_size

        plot_attention(maps, path, layer=layer, head=args.head)
        width, height = png_size(path)
        heads = f"head {args.head}" if args.head is not None else f"{maps.n_heads} heads"
        shown = f"layer {layer}, {heads}; {width} x {height} px"
    else:
        from attnlab.viz.html import write_attention_html

        write_attention_html(maps, path, layer=layer, head=args.head)
        shown = f"{maps.n_layers} layers x {maps.n_heads} heads"
    if args.json:
        from attnlab.cli import print_json

        print_json(
            {
                "out": str(path),
                "kind": maps.kind,
                "layers": maps.n_layers,
                "heads": maps.n_heads,
                "layer": layer,
                "head": args.head,
                "query_tokens": maps.query_tokens,
                "key_tokens": maps.key_tokens,
                "output": maps.output,
            }
        )
        return 0
    if maps.output:
        print(maps.output)
    print(f"{maps.kind} ({shown}) saved to {path}")
    return 0


def _load_text_model(args: argparse.Namespace):
    """The run, Hugging Face folder or GGUF file that --text is drawn for (`load_any`): what
    `attention_maps` takes; a `UserError` for a run of a task without text."""
    from attnlab.device import resolve_device
    from attnlab.errors import UserError
    from attnlab.train.load import load_any

    device = resolve_device(args.device)
    loaded = load_any(args.run_dir, command="attention", device=device, checkpoint=args.checkpoint)
    if loaded.run is None:
        return loaded
    if loaded.task == "node-classification":
        raise UserError(f"{args.run_dir} is a node-classification run: draw a node's attention with --node ID")
    if loaded.task in ("image-density", "image-classification", "audio-density", "audio-classification"):
        raise UserError(f"{args.run_dir} is an {loaded.task!r} run: --text is for text models (ViT: --image)")
    return loaded.run


def _node(args: argparse.Namespace) -> int:
    """--node ID: a GAT run's attention around one node, as one PNG
    (`attnlab.viz.graph_attention.draw_node_attention`)."""
    from attnlab import load
    from attnlab.device import resolve_device
    from attnlab.errors import UserError
    from attnlab.viz.figure import check_png_path, png_size
    from attnlab.viz.graph_attention import draw_node_attention

    if args.layer is not None or args.head is not None or args.kind is not None:
        raise UserError("--layer, --head and --kind go with --text; --node draws every layer and head of a GAT")
    path = check_png_path(args.out if args.out is not None else Path("attention.png"))
    loaded = load(args.run_dir, device=resolve_device(args.device), checkpoint=args.checkpoint)
    att = draw_node_attention(loaded, args.node, path, data_dir=args.data_dir)
    width, height = png_size(path)
    shown = {
        "out": str(path),
        "node": att.node,
        "neighbours": [j for j in att.neighbours if j != att.node],
        "class": att.classes[att.neighbours.index(att.node)],
        "predicted": att.predicted,
        "layers": att.n_layers,
        "heads": [w.shape[0] for w in att.weights],
        "mean_entropy": [float(e.mean()) for e in att.entropies],
        "mean_uniform_entropy": float(att.uniform.mean()),
    }
    if args.json:
        from attnlab.cli import print_json

        print_json(shown)
        return 0
    print(
        f"node {att.node} ({len(shown['neighbours'])} neighbours), {att.n_layers} layers x {shown['heads']} heads; "
        f"{width} x {height} px saved to {path}"
    )
    return 0


def _check_out(path: Path) -> Path:
    """--out checked before the model is loaded: .png or .html, in an existing folder."""
    from attnlab.viz.figure import check_output_path

    return check_output_path(path, (".png", ".html"), "attention is drawn as a PNG picture or an HTML page")
