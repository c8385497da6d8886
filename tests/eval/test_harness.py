"""lm-evaluation-harness's model `attnlab` against the harness's own `hf` model on the same Hugging
Face folder: small local tasks written here (JSONL documents and task YAMLs: multiple choice,
rolling log-likelihood, generation), the same log-likelihoods per request (1e-4), the same
accuracy and the same generations; and through the command line, `python -m attnlab.studies.harness`."""

import json
import logging
import runpy
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from attnlab import load
from attnlab.data.text import bundled_shakespeare
from helpers import cli
from hf_folders import causal_lm_folder

pytestmark = pytest.mark.slow

lm_eval = pytest.importorskip("lm_eval")
pytest.importorskip("transformers")
import attnlab.studies.harness  # noqa: E402, F401  registers `attnlab`

QUESTIONS = [
    ("ROMEO: What say you", [" of love?", " of the moon?", " to me?"], 0),
    ("JULIET: Where art", [" thou", " the king", " my lord"], 1),
    ("First Citizen:", [" We are poor", " Speak, speak.", " Hear me speak."], 2),
    ("MENENIUS: I tell you, friends, most charitable care", [" have the", " and", "."], 0),
    ("MARCIUS: ", ["Thanks.", "What", "He that will"], 1),  # a trailing space in the context
]

TASKS = {
    "tiny_mc": """output_type: multiple_choice
target_delimiter: ""
doc_to_text: "{{question}}"
doc_to_choice: "{{choices}}"
doc_to_target: "{{answer}}"
metric_list:
  - metric: acc
""",
    "tiny_roll": """output_type: loglikelihood_rolling
doc_to_text: ""
doc_to_target: "{{text}}"
metric_list:
  - metric: word_perplexity
""",
    "tiny_gen": """output_type: generate_until
doc_to_text: "{{question}}"
doc_to_target: "{{choices[answer]}}"
generation_kwargs:
  until: ["\\n", "."]
  max_gen_toks: 8
  do_sample: false
metric_list:
  - metric: exact_match
""",
}


def write_tasks(folder: Path) -> Path:
    """The three tasks' YAMLs and their shared JSONL documents in `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    text = bundled_shakespeare()
    with open(folder / "docs.jsonl", "w", encoding="utf-8") as f:
        for i, (question, choices, answer) in enumerate(QUESTIONS):
            # Passages of 150 to 550 characters: one to several 64-token rolling windows.
            passage = text[40_000 + 1000 * i : 40_150 + 1100 * i]
            f.write(json.dumps({"question": question, "choices": choices, "answer": answer, "text": passage}) + "\n")
    for name, body in TASKS.items():
        head = f"task: {name}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {folder / 'docs.jsonl'}\n"
        (folder / f"{name}.yaml").write_text(head + "test_split: test\n" + body, encoding="utf-8")
    return folder


@pytest.fixture(scope="module")
def tasks(tmp_path_factory):
    return write_tasks(tmp_path_factory.mktemp("tasks"))


@pytest.fixture(scope="module", params=["llama", "gpt2"])
def folder(tmp_path_factory, request):
    path = tmp_path_factory.mktemp(request.param)
    causal_lm_folder(path, request.param)
    # transformers' tokenizer learns its special tokens from tokenizer_config.json (attnlab reads
    # config.json's ids): published checkpoints ship both.
    (path / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>", "eos_token": "</s>"}))
    return path


def evaluate(model: str, pretrained: Path, tasks: Path, names: list[str], batch_size: int) -> dict:
    from lm_eval.tasks import TaskManager

    return lm_eval.simple_evaluate(
        model=model,
        model_args={"pretrained": str(pretrained), **({"dtype": "float32"} if model == "hf" else {})},
        tasks=names,
        task_manager=TaskManager(include_path=str(tasks)),
        batch_size=batch_size,
        device="cpu",
        log_samples=True,
    )


def responses(results: dict, task: str) -> list:
    """Each document's raw responses, in document order."""
    return [sample["resps"] for sample in sorted(results["samples"][task], key=lambda s: s["doc_id"])]


def loglikelihoods(results: dict, task: str) -> list[float]:
    """Every request's log-likelihood: a request's response is [(logprob, is_greedy)] or [logprob]."""
    first = [request[0] for doc in responses(results, task) for request in doc]
    return [float(r[0]) if isinstance(r, (list, tuple)) else float(r) for r in first]


@pytest.fixture(scope="module")
def both(folder, tasks):
    """The harness's `hf` model (one request at a time) and `attnlab` (four) on every task."""
    names = list(TASKS)
    return evaluate("hf", folder, tasks, names, 1), evaluate("attnlab", folder, tasks, names, 4)


@pytest.mark.parametrize("task", ["tiny_mc", "tiny_roll"])
def test_loglikelihoods_equal_the_hf_models(both, task):
    hf, ours = both
    want, got = loglikelihoods(hf, task), loglikelihoods(ours, task)
    assert len(got) == len(want) > len(QUESTIONS) - 1
    assert got == pytest.approx(want, abs=1e-4)
    assert len(set(round(x, 2) for x in got)) == len(got)  # distinct scores: the comparison can tell them apart


def test_accuracy_and_greedy_flags_equal_the_hf_models(both):
    hf, ours = both
    assert ours["results"]["tiny_mc"]["acc,none"] == hf["results"]["tiny_mc"]["acc,none"]
    hf_flags, our_flags = ([bool(req[0][1]) for doc in responses(r, "tiny_mc") for req in doc] for r in (hf, ours))
    assert our_flags == hf_flags


def test_generations_equal_the_hf_models(both):
    hf, ours = both
    want, got = responses(hf, "tiny_gen"), responses(ours, "tiny_gen")
    assert got == want
    assert any(doc[0] for doc in got)  # something was generated


def test_the_command_line_runs_the_model(folder, tasks, both, tmp_path, monkeypatch, capsys):
    """`python -m attnlab.studies.harness` is `lm_eval` with `--model attnlab` available."""
    argv = ["--model", "attnlab", "--model_args", f"pretrained={folder}", "--tasks", "tiny_mc"]
    argv += ["--include_path", str(tasks), "--device", "cpu", "--batch_size", "3", "--output_path", str(tmp_path)]
    assert run_module(monkeypatch, argv) == 0
    (written,) = tmp_path.rglob("results_*.json")
    results = json.loads(written.read_text())["results"]["tiny_mc"]
    assert results["acc,none"] == both[0]["results"]["tiny_mc"]["acc,none"]
    assert "tiny_mc" in capsys.readouterr().out  # the harness's table


def run_module(monkeypatch, argv: list[str]) -> int:
    """`python -m attnlab.studies.harness ARGV` in this process; returns its exit code. The harness's
    command line gives its logger a handler on this test's captured stderr, which the next test
    closes: the logger is put back as it was."""
    monkeypatch.setattr(sys, "argv", ["attnlab.studies.harness", *argv])
    logger = logging.getLogger("lm_eval")
    monkeypatch.setattr(logger, "handlers", list(logger.handlers))
    monkeypatch.setattr(logger, "propagate", logger.propagate)
    monkeypatch.setattr(lm_eval.utils, "_LOGGING_CONFIGURED", lm_eval.utils._LOGGING_CONFIGURED)
    try:
        runpy.run_module("attnlab.studies.harness", run_name="__main__")
    except SystemExit as e:
        return e.code
    return 0


def test_a_folder_without_tokenizer_is_one_line(folder, tasks, tmp_path, monkeypatch, capsys):
    broken = tmp_path / "no-tokenizer"
    broken.mkdir()
    for name in ("config.json", "model.safetensors"):
        (broken / name).write_bytes((folder / name).read_bytes())
    argv = ["--model", "attnlab", "--model_args", f"pretrained={broken}", "--tasks", "tiny_mc"]
    assert run_module(monkeypatch, [*argv, "--include_path", str(tasks)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("attnlab: error:") and "tokenizer.json" in err[-1]
    assert not any("Traceback" in line for line in err), "\n".join(err)


@torch.no_grad()
def direct_loglikelihood(model, context: list[int], continuation: list[int]) -> float:
    """log p(continuation | context), summed: the pair through the model at once."""
    ids = (context + continuation)[-(model.config.block_size + 1) :]  # what fits, as the harness keeps it
    logp = F.log_softmax(model(torch.tensor([ids[:-1]]))[0, -len(continuation) :], dim=-1)
    return logp.gather(-1, torch.tensor(continuation)[:, None]).sum().item()


def test_a_character_run_scores_as_its_model_does(tiny_toml, tmp_path, tasks, capsys):
    """A run's tokenizer of characters has no special tokens: contexts are scored as they are, and
    a rolling window's first token needs a prefix_token_id."""
    from attnlab.errors import UserError

    assert cli(capsys, "train", tiny_toml, "--out", tmp_path / "run")[0] == 0
    run = load(tmp_path / "run")
    got = loglikelihoods(evaluate("attnlab", tmp_path / "run", tasks, ["tiny_mc"], 2), "tiny_mc")
    encode = run.tokenizer.encode
    # The harness moves a context's trailing space to the continuation.
    pairs = [(q.rstrip(), q[len(q.rstrip()) :] + c) for q, choices, _ in QUESTIONS for c in choices]
    want = [direct_loglikelihood(run.model, encode(q), encode(c)) for q, c in pairs]
    assert got == pytest.approx(want, abs=1e-4)
    with pytest.raises(UserError, match="prefix_token_id"):
        evaluate("attnlab", tmp_path / "run", tasks, ["tiny_roll"], 2)
    newline = encode("\n")[0]
    lm = lm_eval.api.registry.get_model("attnlab")(pretrained=str(tmp_path / "run"), prefix_token_id=newline)
    assert lm.max_length == 16 and lm.prefix_token_id == newline
