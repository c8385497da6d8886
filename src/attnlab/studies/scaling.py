"""Scaling laws on your machine (Kaplan et al. 2020, "Scaling Laws for Neural Language Models").

A ladder of GPTs of growing size is trained on the same data for the same number of tokens, and
the validation loss of each against its non-embedding parameters N is fitted with

    L(N) = (N_c / N)^alpha            Kaplan et al. Eq. 1.1 (alpha_N = 0.076, N_c = 8.8e13)
    L(N) = E + (N_c / N)^alpha        with an irreducible loss E (as in Hoffmann et al. 2022)

by least squares on log L: the first is a straight line in log-log space; for the second, a 1-D
search over E (a grid, then golden-section refinement) with the straight-line fit of
log(L - E) inside. The better law is the one with the smaller residual standard error of log L,
sqrt(SSR / (n - p)) with p = 2 or 3 fitted numbers, so that E must pay for its extra degree of
freedom (with E >= 0 allowed to be 0, the three-number law never has the larger SSR).

Each size learns at Kaplan et al.'s Eq. D.1 rate, LR(N) = 0.003239 - 0.0001395 log N, decayed to a
tenth. Compute-optimal frontier: along each run's validation curve, compute C = 6 N D after D
tokens (Kaplan §2.1); at each budget C the size whose curve is lowest there is the compute-optimal
one among those whose runs reach C. (A point inside a run is not a run of that length with its
own schedule, Hoffmann et al. §3.1's caveat: the frontier is indicative.)

Layout: OUT/<LxC>/ (run folders), OUT/scale.csv, OUT/scale_fit.json.
"""

import dataclasses
import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from attnlab.config import flatten, load_preset_or_file, merge, nest
from attnlab.errors import UserError
from attnlab.fileio import atomic_write_text
from attnlab.models import GPT, GPTConfig
from attnlab.studies.measure import measure_run, non_embedding_parameters
from attnlab.studies.sweep import (
    Backend,
    PlannedRun,
    RunOutcome,
    eval_rows,
    run_all,
    si,
    steps_per_sec,
    text_table,
    validation_loss,
)
from attnlab.train.config import apply_overrides, resolve

KAPLAN_ALPHA_N = 0.076
"""Kaplan et al. 2020 Eq. 1.1: L(N) = (N_c / N)^0.076, N_c = 8.8e13, for models trained to convergence on WebText2."""
BASE_PRESET = "shakespeare-char-cpu"
# Six sizes from 12k to 790k non-embedding parameters (64x), 6M characters each (~6 epochs of Tiny
# Shakespeare, 8 to 480 tokens per parameter): sized so that the study takes minutes on a laptop
# CPU, 4x128 the longest run (docs/history.md, "A scaling law on this CPU").
DEFAULT_SIZES = ("1x32", "2x32", "2x48", "2x64", "3x96", "4x128")
DEFAULT_TOKENS = 6_000_000
HEAD_DIM = 16
LADDER_KEYS = ("model.n_layers", "model.d_model", "model.n_heads", "train.max_iters", "train.lr_decay_iters")
EVALS_PER_RUN = 16
"""Validation points along each run (besides step 0), for the compute frontier."""


@dataclass(frozen=True)
class LadderSize:
    """One rung: n_layers blocks of width d_model, heads of HEAD_DIM."""

    n_layers: int
    d_model: int

    @property
    def name(self) -> str:
        return f"{self.n_layers}x{self.d_model}"

    @property
    def n_heads(self) -> int:
        return self.d_model // HEAD_DIM


def parse_sizes(text: str | Sequence[str]) -> list[LadderSize]:
    """`"2x64,4x128"` (layers x width) -> the sizes; the width a multiple of 16 (heads of 16)."""
    items = [s.strip() for s in (text.split(",") if isinstance(text, str) else text) if s.strip()]
    sizes = []
    for item in items:
        match = re.fullmatch(r"(\d+)x(\d+)", item)
        if not match:
            raise UserError(f"size {item!r} is not LAYERSxWIDTH, e.g. 4x128")
        size = LadderSize(int(match.group(1)), int(match.group(2)))
        if size.n_layers < 1 or size.d_model < HEAD_DIM or size.d_model % HEAD_DIM:
            raise UserError(f"size {item!r}: at least 1 layer, and a width that is a multiple of {HEAD_DIM}")
        sizes.append(size)
    if len({s.name for s in sizes}) != len(sizes):
        raise UserError(f"the sizes {', '.join(items)} repeat one; give each once")
    if len(sizes) < 4:
        raise UserError(f"give at least 4 sizes (the law with E fits 3 numbers); got {len(sizes)}")
    return sizes


def kaplan_learning_rate(n: int) -> float:
    """Kaplan et al. 2020 Eq. D.1: the learning rate that suits a model of N non-embedding parameters."""
    return 0.003239 - 0.0001395 * math.log(n)


def non_embedding_count(model: GPTConfig) -> int:
    """N of a GPT config, counted on the model built with a one-token vocabulary (N does not
    depend on it; the ladder's sizes build in milliseconds, which the meta device does not: its
    first random init loads the compiler)."""
    return non_embedding_parameters(GPT(dataclasses.replace(model, vocab_size=1)))


def plan(
    sizes: Sequence[LadderSize],
    tokens: int,
    out: str | Path,
    *,
    data: str = "",
    overrides: Mapping[str, Any] | None = None,
    device: str | None = None,
) -> list[PlannedRun]:
    """One run per size on the same data (a text file; "" is the bundled Tiny Shakespeare), for
    `tokens` training tokens each. `overrides`: dotted config keys for every run (not the ones
    the ladder sets). Nothing is written."""
    overrides = dict(overrides or {})
    if tokens < 1:
        raise UserError(f"--tokens must be >= 1, got {tokens}")
    for key in overrides:
        if key in LADDER_KEYS:
            raise UserError(f"the ladder sets {key}; choose the sizes with --sizes and the budget with --tokens")
    if data and not Path(data).expanduser().is_file():
        raise UserError(f"corpus file {data} does not exist; --data takes a UTF-8 text file")
    _, base = load_preset_or_file(BASE_PRESET)
    extra = {"data.path": data} | ({"train.device": device} if device else {}) | overrides
    common = resolve(apply_overrides(base, nest(extra.items())))
    if common.task != "language-model":
        raise UserError(f"a scaling ladder trains language models; task {common.task!r} is not one")
    per_step = common.train.batch_size * common.train.gradient_accumulation_steps * common.model.block_size
    max_iters = max(1, math.ceil(tokens / per_step))
    runs = []
    for size in sizes:
        ladder = {
            "model.n_layers": size.n_layers,
            "model.d_model": size.d_model,
            "model.n_heads": size.n_heads,
            "train.max_iters": max_iters,
            "train.lr_decay_iters": max_iters,
            "train.warmup_iters": max(1, min(100, max_iters // 10)),
            "train.eval_interval": max(1, max_iters // EVALS_PER_RUN),
        }
        doc = apply_overrides(base, nest({**ladder, **extra}.items()))
        if "train.learning_rate" not in overrides:
            lr = kaplan_learning_rate(non_embedding_count(resolve(doc).model))
            doc = merge(doc, {"train": {"learning_rate": lr, "min_lr": lr / 10}})
        runs.append(PlannedRun(size.name, Path(out) / size.name, resolve(doc), flatten(doc)))
    return runs


@dataclass(frozen=True)
class PowerLaw:
    """L(N) = e + (n_c / N)^alpha, fitted by least squares on log L."""

    alpha: float
    n_c: float
    e: float
    ssr: float
    """Sum of squared residuals of log L."""
    n_fitted: int
    """Numbers fitted: 2 (alpha, N_c) or 3 (with E)."""
    n_points: int

    @property
    def rse(self) -> float:
        """Residual standard error of log L, sqrt(SSR / (n - p)): what picks the better law."""
        dof = self.n_points - self.n_fitted
        return math.sqrt(self.ssr / dof) if dof > 0 else math.inf  # no residual left: never the better law

    @property
    def law(self) -> str:
        return "L = (N_c/N)^alpha" if self.n_fitted == 2 else "L = E + (N_c/N)^alpha"

    def predict(self, n: Any) -> np.ndarray:
        return self.e + (self.n_c / np.asarray(n, dtype=np.float64)) ** self.alpha


def _line(log_n: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """Least-squares (slope, intercept) of y on log N."""
    a = np.stack([log_n, np.ones_like(log_n)], axis=1)
    (slope, intercept), *_ = np.linalg.lstsq(a, y, rcond=None)
    return float(slope), float(intercept)


def _with_offset(log_n: np.ndarray, log_l: np.ndarray, loss: np.ndarray, e: float) -> tuple[float, float, float]:
    """(alpha, N_c, SSR of log L) of the law with irreducible loss `e`: a line through log(L - e)."""
    slope, intercept = _line(log_n, np.log(loss - e))
    alpha = -slope
    log_n_c = intercept / alpha if alpha != 0 else math.inf
    n_c = math.exp(log_n_c) if log_n_c < 700 else math.inf  # a flat ladder (alpha ~ 0) has no scale
    pred = np.log(e + np.exp(intercept + slope * log_n))
    return alpha, n_c, float(np.sum((log_l - pred) ** 2))


def fit_power_law(n: Sequence[float], loss: Sequence[float]) -> PowerLaw:
    """L = (N_c/N)^alpha: log L = alpha log N_c - alpha log N, a straight line."""
    log_n, log_l = np.log(np.asarray(n, dtype=np.float64)), np.log(np.asarray(loss, dtype=np.float64))
    alpha, n_c, ssr = _with_offset(log_n, log_l, np.exp(log_l), 0.0)
    return PowerLaw(alpha, n_c, 0.0, ssr, 2, len(log_n))


def fit_power_law_with_offset(n: Sequence[float], loss: Sequence[float], grid: int = 400) -> PowerLaw:
    """L = E + (N_c/N)^alpha, 0 <= E < min L: the E whose line fit of log(L - E) leaves the least
    SSR of log L, found on a grid of `grid` values and refined by golden-section search."""
    loss_arr = np.asarray(loss, dtype=np.float64)
    log_n, log_l = np.log(np.asarray(n, dtype=np.float64)), np.log(loss_arr)
    top = float(loss_arr.min()) * (1 - 1e-9)

    def ssr(e: float) -> float:
        return _with_offset(log_n, log_l, loss_arr, e)[2]

    es = np.linspace(0.0, top, grid)
    values = [ssr(float(e)) for e in es]
    k = int(np.nanargmin(values))
    lo, hi = float(es[max(k - 1, 0)]), float(es[min(k + 1, grid - 1)])
    ratio = (math.sqrt(5) - 1) / 2
    a, b = hi - ratio * (hi - lo), lo + ratio * (hi - lo)
    fa, fb = ssr(a), ssr(b)
    for _ in range(200):  # the bracket shrinks by 0.618 a step: far below float resolution
        if fa < fb:
            hi, b, fb = b, a, fa
            a = hi - ratio * (hi - lo)
            fa = ssr(a)
        else:
            lo, a, fa = a, b, fb
            b = lo + ratio * (hi - lo)
            fb = ssr(b)
    e = min((float(es[k]), values[k]), (a, fa), (b, fb), key=lambda pair: pair[1])[0]
    alpha, n_c, residual = _with_offset(log_n, log_l, loss_arr, e)
    return PowerLaw(alpha, n_c, e, residual, 3, len(log_n))


def better_fit(fits: Sequence[PowerLaw]) -> PowerLaw:
    """The law with the smallest residual standard error (the simpler one on a tie)."""
    return min(fits, key=lambda f: (f.rse, f.n_fitted))


@dataclass(frozen=True)
class FrontierPoint:
    compute: float
    """Training FLOPs C = 6 N D."""
    size: str
    """The size whose validation loss is lowest at this compute."""
    non_embedding_params: int
    loss: float
    sizes_compared: int
    """How many sizes' runs reach this compute (at least 2)."""


def compute_frontier(
    curves: Mapping[str, tuple[int, Sequence[tuple[float, float]]]], budgets: int = 12
) -> list[FrontierPoint]:
    """`curves`: size -> (N, [(compute, validation loss), ...] in compute order). At `budgets`
    compute values spaced evenly in log C, the size with the lowest loss (interpolated linearly in
    log C) among the sizes whose curves cover that compute; budgets covered by fewer than two
    sizes are left out."""
    spans = {s: (pts[0][0], pts[-1][0]) for s, (_, pts) in curves.items() if len(pts) >= 2}
    if not spans:
        return []
    low, high = min(a for a, _ in spans.values()), max(b for _, b in spans.values())
    points = []
    for c in np.geomspace(low, high, budgets):
        losses = {}
        for size, (first, last) in spans.items():
            if first <= c <= last:
                compute, loss = zip(*curves[size][1], strict=True)
                losses[size] = float(np.interp(math.log(c), np.log(compute), loss))
        if len(losses) >= 2:
            best = min(losses, key=losses.__getitem__)
            points.append(FrontierPoint(float(c), best, curves[best][0], losses[best], len(losses)))
    return points


@dataclass(frozen=True)
class LadderRow:
    size: str
    n_layers: int
    d_model: int
    params: int
    non_embedding_params: int
    tokens: int
    learning_rate: float
    flops_per_token: float
    """Counted on a training step (forward + backward); compare 6 N."""
    val_loss: float
    """Over the whole validation split (every block, deterministic), last checkpoint."""
    steps_per_sec: float

    @property
    def tokens_per_param(self) -> float:
        return self.tokens / self.non_embedding_params


@dataclass
class ScaleResult:
    rows: list[LadderRow]
    fits: list[PowerLaw]
    frontier: list[FrontierPoint]
    curves: dict[str, tuple[int, list[tuple[float, float]]]]
    """Size -> (N, [(compute, validation loss)]) from the runs' metrics.csv."""
    outcomes: list[RunOutcome] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        return all(o.status in ("done", "trained") for o in self.outcomes)

    @property
    def chosen(self) -> PowerLaw:
        return better_fit(self.fits)


def run_scale(
    sizes: Sequence[LadderSize],
    tokens: int,
    out: str | Path,
    *,
    data: str = "",
    overrides: Mapping[str, Any] | None = None,
    jobs: int = 1,
    backend: Backend | None = None,
    device: str | None = None,
    log: Callable[[str], None] | None = None,
) -> ScaleResult:
    """Train (or finish) the ladder, evaluate every size on the validation split, fit both laws,
    find the frontier, and write OUT/scale.csv and OUT/scale_fit.json. A ladder stopped by a
    signal returns without rows. backend: where the runs train (`studies.sweep.run_all`; default
    this machine, `jobs` at a time)."""
    out = Path(out)
    runs = plan(sizes, tokens, out, data=data, overrides=overrides, device=device)
    # The largest first: with several jobs, the smaller runs fill the other processes meanwhile.
    by_cost = sorted(runs, key=lambda r: non_embedding_count(r.config.model), reverse=True)
    done = {o.name: o for o in run_all(by_cost, jobs=jobs, backend=backend, log=log)}
    outcomes = [done[r.name] for r in runs]
    result = ScaleResult([], [], [], {}, outcomes)
    if not result.complete:
        return result
    for run in runs:
        measure = measure_run(run.folder)
        c = run.config
        per_step = c.train.batch_size * c.train.gradient_accumulation_steps * c.model.block_size
        result.rows.append(
            LadderRow(
                run.name,
                c.model.n_layers,
                c.model.d_model,
                measure.params,
                measure.non_embedding_params,
                c.train.max_iters * per_step,
                c.train.learning_rate,
                measure.flops_per_token,
                validation_loss(run.folder),
                steps_per_sec(run.folder),
            )
        )
        n = measure.non_embedding_params
        points = [(6 * n * per_step * r["step"], r["val_loss"]) for r in eval_rows(run.folder) if r["step"] > 0]
        result.curves[run.name] = (n, points)
    n, loss = [r.non_embedding_params for r in result.rows], [r.val_loss for r in result.rows]
    result.fits = [fit_power_law(n, loss), fit_power_law_with_offset(n, loss)]
    result.frontier = compute_frontier(result.curves)
    write_results(result, out)
    return result


CSV_FIELDS = (
    "size",
    "n_layers",
    "d_model",
    "params",
    "non_embedding_params",
    "tokens",
    "tokens_per_param",
    "learning_rate",
    "flops_per_token",
    "six_n",
    "val_loss",
    "steps_per_sec",
)


def write_results(result: ScaleResult, out: Path) -> None:
    lines = [",".join(CSV_FIELDS)]
    for r in result.rows:
        values = [r.size, r.n_layers, r.d_model, r.params, r.non_embedding_params, r.tokens, r.tokens_per_param]
        values += [r.learning_rate, r.flops_per_token, 6 * r.non_embedding_params, r.val_loss, r.steps_per_sec]
        lines.append(",".join(f"{v:.6g}" if isinstance(v, float) else str(v) for v in values))
    atomic_write_text(out / "scale.csv", "\n".join(lines) + "\n")
    atomic_write_text(out / "scale_fit.json", json.dumps(fit_summary(result), indent=2) + "\n")


def fit_summary(result: ScaleResult) -> dict[str, Any]:
    """The fits, the choice and the frontier as plain data (scale_fit.json, `--json`)."""
    return {
        "fits": [
            {**dataclasses.asdict(f), "law": f.law, "rse": f.rse, "log10_n_c": math.log10(f.n_c)} for f in result.fits
        ],
        "chosen": result.chosen.law,
        "chosen_by": "smallest residual standard error of log L, sqrt(SSR / (n - p)), p = numbers fitted",
        "kaplan_alpha_n": KAPLAN_ALPHA_N,
        "tokens": result.rows[0].tokens if result.rows else 0,
        "tokens_per_param": {r.size: r.tokens_per_param for r in result.rows},
        "points": [{"size": r.size, "n": r.non_embedding_params, "val_loss": r.val_loss} for r in result.rows],
        "frontier": [dataclasses.asdict(p) for p in result.frontier],
    }


def format_report(result: ScaleResult) -> str:
    """The ladder, the fits beside Kaplan et al.'s alpha_N, and the frontier, as text."""
    header = ["size", "N (non-emb.)", "params", "tokens/N", "FLOPs/token", "6N", "lr", "val loss", "steps/s"]
    rows = [
        [
            r.size,
            f"{r.non_embedding_params:,}",
            si(r.params),
            f"{r.tokens_per_param:.1f}",
            si(r.flops_per_token),
            si(6 * r.non_embedding_params),
            f"{r.learning_rate:.2e}",
            f"{r.val_loss:.4f}",
            f"{r.steps_per_sec:.1f}",
        ]
        for r in result.rows
    ]
    lines = text_table(header, rows)
    n = [r.non_embedding_params for r in result.rows]
    lines.append(f"\n{result.rows[0].tokens:,} tokens per size; N spans {max(n) / min(n):.0f}x")
    for f in result.fits:
        mark = "  <- chosen (smaller residual standard error of log L)" if f is result.chosen else ""
        e = f", E = {f.e:.4f}" if f.n_fitted == 3 else ""
        lines.append(
            f"{f.law}: alpha = {f.alpha:.4f}, N_c = {f.n_c:.3g}{e}; rse {f.rse:.2e} (SSR {f.ssr:.2e}, "
            f"{f.n_points} points, {f.n_fitted} fitted){mark}"
        )
    tpp = [r.tokens_per_param for r in result.rows]
    tokens = result.rows[0].tokens
    lines.append(
        f"alpha = {result.chosen.alpha:.3f} here vs Kaplan et al. 2020's alpha_N = {KAPLAN_ALPHA_N} (models trained "
        f"near convergence on WebText2's 23B tokens); here {tokens:,} tokens, {min(tpp):.1f} to {max(tpp):.0f} "
        "per parameter"
    )
    if result.frontier:
        lines.append("compute-optimal frontier (lowest validation loss at each compute C = 6 N D):")
        table = [[f"{p.compute:.2e}", p.size, f"{p.loss:.4f}", str(p.sizes_compared)] for p in result.frontier]
        lines += ["  " + line for line in text_table(["C (FLOPs)", "best size", "val loss", "sizes"], table)]
    else:
        lines.append("compute-optimal frontier: no compute budget is reached by two sizes' curves")
    return "\n".join(lines)
