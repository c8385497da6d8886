"""`attnlab.Chat`: a conversation with a chat model from Python, what `attnlab chat` holds in the
terminal. The history is OpenAI's chat messages; each reply is the model's answer to the whole
history, rendered by the model's chat template (a chat run's, a Hugging Face folder's, a GGUF
file's), its calls of the tools answered while it generates (`attnlab.decode.tool_use`).

chat = attnlab.Chat("runs/chat-sft", system="Be brief.")
chat.say("What is 347 * 12?")      # "347 * 12 = 4164." (the calculator answered the call)
for piece in chat.stream("And 12 * 12?"):   # text pieces as they come, and a ToolResult a call
    print(piece, end="")
chat.messages                      # the history: the calls and the tool's answers included
chat.reset()                       # forget it (the system prompt stays)

Importing this module imports no PyTorch: a `Chat` does, when it is made.
"""

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from attnlab.errors import UserError


class ConversationTooLong(UserError):
    """The conversation, the new message in it, no longer fits the model's context."""

    def __init__(self, tokens: int, context: int) -> None:
        super().__init__(f"the conversation is {tokens} tokens, past the context of {context}; reset() it")
        self.tokens, self.context = tokens, context


class Chat:
    """A conversation with a chat model.

    model: a path (a chat run's folder, a Hugging Face chat model's folder or GGUF file: what
        `attnlab chat` takes), or a model `attnlab.train.load.load_any` loaded.
    system: a system prompt, the first message of every conversation. tools: the names of the
        tools the model may call (`attnlab.decode.tool_use.TOOLS`); () for none.
    max_new_tokens: the longest reply in tokens, its calls included. temperature 0 (the default)
        decodes greedily; above it samples, after top_k and top_p, with a generator seeded by `seed`.
    template: the `ChatTemplate` to render with, instead of the model's own
        (`attnlab.tasks.chat.loaded_chat_template`).
    """

    def __init__(
        self,
        model: str | Path | Any,
        *,
        system: str | None = None,
        tools: Sequence[str] = ("calculator",),
        max_new_tokens: int = 512,
        temperature: float = 0.0,
        top_k: int | None = None,
        top_p: float | None = None,
        seed: int = 0,
        device: str = "cpu",
        template: Any = None,
    ) -> None:
        import torch

        from attnlab.decode import sampling_picker
        from attnlab.decode.tool_use import tools_named

        loaded = _loaded(model, device)
        self.model, self.tokenizer = loaded.model, loaded.tokenizer
        self.template = template if template is not None else _template(model, loaded)
        self.tools = tools_named(tools)
        generator = torch.Generator(device=next(self.model.parameters()).device).manual_seed(seed)
        self.pick = sampling_picker(temperature, top_k, top_p, generator)
        self.system, self.max_new_tokens = system, max_new_tokens
        self.context: int | None = getattr(self.model.config, "block_size", None)
        self.messages: list[dict] = []
        self.reset()

    def reset(self) -> None:
        """Forget the conversation; the system prompt stays."""
        self.messages = [{"role": "system", "content": self.system}] if self.system else []

    def say(self, text: str) -> str:
        """The model's reply to `text` (the text after its calls were answered); the exchange joins
        `messages`. A `UserError` when the conversation no longer fits the model's context."""
        return "".join(piece for piece in self.stream(text) if isinstance(piece, str))

    def stream(self, text: str) -> Iterator[Any]:
        """The reply to `text` as it is generated: its text in pieces (str) and, for each call a
        tool answered, an `attnlab.decode.tool_use.ToolResult`. Stopping early (closing the
        iterator) keeps what was said in `messages`. A `ConversationTooLong`, before anything is
        generated and with `messages` as they were, when the conversation no longer fits the context."""
        from attnlab.decode.tool_use import reply_with_tools

        self.messages.append({"role": "user", "content": text})
        try:
            self._check_context()
        except ConversationTooLong:
            self.messages.pop()
            raise
        options = dict(tools=self.tools, context=self.context)
        yield from reply_with_tools(
            self.model, self.tokenizer, self.template, self.messages, self.max_new_tokens, self.pick, **options
        )

    def _check_context(self) -> None:
        from attnlab.decode.tool_use import definitions, for_template

        if self.context is None:
            return
        ids = self.template.encode(self.tokenizer, for_template(self.messages), tools=definitions(self.tools))
        if len(ids) >= self.context:
            raise ConversationTooLong(len(ids), self.context)


def _loaded(model: str | Path | Any, device: str):
    """`model` loaded (`attnlab.tasks.sources.Loaded`) when it is a path; as it is otherwise."""
    if not isinstance(model, (str, Path)):
        return model
    from attnlab.train.load import load_any

    return load_any(model, command="chat", device=device)


def _template(model: str | Path | Any, loaded):
    """The model's own template; a model given loaded carries its template, or has none here (its
    folder is not known)."""
    from attnlab.tasks.chat import loaded_chat_template

    if isinstance(model, (str, Path)):
        return loaded_chat_template(model, loaded)
    if getattr(loaded, "chat_template", None) is None:
        raise UserError("this model carries no chat template; give Chat its path, or template=")
    return loaded_chat_template("", loaded)
