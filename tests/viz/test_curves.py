import csv

import pytest

from attnlab import UserError
from attnlab.train.trainer import METRICS_FIELDS
from attnlab.viz import plot_curves, read_metric

pytest.importorskip("matplotlib")


def write_metrics(run_dir, rows):
    run_dir.mkdir()
    with open(run_dir / "metrics.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, METRICS_FIELDS)
        writer.writeheader()
        writer.writerows(rows)
    return run_dir


@pytest.fixture
def run(tmp_path):
    return write_metrics(
        tmp_path / "run",
        [
            {"step": 0, "kind": "eval", "val_loss": 9.0, "val_accuracy": 0.01, "val_ppl": 8100.0},
            {"step": 10, "kind": "train", "train_loss": 7.5},
            {"step": 20, "kind": "eval", "val_loss": 6.0, "val_accuracy": 0.2, "val_ppl": 403.0},
            {"step": 40, "kind": "eval", "val_loss": 5.0, "val_accuracy": 0.3, "val_ppl": 148.0},
        ],
    )


def test_read_metric_keeps_only_rows_that_have_it(run):
    assert read_metric(run, "val_accuracy") == ([0, 20, 40], [0.01, 0.2, 0.3])
    assert read_metric(run, "train_loss") == ([10], [7.5])


def test_unknown_metric_and_missing_run_are_user_errors(run, tmp_path):
    with pytest.raises(UserError, match="no column 'val_f1'"):
        read_metric(run, "val_f1")
    with pytest.raises(UserError, match="does not exist"):
        read_metric(tmp_path / "nowhere", "val_loss")


def test_plot_curves_writes_a_png_with_one_panel_per_metric(run, tmp_path):
    other = write_metrics(tmp_path / "other", [{"step": 0, "kind": "eval", "val_accuracy": 0.5, "val_ppl": 50.0}])
    out = plot_curves([run, other], ["val_accuracy", "val_ppl"], tmp_path / "curves.png", title="MLM")
    data = out.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n")
    one = plot_curves([run], ["val_accuracy"], tmp_path / "one.png")
    # Two panels are wider than one: the figure width grows with the number of metrics.
    width = lambda p: int.from_bytes(p.read_bytes()[16:20], "big")  # noqa: E731 (PNG IHDR width)
    assert width(out) > width(one)


def test_plot_curves_refuses_a_non_png_path(run, tmp_path):
    with pytest.raises(UserError, match="PNG"):
        plot_curves([run], ["val_loss"], tmp_path / "curves.jpg")


def csv_column(run_dir, column, kind=None):
    """(step, value) pairs of a column, read with the csv module alone; the last row of a step wins."""
    with open(run_dir / "metrics.csv", newline="") as f:
        rows = [r for r in csv.DictReader(f) if r[column] and kind in (None, r["kind"])]
    return dict((float(r["step"]), float(r[column])) for r in rows)


def test_plot_run_draws_every_logged_curve_of_a_real_run(tmp_path_factory, tmp_path):
    from attnlab.viz.curves import plot_run
    from attnlab.viz.figure import png_size
    from helpers import shared

    run_dir = shared(tmp_path_factory, "lm")
    plot = plot_run(run_dir, tmp_path / "curves.png")

    assert list(plot.panels) == ["loss", "learning rate", "throughput (tokens / s)"]  # an LM logs no val_ppl
    expected = {
        "loss": {"train_loss": csv_column(run_dir, "train_loss", "train"), "val_loss": csv_column(run_dir, "val_loss")},
        "learning rate": {"lr": csv_column(run_dir, "lr")},
        "throughput (tokens / s)": {"tokens_per_sec": csv_column(run_dir, "tokens_per_sec", "train")},
    }
    for title, lines in expected.items():
        assert set(plot.panels[title]) == set(lines), title
        for column, points in lines.items():
            steps, values = plot.panels[title][column]
            assert len(points) >= 2 and dict(zip(steps, values, strict=True)) == pytest.approx(points), column
    assert [line.get_label() for line in plot.figure.axes[0].get_lines()] == ["training loss", "validation loss"]
    width, height = png_size(tmp_path / "curves.png")
    assert width > 1000 and height > 300


def test_plot_run_of_an_empty_log(tmp_path):
    from attnlab.viz.curves import plot_run

    with pytest.raises(UserError, match="no logged values"):
        plot_run(write_metrics(tmp_path / "run", []), tmp_path / "c.png")
    with pytest.raises(UserError, match="does not exist"):
        plot_run(tmp_path / "nowhere", tmp_path / "c.png")
