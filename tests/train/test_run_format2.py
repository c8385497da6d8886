"""Run folders written before issue 45's renames (tests/fixtures/run-format2/: one per model family,
attnlab as of 2026-11-27) still load to the logits they gave, resume, and export. What they hold and
how the logits are read: tests/run_format.py; how they were made: tests/fixtures/make_run_format2.py."""

import csv
import re
import shutil

import pytest
import torch
from safetensors.torch import load_file

import attnlab
from helpers import FIXTURES, cli
from run_format import FOLDER, INPUTS, LOGITS, PROBES, kept_values
from tolerance import assert_float32_close

pytestmark = pytest.mark.slow

FAMILIES = sorted(PROBES)


def test_every_family_has_its_fixture():
    assert sorted(p.name for p in FOLDER.iterdir() if p.is_dir()) == FAMILIES


@pytest.mark.parametrize("family", FAMILIES)
def test_a_run_folder_of_each_family_loads_to_the_logits_it_gave(family):
    """The weights, the config and the tokenizer as saved, read by today's loader: the model's
    logits on the saved inputs are the ones it gave when it was written (up to float32 rounding of
    another CPU's summation order: 20 chained sums of at most 1,024 terms bound these small models)."""
    run = attnlab.load(FOLDER / family)
    names, logits = PROBES[family]
    inputs = load_file(FOLDER / family / INPUTS)
    assert sorted(inputs) == sorted(names)
    with torch.no_grad():
        got = kept_values(logits(run.model, inputs))
    assert_float32_close(got, load_file(FOLDER / family / LOGITS)["logits"], reduction=1024, depth=20)


@pytest.mark.parametrize("family, data", [("gpt", None), ("gat", "planetoid"), ("bert-classification", "sst2")])
def test_an_old_run_folder_resumes(family, data, tmp_path, capsys):
    """`attnlab train RUN --resume` continues an old run folder for another step. The folder names
    its data by the path it had on the machine that wrote it, as a user's moved run folder would:
    the copy here names the repository's fixture slice instead."""
    run = tmp_path / family
    shutil.copytree(FOLDER / family, run)
    if data:
        config = run / "config.toml"
        text = re.sub(r'data_dir = ".*"', f'data_dir = "{(FIXTURES / data).as_posix()}"', config.read_text())
        config.write_text(text)
    settings = ["--set", "train.max_iters=3", "--set", "train.fused_kernels=false"]  # no build where none is
    code, out, err = cli(capsys, "train", str(run), "--resume", *settings)
    assert code == 0, err
    assert _steps(run)[-1] == 3


def _steps(run) -> list[int]:
    with open(run / "metrics.csv", newline="") as f:
        return [int(row["step"]) for row in csv.DictReader(f)]


def test_an_old_gpt_run_exports_to_transformers_with_its_logits(tmp_path, capsys):
    transformers = pytest.importorskip("transformers")
    out = tmp_path / "hf"
    code, _, err = cli(capsys, "export", str(FOLDER / "gpt"), str(out), "--to", "hf")
    assert code == 0, err
    model = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    x = load_file(FOLDER / "gpt" / INPUTS)["x"]
    with torch.no_grad():
        got = kept_values(model(x).logits)
    assert_float32_close(got, load_file(FOLDER / "gpt" / LOGITS)["logits"], reduction=1024, depth=20)
