"""Perplexity of one trained model stored in each GGUF format, beside its fp32 run: what each of
llama.cpp's formats costs in quality, read back through attnlab's GGUF reader.

The run is exported with `attnlab export RUN FILE --to gguf --outtype f32|bf16|q8_0`; with
`--llama-quantize` (llama.cpp's `llama-quantize`, built from its source) the f32 file is also
quantized to the 4-, 5- and 6-bit formats (Q4_0, Q4_K_M, Q5_K_M, Q6_K: a _M file mixes its type with
Q6_K for some tensors, as llama.cpp chooses). Each file, and the run itself, is scored by
`attnlab eval SOURCE --data FILE --context C --stride C --json` (disjoint windows of the model's
context): the same command, loader and windows for every row. With `--llama-perplexity`
(llama.cpp's `llama-perplexity`) each file is also scored by llama.cpp itself, on its own windows
(it scores the second half of each window), for the formats' order by another implementation.

    python benchmarks/gguf_perplexity.py RUN --data ../shared/data/wikitext-2/valid.txt
        [--llama-quantize PATH] [--llama-perplexity PATH] [--work DIR] [--json FILE]
"""

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ATTNLAB = [sys.executable, "-m", "attnlab"]
EXPORTED = ("f32", "bf16", "q8_0")
QUANTIZED = ("Q6_K", "Q5_K_M", "Q4_K_M", "Q4_0")


def run(command: list[str]) -> str:
    """stdout of `command`; its stderr on failure."""
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stderr[-2000:]}")
    return done.stdout


def attnlab_perplexity(source: Path, data: Path, context: int) -> dict:
    """`attnlab eval SOURCE --data DATA` over disjoint windows of `context` tokens, as JSON."""
    args = ["eval", str(source), "--data", str(data), "--context", str(context), "--stride", str(context), "--json"]
    return json.loads(run([*ATTNLAB, *args]))


def llama_cpp_perplexity(binary: Path, model: Path, data: Path, context: int) -> float | str:
    """llama.cpp's final perplexity estimate of `model` on `data` (its windows of `context` tokens),
    or why there is none (a build without some type's kernels stops with a signal)."""
    done = subprocess.run(
        [str(binary), "-m", str(model), "-f", str(data), "-c", str(context), "-b", str(context), "-t", "2"],
        capture_output=True,
        text=True,
    )
    found = re.search(r"Final estimate: PPL = ([0-9.]+)", done.stdout + done.stderr)
    if found is None:
        return f"no estimate: llama-perplexity exited with {done.returncode}"
    return float(found.group(1))


def gguf_files(run_dir: Path, work: Path, quantize: Path | None) -> dict[str, Path]:
    """The run exported in each format `EXPORTED`, and quantized to `QUANTIZED` where llama-quantize is given."""
    files = {}
    for outtype in EXPORTED:
        files[outtype] = work / f"model-{outtype}.gguf"
        run([*ATTNLAB, "export", str(run_dir), str(files[outtype]), "--to", "gguf", "--outtype", outtype, "--force"])
    for qtype in QUANTIZED if quantize else ():
        files[qtype] = work / f"model-{qtype}.gguf"
        run([str(quantize), str(files["f32"]), str(files[qtype]), qtype])
    return files


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--llama-quantize", type=Path)
    parser.add_argument("--llama-perplexity", type=Path)
    parser.add_argument("--context", type=int, default=128, help="the windows' length (default 128)")
    parser.add_argument("--work", type=Path, help="where the GGUF files go (default: a temporary folder)")
    parser.add_argument("--json", type=Path, help="also write the result here")
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="gguf-ppl-"))
    work.mkdir(parents=True, exist_ok=True)

    context = args.context
    reference = attnlab_perplexity(args.run_dir, args.data, context)
    rows = {"run (fp32, PyTorch)": {"attnlab": reference["perplexity"], "bytes": None}}
    for name, path in gguf_files(args.run_dir, work, args.llama_quantize).items():
        row = {"attnlab": attnlab_perplexity(path, args.data, context)["perplexity"], "bytes": path.stat().st_size}
        if args.llama_perplexity:
            row["llama.cpp"] = llama_cpp_perplexity(args.llama_perplexity, path, args.data, context)
        rows[name] = row
        print(f"{name:>10}: {row}", file=sys.stderr)
    fp32 = reference["perplexity"]
    for row in rows.values():
        row["vs_fp32"] = row["attnlab"] / fp32 - 1
    result = {"run": str(args.run_dir), "data": str(args.data), "context": context, "tokens": reference["tokens"]}
    result["rows"] = rows
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
