"""attnlab GPT versus `transformers` GPT-2 of the same shape, measured side by side in one run.

The measurements now live in `attnlab.studies.bench` and run as `attnlab bench`; this script is that command,
kept so that the invocations written down earlier still work (same flags: --repeats, --out, --quick,
and --device, --json).

    python benchmarks/bench_gpt.py --out benchmarks/results/bench_gpt.json
"""

import sys

from attnlab.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", *sys.argv[1:]]))
