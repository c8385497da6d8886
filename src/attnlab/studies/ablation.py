"""Ablations: do Transformer modifications transfer? (Narang et al. 2021, "Do Transformer
Modifications Transfer Across Implementations and Applications?")

A spec names a base configuration (a preset or a TOML file), overrides for every run, and named
variants, each a few overrides of the model. Every variant is trained the same way (data, steps,
batch, schedule, evaluation), with S seeds each, and the table reports the paper's columns:
parameters, training FLOPs per token (counted on a real step, `studies.measure`), steps per second,
the validation loss early (at a quarter of training) and at the end (mean ± sd over seeds), and
the task's downstream metric. The runs are ordinary run folders, trained resumably by
`studies.sweep`.

    # shakespeare.toml
    base = "shakespeare-char-cpu"
    seeds = 3
    [set]                                    # every run
    "train.max_iters" = 400
    [variants.vanilla]
    set = { "model.activation" = "relu" }
    [variants.swiglu]
    set = { "model.activation" = "swiglu" }

Layout: OUT/<variant>/seed<k>/ (seed k trains with train.seed = base seed + k), OUT/ablation.csv.
"""

import dataclasses
import json
import math
import re
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attnlab.config import close_matches, flatten, load_preset_or_file, nest, presets
from attnlab.errors import ConfigError, UserError
from attnlab.fileio import atomic_write_text
from attnlab.studies.measure import measure_run
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
from attnlab.train.config import RunConfig, apply_overrides, read_config, resolve

SPECS_FOLDER = "presets/ablations"
SPEC_KEYS = ("base", "description", "seeds", "set", "variants")
VARIANT_KEYS = ("description", "set")
# A variant changes the model, never what it is trained on or for how long: with other data or
# another budget the comparison would be unfair (Narang et al. 2021 §2 train every variant alike).
FIXED_KEYS = (
    "task",
    "format_version",
    "model.block_size",
    "model.max_len",
    "train.max_iters",
    "train.batch_size",
    "train.gradient_accumulation_steps",
    "train.learning_rate",
    "train.min_lr",
    "train.warmup_iters",
    "train.lr_decay_iters",
    "train.decay_lr",
    "train.schedule",
    "train.seed",
    "train.eval_interval",
    "train.eval_iters",
)
VARIANT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]*")
# The downstream metric of the table: the first of these the runs log, else perplexity from the loss.
DOWNSTREAM = ("val_accuracy", "val_bleu", "val_ppl")


@dataclass(frozen=True)
class Variant:
    name: str
    overrides: dict[str, Any]
    """Dotted config keys and their values, e.g. {"model.activation": "swiglu"}."""
    description: str = ""


@dataclass(frozen=True)
class AblationSpec:
    name: str
    """The spec's name (its preset name or file stem): the default output folder's."""
    base_doc: dict[str, Any]
    """The base configuration's TOML document (a preset or a file)."""
    common: dict[str, Any]
    """Dotted overrides applied to every run."""
    variants: tuple[Variant, ...]
    seeds: int = 3
    description: str = ""


def select_variants(spec: AblationSpec, names: Sequence[str]) -> AblationSpec:
    """The spec with the variants `names` alone, in the spec's order (`attnlab ablate --variants`);
    a name the spec lacks is a ConfigError with a did-you-mean."""
    known = [v.name for v in spec.variants]
    for name in names:
        if name not in known:
            raise ConfigError(
                f"the spec {spec.name!r} has no variant {name!r}{close_matches(name, known)}; "
                f"its variants: {', '.join(known)}"
            )
    return dataclasses.replace(spec, variants=tuple(v for v in spec.variants if v.name in names))


def ablation_specs() -> list[str]:
    """Names of the ablation specs shipped with attnlab (`attnlab/presets/ablations/*.toml`)."""
    return presets(SPECS_FOLDER)


def load_spec(name: str) -> AblationSpec:
    """A shipped spec by exact name, or a spec file by path (a relative `base` path is read from
    the spec's folder)."""
    stem, doc = load_preset_or_file(name, SPECS_FOLDER, "ablation spec")
    base_dir = Path(name).parent if name.endswith(".toml") or Path(name).is_file() else Path.cwd()
    return parse_spec(doc, stem, base_dir)


def parse_spec(doc: dict[str, Any], name: str, base_dir: Path = Path(".")) -> AblationSpec:
    """Check a spec's document and read its base configuration. `ConfigError` on an unknown key,
    a missing or ill-typed entry, or a variant that changes the data or the budget."""
    _check_keys(doc, SPEC_KEYS, "the spec")
    base = doc.get("base")
    if not isinstance(base, str) or not base:
        raise ConfigError(
            'the spec needs base = "PRESET" or base = "file.toml": the configuration every variant starts from'
        )
    if base.endswith(".toml") and not Path(base).is_absolute():
        base = str(base_dir / base)
    _, base_doc = load_preset_or_file(base)
    seeds = doc.get("seeds", 3)
    if not isinstance(seeds, int) or isinstance(seeds, bool) or seeds < 1:
        raise ConfigError(f"seeds must be an integer >= 1, got {seeds!r}")
    variants_doc = doc.get("variants")
    if not isinstance(variants_doc, dict) or not variants_doc:
        raise ConfigError('the spec has no variants; add [variants.NAME] tables with set = { "model.KEY" = VALUE }')
    variants = []
    for vname, vdoc in variants_doc.items():
        if not VARIANT_NAME.fullmatch(vname):
            raise ConfigError(f"variant name {vname!r} is not a folder name: use letters, digits and _ . + -")
        if not isinstance(vdoc, dict):
            raise ConfigError(f"[variants.{vname}] must be a table with set = {{ ... }}")
        _check_keys(vdoc, VARIANT_KEYS, f"[variants.{vname}]")
        overrides = _dotted(vdoc.get("set", {}), f"[variants.{vname}] set")
        for key in overrides:
            if key.startswith("data.") or key in FIXED_KEYS:
                raise ConfigError(
                    f"variant {vname!r} sets {key}: a variant may not change the data or the training budget "
                    "(steps, batch, block size, learning-rate schedule, gradient accumulation, seed, evaluation), "
                    "or the comparison would be unfair; set it in the spec's [set] table for every variant"
                )
        variants.append(Variant(vname, overrides, str(vdoc.get("description", ""))))
    common = _dotted(doc.get("set", {}), "[set]")
    return AblationSpec(name, base_doc, common, tuple(variants), seeds, str(doc.get("description", "")))


def _check_keys(doc: dict[str, Any], allowed: Sequence[str], where: str) -> None:
    for key in doc:
        if key not in allowed:
            raise ConfigError(
                f"unknown key {key!r} in {where}{close_matches(key, allowed)}; it accepts {', '.join(allowed)}"
            )


def _dotted(table: Any, where: str) -> dict[str, Any]:
    """A table of overrides as dotted keys: `{"model.activation": "relu"}` and `{model = {activation =
    "relu"}}` (TOML's unquoted dotted keys) both give {"model.activation": "relu"}."""
    if not isinstance(table, dict):
        raise ConfigError(f'{where} must be a table of "section.key" = value overrides')
    return flatten(table)


def variant_doc(base: dict[str, Any], variant: Variant, extra: dict[str, Any]) -> dict[str, Any]:
    """The configuration document of one run: `base` (the base configuration with the spec's
    [set]), the variant's overrides, then `extra` (dotted keys: the seed, what --data-dir and
    --device set)."""
    doc = apply_overrides(base, nest(variant.overrides.items()))
    return apply_overrides(doc, nest(extra.items()))


def plan(
    spec: AblationSpec,
    out: str | Path,
    *,
    seeds: int | None = None,
    data_dir: str | None = None,
    device: str | None = None,
) -> list[PlannedRun]:
    """Every run of the study, each config resolved and checked (nothing is written): a bad
    override, data that cannot be found, or a budget without an evaluation at a quarter of
    training is a `UserError` here, before any run starts. Seed k trains with train.seed = the
    base's seed + k."""
    out = Path(out)
    seeds = spec.seeds if seeds is None else seeds
    if seeds < 1:
        raise UserError(f"--seeds must be >= 1, got {seeds}")
    base = apply_overrides(spec.base_doc, nest(spec.common.items()))
    common = _resolve(base, "the base with the spec's [set]")
    extra = _data_settings(common, data_dir) | ({"train.device": device} if device else {})
    check_early_evaluation(common)
    check_data(_resolve(apply_overrides(base, nest(extra.items())), "--data-dir"))
    runs = []
    for variant in spec.variants:
        for k in range(seeds):
            doc = variant_doc(base, variant, {**extra, "train.seed": common.train.seed + k})
            config = _resolve(doc, f"variant {variant.name!r}")
            runs.append(PlannedRun(f"{variant.name}/seed{k}", out / variant.name / f"seed{k}", config, flatten(doc)))
    return runs


def _resolve(doc: dict[str, Any], where: str) -> RunConfig:
    try:
        return resolve(doc)
    except ConfigError as e:
        raise ConfigError(f"{where}: {e}") from None


def _data_settings(config: RunConfig, data_dir: str | None) -> dict[str, Any]:
    """What --data-dir sets: data.data_dir for tasks that read a folder; for a corpus file
    (data.path, a language model), the spec's relative path is read from that folder."""
    if not data_dir:
        return {}
    folder = Path(data_dir).expanduser()
    if not folder.is_dir():
        raise UserError(f"--data-dir {data_dir} is not a folder")
    if hasattr(config.data, "data_dir"):
        return {"data.data_dir": str(folder)}
    path = getattr(config.data, "path", None)
    if path and not Path(path).is_absolute():
        return {"data.path": str(folder.resolve() / path)}
    raise UserError(
        f"--data-dir is for specs whose data is a folder (data.data_dir) or a relative data.path; "
        f"this {config.task!r} spec reads {path or 'its bundled corpus'}"
    )


def check_data(config: RunConfig) -> None:
    """A `UserError` when the data a config names is missing (checked before any run starts)."""
    path = getattr(config.data, "path", "")
    if path and not Path(path).expanduser().is_file():
        raise UserError(f"corpus file {path} does not exist; give --data-dir FOLDER (the folder that holds it)")
    folder = getattr(config.data, "data_dir", None)
    if folder == "":
        raise UserError(f"this {config.task!r} spec reads a data folder: pass --data-dir FOLDER")
    if folder is not None and not Path(folder).expanduser().is_dir():
        raise UserError(f"data folder {folder!r} does not exist; pass --data-dir FOLDER")


def check_early_evaluation(config: RunConfig) -> None:
    """The early loss is the validation loss after a quarter of the steps, so an evaluation must
    fall there: max_iters a multiple of 4 and eval_interval dividing max_iters / 4."""
    tc = config.train
    quarter, rest = divmod(tc.max_iters, 4)
    if quarter == 0 or rest or quarter % tc.eval_interval:
        raise UserError(
            f"the early loss is measured at 1/4 of training, so train.max_iters ({tc.max_iters}) must be a "
            f"positive multiple of 4 and train.eval_interval ({tc.eval_interval}) must divide max_iters / 4; "
            f"set both in the spec's [set] table"
        )


@dataclass(frozen=True)
class AblationRow:
    """One line of the table: a variant, measured on its seed-0 model, its losses over seeds."""

    variant: str
    params: int
    flops_per_token: float
    steps_per_sec: float
    early_loss: float
    early_loss_sd: float
    final_loss: float
    final_loss_sd: float
    metric: str
    """The downstream metric's name: val_accuracy, val_bleu, or val_ppl (exp of the loss)."""
    metric_value: float
    metric_sd: float
    seeds: int


@dataclass
class AblationResult:
    rows: list[AblationRow]
    """One per variant, in the spec's order; empty until every run has finished."""
    curves: dict[str, tuple[list[int], list[float]]]
    """Variant -> (steps, validation loss averaged over seeds)."""
    outcomes: list[RunOutcome] = field(default_factory=list)
    steps: int = 0
    tokens_per_step: int = 0

    @property
    def complete(self) -> bool:
        return all(o.status in ("done", "trained") for o in self.outcomes)


def run_ablation(
    spec: AblationSpec,
    out: str | Path,
    *,
    seeds: int | None = None,
    jobs: int = 1,
    backend: Backend | None = None,
    data_dir: str | None = None,
    device: str | None = None,
    log: Callable[[str], None] | None = None,
) -> AblationResult:
    """Train (or finish) every run of the study, then summarise it and write OUT/ablation.csv.
    When a signal stopped the runs, the result has no rows and nothing is summarised. backend: where
    the runs train (`studies.sweep.run_all`; default this machine, `jobs` at a time)."""
    out = Path(out)
    runs = plan(spec, out, seeds=seeds, data_dir=data_dir, device=device)
    outcomes = run_all(runs, jobs=jobs, backend=backend, log=log)
    result = AblationResult([], {}, outcomes, runs[0].config.train.max_iters, _tokens_per_step(runs[0].config))
    if not result.complete:
        return result
    by_variant: dict[str, list[Path]] = {}
    for run in runs:
        by_variant.setdefault(run.name.split("/")[0], []).append(run.folder)
    result.rows = [summarize(name, folders, result.steps) for name, folders in by_variant.items()]
    result.curves = {name: mean_curve(folders) for name, folders in by_variant.items()}
    write_csv(result.rows, out / "ablation.csv")
    return result


def _tokens_per_step(config: RunConfig) -> int:
    block = getattr(config.model, "block_size", None) or getattr(config.model, "max_len", 0)
    return config.train.batch_size * config.train.gradient_accumulation_steps * block


def summarize(variant: str, folders: Sequence[Path], max_iters: int) -> AblationRow:
    """A variant's line from its finished seeds' run folders."""
    early, final, downstream, speeds = [], [], [], []
    metric = ""
    for folder in folders:
        evals = {int(r["step"]): r for r in eval_rows(folder)}
        early.append(evals.get(max_iters // 4, {}).get("val_loss", math.nan))
        last = evals.get(max_iters, {})
        final.append(_final_loss(folder, last))
        metric = next((m for m in DOWNSTREAM if m in last), "val_ppl")
        downstream.append(last[metric] if metric in last else math.exp(final[-1]))
        speeds.append(steps_per_sec(folder))
    measure = measure_run(folders[0])
    return AblationRow(
        variant,
        measure.params,
        measure.flops_per_token,
        statistics.fmean(speeds),
        *_mean_sd(early),
        *_mean_sd(final),
        metric,
        *_mean_sd(downstream),
        len(folders),
    )


FINAL_EVAL_TOKENS = 200_000
"""A language model's final loss is measured on its validation split's first this many tokens."""
FINAL_EVAL_FILE = "final_eval.json"


def _final_loss(folder: Path, last_eval: dict[str, float]) -> float:
    """The final validation loss: for a language model over a fixed FINAL_EVAL_TOKENS of the
    validation split (the trainer's estimate from a few random batches adds its own noise to the
    seed spread); for other tasks the last evaluation's."""
    if read_config(folder).task != "language-model":
        return last_eval.get("val_loss", math.nan)
    # Kept beside the run: a finished study's table is asked for again (every resumed call).
    saved = folder / FINAL_EVAL_FILE
    key = {"max_tokens": FINAL_EVAL_TOKENS, "step": int(last_eval.get("step", -1))}
    if saved.exists():
        record = json.loads(saved.read_text())
        if {k: record.get(k) for k in key} == key:
            return record["val_loss"]
    loss = validation_loss(folder, max_tokens=FINAL_EVAL_TOKENS)
    atomic_write_text(saved, json.dumps(key | {"val_loss": loss}) + "\n")
    return loss


def _mean_sd(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (nan for a single value)."""
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else math.nan


def mean_curve(folders: Sequence[Path]) -> tuple[list[int], list[float]]:
    """(steps, validation loss averaged over the runs) at the steps every run evaluated."""
    per_run = [{int(r["step"]): r["val_loss"] for r in eval_rows(f) if "val_loss" in r} for f in folders]
    steps = sorted(set.intersection(*(set(p) for p in per_run)))
    return steps, [statistics.fmean(p[s] for p in per_run) for s in steps]


CSV_FIELDS = (
    "variant",
    "params",
    "flops_per_token",
    "steps_per_sec",
    "early_loss",
    "early_loss_sd",
    "final_loss",
    "final_loss_sd",
)


def write_csv(rows: Sequence[AblationRow], path: Path) -> None:
    """The table as CSV: the columns of CSV_FIELDS, then the metric's (e.g. val_ppl, val_ppl_sd), then seeds."""
    metric = rows[0].metric if rows else "metric"
    lines = [",".join([*CSV_FIELDS, metric, f"{metric}_sd", "seeds"])]
    for r in rows:
        values = [r.variant, r.params, r.flops_per_token, r.steps_per_sec, r.early_loss, r.early_loss_sd]
        values += [r.final_loss, r.final_loss_sd, r.metric_value, r.metric_sd, r.seeds]
        lines.append(",".join(_csv_value(v) for v in values))
    atomic_write_text(path, "\n".join(lines) + "\n")


def _csv_value(v: Any) -> str:
    return f"{v:.6g}" if isinstance(v, float) else str(v)


def format_table(result: AblationResult) -> str:
    """The table as text, in Narang et al. 2021's columns."""
    rows = result.rows
    metric = rows[0].metric.replace("_", " ") if rows else "metric"
    header = ["variant", "params", "FLOPs/token", "steps/s", "early loss", "final loss", metric]
    lines = [
        [
            r.variant,
            si(r.params),
            si(r.flops_per_token),
            f"{r.steps_per_sec:.1f}",
            f"{r.early_loss:.3f}",
            _pm(r.final_loss, r.final_loss_sd, 3),
            _pm(r.metric_value, r.metric_sd, 3 if r.metric_value < 10 else 1),
        ]
        for r in rows
    ]
    text = text_table(header, lines)
    seeds = rows[0].seeds if rows else 0
    text.append(
        f"{seeds} seed(s) per variant, {result.steps} steps of {result.tokens_per_step} tokens; losses on validation "
        f"(early: the trainer's estimate at step {result.steps // 4}; final: a language model's first "
        f"{FINAL_EVAL_TOKENS:,} validation tokens, other tasks' last evaluation); FLOPs counted on one training "
        "step; params and FLOPs of the seed-0 model; "
        "steps/s over training time, comparable between runs trained with the same --jobs on the same machine"
    )
    return "\n".join(text)


def _pm(mean: float, sd: float, digits: int) -> str:
    return f"{mean:.{digits}f}" + ("" if math.isnan(sd) else f" ± {sd:.{digits}f}")
