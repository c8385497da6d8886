"""attnlab demo: the quick start — a small GPT trained on the bundled Tiny Shakespeare, then a sample.

Calls `attnlab.train.train` on the demo preset, then `attnlab.decode.complete`."""

import argparse
import os
import shlex
import shutil
import sys
from pathlib import Path

from attnlab.cli import check_overrides, non_negative_int
from attnlab.cli.arguments import add_seed_argument


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "demo",
        help="train a small GPT on Tiny Shakespeare (a few minutes on a CPU) and print a sample",
        description="Train the `demo` preset on the bundled Tiny Shakespeare, then print a sample. "
        "Run it again and it resumes or reuses the finished run in --out.",
    )
    p.add_argument("--out", type=Path, default=Path("runs/demo"), help="run folder (default runs/demo)")
    p.add_argument("--prompt", default="ROMEO:", help="text to continue (default ROMEO:)")
    p.add_argument("--max-new-tokens", type=non_negative_int, default=500, help="characters to generate (default 500)")
    add_seed_argument(p)
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a value of the demo preset, e.g. --set train.max_iters=300 for a quicker look (repeatable)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(run=run, check=lambda args: check_overrides(args.overrides))


def run(args: argparse.Namespace) -> int:
    import torch

    from attnlab import load
    from attnlab.config import load_preset_or_file, parse_overrides
    from attnlab.decode import complete, sampling_picker
    from attnlab.train import resolve, train
    from attnlab.train.config import apply_overrides
    from attnlab.train.signals import StopRequest

    _, doc = load_preset_or_file("demo")
    config = resolve(apply_overrides(doc, parse_overrides(args.overrides)))
    done = _steps_done(args.out)
    finished = done is not None and done >= config.train.max_iters
    if not finished:
        resuming = f", resuming at step {done}" if done is not None else ""
        print(
            f"Training a {config.model.n_layers}-layer GPT on Tiny Shakespeare into {args.out} "
            f"({config.train.max_iters} steps{resuming}) ...",
            flush=True,
        )
    # A finished run trains no step: train() only checks that the folder holds this model and data.
    with StopRequest() as stop:  # Ctrl-C: finish the step, save; running the demo again resumes
        result = train(config, args.out, resume=done is not None, progress=not (args.quiet or finished), stop=stop)
    if result.stopped_by is not None:
        again = shlex.join(["demo", "--out", str(args.out), *_sets(args.overrides)])
        sys.stderr.write(
            f"attnlab demo: stopped at step {result.step} ({result.stopped_by}); checkpoint saved, "
            f"continue with: {attnlab_command()} {again}\n"
        )
        return 0
    if finished:
        print(f"{args.out} is already trained ({result.step} steps, val loss {result.val_loss:.4f}): sampling.\n")
    else:
        print(f"Done: step {result.step}, val loss {result.val_loss:.4f}, {result.elapsed_sec:.0f}s of training.\n")
    run = load(args.out)
    pick = sampling_picker(temperature=0.8, generator=torch.Generator().manual_seed(args.seed))
    print(args.prompt + complete(run.model, run.tokenizer, args.prompt, args.max_new_tokens, pick))
    print(_next_commands(args.out))
    return 0


def _steps_done(out: Path) -> int | None:
    """The step of the run in `out` (its latest checkpoint); None where there is no run to resume."""
    from attnlab.checkpoints import CONFIG, has_checkpoint, latest_checkpoint

    if not ((out / CONFIG).exists() and has_checkpoint(out)):
        return None
    return latest_checkpoint(out).step


def _next_commands(out: Path) -> str:
    """The demo's last lines: the commands to try next, as this shell can run them."""
    command, folder = attnlab_command(), shlex.quote(str(out))
    text = f"\nMore: {command} sample {folder} --prompt 'JULIET:'   |   {command} eval {folder}"
    activate = Path(sys.executable).parent / "activate"
    if command != "attnlab" and activate.is_file():
        text += f"\n(Or `source {shlex.quote(_short(activate))}` once in a shell, then `attnlab ...` as in the docs.)"
    return text


def attnlab_command() -> str:
    """How a shell here reaches this attnlab: "attnlab" where PATH finds this installation's
    command (an activated virtual environment, an installation on PATH); else the command beside
    this Python (`.venv/bin/attnlab` after `make demo`, in a shell that has not activated .venv);
    else `PYTHON -m attnlab`."""
    here = shutil.which("attnlab", path=str(Path(sys.executable).parent))
    on_path = shutil.which("attnlab", path=_shell_path())
    if on_path is not None and (here is None or os.path.samefile(on_path, here)):
        return "attnlab"
    if here is not None:
        return shlex.quote(_short(Path(here)))
    return f"{shlex.quote(_short(Path(sys.executable)))} -m attnlab"


def _shell_path() -> str:
    """This process's PATH as the user's shell has it: without the folder a kernel build put in
    front for ninja (`attnlab.accel.extensions.PATH_ADDED`), which the shell never sees."""
    added = getattr(sys.modules.get("attnlab.accel.extensions"), "PATH_ADDED", None)
    return os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep) if p != added)


def _short(path: Path) -> str:
    """`path` relative to the current folder where it lies inside it (.venv/bin/attnlab), else as it is."""
    relative = os.path.relpath(path)
    return path.as_posix() if relative.startswith("..") else relative


def _sets(overrides: list[str]) -> list[str]:
    return [word for kv in overrides for word in ("--set", kv)]
