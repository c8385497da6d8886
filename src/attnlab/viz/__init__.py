"""Pictures of what a model does: attention maps and training curves (positional-encoding plots to come).

Needs the optional extra: `pip install 'attnlab[plot]'`. Importing this package does not import
matplotlib; drawing does, and raises `attnlab.UserError` when it is missing.
"""

from attnlab.viz.attention import display_token, plot_alignment, plot_heads
from attnlab.viz.curves import plot_curves, read_metric

__all__ = ["display_token", "plot_alignment", "plot_curves", "plot_heads", "read_metric"]
