"""attnlab embed RUN_OR_FOLDER TEXT ... [--json]

Calls `SentenceEncoder.embed_texts` on `attnlab.tasks.embeddings.load_sentence_encoder`: the vectors of
`POST /v1/embeddings`, sentence-transformers' for a sentence-transformers folder."""

import argparse
from pathlib import Path

from attnlab.cli.arguments import add_device_argument, add_json_argument
from attnlab.families import ENCODER, names
from attnlab.sources import takes_words


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "embed",
        help="contextual sentence vectors from a BERT encoder",
        description="Mean of the encoder's last hidden states over each sentence's tokens, [CLS] and [SEP] "
        "included, as sentence-transformers computes it; a sentence-transformers folder's own pooling and "
        "normalisation (modules.json) where it has them. RUN_OR_FOLDER is an attnlab run with a BERT encoder "
        f"(pre-training or fine-tuning) or a Hugging Face {names(ENCODER)} folder.",
    )
    p.add_argument("source", metavar="RUN_OR_FOLDER", help=takes_words((ENCODER,)))
    p.add_argument("text", nargs="*", metavar="TEXT", help="sentences to embed")
    p.add_argument("--input", help="a UTF-8 file with one sentence per line (- for stdin)")
    add_device_argument(p)
    add_json_argument(p, '{"vectors": [[...], ...], "dim": C}')
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from attnlab.cli import print_json, read_text_arguments
    from attnlab.cli.kinds import require_kind
    from attnlab.device import resolve_device
    from attnlab.errors import UserError
    from attnlab.sources import RUN, what_is
    from attnlab.tasks.embeddings import load_sentence_encoder
    from attnlab.train.config import read_config

    texts = read_text_arguments(args.text, args.input, "embed")
    if any(not t.strip() for t in texts):
        raise UserError("an input sentence is empty; every sentence needs at least one word to embed")
    if what_is(args.source).form == RUN:  # an attnlab run: is it one with a BERT encoder?
        require_kind(args.source, read_config(Path(args.source)), "embed")
    device = resolve_device(args.device)
    vectors = load_sentence_encoder(args.source, device).embed_texts(texts)
    if args.json:
        print_json({"dim": vectors.size(1), "vectors": [[round(x, 6) for x in v.tolist()] for v in vectors]})
    else:
        for text, v in zip(texts, vectors, strict=True):
            print(f"{text}\t" + " ".join(f"{x:.4f}" for x in v.tolist()))
    return 0
