"""The whole run: every model, kind and length measured and counted (`measure_cost`), the results
(`CostResult`) and the exponents fitted beside the theory (`fit_table`)."""

import dataclasses
import platform
import sys
from dataclasses import dataclass
from datetime import date

import torch

from attnlab.studies.cost.counting import count_steps
from attnlab.studies.cost.measure import _Server
from attnlab.studies.cost.settings import CASE_BUDGET_S, KINDS, MODEL_LABELS, MODELS, VOCAB, CostSettings
from attnlab.studies.cost.theory import COUNTED, QUANTITIES, THEORY, fit_exponent


@dataclass
class Measurement:
    model: str
    kind: str
    """"train" or "generate"."""
    length: int
    seconds: float | None
    """The fastest timed call; None when the case did not run (skipped or out of memory)."""
    peak_mib: float | None
    """Peak resident memory above model, optimizer and warm-up, MiB (one page at least)."""


@dataclass
class Count:
    model: str
    length: int
    sequential_steps: int
    max_path_length: int | None
    """None: some pair of positions is not connected at all (an infinite path)."""


@dataclass
class TableRow:
    model: str
    quantity: str
    theory: str
    theory_exponent: int | None
    source: str
    fitted_exponent: float | None
    """None when fewer than two of the fit lengths have a value (cases skipped for memory), or, for
    a count, when a path is infinite at one of them."""
    fit_lengths: list[int]
    """The lengths this row's exponent was fitted on: those of `CostResult.fit_lengths` with a value
    (all of them for a count: an infinite path is a value that no power of t fits)."""


@dataclass
class CostResult:
    date: str
    device: str
    machine: str
    threads: int
    torch: str
    lengths: list[int]
    fit_lengths: list[int]
    width: int
    layers: int
    heads: int
    vocab: int
    batch: int
    repeats: int
    passes: int
    max_memory_mib: float
    timing_method: str
    memory_method: str
    measurements: list[Measurement]
    counts: list[Count]
    table: list[TableRow]
    models: list[str] = dataclasses.field(default_factory=lambda: list(MODELS))
    """The models measured, in the order of the tables: MODELS, then those of the attention
    patterns (`CostSettings.models`)."""
    # The patterns' sizes (`CostSettings`); they matter where `models` has the patterns' Transformers.
    attention_window: int = CostSettings.attention_window
    attention_block: int = CostSettings.attention_block
    global_blocks: int = CostSettings.global_blocks
    random_blocks: int = CostSettings.random_blocks

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    def series(self, model: str, quantity: str) -> list[float | None]:
        """The values of `quantity` (one of QUANTITIES) for `model`, one per length."""
        if quantity in COUNTED:
            by_length = {c.length: getattr(c, quantity) for c in self.counts if c.model == model}
        else:
            kind, what = quantity.split("_")
            field = "seconds" if what == "time" else "peak_mib"
            by_length = {m.length: getattr(m, field) for m in self.measurements if m.model == model and m.kind == kind}
        return [by_length.get(t) for t in self.lengths]


MEMORY_METHOD = (
    "peak resident set (VmHWM) of a fresh forked process, reset after model, optimizer and warm-up, "
    "fixed mmap threshold 64 KiB; resolution one page (4 KiB)"
)
TIMING_METHOD = (
    f"fastest of `repeats` calls after an untimed one (a single call when `repeats` calls would take "
    f"over {CASE_BUDGET_S:g} s), the fastest of `passes` sweeps"
)


def _measure_or_skip(
    server: _Server,
    model: str,
    kind: str,
    t: int,
    settings: CostSettings,
    threads: int,
    failed: set[tuple[str, str]],
    last: dict[tuple[str, str], tuple[int, float]],
) -> dict:
    """The server's reply for one case, or {"died": why} without running it when a shorter length
    of the same model and kind did not fit, or when its peak, extrapolated quadratically from the
    last length measured, would exceed `settings.max_memory_mib`. Updates `failed` and `last`."""
    if (model, kind) in failed:
        return {"died": "a shorter length did not fit"}
    previous = last.get((model, kind))
    expected = previous[1] * (t / previous[0]) ** 2 if previous else 0.0
    if expected > settings.max_memory_mib:
        reply = {"died": f"skipped: about {expected:,.0f} MiB expected > max {settings.max_memory_mib:,.0f}"}
    else:
        reply = server.measure(model, kind, t, settings, threads)
    if "died" in reply:
        failed.add((model, kind))
    else:
        last[(model, kind)] = (t, reply["peak_mib"])
    return reply


def measure_cost(settings: CostSettings, *, threads: int = 1, progress: bool = False) -> CostResult:
    """Measure and count everything for `settings` on this CPU -> CostResult. Each case runs in a
    fresh process, one at a time, with `threads` torch threads. One by default: the question is how
    cost grows with t, not peak speed; batch-1 steps of width 64 gain little from a thread pool, and
    a pool stalls at every barrier when another process holds a core (docs/history.md: the note on
    threads at its top), which would bend the slopes.
    A case that would exceed `settings.max_memory_mib` or that dies (out of memory) is recorded as
    None, and the longer lengths of that model and kind are skipped.
    `progress` shows a tqdm bar on a terminal, one line per case on stderr otherwise (a log file)."""
    from tqdm.auto import tqdm

    if threads < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")
    cases = [(t, m, k) for t in settings.lengths for m in settings.models for k in KINDS]  # peers side by side
    show_bar = progress and sys.stderr.isatty()
    total = settings.passes * len(cases)
    bar = tqdm(total=total, disable=not show_bar, unit="case", dynamic_ncols=True, file=sys.stderr)
    failed: set[tuple[str, str]] = set()
    last: dict[tuple[str, str], tuple[int, float]] = {}  # (length, peak MiB) of the last measured case
    best: dict[tuple[str, str, int], Measurement] = {}
    server = _Server()
    try:
        for sweep in range(settings.passes):
            for t, model, kind in cases:
                bar.update()
                key = (model, kind, t)
                if sweep == 0:
                    reply = _measure_or_skip(server, model, kind, t, settings, threads, failed, last)
                elif best[key].seconds is None:
                    continue  # later passes repeat what the first could run
                else:
                    reply = server.measure(model, kind, t, settings, threads)
                m = Measurement(model, kind, t, reply.get("seconds"), reply.get("peak_mib"))
                if key in best and m.seconds is not None:
                    m = Measurement(
                        model, kind, t, min(best[key].seconds, m.seconds), min(best[key].peak_mib, m.peak_mib)
                    )
                best.setdefault(key, m)
                if m.seconds is not None:
                    best[key] = m
                if progress and not show_bar:
                    where = f"pass {sweep + 1}/{settings.passes}, " if settings.passes > 1 else ""
                    sys.stderr.write(f"cost: {where}{_case_line(m, reply.get('died'))}\n")
                    sys.stderr.flush()
    finally:
        bar.close()
        server.close()
    measurements = [best[(m, k, t)] for t, m, k in cases]
    counts = [
        Count(m, t, *count_steps(m, t, settings.layers, settings)) for m in settings.models for t in settings.lengths
    ]
    result = CostResult(
        date=date.today().isoformat(),
        device="cpu",
        machine=f"{platform.machine()} {platform.processor()}".strip(),
        threads=threads,
        torch=torch.__version__,
        lengths=list(settings.lengths),
        fit_lengths=list(settings.fit_lengths),
        width=settings.width,
        layers=settings.layers,
        heads=settings.heads,
        vocab=VOCAB,
        batch=1,
        repeats=settings.repeats,
        passes=settings.passes,
        max_memory_mib=settings.max_memory_mib,
        timing_method=TIMING_METHOD,
        memory_method=MEMORY_METHOD,
        measurements=measurements,
        counts=counts,
        table=[],
        models=list(settings.models),
        attention_window=settings.attention_window,
        attention_block=settings.attention_block,
        global_blocks=settings.global_blocks,
        random_blocks=settings.random_blocks,
    )
    result.table = fit_table(result)
    return result


def fit_table(result: CostResult) -> list[TableRow]:
    """One row per model and quantity: the theory beside the exponent fitted on those of
    `fit_lengths` that have a value (a case skipped for memory leaves its length out; a count that
    is an infinite path at one of them leaves no fit)."""
    rows = []
    for quantity in QUANTITIES:
        for model in result.models:
            series = zip(result.lengths, result.series(model, quantity), strict=True)
            # A missing reading leaves its length out; a missing count is an infinite path, which no
            # power of t fits (`fit_exponent` gives None).
            points = [(t, v) for t, v in series if t in result.fit_lengths and (v is not None or quantity in COUNTED)]
            lengths, values = [t for t, _ in points], [v for _, v in points]
            fitted = fit_exponent(lengths, values) if len(points) >= 2 else None
            theory = THEORY[(model, quantity)]
            rows.append(TableRow(model, quantity, theory.formula, theory.exponent, theory.source, fitted, lengths))
    return rows


def _case_line(m: Measurement, died: str | None) -> str:
    what = f"{MODEL_LABELS[m.model]} {m.kind} t={m.length}"
    if m.seconds is None:
        return f"{what}: not measured ({died})"
    return f"{what}: {m.seconds:.4f} s, {m.peak_mib:,.2f} MiB"
