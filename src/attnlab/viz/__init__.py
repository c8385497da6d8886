"""Pictures of what a model does: attention maps (positional-encoding plots and training curves to come).

Needs the optional extra: `pip install 'attnlab[plot]'`. Importing this package does not import
matplotlib; drawing does, and raises `attnlab.UserError` when it is missing.
"""

from attnlab.viz.attention import display_token, plot_alignment, plot_heads

__all__ = ["display_token", "plot_alignment", "plot_heads"]
