"""`attnlab sample FOLDER` on a Hugging Face checkpoint folder: config.json's model_type picks the
importer, tokenizer.json the tokenizer, and greedy decoding prints what transformers' own model
would continue the prompt with."""

import json

import pytest
import torch

from attnlab.models.hf import load_causal_lm
from helpers import assert_user_error, cli
from hf_folders import BOS, EOS, causal_lm_folder

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

PROMPT = "ROMEO: What"


@torch.no_grad()
def hf_greedy(model: torch.nn.Module, tok, prompt: str, n: int) -> str:
    """transformers' model continuing `prompt` greedily for up to n tokens, stopping at EOS."""
    ids = tok.encode(prompt).ids  # with "<s>" first, as the post-processor says
    new: list[int] = []
    for _ in range(n):
        next_id = int(model(torch.tensor([ids + new])).logits[0, -1].argmax())
        if next_id == EOS:
            break
        new.append(next_id)
    # The text ends before a character its last bytes leave unfinished (decode.text.TextPieces.finish),
    # where the tokenizer's decode shows them as U+FFFD.
    return tok.decode(new, skip_special_tokens=False).rstrip("\ufffd")


@pytest.fixture
def folder(tmp_path, request):
    tok, model = causal_lm_folder(tmp_path, request.param)
    return tmp_path, tok, model


@pytest.mark.parametrize("folder", ["llama", "mixtral", "gpt2"], indirect=True)
def test_greedy_sample_prints_transformers_continuation(folder, capsys):
    path, tok, model = folder
    code, out, err = cli(
        capsys, "sample", path, "--prompt", PROMPT, "--temperature", "0", "--max-new-tokens", "12", "--json"
    )
    assert code == 0, err
    sample = json.loads(out)["samples"][0]
    assert sample == hf_greedy(model, tok, PROMPT, 12)
    assert sample  # a continuation was printed, not an immediate end of text


@pytest.mark.parametrize("folder", ["llama"], indirect=True)
def test_tokenizer_takes_special_ids_from_config_and_rules_from_the_file(folder):
    path, tok, _ = folder
    tokenizer = load_causal_lm(path).tokenizer
    assert (tokenizer.bos_id, tokenizer.eos_id) == (BOS, EOS)
    assert tokenizer.encode(PROMPT) == tok.encode(PROMPT).ids and tokenizer.encode(PROMPT)[0] == BOS
    assert tokenizer.decode(tokenizer.encode(PROMPT)[1:]) == PROMPT


@pytest.mark.parametrize("folder", ["llama"], indirect=True)
def test_sampling_from_an_unloadable_folder_is_one_line(folder, capsys):
    path, _, _ = folder
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "rope_scaling": {"rope_type": "longrope", "factor": 4.0}}))
    assert_user_error(cli(capsys, "sample", path, "--max-new-tokens", "3"), "config.json", "rope_type='longrope'")
    (path / "config.json").write_text(json.dumps({**config, "model_type": "t5"}))
    assert_user_error(cli(capsys, "sample", path, "--max-new-tokens", "3"), "model_type", "'t5'", "llama")
    (path / "config.json").write_text(json.dumps(config))
    (path / "tokenizer.json").unlink()
    assert_user_error(cli(capsys, "sample", path, "--max-new-tokens", "3"), "tokenizer.json")
