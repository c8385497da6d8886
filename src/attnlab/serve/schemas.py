"""Request and response bodies of the API, as pydantic models (they also write the OpenAPI page).

The completion bodies follow OpenAI's legacy completions API (`POST /v1/completions`, the
`text_completion` object and its stream chunks), so the official `openai` client reads them
unchanged; `top_k` is ours. Every field of OpenAI's completion request is taken and means what it
means there (`logprobs`, `echo`, the penalties, `logit_bias`; `best_of` 1 or n, `suffix` empty);
other unknown fields are refused (a 400 naming the field) rather than silently ignored. Types are
strict, as OpenAI's are: `"max_tokens": "3"` or `"stream": "yes"` is a 400 naming the field, not
a value coerced (`STRICT`; an integer is still a number).
"""

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field


def _unicode(text: str) -> str:
    """JSON can carry lone UTF-16 surrogates ("\\ud800") that are not text: refuse them here rather
    than in the tokenizer."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("not valid Unicode text (it holds a lone surrogate)") from None
    return text


Text = Annotated[str, AfterValidator(_unicode)]
Seed = Annotated[int, Field(ge=-(2**63), le=2**64 - 1)]  # what torch.Generator.manual_seed takes
TokenIds = Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1)]
MAX_LOGPROBS = 5  # OpenAI's cap on `logprobs` of the legacy completions API
MAX_TOP_LOGPROBS = 20  # and on `top_logprobs` of chat completions
STRICT = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)
"""Every request body and its parts: unknown fields refused, no string taken for a number or a
boolean (pydantic's strict mode)."""


class Request(BaseModel):
    model_config = STRICT

    model: str = Field(description="a model id from GET /v1/models")


# -- completions ---------------------------------------------------------------------------------


class StreamOptions(BaseModel):
    model_config = STRICT

    include_usage: bool = Field(False, description="end the stream with a chunk that holds only `usage`")


# OpenAI's logit adjustments, the same in completions and chat (`attnlab.serve.completions.penalties`).
PresencePenalty = Annotated[
    float | None, Field(ge=-2, le=2, description="subtracted from the logit of every token generated so far")
]
FrequencyPenalty = Annotated[
    float | None,
    Field(ge=-2, le=2, description="times its count, subtracted from the logit of each token generated so far"),
]
LogitBias = Annotated[
    dict[str, Annotated[float, Field(ge=-100, le=100)]] | None,
    Field(description='token id (as a string) -> added to its logit, -100 to 100: {"50256": -100} bans it'),
]


class JSONSchemaFormat(BaseModel):
    """OpenAI's `response_format.json_schema`: the schema the reply's JSON follows."""

    model_config = ConfigDict(**STRICT, populate_by_name=True)

    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$", description="the schema's name (letters, digits, _ and -)")
    description: str | None = Field(None, description="what the reply is for; not used")
    schema_: dict[str, Any] | None = Field(
        None, alias="schema", description="a JSON Schema (draft 2020-12); absent: any JSON object"
    )
    strict: bool | None = Field(None, description="accepted; replies follow the schema exactly either way")


class ResponseFormat(BaseModel):
    """OpenAI's `response_format`: plain text, any JSON object, or JSON that follows a schema.
    Decoding is constrained to it token by token (`attnlab.serve.structured`)."""

    model_config = STRICT

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JSONSchemaFormat | None = Field(None, description="with type json_schema: the schema")


ResponseFormatField = Annotated[
    ResponseFormat | None,
    Field(description='{"type": "json_object"} or {"type": "json_schema", "json_schema": {"name", "schema"}}'),
]


class CompletionRequest(Request):
    """OpenAI's legacy completion request. null means the default, as in OpenAI's API."""

    prompt: (
        Text | Annotated[list[Text], Field(min_length=1)] | TokenIds | Annotated[list[TokenIds], Field(min_length=1)]
    ) = Field(
        "",
        description="text to continue, a list of texts, token ids, or a list of token-id lists; empty: start "
        "from the end-of-text token",
    )
    max_tokens: int | None = Field(16, ge=0, description="new tokens per completion (default 16)")
    temperature: float | None = Field(1.0, ge=0, le=2, description="softmax temperature; 0 = greedy")
    top_p: float | None = Field(1.0, gt=0, le=1, description="nucleus sampling")
    top_k: int | None = Field(None, ge=1, description="sample among the k most likely tokens (an attnlab extension)")
    n: int | None = Field(1, ge=1, description="completions per prompt")
    stream: bool | None = Field(False, description="send the text as server-sent events as it is generated")
    stream_options: StreamOptions | None = None
    stop: Text | Annotated[list[Text], Field(max_length=4)] | None = Field(
        None, description="up to 4 strings; the text ends before the first"
    )
    seed: Seed | None = Field(None, description="the same seed gives the same text; choice i uses seed + i")
    user: str | None = Field(None, description="accepted for compatibility, not used")
    echo: bool | None = Field(False, description="the prompt before the completion (and in `logprobs`)")
    logprobs: int | None = Field(
        None,
        ge=0,
        description=f"each token's log-probability under the model, with the N (at most {MAX_LOGPROBS}) most "
        "likely tokens at its position",
    )
    presence_penalty: PresencePenalty = 0.0
    frequency_penalty: FrequencyPenalty = 0.0
    logit_bias: LogitBias = None
    best_of: int | None = Field(1, ge=1, description="completions to choose the n best from: 1, or n (no choice)")
    suffix: Text | None = Field(None, description="text after the completion: not supported, empty only")
    response_format: ResponseFormatField = None

    @property
    def new_tokens(self) -> int:
        return 16 if self.max_tokens is None else self.max_tokens

    @property
    def per_prompt(self) -> int:
        return self.n or 1

    def stops(self) -> tuple[str, ...]:
        stop = [self.stop] if isinstance(self.stop, str) else (self.stop or [])
        return tuple(s for s in stop if s)  # an empty stop string would end every completion at once

    def prompts(self) -> list[str | list[int]]:
        """Each prompt: a text or a list of token ids."""
        single = isinstance(self.prompt, str) or isinstance(self.prompt[0], int)
        return [self.prompt] if single else list(self.prompt)

    @property
    def single_prompt(self) -> bool:
        """Whether `prompt` is one prompt (a text or token ids) rather than a list of them."""
        return isinstance(self.prompt, str) or isinstance(self.prompt[0], int)


class PromptTokensDetails(BaseModel):
    cached_tokens: int = Field(0, description="prompt tokens read from the prefix cache, not prefilled again")


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails = Field(default_factory=PromptTokensDetails)


class Logprobs(BaseModel):
    """OpenAI's `logprobs` of a legacy completion choice: a row per token, the prompt's first with
    `echo` (its `token_logprobs` and `top_logprobs` null: nothing comes before it)."""

    tokens: list[str] = Field(description="each token's text")
    token_logprobs: list[float | None] = Field(description="its log-probability under the model")
    top_logprobs: list[dict[str, float] | None] = Field(
        description="the `logprobs` most likely tokens at its position and the token itself, with theirs"
    )
    text_offset: list[int] = Field(description="where it starts in the prompt and completion's text")


class CompletionChoice(BaseModel):
    text: str
    index: int
    logprobs: Logprobs | None = None
    finish_reason: Literal["stop", "length"] | None


class Completion(BaseModel):
    """A whole completion (`stream: false`), or one server-sent event of a stream (`stream: true`:
    `choices` holds the new text of one choice; its last event sets `finish_reason`)."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


# -- models --------------------------------------------------------------------------------------


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "attnlab"
    task: str = Field(
        description="the run's task: language-model, translation, text-classification, token-classification "
        "or masked-lm"
    )
    endpoints: list[str] = Field(description="the paths this model answers, besides /v1/models")
    context: int | None = Field(description="the most tokens the model reads at once")
    max_prompt_tokens: int | None = Field(
        None, description="language models: the longest prompt taken (past `context`, only with max_tokens 0)"
    )


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


# -- the other families --------------------------------------------------------------------------


class TranslationRequest(Request):
    input: Text = Field(description="the source sentence")
    beam: int | None = Field(None, ge=1, description="beam size; 1 = greedy (default 5, or the server's cap)")


class TranslationResponse(BaseModel):
    """The translation and where the decoder looked while writing it: `attention[t][s]` is the
    weight of source token s when predicting target token t (last decoder layer, mean over heads)."""

    object: Literal["translation"] = "translation"
    model: str
    input: str
    translation: str
    source_tokens: list[str]
    target_tokens: list[str] = Field(description='the translation\'s tokens and a final "</s>"')
    source_labels: list[str] = Field(description="the source tokens as one-line labels (a space shown as ▁)")
    target_labels: list[str]
    attention: list[list[float]] = Field(description="(target tokens) x (source tokens), rows sum to 1")


class TextsRequest(Request):
    input: Text | Annotated[list[Text], Field(min_length=1)] = Field(description="a text or a list of texts")

    def texts(self) -> list[str]:
        return [self.input] if isinstance(self.input, str) else list(self.input)


class Classification(BaseModel):
    index: int
    input: str
    label: str
    probabilities: dict[str, float] = Field(description="every label's probability, most likely first")


class ClassificationResponse(BaseModel):
    object: Literal["list"] = "list"
    model: str
    data: list[Classification]


class TaggedWord(BaseModel):
    word: str
    tag: str = Field(description='"?" for a word past the model\'s length limit')
    probability: float
    probabilities: dict[str, float] = Field(description="every tag's probability, most likely first")


class Tagging(BaseModel):
    index: int
    input: str
    words: list[TaggedWord]


class TaggingResponse(BaseModel):
    object: Literal["list"] = "list"
    model: str
    data: list[Tagging]


class AttentionRequest(Request):
    input: Text = Field(description="the text to look at; translation: the source sentence")
    kind: Literal["self", "cross"] | None = Field(
        None, description="translation: cross (default) or the encoder's self-attention"
    )
    beam: int | None = Field(
        None, ge=1, description="translation: beam size of the translation shown (default 5, or the server's cap)"
    )


class AttentionResponse(BaseModel):
    """The data of `attnlab attention`'s HTML explorer (`attnlab.viz.html.attention_data`):
    `layers[l][h][q][k]` is the weight of key token k for query token q in head h of layer l."""

    object: Literal["attention"] = "attention"
    model: str
    kind: str
    causal: bool
    text: str
    output: str = Field(description="translation runs: the translation whose cross-attention is shown")
    query_tokens: list[str]
    key_tokens: list[str]
    query_labels: list[str]
    key_labels: list[str]
    layers: list[list[list[list[float]]]]
    decimals: int
    colours: list[str]


# -- embeddings ----------------------------------------------------------------------------------

TokenId = Annotated[int, Field(strict=True, ge=0)]  # strict: JSON true is not the token 1


class EmbeddingRequest(Request):
    """OpenAI's embedding request. A text may be given as its token ids (the model's WordPiece ids,
    [CLS] and [SEP] left for the server to add)."""

    input: (
        Text
        | Annotated[list[Text], Field(min_length=1)]
        | Annotated[list[TokenId], Field(min_length=1)]
        | Annotated[list[list[TokenId]], Field(min_length=1)]  # an empty row: a 400 naming it, after validation
    ) = Field(description="a text, a list of texts, one text's token ids, or a list of those")
    encoding_format: Literal["float", "base64"] | None = Field(
        "float", description="float: lists of numbers; base64: each vector's float32 little-endian bytes"
    )
    dimensions: int | None = Field(None, ge=1, description="accepted when it is the model's own width")
    user: str | None = Field(None, description="accepted for compatibility, not used")


class Embedding(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str


class EmbeddingUsage(BaseModel):
    prompt_tokens: int = Field(description="tokens the encoder read, [CLS] and [SEP] included")
    total_tokens: int


class EmbeddingResponse(BaseModel):
    object: Literal["list"] = "list"
    data: list[Embedding]
    model: str
    usage: EmbeddingUsage


# -- chat completions ----------------------------------------------------------------------------


class TextPart(BaseModel):
    model_config = STRICT

    type: Literal["text"] = Field(description="only text parts: these models read text")
    text: Text


class FunctionDefinition(BaseModel):
    """OpenAI's `tools[i].function`: a function the model may call."""

    model_config = STRICT

    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$", description="the function's name (letters, digits, _ and -)")
    description: str | None = Field(None, description="what it does; the chat template shows it to the model")
    parameters: dict[str, Any] | None = Field(None, description="its arguments' JSON Schema (absent: no arguments)")
    strict: bool | None = Field(None, description="accepted; a forced call follows the schema exactly either way")


class Tool(BaseModel):
    model_config = STRICT

    type: Literal["function"]
    function: FunctionDefinition


class FunctionName(BaseModel):
    model_config = STRICT

    name: str


class NamedToolChoice(BaseModel):
    """`tool_choice` `{"type": "function", "function": {"name": ...}}`: call this function."""

    model_config = STRICT

    type: Literal["function"]
    function: FunctionName


class FunctionCall(BaseModel):
    model_config = STRICT

    name: str
    arguments: str = Field(description="the arguments as a JSON object's text")


class ToolCall(BaseModel):
    """One call of a function: in an assistant message sent back, and in a reply."""

    model_config = STRICT

    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(BaseModel):
    """One turn of a conversation, as OpenAI's chat API writes it. A list of text parts is joined
    with newlines into one text before the chat template sees it. An assistant's turn may hold
    `tool_calls` (and no content); a `tool` message answers one of them by its `tool_call_id`."""

    model_config = STRICT

    role: Literal["system", "user", "tool", "assistant"]
    content: Text | list[TextPart] | None = None
    name: str | None = Field(None, description="passed to the chat template; most templates ignore it")
    tool_calls: list[ToolCall] | None = Field(None, description="an assistant's: the functions it called")
    tool_call_id: str | None = Field(None, description="a tool message's: the call it answers")

    def text(self) -> str:
        if self.content is None:
            return ""
        return self.content if isinstance(self.content, str) else "\n".join(p.text for p in self.content)


class ChatCompletionRequest(Request):
    """OpenAI's chat completion request. The conversation goes through the model's chat template;
    null means the default, as in OpenAI's API."""

    messages: Annotated[list[ChatMessage], Field(min_length=1)] = Field(description="the conversation so far")
    max_completion_tokens: int | None = Field(
        None, ge=0, description="new tokens per reply (default: the server's --max-tokens)"
    )
    max_tokens: int | None = Field(None, ge=0, description="the older name of max_completion_tokens")
    temperature: float | None = Field(1.0, ge=0, le=2, description="softmax temperature; 0 = greedy")
    top_p: float | None = Field(1.0, gt=0, le=1, description="nucleus sampling")
    top_k: int | None = Field(None, ge=1, description="sample among the k most likely tokens (an attnlab extension)")
    n: int | None = Field(1, ge=1, description="replies to the conversation")
    stream: bool | None = Field(False, description="send the reply as server-sent events as it is generated")
    stream_options: StreamOptions | None = None
    stop: Text | Annotated[list[Text], Field(max_length=4)] | None = Field(
        None, description="up to 4 strings; the reply ends before the first (it also ends at the model's end of turn)"
    )
    seed: Seed | None = Field(None, description="the same seed gives the same reply; choice i uses seed + i")
    presence_penalty: PresencePenalty = 0.0
    frequency_penalty: FrequencyPenalty = 0.0
    logit_bias: LogitBias = None
    logprobs: bool | None = Field(None, description="each reply token's log-probability under the model")
    top_logprobs: int | None = Field(
        None,
        ge=0,
        le=MAX_TOP_LOGPROBS,
        description=f"with logprobs: the N (at most {MAX_TOP_LOGPROBS}) most likely tokens at each position",
    )
    user: str | None = Field(None, description="accepted for compatibility, not used")
    response_format: ResponseFormatField = None
    tools: list[Tool] | None = Field(None, description="functions the model may call (`attnlab.serve.tools`)")
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = Field(
        None, description='"auto" (the default with tools), "none", "required", or a function by name'
    )
    parallel_tool_calls: bool | None = Field(None, description="whether a reply may call several (default true)")

    def new_tokens(self, default: int) -> int:
        """max_completion_tokens, else max_tokens, else `default`."""
        for value in (self.max_completion_tokens, self.max_tokens):
            if value is not None:
                return value
        return default

    def stops(self) -> tuple[str, ...]:
        stop = [self.stop] if isinstance(self.stop, str) else (self.stop or [])
        return tuple(s for s in stop if s)


class ChatReply(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    tool_calls: list[ToolCall] | None = Field(None, description="the functions the reply calls, if any")


class TopLogprob(BaseModel):
    token: str = Field(description="the token's text (a part of a character shows as U+FFFD)")
    logprob: float
    bytes: list[int] = Field(description="the token's own UTF-8 bytes")


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob] = Field(description="the top_logprobs most likely tokens here, most likely first")


class ChatLogprobs(BaseModel):
    """OpenAI's `logprobs` of a chat choice: a row per reply token, under the model's own
    distribution (before temperature, filters and penalties)."""

    content: list[TokenLogprob] | None
    refusal: None = None


class ChatChoice(BaseModel):
    index: int
    message: ChatReply
    logprobs: ChatLogprobs | None = None
    finish_reason: Literal["stop", "length", "tool_calls"] | None


class ChatCompletion(BaseModel):
    """A whole reply (`stream: false`). Streamed, each server-sent event is a `chat.completion.chunk`
    whose choices hold a `delta` (the first `{"role": "assistant", "content": ""}`, then the new
    text) and, in the last of each choice, the `finish_reason`."""

    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


# -- responses -----------------------------------------------------------------------------------


class InputText(BaseModel):
    """A text part of a Responses input message (`input_text`; an earlier reply's `output_text`)."""

    model_config = STRICT

    type: Literal["input_text", "output_text"]
    text: Text
    annotations: list | None = Field(None, description="accepted, not used")


class InputMessage(BaseModel):
    model_config = STRICT

    type: Literal["message"] | None = None
    role: Literal["system", "developer", "user", "assistant"]
    content: Text | list[InputText]
    id: str | None = None
    status: str | None = None

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "\n".join(p.text for p in self.content)


class FunctionCallItem(BaseModel):
    """A call an earlier reply made (`function_call`), sent back with its output."""

    model_config = STRICT

    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str
    id: str | None = None
    status: str | None = None


class FunctionCallOutput(BaseModel):
    """A call's result (`function_call_output`), answering the `function_call` of the same `call_id`."""

    model_config = STRICT

    type: Literal["function_call_output"]
    call_id: str
    output: Text
    id: str | None = None
    status: str | None = None


class FunctionTool(BaseModel):
    """A Responses function tool: the chat API's `function` fields at the top level."""

    model_config = STRICT

    type: Literal["function"]
    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class FunctionChoice(BaseModel):
    model_config = STRICT

    type: Literal["function"]
    name: str


class TextFormat(BaseModel):
    """`text.format`: the chat API's response_format, with the json_schema's fields at the top level."""

    model_config = ConfigDict(**STRICT, populate_by_name=True)

    type: Literal["text", "json_object", "json_schema"]
    name: str | None = Field(None, pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class TextConfig(BaseModel):
    model_config = STRICT

    format: TextFormat | None = None


class ResponsesRequest(Request):
    """OpenAI's `POST /v1/responses`, served through the chat path (`attnlab.serve.responses`)."""

    input: Text | Annotated[list[InputMessage | FunctionCallItem | FunctionCallOutput], Field(min_length=1)] = Field(
        description="a user message's text, or a list of messages, function calls and their outputs"
    )
    instructions: Text | None = Field(None, description="a system message before the input (not carried over)")
    max_output_tokens: int | None = Field(None, ge=0, description="new tokens (default: the server's --max-tokens)")
    temperature: float | None = Field(1.0, ge=0, le=2)
    top_p: float | None = Field(1.0, gt=0, le=1)
    top_k: int | None = Field(None, ge=1, description="an attnlab extension")
    seed: Seed | None = Field(None, description="an attnlab extension: the same seed gives the same reply")
    tools: list[FunctionTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | FunctionChoice | None = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    stream: bool | None = False
    previous_response_id: str | None = Field(None, description="go on from a stored response's conversation")
    store: bool | None = Field(True, description="keep the response for previous_response_id (within a bound)")
    metadata: dict[str, str] | None = None
    user: str | None = None
