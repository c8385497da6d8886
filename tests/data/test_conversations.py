"""Conversations: OpenAI's fine-tuning JSONL checked line by line (every error names the line), and
the assistant mask, token by token, against transformers' `return_assistant_tokens_mask` on the
same template written with `{% generation %}` blocks, for Qwen's ChatML, Llama 3's and attnlab's."""

import json

import pytest

from attnlab.data.conversations import (
    ATTNLAB_TEMPLATE,
    ConversationError,
    parse_line,
    read_conversations,
    render_conversation,
)
from hf_folders import write_tokenizer

transformers = pytest.importorskip("transformers")

# The published templates (tests/serve/test_chat_template.py), and each with the assistant's turn
# in a {% generation %} block: what transformers needs to compute the mask itself.
CHATML = (
    "{%- for message in messages %}{{ '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' }}"
    "{%- endfor %}{%- if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{%- endif %}"
)
CHATML_MARKED = (
    "{%- for message in messages %}{{ '<|im_start|>' + message.role + '\n' }}{%- if message.role == 'assistant' %}"
    "{% generation %}{{ message.content + '<|im_end|>' }}{% endgeneration %}{{ '\n' }}"
    "{%- else %}{{ message.content + '<|im_end|>\n' }}{%- endif %}"
    "{%- endfor %}{%- if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{%- endif %}"
)
LLAMA3 = (
    "{{- bos_token }}{%- for message in messages %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] | trim "
    "+ '<|eot_id|>' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{%- endif %}"
)
LLAMA3_MARKED = (
    "{{- bos_token }}{%- for message in messages %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' }}{%- if message.role == 'assistant' %}"
    "{% generation %}{{- message['content'] | trim + '<|eot_id|>' }}{% endgeneration %}"
    "{%- else %}{{- message['content'] | trim + '<|eot_id|>' }}{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{%- endif %}"
)
ATTNLAB_MARKED = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message.role + '\\n' }}"
    "{%- if message.role == 'assistant' %}{% generation %}"
    "{%- if message.content %}{{- message.content }}{%- endif %}{{- '<|im_end|>' }}"
    "{% endgeneration %}{{- '\\n' }}"
    "{%- else %}{{- message.content + '<|im_end|>\\n' }}{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
SPECIAL = ["<|im_start|>", "<|im_end|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]

CHAT = [
    {"role": "system", "content": "Answer as a <b>bard</b> & briefly."},
    {"role": "user", "content": "  Who art thou? 你好 😀 "},
    {"role": "assistant", "content": "A poor player. ¿Qué?"},
    {"role": "user", "content": "Speak again."},
    {"role": "assistant", "content": "Tomorrow, and tomorrow."},
]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """A Hugging Face tokenizer folder whose tokenizer knows the templates' special tokens."""
    path = tmp_path_factory.mktemp("tok")
    tok = write_tokenizer(path)
    tok.post_processor = None
    tok.add_special_tokens(SPECIAL)
    tok.save(str(path / "tokenizer.json"))
    return path, tok


def theirs(folder, template, messages) -> tuple[list[int], list[int]]:
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "chat_template": template,
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    out = tok.apply_chat_template(messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
    return list(out["input_ids"]), list(out["assistant_masks"])


@pytest.mark.parametrize(
    "plain, marked", [(CHATML, CHATML_MARKED), (LLAMA3, LLAMA3_MARKED), (ATTNLAB_TEMPLATE, ATTNLAB_MARKED)],
    ids=["chatml-qwen", "llama3", "attnlab"],
)  # fmt: skip
def test_the_mask_is_transformers_assistant_mask(folder, plain, marked):
    path, tok = folder
    want_ids, want_mask = theirs(path, marked, CHAT)
    conversation = parse_line(json.dumps({"messages": CHAT}), 1)
    special = {"bos_token": "<s>", "eos_token": "</s>"}
    for template in (plain, marked):  # incremental renders on the plain one; the blocks on the marked one
        got = render_conversation(conversation, template, special, tok)
        assert got.ids == want_ids
        assert [int(m) for m in got.mask] == want_mask
    # and token by token, the marked tokens are exactly each reply and its end-of-turn token
    runs, current = [], []
    for i, m in zip([*got.ids, None], [*got.mask, False], strict=False):  # a last False closes a run at the end
        if m:
            current.append(i)
        elif current:
            runs.append(tok.decode(current, skip_special_tokens=False)), current.clear()
    end = "<|eot_id|>" if plain is LLAMA3 else "<|im_end|>"
    assert runs == [m["content"] + end for m in CHAT if m["role"] == "assistant"]


def test_weight_zero_turns_and_tool_calls(folder):
    path, tok = folder
    line = open("tests/fixtures/chat/conversations.jsonl", encoding="utf-8").read().splitlines()
    tool, weighted = parse_line(line[-2], 11), parse_line(line[-1], 12)
    r = render_conversation(tool, ATTNLAB_TEMPLATE, {}, tok)
    text = tok.decode([i for i, m in zip(r.ids, r.mask, strict=False) if m], skip_special_tokens=False)
    call = '<tool_call>{"name": "calculator", "arguments": {"expression": "12 * 34"}}</tool_call>'
    assert text == call + "<|im_end|>12 * 34 = 408.<|im_end|>"
    r = render_conversation(weighted, ATTNLAB_TEMPLATE, {}, tok)
    marked = [i for i, m in zip(r.ids, r.mask, strict=False) if m]
    assert tok.decode(marked, skip_special_tokens=False) == "Sorry: 2 + 2 = 4.<|im_end|>"


@pytest.mark.parametrize(
    "line, why",
    [
        ('{"messages": [', "not JSON"),
        ('{"messages": [{"role": "bot", "content": "x"}]}', "unknown role 'bot'"),
        ('{"messages": [{"role": "user", "content": "x"}]}', "no assistant turn"),
        (
            '{"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y", "weight": 0}]}',
            "no assistant turn",
        ),
        (
            '{"messages": [{"role": "user", "content": 3}, {"role": "assistant", "content": "y"}]}',
            "content as a string",
        ),
        ('{"prompt": "x"}', '{"messages": [...]}'),
        ('{"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": null, "tool_calls": '
         '[{"type": "function", "function": {"name": "rm", "arguments": "{}"}}]}], "tools": '
         '[{"type": "function", "function": {"name": "calculator"}}]}', "unknown tool 'rm'"),
        ('{"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": null, "tool_calls": '
         '[{"type": "function", "function": {"name": "f", "arguments": "[1"}}]}]}', "tool call that is not"),
    ],
)  # fmt: skip
def test_bad_lines_name_the_line(tmp_path, line, why):
    good = '{"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]}'
    path = tmp_path / "c.jsonl"
    path.write_text(f"{good}\n\n{good}\n{line}\n", encoding="utf-8")
    with pytest.raises(ConversationError) as e:
        read_conversations(path)
    assert f"{path} line 4: " in str(e.value) and why in str(e.value)


def test_a_template_that_rewrites_earlier_turns_is_refused(folder):
    _, tok = folder
    rewrites = "{% for m in messages %}{{ m.content if loop.last else '[' + m.content + ']' }}{% endfor %}"
    conversation = parse_line(json.dumps({"messages": CHAT}), 7)
    with pytest.raises(ConversationError, match="line 7: .*generation"):
        render_conversation(conversation, rewrites, {}, tok)
