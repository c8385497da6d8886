"""Pictures of what a model does: attention maps (PNG, or an interactive HTML page), the sinusoidal
positional encodings, training curves, a grid of images sampled from a run, and a one-page HTML
report of a run.

Needs the optional extra: `pip install 'attnlab[plot]'`. Importing this package does not import
matplotlib; drawing does, and raises `attnlab.UserError` when it is missing.
"""

from attnlab.viz.attention import display_token, draw_alignment, plot_alignment, plot_attention, plot_heads
from attnlab.viz.curves import draw_run, plot_curves, plot_run, read_metric
from attnlab.viz.html import attention_view, write_attention_html
from attnlab.viz.images import sample_image_grid
from attnlab.viz.maps import AttentionMaps, attention_maps
from attnlab.viz.positions import plot_positions
from attnlab.viz.report import write_report

__all__ = [
    "AttentionMaps",
    "attention_maps",
    "attention_view",
    "display_token",
    "draw_run",
    "draw_alignment",
    "plot_alignment",
    "plot_attention",
    "plot_curves",
    "plot_heads",
    "plot_positions",
    "plot_run",
    "read_metric",
    "sample_image_grid",
    "write_attention_html",
    "write_report",
]
