"""Import Hugging Face checkpoints from a local folder into attnlab models, and export to transformers.

Nothing is ever downloaded: fetch the folder first (e.g. `huggingface-cli download
openai-community/gpt2`) and pass its path. One module per family, all sharing the readers of
`_common` (config.json, safetensors / weights-only PyTorch files, shard indexes, shape checks):
- `gpt2`: `load_gpt2(folder)` -> `GPT`;
- `bert`: `load_bert(folder)` -> `LoadedBert` (`Bert` + WordPiece tokenizer);
- `llama`: `load_llama(folder)` -> `GPT` with RMSNorm, SwiGLU, rotary positions, grouped-query attention;
- `mixtral`: `load_mixtral(folder)` -> the same `GPT` with a mixture of SwiGLU experts;
- `qwen`, `mistral`, `gemma`, `phi3`: Qwen2 / Qwen3, Mistral / SmolLM3, Gemma 3 and Phi-3 -> `GPT`
  (Llama's block with each family's parts);
- `roberta`, `modernbert`: RoBERTa and ModernBERT -> `LoadedBert`;
- `gguf`: `load_gguf(path)` -> a GGUF file (llama.cpp's format) as the causal LM it holds, its
  tokenizer and chat template; `gguf_export.write_gguf` the way back;
- `auto`: `load_causal_lm(folder)` -> any causal LM of `attnlab.families` with its tokenizer, by
  model_type; `ENCODER_LOADERS` the encoders';
- `marian`: `load_marian(folder)` -> `Seq2SeqTransformer`; `to_marian(model)` -> a transformers
  `MarianMTModel` computing the same function.
Each module's docstring gives its source format and its HF -> attnlab name map.

Export, the same name maps read backwards: `gpt2_export`, `llama_export` (or `causal_lm_export`,
which picks one by the model's parts), `bert_export`, `marian_export` turn a model into an
`HFCheckpoint` (config.json as a dict, tensors under transformers' names), `save_hf_checkpoint`
writes it, `tokenizer_export.tokenizer_files` gives the tokenizer's files. A part the target family
lacks raises `attnlab.ExportError` naming it. `attnlab.export.export_run` does all of it for a run.
"""

from attnlab.models.hf._common import (
    CONFIG_FILE,
    HF_ACTIVATIONS,
    TOKENIZER_FILE,
    WEIGHT_FILES,
    HFCheckpoint,
    read_hf_config,
    save_hf_checkpoint,
)
from attnlab.models.hf.auto import (
    CAUSAL_LM_LOADERS,
    ENCODER_LOADERS,
    LoadedCausalLM,
    causal_lm_export,
    load_causal_lm,
)
from attnlab.models.hf.bert import (
    BERT_DEFAULTS,
    BERT_FIXED_SWITCHES,
    BERT_HEADS,
    BERT_IGNORED_TENSOR,
    BERT_LAYER_TENSORS,
    BERT_MLM_TENSORS,
    BERT_POOLER_TENSORS,
    BERT_QKV,
    BERT_TOP_TENSORS,
    TOKENIZER_CONFIG_FILE,
    VOCAB_FILE,
    LoadedBert,
    bert_config_from_hf,
    bert_export,
    load_bert,
)
from attnlab.models.hf.gemma import load_gemma3
from attnlab.models.hf.gpt2 import (
    BLOCK_TENSORS,
    HF_DEFAULTS,
    HF_FIXED_SWITCHES,
    IGNORED_TENSOR,
    TOP_TENSORS,
    gpt2_config_from_hf,
    gpt2_export,
    load_gpt2,
)
from attnlab.models.hf.llama import (
    LLAMA_DEFAULTS,
    LLAMA_FIXED_SWITCHES,
    llama_config_from_hf,
    llama_export,
    load_llama,
)
from attnlab.models.hf.marian import (
    MARIAN_LAYER_NORM_EPS,
    load_marian,
    marian_export,
    marian_feature_order,
    to_marian,
)
from attnlab.models.hf.mistral import load_mistral, load_smollm3
from attnlab.models.hf.mixtral import MIXTRAL_DEFAULTS, MIXTRAL_FIXED_SWITCHES, load_mixtral, mixtral_config_from_hf
from attnlab.models.hf.modernbert import load_modernbert
from attnlab.models.hf.phi3 import load_phi3
from attnlab.models.hf.qwen import load_qwen2, load_qwen3
from attnlab.models.hf.roberta import load_roberta, roberta_export

__all__ = [
    "BERT_DEFAULTS",
    "BERT_FIXED_SWITCHES",
    "BERT_HEADS",
    "BERT_IGNORED_TENSOR",
    "BERT_LAYER_TENSORS",
    "BERT_MLM_TENSORS",
    "BERT_POOLER_TENSORS",
    "BERT_QKV",
    "BERT_TOP_TENSORS",
    "BLOCK_TENSORS",
    "CAUSAL_LM_LOADERS",
    "ENCODER_LOADERS",
    "CONFIG_FILE",
    "HF_ACTIVATIONS",
    "HF_DEFAULTS",
    "HF_FIXED_SWITCHES",
    "IGNORED_TENSOR",
    "LLAMA_DEFAULTS",
    "LLAMA_FIXED_SWITCHES",
    "MARIAN_LAYER_NORM_EPS",
    "MIXTRAL_DEFAULTS",
    "MIXTRAL_FIXED_SWITCHES",
    "TOKENIZER_CONFIG_FILE",
    "TOKENIZER_FILE",
    "TOP_TENSORS",
    "VOCAB_FILE",
    "WEIGHT_FILES",
    "HFCheckpoint",
    "LoadedBert",
    "LoadedCausalLM",
    "bert_config_from_hf",
    "bert_export",
    "causal_lm_export",
    "gpt2_config_from_hf",
    "gpt2_export",
    "llama_config_from_hf",
    "llama_export",
    "load_bert",
    "load_causal_lm",
    "load_gemma3",
    "load_gpt2",
    "load_llama",
    "load_marian",
    "load_mistral",
    "load_mixtral",
    "load_modernbert",
    "load_phi3",
    "load_qwen2",
    "load_qwen3",
    "load_roberta",
    "load_smollm3",
    "marian_export",
    "marian_feature_order",
    "mixtral_config_from_hf",
    "read_hf_config",
    "roberta_export",
    "save_hf_checkpoint",
    "to_marian",
]
