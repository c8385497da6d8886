"""The cost table as text: the measurements per length, then theory against the fitted exponents."""

from collections.abc import Sequence

from attnlab.studies.bench.report import optional_number
from attnlab.studies.cost.settings import MODEL_LABELS, MODELS, SHORT_LABELS
from attnlab.studies.cost.study import CostResult
from attnlab.studies.cost.theory import COUNTED, QUANTITIES, QUANTITY_LABELS


def model_groups(models: Sequence[str]) -> list[tuple[str, ...]]:
    """The models in tables of at most three, as wide as a terminal: the lectures' three, then the
    attention patterns two at a time beside the full-attention Transformer they vary.
    Example: `MODELS + ("transformer-window",)` -> [MODELS, ("transformer", "transformer-window")]."""
    extra = [m for m in models if m not in MODELS]
    return [tuple(m for m in models if m in MODELS)] + [
        ("transformer", *extra[i : i + 2]) for i in range(0, len(extra), 2)
    ]


def _measurement_lines(result: CostResult, group: tuple[str, ...]) -> list[str]:
    """The readings of `group` per length: training, then generation, time and memory side by side."""
    units = {
        "train_time": "train s",
        "train_memory": "train MiB",
        "generate_time": "gen s",
        "generate_memory": "gen MiB",
    }
    lines = []
    for quantities in (("train_time", "train_memory"), ("generate_time", "generate_memory")):
        columns = [(m, q) for q in quantities for m in group]
        head = f"{'t':>6} " + " ".join(f"{SHORT_LABELS[m] + ' ' + units[q]:>18}" for m, q in columns)
        lines += [head, "-" * len(head)]
        series = {c: result.series(*c) for c in columns}
        for i, t in enumerate(result.lengths):
            cells = []
            for model, quantity in columns:
                spec = ".4f" if quantity.endswith("time") else ",.2f"
                cells.append(f"{optional_number(series[(model, quantity)][i], spec):>18}")
            lines.append(f"{t:>6} " + " ".join(cells))
        lines.append("")
    return lines


def _theory_lines(result: CostResult, group: tuple[str, ...], notes: list[str]) -> list[str]:
    """The cost table of `group`: per quantity, each model's theory beside its fitted exponent ("∞"
    for an infinite path). Appends to `notes` the rows fitted on fewer lengths than the others."""
    by_key = {(r.model, r.quantity): r for r in result.table}
    theory_width = max(17, *(len(by_key[(m, q)].theory) + 1 for m in group for q in QUANTITIES))
    cell = theory_width + 15
    lines = [
        f"{'':<22}" + "".join(f"{MODEL_LABELS[m]:>{cell}}" for m in group),
        f"{'quantity':<22}" + "".join(f"{'theory':>{theory_width}} {'exp.':>4} {'fit':>9}" for _ in group),
    ]
    lines.append("-" * len(lines[0]))
    for quantity in QUANTITIES:
        cells = []
        for model in group:
            r = by_key[(model, quantity)]
            star = "*" if r.source == "derived" else ""
            if r.fitted_exponent is None and quantity in COUNTED:
                fitted = "∞"  # counts are never missing: a None fit is a pair that no path connects
            else:
                fitted = optional_number(r.fitted_exponent, ".2f")
            if r.fitted_exponent is not None and r.fit_lengths != result.fit_lengths:
                fitted += "†"
                notes.append(
                    f"{MODEL_LABELS[model]} {QUANTITY_LABELS[quantity]} on t = {', '.join(map(str, r.fit_lengths))}"
                )
            exponent = optional_number(r.theory_exponent, "d")
            cells.append(f"{r.theory + star:>{theory_width}} {exponent:>4} {fitted:>9}")
        lines.append(f"{QUANTITY_LABELS[quantity]:<22}" + "".join(f"{c:>{cell}}" for c in cells))
    return lines


def _path_text(length: int | None) -> str:
    """A counted path length, "∞" where no path connects a pair."""
    return "∞" if length is None else str(length)


def format_table(result: CostResult) -> str:
    """The measurements per length, then the cost table: theory beside the fitted exponents. Models
    beyond the lectures' three (the attention patterns) get tables of their own after theirs."""
    lines = [
        f"attnlab cost on {result.device} ({result.machine}), {result.threads} thread"
        f"{'s' if result.threads != 1 else ''}, torch {result.torch}, {result.date}",
        f"width k={result.width}, layers d={result.layers}, heads {result.heads}, vocab {result.vocab}, "
        f"batch {result.batch}; time: {result.timing_method}",
        f"memory: {result.memory_method}",
    ]
    patterns = {
        "transformer-window": f"window w={result.attention_window}",
        "transformer-bigbird": f"BigBird blocks b={result.attention_block}, {result.global_blocks} global, "
        f"{result.random_blocks} random",
    }
    if len(result.models) > len(MODELS):
        lines.append("attention patterns: " + "; ".join(patterns[m] for m in result.models if m in patterns))
    lines.append("")
    groups = model_groups(result.models)
    for group in groups:
        lines += _measurement_lines(result, group)
    fit = result.fit_lengths
    lines.append(f"the cost table: theory beside the exponent of t fitted on t = {fit[0]}..{fit[-1]}")
    notes: list[str] = []
    for i, group in enumerate(groups):
        lines += ([""] if i else []) + _theory_lines(result, group, notes)
    lines.append("* not in the lectures' table: derived for these models (see attnlab.studies.cost.THEORY)")
    if notes:
        lines.append("† fitted on the lengths that ran: " + "; ".join(notes))
    last = result.lengths[-1]
    counted = {c.model: c for c in result.counts if c.length == last}
    lines.append("")
    lines.append(
        f"counted at t={last}, d={result.layers}: sequential steps "
        + ", ".join(f"{MODEL_LABELS[m]} {counted[m].sequential_steps}" for m in result.models)
        + "; max path length "
        + ", ".join(f"{MODEL_LABELS[m]} {_path_text(counted[m].max_path_length)}" for m in result.models)
    )
    return "\n".join(lines)
