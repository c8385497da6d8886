"""attnlab's logits on a quantized GGUF file beside llama.cpp's own on the same file.

llama.cpp (through llama-cpp-python, where installed; the tests skip, saying so, elsewhere: it is
not a dev dependency, as it compiles llama.cpp) reads tiny Llama and Qwen2 files written by
llama.cpp's converter (f32, Q8_0) and by llama.cpp's own quantizer (Q4_0, Q4_K_M, which mixes
Q4_K and Q6_K). Both libraries decode the same blocks to the same weights; they differ in how they
multiply them: llama.cpp's CPU kernels quantize each activation vector to 8 bits before a dot
product with a quantized matrix (Q8_0 blocks of 32 for Q8_0 / Q4_0 weights, Q8_K blocks of 256 for
the K-quants: codes −127 … 127 times the block's max / 127), where attnlab multiplies in float32.

The bound. Rounding to 127 levels of the block's largest magnitude errs by at most half a step,
u₈ = 1 / 254 < 2⁻⁷ of that magnitude; to first order each quantized product adds one such relative
error to what it computes, and a logit lies at the end of 4L + 1 chained products (q, k, v; the
output projection; gate and up; down, in each of L blocks; the head). Hence the first-order
estimate (4L + 1) · 2⁻⁸ · max |logit|, and the test allows twice it, as softmax over sharp
attention scores (these models' q and k are scaled up, `gguf_files.spread`) amplifies an error in
the scores beyond first order. Measured figures are in docs/checkpoints.md. The key / value
cache is kept in float32 (llama.cpp's default is f16, which adds its own rounding): on the f32 file
the two libraries then agree to float32 rounding (1e-4), which shows that the comparison is set up right.
A Llama with Llama 3.1's scaled RoPE (its file holds the divisors as rope_freqs) is compared the same way.

Files attnlab writes (`attnlab export RUN --to gguf`, a tiny trained Llama-shaped and GPT-2-shaped
run, f32, bf16 and Q8_0) load in llama.cpp and are held to the same bounds: bf16 weights make
llama.cpp round the activations to bf16 (8 significant bits, a relative error of at most 2⁻⁸ per
element), within the bound above. GPT-2's GELU has a rounding of llama.cpp's own: its CPU kernel
reads the GELU of the input rounded to f16 from a table of f16 values (ggml's GGML_GELU_FP16);
attnlab's GELU is rounded the same way for the comparison (`ggml_gelu`), after which f32 files
again agree to float32 rounding.
"""

import ctypes
from pathlib import Path

import numpy as np
import pytest
import torch

from attnlab.decode.sampling import greedy
from attnlab.models.hf.gguf import load_gguf
from attnlab.models.hf.gguf_export import OUTTYPES
from gguf_files import LLAMA3_ROPE, RUN_CONTEXT, convert, converter, hf_folder, llama3_gpt, stored_tensors, tiny_runs

pytestmark = pytest.mark.slow

llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (it compiles llama.cpp)")

GGML_TYPE_F32 = 0  # ggml_type: the key / value cache in float32
QWEN2 = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
WIDE = dict(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
# file -> (folder, how it is made: the converter's --outtype or llama.cpp's quantizer's ftype)
FILES = {
    "llama-f32": ("llama", "f32"),
    "llama-q8_0": ("llama", "q8_0"),
    "llama-q4_0": ("llama", "LLAMA_FTYPE_MOSTLY_Q4_0"),
    "wide-f32": ("wide", "f32"),
    "wide-q4_k_m": ("wide", "LLAMA_FTYPE_MOSTLY_Q4_K_M"),
    "qwen2-q8_0": ("qwen2", "q8_0"),
    "llama3-f32": ("llama3", "f32"),
    "llama3-q8_0": ("llama3", "q8_0"),
}
STORED = {
    "llama-q4_0": "Q4_0",
    "wide-q4_k_m": "Q4_K",
    "qwen2-q8_0": "Q8_0",
    "llama-q8_0": "Q8_0",
    "llama3-q8_0": "Q8_0",
}


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> Path:
    """The folders and every file of `FILES`, in one run of the converter and llama.cpp's quantizer."""
    converter()
    root = tmp_path_factory.mktemp("llamacpp")
    hf_folder(root / "llama", "llama")
    hf_folder(root / "wide", "llama", max_position_embeddings=64, **WIDE)
    hf_folder(
        root / "qwen2", "qwen2", max_position_embeddings=64, **QWEN2
    )  # heads of width / heads, as llama.cpp's qwen2 has them
    hf_folder(root / "llama3", "llama", max_position_embeddings=64, rope_parameters=LLAMA3_ROPE, **QWEN2)
    convert(
        [(root / folder, how, root / f"{name}.gguf") for name, (folder, how) in FILES.items() if how in ("f32", "q8_0")]
    )
    for name, (folder, how) in FILES.items():
        if how.startswith("LLAMA_FTYPE"):
            params = llama_cpp.llama_model_quantize_default_params()
            params.ftype, params.nthread = getattr(llama_cpp, how), 1
            source, out = str(root / f"{folder}-f32.gguf").encode(), str(root / f"{name}.gguf").encode()
            assert llama_cpp.llama_model_quantize(source, out, ctypes.byref(params)) == 0, name
    return root


def llama(path: Path):
    return llama_cpp.Llama(
        str(path), logits_all=True, n_ctx=64, n_threads=1, verbose=False, type_k=GGML_TYPE_F32, type_v=GGML_TYPE_F32
    )


def their_logits(path: Path, ids: list[int]) -> np.ndarray:
    """llama.cpp's logits `(T, V)` for the token ids `ids`, read in one batch."""
    model = llama(path)
    model.eval(ids)
    return np.array(model.scores[: len(ids)])


def our_logits(path: Path, ids: list[int]) -> np.ndarray:
    with torch.no_grad():
        return load_gguf(path).model(torch.tensor([ids]))[0].numpy()


def bound(path: Path, logits: np.ndarray) -> float:
    """Twice the first-order estimate (4L + 1) · 2⁻⁸ · max |logit| (see the module docstring)."""
    n_layers = load_gguf(path).model.config.n_layers
    return 2 * (4 * n_layers + 1) * 2**-8 * float(np.abs(logits).max())


def prompt(path: Path, n: int = 24) -> list[int]:
    vocab = load_gguf(path).model.config.vocab_size
    return torch.randint(2, vocab, (n,), generator=torch.Generator().manual_seed(0)).tolist()


@pytest.mark.parametrize("name", ["llama-f32", "wide-f32", "llama3-f32"])
def test_float_files_agree_to_float32_rounding(files, name):
    path = files / f"{name}.gguf"
    ids = prompt(path)
    np.testing.assert_allclose(our_logits(path, ids), their_logits(path, ids), atol=1e-4, rtol=0)


@pytest.mark.parametrize("name", list(STORED))
def test_quantized_files_agree_within_llama_cpp_s_rounding(files, name):
    path = files / f"{name}.gguf"
    assert STORED[name] in {qtype.name for _, qtype in stored_tensors(path).values()}
    ids = prompt(path)
    ours, theirs = our_logits(path, ids), their_logits(path, ids)
    assert np.abs(ours - theirs).max() <= bound(path, ours)


@pytest.mark.parametrize("name", ["llama-q4_0", "wide-q4_k_m"])
def test_the_bound_tells_the_blocks_apart(files, name):
    """The unquantized model (the f32 file) is further from llama.cpp's logits on the 4-bit file
    than the bound: a reader that decoded the blocks wrongly, or not at all, would fail."""
    path, f32 = files / f"{name}.gguf", files / f"{FILES[name][0]}-f32.gguf"
    ids = prompt(path)
    theirs = their_logits(path, ids)
    assert np.abs(our_logits(f32, ids) - theirs).max() > bound(path, theirs)


def their_greedy(path: Path, ids: list[int], n: int) -> list[int]:
    """llama.cpp's greedy continuation: n tokens, each the argmax of the last logits, cached."""
    model = llama(path)
    model.eval(ids)
    new = []
    for _ in range(n):
        new.append(int(np.argmax(model.scores[model.n_tokens - 1])))
        model.eval(new[-1:])
    return new


def assert_greedy_agrees(path: Path, model: torch.nn.Module, ids: list[int], n: int, allowed: float) -> None:
    """n greedy tokens from attnlab's `model` and from llama.cpp on the file `path` (each with its
    own cache) agree token for token until, if ever, a step where attnlab's two best logits are
    closer than twice `allowed` (a tie within llama.cpp's rounding); the number that agree is printed
    (`pytest -s`)."""
    ours = greedy(model, torch.tensor([ids]), n, use_cache=True)[0, len(ids) :].tolist()
    theirs = their_greedy(path, ids, n)
    agree = next((i for i, (a, b) in enumerate(zip(ours, theirs, strict=True)) if a != b), n)
    print(f"{path.name}: {agree} of {n} greedy tokens agree")
    if agree < n:
        with torch.no_grad():
            top2 = np.sort(model(torch.tensor([ids + ours[:agree]]))[0, -1].numpy())[-2:]
        assert top2[1] - top2[0] <= 2 * allowed, f"{path.name}: the continuations part at token {agree}"


@pytest.mark.parametrize("name", list(STORED))
def test_greedy_continuations_agree_until_a_near_tie(files, name):
    """32 greedy tokens, each library's own, agree but for near ties within the bound."""
    path = files / f"{name}.gguf"
    model = load_gguf(path).model
    ids = prompt(path, 8)
    with torch.no_grad():
        logits = model(torch.tensor([ids]))[0].numpy()
    assert_greedy_agrees(path, model, ids, 32, bound(path, logits))


# llama.cpp's Q4_0 file keeps some tensors in Q8_0 and F16, so attnlab decodes it in fp32 (the int4
# step reads files whose matrices are all Q4_0); its Q4_K_M file is all Q4_K and Q6_K.
@pytest.mark.parametrize("name, weights", [("wide-q4_k_m", "q4_k")])
def test_the_fused_step_on_the_files_own_blocks_agrees_with_llama_cpp(files, name, weights):
    """What `attnlab sample FILE` decodes by default: the fused step reading the file's own 4-bit
    blocks (llama.cpp's quantizer's, not requantized), whose products quantize the activations as
    llama.cpp's do. 32 greedy tokens agree with llama.cpp's but for near ties within the bound."""
    from attnlab.accel.fused import extension
    from attnlab.tasks.sources import default_weights, load_checkpoint

    if extension() is None:
        pytest.skip("the fused step could not be built here")
    path = files / f"{name}.gguf"
    loaded = load_checkpoint(path, command="sample")
    assert default_weights(loaded.model, loaded.stored_weights) == weights
    ids = prompt(path, 8)
    ours = greedy(loaded.model, torch.tensor([ids]), 32, fused=True, weights=weights)[0, len(ids) :].tolist()
    theirs = their_greedy(path, ids, 32)
    agree = next((i for i, (a, b) in enumerate(zip(ours, theirs, strict=True)) if a != b), 32)
    print(f"{name} on the {weights} step: {agree} of 32 greedy tokens agree")
    if agree < 32:
        with torch.no_grad():
            logits = loaded.model(torch.tensor([ids + ours[:agree]]))[0].numpy()
        top2 = np.sort(logits[-1])[-2:]
        assert top2[1] - top2[0] <= 2 * bound(path, logits), f"{name}: the continuations part at token {agree}"


# -- files attnlab writes ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Runs of gguf_files.EXPORTED_RUNS, trained on first use."""
    return tiny_runs(tmp_path_factory)


def ggml_gelu(monkeypatch: pytest.MonkeyPatch) -> None:
    """attnlab's GELU (PyTorch's) as ggml's CPU kernel computes it (GGML_GELU_FP16): 0 below −10,
    x above 10, and between them the table of f16 values at the input rounded to f16."""
    gelu = torch.nn.functional.gelu

    def table(x: torch.Tensor, approximate: str = "none") -> torch.Tensor:
        looked_up = gelu(x.half().float(), approximate=approximate).half().float()
        return torch.where(x <= -10, 0.0, torch.where(x >= 10, x, looked_up))

    monkeypatch.setattr(torch.nn.functional, "gelu", table)


@pytest.mark.parametrize("name", ["llama", "gpt2"])
@pytest.mark.parametrize("outtype", OUTTYPES)
def test_an_exported_run_loads_in_llama_cpp(runs, capsys, tmp_path, monkeypatch, name, outtype):
    """`attnlab export RUN --to gguf`: llama.cpp loads the file, tokenizes as the run does, and its
    logits are attnlab's on the same weights (the run itself for f32: to float32 rounding; the
    file's bf16 / Q8_0 weights otherwise: within the bound), with GPT-2's GELU rounded as ggml's
    table rounds it; its greedy tokens are attnlab's but for near ties."""
    from attnlab.train.load import load_run
    from helpers import cli

    path = tmp_path / f"{name}-{outtype}.gguf"
    code, _, err = cli(capsys, "export", runs(name), "--to", "gguf", path, "--outtype", outtype)
    assert code == 0, err
    run = load_run(runs(name))
    for text in ("ROMEO: What light through yonder window breaks?", "Déjà vu — naïve café 3.14159 😀"):
        assert llama(path).tokenize(text.encode(), add_bos=True, special=True) == run.tokenizer.encode(text)
    model = run.model.eval() if outtype == "f32" else load_gguf(path).model
    if name == "gpt2":
        ggml_gelu(monkeypatch)
    ids = prompt(path, RUN_CONTEXT)  # GPT-2's learned positions stop at the run's context
    with torch.no_grad():
        ours = model(torch.tensor([ids]))[0].numpy()
    allowed = 1e-4 if outtype == "f32" else bound(path, ours)
    assert np.abs(ours - their_logits(path, ids)).max() <= allowed
    assert_greedy_agrees(path, model, ids[:4], RUN_CONTEXT - 4, allowed)


def test_an_exported_llama3_model_loads_in_llama_cpp(tmp_path):
    """A Llama with Llama 3.1's scaled RoPE, written by attnlab (the divisors as rope_freqs): llama.cpp's
    logits are the model's to float32 rounding, and so are its greedy tokens."""
    from attnlab.models.hf.gguf_export import write_gguf

    model, tokenizer = llama3_gpt(tmp_path)
    path = tmp_path / "llama3.gguf"
    write_gguf(model, tokenizer, path)
    ids = prompt(path)
    with torch.no_grad():
        ours = model(torch.tensor([ids]))[0].numpy()
    np.testing.assert_allclose(ours, their_logits(path, ids), atol=1e-4, rtol=0)
    assert_greedy_agrees(path, model, ids[:8], 32, 1e-4)
