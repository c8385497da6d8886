"""Chat templates rendered as `transformers` renders them: the same token ids as its
`apply_chat_template` on the same folder, for templates in the styles published checkpoints use;
refusals (`raise_exception`) and sandbox escapes become `ChatTemplateError`, a broken folder a
`CheckpointError`."""

import json

import pytest

from attnlab.errors import CheckpointError
from attnlab.serve.chat_template import ChatTemplateError, read_chat_template
from hf_folders import BOS, EOS, write_tokenizer

transformers = pytest.importorskip("transformers")

# Llama 2 chat's template (meta-llama/Llama-2-7b-chat-hf): bos_token, eos_token, a system block,
# roles that must alternate.
LLAMA2 = (
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
    "{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}"
    "{% set system_message = false %}{% endif %}{% for message in loop_messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if loop.index0 == 0 and system_message != false %}"
    "{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}"
    "{% else %}{% set content = message['content'] %}{% endif %}"
    "{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ ' ' + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}"
)
# Zephyr's (HuggingFaceH4/zephyr-7b-beta): one statement a line, so trim_blocks and lstrip_blocks
# decide every newline.
ZEPHYR = (
    "{% for message in messages %}\n{% if message['role'] == 'user' %}\n{{ '<|user|>\n' + message['content'] + "
    "eos_token }}\n{% elif message['role'] == 'system' %}\n{{ '<|system|>\n' + message['content'] + eos_token }}\n"
    "{% elif message['role'] == 'assistant' %}\n{{ '<|assistant|>\n'  + message['content'] + eos_token }}\n"
    "{% endif %}\n{% if loop.last and add_generation_prompt %}\n{{ '<|assistant|>' }}\n{% endif %}\n{% endfor %}"
)
# Namespaces, loop controls, tojson (non-ASCII kept, HTML characters unescaped), indented blocks.
TOOLS = """{%- set ns = namespace(system='', turns=0) %}
{%- for message in messages %}
    {%- if message.role == 'system' %}
        {%- set ns.system = message.content %}
        {%- continue %}
    {%- endif %}
    {%- set ns.turns = ns.turns + 1 %}
  <turn n="{{ ns.turns }}" role="{{ message.role }}">{{ message.content | tojson }}</turn>
    {%- if message.content == 'STOP' %}{% break %}{% endif %}
{%- endfor %}
{% if ns.system %}[system: {{ ns.system }}]{% endif %}
{% for message in messages %}
    {% if loop.first %}first: {{ message.role }}{% endif %}
{% endfor %}
{% if add_generation_prompt %}<s>assistant:{% endif %}"""

# The turn formats of today's families, written here in their published shape: ChatML (Qwen2,
# Qwen3, SmolLM3), Llama 3's header blocks, Gemma's turns (a system prompt folded into the first
# user turn, "model" for the assistant) and Phi-3's tags.
CHATML = (
    "{%- for message in messages %}{{ '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' }}"
    "{%- endfor %}{%- if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{%- endif %}"
)
LLAMA3 = (
    "{{- bos_token }}{%- for message in messages %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] | trim "
    "+ '<|eot_id|>' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{%- endif %}"
)
GEMMA = (
    "{{ bos_token }}{%- if messages[0]['role'] == 'system' -%}{%- set first_user_prefix = messages[0]['content'] + "
    "'\n\n' -%}{%- set loop_messages = messages[1:] -%}{%- else -%}{%- set first_user_prefix = '' -%}"
    "{%- set loop_messages = messages -%}{%- endif -%}{%- for message in loop_messages -%}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}"
    "{{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else '') + message['content'] | trim "
    "+ '<end_of_turn>\n' }}{%- endfor -%}{%- if add_generation_prompt -%}{{ '<start_of_turn>model\n' }}{%- endif -%}"
)
PHI3 = (
    "{% for message in messages %}{{ '<|' + message['role'] + '|>' + '\n' + message['content'] + '<|end|>' + '\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>' + '\n' }}{% else %}{{ eos_token }}{% endif %}"
)

CHAT = [
    {"role": "system", "content": "Answer as a <b>bard</b> & briefly."},
    {"role": "user", "content": "  Who art thou? 你好 😀 "},
    {"role": "assistant", "content": "A poor player. ¿Qué?"},
    {"role": "user", "content": "Speak again."},
]


def folder_with(tmp_path, template, *, where="config", **config):
    """A folder with the test tokenizer and `template` in tokenizer_config.json (or in
    chat_template.jinja, or as named templates)."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    write_tokenizer(tmp_path)
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>", **config}
    if where == "file":
        (tmp_path / "chat_template.jinja").write_text(template, encoding="utf-8")
    elif where == "named":
        config["chat_template"] = [{"name": "tool_use", "template": "x"}, {"name": "default", "template": template}]
    else:
        config["chat_template"] = template
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    return tmp_path


def ours(folder, messages, add_generation_prompt=True) -> list[int]:
    from attnlab.models.hf._common import load_tokenizer

    tokenizer = load_tokenizer(folder / "tokenizer.json")
    template = read_chat_template(folder, tokenizer.decode)
    return template.encode(tokenizer, messages, add_generation_prompt=add_generation_prompt)


def theirs(folder, messages, add_generation_prompt=True) -> list[int]:
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    out = tok.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tokenize=True)
    return list(out["input_ids"] if hasattr(out, "keys") else out)


@pytest.mark.parametrize(
    "template, messages",
    [(LLAMA2, CHAT), (LLAMA2, CHAT[1:]), (ZEPHYR, CHAT), (ZEPHYR, CHAT[:2]), (TOOLS, CHAT), (TOOLS, [*CHAT[:2],
     {"role": "user", "content": "STOP"}, *CHAT[2:]]), (CHATML, CHAT), (LLAMA3, CHAT), (GEMMA, CHAT),
     (GEMMA, CHAT[1:]), (PHI3, CHAT)],
    ids=["llama2", "llama2-no-system", "zephyr", "zephyr-one-turn", "namespace-tojson", "loop-break", "chatml-qwen",
         "llama3", "gemma", "gemma-no-system", "phi3"],
)  # fmt: skip
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_the_same_ids_as_apply_chat_template(tmp_path, template, messages, add_generation_prompt):
    folder = folder_with(tmp_path, template)
    want = theirs(folder, messages, add_generation_prompt)
    assert ours(folder, messages, add_generation_prompt) == want
    assert len(want) > 20 and (template != LLAMA2 or want[0] == BOS)


@pytest.mark.parametrize("where", ["file", "named"])
def test_the_template_file_and_named_templates(tmp_path, where):
    folder = folder_with(tmp_path, ZEPHYR, where=where)
    assert ours(folder, CHAT) == theirs(folder, CHAT)


def test_special_tokens_are_read_as_special_and_written_by_the_template(tmp_path):
    folder = folder_with(tmp_path, LLAMA2, bos_token={"content": "<s>", "special": True, "__type": "AddedToken"})
    ids = ours(folder, CHAT[1:2])
    assert ids[0] == BOS and ids.count(BOS) == 1  # the template's bos_token once; the post-processor adds none
    two_turns = ours(folder, CHAT[1:])
    assert two_turns.count(EOS) == 1 and two_turns.count(BOS) == 2  # </s> after the assistant's turn


def test_a_refusal_and_the_sandbox_are_template_errors(tmp_path):
    folder = folder_with(tmp_path / "a", LLAMA2)
    with pytest.raises(ChatTemplateError, match="Conversation roles must alternate"):
        ours(folder, [CHAT[1], CHAT[1]])
    escape = "{{ messages.__class__.__mro__[1].__subclasses__() }}"
    with pytest.raises(ChatTemplateError, match="unsafe|not safely|access"):
        ours(folder_with(tmp_path / "b", escape), CHAT)
    mutate = "{% set x = messages.append({'role': 'user'}) %}{{ messages | length }}"
    with pytest.raises(ChatTemplateError):
        ours(folder_with(tmp_path / "c", mutate), CHAT)
    namespace = "{% set ns = namespace(_secret=1) %}{{ ns._secret }}"
    with pytest.raises(ChatTemplateError, match="_secret"):
        ours(folder_with(tmp_path / "d", namespace), CHAT)


def test_no_template_and_broken_files(tmp_path):
    folder = folder_with(tmp_path / "none", None)
    assert read_chat_template(folder, str) is None
    with pytest.raises(CheckpointError, match="not a Jinja template"):
        read_chat_template(folder_with(tmp_path / "syntax", "{% for m in messages %}"), str)
    bad = folder_with(tmp_path / "json", ZEPHYR)
    (bad / "tokenizer_config.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(CheckpointError, match="is not JSON"):
        read_chat_template(bad, str)
    named = folder_with(tmp_path / "named", ZEPHYR)
    (named / "tokenizer_config.json").write_text(json.dumps({"chat_template": [{"name": "rag", "template": "x"}]}))
    with pytest.raises(CheckpointError, match="none named 'default'"):
        read_chat_template(named, str)


def test_the_end_of_turn_texts(tmp_path):
    folder = folder_with(tmp_path, ZEPHYR)
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [1, 0]}))
    names = {0: "<s>", 1: "</s>"}
    assert read_chat_template(folder, lambda ids: names[ids[0]]).end_of_turn == ("</s>", "<s>")
