"""A model's LoRA adapters (`attnlab.nn.lora.LoRALinear`) as a `peft` adapter folder's contents:
adapter_config.json and adapter_model.safetensors under peft's names, for the transformers model
that `attnlab export --to hf` writes of the base (`peft.PeftModel.from_pretrained(base, folder)`).

The layers by family (i = block index), attnlab -> transformers:
    GPT-2   blocks.i.attn.in_proj -> transformer.h.i.attn.c_attn (q, k and v in one Conv1D)
            blocks.i.attn.out_proj -> ...attn.c_proj, ffn.fc1 -> ...mlp.c_fc, ffn.fc2 -> ...mlp.c_proj
    Llama   in_proj -> model.layers.i.self_attn.{q,k,v}_proj, out_proj -> ...o_proj,
            fc1 -> ...mlp.{gate,up}_proj, fc2 -> ...mlp.down_proj (also Qwen2, Qwen3, Mistral,
            SmolLM3 and Gemma 3: the same names)
    Phi-3   in_proj -> model.layers.i.self_attn.qkv_proj, fc1 -> ...mlp.gate_up_proj (one layer
            each, stacked as GPT-2's c_attn), out_proj -> ...o_proj, fc2 -> ...mlp.down_proj
    BERT    in_proj -> bert.encoder.layer.i.attention.self.{query,key,value},
            out_proj -> ...attention.output.dense, fc1 -> ...intermediate.dense, fc2 -> ...output.dense;
            a classifier or tagger head -> classifier, a sequence classifier's pooler -> bert.pooler.dense
            (peft's modules_to_save: saved in full)
    RoBERTa as BERT under roberta.encoder.layer.i; a sequence classifier's pooler and head ->
            classifier.dense and classifier.out_proj (RoBERTa's classification head)
    ModernBERT in_proj -> model.layers.i.attn.Wqkv, fc1 -> ...mlp.Wi (one layer each, stacked as
            GPT-2's c_attn), out_proj -> ...attn.Wo, fc2 -> ...mlp.Wo; a classifier's prediction
            head and label layer -> head (dense, norm) and classifier (modules_to_save)
Where attnlab's adapted slices are separate transformers layers (Llama's and BERT's q, k, v), each
slice's (A, B) is that layer's adapter. GPT-2's c_attn is one layer: its adapter stacks the
slices' A matrices (rank k·r for k slices) and places each B on its own rows of a block matrix
(zeros elsewhere), with alpha k·α so that alpha / rank stays α / r: the same update, exactly.
So are Phi-3's and ModernBERT's fused layers: attnlab's LoRA adapts q, k and v (and a GeGLU's
gate and up halves) apart, each with its own rank-r pair, which peft's adapters on separate q, k, v
layers would be; ModernBERT has no separate layers, so the stacked adapter on Wqkv (Wi) is the one
that computes the same update. Its rank k·r changes nothing computed, only the adapter's shape.
"""

import re
from typing import Any

import torch
from torch import nn

from attnlab.errors import ExportError
from attnlab.models.bert import Bert
from attnlab.models.gpt import GPT
from attnlab.models.hf._common import refuse
from attnlab.models.hf.auto import CAUSAL_LM_EXPORTERS
from attnlab.models.hf.decoders import PHI3
from attnlab.models.hf.modernbert import MODERNBERT_CLASSIFIER_TENSORS, is_modernbert, modernbert_export_problems
from attnlab.models.hf.roberta import is_roberta
from attnlab.nn.lora import LoRALinear, adapter_key, lora_layers

ADAPTER_CONFIG, ADAPTER_WEIGHTS = "adapter_config.json", "adapter_model.safetensors"
PREFIX = "base_model.model."  # where peft's PeftModel keeps the transformers model

# attnlab layer (after "blocks.i.") -> the transformers layer of each part it holds (after the block's prefix).
GPT2_LAYERS = {
    "attn.in_proj": "attn.c_attn",
    "attn.out_proj": "attn.c_proj",
    "ffn.fc1": "mlp.c_fc",
    "ffn.fc2": "mlp.c_proj",
}
PHI3_LAYERS = {
    "attn.in_proj": "self_attn.qkv_proj",
    "attn.out_proj": "self_attn.o_proj",
    "ffn.fc1": "mlp.gate_up_proj",
    "ffn.fc2": "mlp.down_proj",
}
MODERNBERT_LAYERS = {
    "attn.in_proj": "attn.Wqkv",
    "attn.out_proj": "attn.Wo",
    "ffn.fc1": "mlp.Wi",
    "ffn.fc2": "mlp.Wo",
}
# The families whose stacked attnlab layers are stacked in transformers too: their layers and stem.
STACKED = {
    "gpt2": (GPT2_LAYERS, "transformer.h.{}."),
    "phi3": (PHI3_LAYERS, "model.layers.{}."),
    "modernbert": (MODERNBERT_LAYERS, "model.layers.{}."),
}
LLAMA_PARTS = {
    "query": "self_attn.q_proj",
    "key": "self_attn.k_proj",
    "value": "self_attn.v_proj",
    "output": "self_attn.o_proj",
    "gate": "mlp.gate_proj",
    "ff-in": "mlp.up_proj",
    "ff-out": "mlp.down_proj",
}
BERT_PARTS = {
    "query": "attention.self.query",
    "key": "attention.self.key",
    "value": "attention.self.value",
    "output": "attention.output.dense",
    "ff-in": "intermediate.dense",
    "ff-out": "output.dense",
}
TASK_TYPES = {"lm": "CAUSAL_LM", "sequence": "SEQ_CLS", "token": "TOKEN_CLS"}
FEEDFORWARD_PARTS = ("gate", "ff-in", "ff-out")


def peft_adapter(
    model: nn.Module, *, dropout: float = 0.0, base: str = ""
) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """(adapter_config.json as a dict, adapter_model.safetensors' tensors) of `model`'s adapters.
    `base` names the base model in the config. Raises `ExportError` for a model peft's
    transformers counterpart cannot take (no adapters; a model no exported family computes)."""
    layers = lora_layers(model)
    if not layers:
        raise ExportError("the model has no LoRA adapters to export")
    first = next(iter(layers.values()))
    rank, alpha = first.rank, first.alpha
    family, task = _family(model)
    _refuse_moe_feedforward(model, layers)
    tensors: dict[str, torch.Tensor] = {}
    rank_pattern, alpha_pattern = {}, {}
    for name, layer in layers.items():
        block, _, inner = name.partition(".")[2].partition(".")  # "blocks.3.attn.in_proj" -> "3", "attn.in_proj"
        if family in STACKED:
            names, stem = STACKED[family]
            target = stem.format(block) + names[inner]
            tensors |= _stacked(target, layer)
            if len(layer.slices) > 1 or _partial(layer):
                k = len(layer.slices)
                rank_pattern[re.escape(target)], alpha_pattern[re.escape(target)] = k * rank, k * alpha
            continue
        parts = LLAMA_PARTS if family == "llama" else BERT_PARTS
        stem = f"model.layers.{block}." if family == "llama" else f"{family}.encoder.layer.{block}."
        for part in layer.slices:
            tensors |= _pair(stem + parts[part], layer, part)
    targets = sorted({key.removeprefix(PREFIX).rsplit(".lora_", 1)[0] for key in tensors})
    saved = _trained_in_full(model, task)
    for hf, tensor in saved.items():
        tensors[PREFIX + hf] = tensor.detach().clone()
    config = {
        "peft_type": "LORA",
        "task_type": TASK_TYPES[task],
        "base_model_name_or_path": base,
        "r": rank,
        "lora_alpha": alpha,
        "lora_dropout": dropout,
        # One alternation of exact names: peft's suffix match would take "attention.output.dense"
        # for "output.dense".
        "target_modules": "(" + "|".join(re.escape(t) for t in targets) + ")",
        "rank_pattern": rank_pattern,
        "alpha_pattern": alpha_pattern,
        "fan_in_fan_out": family == "gpt2",  # GPT-2's Conv1D stores its weight (in, out)
        "bias": "none",
        # A head whole (RoBERTa's classifier, ModernBERT's prediction head are two layers each): peft
        # wraps it once, as it does the classifier for SEQ_CLS; BERT's pooler sits inside the encoder.
        "modules_to_save": sorted({_saved_module(n) for n in saved}) or None,
        "init_lora_weights": True,
        "inference_mode": True,
        "use_rslora": False,
        "use_dora": False,
    }
    return config, {k: v.contiguous() for k, v in tensors.items()}


def _refuse_moe_feedforward(model: nn.Module, layers: dict[str, LoRALinear]) -> None:
    """peft (for transformers 5) retargets a mixture-of-experts model's gate/up/down adapters onto
    the fused experts' tensors, even those of its dense blocks: no peft adapter computes attnlab's
    adapters on a dense block's feed-forward there (attention adapters map one to one)."""
    if not isinstance(model, GPT) or model.config.experts == 0:
        return
    feedforward = sorted({part for layer in layers.values() for part in layer.slices if part in FEEDFORWARD_PARTS})
    if feedforward:
        raise ExportError(
            f"LoRA adapters on {', '.join(feedforward)} of a mixture-of-experts model have no peft form "
            "(peft maps those targets onto the fused experts); train with attention targets alone "
            "(query, key, value, output) to export a peft adapter"
        )


def _saved_module(name: str) -> str:
    """The module peft's modules_to_save names for a tensor trained in full: a head at the top
    (classifier.*, head.*) whole, else the layer holding it ("bert.pooler.dense")."""
    return name.split(".")[0] if name.startswith(("classifier.", "head.")) else name.rsplit(".", 1)[0]


def _family(model: nn.Module) -> tuple[str, str]:
    """("gpt2" | "llama" | "phi3" | "bert" | "roberta" | "modernbert", "lm" | "sequence" | "token") as
    `attnlab export --to hf` writes the model ("llama": every family with Llama's layer names)."""
    if isinstance(model, GPT):
        for name, problems, _ in CAUSAL_LM_EXPORTERS:
            if not problems(model.config):
                return {"GPT-2": "gpt2", PHI3.name: "phi3"}.get(name, "llama"), "lm"
        raise ExportError("this GPT has the parts of no transformers family: no transformers model takes its adapters")
    if isinstance(model, Bert) and model.config.head in ("sequence", "token"):
        if is_modernbert(model.config):
            refuse(modernbert_export_problems(model.config), "ModernBERT")  # no transformers model to adapt
            return "modernbert", model.config.head
        return ("roberta" if is_roberta(model.config) else "bert"), model.config.head
    raise ExportError(f"a {type(model).__name__} has no peft adapter format here; GPT and BERT classifiers do")


def _trained_in_full(model: nn.Module, task: str) -> dict[str, torch.Tensor]:
    """The tensors peft's modules_to_save carry, by transformers name: a BERT classifier's head,
    and for a sequence classifier its pooler too, which a BertForMaskedLM base does not have (the
    run then trained on its own initialisation of it); ModernBERT's prediction head and label layer."""
    if not isinstance(model, Bert):
        return {}
    if is_modernbert(model.config):
        state = model.state_dict()
        return {hf: state[ours] for hf, ours in MODERNBERT_CLASSIFIER_TENSORS.items()}
    head, pooler = model.head.proj, model.pooler
    if is_roberta(model.config) and task == "sequence":  # RoBERTa's classification head
        return {
            "classifier.dense.weight": pooler.weight,
            "classifier.dense.bias": pooler.bias,
            "classifier.out_proj.weight": head.weight,
            "classifier.out_proj.bias": head.bias,
        }
    found = {"classifier.weight": head.weight, "classifier.bias": head.bias}
    if task == "sequence":
        found |= {"bert.pooler.dense.weight": pooler.weight, "bert.pooler.dense.bias": pooler.bias}
    return found


def _pair(target: str, layer: LoRALinear, part: str) -> dict[str, torch.Tensor]:
    key = adapter_key(part)
    return {
        f"{PREFIX}{target}.lora_A.weight": layer.lora_A[key].detach().clone(),
        f"{PREFIX}{target}.lora_B.weight": layer.lora_B[key].detach().clone(),
    }


def _partial(layer: LoRALinear) -> bool:
    """Whether the layer's one adapted slice leaves some of its rows unadapted."""
    ((start, stop),) = layer.slices.values()
    return (start, stop) != (0, layer.out_features)


def _stacked(target: str, layer: LoRALinear) -> dict[str, torch.Tensor]:
    """One adapter for all of `layer`'s slices: A `(k r, in)` stacked, B `(out, k r)` block-placed."""
    r = layer.rank
    a = torch.cat([layer.lora_A[adapter_key(p)].detach() for p in layer.slices])
    b = torch.zeros(layer.out_features, r * len(layer.slices), dtype=a.dtype)
    for j, (part, (start, stop)) in enumerate(layer.slices.items()):
        b[start:stop, j * r : (j + 1) * r] = layer.lora_B[adapter_key(part)].detach()
    return {f"{PREFIX}{target}.lora_A.weight": a.clone(), f"{PREFIX}{target}.lora_B.weight": b}
