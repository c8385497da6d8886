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
    LLAMA3_ROPE,
    convert,
    converter,
    fields,
    hf_folder,
    llama3_gpt,
    random_blocks,
    reference_model,
    rewrite_gguf,
    stored_tensors,
    tiny_runs,
)

pytestmark = pytest.mark.slow

transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")

ARCHITECTURES = {
    "llama": "llama",
    "gpt2": "gpt2",
    "wide": "llama",
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "gemma3": "gemma3",
    "phi3": "phi3",
    "smollm3": "smollm3",
    "mistral": "llama",  # the converter writes Mistral as Llama (`LlamaModel`)
    "mixtral": "llama",  # ... and Mixtral as Llama with experts
    "qwen2-yarn": "qwen2",
    "llama3": "llama",
}
# The folders beyond the tiny Llama, GPT-2 and Qwen shapes: model_type -> its config (with the
# converter's needs: no pad id past the tiny vocabulary, Phi-3's tokenizer class).
SMALL = dict(hidden_size=32, intermediate_size=48, num_attention_heads=4, num_key_value_heads=2)
SMALL |= dict(max_position_embeddings=64, pad_token_id=None)
FOLDERS = {
    # Six layers: five with a window of 8 (shorter than the test's 24 tokens) and one global, each
    # with its own RoPE base.
    "gemma3": (
        "gemma3_text",
        dict(SMALL, num_hidden_layers=6, head_dim=16, sliding_window=8, query_pre_attn_scalar=16),
    ),
    # Partial rotary and LongRoPE stretching a pre-training context of 32 twofold.
    "phi3": (
        "phi3",
        dict(
            SMALL,
            num_hidden_layers=2,
            partial_rotary_factor=0.5,
            original_max_position_embeddings=32,
            rope_parameters={
                "rope_type": "longrope",
                "rope_theta": 1e4,
                "short_factor": [1.0, 1.5],
                "long_factor": [2.0, 3.0],
            },
            tokenizer_class="GPT2Tokenizer",
        ),
    ),
    "smollm3": ("smollm3", dict(SMALL, num_hidden_layers=4)),  # layer 3 without RoPE
    "mistral": ("mistral", dict(SMALL, num_hidden_layers=2, sliding_window=None)),
    "mixtral": ("mixtral", dict(SMALL, num_hidden_layers=2, num_local_experts=3, num_experts_per_tok=2)),
    # Llama 3.1's scaling (gguf_files.LLAMA3_ROPE), which the converter stores as a rope_freqs tensor.
    "llama3": ("llama", dict(SMALL, num_hidden_layers=2, rope_parameters=LLAMA3_ROPE)),
    # YaRN stretching a pre-training context of 16 fourfold: the test's 24 tokens pass it.
    "qwen2-yarn": (
        "qwen2",
        dict(
            SMALL,
            num_hidden_layers=2,
            rope_parameters={
                "rope_type": "yarn",
                "rope_theta": 1e4,
                "factor": 4.0,
                "original_max_position_embeddings": 16,
            },
        ),
    ),
}
# What each folder reads back as (config.json's model_type).
MODEL_TYPES = {name: model_type for name, (model_type, _) in FOLDERS.items()} | {
    "mistral": "llama",
    "qwen2-yarn": "qwen2",
}
# Mixtral's gate and up experts, fused in transformers 5's model, are two GGUF tensors (the
# converter's --fuse-gate-up-exps does not apply to its "llama" architecture).
MIXTRAL_JOINS = {
    f"model.layers.{i}.mlp.experts.gate_up_proj": (f"blk.{i}.ffn_gate_exps.weight", f"blk.{i}.ffn_up_exps.weight")
    for i in range(2)
}
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
    *((name, outtype) for name in FOLDERS for outtype in ("f32", "q8_0") if name != "qwen2-yarn"),
    ("qwen2-yarn", "f32"),
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
        **{name: hf_folder(root / name, model_type, **config) for name, (model_type, config) in FOLDERS.items()},
    }
    files = Converted(root, models)
    jobs = [(root / model, outtype, files.path(model, outtype)) for model, outtype in CONVERTED]
    convert(jobs)
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


@pytest.mark.parametrize("model", list(FOLDERS))
def test_f32_file_of_the_other_families_gives_transformers_logits(converted, model):
    """Gemma 3 (norms stored as 1 + w, windows and global layers, two RoPE bases), Phi-3 (fused
    projections, partial rotary, LongRoPE's factors as tensors), SmolLM3 (a layer without RoPE),
    Mistral and Mixtral (written as Llama, with experts), a YaRN Qwen2 and a Llama with Llama 3.1's
    scaling (a rope_freqs tensor), over 24 tokens."""
    loaded = load_gguf(converted.path(model, "f32"))
    assert loaded.model_type == MODEL_TYPES[model]
    assert_same_logits(converted.path(model, "f32"), converted.models[model])


def test_the_other_families_read_their_parts(converted):
    """What the logits test could pass without: each file's parts are read, not defaulted."""
    gemma = load_gguf(converted.path("gemma3", "f32")).model.config
    assert gemma.layer_attention == ("window",) * 5 + ("full",) and gemma.attention_window == 8
    assert (gemma.rope_theta, gemma.window_rope_theta, gemma.attention_scale) == (1e6, 1e4, 16**-0.5)
    phi = load_gguf(converted.path("phi3", "f32")).model.config
    assert (phi.rope_scaling, phi.rope_short_factor, phi.rope_long_factor, phi.rotary_dims) == (
        "longrope",
        (1.0, 1.5),
        (2.0, 3.0),
        4,
    )
    assert phi.rope_attention_factor == pytest.approx((1 + np.log(2) / np.log(32)) ** 0.5)
    assert load_gguf(converted.path("smollm3", "f32")).model.config.nope_layers == (3,)
    mixtral = load_gguf(converted.path("mixtral", "f32")).model.config
    assert (mixtral.experts, mixtral.expert_top_k) == (3, 2)
    yarn = load_gguf(converted.path("qwen2-yarn", "f32")).model.config
    assert (yarn.rope_scaling, yarn.rope_factor, yarn.rope_original_context) == ("yarn", 4.0, 16)


def test_llama3_divisors_are_transformers_frequencies(converted):
    """The llama3 file's rope_freqs, read as rope_scaling "factors", divide the unscaled
    frequencies into transformers' own llama3 frequencies (its `ROPE_INIT_FUNCTIONS`, not the
    converter's arithmetic), with each kind of pair present: kept, on the ramp, divided by the factor."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = load_gguf(converted.path("llama3", "f32")).model.config
    assert config.rope_scaling == "factors" and config.rope_theta == LLAMA3_ROPE["rope_theta"]
    unscaled = LLAMA3_ROPE["rope_theta"] ** (-torch.arange(0, 8, 2, dtype=torch.float32) / 8)
    scaled, _ = ROPE_INIT_FUNCTIONS["llama3"](converted.models["llama3"].config, "cpu")
    divisors = torch.tensor(config.rope_long_factor)
    torch.testing.assert_close(divisors, unscaled / scaled, rtol=1e-6, atol=0)
    assert divisors[0] == 1 and 1 < divisors[1] < 4 and divisors[2:].tolist() == [4.0, 4.0]


def test_llama3_file_decodes_through_the_fused_step(converted):
    """The divisors are one table of angles: the fused step covers the model and its greedy
    tokens are PyTorch's."""
    from attnlab.accel.fused import extension, supports
    from attnlab.decode.sampling import greedy

    if extension() is None:
        pytest.skip("the fused step could not be built here")
    model = load_gguf(converted.path("llama3", "f32")).model
    assert supports(model, model.new_cache(1))
    prompt = tokens(model.config.vocab_size, n=4)
    assert torch.equal(greedy(model, prompt, 40, fused=True), greedy(model, prompt, 40))


def test_rope_freqs_beside_another_scaling_or_of_the_wrong_size_is_refused(converted, tmp_path):
    both = tmp_path / "both.gguf"
    scaling = {"llama.rope.scaling.type": "linear", "llama.rope.scaling.factor": 2.0}
    rewrite_gguf(converted.path("llama3", "f32"), both, add=scaling)
    assert_refused(both, "rope_freqs.weight", "'linear'")
    short = tmp_path / "short.gguf"
    three = (np.array([1.0, 2.0, 4.0], dtype=np.float32), gguf.GGMLQuantizationType.F32)
    rewrite_gguf(converted.path("llama3", "f32"), short, tensors={"rope_freqs.weight": three})
    assert_refused(short, "rope_freqs.weight", "3 divisors")


@pytest.mark.parametrize("model", [name for name in FOLDERS if name != "qwen2-yarn"])
def test_q8_0_file_of_the_other_families_gives_the_dequantized_model(converted, model):
    path = converted.path(model, "q8_0")
    assert "Q8_0" in {qtype.name for _, qtype in stored_tensors(path).values()}
    joins = MIXTRAL_JOINS if model == "mixtral" else None
    reference = reference_model(
        converted.models[model], converted.path(model, "f32"), path, ARCHITECTURES[model], joins
    )
    theirs = assert_same_logits(path, reference)
    assert (theirs - logits(converted.models[model], tokens(theirs.size(-1)))).abs().max() > 1e-3  # blocks changed it


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


def test_rope_scaling_is_read_with_its_factor(converted, tmp_path):
    """rope.scaling.type "linear" and its factor become the model's scaled RoPE (a type without its
    factor would be read as no stretch at all); "yarn" without its pre-training context takes the
    file's context, as transformers does; a type attnlab does not compute for Llama is refused by name."""
    path = tmp_path / "linear.gguf"
    scaling = {"llama.rope.scaling.type": "linear", "llama.rope.scaling.factor": 4.0}
    rewrite_gguf(converted.path("llama", "f32"), path, add=scaling)
    config = load_gguf(path).model.config
    assert (config.rope_scaling, config.rope_factor) == ("linear", 4.0)
    yarn = tmp_path / "yarn.gguf"
    rewrite_gguf(converted.path("llama", "f32"), yarn, add={**scaling, "llama.rope.scaling.type": "yarn"})
    config = load_gguf(yarn).model.config
    assert (config.rope_scaling, config.rope_factor, config.rope_original_context) == ("yarn", 4.0, 64)
    assert config.rope_attention_factor == pytest.approx(0.1 * np.log(4.0) + 1)
    longrope = tmp_path / "longrope.gguf"
    rewrite_gguf(converted.path("llama", "f32"), longrope, add={**scaling, "llama.rope.scaling.type": "longrope"})
    assert_refused(longrope, "'longrope'")


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


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Runs of gguf_files.EXPORTED_RUNS, trained on first use."""
    return tiny_runs(tmp_path_factory)


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


def test_export_writes_llama3_rope_as_the_converter_does(converted, tmp_path):
    """Llama 3.1's scaled RoPE is written as llama.cpp's converter writes it, the divisors as the
    tensor rope_freqs (the converter's own for the same settings), and reads back to the model's
    logits, which the scaling changes; another scaling is refused by name, and no file is left."""
    from attnlab.errors import ExportError
    from attnlab.models.gpt import GPT
    from attnlab.models.hf.gguf_export import write_gguf

    model, tokenizer = llama3_gpt(tmp_path)
    path = tmp_path / "llama3.gguf"
    write_gguf(model, tokenizer, path)
    ours, theirs = (stored_tensors(p)["rope_freqs.weight"][0] for p in (path, converted.path("llama3", "f32")))
    np.testing.assert_allclose(ours, theirs, rtol=1e-6)
    idx = tokens(model.config.vocab_size)
    torch.testing.assert_close(logits(load_gguf(path).model, idx), logits(model, idx), atol=1e-4, rtol=0)
    unscaled = GPT(dataclasses.replace(model.config, rope_scaling="none"))
    unscaled.load_state_dict(model.state_dict())
    assert (logits(unscaled.eval(), idx) - logits(model, idx)).abs().max() > 1e-2
    linear = GPT(dataclasses.replace(model.config, rope_scaling="linear", rope_factor=2.0))
    with pytest.raises(ExportError, match="rope_type 'linear'"):
        write_gguf(linear, tokenizer, tmp_path / "scaled.gguf")
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
