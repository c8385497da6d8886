"""Export attnlab's encoder–decoder as a transformers `MarianMTModel`.

MarianMT (Junczys-Dowmunt et al. 2018; transformers `models/marian/modeling_marian.py`) is the
paper's base architecture exactly as attnlab's `Seq2SeqTransformer` builds it with post-norm,
sinusoidal positions and one shared vocabulary: embeddings × √d_model plus a fixed sinusoid table,
LayerNorm after each residual sum, no final LayerNorm, tied output projection. Exporting a trained
attnlab model therefore gives a transformers model that computes the same function, which lets a
benchmark compare the two libraries' decoders on the same trained weights and the same outputs.

One layout differs: Marian's table holds all the sines first and then all the cosines
(`out[:, :d/2] = sin`, `out[:, d/2:] = cos`), attnlab's interleaves them (sin at 2i, cos at 2i+1).
Marian feature m is attnlab feature `marian_feature_order(d_model)[m]`. Re-ordering the d_model
features of every tensor consistently (embedding columns, the inputs of every projection that reads the residual
stream, the outputs of every projection that writes it, LayerNorm gains and biases) changes
nothing else: LayerNorm's mean and variance do not depend on the order of the features.

Name map, attnlab -> Marian (i = layer index; in_proj rows [q; k; v] -> q_proj, k_proj, v_proj):
  src_embedding / output          -> model.shared / lm_head (all tied)
  encoder.i.attn                  -> model.encoder.layers.i.self_attn
  encoder.i.norm1 / norm2         -> ...self_attn_layer_norm / final_layer_norm
  decoder.i.self_attn / cross_attn -> model.decoder.layers.i.self_attn / encoder_attn
  decoder.i.norm1 / norm2 / norm3 -> ...self_attn_layer_norm / encoder_attn_layer_norm / final_layer_norm
  *.ffn.fc1 / fc2                 -> *.fc1 / fc2
"""

from typing import Any

import torch

MARIAN_LAYER_NORM_EPS = 1e-5  # Marian's nn.LayerNorm(embed_dim) keeps torch's default


def marian_feature_order(d_model: int) -> torch.Tensor:
    """attnlab's feature index of each Marian feature `(d_model,)`: the sines (attnlab's even
    features) first, then the cosines (the odd ones)."""
    return torch.cat([torch.arange(0, d_model, 2), torch.arange(1, d_model, 2)])


def to_marian(model: Any, *, bos_id: int, eos_id: int) -> Any:
    """A `transformers.MarianMTModel` computing the same function as `model`, an attnlab
    `Seq2SeqTransformer` with post-norm, sinusoidal positions and tied embeddings; `bos_id` becomes
    Marian's `decoder_start_token_id`. Raises `ValueError` naming what Marian cannot represent."""
    from transformers import MarianConfig, MarianMTModel

    c = model.config
    problems = [
        f"{what} (Marian has only {wanted})"
        for what, ok, wanted in (
            (f"norm = {c.norm!r}", c.norm == "post", "post-norm"),
            (f"positions = {c.positions!r}", c.positions == "sinusoidal", "sinusoidal positions"),
            ("untied embeddings", c.tie_embeddings, "one shared vocabulary"),
            (f"activation = {c.activation!r}", c.activation in ("relu", "gelu"), "relu or gelu here"),
            (f"layer_norm_eps = {c.layer_norm_eps}", c.layer_norm_eps == MARIAN_LAYER_NORM_EPS, "1e-5"),
        )
        if not ok
    ]
    if problems:
        raise ValueError("cannot export to MarianMT: " + "; ".join(problems))
    config = MarianConfig(
        vocab_size=c.vocab_size,
        d_model=c.d_model,
        encoder_layers=c.n_encoder_layers,
        decoder_layers=c.n_decoder_layers,
        encoder_attention_heads=c.n_heads,
        decoder_attention_heads=c.n_heads,
        encoder_ffn_dim=c.d_ff,
        decoder_ffn_dim=c.d_ff,
        activation_function=c.activation,
        max_position_embeddings=c.max_len,
        scale_embedding=True,
        dropout=0.0,
        pad_token_id=c.pad_id,
        eos_token_id=eos_id,
        forced_eos_token_id=eos_id,
        decoder_start_token_id=bos_id,
        bos_token_id=bos_id,
    )
    marian = MarianMTModel(config).eval()
    result = marian.load_state_dict(_marian_state(model), strict=False)
    # Everything is given but Marian's fixed sinusoid tables, which it builds itself.
    missing = [k for k in result.missing_keys if "embed_positions" not in k]
    if missing or result.unexpected_keys:
        raise RuntimeError(
            f"MarianMT export out of step with transformers: missing {missing}, unexpected {result.unexpected_keys}"
        )
    return marian


def _marian_state(model: Any) -> dict[str, torch.Tensor]:
    """attnlab `Seq2SeqTransformer` weights under Marian's names, features in Marian's order."""
    c = model.config
    order = marian_feature_order(c.d_model)
    sd = {k: v.detach().float() for k, v in model.state_dict().items()}
    out: dict[str, torch.Tensor] = {}

    def reads(w: torch.Tensor) -> torch.Tensor:  # a projection from the residual stream: input columns
        return w[:, order]

    def writes(w: torch.Tensor) -> torch.Tensor:  # into the residual stream: output rows (or a vector)
        return w[order]

    embedding = reads(sd["src_embedding.weight"])
    for name in ("model.shared", "model.encoder.embed_tokens", "model.decoder.embed_tokens", "lm_head"):
        out[f"{name}.weight"] = embedding
    out["final_logits_bias"] = torch.zeros(1, c.vocab_size)

    def attention(src: str, dst: str) -> None:
        for proj, w, b in zip(
            ("q_proj", "k_proj", "v_proj"),
            sd[f"{src}.in_proj.weight"].chunk(3),
            sd[f"{src}.in_proj.bias"].chunk(3),
            strict=True,
        ):
            out[f"{dst}.{proj}.weight"], out[f"{dst}.{proj}.bias"] = reads(w), b
        out[f"{dst}.out_proj.weight"] = writes(sd[f"{src}.out_proj.weight"])
        out[f"{dst}.out_proj.bias"] = writes(sd[f"{src}.out_proj.bias"])

    def layer_norm(src: str, dst: str) -> None:
        out[f"{dst}.weight"], out[f"{dst}.bias"] = writes(sd[f"{src}.weight"]), writes(sd[f"{src}.bias"])

    def ffn(src: str, dst: str) -> None:
        out[f"{dst}.fc1.weight"], out[f"{dst}.fc1.bias"] = reads(sd[f"{src}.fc1.weight"]), sd[f"{src}.fc1.bias"]
        out[f"{dst}.fc2.weight"], out[f"{dst}.fc2.bias"] = (
            writes(sd[f"{src}.fc2.weight"]),
            writes(sd[f"{src}.fc2.bias"]),
        )

    for i in range(c.n_encoder_layers):
        src, dst = f"encoder.{i}", f"model.encoder.layers.{i}"
        attention(f"{src}.attn", f"{dst}.self_attn")
        layer_norm(f"{src}.norm1", f"{dst}.self_attn_layer_norm")
        ffn(f"{src}.ffn", dst)
        layer_norm(f"{src}.norm2", f"{dst}.final_layer_norm")
    for i in range(c.n_decoder_layers):
        src, dst = f"decoder.{i}", f"model.decoder.layers.{i}"
        attention(f"{src}.self_attn", f"{dst}.self_attn")
        layer_norm(f"{src}.norm1", f"{dst}.self_attn_layer_norm")
        attention(f"{src}.cross_attn", f"{dst}.encoder_attn")
        layer_norm(f"{src}.norm2", f"{dst}.encoder_attn_layer_norm")
        ffn(f"{src}.ffn", dst)
        layer_norm(f"{src}.norm3", f"{dst}.final_layer_norm")
    return out
