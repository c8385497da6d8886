"""The GPU check: the CUDA tests (tests/gpu), then each model family's preset trained for a few
dozen steps on the GPU; a table on stdout, the same as JSON. docs/development.md says when and how.

    make gpu-check                                # on the GPU machine, after `make dev`
    .venv/bin/python scripts/gpu_check.py --data-dir ../shared/data --json runs/gpu-check.json
    .venv/bin/python scripts/gpu_check.py --device cpu --steps 2 --presets shakespeare-char-cpu --skip-tests

Each preset runs as `attnlab train PRESET --set train.max_iters=STEPS --set train.device=DEVICE
--data-dir ROOT/FOLDER`, plus `train.eval_iters=20` (its evaluations at step 0 and at the end cost
a bounded time) and `train.fused_kernels='auto'` (attnlab's C++ kernels compute on the CPU alone;
a GPU run computes the same without them and never waits for their build). A preset whose data
folder is missing is skipped, saying so. The whole check keeps to --budget seconds (8 minutes on
an H100 with the defaults): the tests get --tests-timeout, each preset at most --preset-timeout,
and a preset that no longer fits is skipped, saying so. Exit status 0 when nothing failed.
"""

import argparse
import json
import math
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The shared data sets beside the working tree: ./shared/data, or ../shared/data.
DATA_ROOTS = (ROOT / "shared" / "data", ROOT.parent / "shared" / "data")

# (family, preset, its --data-dir below the data root; None: the preset reads the bundled text).
FAMILIES = (
    ("GPT", "shakespeare-char", None),
    ("encoder-decoder", "multi30k-de-en", "multi30k"),
    ("BERT masked LM", "wikitext2-mlm", "wikitext-2"),
    ("ELECTRA replaced-token detection", "wikitext2-electra", "wikitext-2"),
    ("BERT classifier", "sst2", "sst2"),
    ("ViT", "fashion-vit", "fashion-mnist"),
    ("PixelCNN", "fashion-pixelcnn", "fashion-mnist"),
    ("WaveNet", "fsdd-wavenet", "fsdd"),
    ("GAT", "cora-gat", "planetoid"),
)
MORE = (  # the other presets, run with --all or named with --presets
    ("GPT", "shakespeare-char-cpu", None),
    ("GPT", "demo", None),
    ("GPT", "finetune-lm", None),  # without --init-from: from scratch, the preset's recipe alone
    ("GPT chat (SFT)", "chat-sft", "conversations"),  # a folder of train.jsonl (and val.jsonl)
    # `attnlab data chat-mix` writes their folder; skipped where the data root has none
    ("GPT", "chat-mix-pretrain", "chat-mix"),
    ("GPT chat (SFT)", "chat-mix-sft", "chat-mix"),
    ("BERT tagger", "ud-pos", "ud-english-ewt"),
    ("BERT masked LM", "ud-mlm", "ud-english-ewt"),
    ("BERT classifier", "sst2-minilm", "sst2"),  # without --init-from: the recipe on a BERT from scratch
    ("BERT tagger", "ud-pos-minilm", "ud-english-ewt"),
    ("BiLSTM classifier", "sst2-bilstm", "sst2"),
    ("BiLSTM tagger", "ud-pos-bilstm", "ud-english-ewt"),
    ("GRU encoder-decoder", "multi30k-de-en-rnn", "multi30k"),
    ("GRU encoder-decoder", "multi30k-de-en-rnn-attention", "multi30k"),
    ("Transformer encoder-decoder", "multi30k-ablate", "multi30k"),  # the multi30k ablations' base
    ("ViT", "fashion-vit-hybrid", "fashion-mnist"),
    ("CNN", "fashion-cnn", "fashion-mnist"),
    ("PixelCNN", "fashion-gated-pixelcnn", "fashion-mnist"),
    ("pixel GPT", "fashion-igpt", "fashion-mnist"),
    ("digit classifier", "fsdd-digits", "fsdd"),
    ("GAT", "citeseer-gat", "planetoid"),
    ("GCN", "cora-gcn", "planetoid"),
    ("node Transformer", "cora-transformer", "planetoid"),
    ("node Transformer", "cora-transformer-masked", "planetoid"),
)
# What the trainer's "tokens" per second count, by task.
UNITS = {
    "language-model": "tokens/s",
    "translation": "tokens/s",
    "masked-lm": "tokens/s",
    "text-classification": "tokens/s",
    "token-classification": "tokens/s",
    "image-density": "pixels/s",
    "image-classification": "images/s",
    "audio-density": "samples/s",
    "audio-classification": "recordings/s",
    "node-classification": "nodes/s",
}
EXTRA = ("train.eval_iters=20", "train.fused_kernels='auto'")
MIN_PRESET_S = 20  # a preset with less time left than this is skipped


@dataclass
class PresetResult:
    family: str
    preset: str
    status: str  # "ok", "failed" or "skipped"
    error: str = ""  # one line: why it failed or was skipped
    steps: int = 0
    seconds: float = 0.0  # wall time of the command, start-up and data preparation included
    train_seconds: float = 0.0  # the trainer's own clock: the steps, without evaluations
    final_loss: float | None = None  # the last logged training loss
    throughput: float | None = None
    unit: str = ""
    dtype: str = ""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--device", default="cuda", help="the presets' device (default cuda); the tests use CUDA")
    p.add_argument("--steps", type=int, default=50, help="training steps per preset (default 50)")
    p.add_argument("--data-dir", type=Path, help="the data sets' root (default ./shared/data or ../shared/data)")
    p.add_argument("--json", type=Path, default=Path("runs/gpu-check.json"), help="where the results go")
    p.add_argument("--out", type=Path, help="keep the run folders here (default: a temporary folder, removed)")
    p.add_argument("--presets", help="comma-separated presets to run instead of one per family")
    p.add_argument("--all", action="store_true", help="every preset in the table, not one per family")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help="to every preset")
    p.add_argument("--skip-tests", action="store_true", help="the presets alone")
    p.add_argument("--budget", type=float, default=470, help="seconds for the whole check (default 470)")
    p.add_argument("--tests-timeout", type=float, default=300, help="seconds for the tests (default 300)")
    p.add_argument("--preset-timeout", type=float, default=90, help="seconds per preset at most (default 90)")
    return p.parse_args(argv)


def chosen_presets(args: argparse.Namespace) -> list[tuple[str, str, str | None]]:
    table = {preset: (family, preset, folder) for family, preset, folder in FAMILIES + MORE}
    if args.presets:
        names = [n.strip() for n in args.presets.split(",") if n.strip()]
        unknown = [n for n in names if n not in table]
        if unknown:
            print(
                f"gpu_check: unknown preset(s) {', '.join(unknown)}; the table has {', '.join(table)}", file=sys.stderr
            )
            sys.exit(2)
        return [table[n] for n in names]
    return list(FAMILIES + MORE if args.all else FAMILIES)


def data_root(given: Path | None) -> Path | None:
    if given is not None:
        return given
    return next((root for root in DATA_ROOTS if root.is_dir()), None)


def one_line(text: str, *, first: bool = False) -> str:
    """The last non-empty line of a command's output (attnlab's one-line error, or a traceback's
    last), or the first (a test failure's message: the exception, then pytest's explanation)."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[0 if first else -1][:300] if lines else ""


def run_tests(timeout: float, scratch: Path) -> dict:
    """`pytest tests/gpu -m cuda`: counts, seconds and each failure's one line (from its JUnit XML)."""
    junit = scratch / "junit.xml"
    cmd = [sys.executable, "-m", "pytest", "tests/gpu", "-m", "cuda", "-q", "-p", "no:cacheprovider"]
    start = time.perf_counter()
    try:
        proc = subprocess.run([*cmd, f"--junitxml={junit}"], cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {
            "ok": False,
            "error": f"timed out after {timeout:.0f} s",
            "seconds": round(time.perf_counter() - start, 1),
        }
    out = {"exit_code": proc.returncode, "seconds": round(time.perf_counter() - start, 1)}
    if not junit.is_file():
        return {**out, "ok": False, "error": one_line(proc.stdout + proc.stderr)}
    suite = ET.parse(junit).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    counts = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    failures = []
    for case in suite.iter("testcase"):
        for problem in (*case.findall("failure"), *case.findall("error")):
            message = one_line(problem.get("message") or problem.text or "", first=True)
            failures.append(f"{case.get('classname')}::{case.get('name')}: {message}")
    failed = counts["failures"] + counts["errors"]
    ok = proc.returncode == 0 and failed == 0
    passed = counts["tests"] - failed - counts["skipped"]
    return {**out, "ok": ok, "passed": passed, "failed": failed, "skipped": counts["skipped"], "failures": failures}


def run_preset(
    entry: tuple[str, str, str | None], args: argparse.Namespace, root: Path | None, out: Path, timeout: float
) -> PresetResult:
    family, preset, folder = entry
    result = PresetResult(family, preset, "skipped")
    cmd = [sys.executable, "-m", "attnlab", "train", preset, "--out", str(out / preset), "--quiet", "--json"]
    if folder is not None:
        if root is None or not (root / folder).is_dir():
            where = root / folder if root is not None else f"{folder}/ (no data root found: pass --data-dir)"
            result.error = f"its data is missing: {where}"
            return result
        cmd += ["--data-dir", str(root / folder)]
    for kv in (f"train.max_iters={args.steps}", f"train.device={args.device}", *EXTRA, *args.overrides):
        cmd += ["--set", kv]
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return PresetResult(family, preset, "failed", f"timed out after {timeout:.0f} s", seconds=round(timeout, 1))
    result.seconds = round(time.perf_counter() - start, 1)
    if proc.returncode != 0:
        result.status, result.error = "failed", one_line(proc.stderr) or f"exit code {proc.returncode}"
        return result
    try:
        summary = json.loads(proc.stdout)
    except json.JSONDecodeError:
        result.status, result.error = "failed", f"its --json output is not JSON: {one_line(proc.stdout)}"
        return result
    result.steps, result.train_seconds, result.dtype = summary["step"], summary["elapsed_sec"], summary["dtype"]
    result.throughput, result.unit = summary["tokens_per_sec"], UNITS.get(_task(preset), "per s")
    result.final_loss = _last_train_loss(out / preset / "metrics.csv")
    finite = result.final_loss is not None and math.isfinite(result.final_loss)
    result.status, result.error = ("ok", "") if finite else ("failed", f"final training loss {result.final_loss}")
    return result


def _task(preset: str) -> str:
    from attnlab.config import load_preset_or_file
    from attnlab.names import upgrade

    return upgrade(load_preset_or_file(preset)[1])["task"]


def _last_train_loss(metrics: Path) -> float | None:
    import csv

    if not metrics.is_file():
        return None
    with open(metrics, newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["kind"] == "train" and r["train_loss"]]
    return float(rows[-1]["train_loss"]) if rows else None


def table(results: list[PresetResult]) -> str:
    head = f"{'family':<20} {'preset':<30} {'steps':>5} {'seconds':>7} {'final loss':>10} {'throughput':>22}  result"
    lines = [head, "-" * len(head)]
    for r in results:
        loss = f"{r.final_loss:.4f}" if r.final_loss is not None else "-"
        speed = f"{r.throughput:,.0f} {r.unit}" if r.throughput is not None and math.isfinite(r.throughput) else "-"
        verdict = r.status + (f" {r.dtype}" if r.status == "ok" else f": {r.error}")
        lines.append(f"{r.family:<20} {r.preset:<30} {r.steps:>5} {r.seconds:>7.1f} {loss:>10} {speed:>22}  {verdict}")
    return "\n".join(lines)


def machine(device: str) -> dict:
    import torch

    about = {"device": device, "torch": torch.__version__, "cuda": torch.version.cuda}
    if torch.cuda.is_available():
        about["gpu"] = torch.cuda.get_device_name(0)
    return about


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started, clock = time.strftime("%Y-%m-%dT%H:%M:%S%z"), time.perf_counter()
    entries, root = chosen_presets(args), data_root(args.data_dir)
    about = machine(args.device)
    if args.device.startswith("cuda") and "gpu" not in about:
        print(
            f"gpu_check: --device {args.device}, but torch {about['torch']} sees no CUDA GPU (a CPU build of "
            "torch, or no driver); --device cpu runs the presets on the CPU",
            file=sys.stderr,
        )
        return 2
    print(f"GPU check: {about.get('gpu', args.device)}, torch {about['torch']}, CUDA {about['cuda']}", flush=True)
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as scratch:
        out = args.out if args.out is not None else Path(scratch) / "runs"
        tests = None
        if not args.skip_tests:
            tests = run_tests(min(args.tests_timeout, args.budget), Path(scratch))
            print(_tests_line(tests), flush=True)
        results = []
        for entry in entries:
            left = args.budget - (time.perf_counter() - clock)
            if left < MIN_PRESET_S:
                results.append(
                    PresetResult(entry[0], entry[1], "skipped", f"over the time budget ({args.budget:.0f} s)")
                )
                continue
            results.append(run_preset(entry, args, root, out, min(args.preset_timeout, left)))
            print(
                f"  {entry[1]}: {results[-1].status}" + (f": {results[-1].error}" if results[-1].error else ""),
                flush=True,
            )
    print(table(results))
    ok = (tests is None or tests["ok"]) and all(r.status != "failed" for r in results)
    report = {
        **about,
        "started": started,
        "seconds": round(time.perf_counter() - clock, 1),
        "steps": args.steps,
        "data_dir": str(root) if root is not None else None,
        "overrides": [*EXTRA, *args.overrides],
        "tests": tests,
        "presets": [asdict(r) for r in results],
        "ok": ok,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(f"{'all ok' if ok else 'FAILED'} in {report['seconds']:.0f} s; results: {args.json}")
    return 0 if ok else 1


def _tests_line(tests: dict) -> str:
    if "passed" not in tests:
        return f"tests/gpu: failed to run: {tests.get('error', '')}"
    line = f"tests/gpu: {tests['passed']} passed, {tests['failed']} failed, "
    line += f"{tests['skipped']} skipped in {tests['seconds']:.0f} s"
    return "\n".join([line, *(f"  FAILED {f}" for f in tests["failures"])])


if __name__ == "__main__":
    sys.exit(main())
