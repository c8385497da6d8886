"""python -m attnlab.studies.harness ARGS: lm-evaluation-harness's command line (`lm_eval ARGS`) with
the `attnlab` model registered, e.g.

    python -m attnlab.studies.harness --model attnlab --model_args pretrained=runs/demo --tasks lambada_openai

A mistake in what the model is given (a folder without tokenizer.json, a run of another task) is
one line and exit code 2, as with `attnlab`; the harness's own errors are its own.
"""

import sys

from lm_eval.__main__ import cli_evaluate

import attnlab.studies.harness  # noqa: F401  registers the model `attnlab`
from attnlab.errors import UserError


def main() -> int:
    try:
        cli_evaluate()
    except UserError as e:
        print(f"attnlab: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
