"""Small Hugging Face causal-LM checkpoint folders for tests: a byte-level BPE tokenizer.json
trained on Tiny Shakespeare, and a random-weight GPT-2, Llama or Mixtral saved by `transformers`."""

from pathlib import Path

import torch

from attnlab.data.text import bundled_shakespeare

CAUSAL_FAMILIES = ("gpt2", "llama", "mixtral")

BOS, EOS = 0, 1
PROMPT = "ROMEO: What"


def write_tokenizer(folder: Path):
    """A tiny byte-level BPE with Llama's special tokens and Llama's post-processor: "<s>" before
    every text (Llama 3's tokenizer.json has the same shape, with other names)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([bundled_shakespeare()[:5000]], trainer=trainer)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", BOS)])
    tok.save(str(folder / "tokenizer.json"))
    return tok


def hf_model(family: str, vocab_size: int) -> torch.nn.Module:
    """A random-weight (seed 0) two-layer model of `family` in eval mode."""
    import transformers

    torch.manual_seed(0)
    common = dict(vocab_size=vocab_size, bos_token_id=BOS, eos_token_id=EOS)
    if family == "gpt2":
        config = transformers.GPT2Config(n_embd=32, n_layer=2, n_head=4, n_positions=64, **common)
        return transformers.GPT2LMHeadModel(config).eval()
    llama = dict(
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        **common,
    )
    if family == "llama":
        return transformers.LlamaForCausalLM(transformers.LlamaConfig(**llama)).eval()
    config = transformers.MixtralConfig(num_local_experts=3, num_experts_per_tok=2, **llama)
    return transformers.MixtralForCausalLM(config).eval()


def causal_lm_folder(folder: Path, family: str):
    """Write a tokenizer and a `family` model into `folder`; returns (tokenizer, transformers model)."""
    folder.mkdir(parents=True, exist_ok=True)
    tok = write_tokenizer(folder)
    model = hf_model(family, tok.get_vocab_size())
    model.save_pretrained(folder)
    return tok, model


def qwen3_moe_model(seed: int = 0, **fields) -> torch.nn.Module:
    """A random-weight Qwen3-MoE of `fields` (transformers' Qwen3MoeConfig keys) in eval mode, moved
    far from its initialisation as tests/models/hf/test_families.py moves its models (norms near 1,
    q and k scaled up, embeddings N(0, 1)), and with its routers spread out: at transformers' init
    every expert is nearly equally likely, and a near tie could pick another expert in two
    libraries' rounding."""
    import transformers

    torch.manual_seed(seed)
    model = transformers.Qwen3MoeForCausalLM(transformers.Qwen3MoeConfig(**fields))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            elif name.endswith(("q_proj.weight", "k_proj.weight")):
                p.mul_(8.0)
            elif name.endswith("mlp.gate.weight"):  # the router
                p.normal_(0.0, 1.0)
            elif name.endswith(("embed_tokens.weight", "lm_head.weight")):
                p.normal_(0.0, 1.0)
    return model.eval()
