"""The tool loop's one KV cache (`attnlab.decode.tool_use`): after a call, only the tool's answer
and what the template writes around it are read into the cache, and the tokens that follow are
those of the loop that prefills the rendered conversation afresh for each continuation (written
out here as the reference, on `generate_tokens`).

The model is a random GPT (`tiny_gpt`, whose greedy continuations wander over the vocabulary);
its call is forced by a picker that picks the call's tokens first and greedy tokens after, so the
call, the calculator's answer and the continuation after it are all exercised without training."""

import json

import pytest
import torch

from attnlab.data.chat_templates import carried_chat_template
from attnlab.data.conversations import ATTNLAB_TEMPLATE, ATTNLAB_TOKENS
from attnlab.data.tokenizers import BPETokenizer
from attnlab.decode.sampling import generate_tokens
from attnlab.decode.text import token_text
from attnlab.decode.tool_calls import HERMES
from attnlab.decode.tool_use import CALCULATOR, ToolResult, answer_calls, definitions, for_template, reply_with_tools
from decode.conftest import tiny_gpt

TOOLS = {"calculator": CALCULATOR}
QUESTION = "A crate holds 12 books. How many books are in 347 crates?"
CALL = {"name": "calculator", "arguments": {"expression": "347 * 12"}}
TEMPLATE_CALL = "<tool_call>" + json.dumps(CALL) + "</tool_call>"  # as attnlab's template writes it
TIGHT_CALL = "<tool_call>" + json.dumps(CALL, separators=(",", ":")) + "</tool_call>"  # as it does not
BUDGET = 60


@pytest.fixture(scope="module")
def tokenizer() -> BPETokenizer:
    texts = [QUESTION, TEMPLATE_CALL, TIGHT_CALL, "tool assistant user 4164 The answer is 4164."] * 20
    trained = BPETokenizer.train(texts, 400, special_tokens=("<|endoftext|>", *ATTNLAB_TOKENS))
    return BPETokenizer(trained.tokenizer, eos_id=trained.tokenizer.token_to_id(ATTNLAB_TOKENS[1]))


@pytest.fixture(scope="module")
def template(tokenizer):
    return carried_chat_template(ATTNLAB_TEMPLATE, tokenizer)


class Scripted:
    """A picker that picks `forced` first (a call and its end of turn), then the greedy token,
    and keeps every token it picked."""

    def __init__(self, forced: list[int]) -> None:
        self.forced, self.picked = forced, []

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:  # (1, V) -> (1,)
        n = len(self.picked)
        token = self.forced[n] if n < len(self.forced) else int(logits[0].argmax())
        self.picked.append(token)
        return torch.tensor([token])


def call_tokens(tokenizer: BPETokenizer, call: str) -> list[int]:
    return [*tokenizer.encode(call), tokenizer.eos_id]


def reprefilled(model, tokenizer, template, messages: list[dict], pick) -> list[list[int]]:
    """The reference loop: each part of the reply generated from a fresh prefill of the whole
    conversation as the template renders it; the tokens of each part (its end of turn included)."""
    parts, budget, calls = [], BUDGET, 0
    while True:
        ids = template.encode(tokenizer, for_template(messages), add_generation_prompt=True, tools=definitions(TOOLS))
        room = min(budget, model.config.block_size - len(ids))
        prompt = torch.tensor([ids])
        part = [int(t[0]) for t in generate_tokens(model, prompt, room, pick, eos_id=tokenizer.eos_id)]
        parts.append(part)
        budget -= len(part)
        text = "".join(token_text(tokenizer, part, template.end_of_turn))
        added, results = answer_calls(text, HERMES, TOOLS, calls + 1) if len(part) < room else ([], [])
        if not results:
            messages.append({"role": "assistant", "content": text})
            return parts
        messages.extend(added)
        calls += len(results)


def appended(model, tokenizer, template, messages: list[dict], pick) -> tuple[list, list[int]]:
    """The tool loop's items, and the number of tokens of each forward the model ran."""
    sizes: list[int] = []
    hook = model.register_forward_pre_hook(lambda module, args: sizes.append(args[0].size(1)))
    try:
        items = list(reply_with_tools(model, tokenizer, template, messages, BUDGET, pick, tools=TOOLS, context=None))
    finally:
        hook.remove()
    return items, sizes


def shared_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


@pytest.mark.parametrize("attention", ["full", "window"])
@pytest.mark.parametrize("call", [TEMPLATE_CALL, TIGHT_CALL], ids=["as-rendered", "rendered-otherwise"])
def test_appending_to_the_cache_gives_the_reprefilled_tokens(tokenizer, template, attention, call):
    """Greedy, the appending loop picks the tokens the re-prefilling loop picks, part for part, and
    the conversations it leaves are the same. With full attention it reads the conversation once,
    each token it picked once (but each part's last), and after the call what the rendered
    conversation adds past the longest prefix it shares with what was read: where the model wrote
    the call as the template renders it, exactly the end of the call's turn, the tool's answer and
    the assistant's header. Window attention's ring cannot be cut back: where the rendering parts
    from what was read, it reads the conversation again."""
    model = tiny_gpt(tokenizer.vocab_size, block_size=128, attention=attention, attention_window=32)
    forced = call_tokens(tokenizer, call)
    question = [{"role": "user", "content": QUESTION}]
    want_messages = [dict(m) for m in question]
    want_pick = Scripted(forced)
    want = reprefilled(model, tokenizer, template, want_messages, want_pick)
    messages = [dict(m) for m in question]
    pick = Scripted(forced)
    items, sizes = appended(model, tokenizer, template, messages, pick)

    assert len(want) == 2 and want[0] == forced and len(want[1]) > 1  # a call, then a continuation
    assert pick.picked == want_pick.picked == [*want[0], *want[1]]
    assert messages == want_messages and messages[2]["content"] == "4164"
    (result,) = [i for i in items if isinstance(i, ToolResult)]
    assert result.content == "4164" and json.loads(result.arguments) == CALL["arguments"]

    defined = definitions(TOOLS)
    first = template.encode(tokenizer, for_template(question), add_generation_prompt=True, tools=defined)
    second = template.encode(tokenizer, for_template(messages[:3]), add_generation_prompt=True, tools=defined)
    read = [*first, *want[0][:-1]]  # the conversation and the call, its end of turn picked but not read
    kept = shared_prefix(read, second)
    if attention == "window" and kept < len(read):
        kept = 0
    assert sizes == [len(first), *[1] * (len(want[0]) - 1), len(second) - kept, *[1] * (len(want[1]) - 1)]
    if call == TEMPLATE_CALL:
        assert kept == len(read)
        forced_in = tokenizer.decode(second[kept:])
        assert forced_in == "<|im_end|>\n<|im_start|>tool\n4164<|im_end|>\n<|im_start|>assistant\n"
    else:
        assert len(first) <= shared_prefix(read, second) < len(read)  # cut back inside the call


def test_a_reply_stops_where_the_cache_is_full(tokenizer, template):
    """The reply's tokens fit the one cache: a context shorter than the conversation and the
    budget cuts the reply at the context, its last token picked but not read."""
    model = tiny_gpt(tokenizer.vocab_size, block_size=128)
    messages = [{"role": "user", "content": QUESTION}]
    prompt = template.encode(tokenizer, for_template(messages), add_generation_prompt=True, tools=definitions(TOOLS))
    context = len(prompt) + 5
    pick = Scripted([])
    sizes: list[int] = []
    hook = model.register_forward_pre_hook(lambda module, args: sizes.append(args[0].size(1)))
    try:
        list(reply_with_tools(model, tokenizer, template, messages, BUDGET, pick, tools=TOOLS, context=context))
    finally:
        hook.remove()
    assert len(pick.picked) == 5 and sizes == [len(prompt), 1, 1, 1, 1]
    want = [int(t[0]) for t in generate_tokens(model, torch.tensor([prompt]), 5, Scripted([]))]
    assert pick.picked == want
