"""Text decoding: prompts, streamed pieces, stop strings, and byte-level tokens that split characters."""

from types import SimpleNamespace

import pytest
import torch
from torch import nn

from attnlab.data.tokenizers import BPETokenizer, CharTokenizer
from attnlab.decode import complete, encode_prompt, greedy, greedy_picker, sample, sampling_picker, stream_text
from attnlab.errors import UserError

CORPUS = "the quick brown fox jumps over the lazy dog.\nTHE FIVE BOXING WIZARDS JUMP QUICKLY!\n"
# Characters that the BPE below never saw are byte-level tokens, one per UTF-8 byte: decoding
# a prefix of their ids can end inside a character.
MULTIBYTE = "naïve café 日本語 🚀🎉 Ω≈√ — done\n"


@pytest.fixture
def char_tok() -> CharTokenizer:
    return CharTokenizer.train(CORPUS)


@pytest.fixture(scope="module")
def bpe_tok() -> BPETokenizer:
    return BPETokenizer.train([("hello world, plain ascii text.\n" * 10) + "café\n"], 300)


class ScriptedModel(nn.Module):
    """Emits a fixed list of token ids, one per call, whatever the input: stands in for a GPT
    whose greedy output is known in advance."""

    def __init__(self, script: list[int], vocab_size: int) -> None:
        super().__init__()
        self.script = script
        self.vocab_size = vocab_size
        self.calls = 0
        self.anchor = nn.Parameter(torch.zeros(1))  # complete() reads the device off a parameter
        self.config = SimpleNamespace(block_size=1024)

    def new_cache(self, batch_size: int, max_len: int | None = None) -> list[SimpleNamespace]:
        return [SimpleNamespace(length=0)]

    def forward(self, idx: torch.Tensor, cache=None, positions=None, last_only: bool = False) -> torch.Tensor:
        logits = torch.zeros(idx.size(0), 1, self.vocab_size)
        logits[:, 0, self.script[min(self.calls, len(self.script) - 1)]] = 1.0
        self.calls += 1
        return logits


def continuation(model, tok, prompt: str, n: int) -> str:
    """Independent reference: greedy ids, decoded at once."""
    idx = torch.tensor([tok.encode(prompt)])
    return tok.decode(greedy(model, idx, n)[0, idx.size(1) :].tolist())


# ------------------------------------------------------------------ prompts


def test_encode_prompt(char_tok):
    ids = encode_prompt(char_tok, "the fox")
    assert ids.dtype == torch.long and ids.shape == (1, 7)
    assert ids[0].tolist() == char_tok.encode("the fox")


def test_empty_prompt_starts_from_newline_for_char_tokenizer(char_tok, make_gpt):
    ids = encode_prompt(char_tok, "")
    assert ids.tolist() == [[char_tok.encode("\n")[0]]]
    model = make_gpt(vocab_size=char_tok.vocab_size)
    assert complete(model, char_tok, "", 20, greedy_picker()) == continuation(model, char_tok, "\n", 20)


def test_empty_prompt_without_newline_is_a_user_error():
    with pytest.raises(UserError, match="prompt"):
        encode_prompt(CharTokenizer.train("abc"), "")


def test_empty_prompt_starts_from_eos_for_bpe(bpe_tok):
    assert encode_prompt(bpe_tok, "").tolist() == [[bpe_tok.eos_id]]


# ------------------------------------------------------------------ streaming


def test_stream_equals_complete_equals_greedy(char_tok, make_gpt):
    model = make_gpt(vocab_size=char_tok.vocab_size)
    expected = continuation(model, char_tok, "the ", 40)  # 4 + 40 tokens: the window slides too
    assert len(set(expected)) >= 5, "the tiny model should produce varied text"
    pieces = list(stream_text(model, char_tok, encode_prompt(char_tok, "the "), 40, greedy_picker()))
    # One character per token, each yielded as soon as it is known.
    assert pieces == list(expected)
    assert complete(model, char_tok, "the ", 40, greedy_picker()) == expected


def test_stream_sampled_equals_complete_for_same_seed(char_tok, make_gpt):
    model = make_gpt(vocab_size=char_tok.vocab_size)

    def pick():
        return sampling_picker(0.9, top_k=8, generator=torch.Generator().manual_seed(5))

    streamed = "".join(stream_text(model, char_tok, encode_prompt(char_tok, "fox"), 30, pick()))
    assert streamed == complete(model, char_tok, "fox", 30, pick())
    assert len(streamed) == 30


def test_stop_string_cuts_before_its_first_occurrence(char_tok, make_gpt):
    model = make_gpt(vocab_size=char_tok.vocab_size)
    full = continuation(model, char_tok, "the ", 40)
    stop = full[14:17]
    cut = full.find(stop)
    assert 0 < cut <= 14
    ids = encode_prompt(char_tok, "the ")
    pieces = list(stream_text(model, char_tok, ids, 40, greedy_picker(), stop=[stop]))
    assert "".join(pieces) == full[:cut]
    assert all(stop not in p for p in pieces)
    assert complete(model, char_tok, "the ", 40, greedy_picker(), stop=[stop]) == full[:cut]


def test_earliest_of_several_stop_strings_wins(char_tok, make_gpt):
    model = make_gpt(vocab_size=char_tok.vocab_size)
    full = continuation(model, char_tok, "the ", 40)
    late, early = full[25:28], full[9:11]
    cut = min(full.find(late), full.find(early))
    out = complete(model, char_tok, "the ", 40, greedy_picker(), stop=[late, "never seen \x00", early])
    assert out == full[:cut]


def test_stop_string_that_never_completes_holds_nothing_back(char_tok, make_gpt):
    model = make_gpt(vocab_size=char_tok.vocab_size)
    full = continuation(model, char_tok, "the ", 40)
    # Starts with a character that occurs in the text, but never occurs whole.
    stop = full[-1] + "\x00\x00"
    ids = encode_prompt(char_tok, "the ")
    assert "".join(stream_text(model, char_tok, ids, 40, greedy_picker(), stop=[stop])) == full


def test_stop_string_inside_the_prompt_does_not_count(char_tok, make_gpt):
    model = make_gpt(vocab_size=char_tok.vocab_size)
    full = continuation(model, char_tok, "lazy dog", 20)
    assert "dog" not in full  # otherwise the check below would not isolate the prompt
    assert complete(model, char_tok, "lazy dog", 20, greedy_picker(), stop=["dog"]) == full


def test_streaming_is_incremental_with_stop_strings(char_tok, make_gpt):
    # Pieces come out while the model is still generating, not all at the end.
    model = make_gpt(vocab_size=char_tok.vocab_size)
    calls = []

    def counting_pick(logits: torch.Tensor) -> torch.Tensor:
        calls.append(1)
        return logits.argmax(dim=-1)

    stream = stream_text(model, char_tok, encode_prompt(char_tok, "the "), 40, counting_pick, stop=["\x00\x00"])
    first = next(stream)
    assert first and len(calls) <= 2
    rest = list(stream)
    assert first + "".join(rest) == continuation(model, char_tok, "the ", 40)
    assert len(calls) == 40


def test_stream_stops_at_eos(bpe_tok):
    script = bpe_tok.encode("hello world") + [bpe_tok.eos_id] + bpe_tok.encode(" after eos")
    model = ScriptedModel(script, bpe_tok.vocab_size)
    pieces = list(stream_text(model, bpe_tok, encode_prompt(bpe_tok, "x"), 50, greedy_picker()))
    assert "".join(pieces) == "hello world"


# ------------------------------------------------------------------ UTF-8 across byte-level tokens


def test_multibyte_script_really_splits_characters(bpe_tok):
    ids = bpe_tok.encode(MULTIBYTE)
    assert bpe_tok.decode(ids) == MULTIBYTE
    partial = [bpe_tok.decode(ids[:i]) for i in range(1, len(ids))]
    assert any(p.endswith("\ufffd") for p in partial), "no token boundary falls inside a character"


def test_streaming_never_yields_a_partial_character(bpe_tok):
    script = bpe_tok.encode(MULTIBYTE)
    model = ScriptedModel(script, bpe_tok.vocab_size)
    pieces = list(stream_text(model, bpe_tok, encode_prompt(bpe_tok, "x"), len(script), greedy_picker()))
    assert "".join(pieces) == MULTIBYTE
    assert not any("\ufffd" in p for p in pieces)
    assert len(pieces) > 5  # streamed piece by piece, not in one final flush


def test_multibyte_stop_string(bpe_tok):
    script = bpe_tok.encode(MULTIBYTE)
    ids = encode_prompt(bpe_tok, "x")
    # "本語": its first character is complete while the second is still partial bytes.
    for stop in ("🎉", "本語", "Ω≈", "— d"):
        model = ScriptedModel(script, bpe_tok.vocab_size)
        pieces = list(stream_text(model, bpe_tok, ids, len(script), greedy_picker(), stop=[stop]))
        assert "".join(pieces) == MULTIBYTE[: MULTIBYTE.find(stop)], stop
        assert not any("\ufffd" in p for p in pieces)


def test_a_character_cut_by_max_tokens_is_dropped(bpe_tok):
    script = bpe_tok.encode(MULTIBYTE)
    cuts = [n for n in range(1, len(script)) if bpe_tok.decode(script[:n]).endswith("\ufffd")]
    for n in cuts[:5]:
        model = ScriptedModel(script, bpe_tok.vocab_size)
        pieces = list(stream_text(model, bpe_tok, encode_prompt(bpe_tok, "x"), n, greedy_picker()))
        assert "".join(pieces) == bpe_tok.decode(script[:n]).rstrip("\ufffd")
        assert not any("\ufffd" in p for p in pieces)


def test_complete_with_scripted_multibyte_model(bpe_tok):
    script = bpe_tok.encode(MULTIBYTE)
    model = ScriptedModel(script, bpe_tok.vocab_size)
    assert complete(model, bpe_tok, "prompt", len(script), greedy_picker()) == MULTIBYTE


@pytest.mark.parametrize("seed", range(4))
def test_bpe_stream_of_a_random_model_matches_full_decode(bpe_tok, make_gpt, seed):
    model = make_gpt(vocab_size=bpe_tok.vocab_size, seed=seed)
    ids = encode_prompt(bpe_tok, "hello")
    pick = sampling_picker(1.0, generator=torch.Generator().manual_seed(seed))
    pieces = list(stream_text(model, bpe_tok, ids, 30, pick))
    # Reference: the same draws without eos handling, cut at the first eos, decoded at once.
    out = sample(model, ids, 30, temperature=1.0, generator=torch.Generator().manual_seed(seed))
    new = out[0, ids.size(1) :].tolist()
    if bpe_tok.eos_id in new:
        new = new[: new.index(bpe_tok.eos_id)]
    full = bpe_tok.decode(new).rstrip("\ufffd")  # a character cut by the end is dropped, not sent as U+FFFD
    assert "".join(pieces) == full
    if "\ufffd" not in full:
        assert not any("\ufffd" in p for p in pieces)


def test_empty_stop_string_is_ignored(make_gpt, char_tok):
    model = make_gpt(vocab_size=char_tok.vocab_size)
    full = complete(model, char_tok, "ab", 12, greedy_picker())
    assert complete(model, char_tok, "ab", 12, greedy_picker(), stop=[""]) == full != ""
