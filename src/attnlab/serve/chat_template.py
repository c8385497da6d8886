"""A chat model's template, as the server uses it: `attnlab.data.chat_templates`' `ChatTemplate`
(read from a Hugging Face folder's files, or carried in a checkpoint, rendered as `transformers`
renders it), re-exported here under the names the server's modules use.

A chat model's folder says how a conversation becomes text in a Jinja template (`chat_template` in
`tokenizer_config.json`, or the file `chat_template.jinja` beside it, which `transformers` prefers).
The template is code from the checkpoint's authors, so it runs in Jinja's immutable sandbox with
exactly what `transformers`' `apply_chat_template` gives it; same template, same messages: the same
token ids as `apply_chat_template` (`attnlab.data.chat_templates` says how).
"""

from attnlab.data.chat_templates import (
    ChatTemplate,
    TemplateRenderError,
    carried_chat_template,
    compile_template,
    read_chat_template,
)

ChatTemplateError = TemplateRenderError
"""The template refused the messages (`raise_exception`) or failed on them; the message says why."""
__all__ = ["ChatTemplate", "ChatTemplateError", "carried_chat_template", "compile_template", "read_chat_template"]
