"""lm-evaluation-harness's own `local-completions` model, run from its command line against a live
`attnlab serve`, on a small multiple-choice task written here (a task YAML and a JSONL file): its
log-likelihoods are the model's own, computed here by a forward pass, and so is its accuracy.

lm-eval tokenizes on its side (it needs the lengths of contexts) and sends token ids with `echo`,
`logprobs: 1` and `max_tokens: 1`, reading `token_logprobs[ctxlen:-1]`; its tokenizer here is the
run's, exported as a Hugging Face folder (`attnlab export`)."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from attnlab.data.text import bundled_shakespeare
from attnlab.export import export_run
from attnlab.serve.app import create_app
from attnlab.serve.server import BackgroundServer

pytestmark = pytest.mark.slow

pytest.importorskip("lm_eval")
pytest.importorskip("tenacity", reason="lm-eval's API models need lm-eval[api] (tenacity)")

TASK = "attnlab_tiny_mc"
BLOCK = 16  # the shared "lm" run's context: lm-eval's max_length is one more (it keeps one for generation)


def write_task(folder: Path) -> list[dict]:
    """Twelve questions: a line of Tiny Shakespeare, and which of four endings follows it."""
    text = bundled_shakespeare()[:20_000]
    docs = []
    for k in range(12):
        at = 500 + 731 * k
        context, right = text[at : at + 9], text[at + 9 : at + 13]
        others = [text[at + 4000 + 97 * j : at + 4004 + 97 * j] for j in range(3)]
        choices = [right, *others]
        label = k % 4
        choices[0], choices[label] = choices[label], choices[0]
        docs.append({"context": context, "choices": choices, "label": label})
    data = folder / "tiny.jsonl"
    data.write_text("".join(json.dumps(d) + "\n" for d in docs), encoding="utf-8")
    (folder / f"{TASK}.yaml").write_text(
        f"task: {TASK}\n"
        "dataset_path: json\n"
        f"dataset_kwargs:\n  data_files:\n    test: {data}\n"
        "test_split: test\n"
        "output_type: multiple_choice\n"
        "doc_to_text: '{{context}}'\n"
        "doc_to_choice: '{{choices}}'\n"
        "doc_to_target: label\n"
        "target_delimiter: ''\n"
        "metric_list:\n  - metric: acc\n",
        encoding="utf-8",
    )
    return docs


def loglikelihood(model, tokenizer, context: str, continuation: str) -> float:
    """log P(continuation | context) by one forward pass over their tokens (at most the context)."""
    ids = tokenizer.encode(context + continuation)
    n = len(tokenizer.encode(continuation))
    ids = ids[-BLOCK:]  # lm-eval truncates on the left to its max_length as well
    with torch.no_grad():
        logprobs = torch.log_softmax(model.eval()(torch.tensor([ids]))[0].double(), dim=-1)
    return sum(float(logprobs[t - 1, ids[t]]) for t in range(len(ids) - n, len(ids)))


def test_lm_eval_local_completions_scores_what_the_model_scores(tmp_path, run_dirs, runs):
    docs = write_task(tmp_path)
    tokenizer_dir = tmp_path / "tokenizer"
    export_run(run_dirs["lm"], tokenizer_dir)  # lm-eval reads the tokenizer with transformers
    out = tmp_path / "out"
    env = os.environ | {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    env["PYTHONPATH"] = os.pathsep.join([*sys.path, env.get("PYTHONPATH", "")])
    with BackgroundServer(create_app(runs)) as server:
        args = (
            f"base_url={server.url}/v1/completions,model=lm,tokenizer_backend=huggingface,"
            f"tokenizer={tokenizer_dir},max_length={BLOCK + 1},max_retries=1"
        )
        command = [sys.executable, "-m", "lm_eval", "--model", "local-completions", "--model_args", args]
        command += ["--tasks", TASK, "--include_path", str(tmp_path), "--output_path", str(out), "--log_samples"]
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    (samples_file,) = out.rglob(f"samples_{TASK}_*.jsonl")
    samples = [json.loads(line) for line in samples_file.read_text().splitlines()]
    assert len(samples) == len(docs)
    run = runs["lm"]
    right = 0
    for sample in sorted(samples, key=lambda s: s["doc_id"]):
        doc = docs[sample["doc_id"]]
        got = [float(resp[0][0]) for resp in sample["resps"]]  # the samples file holds them as text
        want = [loglikelihood(run.model, run.tokenizer, doc["context"], c) for c in doc["choices"]]
        assert got == pytest.approx(want, abs=1e-5), sample["doc_id"]
        right += int(max(range(4), key=want.__getitem__) == doc["label"])
    (results_file,) = out.rglob("results_*.json")
    acc = json.loads(results_file.read_text())["results"][TASK]["acc,none"]
    assert math.isclose(acc, right / len(docs))
