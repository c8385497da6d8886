"""`attnlab attention`, `positions`, `plot` and `report` as a user runs them, on tiny real runs."""

import html
import json
import re

import numpy as np
import pytest

from attnlab.viz.figure import png_size
from helpers import assert_user_error, cli, read_page, shared

pytestmark = pytest.mark.slow

pytest.importorskip("matplotlib")

GERMAN = "Ein Mann schläft."


@pytest.fixture(scope="module")
def lm_run(tmp_path_factory):
    return shared(tmp_path_factory, "lm")


@pytest.fixture(scope="module")
def mt_run(tmp_path_factory):
    return shared(tmp_path_factory, "mt-transformer")


def printed_size(out: str) -> tuple[int, int]:
    width, height = re.search(r"(\d+) x (\d+) px", out).groups()
    return int(width), int(height)


def test_attention_png_is_a_real_image_of_the_printed_size(lm_run, capsys, tmp_path):
    import matplotlib.image

    path = tmp_path / "heads.png"
    code, out, err = cli(capsys, "attention", lm_run, "--text", "ROMEO: Peace!", "--layer", "0", "--out", path)
    assert code == 0, err
    assert "causal self-attention (layer 0, 2 heads" in out
    assert png_size(path) == printed_size(out)
    assert matplotlib.image.imread(path).shape[:2] == printed_size(out)[::-1]


def test_attention_html_and_json(lm_run, capsys, tmp_path):
    path = tmp_path / "attention.html"
    code, out, _ = cli(capsys, "attention", lm_run, "--text", "ROMEO:", "--out", path, "--json")
    assert code == 0
    summary = json.loads(out)
    assert summary["layers"] == 2 and summary["heads"] == 2 and summary["query_tokens"] == list("ROMEO:")
    page = read_page(path)
    layers = json.loads(page.json_scripts["attention-data"])["layers"]
    assert np.array(layers).shape == (2, 2, 6, 6)


def test_translation_attention_prints_the_translation(mt_run, capsys, tmp_path):
    code, out, _ = cli(capsys, "attention", mt_run, "--text", GERMAN, "--beam", "1", "--out", tmp_path / "a.png")
    assert code == 0
    translation, saved = out.splitlines()
    assert saved.startswith("decoder cross-attention (layer 1, 2 heads")
    translated = cli(capsys, "translate", mt_run, GERMAN, "--beam", "1")[1].strip()
    assert translation == translated
    code, out, _ = cli(capsys, "attention", mt_run, "--text", GERMAN, "--kind", "self", "--out", tmp_path / "s.png")
    assert code == 0 and out.startswith("encoder self-attention (layer 0, 2 heads")


def test_attention_errors(lm_run, capsys, tmp_path):
    base = ("attention", lm_run, "--text", "ROMEO:")
    assert_user_error(cli(capsys, *base, "--layer", "2", "--out", tmp_path / "a.png"), "--layer 2", "0 to 1")
    assert_user_error(cli(capsys, *base, "--head", "9", "--out", tmp_path / "a.html"), "--head 9", "0 to 1")
    assert_user_error(cli(capsys, *base, "--out", tmp_path / "a.jpg"), ".png or .html")
    assert_user_error(cli(capsys, *base, "--out", tmp_path / "no" / "a.png"), "not an existing folder")
    assert_user_error(cli(capsys, "attention", lm_run, "--text", "", "--out", tmp_path / "a.png"), "empty")
    assert_user_error(cli(capsys, "attention", tmp_path / "none", "--text", "x", "--out", tmp_path / "a.png"), "none")
    assert list(tmp_path.iterdir()) == []


def test_positions(capsys, tmp_path):
    path = tmp_path / "pe.png"
    code, out, _ = cli(capsys, "positions", "--d-model", "32", "--n", "20", "--out", path)
    assert code == 0 and "(20 x 32)" in out
    assert png_size(path) == printed_size(out) == (1650, 630)
    assert_user_error(cli(capsys, "positions", "--d-model", "1", "--out", path), "--d-model")


def test_plot(lm_run, capsys, tmp_path):
    path = tmp_path / "curves.png"
    code, out, _ = cli(capsys, "plot", lm_run, "--out", path)
    assert code == 0 and out.startswith("loss, learning rate, throughput (tokens / s) saved to")
    assert png_size(path) == printed_size(out)
    assert_user_error(cli(capsys, "plot", tmp_path / "missing"), "does not exist")


def test_report_of_a_language_model(lm_run, capsys, tmp_path):
    path = tmp_path / "report.html"
    code, out, err = cli(capsys, "report", lm_run, "--out", path)
    assert code == 0 and err == ""
    assert "(Run, Configuration, Training curves, Sample, Attention)" in out
    text = path.read_text(encoding="utf-8")
    page = read_page(path)
    assert f"<pre>{html.escape((lm_run / 'config.toml').read_text(encoding='utf-8'))}</pre>" in text
    assert text.count('src="data:image/png;base64,') == 1
    data = json.loads(page.json_scripts["attention-data"])
    assert data["causal"] and len(data["layers"]) == 2
    sample = cli(capsys, "sample", lm_run, "--max-new-tokens", "300", "--seed", "1337")[1]
    assert f"<pre>{html.escape(sample.removesuffix(chr(10)))}</pre>" in text  # the command the page names


def test_report_of_a_translation_model(mt_run, capsys, tmp_path):
    from attnlab.data.parallel import load_multi30k
    from attnlab.train.config import read_config

    path = tmp_path / "report.html"
    code, out, _ = cli(capsys, "report", mt_run, "--out", path, "--examples", "2")
    assert code == 0 and "Translations" in out
    text = path.read_text(encoding="utf-8")
    page = read_page(path)
    config = read_config(mt_run)
    pairs = load_multi30k(config.data.data_dir, "val", "de", "en").pairs[:2]
    for source, reference in pairs:  # each source beside its reference, in a table row
        assert f"<td>{html.escape(source)}</td><td>{html.escape(reference)}</td>" in text
    data = json.loads(page.json_scripts["attention-data"])
    assert data["kind"] == "decoder cross-attention" and data["text"] == pairs[0][0]


def test_report_of_a_model_without_attention_says_so(tmp_path_factory, capsys, tmp_path):
    run_dir = shared(tmp_path_factory, "sst2-bilstm")
    path = tmp_path / "report.html"
    code, out, err = cli(capsys, "report", run_dir, "--out", path)
    assert code == 0 and "has no attention to show" in err
    text = path.read_text(encoding="utf-8")
    read_page(path)
    assert "<th>accuracy</th>" in text and "Not shown: this run&#x27;s model (BiLSTM) has no attention" in text
