"""Small Hugging Face RoBERTa checkpoint folders for tests: a byte-level BPE tokenizer.json with
RoBERTa's special tokens and post-processor, trained on Tiny Shakespeare, and a random-weight
RoBERTa of transformers saved beside it (nothing downloaded)."""

from pathlib import Path

import torch

from attnlab.data.text import bundled_shakespeare

# RoBERTa's special tokens at the ids its published vocabulary gives them (fairseq's dictionary).
SPECIALS = ("<s>", "<pad>", "</s>", "<unk>", "<mask>")
CLS, PAD, SEP = 0, 1, 2
TEXTS = ["ROMEO: What light through yonder window breaks?", "Thou art", "  O, speak again, bright angel!"]
# Shapes that a head mix-up or an off-by-one in the positions would break: odd head counts and widths.
SHAPES = {
    "h4": dict(hidden_size=32, num_attention_heads=4, intermediate_size=37, num_hidden_layers=2),
    "h3": dict(hidden_size=30, num_attention_heads=3, intermediate_size=41, num_hidden_layers=3),
    "h5": dict(hidden_size=35, num_attention_heads=5, intermediate_size=24, num_hidden_layers=1),
}


def train_bpe(specials: tuple[str, ...]):
    """A tiny byte-level BPE trained on Tiny Shakespeare, `specials` at ids 0, 1, ..."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320,
        special_tokens=[AddedToken(t, special=True) for t in specials],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([bundled_shakespeare()[:8000]], trainer=trainer)
    assert [tok.token_to_id(t) for t in specials] == list(range(len(specials)))
    return tok


def write_tokenizer(folder: Path):
    """A tiny byte-level BPE with RoBERTa's special tokens and its post-processor ("<s> text </s>")."""
    from tokenizers import processors

    tok = train_bpe(SPECIALS)
    tok.post_processor = processors.RobertaProcessing(("</s>", SEP), ("<s>", CLS))  # (sep, cls)
    tok.save(str(folder / "tokenizer.json"))
    return tok


def hf_roberta(kind: str, vocab_size: int, shape: str = "h4", seed: int = 0, **overrides) -> torch.nn.Module:
    """A random RoBERTa of transformers in eval mode (`kind`: model, mlm, sequence, token), with
    LayerNorms and biases moved off their 1/0 init and q, k scaled up so that attention is far from
    uniform (a q/k/v, head or position mix-up shows)."""
    import transformers

    torch.manual_seed(seed)
    config = transformers.RobertaConfig(
        vocab_size=vocab_size,
        max_position_embeddings=40 + PAD + 1,  # as roberta-base's 514: the longest input plus pad + 1
        type_vocab_size=1,
        layer_norm_eps=1e-5,
        pad_token_id=PAD,
        bos_token_id=CLS,
        eos_token_id=SEP,
        num_labels=3,
        **{**SHAPES[shape], **overrides},
    )
    classes = {
        "model": transformers.RobertaModel,
        "mlm": transformers.RobertaForMaskedLM,
        "sequence": transformers.RobertaForSequenceClassification,
        "token": transformers.RobertaForTokenClassification,
    }
    model = classes[kind](config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "LayerNorm" in name or "layer_norm" in name:
                p.copy_((1.0 if name.endswith("weight") else 0.0) + 0.2 * torch.randn_like(p))
            elif name.endswith("bias"):
                p.copy_(0.1 * torch.randn_like(p))
            if name.endswith(("attention.self.query.weight", "attention.self.key.weight")):
                p.mul_(5.0)
    return model


def roberta_folder(folder: Path, kind: str = "model", shape: str = "h4", **overrides):
    """Write a tokenizer and a RoBERTa of `kind` into `folder`; returns (tokenizer, transformers model)."""
    folder.mkdir(parents=True, exist_ok=True)
    tok = write_tokenizer(folder)
    model = hf_roberta(kind, tok.get_vocab_size(), shape, **overrides)
    model.save_pretrained(folder)
    return tok, model
