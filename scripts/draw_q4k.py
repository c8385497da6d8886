"""Draw the bytes of one Q4_K super-block (ggml's `block_q4_K`) as a strip: docs/q4k-superblock.png,
the picture in docs/looking-inside.md ("Block formats").

    python scripts/draw_q4k.py [--out docs/q4k-superblock.png]

A super-block stands for 256 weights of a row in 144 bytes: d and dmin (fp16, 2 bytes each), the
eight sub-blocks' 6-bit scales and mins packed in 12 bytes, then 128 bytes of four-bit codes, 32
bytes for each pair of sub-blocks (low nibbles the first of the pair, high nibbles the second).
Weight i of sub-block j is d·sc_j·q_i − dmin·m_j. The layout follows the `gguf` package's
`gguf.quants.Q4_K` (the reader attnlab's GGUF loader uses).
"""

import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402

OUT = Path(__file__).resolve().parents[1] / "docs" / "q4k-superblock.png"

# (first byte, bytes, label, colour) of the super-block's fields, in file order
FIELDS = [
    (0, 2, "d\nfp16", "#e4572e"),
    (2, 2, "dmin\nfp16", "#f3a712"),
    (4, 12, "scales and mins\n6 bits each, 12 bytes", "#a8c686"),
    *[
        (16 + 32 * j, 32, f"sub-blocks {2 * j} | {2 * j + 1}\n(low | high nibbles)", c)
        for j, c in enumerate(["#669bbc", "#8fb8d6", "#669bbc", "#8fb8d6"])
    ],
]

# the 12 scale bytes: (bytes, what their bits hold)
SCALE_BYTES = [
    ("bytes 4–7", "bits 0–5: sc₀…sc₃\nbits 6–7: sc₄…sc₇'s top 2 bits"),
    ("bytes 8–11", "bits 0–5: m₀…m₃\nbits 6–7: m₄…m₇'s top 2 bits"),
    ("bytes 12–15", "bits 0–3: sc₄…sc₇'s low 4 bits\nbits 4–7: m₄…m₇'s low 4 bits"),
]


def draw_strip(ax: Axes) -> None:
    """The 144 bytes as one strip, a thin tick per byte, each field labelled (the two narrow ones
    above the strip, with arrows, so their labels do not overlap)."""
    for first, size, label, colour in FIELDS:
        ax.add_patch(Rectangle((first, 0), size, 1, facecolor=colour, edgecolor="black", lw=1.2))
        ax.text(first, -0.08, str(first), ha="center", va="top", fontsize=7)
        if size > 2:
            ax.text(first + size / 2, -0.5, label, ha="center", va="top", fontsize=7.5)
        else:
            where = (first + 1 + (8 if first else 0), 1.9)
            ax.annotate(
                label.replace("\n", " "),
                (first + 1, 1),
                where,
                fontsize=7.5,
                ha="left",
                arrowprops={"arrowstyle": "->", "lw": 0.8},
            )
    for byte in range(145):
        ax.plot([byte, byte], [0, 0.18], color="black", lw=0.3)
    ax.text(144, -0.08, "144", ha="center", va="top", fontsize=7)
    ax.set_xlim(-2, 146)
    ax.set_ylim(-1.8, 2.4)
    ax.axis("off")
    ax.set_title("One Q4_K super-block: 256 weights in 144 bytes (4.5 bits a weight)", fontsize=10)


def draw_scales(ax: Axes) -> None:
    """The 12 scale bytes enlarged: which bits of which byte hold each sub-block's scale and min."""
    for k, (span, bits) in enumerate(SCALE_BYTES):
        ax.add_patch(Rectangle((4 * k, 0), 4, 1, facecolor="#a8c686", edgecolor="black", lw=1))
        ax.text(4 * k + 2, 0.5, span, ha="center", va="center", fontsize=8)
        ax.text(4 * k + 2, -0.15, bits, ha="center", va="top", fontsize=7)
    ax.set_xlim(-0.5, 12.5)
    ax.set_ylim(-1.6, 1.2)
    ax.axis("off")
    ax.set_title("the 12 bytes of scales (sc) and mins (m), sub-blocks 0–7", fontsize=9)


def draw_formula(ax: Axes) -> None:
    """How a weight is read back."""
    text = (
        "sub-block j (32 weights), code q in 0..15:\n\n"
        "    w = d · sc_j · q  −  dmin · m_j\n\n"
        "sc_j, m_j: 6-bit integers (0..63)\n"
        "codes: 32 bytes per pair of sub-blocks;\n"
        "byte i's low nibble is weight i of sub-block 2p,\n"
        "its high nibble weight i of sub-block 2p + 1"
    )
    ax.text(0, 0.5, text, ha="left", va="center", fontsize=8, family="monospace")
    ax.axis("off")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args()
    fig = plt.figure(figsize=(11, 4.4))
    grid = fig.add_gridspec(2, 2, height_ratios=[1, 1.1], width_ratios=[1.3, 1])
    draw_strip(fig.add_subplot(grid[0, :]))
    draw_scales(fig.add_subplot(grid[1, 0]))
    draw_formula(fig.add_subplot(grid[1, 1]))
    fig.tight_layout()
    fig.savefig(args.out, dpi=120)
    print(args.out)


if __name__ == "__main__":
    main()
