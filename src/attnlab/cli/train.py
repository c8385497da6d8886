"""attnlab train PRESET_OR_TOML [--set key=value ...] [--out DIR] [--resume] [--nproc N [--strategy S]]
[--seeds N [--backend ray [--address ADDR]]]

Calls `attnlab.train.train` on the config `attnlab.train.resolve` builds (--seeds: once per seed)."""

import argparse
import shlex
import sys
import textwrap
from pathlib import Path

from attnlab.cli import check_overrides, positive_int
from attnlab.cli.arguments import (
    add_backend_arguments,
    add_data_dir_argument,
    add_device_argument,
    add_json_argument,
)
from attnlab.config import presets
from attnlab.families import CAUSAL_LM, ENCODER, names
from attnlab.names import OLD_TASKS, TASK_KINDS
from attnlab.sources import takes_words


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "train",
        help="train a model from a preset or a TOML config",
        description=_fill(
            "Train a model from a preset name (e.g. shakespeare-char-cpu) or a TOML config file. "
            "The run folder gets config.toml, model.safetensors, tokenizer.json, train_state.pt and metrics.csv, "
            "and checkpoints/ (the newest train.keep_last checkpoints). SIGINT or SIGTERM: the run finishes its "
            "step, saves a checkpoint and exits 0 with the command that continues it."
        ),
        epilog=_fill(f"presets: {', '.join(presets())}") + "\n\n" + _fill(_tasks_line()),
        formatter_class=argparse.RawDescriptionHelpFormatter,  # so that no preset name is cut at a hyphen
    )
    p.add_argument(
        "config",
        metavar="PRESET_OR_TOML",
        help="a preset name, a path to a .toml file, or a run folder (its config.toml; the run folder is then "
        "--out: attnlab train RUN --resume)",
    )
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config value, e.g. --set train.max_iters=500 (repeatable)",
    )
    p.add_argument("--out", type=Path, help="run folder (default: runs/<preset name>)")
    p.add_argument("--resume", action="store_true", help="continue the run in --out from its last checkpoint")
    add_data_dir_argument(p, "e.g. a Multi30k folder")
    p.add_argument(
        "--init-from",
        metavar="FOLDER",
        help="fine-tune a pre-trained model (sets data.init_from): a language model from "
        + takes_words((CAUSAL_LM,)).replace("a run folder", "an attnlab language-model run folder", 1)
        + "; an encoder task from an attnlab run or a Hugging Face "
        + names(ENCODER)
        + " folder",
    )
    add_device_argument(p, sets_config=True)
    _add_process_arguments(p)
    _add_seeds_arguments(p)
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    add_json_argument(p)
    p.set_defaults(run=run, check=check)


def _add_process_arguments(p: argparse.ArgumentParser) -> None:
    """--nproc and --strategy: training in several processes."""
    p.add_argument(
        "--nproc",
        type=positive_int,
        metavar="N",
        help="train in N processes on this machine (distributed data parallel: gloo on CPU, nccl with one "
        "GPU per process): launches torchrun with the same arguments; train.batch_size is the global batch",
    )
    p.add_argument(
        "--strategy",
        choices=("ddp", "fsdp"),
        default="ddp",
        metavar="NAME",  # (the choices are in the help; a long metavar would widen every option's column)
        help="with --nproc: ddp (default) keeps a whole copy of the model and its optimizer state in every "
        "process; fsdp shards weights, gradients and optimizer state across the processes (PyTorch's "
        "fully_shard), for a model whose training state does not fit one device. Checkpoints are the same files",
    )


def _add_seeds_arguments(p: argparse.ArgumentParser) -> None:
    """--seeds and --eval-split: one config trained with several seeds."""
    p.add_argument(
        "--seeds",
        type=positive_int,
        metavar="N",
        help="train N runs with seeds train.seed, train.seed+1, ... into OUT/seed-S (one after another, or at once "
        "with --backend ray), and print "
        "the mean ± sd of their scores (the validation score: the best of the task's selection metric, a language "
        "model's last; and each run's best weights on --eval-split)",
    )
    p.add_argument(
        "--eval-split",
        metavar="SPLIT",
        help="with --seeds: the split each run's best weights are evaluated on (default: the task's reported "
        "split, test for node classification and the image and audio tasks; none for the others)",
    )
    add_backend_arguments(p)  # with --seeds: the seeds' runs as a sweep (on Ray, all at once)


def check(args: argparse.Namespace) -> None:
    """Before PyTorch is imported: the preset or file exists and is TOML with a run's top-level
    keys, each of its sections' keys and each --set key is one that some task accepts."""
    from attnlab.config import check_run_keys, load_preset_or_file
    from attnlab.names import check_section_keys

    doc = load_preset_or_file(args.config)[1]
    check_run_keys(doc)
    check_section_keys(doc)
    check_overrides(args.overrides)
    if args.init_from:
        _check_init_from(args.init_from)


def _check_init_from(path: str) -> None:
    """A --init-from that is no checkpoint at all (missing, or a file or folder of another kind),
    refused before PyTorch is imported; which families the run's task takes is checked once the
    task is known."""
    from attnlab import sources

    source = sources.what_is(path)
    if source.form in (sources.MISSING, sources.OTHER_FILE, sources.OTHER_FOLDER):
        sources.refuse(path, "train --init-from")


def _default_out(config: str, name: str) -> Path:
    """A run folder given as the config is its own --out (`attnlab train RUN --resume`); else runs/NAME."""
    return Path(config) if Path(config).is_dir() else Path("runs") / name


def _tasks_line() -> str:
    """The tasks and each one's model kinds, as a config names them (`task`, `model.kind`)."""
    tasks = "; ".join(f"{task} ({', '.join(kinds)})" if kinds else task for task, kinds in TASK_KINDS.items())
    return f"tasks (model kinds): {tasks}. Older task names are still read: {', '.join(OLD_TASKS)}."


def _fill(text: str) -> str:
    return textwrap.fill(text, width=90, break_on_hyphens=False, break_long_words=False)


def run(args: argparse.Namespace) -> int:
    from attnlab.config import load_preset_or_file, parse_overrides
    from attnlab.device import resolve_device
    from attnlab.errors import UserError
    from attnlab.train import resolve, train
    from attnlab.train.config import apply_overrides
    from attnlab.train.distributed import launch, preflight, ranks_from_environment
    from attnlab.train.signals import StopRequest
    from attnlab.train.trainer import check_run_dir

    if args.strategy == "fsdp" and args.nproc is None and not ranks_from_environment().launched:
        raise UserError("--strategy fsdp shards the model across processes: add --nproc N (N >= 2)")
    name, doc = load_preset_or_file(args.config)
    overrides = parse_overrides(args.overrides)
    if args.device:
        overrides.setdefault("train", {})["device"] = args.device
    if args.data_dir:
        overrides.setdefault("data", {})["data_dir"] = args.data_dir
    config = resolve(apply_overrides(doc, overrides))
    if args.data_dir and not hasattr(config.data, "data_dir"):
        raise UserError(f"--data-dir is for tasks that read a data folder; a {config.task!r} run reads data.path")
    if args.init_from:
        if not hasattr(config.data, "init_from"):
            raise UserError(
                "--init-from is for language models and the encoder tasks (text-classification, "
                f"token-classification, masked-lm), not a {config.task!r} run"
            )
        overrides.setdefault("data", {})["init_from"] = args.init_from
        config = resolve(apply_overrides(doc, overrides))
    out = args.out if args.out is not None else _default_out(args.config, name)
    if args.eval_split and args.seeds is None:
        raise UserError("--eval-split goes with --seeds; evaluate a single run with `attnlab eval RUN --split SPLIT`")
    if (args.backend != "local" or args.address is not None) and args.seeds is None:
        raise UserError("--backend and --address go with --seeds (the runs of a series); a single run trains here")
    if args.seeds is not None:
        if args.nproc is not None:
            raise UserError("--seeds trains its runs one after another in this process; drop --nproc")
        return _train_seeds(args, config, out)
    ranks = ranks_from_environment()
    if args.nproc is not None and not ranks.launched:
        preflight(config, args.nproc, resolve_device(config.train.device), args.strategy)
        check_run_dir(out, args.resume)
        return launch(args.nproc, _without_nproc(args.argv))
    if args.nproc is not None and args.nproc != ranks.world_size:
        raise UserError(f"--nproc {args.nproc}, but torchrun started {ranks.world_size} processes; drop --nproc")
    try:
        # SIGINT/SIGTERM: finish the step, save, and say how to go on (a second signal stops at once).
        with StopRequest() as stop:
            progress = not args.quiet and not args.json
            result = train(config, out, resume=args.resume, progress=progress, stop=stop, strategy=args.strategy)
    except UserError:
        if ranks.is_main:
            raise
        return 2  # rank 0 reports the same error; one line for the job, not one per process
    if not ranks.is_main:
        return 0
    _print_result(args, result, out, ranks)
    return 0


def _print_result(args: argparse.Namespace, result, out: Path, ranks) -> None:
    """Rank 0's last words: how to continue a stopped run, then the summary (one line, or --json)."""
    if result.stopped_by is not None:
        sys.stderr.write(
            f"attnlab train: stopped at step {result.step} ({result.stopped_by}); checkpoint saved, "
            f"continue with: {resume_command(args, out, ranks.world_size if ranks.launched else None)}\n"
        )
    summary = {
        "run": str(result.run_dir),
        "step": result.step,
        **result.metrics,
        "elapsed_sec": round(result.elapsed_sec, 2),
        "tokens_per_sec": round(result.tokens_per_sec, 1),
        "compiled": result.compiled,
        "dtype": result.dtype,
        "stopped_by": result.stopped_by,
        "resumed_from": result.resumed_from,
        "new_steps": result.step - (result.resumed_from or 0),
    }
    if args.json:
        from attnlab.cli import print_json

        print_json(summary)
    elif result.stopped_by is None:  # a stopped run's one line is the one above
        new = "" if result.resumed_from is None else f", {result.step - result.resumed_from} of them new,"
        print(
            f"trained {result.step} steps{new} in {result.elapsed_sec:.1f}s ({result.tokens_per_sec:,.0f} tokens/s"
            + (", compiled" if result.compiled else "")
            + "): "
            + ", ".join(f"{k.replace('_', ' ')} {v:.4f}" for k, v in result.metrics.items())
            + f". Run folder: {result.run_dir}"
        )


def _train_seeds(args: argparse.Namespace, config, out: Path) -> int:
    """--seeds N: the runs one after another (or on Ray, at once), then their scores as mean ± sd."""
    from attnlab.studies.seeds import mean_sd, seed_folder, train_seeds
    from attnlab.tasks import TASKS
    from attnlab.train.signals import StopRequest

    task = TASKS[config.task]
    split = args.eval_split or getattr(task, "report_split", None)
    if args.backend != "local" or args.address is not None:  # (make_backend refuses --address without ray)
        from attnlab.studies.backends import make_backend
        from attnlab.studies.seeds import train_seeds_on

        backend = make_backend(args.backend, address=args.address)
        log = None if args.quiet or args.json else (lambda line: print(line, file=sys.stderr, flush=True))
        runs = train_seeds_on(backend, config, out, args.seeds, split=split, resume=args.resume, log=log)
    else:
        with StopRequest() as stop:
            progress = not args.quiet and not args.json
            runs = train_seeds(config, out, args.seeds, split=split, resume=args.resume, progress=progress, stop=stop)
    rows = _seed_rows(runs, task, split)
    scores = list(dict.fromkeys(k for row in rows for k in row if k not in ("seed", "run", "step")))
    # A run stopped before it was evaluated has no score: the mean is over the runs that have one.
    summary = {k: mean_sd([float(row[k]) for row in rows if k in row]) for k in scores}
    stopped = runs[-1].result.stopped_by
    if stopped is not None:
        sys.stderr.write(
            f"attnlab train: stopped during seed {runs[-1].seed} ({stopped}); continue the series with: "
            f"{resume_command(args, out)}\n"
        )
    if args.json:
        from attnlab.cli import print_json

        print_json(
            {
                "runs": rows,
                "seeds": len(rows),
                "mean": {k: m for k, (m, _) in summary.items()},
                "sd": {k: sd for k, (_, sd) in summary.items()},
                "stopped_by": stopped,
            }
        )
        return 0
    for row in rows:
        print(
            f"seed {row['seed']}: "
            + ", ".join(f"{k.replace('_', ' ')} {row[k]:.4f}" for k in scores if k != "elapsed_sec" and k in row)
            + f" (step {row['step']}, {row['elapsed_sec']:.1f}s)"
        )
    print(
        f"{len(rows)} seed(s): "
        + ", ".join(f"{k.replace('_', ' ')} {m:.4f} ± {sd:.4f}" for k, (m, sd) in summary.items())
        + f". Run folders: {seed_folder(out, runs[0].seed).parent}/seed-*"
    )
    return 0


def _seed_rows(runs, task, split: str | None) -> list[dict]:
    """One row per run of a series: its validation score and each number the evaluation on the
    split returned (its accuracy, its loss, ...). The validation score is the best value of the
    task's selection metric; a task that keeps no best checkpoint (the language model) reports its
    last evaluation's validation numbers (val_loss), its model being its last weights."""
    selection = task.selection[0] if task.selection is not None else None
    rows = []
    for r in runs:
        row = {"seed": r.seed, "run": str(r.result.run_dir), "step": r.result.step}
        if selection is not None and r.result.best is not None:
            row[f"best_{selection}"] = r.result.best
        if selection is None:
            row |= {k: float(v) for k, v in r.result.metrics.items() if k.startswith("val_")}
        for k, v in r.evaluation.items():  # {"accuracy": a, "test_loss": l, "examples": n} -> test_accuracy, test_loss
            if isinstance(v, float):
                row[k if k.startswith(f"{split}_") else f"{split}_{k}"] = v
        rows.append(row | {"elapsed_sec": r.result.elapsed_sec})  # (last: the scores lead each line)
    return rows


def resume_command(args: argparse.Namespace, out: Path, nproc: int | None = None) -> str:
    """The `attnlab train` command line that continues this run (shell-quoted), with `--nproc`
    for a job of `nproc` processes."""
    words = ["attnlab", "train", args.config]
    for kv in args.overrides:
        words += ["--set", kv]
    for flag, value in (("--data-dir", args.data_dir), ("--init-from", args.init_from), ("--device", args.device)):
        if value:
            words += [flag, value]
    if nproc is not None:
        words += ["--nproc", str(nproc)]
        if args.strategy != "ddp":
            words += ["--strategy", args.strategy]
    if args.seeds is not None:
        words += ["--seeds", str(args.seeds)]
    if getattr(args, "backend", "local") != "local":
        words += ["--backend", args.backend] + (["--address", args.address] if args.address else [])
    if args.eval_split:
        words += ["--eval-split", args.eval_split]
    return shlex.join([*words, "--out", str(out), "--resume"])


def _without_nproc(argv: list[str]) -> list[str]:
    """The command line minus `--nproc N` (or `--nproc=N`, or an abbreviation argparse accepted):
    the processes torchrun starts find their rank in the environment, and torchrun's own parser
    would take `--nproc` for an ambiguous `--nproc-per-node`. Example:
    ["train", "x.toml", "--nproc", "2", "--quiet"] -> ["train", "x.toml", "--quiet"]."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
            continue
        name, eq, _ = arg.partition("=")
        if len(name) > 3 and "--nproc".startswith(name):
            skip = not eq
            continue
        out.append(arg)
    return out
