"""What every Hugging Face importer shares: finding and reading a checkpoint folder's `config.json`
and weights, and checking config values and tensor shapes.

Weights: `model.safetensors`, or `pytorch_model.bin` (a state dict of tensors; read with
`torch.load(weights_only=True)`, so a pickle never runs code), or either one sharded behind its
`*.index.json` (`{"weight_map": {tensor name: shard file}}`, as `save_pretrained` writes it).
Every error is a `CheckpointError` naming the file, the key and the fix.

The way back, for the exporters: `HFCheckpoint` (a config.json as a dict, tensors under
transformers' names), `save_hf_checkpoint` to write it, and `part_problems` / `refuse` to name
what a target family cannot represent (an `ExportError`).
"""

import dataclasses
import json
import pickle
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from attnlab.data.tokenizers import BPETokenizer, load_tokenizer
from attnlab.errors import CheckpointError, ExportError

CONFIG_FILE = "config.json"
# Looked for in this order; the first one present is read.
WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)
TOKENIZER_FILE = "tokenizer.json"

# HF `activation_function` -> attnlab activation. "gelu_new" is GPT-2's own tanh approximation of
# GELU (Hendrycks & Gimpel 2016, §2), the same function as PyTorch's approximate="tanh".
HF_ACTIVATIONS = {
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu": "gelu",
    "relu": "relu",
}
# The way back: attnlab activation -> the first HF name of each (HF_ACTIVATIONS read backwards).
EXPORT_ACTIVATIONS = {ours: hf for hf, ours in reversed(HF_ACTIVATIONS.items())}


def check_switches(hf: Mapping[str, Any], switches: Mapping[str, tuple[Any, str]], family: str, source: str) -> None:
    """Refuse a config.json whose switch (key -> (the value attnlab computes, what another value would
    do)) is set to a value attnlab cannot represent."""
    for key, (supported, effect) in switches.items():
        if key in hf and hf[key] != supported:
            raise CheckpointError(
                f"{source}: {key}={json.dumps(hf[key])} cannot be imported ({effect}); "
                f"attnlab's {family} supports only {key}={json.dumps(supported)}"
            )


def config_value(
    hf: Mapping[str, Any], defaults: Mapping[str, Any], key: str, kind: type | tuple[type, ...], source: str
) -> Any:
    """hf[key] (transformers' default when absent), checked to be of `kind`; a bool is no number."""
    value = hf.get(key, defaults[key])
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        raise CheckpointError(f"{source}: {key} must be {getattr(kind, '__name__', 'a number')}, got {value!r}")
    return value


def checked(name: str, tensor: torch.Tensor, like: torch.Tensor, conv: bool, source: Path) -> torch.Tensor:
    """`tensor` in attnlab's layout (transposed if a Conv1D weight), after checking its shape against `like`."""
    want = tuple(like.shape[::-1] if conv else like.shape)
    if tuple(tensor.shape) != want:
        raise CheckpointError(
            f"{source}: tensor {name} has shape {tuple(tensor.shape)}, config.json implies {want}; "
            "the weights and config.json come from different models"
        )
    return tensor.t() if conv else tensor


def read_hf_config(folder: Path, family: str, holding: str) -> tuple[Path, dict[str, Any]]:
    """The path and contents of a checkpoint folder's config.json, or a `CheckpointError` that
    says what the folder should hold."""
    if not folder.is_dir():
        raise CheckpointError(
            f"{family} checkpoint folder {folder} does not exist; pass a local folder holding {holding}"
        )
    config_path = folder / CONFIG_FILE
    hf_config = read_json(config_path, what=f"a {family} config (written by save_pretrained)")
    if not isinstance(hf_config, dict):
        raise CheckpointError(f"{config_path}: expected a JSON object, got {type(hf_config).__name__}")
    return config_path, hf_config


@dataclasses.dataclass
class HFSource:
    """A checkpoint's config.json and tensors as read: from a folder (`as_source`), or converted
    from another file (a GGUF file's metadata and tensors under transformers' names). Every
    importer takes one in place of a folder; messages name `config_path` and `weights_path`."""

    config_path: Path
    config: dict[str, Any]
    weights_path: Path
    tensors: dict[str, torch.Tensor]


def as_source(folder: "str | Path | HFSource", family: str) -> HFSource:
    """`folder`'s config.json and weights (`read_hf_config`, `read_weights`); an `HFSource` as it is."""
    if isinstance(folder, HFSource):
        return folder
    holding = f"{CONFIG_FILE} and model.safetensors (download it first, e.g. with huggingface-cli download)"
    config_path, hf_config = read_hf_config(Path(folder), family, holding)
    weights_path, tensors = read_weights(Path(folder))
    return HFSource(config_path, hf_config, weights_path, tensors)


def one_dropout(rates: dict[str, float], source: str) -> float:
    """The one dropout rate attnlab models have, from a checkpoint's several (which must agree)."""
    if len(set(rates.values())) > 1:
        raise CheckpointError(
            f"{source}: the dropout rates differ ({rates}) and attnlab has one; pass dropout=... to choose it"
        )
    return float(next(iter(rates.values())))


def read_json(path: Path, *, what: str) -> Any:
    if not path.is_file():
        raise CheckpointError(f"{path} not found; the folder needs {what} beside its weights")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path} is not readable JSON ({e}); re-save the checkpoint") from e


def read_weights(folder: Path) -> tuple[Path, dict[str, torch.Tensor]]:
    """The first weights file of `WEIGHT_FILES` in `folder`, and all its tensors (every shard)."""
    for filename in WEIGHT_FILES:
        path = folder / filename
        if path.is_file():
            break
    else:
        raise CheckpointError(
            f"no weights in {folder}: expected one of {', '.join(WEIGHT_FILES)}; "
            "save the model with save_pretrained or download the weights too"
        )
    if not filename.endswith(".index.json"):
        return path, read_tensor_file(path)
    index = read_json(path, what="the shard index")
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict):
        raise CheckpointError(f"{path}: no weight_map object; re-save the checkpoint")
    tensors: dict[str, torch.Tensor] = {}
    for shard in sorted(set(weight_map.values())):
        shard_path = folder / shard
        if not shard_path.is_file():
            raise CheckpointError(f"{shard_path} not found, but {path.name} lists it; download every shard")
        tensors.update(read_tensor_file(shard_path))
    return path, tensors


def read_tensor_file(path: Path) -> dict[str, torch.Tensor]:
    """All tensors in one safetensors or PyTorch file, on the CPU. PyTorch files never run pickled code."""
    try:
        if path.name.endswith(".safetensors"):
            tensors = load_file(path)
        else:
            tensors = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        raise CheckpointError(
            f"{path} holds pickled objects other than tensors, which are never loaded (weights_only=True); "
            "convert it to model.safetensors from a trusted environment"
        ) from e
    except (OSError, RuntimeError, ValueError, EOFError, SafetensorError) as e:
        first_line = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointError(f"{path} cannot be read ({first_line}); re-download or re-save it") from e
    if not isinstance(tensors, dict) or not all(isinstance(t, torch.Tensor) for t in tensors.values()):
        raise CheckpointError(f"{path} is not a state dict of tensors; save model.state_dict() or use save_pretrained")
    return tensors


class CheckpointTensors:
    """A checkpoint's tensors, handed out by name and checked against attnlab's shapes.

    Names are used without `prefix` ("model." in a `*ForCausalLM` checkpoint, absent in a bare
    `*Model` one); tensors matching `ignored` (buffers attnlab computes itself) are dropped. Every
    message names a tensor as the file stores it. `check_all_taken` then refuses what was never
    asked for: a tensor attnlab would silently drop means the checkpoint is not what config.json says.
    """

    def __init__(
        self, tensors: Mapping[str, torch.Tensor], source: Path, *, prefix: str, ignored: re.Pattern | None = None
    ) -> None:
        self.source = source
        self.prefix = prefix if any(key.startswith(prefix) for key in tensors) else ""
        self._tensors: dict[str, torch.Tensor] = {}
        for key, tensor in tensors.items():
            name = key.removeprefix(self.prefix)
            if name in self._tensors:
                raise CheckpointError(f"{source}: tensor {name} is stored twice (with and without {self.prefix!r})")
            if ignored is None or not ignored.fullmatch(name):
                self._tensors[name] = tensor
        self._taken: set[str] = set()

    def stored_name(self, name: str) -> str:
        """`name` as the file stores it (the output head is never under the prefix)."""
        return name if name == "lm_head.weight" else self.prefix + name

    def has(self, name: str) -> bool:
        return name in self._tensors

    def take(self, name: str, like: torch.Tensor) -> torch.Tensor:
        """Tensor `name`, checked to have the shape of `like`."""
        if name not in self._tensors:
            raise CheckpointError(
                f"{self.source}: missing tensor {self.stored_name(name)}; the weights file is incomplete or "
                "belongs to another config.json, re-save it with save_pretrained"
            )
        self._taken.add(name)
        return checked(self.stored_name(name), self._tensors[name], like, False, self.source)

    def rows(self, names: Sequence[str], like: torch.Tensor, sizes: Sequence[int]) -> torch.Tensor:
        """Tensors `names`, `sizes[j]` rows each, stacked along rows into one shaped like `like`.
        Example: q, k, v projections (H·D, C), (Hkv·D, C), (Hkv·D, C) -> in_proj ((H + 2·Hkv)·D, C)."""
        parts = like.split(list(sizes))
        return torch.cat([self.take(name, part) for name, part in zip(names, parts, strict=True)])

    def check_all_taken(self, family: str) -> None:
        for name in self._tensors:
            if name not in self._taken:
                raise CheckpointError(
                    f"{self.source}: unexpected tensor {self.stored_name(name)} for the {family} that config.json "
                    "describes; the weights and config.json come from different models"
                )


def read_lm_tokenizer(folder: Path, hf: Mapping[str, Any], source: str, vocab_size: int) -> BPETokenizer:
    """The BPE tokenizer of a causal language model folder (its `tokenizer.json`), with the
    `bos_token_id` and `eos_token_id` of its config.json (the first one where it lists several)
    and the file's own rules for adding them when encoding."""
    path = folder / TOKENIZER_FILE
    if not path.is_file():
        raise CheckpointError(f"no {TOKENIZER_FILE} in {folder}; download the tokenizer with the weights")
    tokenizer = load_tokenizer(path)
    if not isinstance(tokenizer, BPETokenizer):
        raise CheckpointError(f"{path} is not a BPE tokenizer; a causal language model folder needs its BPE file")
    special: dict[str, int | None] = {}
    for key in ("bos_token_id", "eos_token_id"):
        value = hf.get(key)
        if isinstance(value, list) and value:
            value = value[0]  # Llama 3 instruct ends a turn with either of two tokens; the first ends text
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
            raise CheckpointError(f"{source}: {key} must be a token id, a list of them or null, got {hf[key]!r}")
        special[key] = value
    if tokenizer.vocab_size > vocab_size:
        raise CheckpointError(
            f"{path}: the tokenizer has {tokenizer.vocab_size} tokens but {CONFIG_FILE} says vocab_size="
            f"{vocab_size}; the tokenizer belongs to another model"
        )
    return BPETokenizer(
        tokenizer.tokenizer, bos_id=special["bos_token_id"], eos_id=special["eos_token_id"], add_special_tokens=True
    )


# -- the way back: attnlab -> a transformers folder ------------------------------------------------


@dataclasses.dataclass
class HFCheckpoint:
    """A model in transformers' terms, ready to be written as a folder that `from_pretrained` reads."""

    config: dict[str, Any]
    """config.json as a dict: `model_type`, `architectures` and the family's fields."""
    tensors: dict[str, torch.Tensor]
    """Every tensor under transformers' name, in transformers' layout. A tied matrix is stored once
    (transformers ties it again on loading, as its own save_pretrained expects)."""


def save_hf_checkpoint(checkpoint: HFCheckpoint, folder: Path) -> list[str]:
    """Write config.json and model.safetensors into `folder` (which must exist); returns the file names.
    The safetensors metadata says "pt", the mark transformers' own files carry."""
    (folder / CONFIG_FILE).write_text(json.dumps(checkpoint.config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    tensors = {name: t.detach().to("cpu").contiguous().clone() for name, t in checkpoint.tensors.items()}
    save_file(tensors, folder / WEIGHT_FILES[0], metadata={"format": "pt"})
    return [CONFIG_FILE, WEIGHT_FILES[0]]


# A part of an attnlab config a target family can take: field -> (the test of its value, what the
# target has instead, in words). The test reads the whole config, as some fields only make sense
# beside others (n_kv_heads against the number of heads).
PartRule = tuple[Callable[[Any], bool], str]


def is_value(field: str, *allowed: Any) -> Callable[[Any], bool]:
    """The test that `config.field` is one of `allowed`."""
    return lambda config: getattr(config, field) in allowed


# What no exporter takes: the block variants of attnlab.nn.parts and the sparse attention patterns,
# which no transformers family computes in the dense models exported here.
COMMON_EXPORT_RULES: dict[str, PartRule] = {
    "attention": (is_value("attention", "full"), "full attention (no window, BigBird or Linformer pattern)"),
    "experts": (is_value("experts", 0), "a dense feed-forward layer (no mixture of experts)"),
    "block_sharing": (
        is_value("block_sharing", "none"),
        "its own weights in every block (no ALBERT or Universal sharing)",
    ),
    "embedding_dim": (is_value("embedding_dim", None), "token embeddings as wide as the model (no factorization)"),
    "block": (is_value("block", "transformer"), "the Transformer's blocks (no Evolved Transformer cells)"),
    "memory_keys": (is_value("memory_keys", 0), "a feed-forward layer in every block (no product key memory)"),
    "branched_attention": (is_value("branched_attention", False), "one attention a block (no Weighted Transformer)"),
    "funnel_stages": (is_value("funnel_stages", None), "every layer at full length (no Funnel pooling)"),
}


def part_problems(config: Any, rules: Mapping[str, PartRule], target: str) -> list[str]:
    """Each part of `config` that breaks one of `rules`, as "field = value (TARGET has ...)".
    Example: positions='alibi' against GPT-2's rules -> ["positions = 'alibi' (GPT-2 has learned positions)"]."""
    return [
        f"{field} = {getattr(config, field)!r} ({target} has {wanted})"
        for field, (fits, wanted) in rules.items()
        if not fits(config)
    ]


def refusal(problems: Sequence[str], target: str) -> ExportError:
    """The `ExportError` naming every problem, on one line."""
    return ExportError(f"cannot export to transformers {target}: " + "; ".join(problems))


def refuse(problems: Sequence[str], target: str) -> None:
    """Raise `refusal(problems, target)`; nothing when there are no problems."""
    if problems:
        raise refusal(problems, target)
