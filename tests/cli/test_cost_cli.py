"""`attnlab cost`: a real --quick run (fresh processes, real timings and memory readings) gives a
table, cost.json and real PNG pictures of the stated size; bad input is one line and exit code 2."""

import contextlib
import io
import json
import math
import re
from importlib.util import find_spec

import pytest

from attnlab.cli import main
from attnlab.studies.cost import MODELS, QUANTITIES, QUICK_LENGTHS, THEORY, CostSettings, count_steps
from helpers import assert_user_error, cli

pytestmark = pytest.mark.slow

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
needs_matplotlib = pytest.mark.skipif(find_spec("matplotlib") is None, reason="pip install 'attnlab[plot]'")


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    """One `attnlab cost --quick --out DIR` run for the module: (stdout, stderr, DIR)."""
    out = tmp_path_factory.mktemp("cost")
    # capsys is per test; the run is shared by the module, so its output is captured here.
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        code = main(["cost", "--quick", "--threads", "1", "--out", str(out)])
    assert code == 0, stderr.getvalue()
    return stdout.getvalue(), stderr.getvalue(), out


@needs_matplotlib
def test_quick_run_writes_a_table_with_finite_exponents(quick_run):
    out, err, folder = quick_run
    result = json.loads((folder / "cost.json").read_text(encoding="utf-8"))
    assert result["lengths"] == list(QUICK_LENGTHS)
    assert result["fit_lengths"] == list(QUICK_LENGTHS[-2:])
    assert result["threads"] == 1 and result["width"] == 16 and result["layers"] == 1

    # Every case ran: 3 models x 2 kinds x 3 lengths, with a positive time and memory reading.
    cases = {(m["model"], m["kind"], m["length"]) for m in result["measurements"]}
    assert cases == {(m, k, t) for m in MODELS for k in ("train", "generate") for t in QUICK_LENGTHS}
    assert all(m["seconds"] > 0 and m["peak_mib"] > 0 for m in result["measurements"])

    table = {(r["model"], r["quantity"]): r for r in result["table"]}
    assert set(table) == {(m, q) for m in MODELS for q in QUANTITIES}
    for key, row in table.items():
        assert math.isfinite(row["fitted_exponent"]), key
        assert row["theory_exponent"] == THEORY[key].exponent and row["theory"] == THEORY[key].formula
    for c in result["counts"]:
        assert (c["sequential_steps"], c["max_path_length"]) == count_steps(c["model"], c["length"], 1)
    # Counted exactly: the transformer's steps do not grow with t, the RNN's grow like t.
    assert table[("transformer", "sequential_steps")]["fitted_exponent"] == pytest.approx(0.0, abs=1e-9)
    assert table[("rnn", "max_path_length")]["fitted_exponent"] > 0.9

    lines = out.splitlines()
    assert lines[0].startswith("attnlab cost on cpu") and "1 thread," in lines[0]
    for quantity in ("training step time", "generation memory", "sequential steps", "max path length"):
        row = next(line for line in lines if line.startswith(quantity))
        assert not re.search(r"\s-(\s|$)", row), row  # "-" marks a missing fit
    assert "t²·k·d" in out and "t²·k²·d" in out
    # Progress: one line per case on stderr (not a terminal), then the pictures written.
    assert sum(line.startswith("cost: ") and " t=" in line for line in err.splitlines()) == 18
    assert "cost_time.png" in err


@needs_matplotlib
def test_quick_run_pictures_are_real_pngs_of_the_stated_size(quick_run):
    from matplotlib.image import imread

    from attnlab.viz.cost import PLOTS, nominal_size

    _, _, folder = quick_run
    for name, quantities in PLOTS.items():
        path = folder / name
        assert path.read_bytes()[:8] == PNG_SIGNATURE
        pixels = imread(path)  # decodes the whole file: a real image, not just a header
        height, width = pixels.shape[:2]
        expected_w, expected_h = nominal_size(len(quantities))
        # The tight bounding box trims or pads the margins by a few percent at most.
        assert abs(width - expected_w) <= 0.1 * expected_w, (name, width, expected_w)
        assert abs(height - expected_h) <= 0.1 * expected_h, (name, height, expected_h)
        assert pixels.std() > 0.05  # something is drawn


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--lengths", "64,32"], "strictly increasing"),
        (["--lengths", "64,64"], "strictly increasing"),
        (["--lengths", "0,64"], ">= 2"),
        (["--lengths=-8,64"], ">= 2"),
        (["--lengths", "64"], "at least two"),
        (["--lengths", "a,b"], "integers separated by commas"),
        (["--width", "30", "--heads", "4"], "divisible by heads"),
        (["--width", "0"], ">= 1"),
        (["--quick", "--fit-from", "64"], "fewer than two"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(capsys, args, fragment):
    assert_user_error(cli(capsys, "cost", *args), fragment)


def test_out_that_is_a_file_fails_before_measuring(capsys, tmp_path):
    taken = tmp_path / "taken"
    taken.write_text("x", encoding="utf-8")
    assert_user_error(cli(capsys, "cost", "--quick", "--out", taken), "is a file")


def test_json_prints_the_same_object_it_writes(capsys, tmp_path):
    code, out, err = cli(
        capsys, "cost", "--lengths", "8,16", "--width", "8", "--layers", "1", "--heads", "2", "--repeats", "1",
        "--json", "--out", tmp_path,
    )  # fmt: skip
    assert code == 0, err
    printed = json.loads(out)
    assert printed == json.loads((tmp_path / "cost.json").read_text(encoding="utf-8"))
    assert printed["lengths"] == [8, 16] and printed["heads"] == 2 and printed["passes"] == 1
    assert len(printed["measurements"]) == 12 and len(printed["table"]) == 18


@pytest.fixture(scope="module")
def attention_run(tmp_path_factory):
    """`attnlab cost --quick --attention window,bigbird --json --out DIR`: (printed JSON, stderr, DIR)."""
    out = tmp_path_factory.mktemp("cost-attention")
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        code = main(["cost", "--quick", "--attention", "window,bigbird", "--threads", "1", "--json", "--out", str(out)])
    assert code == 0, stderr.getvalue()
    return json.loads(stdout.getvalue()), stderr.getvalue(), out


@needs_matplotlib
def test_attention_adds_the_pattern_transformers_to_a_quick_run(attention_run):
    result, err, folder = attention_run
    models = [*MODELS, "transformer-window", "transformer-bigbird"]
    assert result["models"] == models
    # --quick narrows the patterns below its lengths (8, 16, 32), so that they leave keys out.
    assert (result["attention_window"], result["attention_block"]) == (8, 4)
    cases = {(m["model"], m["kind"], m["length"]) for m in result["measurements"]}
    assert cases == {(m, k, t) for m in models for k in ("train", "generate") for t in QUICK_LENGTHS}
    assert all(m["seconds"] > 0 and m["peak_mib"] > 0 for m in result["measurements"])
    assert sum(line.startswith("cost: ") and " t=" in line for line in err.splitlines()) == 30

    table = {(r["model"], r["quantity"]): r for r in result["table"]}
    assert set(table) == {(m, q) for m in models for q in QUANTITIES}
    settings = CostSettings(layers=1, attention_window=8, attention_block=4)
    for c in result["counts"]:
        assert (c["sequential_steps"], c["max_path_length"]) == count_steps(c["model"], c["length"], 1, settings)
    # One layer of an 8-key window connects t = 8 but not 16 or 32: the fitted path is infinite.
    window = {c["length"]: c["max_path_length"] for c in result["counts"] if c["model"] == "transformer-window"}
    assert window == {8: 1, 16: None, 32: None}
    assert table[("transformer-window", "max_path_length")]["fitted_exponent"] is None
    for model in ("transformer-window", "transformer-bigbird"):
        for quantity in ("train_time", "train_memory", "generate_time", "generate_memory", "sequential_steps"):
            assert math.isfinite(table[(model, quantity)]["fitted_exponent"]), (model, quantity)
    for name in ("cost_time.png", "cost_memory.png", "cost_generate.png"):
        assert (folder / name).read_bytes()[:8] == PNG_SIGNATURE


@pytest.mark.parametrize(
    ("value", "fragment"),
    [("lstm", "attention must be among window, bigbird, got 'lstm'"), ("window,linformer", "no causal model")],
)
def test_a_bad_attention_pattern_is_one_line_naming_the_choices(capsys, value, fragment):
    assert_user_error(cli(capsys, "cost", "--quick", "--attention", value), fragment)


def test_cost_help_says_fastest_of_as_the_output_does(capsys):
    code, out, _ = cli(capsys, "cost", "--help")
    text = " ".join(out.split())
    assert code == 0 and "the fastest of them" in text and "median" not in text
