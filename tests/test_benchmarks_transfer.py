"""benchmarks/transfer_table.py: its Spearman ρ against scipy's, and the two-column table built
from hand-written ablation.csv files and test2016.json results kept in fake run folders (no model
is trained or decoded: a run scored anew would fail, as the folders hold no weights)."""

import csv
import importlib.util
import json
import math
import random
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).parents[1] / "benchmarks" / "transfer_table.py"
_spec = importlib.util.spec_from_file_location("transfer_table", SCRIPT)
transfer = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(transfer)

FIELDS = ["variant", "params", "flops_per_token", "steps_per_sec", "early_loss", "early_loss_sd"]
FIELDS += ["final_loss", "final_loss_sd", "val_ppl", "val_ppl_sd", "seeds"]

# variant -> (final loss mean, sd) over 3 seeds; "universal" has no translation row.
LM = {"vanilla": (2.0, 0.01), "gelu": (2.1, 0.02), "rmsnorm": (1.9, 0.01), "universal": (2.3, 0.03)}
# variant -> the test2016 BLEU of seed0 and seed1; "funnel" exists only in the encoder–decoder.
MT = {"vanilla": (30.0, 32.0), "gelu": (29.0, 29.5), "rmsnorm": (33.0, 34.0), "funnel": (25.0, 26.0)}


def write_ablation(folder: Path, rows: dict[str, tuple[float, float]], seeds: int) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "ablation.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(FIELDS)
        for name, (mean, sd) in rows.items():
            w.writerow([name, 1000, 1e6, 5.0, mean + 0.5, 0.01, mean, sd, 7.0, 0.1, seeds])


def write_run(run_dir: Path, bleu: float, beam: int = 5) -> None:
    """A run folder as far as the table reads it: metrics.csv and a kept test2016 result."""
    run_dir.mkdir(parents=True)
    (run_dir / "metrics.csv").write_text("step,kind,val_loss,val_bleu\n400,eval,3.1,20.0\n")
    record = {"split": "test2016", "beam": beam, "checkpoint": "best", "trained_to": 400, "bleu": bleu}
    (run_dir / "test2016.json").write_text(json.dumps(record))


@pytest.fixture
def studies(tmp_path: Path) -> tuple[Path, Path]:
    lm, mt = tmp_path / "lm", tmp_path / "mt"
    write_ablation(lm, LM, seeds=3)
    write_ablation(mt, {name: (3.0, 0.1) for name in MT}, seeds=2)
    for name, scores in MT.items():
        for k, bleu in enumerate(scores):
            write_run(mt / name / f"seed{k}", bleu)
    return lm, mt


def run(*args: object) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True, timeout=120)


def test_ranks_average_ties():
    assert transfer.ranks([10, 20, 20, 5]) == [2, 3.5, 3.5, 1]
    assert transfer.ranks([1, 1, 1]) == [2, 2, 2]


def test_spearman_matches_scipy_with_and_without_ties():
    stats = pytest.importorskip("scipy.stats")
    rng = random.Random(0)
    for n in (3, 5, 8, 20):
        for _ in range(20):
            xs = [rng.randint(0, 5) for _ in range(n)]  # many ties
            ys = [rng.gauss(0, 1) for _ in range(n)]
            want = stats.spearmanr(xs, ys).statistic
            got = transfer.spearman(xs, ys)
            assert (math.isnan(got) and math.isnan(want)) or got == pytest.approx(want, abs=1e-12)


def test_spearman_by_hand_and_degenerate_columns():
    # ranks (1, 2, 3, 4) and (1, 3, 2, 4): d² = 0 + 1 + 1 + 0, ρ = 1 - 6·2 / (4·15) = 0.8
    assert transfer.spearman([1.0, 2.0, 3.0, 4.0], [10.0, 30.0, 20.0, 40.0]) == pytest.approx(0.8)
    assert transfer.spearman([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    assert math.isnan(transfer.spearman([1, 2, 3], [5, 5, 5]))
    assert math.isnan(transfer.spearman([1], [2]))


def test_table_joins_columns_by_name_with_deltas_and_blanks(studies):
    lm_dir, mt_dir = studies
    lm = transfer.lm_column(lm_dir)
    mt = transfer.mt_column(
        transfer.run_folders(mt_dir), lambda line: None, data_dir=None, beam=5, checkpoint="best", device="cpu"
    )
    rows = {r.variant: r for r in transfer.build_rows(lm, mt)}
    assert list(rows) == ["vanilla", "gelu", "rmsnorm", "universal", "funnel"]  # LM order, then MT's own
    assert rows["gelu"].lm_delta == pytest.approx(LM["gelu"][0] - LM["vanilla"][0])
    assert rows["rmsnorm"].mt.mean == pytest.approx(33.5)
    assert rows["rmsnorm"].mt.sd == pytest.approx(math.sqrt(0.5))
    assert rows["rmsnorm"].mt_delta == pytest.approx(33.5 - 31.0)
    assert rows["vanilla"].lm_delta == 0 and rows["vanilla"].mt_delta == 0
    assert rows["universal"].mt is None and rows["universal"].mt_delta is None
    assert rows["funnel"].lm is None and rows["funnel"].mt.mean == pytest.approx(25.5)
    for name, row in rows.items():
        assert (row.paper_loss, row.paper_bleu) == transfer.PAPER[name]


def test_correlations_pair_the_rows_both_columns_have(studies):
    lm_dir, mt_dir = studies
    lm = transfer.lm_column(lm_dir)
    mt = transfer.mt_column(
        transfer.run_folders(mt_dir), lambda line: None, data_dir=None, beam=5, checkpoint="best", device="cpu"
    )
    ours_lm, ours_mt, lm_mt = transfer.correlations(transfer.build_rows(lm, mt))
    assert ours_lm.n == 4 and ours_mt.n == 4 and lm_mt.n == 3
    lm_names, mt_names = list(LM), list(MT)
    want = transfer.spearman([-LM[v][0] for v in lm_names], [-transfer.PAPER[v][0] for v in lm_names])
    assert ours_lm.rho == pytest.approx(want)
    want = transfer.spearman([sum(MT[v]) / 2 for v in mt_names], [transfer.PAPER[v][1] for v in mt_names])
    assert ours_mt.rho == pytest.approx(want)
    # lower loss with higher BLEU is agreement: rmsnorm best in both, gelu worst in both
    assert lm_mt.rho == pytest.approx(1.0)


def test_cli_prints_the_table_from_kept_results(studies, tmp_path):
    lm_dir, mt_dir = studies
    out, doc = tmp_path / "t.md", tmp_path / "t.json"
    done = run(lm_dir, mt_dir, "--out", out, "--json", doc)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("| variant | LM final loss")
    gelu = next(line for line in lines if line.startswith("| gelu |"))
    assert "2.100 ± 0.020 (+0.100)" in gelu and "29.25 ± 0.35 (-1.75)" in gelu
    assert next(line for line in lines if line.startswith("| universal |")).split("|")[3].strip() == ""
    assert "(n = 3)" in done.stdout
    assert "kept from an earlier call" in done.stderr
    assert out.read_text() == done.stdout
    saved = json.loads(doc.read_text())
    assert [r["variant"] for r in saved["rows"]][-1] == "funnel" and len(saved["correlations"]) == 3


def test_a_result_kept_for_another_beam_is_not_reused(studies):
    _, mt_dir = studies
    run_dir = mt_dir / "gelu" / "seed0"
    key = {"split": "test2016", "beam": 5, "checkpoint": "best", "trained_to": 400}
    assert transfer.cached_bleu(run_dir, key) == MT["gelu"][0]
    assert transfer.cached_bleu(run_dir, key | {"beam": 1}) is None
    assert transfer.cached_bleu(run_dir, key | {"trained_to": 800}) is None


def assert_one_line_error(done: subprocess.CompletedProcess, *words: str) -> None:
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr  # no traceback
    assert lines[0].startswith("transfer_table: error: ")
    for word in words:
        assert word in lines[0]


def test_a_folder_without_ablation_csv_is_one_line(studies, tmp_path):
    lm_dir, mt_dir = studies
    empty = tmp_path / "empty"
    empty.mkdir()
    assert_one_line_error(run(empty, mt_dir), "LM_STUDY", "ablation.csv")
    assert_one_line_error(run(lm_dir, tmp_path / "missing"), "MT_STUDY", "ablation.csv")


def test_a_study_without_vanilla_is_one_line(studies, tmp_path):
    lm_dir, mt_dir = studies
    write_ablation(tmp_path / "novanilla", {"gelu": (2.1, 0.02)}, seeds=3)
    assert_one_line_error(run(tmp_path / "novanilla", mt_dir), "'vanilla'")
    assert_one_line_error(run(lm_dir, tmp_path / "novanilla"), "'vanilla'")


def test_a_run_folder_missing_from_the_study_is_one_line(studies):
    lm_dir, mt_dir = studies
    (mt_dir / "funnel" / "seed1" / "test2016.json").unlink()
    (mt_dir / "funnel" / "seed1" / "metrics.csv").unlink()
    (mt_dir / "funnel" / "seed1").rmdir()
    assert_one_line_error(run(lm_dir, mt_dir), "funnel", "seed1")


def test_the_language_model_column_alone(tmp_path, capsys):
    lm = tmp_path / "lm"
    lm.mkdir()
    (lm / "ablation.csv").write_text(
        "variant,final_loss,final_loss_sd,seeds\nvanilla,2.0,0.01,3\nswiglu,1.9,0.02,3\nrezero,2.6,0.03,3\n"
    )
    assert transfer.main([str(lm)]) == 0
    out = capsys.readouterr().out
    assert "| swiglu | 1.900 ± 0.020 (-0.100) |  | 1.789 | 27.02 |" in out
    assert "vs paper final loss: ρ = +1.00 (n = 3)" in out and "(n = 0)" in out
