"""`attnlab ablate`: the spec and its refusals, a real tiny ablation end to end, counted FLOPs
against a hand count, resuming, and the shipped specs' variants."""

import contextlib
import csv
import dataclasses
import io
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from attnlab.checkpoints import latest_checkpoint
from attnlab.cli import main
from attnlab.data.text import bundled_shakespeare
from attnlab.models import GPT
from attnlab.studies.ablation import ablation_specs, load_spec, plan, run_ablation
from attnlab.train import train
from attnlab.train.config import read_config
from helpers import ONE_LAYER_LM, WIKITEXT, assert_user_error, cli

pytestmark = pytest.mark.slow

BASE = ONE_LAYER_LM

SPEC = """
base = "base.toml"
seeds = 2
[set]
"train.max_iters" = {steps}
"train.eval_interval" = {every}
[variants.narrow]
set = {{ "model.d_model" = 16 }}
[variants.wide]
set = {{ "model.d_model" = {wide} }}
"""

COLUMNS = [
    "variant",
    "params",
    "flops_per_token",
    "steps_per_sec",
    "early_loss",
    "early_loss_sd",
    "final_loss",
    "final_loss_sd",
    "val_ppl",
    "val_ppl_sd",
    "seeds",
]


def write_spec(folder: Path, wide: int = 32, corpus: Path | None = None, steps: int = 20, every: int = 5) -> Path:
    """A two-variant spec (d_model 16 and `wide`) over a tiny base in `folder`, `steps` long with an
    evaluation `every` steps."""
    if corpus is None:
        corpus = folder / "corpus.txt"
        corpus.write_text(bundled_shakespeare()[:20_000], encoding="utf-8")
    (folder / "base.toml").write_text(BASE.format(corpus=corpus.as_posix()), encoding="utf-8")
    spec = folder / "spec.toml"
    spec.write_text(SPEC.format(wide=wide, steps=steps, every=every), encoding="utf-8")
    return spec


@dataclasses.dataclass
class Study:
    spec: Path
    out: Path
    stdout: str
    stderr: str


@pytest.fixture(scope="module")
def study(tmp_path_factory) -> Study:
    """2 variants x 2 seeds x 20 steps, trained once through the command line; tests only read it."""
    folder = tmp_path_factory.mktemp("ablate")
    spec = write_spec(folder)
    out = folder / "out"
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        code = main(["ablate", str(spec), "--out", str(out)])
    assert code == 0, stderr.getvalue()
    return Study(spec, out, stdout.getvalue(), stderr.getvalue())


def read_table(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def val_losses(run_dir: Path) -> dict[int, float]:
    """step -> val_loss of a run's metrics.csv, read independently of attnlab."""
    with open(run_dir / "metrics.csv", newline="") as f:
        return {int(r["step"]): float(r["val_loss"]) for r in csv.DictReader(f) if r["kind"] == "eval"}


def evaluated_loss(capsys, run_dir: Path) -> float:
    """The run's loss on the validation split's first 200,000 tokens, from `attnlab eval`."""
    code, out, err = cli(capsys, "eval", run_dir, "--max-tokens", "200000", "--json")
    assert code == 0, err
    return json.loads(out)["val_loss"]


def test_the_table_holds_each_variants_losses_over_its_seeds(study, capsys):
    rows = read_table(study.out / "ablation.csv")
    assert list(rows[0]) == COLUMNS
    assert [r["variant"] for r in rows] == ["narrow", "wide"]
    for row in rows:
        folders = [study.out / row["variant"] / f"seed{k}" for k in range(2)]
        curves = [val_losses(f) for f in folders]
        assert curves[0] != curves[1]  # the seeds differ
        early, final = [c[5] for c in curves], [evaluated_loss(capsys, f) for f in folders]
        assert float(row["early_loss"]) == pytest.approx(statistics.fmean(early), rel=1e-5)
        assert float(row["final_loss"]) == pytest.approx(statistics.fmean(final), rel=1e-5)
        assert float(row["final_loss_sd"]) == pytest.approx(statistics.stdev(final), rel=1e-4)
        assert float(row["val_ppl"]) == pytest.approx(statistics.fmean(math.exp(v) for v in final), rel=1e-5)
        assert row["seeds"] == "2" and float(row["steps_per_sec"]) > 0
        assert final[0] < early[0] < curves[0][0]  # it learned
    assert int(rows[0]["params"]) < int(rows[1]["params"])
    assert float(rows[0]["flops_per_token"]) < float(rows[1]["flops_per_token"])
    header = study.stdout.splitlines()[0].split()
    assert header[:3] == ["variant", "params", "FLOPs/token"] and "±" in study.stdout
    assert (study.out / "ablation.png").read_bytes().startswith(b"\x89PNG")
    assert "[4/4] wide/seed1: starting" in study.stderr


def test_flops_are_counted_on_a_real_step_and_equal_a_hand_count(study):
    """A plain GPT's matrix products, forward 2 FLOPs per weight and token plus the attention
    scores' 4 T C per layer (QK^T and AV over the full T x T), and backward twice the forward."""
    for row in read_table(study.out / "ablation.csv"):
        m = read_config(study.out / row["variant"] / "seed0").model
        c, t, v = m.d_model, m.block_size, m.vocab_size
        per_layer = 4 * c * c + 2 * c * 4 * c  # q, k, v, out; fc1, fc2
        forward = 2 * (m.n_layers * per_layer + v * c) + m.n_layers * 4 * t * c
        assert float(row["flops_per_token"]) == pytest.approx(3 * forward, rel=1e-6)


def test_a_finished_study_is_not_trained_again(study, capsys):
    files = sorted(p for p in study.out.rglob("*") if p.is_file() and p.suffix != ".png" and p.name != "ablation.csv")
    before = {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in files}
    table = (study.out / "ablation.csv").read_text()
    code, out, err = cli(capsys, "ablate", study.spec, "--out", study.out, "--json")
    assert code == 0, err
    assert {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in files} == before
    assert (study.out / "ablation.csv").read_text() == table
    rows = json.loads(out)["rows"]
    assert [r["variant"] for r in rows] == ["narrow", "wide"]
    assert rows[1]["final_loss"] == pytest.approx(
        float(read_table(study.out / "ablation.csv")[1]["final_loss"]), rel=1e-5
    )


def test_variants_picks_rows_of_a_study_and_trains_nothing_finished(study, tmp_path, capsys):
    out = tmp_path / "study"
    shutil.copytree(study.out, out)
    code, stdout, err = cli(capsys, "ablate", study.spec, "--out", out, "--json", "--variants", "wide")
    assert code == 0, err
    assert [r["variant"] for r in json.loads(stdout)["rows"]] == ["wide"]
    assert "starting" not in err  # its runs were finished
    assert_user_error(
        cli(capsys, "ablate", study.spec, "--out", out, "--variants", "wide,wdie"),
        "has no variant 'wdie'",
        "did you mean 'wide'",
    )


class StopAt:
    """The trainer's stop request, asked once a step: a signal arrives at step `step`."""

    def __init__(self, step: int) -> None:
        self.step, self.asked = step, 0

    @property
    def signal_name(self) -> str | None:
        self.asked += 1
        return "SIGTERM" if self.asked >= self.step else None


def test_a_half_done_run_continues_from_its_checkpoint_in_a_worker(study, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(study.out, out)
    shutil.rmtree(out / "wide" / "seed1")
    (out / "ablation.csv").unlink()
    spec = load_spec(str(study.spec))
    run = next(r for r in plan(spec, out) if r.name == "wide/seed1")
    assert train(run.config, run.folder, progress=False, stop=StopAt(8)).stopped_by == "SIGTERM"
    assert latest_checkpoint(run.folder).step == 8

    lines = []
    result = run_ablation(spec, out, jobs=2, log=lines.append)
    assert "[1/1] wide/seed1: continuing at step 8 (20 steps)" in lines
    assert [o.status for o in result.outcomes] == ["done", "done", "done", "trained"]
    assert latest_checkpoint(run.folder).step == 20
    # Resumed from step 8, the run is the uninterrupted one: the trainer's resume is exact on a CPU.
    assert val_losses(run.folder) == val_losses(study.out / "wide" / "seed1")
    fresh, original = read_table(out / "ablation.csv"), read_table(study.out / "ablation.csv")
    for a, b in zip(fresh, original, strict=True):
        assert {k: v for k, v in a.items() if k != "steps_per_sec"} == {
            k: v for k, v in b.items() if k != "steps_per_sec"
        }


def test_a_changed_spec_is_refused_before_anything_is_written(study, tmp_path, capsys):
    changed = write_spec(tmp_path, wide=48, corpus=study.spec.parent / "corpus.txt")
    listing = sorted((p, p.stat().st_mtime_ns) for p in study.out.rglob("*"))
    result = cli(capsys, "ablate", changed, "--out", study.out)
    assert_user_error(result, "wide/seed0 holds a run with model.d_model = 32, but this study sets 48")
    assert sorted((p, p.stat().st_mtime_ns) for p in study.out.rglob("*")) == listing


BUDGET_KEYS = [
    "train.max_iters",
    "train.batch_size",
    "model.block_size",
    "train.learning_rate",
    "train.lr_decay_iters",
    "train.warmup_iters",
    "train.gradient_accumulation_steps",
    "train.seed",
    "train.eval_interval",
    "train.eval_iters",
]


@pytest.mark.parametrize(
    "text, fragments",
    [
        ('varaints = {}\n[variants.a]\nset = {"model.n_layers" = 2}', ["unknown key 'varaints'", "'variants'"]),
        ('[variants.a]\nsett = {"model.n_layers" = 2}', ["unknown key 'sett' in [variants.a]", "did you mean 'set'"]),
        ('[variants.a]\nset = {"model.activaton" = "gelu"}', ["variant 'a'", "model.activaton", "'activation'"]),
        ('[variants.a]\nset = {"model.activation" = "swishy"}', ["variant 'a'", "activation must be", "'swish'"]),
        ('[variants.a]\nset = {"model.n_layers" = "two"}', ["variant 'a'", "model.n_layers must be of type int"]),
        ('[variants.a]\nset = {"data.path" = "other.txt"}', ["variant 'a' sets data.path", "unfair"]),
        ('[variants."a/b"]\nset = {}', ["'a/b' is not a folder name"]),
        ("seeds = 0\n[variants.a]\nset = {}", ["seeds must be an integer >= 1"]),
        ("[set]\n", ["the spec has no variants"]),
        ('[set]\n"train.eval_interval" = 3\n[variants.a]\nset = {}', ["1/4 of training", "eval_interval (3)"]),
        ('[set]\n"data.path" = "missing.txt"\n[variants.a]\nset = {}', ["corpus file missing.txt does not exist"]),
    ]
    + [
        (f'[variants.a]\nset = {{"{key}" = 2}}', [f"variant 'a' sets {key}", "training budget", "unfair"])
        for key in BUDGET_KEYS
    ],
)
def test_bad_specs_are_one_line_and_write_nothing(tmp_path, capsys, text, fragments):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(bundled_shakespeare()[:5_000], encoding="utf-8")
    (tmp_path / "base.toml").write_text(BASE.format(corpus=corpus.as_posix()), encoding="utf-8")
    spec = tmp_path / "spec.toml"
    spec.write_text('base = "base.toml"\n' + text, encoding="utf-8")
    assert_user_error(cli(capsys, "ablate", spec, "--out", tmp_path / "out"), *fragments)
    assert not (tmp_path / "out").exists()


def test_unknown_spec_name_suggests_the_shipped_one(tmp_path, capsys):
    result = cli(capsys, "ablate", "shakespeare-chr", "--out", tmp_path / "out")
    assert_user_error(result, "unknown ablation spec 'shakespeare-chr'", "did you mean 'shakespeare-char'")
    assert not (tmp_path / "out").exists()


PAPER_ROWS = [
    "vanilla",
    "gelu",
    "swish",
    "glu",
    "geglu",
    "reglu",
    "swiglu",
    "liglu",
    "rmsnorm",
    "rezero",
    "rezero+layernorm",
    "rezero+rmsnorm",
    "block-sharing",
    "factorized-embeddings",
    "moe-top2",
    "switch",
    "universal",
    # issue 49's attention-side rows
    "synthesizer-dense",
    "synthesizer-dense+",
    "synthesizer-dense+alpha",
    "synthesizer-factorized",
    "synthesizer-random",
    "synthesizer-random+",
    "synthesizer-random+alpha",
    "weighted-transformer",
    "product-key-memory",
]
"""The first rows of the language-model specs (their figures are in BENCHMARKS.md); issue 49's
rows follow them (tests/nn/test_rows_embeddings.py checks those)."""

LM_SPECS = ["shakespeare-char", "wikitext2"]


def test_shipped_specs_have_the_papers_rows_and_each_variant_changes_its_part(tmp_path):
    assert set(LM_SPECS) <= set(ablation_specs())
    plans = {
        name: plan(load_spec(name), tmp_path / name, data_dir=str(WIKITEXT) if name == "wikitext2" else None)
        for name in LM_SPECS
    }
    for runs in plans.values():
        names = [r.name for r in runs]
        assert names[: 3 * len(PAPER_ROWS)] == [f"{v}/seed{k}" for v in PAPER_ROWS for k in range(3)]
        assert len({r.config.train for r in runs if r.name.endswith("seed0")}) == 1  # one budget for all
        assert runs[0].config.train.max_iters % 4 == 0
    assert plans["wikitext2"][0].config.data.path == str((WIKITEXT / "train.txt").resolve())
    assert not (tmp_path / "shakespeare-char").exists()
    vanilla = plans["shakespeare-char"][0].config.model
    assert (vanilla.activation, vanilla.normalization) == ("relu", "layernorm")
    changed = {
        run.name.split("/")[0]: {
            f.name: getattr(run.config.model, f.name)
            for f in dataclasses.fields(vanilla)
            if getattr(run.config.model, f.name) != getattr(vanilla, f.name)
        }
        for run in plans["shakespeare-char"][::3]
    }
    assert changed["swiglu"] == {"activation": "swiglu"}
    assert changed["rezero+rmsnorm"] == {"normalization": "rezero+rmsnorm"}
    assert changed["block-sharing"] == {"block_sharing": "all"}
    assert changed["universal"] == {"block_sharing": "universal"}
    assert changed["switch"] == {"experts": 4, "expert_top_k": 1, "capacity_factor": 1.25}
    assert changed["moe-top2"] == {"experts": 4, "capacity_factor": 1.25}  # top-2 is the default
    assert vanilla.expert_top_k == 2
    assert changed["factorized-embeddings"]["embedding_dim"] < vanilla.d_model
    assert changed["synthesizer-random+alpha"] == {"attention": "synthesizer-random+alpha"}
    assert changed["weighted-transformer"] == {"branched_attention": True}
    assert changed["product-key-memory"] == {"memory_keys": 32}


def test_every_shipped_variant_builds_and_takes_a_training_step(tmp_path):
    torch.manual_seed(0)
    x = torch.randint(0, 65, (2, 64))
    for run in plan(load_spec("shakespeare-char"), tmp_path, seeds=1):
        model = GPT(dataclasses.replace(run.config.model, vocab_size=65))
        _, loss = model(x[:, :-1], x[:, 1:])
        loss.backward()
        assert math.isfinite(loss.item()), run.name


def test_a_signal_stops_the_study_after_a_checkpoint(tmp_path):
    """SIGTERM: the run in training finishes its step and saves, no other run starts, exit 0.
    (That such a run continues is the half-done test's.)"""
    spec = write_spec(tmp_path, steps=2000, every=20)
    out = tmp_path / "out"
    command = [sys.executable, "-m", "attnlab", "ablate", str(spec), "--out", str(out), "--seeds", "1"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    first = out / "narrow" / "seed0"
    deadline = time.monotonic() + 60
    while not (first / "checkpoint.json").exists() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 0, err
    assert err.strip().endswith("attnlab ablate: stopped with 2 run(s) unfinished; the same command continues")
    assert 20 <= latest_checkpoint(first).step < 2000
    assert not (out / "wide").exists() and not (out / "ablation.csv").exists()
