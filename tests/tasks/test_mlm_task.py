"""Masked-LM pre-training on the WikiText fixture: real WordPiece, real blocks, the real trainer."""

import csv
import dataclasses
import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from attnlab import load
from attnlab.accel import kernels, reference_cross_entropy
from attnlab.data.mlm import IGNORE_INDEX
from attnlab.tasks import MaskedLM
from attnlab.train import resolve
from helpers import UD, WIKITEXT, cli, conllu_words, encoder_doc, shared

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def mlm_run(tmp_path_factory) -> Path:
    return shared(tmp_path_factory, "mlm")


def reopen(run_dir: Path, splits=("train", "val")) -> MaskedLM:
    """The task of a trained run, as `attnlab eval` builds it (the run's own vocabulary)."""
    run = load(run_dir)
    return MaskedLM(run.config.data, run.config.model, run_dir, resume=True, batch_size=16, splits=splits)


def test_training_lowers_the_validation_loss_and_logs_accuracy_and_perplexity(mlm_run):
    with open(mlm_run / "metrics.csv", newline="") as f:
        evals = [r for r in csv.DictReader(f) if r["kind"] == "eval"]
    assert [int(r["step"]) for r in evals] == [0, 20, 40]
    first, last = evals[0], evals[-1]
    assert float(last["val_loss"]) < float(first["val_loss"]) - 0.3, evals
    for row in evals:
        assert 0.0 <= float(row["val_accuracy"]) <= 1.0
        assert float(row["val_ppl"]) == pytest.approx(math.exp(float(row["val_loss"])), rel=1e-4)
    assert float(last["val_accuracy"]) > float(first["val_accuracy"])
    assert json.loads((mlm_run / "best.json").read_text())["val_loss"] == pytest.approx(
        min(float(r["val_loss"]) for r in evals), rel=1e-5
    )


def test_evaluation_masks_the_same_way_every_time(mlm_run):
    run = load(mlm_run)
    task, other = reopen(mlm_run, ("val",)), reopen(mlm_run, ("val",))
    torch.manual_seed(0)
    a = task.evaluate(run.model, torch.device("cpu"), split="val")
    torch.manual_seed(1)  # the global generator must not matter
    b = task.evaluate(run.model, torch.device("cpu"), split="val")
    c = other.evaluate(run.model, torch.device("cpu"), split="val")
    assert a == b == c
    assert a["masked_tokens"] > 0
    during = [task.evaluate_during_training(run.model, torch.device("cpu"), eval_iters=1) for _ in range(2)]
    assert during[0] == during[1]


def test_the_loss_runs_through_forward_so_a_compiled_model_covers_it(mlm_run):
    """train.compile wraps the model in torch.compile, which compiles `forward` alone: a loss
    that called `encode` and `head` apart would train eagerly while the log said compiled."""
    run, task = load(mlm_run), reopen(mlm_run)
    batch = task.train_batch(0, torch.Generator().manual_seed(3))
    calls = []
    hook = run.model.register_forward_hook(lambda *_: calls.append(1))
    loss = task.loss(run.model, batch, torch.device("cpu"))
    hook.remove()
    assert calls == [1]
    inputs, labels = batch
    chosen = labels != IGNORE_INDEX
    with torch.no_grad():  # the same number as scoring every position and keeping the chosen ones
        expected = torch.nn.functional.cross_entropy(run.model(inputs)[chosen].float(), labels[chosen])
    torch.testing.assert_close(loss.detach(), expected)


@pytest.mark.skipif(kernels.extension() is None, reason="the kernels could not be built here")
def test_the_loss_through_the_kernel_under_bf16_autocast_is_the_fp32_loss_of_the_logits(mlm_run, monkeypatch):
    """train.fused_kernels with train.dtype bfloat16, as the preset trains: the kernel scores the
    bf16 logits in fp32, as PyTorch's loss of their fp32 copy does, gradients included."""
    run, task = load(mlm_run), reopen(mlm_run)
    batch = task.train_batch(0, torch.Generator().manual_seed(3))
    results, outputs = {}, []

    def keep(_module, _args, out):
        out.retain_grad()
        outputs.append(out)

    for on in (False, True):
        if on:  # and it really is the kernel that runs
            monkeypatch.setattr(F, "cross_entropy", lambda *a, **k: pytest.fail("PyTorch's loss ran"))
        run.model.zero_grad()
        hook = run.model.register_forward_hook(keep)
        task.cross_entropy = kernels.cross_entropy if on else reference_cross_entropy  # as the trainer sets it
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = task.loss(run.model, batch, torch.device("cpu"), label_smoothing=0.1)
        hook.remove()
        loss.backward(retain_graph=True)
        results[on] = loss.detach(), outputs[-1], [p.grad.clone() for p in run.model.parameters() if p.grad is not None]
    (loss, logits, grads), (expected_loss, expected_logits, _) = results[True], results[False]
    torch.testing.assert_close(loss, expected_loss, atol=1e-5, rtol=1e-6)
    assert logits.dtype == torch.bfloat16 and torch.equal(logits, expected_logits)

    # The gradient of the logits, written out in float64: (softmax(z) - q) / N, q the smoothed target.
    z = logits.detach().double()
    target = batch[1][batch[1] != IGNORE_INDEX]
    n, vocab = z.shape
    q = torch.full_like(z, 0.1 / vocab).scatter_add_(1, target[:, None], torch.full((n, 1), 0.9, dtype=z.dtype))
    p = z.softmax(-1)
    exact = (p - q) / n
    # Rounded once to bf16 means within half a bf16 step of the exact value, give or take the fp32
    # arithmetic before the rounding, which may carry a value at a rounding boundary across it:
    # PyTorch's vectorized softmax uses an exp good to 20 fp32 steps (exp_u20; seen: 1.2e-6 with
    # ATEN_CPU_CAPABILITY=avx2), and 4e-6 is ~64 steps, far below the half step a bias would add.
    half_step = torch.exp2(torch.floor(torch.log2(exact.abs().clamp_min(1e-30))) - 8)
    fp32_slack = 4e-6 * (p + q) / n
    for name, got in (("kernel", logits.grad), ("PyTorch", expected_logits.grad)):
        error = (got.double() - exact).abs()
        assert got.dtype == torch.bfloat16 and bool((error <= half_step + fp32_slack).all()), (name, error.max())

    # Everything below the logits is PyTorch's own backward: fed the kernel's logit gradient, it
    # gives the parameter gradients of the kernel's run. (Comparing those with the PyTorch run's
    # instead compares bf16 roundings of a value at a rounding boundary, which flip by the CPU.)
    run.model.zero_grad()
    expected_logits.backward(logits.grad)
    replayed = [p.grad for p in run.model.parameters() if p.grad is not None]
    for with_kernel, replay in zip(grads, replayed, strict=True):
        torch.testing.assert_close(with_kernel, replay, atol=0, rtol=0)


def test_train_batch_depends_only_on_the_generator_seed_and_the_index(mlm_run):
    task, other = reopen(mlm_run), reopen(mlm_run)
    a = task.train_batch(3, torch.Generator().manual_seed(7))
    b = other.train_batch(3, torch.Generator().manual_seed(7))
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    c = task.train_batch(4, torch.Generator().manual_seed(7))
    d = task.train_batch(3, torch.Generator().manual_seed(8))
    assert not torch.equal(a[1], c[1]) and not torch.equal(a[1], d[1])


def test_labels_hold_the_original_token_at_chosen_positions_only(mlm_run):
    task = reopen(mlm_run)
    tok = task.tokenizer
    blocks = {tuple(row) for row in task.blocks["train"].tolist()}
    inputs, labels = task.train_batch(0, torch.Generator().manual_seed(11))
    assert inputs.shape == labels.shape == (16, task.model_config.max_len)
    chosen = labels != IGNORE_INDEX
    # Put the labels back where they were chosen: every row must be a block of the corpus, so the
    # labels are the original tokens there, and the unchosen positions were left alone.
    restored = torch.where(chosen, labels, inputs)
    assert all(tuple(row) in blocks for row in restored.tolist())
    assert not chosen[:, 0].any() and not chosen[:, -1].any()  # [CLS] and [SEP] are never predicted
    share = chosen.float().mean().item()
    assert 0.08 < share < 0.22, share
    masked = (inputs[chosen] == tok.mask_id).float().mean().item()
    assert 0.6 < masked < 0.95, masked
    assert (inputs[~chosen] != tok.mask_id).all()


def test_blocks_are_cls_body_sep_without_padding(mlm_run):
    task = reopen(mlm_run)
    tok = task.tokenizer
    for split, blocks in task.blocks.items():
        assert blocks.size(1) == task.model_config.max_len, split
        assert (blocks[:, 0] == tok.cls_id).all() and (blocks[:, -1] == tok.sep_id).all()
        body = blocks[:, 1:-1]
        for special in (tok.pad_id, tok.cls_id, tok.sep_id, tok.mask_id):
            assert not (body == special).any(), (split, special)
    # The body is the text's token stream in order: the first block starts with the first line's tokens.
    first_line = next(
        line for line in (WIKITEXT / "train.txt").read_text(encoding="utf-8").splitlines() if line.strip()
    )
    start = tok.encode(first_line.replace("<unk>", "[UNK]"))[:10]
    assert task.blocks["train"][0, 1 : 1 + len(start)].tolist() == start


@pytest.mark.parametrize("marker", ["<unk>", ""])
def test_wikitext_unk_is_read_as_the_single_unk_token(tmp_path, marker):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    line = "the old <unk> sat on the mat .\n"
    for name in ("train.txt", "valid.txt"):
        (corpus / name).write_text(" = Heading = \n" + line * 40, encoding="utf-8")
    config = resolve(encoder_doc("mlm", corpus, data={"vocab_size": 100, "unknown_word": marker}))
    task = MaskedLM(config.data, config.model, tmp_path, batch_size=4)
    tok = task.tokenizer
    stream = task.blocks["train"][:, 1:-1].flatten().tolist()
    pattern = tok.encode("the old") + [tok.unk_id] + tok.encode("sat on the mat .")
    assert len(pattern) == 8
    text = "".join(tok.decode([i]) + " " for i in stream)
    if marker:
        assert stream.count(tok.unk_id) >= 30 and "<" not in text
        n = len(pattern)
        at = stream.index(tok.unk_id) - 2  # the first full sentence
        assert stream[at : at + n] == pattern
    else:  # the marker left as text: WordPiece splits it into pieces, none of them [UNK]
        assert tok.unk_id not in stream and "<" in text


def test_eval_cli_on_the_test_split(mlm_run, capsys):
    code, out, err = cli(capsys, "eval", mlm_run, "--split", "test", "--json")
    assert code == 0, err
    metrics = json.loads(out)
    assert 0.0 <= metrics["accuracy"] <= 1.0
    assert metrics["test_ppl"] == pytest.approx(math.exp(metrics["test_loss"]), rel=1e-6)
    assert metrics["masked_tokens"] > 0 and metrics["split"] == "test"
    assert json.loads(cli(capsys, "eval", mlm_run, "--split", "test", "--json")[1]) == metrics


def test_bpe_vocabulary_option(tmp_path):
    config = resolve(encoder_doc("mlm", WIKITEXT, data={"vocab_size": 300, "tokenizer": "bpe"}))
    task = MaskedLM(config.data, config.model, tmp_path, batch_size=4)
    saved = json.loads((tmp_path / "tokenizer.json").read_text(encoding="utf-8"))
    assert saved["model"]["type"] == "BPE" and task.tokenizer.mask_id == 4
    assert any(p.startswith("##") for p in task.tokenizer.tokenizer.get_vocab())
    assert task.blocks["train"].shape[1] == task.model_config.max_len
    with pytest.raises(Exception, match="wordpiece"):
        resolve(encoder_doc("mlm", WIKITEXT, data={"tokenizer": "sentencepiece"}))


def test_a_treebank_folder_is_read_as_the_words_of_its_sentences(tmp_path):
    config = resolve(encoder_doc("mlm", UD, data={"vocab_size": 300}))
    task = MaskedLM(config.data, config.model, tmp_path, batch_size=4, splits=("train", "val", "test"))
    tok = task.tokenizer
    width = task.model_config.max_len - 2
    for split, name in (("train", "train"), ("val", "dev"), ("test", "test")):
        sentences = conllu_words(UD / f"en_ewt-ud-{name}.conllu")
        stream = [i for fields in sentences for i in tok.encode(" ".join(f[1] for f in fields))]
        n = len(stream) // width
        assert n >= 1 and task.blocks[split].shape == (n, width + 2), split
        assert task.blocks[split][:, 1:-1].flatten().tolist() == stream[: n * width], split


def test_continued_pre_training_takes_the_source_vocabulary_shape_and_every_weight(mlm_run, tmp_path):
    source = load(mlm_run)
    doc = encoder_doc("mlm", UD, data={"init_from": str(mlm_run), "vocab_size": 150})
    doc["model"].update(d_model=48, n_heads=4, dropout=0.2)  # the shape is the source's; dropout this run's
    config = resolve(doc)
    task = MaskedLM(config.data, config.model, tmp_path, batch_size=4)
    assert task.tokenizer.tokenizer.get_vocab() == source.tokenizer.tokenizer.get_vocab()
    assert task.model_config == dataclasses.replace(source.config.model, dropout=0.2)
    model = task.build_model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    task.initialize(model)
    ours, theirs = model.state_dict(), source.model.state_dict()
    assert ours.keys() == theirs.keys() and any(k.startswith("head.dense") for k in ours)
    for name, tensor in theirs.items():
        torch.testing.assert_close(ours[name], tensor, rtol=0, atol=0, msg=name)
    assert not torch.equal(before["head.dense.weight"], ours["head.dense.weight"])
    assert model.head.decoder.weight is model.embeddings.token.weight  # still tied


def test_continued_pre_training_from_the_cli_starts_at_the_source_and_resumes(mlm_run, tmp_path, capsys):
    out = tmp_path / "continued"
    flags = ["--set=train.batch_size=4", "--set=train.eval_iters=1", "--set=train.eval_interval=2", "--quiet"]
    args = ["train", "wikitext2-mlm", "--data-dir", UD, "--init-from", mlm_run, "--out", out, *flags]
    code, _, err = cli(capsys, *args, "--set=train.max_iters=2", "--set=train.device=cpu")
    assert code == 0, err
    run = load(out)
    assert run.config.model.d_model == load(mlm_run).config.model.d_model  # not the preset's 256
    with open(out / "metrics.csv", newline="") as f:
        first = next(r for r in csv.DictReader(f) if r["kind"] == "eval")
    assert first["step"] == "0"
    # Step 0 is the source model itself, scored on the treebank's dev text.
    task = MaskedLM(run.config.data, run.config.model, out, resume=True, batch_size=4)
    expected = task.evaluate_during_training(load(mlm_run).model, torch.device("cpu"), eval_iters=1)
    assert float(first["val_loss"]) == pytest.approx(expected["val_loss"], rel=1e-4)
    code, _, err = cli(capsys, *args, "--resume", "--set=train.max_iters=4", "--set=train.device=cpu")
    assert code == 0, err
    assert load(out, checkpoint="last").step == 4
