"""`attnlab bench`: the structure of its results in --quick mode on CPU, numbers recomputed from
their definitions (no timing assertions: this machine's speed is not under test)."""

import contextlib
import io
import json
import sys
import warnings

import pytest
import torch

from attnlab.cli import main
from attnlab.models import GPT, GPTConfig
from attnlab.studies.bench import attention_memory_case, cpu_attention_memory
from attnlab.studies.bench import run as bench_run
from attnlab.studies.bench.cases import GenerateCase, TrainCase
from helpers import assert_user_error, cli

pytestmark = pytest.mark.slow

QUICK_LENGTHS = [64, 128, 256]
TOP_KEYS = {
    "date",
    "device",
    "machine",
    "torch",
    "matmul_peak_flops",
    "memory_bandwidth",
    "quick",
    "compiled",
    "fused",
    "repeats",
    "train",
    "generate",
    "attention_memory",
}
TRAIN_KEYS = {
    "case",
    "shape",
    "block",
    "batch",
    "attnlab_tokens_per_sec",
    "transformers_tokens_per_sec",
    "ratio",
    "attnlab_mfu",
    "transformers_mfu",
}
GENERATE_KEYS = {
    "shape",
    "batch",
    "new_tokens",
    "attnlab_tokens_per_sec",
    "transformers_tokens_per_sec",
    "ratio",
    "weight_bytes",
    "bound_tokens_per_sec",
    "attnlab_of_bound",
    "transformers_of_bound",
}
MEMORY_KEYS = {"path", "seq_len", "peak_mib", "growth_per_doubling"}


def model_flops_per_token(shape: str, block: int) -> float:
    """6N + 12·L·T·C, N the parameters of an attnlab GPT of that shape without position embeddings."""
    n_layers, n_heads, d_model = (int(x) for x in shape.split("x"))
    config = GPTConfig(
        vocab_size=65, block_size=block, n_layers=n_layers, n_heads=n_heads, d_model=d_model, activation="gelu_tanh"
    )
    n = GPT(config).num_parameters()
    return 6 * n + 12 * n_layers * block * d_model


@pytest.fixture(scope="module")
def quick_bench(tmp_path_factory):
    """One `attnlab bench --quick` with its defaults, shared by the tests that read its table, its
    JSON file and its progress (each run takes a while): (exit code, stdout, stderr, the --out
    file's object, calls of the kernels' block, warnings)."""
    pytest.importorskip("transformers")
    from attnlab.accel import kernels

    out_file = tmp_path_factory.mktemp("bench") / "bench.json"
    calls = []
    apply = kernels._PreNormBlock.apply
    out, err = io.StringIO(), io.StringIO()
    with (
        pytest.MonkeyPatch.context() as patch,
        warnings.catch_warnings(record=True) as caught,
        contextlib.redirect_stdout(out),
        contextlib.redirect_stderr(err),
    ):
        warnings.simplefilter("always")
        patch.setattr(kernels._PreNormBlock, "apply", lambda *a: calls.append(1) or apply(*a))
        code = main(["bench", "--quick", "--device", "cpu", "--out", str(out_file)])
    return code, out.getvalue(), err.getvalue(), out_file, calls, caught


def test_quick_json_has_every_field_and_consistent_numbers(quick_bench):
    code, _, err, out_file, _, _ = quick_bench
    assert code == 0, err
    result = json.loads(out_file.read_text(encoding="utf-8"))
    assert TOP_KEYS <= result.keys()
    assert result["device"] == "cpu" and result["quick"] is True and result["repeats"] >= 1
    # The defaults' paths: attnlab's C++ kernels exactly where they are built (make builds them).
    from attnlab.accel import fused, kernels

    assert result["compiled"] is False and result["fused"] is (kernels.is_built() and fused.is_built())
    assert result["torch"] == torch.__version__
    peak = result["matmul_peak_flops"]
    assert peak > 0

    assert [r["shape"] for r in result["train"]] == ["4x4x128", "6x6x384"]
    for row in result["train"]:
        assert TRAIN_KEYS <= row.keys()
        ours, theirs = row["attnlab_tokens_per_sec"], row["transformers_tokens_per_sec"]
        assert ours > 0 and theirs > 0
        assert row["ratio"] == pytest.approx(ours / theirs, rel=1e-9)
        fpt = model_flops_per_token(row["shape"], row["block"])
        assert row["attnlab_mfu"] == pytest.approx(ours * fpt / peak, rel=1e-9)
        assert row["transformers_mfu"] == pytest.approx(theirs * fpt / peak, rel=1e-9)

    assert [(r["shape"], r["batch"]) for r in result["generate"]] == [("6x6x384", 1), ("6x6x384", 8), ("4x4x128", 1)]
    for row in result["generate"]:
        assert GENERATE_KEYS <= row.keys()
        assert row["new_tokens"] > 0
        ours, theirs = row["attnlab_tokens_per_sec"], row["transformers_tokens_per_sec"]
        assert ours > 0 and theirs > 0
        assert row["ratio"] == pytest.approx(ours / theirs, rel=1e-9)
        # The roofline recomputed: fp32 weights without position embeddings, read once per step.
        n_layers, _, d_model = (int(x) for x in row["shape"].split("x"))
        # token table (tied head), per block 12C² weights + 13C biases and LayerNorm, the final LayerNorm
        weights = 65 * d_model + n_layers * (12 * d_model**2 + 13 * d_model) + 2 * d_model
        assert row["weight_bytes"] == 4 * weights
        bound = row["batch"] * result["memory_bandwidth"] / row["weight_bytes"]
        assert row["bound_tokens_per_sec"] == pytest.approx(bound, rel=1e-9)
        assert row["attnlab_of_bound"] == pytest.approx(ours / bound, rel=1e-9)
        assert row["transformers_of_bound"] == pytest.approx(theirs / bound, rel=1e-9)

    memory = result["attention_memory"]
    assert all(MEMORY_KEYS <= row.keys() for row in memory)
    for path in ("explicit", "fused"):
        rows = [r for r in memory if r["path"] == path]
        assert [r["seq_len"] for r in rows] == QUICK_LENGTHS
        assert all(r["peak_mib"] >= 0 for r in rows)
        assert rows[0]["growth_per_doubling"] is None
        for previous, row in zip(rows, rows[1:], strict=False):
            if previous["peak_mib"] > 0:
                assert row["growth_per_doubling"] == pytest.approx(row["peak_mib"] / previous["peak_mib"])
    explicit_longest = next(r for r in memory if r["path"] == "explicit" and r["seq_len"] == QUICK_LENGTHS[-1])
    weights_mib = 1 * 4 * QUICK_LENGTHS[-1] ** 2 * 4 / 2**20  # one (B, H, T, T) fp32 weights matrix
    assert explicit_longest["peak_mib"] > weights_mib


def test_quick_table_prints_the_header_and_one_line_per_case(quick_bench):
    code, out, err, *_ = quick_bench
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].startswith("attnlab bench on cpu") and "torch" in lines[0] and "matmul peak" in lines[0]
    assert "GFLOP/s" in lines[0] and "GB/s" in lines[0]
    cases = ["train 4x4x128", "train 6x6x384", "generate 6x6x384 batch 1,", "generate 6x6x384 batch 8,"]
    cases += ["generate 4x4x128 batch 1,"] + [f"T={t}" for t in QUICK_LENGTHS]
    for case in cases:
        assert sum(line.startswith(case) or f" {case}" in line for line in lines) == 1, (case, out)
    assert "transformers not installed" not in out
    assert "bench: train 4x4x128" in err  # progress on stderr, one line per case


@pytest.mark.parametrize("before, after, as_json", [(1e9, 3e9, True), (3e9, 1e9, False)])
def test_without_transformers_attnlab_columns_run_and_the_peak_is_the_better_of_before_and_after(
    capsys, monkeypatch, tmp_path, before, after, as_json
):
    """Without transformers the attnlab columns still run (the peer's are None, the table says so
    once); the matmul peak is measured before the training cases and after them, and the better
    one is kept; --json prints the object --out writes."""
    monkeypatch.setitem(sys.modules, "transformers", None)  # `import transformers` raises ImportError
    # One small case of each kind: what is under test is the columns and the peak, not the shapes.
    monkeypatch.setattr(bench_run, "train_cases", lambda device, quick: [TrainCase("4x4x128", 32, 2)])
    monkeypatch.setattr(bench_run, "generate_cases", lambda quick: [GenerateCase("4x4x128", 1, 4)])
    monkeypatch.setattr(bench_run, "attention_lengths", lambda quick: (64,))  # (a process per length and path)
    peaks = iter([before, after])
    monkeypatch.setattr(bench_run, "matmul_peak_flops", lambda device, quick=False: (next(peaks), "float32"))
    out_file = tmp_path / "bench.json"
    code, out, err = cli(capsys, "bench", "--quick", "--device", "cpu", "--out", out_file, *["--json"] * as_json)
    assert code == 0, err
    assert next(peaks, None) is None  # measured twice
    result = json.loads(out_file.read_text(encoding="utf-8"))
    if as_json:
        assert json.loads(out) == result
    else:
        assert out.count("transformers not installed") == 1
    assert result["matmul_peak_flops"] == 3e9
    for row in result["train"]:
        assert row["attnlab_tokens_per_sec"] > 0 and row["transformers_tokens_per_sec"] is None
        assert row["ratio"] is None and row["transformers_mfu"] is None
        assert row["attnlab_mfu"] == pytest.approx(row["attnlab_tokens_per_sec"] * row["flops_per_token"] / 3e9)
    for row in result["generate"]:
        assert row["attnlab_tokens_per_sec"] > 0
        assert row["transformers_tokens_per_sec"] is None and row["ratio"] is None
    assert {r["path"] for r in result["attention_memory"]} == {"explicit", "fused"}
    assert f"matmul peak after the training cases: {after / 1e9:.1f} GFLOP/s (kept: 3.0 GFLOP/s)" in err


def test_repeats_must_be_at_least_one(capsys):
    assert_user_error(cli(capsys, "bench", "--quick", "--device", "cpu", "--repeats", "0"), "--repeats", ">= 1")


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA GPU")
def test_cuda_without_a_gpu_is_a_user_error(capsys):
    assert_user_error(cli(capsys, "bench", "--quick", "--device", "cuda"), "--device cpu")


def test_out_into_a_missing_folder_fails_before_measuring(capsys, tmp_path):
    result = cli(capsys, "bench", "--quick", "--device", "cpu", "--out", tmp_path / "missing" / "bench.json")
    assert_user_error(result, "does not exist")


def test_explicit_attention_holds_at_least_one_weights_matrix_at_2048():
    # One fresh process (the peak is per process): (1, 4, 2048, 2048) fp32 is 64 MiB, and the
    # explicit path keeps the softmax weights for backward, besides scores and their gradients.
    assert cpu_attention_memory("explicit", 2048) >= 64


def test_an_unknown_attention_path_is_refused():
    with pytest.raises(ValueError, match="explicit"):
        attention_memory_case("flash", 8)


def test_quick_fused_trains_with_the_kernels_and_decodes_with_the_fused_step(quick_bench):
    """Where the kernels are built (make builds them), bench's defaults take them: the training
    rows through attnlab's kernels, the decoding rows through the fused step, no fallback."""
    from attnlab.accel import fused, kernels

    if not (kernels.is_built() and fused.is_built()):
        pytest.skip("the C++ kernels are not built here (attnlab kernels build)")
    code, _, err, out_file, calls, caught = quick_bench
    assert code == 0, err
    result = json.loads(out_file.read_text(encoding="utf-8"))
    assert not [w for w in caught if "decoding eagerly" in str(w.message)]  # no fallback to the model
    assert result["fused"] is True and result["compiled"] is False
    assert all(row["attnlab_tokens_per_sec"] > 0 for row in result["generate"] + result["train"])
    if kernels.extension() is not None:
        assert calls  # the training rows ran attnlab's blocks through the kernels


def test_fused_is_a_cpu_step_and_not_with_compile(capsys):
    code, _, err = cli(capsys, "bench", "--quick", "--device", "cpu", "--fused", "--compile")
    assert code == 2 and "pick one" in err


def test_quick_help_says_how_long_it_takes(capsys):
    code, out, _ = cli(capsys, "bench", "--help")
    quick = " ".join(out.partition("\n  --quick")[2].partition("\n  --compile")[0].split())
    assert code == 0 and "minute" in quick and "in seconds" not in quick
