"""Structured outputs: `response_format` `{"type": "json_object"}` and `{"type": "json_schema", ...}`
by constrained decoding over the model's own tokenizer.

The schema is checked (`jsonschema`, draft 2020-12: an invalid schema is a 400 naming where it is
wrong), compiled once per request into a grammar by llguidance (Microsoft's Low-level Guidance,
the library behind llama.cpp's and vLLM's `guidance` backends; a schema it cannot compile is a 400
with its reason), and each choice gets a matcher of its own: before every step, the matcher's
bitmask of the tokens that may come next is applied to its row of the batch's logits
(`attnlab.decode.sampling.TokenMask`, `Batcher._advance`), so the sampler never sees a forbidden
token; after the pick the matcher takes the token, and once the JSON is complete (nothing but the
end may follow) the choice stops with finish_reason "stop". A schema whose text never ends is
bounded by max_tokens like any completion ("length").

Why llguidance rather than xgrammar: it takes any tokenizer as a list of token bytes (attnlab's
character tokenizer, a byte-level or SentencePiece BPE) or as the `tokenizers` file itself, with
no dependency (xgrammar pulls in torch, transformers and more); its masks are computed in Rust
with the interpreter's lock released, lazily per step (no ahead-of-time compilation of every
schema over the vocabulary); it reports unsupported schema keywords as errors rather than ignoring
them. The JSON is written with Python's `json.dumps` separators (", " and ": ") and no other
whitespace between tokens: a small model free to add whitespace can spend its whole budget on it,
and a model trained on `json.dumps` output writes it so.
"""

import functools
import logging
from collections.abc import Callable

import torch

from attnlab.errors import UserError
from attnlab.serve.errors import APIError
from attnlab.serve.schemas import ResponseFormat
from attnlab.serve.tokens import token_bytes

log = logging.getLogger(__name__)
PARAM = "response_format"
ANY_OBJECT = {"type": "object"}  # json_object: any JSON object, as OpenAI's JSON mode
COMPILE_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
BITS = torch.arange(32, dtype=torch.int32)


class GrammarMask:
    """One choice's matcher as a `TokenMask`: the tokens its grammar allows next."""

    def __init__(self, matcher) -> None:  # llguidance.LLMatcher
        self.matcher = matcher
        self.dead = False  # no token could continue: the row stops

    def allowed(self, vocab: int) -> torch.Tensor:
        """bool `(vocab,)`: the matcher's bitmask unpacked (bit j of word w is token 32 w + j);
        tokens past the grammar's vocabulary are not allowed."""
        if self.matcher.is_error():  # never after allowed tokens only; the row ends at this token
            return torch.ones(vocab, dtype=torch.bool)
        out = self.grammar_allows(vocab)
        if not out.any():  # a vocabulary that cannot go on (it lacks a character JSON needs here)
            log.warning("no token of the vocabulary can continue the grammar; the row ends at its next token")
            self.dead = True
            return torch.ones(vocab, dtype=torch.bool)  # a pick from all -inf logits would fail the whole batch
        return out

    def grammar_allows(self, vocab: int) -> torch.Tensor:
        """The grammar's own bool `(vocab,)`, which may allow nothing."""
        words = torch.frombuffer(bytearray(self.matcher.compute_bitmask()), dtype=torch.int32)  # (W,)
        bits = ((words[:, None] >> BITS) & 1).bool().view(-1)  # (32 W,)
        if bits.numel() >= vocab:
            return bits[:vocab]
        return torch.cat([bits, bits.new_zeros(vocab - bits.numel())])  # more logits than the tokenizer's tokens

    def accept(self, token: int) -> None:
        if not self.matcher.consume_token(token):
            log.warning("the grammar refused token %d: %s", token, self.matcher.get_error())

    @property
    def finished(self) -> bool:
        return self.dead or self.matcher.is_stopped() or self.matcher.is_error()


def masks_for(served, fmt: ResponseFormat | None) -> Callable[[int], GrammarMask] | None:
    """For a request's response_format: a function of a choice's index that gives the choice a
    matcher of its own, or None for plain text. A 400 naming the field for a schema that is not
    valid JSON Schema or that llguidance cannot compile. Compiling may take a while: call it from
    a worker thread."""
    if fmt is None or fmt.type == "text":
        return None
    schema = ANY_OBJECT if fmt.type == "json_object" else _schema_of(fmt)
    matcher = _compile(schema, served.run.tokenizer)
    vocab = min(served.run.tokenizer.vocab_size, served.run.model.config.vocab_size)
    if not GrammarMask(matcher.deep_copy()).grammar_allows(vocab).any():
        raise APIError(
            400,
            f"{PARAM}: no token of model {served.name!r}'s vocabulary can start this JSON (a character "
            "tokenizer knows only its corpus's characters)",
            param=PARAM,
        )
    return lambda choice: GrammarMask(matcher.deep_copy())


def _schema_of(fmt: ResponseFormat) -> dict:
    """The JSON Schema of a json_schema response format, checked against the metaschema."""
    if fmt.json_schema is None:
        raise APIError(400, f"{PARAM}.json_schema: required with type json_schema", param=f"{PARAM}.json_schema")
    schema = fmt.json_schema.schema_
    if schema is None:
        return ANY_OBJECT
    return check_schema(schema, f"{PARAM}.json_schema.schema")


def check_schema(schema: dict, param: str) -> dict:
    """`schema`, checked against JSON Schema's metaschema: a 400 naming where it is wrong under `param`."""
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import SchemaError

    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as e:
        where = param + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in e.path)
        raise APIError(400, f"{where}: not valid JSON Schema: {e.message}", param=where) from None
    return schema


def _compile(schema: dict, tokenizer):
    """The schema's grammar as an llguidance matcher over the tokenizer (a 400 saying why not)."""
    from llguidance import LLMatcher

    param = f"{PARAM}.json_schema.schema" if schema is not ANY_OBJECT else PARAM
    try:
        grammar = LLMatcher.grammar_from_json_schema(schema, overrides=COMPILE_OPTIONS)
    except ValueError as e:
        raise APIError(400, f"{param}: cannot be compiled for constrained decoding: {e}", param=param) from None
    return compile_grammar(grammar, tokenizer, param)


def compile_grammar(grammar: str, tokenizer, param: str):
    """An llguidance grammar (from a JSON schema, or Lark text with `%json` parts: the tool calls'
    wrappers) as a matcher over the tokenizer; a 400 under `param` saying why it cannot be."""
    from llguidance import LLMatcher

    lexicon = ll_tokenizer(tokenizer)
    failed, messages = LLMatcher.validate_grammar_with_warnings(grammar, lexicon)
    if failed:
        reason = messages[0].strip().splitlines()[0] if messages else "unknown reason"
        raise APIError(400, f"{param}: cannot be compiled for constrained decoding: {reason}", param=param)
    matcher = LLMatcher(lexicon, grammar, log_level=0)
    if matcher.is_error():
        reason = matcher.get_error().strip().splitlines()[0]
        raise APIError(400, f"{param}: cannot be compiled for constrained decoding: {reason}", param=param)
    return matcher


@functools.lru_cache(maxsize=16)
def ll_tokenizer(tokenizer):
    """llguidance's view of a tokenizer, made once per tokenizer: a `tokenizers`-backed BPE with an
    end-of-text token read from its own file; any other, from its tokens' bytes, with an end token
    of its own past the vocabulary (the model never picks it: the choice stops as soon as the
    grammar wants nothing but the end)."""
    from llguidance import LLTokenizer, TokenizerWrapper

    backend = getattr(tokenizer, "tokenizer", None)
    if backend is not None and tokenizer.eos_id is not None:
        return LLTokenizer(backend.to_str(), n_vocab=tokenizer.vocab_size, eos_token=tokenizer.eos_id)
    return LLTokenizer(TokenizerWrapper(_ByteVocabulary(tokenizer)), n_vocab=tokenizer.vocab_size + 1)


class _ByteVocabulary:
    """What `llguidance.TokenizerWrapper` reads of a tokenizer: each token's bytes, the end token
    (one past the vocabulary) and an encoder of text (bytes given)."""

    def __init__(self, tokenizer) -> None:
        found = token_bytes(tokenizer)
        self.tokenizer = tokenizer
        self.eos_token_id = tokenizer.vocab_size
        self.bos_token_id = None
        self.tokens = [*found.pieces, b"\xff[end]"]  # a leading 0xFF byte marks a special token
        self.special_token_ids = [*sorted(found.special), self.eos_token_id]

    def __call__(self, text: bytes) -> list[int]:
        decoded = text.decode("utf-8", errors="replace")
        try:
            return self.tokenizer.encode(decoded)
        except UserError:  # a character tokenizer's unknown characters: the known ones alone
            return [i for c in decoded for i in self._known(c)]

    def _known(self, char: str) -> list[int]:
        try:
            return self.tokenizer.encode(char)
        except UserError:
            return []
