"""One loader for every checkpoint source (`attnlab.tasks.sources.load_checkpoint`) and the one line
every command says about a path it cannot take (`attnlab.sources.refusal`), on real folders and
files: run folders of the run-format fixtures, tiny transformers folders, GGUF headers.

The refusals are checked through the real command line: one line, exit code 2, no traceback, the
words exact."""

import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from attnlab import families, sources
from attnlab.errors import CheckpointError
from attnlab.models.bert import Bert
from attnlab.models.gpt import GPT
from attnlab.tasks.sources import load_checkpoint
from attnlab.train.load import load_any
from helpers import assert_user_error, cli, hf_bert_folder
from hf_folders import PROMPT, causal_lm_folder
from run_format import FOLDER, INPUTS, LOGITS, PROBES, kept_values
from tolerance import assert_float32_close, gpt_sums

pytestmark = pytest.mark.slow

transformers = pytest.importorskip("transformers")
CAUSAL = sources.takes_words(sources.TAKES["sample"])
ENCODERS = sources.takes_words(sources.TAKES["embed"])


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> tuple[Path, torch.nn.Module]:
    folder = tmp_path_factory.mktemp("models") / "llama"
    _, model = causal_lm_folder(folder, "llama")
    return folder, model


@pytest.fixture(scope="module")
def bert(tmp_path_factory) -> Path:
    return hf_bert_folder(tmp_path_factory.mktemp("bert"))


# -- what_is --------------------------------------------------------------------------------------
def test_each_source_is_told_apart(llama, bert, tmp_path):
    folder, _ = llama
    run = sources.what_is(FOLDER / "gpt")
    assert (run.form, run.family) == (sources.RUN, None)
    hf = sources.what_is(folder)
    assert (hf.form, hf.model_type, hf.family.name) == (sources.HF_FOLDER, "llama", "Llama")
    assert hf.kind == families.CAUSAL_LM
    assert sources.what_is(bert).kind == families.ENCODER
    (tmp_path / "notes.txt").write_text("GGU")  # shorter than the magic
    assert sources.what_is(tmp_path / "notes.txt").form == sources.OTHER_FILE
    assert sources.what_is(tmp_path).form == sources.OTHER_FOLDER
    assert sources.what_is(tmp_path / "nothing").form == sources.MISSING


def test_a_gguf_file_is_known_by_its_magic_not_its_name(tmp_path):
    named = tmp_path / "model.gguf"
    named.write_bytes(b"not a gguf file at all")
    assert sources.what_is(named).form == sources.OTHER_FILE
    unnamed = tmp_path / "model.bin"
    unnamed.write_bytes(gguf_header({"general.architecture": "llama"}))
    found = sources.what_is(unnamed)
    assert (found.form, found.model_type, found.family.name) == (sources.GGUF, "llama", "Llama")


def gguf_header(strings: dict[str, str], *, before: int = 0) -> bytes:
    """A GGUF version 3 header with no tensors (llama.cpp's docs/gguf.md), written by hand: `before`
    keys of other types first (a u32, a string and an array of strings), then the string keys."""

    def text(s: str) -> bytes:
        return struct.pack("<Q", len(s.encode())) + s.encode()

    others = [
        text("general.quantization_version") + struct.pack("<II", 4, 2),  # a u32
        text("general.name") + struct.pack("<I", 8) + text("tiny"),
        text("tokenizer.ggml.tokens") + struct.pack("<IIQ", 9, 8, 2) + text("<s>") + text("a"),
    ][:before]
    kvs = others + [text(k) + struct.pack("<I", 8) + text(v) for k, v in strings.items()]
    return b"GGUF" + struct.pack("<IQQ", 3, 0, len(kvs)) + b"".join(kvs)


def test_the_architecture_is_read_past_keys_of_every_shape(tmp_path):
    path = tmp_path / "late.gguf"
    path.write_bytes(gguf_header({"general.architecture": "qwen3"}, before=3))
    assert sources.gguf_architecture(path) == "qwen3"
    path.write_bytes(gguf_header({"general.name": "x"}, before=3))  # no architecture at all
    assert sources.gguf_architecture(path) is None
    path.write_bytes(gguf_header({"general.architecture": "llama"})[:30])  # cut inside the key
    assert sources.gguf_architecture(path) is None


def test_the_header_reader_agrees_with_gguf_own_writer(tmp_path):
    gguf = pytest.importorskip("gguf")
    path = tmp_path / "written.gguf"
    writer = gguf.GGUFWriter(str(path), "gpt2")
    writer.add_name("tiny")
    writer.add_token_list(["<s>", "a", "b"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    assert sources.gguf_architecture(path) == "gpt2"


def test_the_classification_imports_no_torch():
    """The command line refuses a bad path before it imports PyTorch: this module must not."""
    code = "import sys, attnlab.sources; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.strip() == "False"


# -- the refusals, through the command line --------------------------------------------------------
def test_a_missing_path_names_a_near_sibling(llama, capsys):
    folder, _ = llama
    typo = folder.with_name("lama")
    result = cli(capsys, "sample", typo, "--prompt", "a")
    line = f"{typo} does not exist: no such folder or file (did you mean {folder}?); attnlab sample takes {CAUSAL}"
    assert_user_error(result, f"attnlab sample: error: {line}")
    far = folder.with_name("something-else")
    assert_user_error(cli(capsys, "sample", far), f"{far} does not exist: no such folder or file; attnlab sample")


def test_a_file_of_another_kind_is_said_to_be_one(tmp_path, capsys):
    text = tmp_path / "input.txt"
    text.write_text("hello\n")
    takes = sources.takes_words(sources.TAKES["serve"])
    line = f"{text} is a file but not a checkpoint (a GGUF file starts with GGUF); attnlab serve takes {takes}"
    assert_user_error(cli(capsys, "serve", text), f"attnlab serve: error: {line}")


def test_a_gguf_header_cut_short_is_said_to_be_truncated(tmp_path, capsys):
    """Only the magic and the version: the GGUF reader's words (truncated or corrupt), not an
    architecture of None that attnlab does not build."""
    pytest.importorskip("gguf")
    path = tmp_path / "model.gguf"
    path.write_bytes(b"GGUF\x03\x00\x00\x00")
    result = cli(capsys, "sample", path)
    assert_user_error(result, f"attnlab sample: error: {path} is a truncated or corrupt GGUF file")
    assert "does not build" not in result[2]


def test_a_folder_of_another_kind_names_the_commands_that_take_it(llama, bert, tmp_path, capsys):
    text = tmp_path / "f.txt"
    text.write_text("some text to score\n")
    result = cli(capsys, "eval", bert, "--data", text)
    line = (
        f"{bert} is a Hugging Face BERT folder (config.json's model_type is 'bert': an encoder), which attnlab eval "
        f"does not take; attnlab eval takes {CAUSAL}; use it with attnlab attention, attnlab embed, attnlab serve, "
        "attnlab train --init-from"
    )
    assert_user_error(result, f"attnlab eval: error: {line}")
    folder, _ = llama
    line = (
        f"{folder} is a Hugging Face Llama folder (config.json's model_type is 'llama': a causal language model), "
        f"which attnlab embed does not take; attnlab embed takes {ENCODERS}; use it with attnlab sample, "
        "attnlab chat, attnlab eval, attnlab attention, attnlab serve, attnlab train --init-from"
    )
    assert_user_error(cli(capsys, "embed", folder, "a text"), f"attnlab embed: error: {line}")


def test_a_model_type_attnlab_does_not_build_lists_the_families(tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "t5"}))
    line = (
        f"{tmp_path}: config.json's model_type is 't5', a family attnlab does not build (it builds "
        f"{families.names()}); attnlab sample takes {CAUSAL}"
    )
    assert_user_error(cli(capsys, "sample", tmp_path), f"attnlab sample: error: {line}")


def test_a_folder_holding_no_checkpoint_says_what_a_checkpoint_holds(tmp_path, capsys):
    line = (
        f"{tmp_path} is not a checkpoint: a folder with neither config.toml (an attnlab run) nor config.json "
        f"(a Hugging Face checkpoint) in it; attnlab sample takes {CAUSAL}"
    )
    assert_user_error(cli(capsys, "sample", tmp_path), f"attnlab sample: error: {line}")


def test_the_words_of_what_a_command_takes_come_from_the_table():
    causal = families.of_kind(families.CAUSAL_LM)
    assert f"a Hugging Face folder of {families.names(families.CAUSAL_LM)} " in CAUSAL
    assert all(t in CAUSAL for f in causal for t in f.model_types)
    assert not any(f.name in CAUSAL for f in families.of_kind(families.ENCODER))
    assert sources.takes_words(()) == "a run folder written by attnlab train"


# -- loading each source ---------------------------------------------------------------------------
def test_a_run_folder_loads_to_the_logits_it_gave():
    loaded = load_checkpoint(FOLDER / "gpt", command="sample")
    assert isinstance(loaded.model, GPT) and not loaded.model.training
    assert (loaded.task, loaded.family, loaded.kind, loaded.chat_template) == ("language-model", None, None, None)
    assert loaded.model_origin == f"{FOLDER / 'gpt'} (step {loaded.run.step})"
    assert loaded.tokenizer_origin == str(FOLDER / "gpt" / "tokenizer.json")
    names, logits = PROBES["gpt"]
    with torch.no_grad():
        got = kept_values(logits(loaded.model, load_file(FOLDER / "gpt" / INPUTS)))
    # As tests/train/test_run_format2.py: another CPU's summation order, 20 chained sums of <= 1,024 terms.
    assert_float32_close(got, load_file(FOLDER / "gpt" / LOGITS)["logits"], reduction=1024, depth=20)


def test_a_run_through_load_any_is_attnlab_load_run():
    loaded = load_any(FOLDER / "bert-classification", command="attention", checkpoint="last")
    assert type(loaded.run).__name__ == "Run" and loaded.run.config.task == "text-classification"
    assert loaded.task == "text-classification" and isinstance(loaded.model, Bert)


def test_a_causal_folder_loads_to_transformers_logits(llama):
    folder, reference = llama
    loaded = load_checkpoint(folder, command="sample")
    assert (loaded.family.name, loaded.kind, loaded.task, loaded.run) == ("Llama", families.CAUSAL_LM, None, None)
    assert loaded.model_origin == str(folder / "model.safetensors")
    assert loaded.tokenizer_origin == str(folder / "tokenizer.json") and loaded.chat_template_origin is None
    ids = loaded.tokenizer.encode(PROMPT)
    with torch.no_grad():
        got = loaded.model(torch.tensor([ids]))
        want = reference(torch.tensor([ids])).logits
    assert_float32_close(got, want, **gpt_sums(loaded.model.config))


def test_an_encoder_folder_loads_with_its_missing_pooler(bert):
    loaded = load_checkpoint(bert, command="embed", dtype=torch.float64)
    assert isinstance(loaded.model, Bert) and (loaded.family.name, loaded.kind) == ("BERT", families.ENCODER)
    assert next(loaded.model.parameters()).dtype == torch.float64
    assert loaded.tokenizer_origin == str(bert / "vocab.txt")
    assert any(name.startswith("pooler") for name in loaded.missing)  # a BertForMaskedLM has none


def test_the_command_decides_what_loads(llama, bert):
    folder, _ = llama
    with pytest.raises(CheckpointError, match="which attnlab embed does not take"):
        load_checkpoint(folder, command="embed")
    with pytest.raises(CheckpointError, match="which attnlab sample does not take"):
        load_checkpoint(bert, command="sample")
    assert load_checkpoint(bert, command="attention").kind == families.ENCODER


def test_a_gguf_file_loads_as_its_reader_reads_it(tmp_path):
    """The routing only: that the file's model scores like transformers' is tests/models/hf/test_gguf.py's."""
    gguf_reader = pytest.importorskip("attnlab.models.hf.gguf", reason="attnlab.models.hf.gguf is not written yet")
    import gguf_files

    gguf_files.hf_folder(tmp_path / "llama", "llama")
    out = tmp_path / "llama-f32.gguf"
    gguf_files.convert([(tmp_path / "llama", "f32", out)])  # skips without llama.cpp's converter
    loaded, direct = load_checkpoint(out, command="serve"), gguf_reader.load_gguf(out)
    assert (loaded.family.name, loaded.kind, loaded.task) == ("Llama", families.CAUSAL_LM, None)
    assert (loaded.model_origin, loaded.tokenizer_origin) == (str(out), str(out))
    assert loaded.chat_template == direct.chat_template
    assert loaded.chat_template_origin == (None if direct.chat_template is None else f"{out} (tokenizer.chat_template)")
    assert loaded.tokenizer.encode(PROMPT) == direct.tokenizer.encode(PROMPT)
    state, want = loaded.model.state_dict(), direct.model.state_dict()
    assert state.keys() == want.keys() and all(torch.equal(state[k], want[k]) for k in want)


def test_attnlab_load_refuses_what_is_no_run_in_the_same_words(llama):
    import attnlab

    folder, _ = llama
    with pytest.raises(CheckpointError) as e:
        attnlab.load(folder)
    assert str(e.value) == (
        f"{folder} is a Hugging Face Llama folder (config.json's model_type is 'llama': a causal language model), "
        "which attnlab.load does not take; attnlab.load takes a run folder written by attnlab train; use it with "
        "attnlab sample, attnlab chat, attnlab eval, attnlab attention, attnlab serve, attnlab train --init-from"
    )
