"""The server benchmark against two checkouts of attnlab in one run: this one and a `--base` one.

    git worktree add /tmp/base COMMIT
    python benchmarks/serve_ab.py RUN --base /tmp/base [--clients 32] [--requests 4] [--rounds 3]
        [--one-at-a-time] [--json F]

Each round starts `attnlab serve RUN` from the base checkout (its `src` first on PYTHONPATH, its
C++ extensions built into a folder of its own, `BASE/.torch_extensions`) and from this one, in
turn, and drives `--clients` streaming clients against each (`serve_load.py`'s `drive`): a change
to the server measured beside what it changes, on the same machine in the same minutes. Batched
(`--max-batch 64`) by default; `--one-at-a-time` serves with `--max-batch 1`. Prints a JSON line per
run and the medians.
"""

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from run_info import run_info  # noqa: E402
from serve_load import Server, drive  # noqa: E402


def base_env(base: Path) -> dict[str, str]:
    """The environment that makes `python -m attnlab` the base checkout's, its extensions built."""
    env = {**os.environ, "PYTHONPATH": str(base / "src"), "TORCH_EXTENSIONS_DIR": str(base / ".torch_extensions")}
    build = "from attnlab.accel.fused import extension; assert extension() is not None"
    subprocess.run([sys.executable, "-c", build], env=env, check=True)
    return env


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path, help="a character-level language-model run folder")
    parser.add_argument("--base", type=Path, required=True, help="the other checkout (a git worktree)")
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--requests", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--one-at-a-time", action="store_true", help="serve with --max-batch 1")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args()
    if not (args.base / "src" / "attnlab").is_dir():
        parser.error(f"--base {args.base}: no src/attnlab there; give a checkout of attnlab")
    envs = {"base": base_env(args.base.resolve()), "this": dict(os.environ)}
    flags = ["--max-batch", "1" if args.one_at_a_time else "64", "--max-queue", "256"]
    rows = []
    for round_ in range(args.rounds):
        for name, env in envs.items():
            server = Server(args.run, *flags, env=env)
            try:
                row = asyncio.run(drive(server.url, name, args.clients, args.requests, args.max_tokens)).summary()
            finally:
                server.stop()
            rows.append({"round": round_, "checkout": name, **row})
            print(json.dumps(rows[-1]), flush=True)
    medians = {n: statistics.median(r["tokens_per_s"] for r in rows if r["checkout"] == n) for n in envs}
    print(f"base {medians['base']:.0f} tokens/s, this {medians['this']:.0f}: {medians['this'] / medians['base']:.2f}x")
    if args.json:
        info = {"run": str(args.run), "base": str(args.base), "one_at_a_time": args.one_at_a_time, **run_info()}
        args.json.write_text(json.dumps({**info, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
