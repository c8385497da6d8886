"""attnlab kernels build|status [--json]

attnlab's C++ kernels (the training blocks and AdamW step of `attnlab.accel.kernels`, the decoding
step of `attnlab.accel.fused`, WaveNet's generation step of `attnlab.accel.wavenet`) are compiled
for this machine's CPU. `make` builds them when it installs attnlab; the defaults of `attnlab
train`, `sample` and `bench` take them wherever they are built, and PyTorch's operators elsewhere,
so no command waits for a build it was not asked for.
"""

import argparse
import sys
import time
import warnings

from attnlab.cli.arguments import add_json_argument

KERNELS = {
    "training kernels": "attnlab.accel.kernels",
    "fused decoding step": "attnlab.accel.fused",
    "WaveNet generation step": "attnlab.accel.wavenet",
}
"""What is built, by name: the module whose `extension()` builds it and `is_built()` checks it."""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "kernels",
        help="build attnlab's C++ kernels for this CPU (make does at installation), or say whether they are",
        description=__doc__.split("\n\n", 1)[1],
    )
    p.add_argument("action", choices=["build", "status"], help="build: compile what is not built yet; status: say")
    add_json_argument(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from concurrent.futures import ThreadPoolExecutor
    from importlib import import_module

    from attnlab.accel.extensions import build_folder

    modules = {what: import_module(name) for what, name in KERNELS.items()}
    if args.action == "status":
        results = {what: {"built": module.is_built()} for what, module in modules.items()}
    else:
        pending = [what for what, module in modules.items() if not module.is_built()]
        if pending:  # minutes of a silent compiler otherwise (stderr: --json's stdout stays JSON)
            print(
                f"building attnlab's C++ kernels for this CPU ({', '.join(pending)}): a few minutes, once ...",
                file=sys.stderr,
                flush=True,
            )
        # One compiler process each (a single source file): side by side they take the time of one.
        with ThreadPoolExecutor(len(modules)) as pool:
            results = dict(zip(modules, pool.map(_build, modules.values()), strict=True))
    for what, module in modules.items():
        results[what]["folder"] = str(build_folder(module.NAME, module.SOURCE))
    if args.json:
        from attnlab.cli import print_json

        print_json(results)
    else:
        for what, r in results.items():
            print(f"{what}: {_describe(r)}, in {r['folder']}")
    return 0 if args.action == "status" or all(r["built"] for r in results.values()) else 1


def _build(module) -> dict:
    """Build one extension (or load its finished build); the reason where it cannot be built."""
    already = module.is_built()
    start = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        built = module.extension() is not None
    result = {"built": built, "seconds": round(time.perf_counter() - start, 1), "was_built": already}
    if not built:
        result["reason"] = str(caught[-1].message) if caught else "the build failed"
    return result


def _describe(r: dict) -> str:
    if "seconds" not in r:
        return "built" if r["built"] else "not built (attnlab kernels build)"
    if not r["built"]:
        return f"{r['reason']}. attnlab runs on PyTorch's operators: everything works, the CPU steps are slower"
    return "already built" if r["was_built"] else f"built in {r['seconds']:g} s"
