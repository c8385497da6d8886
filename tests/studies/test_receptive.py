"""`attnlab cost --autoregressive`: the counted receptive fields and sequential steps of the image
and audio presets' models, against the masks' Minkowski sum and the configs."""

import json

from attnlab.nn.conv import raster_mask
from attnlab.studies.receptive import autoregressive_rows
from helpers import assert_user_error, cli


def minkowski(masks) -> set[tuple[int, int]]:
    offsets = {(0, 0)}
    for mask in masks:
        c = mask.shape[0] // 2
        taps = [(i - c, j - c) for i, j in mask.nonzero().tolist()]
        offsets = {(a + dy, b + dx) for a, b in offsets for dy, dx in taps}
    return offsets


def test_rows_count_what_the_models_see():
    rows = {r.model: r for r in autoregressive_rows()}
    plain, gated = rows["PixelCNN"], rows["Gated PixelCNN"]
    # The preset: a 7 x 7 mask-A layer and 7 blocks of 3 x 3 mask B; pixel (14, 14) of 28 x 28.
    field = {(14 + dy, 14 + dx) for dy, dx in minkowski([raster_mask(7, "A")] + [raster_mask(3, "B")] * 7)}
    expected = {(r, c) for r, c in field if 0 <= r < 28 and 0 <= c < 28 and (r, c) < (14, 14)}
    assert plain.seen == len(expected) < plain.earlier == 14 * 28 + 14  # the blind spot
    assert gated.seen == gated.earlier  # none
    assert rows["WaveNet, cached"].seen == 510 and rows["WaveNet, naive"].train_steps == 16
    assert rows["RNN (2 layers)"].train_steps == 784 + 1  # t steps, plus one for the second layer
    assert rows["pixel Transformer"].train_steps == 4 and rows["pixel Transformer"].generate_steps == 784 * 4


def test_cost_autoregressive_prints_the_table_and_refuses_measuring_flags(capsys):
    code, out, err = cli(capsys, "cost", "--autoregressive", "--json")
    assert code == 0, err
    assert [r["model"] for r in json.loads(out)["rows"]][:2] == ["PixelCNN", "Gated PixelCNN"]
    code, out, _ = cli(capsys, "cost", "--autoregressive")
    assert "Gated PixelCNN" in out and "406 of 406" in out
    assert_user_error(cli(capsys, "cost", "--autoregressive", "--quick"), "drop --quick")
