"""attnlab.models.hf.gguf: GGUF files written by llama.cpp's own converter give transformers' logits.

The files come from `convert_hf_to_gguf.py` (tests/gguf_files.py; skipped, saying how to get it,
where it is missing) run on tiny random-weight Hugging Face folders. References never use
attnlab's reader: an f32 file is compared with transformers on the source folder, and a
quantized one with transformers' model holding gguf's own dequantization of the file's blocks.
"""

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch

from attnlab.errors import CheckpointError
from attnlab.models.hf.gguf import load_gguf, read_gguf
from gguf_files import (
    convert,
    converter,
    fields,
    hf_folder,
    random_blocks,
    reference_model,
    rewrite_gguf,
    stored_tensors,
)

transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")

ARCHITECTURES = {"llama": "llama", "gpt2": "gpt2", "wide": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}
# A Llama wide enough for the K-quants, whose blocks are 256 weights of a row.
WIDE = dict(
    hidden_size=256,
    intermediate_size=512,
    num_hidden_layers=1,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
)
CONVERTED = [
    ("llama", "f32"),
    ("llama", "q8_0"),
    ("llama", "bf16"),
    ("gpt2", "f32"),
    ("gpt2", "q8_0"),
    ("wide", "f32"),
    ("qwen2", "f32"),
    ("qwen3", "f32"),
    ("qwen3", "q8_0"),
]
TEXTS = [
    "ROMEO: What light through yonder window breaks?",
    "  two spaces,\ttabs\nand lines\n\n",
    "Déjà vu — naïve café 3.14159 😀",
    "</s>special tokens<s> inside",
]


@dataclasses.dataclass
class Converted:
    folder: Path
    models: dict[str, torch.nn.Module]

    def path(self, model: str, outtype: str) -> Path:
        return self.folder / f"{model}-{outtype}.gguf"


@pytest.fixture(scope="module")
def converted(tmp_path_factory) -> Converted:
    """The folders of `ARCHITECTURES` and their GGUFs of `CONVERTED`, in one run of the converter."""
    converter()
    root = tmp_path_factory.mktemp("gguf")
    models = {
        "llama": hf_folder(root / "llama", "llama"),
        "gpt2": hf_folder(root / "gpt2", "gpt2"),
        "wide": hf_folder(root / "wide", "llama", **WIDE),
        "qwen2": hf_folder(root / "qwen2", "qwen2"),
        "qwen3": hf_folder(root / "qwen3", "qwen3"),
    }
    files = Converted(root, models)
    convert([(root / model, outtype, files.path(model, outtype)) for model, outtype in CONVERTED])
    return files


def tokens(vocab_size: int, n: int = 24) -> torch.Tensor:
    """(1, n) random token ids, the same every run."""
    return torch.randint(vocab_size, (1, n), generator=torch.Generator().manual_seed(0))


def logits(model: torch.nn.Module, idx: torch.Tensor) -> torch.Tensor:
    """(B, T, V) logits of an attnlab GPT or a transformers model."""
    with torch.no_grad():
        out = model(idx)
    return out.logits if hasattr(out, "logits") else out


def assert_same_logits(path: Path, reference: torch.nn.Module) -> torch.Tensor:
    """attnlab's model of the file `path` scores like `reference` (1e-4); returns the logits."""
    loaded = load_gguf(path)
    idx = tokens(loaded.model.config.vocab_size)
    ours, theirs = logits(loaded.model, idx), logits(reference, idx)
    torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=0)
    return theirs


@pytest.mark.parametrize("model", ["llama", "gpt2", "qwen2", "qwen3"])
def test_f32_file_gives_transformers_logits(converted, model):
    loaded = load_gguf(converted.path(model, "f32"))
    assert (loaded.model_type, loaded.origin) == (model, str(converted.path(model, "f32")))
    assert loaded.chat_template is None  # the folder has none
    assert_same_logits(converted.path(model, "f32"), converted.models[model])


@pytest.mark.parametrize("model", ["llama", "gpt2"])
def test_tokenizer_gives_the_folder_ids(converted, model):
    from tokenizers import Tokenizer

    folder = Tokenizer.from_file(str(converted.folder / model / "tokenizer.json"))
    _, tokenizer, _ = read_gguf(converted.path(model, "f32"))
    for text in TEXTS:
        assert tokenizer.encode(text) == folder.encode(text).ids, text
        assert tokenizer.decode(folder.encode(text, add_special_tokens=False).ids) == text
    assert (tokenizer.bos_id, tokenizer.eos_id, tokenizer.vocab_size) == (0, 1, folder.get_vocab_size())


@pytest.mark.parametrize("model, outtype", [("llama", "q8_0"), ("llama", "bf16"), ("gpt2", "q8_0"), ("qwen3", "q8_0")])
def test_converter_types_give_the_dequantized_model(converted, model, outtype):
    path = converted.path(model, outtype)
    types = {qtype.name for _, qtype in stored_tensors(path).values()}
    # q8_0 stores norms in F32 and rows not a multiple of 32 weights (the 48-wide down_proj) in F16.
    narrow = model in ("llama", "qwen3")
    assert types == {"q8_0": {"Q8_0", "F32", "F16"} if narrow else {"Q8_0", "F32"}, "bf16": {"BF16", "F32"}}[outtype]
    reference = reference_model(converted.models[model], converted.path(model, "f32"), path, ARCHITECTURES[model])
    assert_same_logits(path, reference)


def quantized_copy(converted: Converted, model: str, qtype: str, out: Path) -> Path:
    """The converter's f32 file of `model` with every matrix whose rows split into `qtype` blocks
    stored as `qtype`: gguf's quantizer for Q4_0, random blocks for the K-quants."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
    from gguf.quants import quantize

    block = GGML_QUANT_SIZES[GGMLQuantizationType[qtype]][0]
    tensors = {}
    for i, (name, (data, _)) in enumerate(stored_tensors(converted.path(model, "f32")).items()):
        if data.ndim == 2 and data.shape[1] % block == 0:
            if qtype == "Q4_0":
                tensors[name] = (quantize(data, GGMLQuantizationType.Q4_0), GGMLQuantizationType.Q4_0)
            else:
                tensors[name] = random_blocks(data.shape, qtype, seed=i)
    assert tensors
    rewrite_gguf(converted.path(model, "f32"), out, tensors=tensors)
    return out


@pytest.mark.parametrize("model, qtype", [("llama", "Q4_0"), ("wide", "Q4_K"), ("wide", "Q5_K"), ("wide", "Q6_K")])
def test_block_types_give_the_dequantized_model(converted, tmp_path, model, qtype):
    path = quantized_copy(converted, model, qtype, tmp_path / f"{model}-{qtype}.gguf")
    assert qtype in {t.name for _, t in stored_tensors(path).values()}
    reference = reference_model(converted.models[model], converted.path(model, "f32"), path, "llama")
    theirs = assert_same_logits(path, reference)
    # The blocks changed the model: the comparison is with the dequantized weights, not the originals.
    assert (theirs - logits(converted.models[model], tokens(theirs.size(-1)))).abs().max() > 1e-2


# -- bad input: one line naming the file and the reason -------------------------------------------


def assert_refused(path: Path, *words: str) -> None:
    with pytest.raises(CheckpointError) as e:
        load_gguf(path)
    message = str(e.value)
    assert "\n" not in message and str(path) in message, message
    for word in words:
        assert word in message, message


def test_a_text_file_is_not_gguf(tmp_path):
    path = tmp_path / "x.gguf"
    path.write_text("not a model\n")
    assert_refused(path, "is not a GGUF file")
    assert_refused(tmp_path / "absent.gguf", "not found")


@pytest.mark.parametrize("keep", [0.5, 0.999, 0.01])
def test_a_truncated_file_is_refused(converted, tmp_path, keep):
    data = converted.path("llama", "f32").read_bytes()
    path = tmp_path / "cut.gguf"
    path.write_bytes(data[: int(len(data) * keep)])
    assert_refused(path, "truncated")


def test_an_unknown_architecture_is_named(converted, tmp_path):
    path = tmp_path / "falcon.gguf"
    rewrite_gguf(converted.path("llama", "f32"), path, architecture="falcon")
    assert_refused(path, "'falcon'", "gpt2", "llama")


def test_linear_rope_scaling_is_read_with_its_factor(converted, tmp_path):
    """rope.scaling.type "linear" and its factor become the model's scaled RoPE (a type without its
    factor would be read as no stretch at all); a type attnlab does not compute is refused by name."""
    path = tmp_path / "linear.gguf"
    scaling = {"llama.rope.scaling.type": "linear", "llama.rope.scaling.factor": 4.0}
    rewrite_gguf(converted.path("llama", "f32"), path, add=scaling)
    config = load_gguf(path).model.config
    assert (config.rope_scaling, config.rope_factor) == ("linear", 4.0)
    yarn = tmp_path / "yarn.gguf"
    rewrite_gguf(converted.path("llama", "f32"), yarn, add={**scaling, "llama.rope.scaling.type": "yarn"})
    assert_refused(yarn, "'yarn'")


def test_missing_metadata_is_named(converted, tmp_path):
    path = tmp_path / "no-blocks.gguf"
    rewrite_gguf(converted.path("llama", "f32"), path, drop=["llama.block_count"])
    assert_refused(path, "llama.block_count", "missing")


def test_an_unreadable_tensor_type_is_named(converted, tmp_path):
    path = tmp_path / "f64.gguf"
    data = stored_tensors(converted.path("llama", "f32"))["output_norm.weight"][0].astype(np.float64)
    rewrite_gguf(converted.path("llama", "f32"), path, tensors={"output_norm.weight": (data, None)})
    assert fields(path)["general.architecture"][0] == "llama"
    assert_refused(path, "output_norm.weight", "F64")


# -- export: attnlab export RUN --to gguf ------------------------------------------------------------

TWO_STEPS = dict(max_iters=2, eval_interval=2, eval_iters=1, warmup_iters=1, log_interval=1, batch_size=4)
# Widths of whole q8_0 blocks (32) for most matrices; Llama's SwiGLU width is not one, which
# leaves its down projection in f32 (the rule `stored` follows, and so does the reference).
EXPORTED_RUNS = {
    "gpt2": dict(activation="gelu_tanh"),  # llama.cpp's GPT-2 GELU is the tanh one
    "llama": dict(positions="rope", normalization="rmsnorm", activation="swiglu", bias=False, n_kv_heads=2),
    "exact-gelu": dict(),  # attnlab's default GELU (erf), which llama.cpp's GPT-2 does not compute
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Runs of EXPORTED_RUNS (a byte-level BPE of 300 tokens, 2 training steps), trained on first use."""
    from attnlab.data.text import bundled_shakespeare
    from attnlab.train import resolve, train

    made: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in made:
            folder = tmp_path_factory.mktemp(name)
            (folder / "corpus.txt").write_text(bundled_shakespeare()[:5_000], encoding="utf-8")
            model = dict(block_size=16, n_layers=2, n_heads=4, d_model=64, **EXPORTED_RUNS[name])
            data = dict(path=str(folder / "corpus.txt"), tokenizer="bpe", vocab_size=300)
            train(resolve(dict(task="lm", model=model, data=data, train=TWO_STEPS)), folder / "run", progress=False)
            made[name] = folder / "run"
        return made[name]

    return get


def round_trip_reference(model: torch.nn.Module, outtype: str) -> torch.nn.Module:
    """A copy of the attnlab `model` whose matrices went through gguf's own quantizer and back
    (matrices of whole blocks only), the weights a GGUF file of `outtype` holds."""
    import copy

    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
    from gguf.quants import dequantize, quantize

    reference = copy.deepcopy(model)
    qtype = {"bf16": GGMLQuantizationType.BF16, "q8_0": GGMLQuantizationType.Q8_0}[outtype]
    with torch.no_grad():
        for p in reference.parameters():
            if p.dim() == 2 and p.size(1) % GGML_QUANT_SIZES[qtype][0] == 0:
                p.copy_(torch.from_numpy(dequantize(quantize(p.numpy(), qtype), qtype)))
    return reference


@pytest.mark.parametrize("name", ["gpt2", "llama"])
@pytest.mark.parametrize("outtype", ["f32", "bf16", "q8_0"])
def test_an_exported_file_reads_back_to_the_run(runs, capsys, tmp_path, name, outtype):
    from attnlab.train.load import load_run
    from helpers import cli

    out = tmp_path / f"{name}.gguf"
    code, _, err = cli(capsys, "export", runs(name), "--to", "gguf", out, "--outtype", outtype)
    assert code == 0, err
    run = load_run(runs(name))
    reference = run.model if outtype == "f32" else round_trip_reference(run.model, outtype)
    loaded = load_gguf(out)
    idx = tokens(run.model.config.vocab_size, n=16)
    torch.testing.assert_close(logits(loaded.model, idx), logits(reference.eval(), idx), atol=1e-4, rtol=0)
    for text in TEXTS:
        assert loaded.tokenizer.encode(text) == run.tokenizer.encode(text)
    assert (loaded.model_type, loaded.tokenizer.eos_id) == (name, run.tokenizer.eos_id)


def test_gguf_reads_the_exported_metadata(runs, capsys, tmp_path):
    from helpers import cli

    out = tmp_path / "llama.gguf"
    assert cli(capsys, "export", runs("llama"), "--to", "gguf", out, "--outtype", "q8_0")[0] == 0
    meta = {key: value for key, (value, _) in fields(out).items()}
    assert meta["general.architecture"] == "llama"
    expected = {"block_count": 2, "embedding_length": 64, "context_length": 16}
    expected |= {"attention.head_count": 4, "attention.head_count_kv": 2, "attention.key_length": 16}
    assert {key: meta[f"llama.{key}"] for key in expected} == expected
    assert meta["tokenizer.ggml.model"] == "gpt2" and len(meta["tokenizer.ggml.tokens"]) == 300
    assert meta["general.file_type"] == gguf.LlamaFileType.MOSTLY_Q8_0
    types = {t.name: t.tensor_type.name for t in gguf.GGUFReader(out).tensors}
    assert types["blk.0.attn_q.weight"] == "Q8_0" and types["output_norm.weight"] == "F32"


def test_export_refuses_what_gguf_lacks(runs, capsys, tmp_path):
    from helpers import assert_user_error, cli

    exact, gpt2 = runs("exact-gelu"), runs("gpt2")
    capsys.readouterr()  # what training printed
    out = tmp_path / "exact.gguf"
    assert_user_error(cli(capsys, "export", exact, "--to", "gguf", out), "activation_function", "gelu_new")
    assert not out.exists() and not list(tmp_path.iterdir())  # no staging file left behind
    (tmp_path / "taken.gguf").write_text("")
    assert_user_error(cli(capsys, "export", gpt2, "--to", "gguf", tmp_path / "taken.gguf"), "--force")


def test_export_refuses_scaled_rope(tmp_path):
    """The GGUF metadata written holds RoPE's base alone: a model with Llama 3's scaled RoPE is
    refused by name rather than written as another model."""
    from attnlab.data.tokenizers import load_tokenizer
    from attnlab.errors import ExportError
    from attnlab.models.gpt import GPT, GPTConfig
    from attnlab.models.hf.gguf_export import write_gguf
    from hf_folders import write_tokenizer

    write_tokenizer(tmp_path)
    tokenizer = load_tokenizer(tmp_path / "tokenizer.json")
    llama = dict(positions="rope", normalization="rmsnorm", activation="swiglu", bias=False, n_heads=2, d_model=16)
    config = GPTConfig(vocab_size=tokenizer.vocab_size, block_size=16, n_layers=1, rope_scaling="linear", **llama)
    with pytest.raises(ExportError, match="rope_type 'linear'"):
        write_gguf(GPT(config), tokenizer, tmp_path / "scaled.gguf")
    assert not (tmp_path / "scaled.gguf").exists()


def test_the_command_line_offers_the_writer_s_types():
    from attnlab.cli.export import GGUF_OUTTYPES
    from attnlab.models.hf.gguf_export import OUTTYPES

    assert GGUF_OUTTYPES == OUTTYPES


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_an_exported_file_holds_what_llama_cpp_writes(runs, capsys, tmp_path, name):
    """The same run exported --to hf and converted by llama.cpp's converter, and exported --to gguf:
    the same tensors (names, layout, values) and the same metadata where both write a key."""
    import json

    from helpers import cli

    run = runs(name)
    capsys.readouterr()
    assert cli(capsys, "export", run, "--to", "hf", tmp_path / "hf")[0] == 0
    assert cli(capsys, "export", run, "--to", "gguf", tmp_path / "ours.gguf")[0] == 0
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    if "n_positions" in config:  # the converter reads GPT-2's context as n_ctx (see gguf_files.hf_folder)
        (tmp_path / "hf" / "config.json").write_text(json.dumps(config | {"n_ctx": config["n_positions"]}))
    convert([(tmp_path / "hf", "f32", tmp_path / "theirs.gguf")])
    ours, theirs = stored_tensors(tmp_path / "ours.gguf"), stored_tensors(tmp_path / "theirs.gguf")
    assert ours.keys() == theirs.keys()
    for tensor, (data, _) in ours.items():
        np.testing.assert_array_equal(data, theirs[tensor][0], err_msg=tensor)
    ours, theirs = fields(tmp_path / "ours.gguf"), fields(tmp_path / "theirs.gguf")
    shared = [key for key in ours if key.startswith((f"{name}.", "tokenizer.")) and key in theirs]
    assert {key: ours[key] for key in shared} == {key: theirs[key] for key in shared}
    assert {key for key in ours if key.startswith(f"{name}.")} <= set(theirs)
    assert len(shared) >= 12
