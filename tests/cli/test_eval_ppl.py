"""`attnlab eval FOLDER|RUN --data FILE`: the perplexity of a text under any language model attnlab
reads, against the sliding-window recipe of transformers' guide "Perplexity of fixed-length
models" written out below and run on transformers' own model of the same folder (or, for a run,
on the run's model through the same loop)."""

import json

import pytest
import torch
import torch.nn.functional as F

from attnlab import load
from attnlab.data.text import bundled_shakespeare
from attnlab.eval.perplexity import windows
from helpers import assert_user_error, cli
from hf_folders import causal_lm_folder

pytestmark = pytest.mark.slow

transformers = pytest.importorskip("transformers")

CONTEXT = 64  # the folders' n_positions / max_position_embeddings


@torch.no_grad()
def guide_perplexity(loss, input_ids: torch.Tensor, max_length: int, stride: int, *, count_scored: bool) -> float:
    """The guide's loop, as published (huggingface.co/docs/transformers/perplexity). `loss(input_ids,
    target_ids)` is `model(input_ids, labels=target_ids).loss`. count_scored=False counts tokens as the
    guide does (valid labels minus one per window); True counts the labels its loss really averaged,
    which differs only for a window whose first label is already -100 (overlapping windows)."""
    seq_len = input_ids.size(1)
    nll_sum, n_tokens, prev_end_loc = 0.0, 0, 0
    for begin_loc in range(0, seq_len, stride):
        end_loc = min(begin_loc + max_length, seq_len)
        trg_len = end_loc - prev_end_loc  # may be different from stride on last loop
        window = input_ids[:, begin_loc:end_loc]
        target_ids = window.clone()
        target_ids[:, :-trg_len] = -100
        neg_log_likelihood = loss(window, target_ids)
        num_valid_tokens = (target_ids != -100).sum().item()
        if count_scored:
            num_loss_tokens = (target_ids[:, 1:] != -100).sum().item()  # the labels left after the shift
        else:
            num_loss_tokens = num_valid_tokens - target_ids.size(0)  # the guide: minus batch_size for the shift
        nll_sum += neg_log_likelihood.double() * num_loss_tokens
        n_tokens += num_loss_tokens
        prev_end_loc = end_loc
        if end_loc == seq_len:
            break
    return torch.exp(nll_sum / n_tokens).item()


def attnlab_loss(model):
    """The loss transformers computes from `labels`, for an attnlab GPT: shift by one, ignore -100."""

    def loss(input_ids: torch.Tensor, target_ids: torch.Tensor) -> torch.Tensor:
        logits = model(input_ids)
        return F.cross_entropy(logits[:, :-1].flatten(0, 1), target_ids[:, 1:].flatten(), ignore_index=-100)

    return loss


@pytest.fixture(scope="module", params=["llama", "gpt2"])
def folder(tmp_path_factory, request):
    path = tmp_path_factory.mktemp(request.param)
    tok, model = causal_lm_folder(path, request.param)
    return path, tok, model


@pytest.fixture(scope="module")
def text_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("text") / "text.txt"
    path.write_text(bundled_shakespeare()[20_000:22_000], encoding="utf-8")
    return path


def perplexity_json(capsys, model, text_file, *flags) -> dict:
    code, out, err = cli(capsys, "eval", model, "--data", text_file, *flags, "--json")
    assert code == 0, err
    return json.loads(out)


@pytest.mark.parametrize("stride", [CONTEXT, 16])
def test_perplexity_of_a_folder_is_the_guides_with_transformers_model(folder, text_file, capsys, stride):
    path, tok, model = folder
    got = perplexity_json(capsys, path, text_file, "--context", CONTEXT, "--stride", stride)
    ids = torch.tensor([tok.encode(text_file.read_text(encoding="utf-8")).ids])  # "<s>" first, as tokenizer(text)

    def hf_loss(input_ids, target_ids):
        return model(input_ids, labels=target_ids).loss

    want = guide_perplexity(hf_loss, ids, CONTEXT, stride, count_scored=True)
    assert got["perplexity"] == pytest.approx(want, rel=1e-4)
    n = ids.size(1)  # disjoint windows predict none of their first tokens; overlapping ones all but the text's
    assert got["tokens"] == (n - -(-n // CONTEXT) if stride == CONTEXT else n - 1) and got["stride"] == stride
    published = guide_perplexity(hf_loss, ids, CONTEXT, stride, count_scored=False)
    if stride == CONTEXT:  # disjoint windows: the guide's count is every scored token, and so is ours
        assert published == pytest.approx(want, rel=1e-6)
    else:  # overlapping: it counts one token fewer per window than its loss averaged
        assert published != pytest.approx(want, rel=1e-7)


def test_defaults_are_the_models_context_and_half_of_it(folder, text_file, capsys):
    path, _, _ = folder
    got = perplexity_json(capsys, path, text_file)
    assert (got["context"], got["stride"]) == (CONTEXT, CONTEXT // 2)
    assert got["windows"] == len(windows(got["tokens"] + 1, CONTEXT, CONTEXT // 2))
    assert got["tokens_per_second"] > 0 and got["seconds"] > 0


def test_a_runs_perplexity_is_the_guides_loop_on_its_model(tiny_toml, corpus, tmp_path, capsys):
    assert cli(capsys, "train", tiny_toml, "--out", tmp_path / "run")[0] == 0
    run = load(tmp_path / "run")
    text = tmp_path / "text.txt"
    text.write_text(bundled_shakespeare()[30_000:31_000], encoding="utf-8")
    got = perplexity_json(capsys, tmp_path / "run", text, "--stride", 5)
    ids = torch.tensor([run.tokenizer.encode(text.read_text(encoding="utf-8"))])
    want = guide_perplexity(attnlab_loss(run.model), ids, 16, 5, count_scored=True)
    assert got["context"] == 16 and got["perplexity"] == pytest.approx(want, rel=1e-4)
    # Learned positions stop at block_size.
    assert_user_error(cli(capsys, "eval", tmp_path / "run", "--data", text, "--context", "17"), "--context 17", "16")


def test_the_text_line_gives_perplexity_and_speed(folder, text_file, capsys):
    path, _, _ = folder
    code, out, err = cli(capsys, "eval", path, "--data", text_file, "--stride", "64")
    assert code == 0, err
    assert "perplexity" in out and "tokens/s" in out and "stride 64" in out


def test_bad_input_is_one_line(folder, text_file, tmp_path, capsys):
    path, _, _ = folder
    assert_user_error(cli(capsys, "eval", path, "--data", text_file, "--context", "65"), "--context 65", "64")
    assert_user_error(cli(capsys, "eval", path, "--data", text_file, "--context", "32", "--stride", "33"), "--stride")
    assert_user_error(cli(capsys, "eval", path, "--data", text_file, "--stride", "0"), "--stride")
    assert_user_error(cli(capsys, "eval", path, "--data", tmp_path / "missing.txt"), "missing.txt")
    assert_user_error(cli(capsys, "eval", path, "--data", text_file, "--split", "val"), "--split")
    assert_user_error(cli(capsys, "eval", path), "Hugging Face folder", "--data")
    assert_user_error(cli(capsys, "eval", path, "--stride", "8"), "--data")
    no_tokenizer = tmp_path / "no-tokenizer"
    no_tokenizer.mkdir()
    for name in ("config.json", "model.safetensors"):
        (no_tokenizer / name).write_bytes((path / name).read_bytes())
    assert_user_error(cli(capsys, "eval", no_tokenizer, "--data", text_file), "tokenizer.json")
