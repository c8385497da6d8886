"""`attnlab scale`: the power-law fits on synthetic data, the compute frontier, and a tiny real
ladder end to end."""

import contextlib
import csv
import io
import json
import math
from pathlib import Path

import numpy as np
import pytest

from attnlab.cli import main
from attnlab.data.text import bundled_shakespeare
from attnlab.errors import UserError
from attnlab.studies.scaling import (
    KAPLAN_ALPHA_N,
    better_fit,
    compute_frontier,
    fit_power_law,
    fit_power_law_with_offset,
    kaplan_learning_rate,
    parse_sizes,
    plan,
)
from attnlab.train.config import read_config
from helpers import assert_user_error, cli

pytestmark = pytest.mark.slow

N = np.geomspace(1e4, 3e6, 7)


def test_the_plain_law_recovers_alpha_and_n_c():
    loss = (2e12 / N) ** 0.09
    fit = fit_power_law(N, loss)
    assert fit.alpha == pytest.approx(0.09, rel=1e-10)
    assert fit.n_c == pytest.approx(2e12, rel=1e-8)
    assert fit.e == 0 and fit.ssr < 1e-25
    np.testing.assert_allclose(fit.predict(N), loss, rtol=1e-12)


def test_the_law_with_an_irreducible_loss_recovers_e_alpha_and_n_c():
    loss = 1.2 + (5e6 / N) ** 0.3
    fit = fit_power_law_with_offset(N, loss)
    assert fit.e == pytest.approx(1.2, rel=1e-7)
    assert fit.alpha == pytest.approx(0.3, rel=1e-7)
    assert fit.n_c == pytest.approx(5e6, rel=1e-6)
    plain = fit_power_law(N, loss)
    assert plain.ssr > 1e-3  # a straight line in log-log cannot bend to E
    assert better_fit([plain, fit]) is fit


def test_the_extra_number_must_pay_for_itself():
    """On a pure power law with a little noise, E would only fit the noise: the residual standard
    error (SSR / (n - p)) keeps the two-number law, though the three-number one has the smaller SSR."""
    noise = np.exp(0.002 * np.array([1.0, -1.0, 0.5, 1.0, -0.5, -1.0, 0.3]))
    loss = (2e12 / N) ** 0.09 * noise
    plain, offset = fit_power_law(N, loss), fit_power_law_with_offset(N, loss)
    assert offset.ssr <= plain.ssr
    assert better_fit([plain, offset]) is plain
    assert plain.alpha == pytest.approx(0.09, rel=0.02)


def test_frontier_picks_the_lower_curve_at_each_compute():
    """Two sizes' curves cross at log10 C = 1.625 (a line in log C each, by construction)."""
    curves = {
        "small": (100, [(1.0, 3.0), (10.0, 2.0), (100.0, 1.5)]),
        "large": (1000, [(10.0, 2.5), (100.0, 1.2), (1000.0, 1.0)]),
    }
    points = compute_frontier(curves, budgets=13)
    assert points and all(10.0 <= p.compute <= 100.0 and p.sizes_compared == 2 for p in points)
    for p in points:
        assert p.size == ("small" if math.log10(p.compute) < 1.625 else "large")
        small = float(np.interp(math.log(p.compute), np.log([1.0, 10.0, 100.0]), [3.0, 2.0, 1.5]))
        large = float(np.interp(math.log(p.compute), np.log([10.0, 100.0, 1000.0]), [2.5, 1.2, 1.0]))
        assert p.loss == pytest.approx(min(small, large))
    assert {p.size for p in points} == {"small", "large"}


@pytest.mark.parametrize(
    "sizes, fragment",
    [
        ("1x16,2x32,2x48", "at least 4 sizes"),
        ("1x16,2x32,2x48,2x32", "repeat"),
        ("1x16,2x30,2x48,3x64", "multiple of 16"),
        ("1x16,2by32,2x48,3x64", "is not LAYERSxWIDTH"),
    ],
)
def test_bad_ladders_are_one_line_and_write_nothing(tmp_path, capsys, sizes, fragment):
    assert_user_error(cli(capsys, "scale", "--sizes", sizes, "--out", tmp_path / "out"), fragment)
    assert not (tmp_path / "out").exists()


def test_the_ladder_owns_sizes_and_steps(tmp_path, capsys):
    result = cli(capsys, "scale", "--set", "model.n_layers=3", "--out", tmp_path / "out")
    assert_user_error(result, "the ladder sets model.n_layers", "--sizes")
    assert_user_error(cli(capsys, "scale", "--data", tmp_path / "none.txt", "--out", tmp_path / "out"), "none.txt")
    assert not (tmp_path / "out").exists()


def test_the_help_states_the_librarys_defaults(capsys):
    from attnlab.studies.scaling import DEFAULT_SIZES, DEFAULT_TOKENS

    code, out, _ = cli(capsys, "scale", "--help")
    text = " ".join(out.split())
    assert code == 0 and f"default {DEFAULT_TOKENS:,})" in text
    assert f"from {DEFAULT_SIZES[0]} to {DEFAULT_SIZES[-1]}" in text and f"default: {len(DEFAULT_SIZES)} sizes" in text


def test_each_size_learns_at_kaplans_rate_unless_one_is_set(tmp_path):
    sizes = parse_sizes("1x16,2x32,2x48,3x64")
    runs = plan(sizes, 10_000, tmp_path)
    rates = [r.config.train.learning_rate for r in runs]
    assert rates == sorted(rates, reverse=True)  # bigger models learn slower (Kaplan Eq. D.1)
    assert kaplan_learning_rate(10**6) == pytest.approx(0.003239 - 0.0001395 * math.log(10**6))
    assert all(r.config.train.min_lr == pytest.approx(r.config.train.learning_rate / 10) for r in runs)
    fixed = plan(sizes, 10_000, tmp_path, overrides={"train.learning_rate": 1e-3})
    assert {r.config.train.learning_rate for r in fixed} == {1e-3}
    with pytest.raises(UserError, match="--tokens"):
        plan(sizes, 0, tmp_path)


SIZES = "1x16,1x32,2x32,2x48,3x48,3x64"  # 3.1k to 148k non-embedding parameters: 47x


@pytest.fixture(scope="module")
def ladder(tmp_path_factory) -> tuple[Path, str, list[str]]:
    folder = tmp_path_factory.mktemp("scale")
    corpus = folder / "corpus.txt"
    corpus.write_text(bundled_shakespeare()[:20_000], encoding="utf-8")
    out = folder / "out"
    args = ["scale", "--data", str(corpus), "--sizes", SIZES, "--tokens", "1600", "--out", str(out)]
    for kv in ("model.block_size=16", "train.batch_size=4", "train.eval_iters=2", "train.device=cpu"):
        args += ["--set", kv]
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        assert main(args) == 0, stderr.getvalue()
    return out, stdout.getvalue(), args


def test_a_tiny_ladder_end_to_end(ladder, capsys):
    out, stdout, _ = ladder
    with open(out / "scale.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [r["size"] for r in rows] == SIZES.split(",")
    n = [int(r["non_embedding_params"]) for r in rows]
    assert n == sorted(n) and n[-1] / n[0] >= 30
    assert {r["tokens"] for r in rows} == {"1600"}  # 25 steps of 4 x 16 tokens, every size
    for r, size in zip(rows, SIZES.split(","), strict=True):
        m = read_config(out / size).model
        assert (m.n_layers, m.d_model, m.n_heads) == (int(r["n_layers"]), int(r["d_model"]), m.d_model // 16)
        assert float(r["tokens_per_param"]) == pytest.approx(1600 / int(r["non_embedding_params"]), rel=1e-5)
        # The counted FLOPs: 6 per non-embedding weight and token, plus the output layer's and the scores'.
        c, t, v = m.d_model, m.block_size, m.vocab_size
        matmul = int(r["non_embedding_params"]) - m.n_layers * 2 * c - c  # less the LayerNorm weights
        assert float(r["flops_per_token"]) == pytest.approx(6 * (matmul + v * c) + 12 * m.n_layers * t * c, rel=1e-5)
        # The val loss is the whole validation split's, as `attnlab eval` measures it.
        code, text, err = cli(capsys, "eval", out / size, "--json")
        assert code == 0, err
        assert float(r["val_loss"]) == pytest.approx(json.loads(text)["val_loss"], rel=1e-5)

    fit = json.loads((out / "scale_fit.json").read_text())
    laws = {f["law"]: f for f in fit["fits"]}
    assert set(laws) == {"L = (N_c/N)^alpha", "L = E + (N_c/N)^alpha"}
    chosen = laws[fit["chosen"]]
    assert chosen["rse"] == min(f["rse"] for f in laws.values())
    points = fit["points"]
    assert [p["n"] for p in points] == n
    assert [p["val_loss"] for p in points] == pytest.approx([float(r["val_loss"]) for r in rows], rel=1e-5)
    plain = fit_power_law([p["n"] for p in points], [p["val_loss"] for p in points])
    assert laws["L = (N_c/N)^alpha"]["alpha"] == pytest.approx(plain.alpha, rel=1e-12)
    assert fit["kaplan_alpha_n"] == KAPLAN_ALPHA_N and f"alpha_N = {KAPLAN_ALPHA_N}" in stdout
    assert fit["frontier"] and all(p["size"] in SIZES.split(",") for p in fit["frontier"])
    compute = [p["compute"] for p in fit["frontier"]]
    assert compute == sorted(compute)
    assert "tokens per size" in stdout and "per parameter" in stdout
    assert (out / "scale.png").read_bytes().startswith(b"\x89PNG")


def test_a_finished_ladder_is_not_trained_again(ladder, capsys):
    out, _, args = ladder
    weights = {p: p.stat().st_mtime_ns for p in out.rglob("model.safetensors")}
    code, _, err = cli(capsys, *args)
    assert code == 0, err
    assert "6 of 6 runs finished already; 0 to train" in err
    assert {p: p.stat().st_mtime_ns for p in out.rglob("model.safetensors")} == weights
