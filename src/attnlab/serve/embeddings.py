"""`POST /v1/embeddings`: OpenAI's embeddings API over BERT encoders.

A Hugging Face BERT folder (with its sentence-transformers pooling, `attnlab.tasks.embeddings`) or
an attnlab run with a BERT encoder (masked-lm, text-classification, token-classification) answers
it; the vectors are those of `attnlab embed`. `encoding_format: base64` sends each vector's float32
little-endian bytes, which is what the official `openai` client asks for by default and decodes.
"""

import base64
from typing import Any

import torch

from attnlab.serve.errors import APIError
from attnlab.serve.limits import Limits
from attnlab.serve.schemas import Embedding, EmbeddingRequest, EmbeddingResponse, EmbeddingUsage


def sentence_encoder(run: Any):
    """The `SentenceEncoder` of a served run: a BERT folder's own (with its pooling), a run's BERT
    encoder with the default mean pooling, or None for a model that has no sentence vectors."""
    from attnlab.data.tokenizers import WordPieceTokenizer
    from attnlab.models.bert import Bert
    from attnlab.tasks.embeddings import SentenceEncoder

    if getattr(run, "encoder", None) is not None:
        return run.encoder
    if isinstance(run.model, Bert) and isinstance(run.tokenizer, WordPieceTokenizer):
        return SentenceEncoder(run.model, run.tokenizer)
    return None


def token_rows(model, body: EmbeddingRequest, limits: Limits) -> list[list[int]]:
    """The token ids of each input ([CLS] and [SEP] not added); a 400 naming the input that is
    empty, too long, not text, or holds an id outside the vocabulary."""
    inputs = [body.input] if isinstance(body.input, str) or _is_ids(body.input) else body.input
    if len(inputs) > limits.max_inputs:
        raise APIError(400, f"input: {len(inputs)} inputs; at most {limits.max_inputs} per request", param="input")
    if body.dimensions is not None and body.dimensions != model.embedder.dim:
        raise APIError(
            400, f"dimensions: this model's vectors have {model.embedder.dim} dimensions", param="dimensions"
        )
    single = len(inputs) == 1 and body.input is inputs[0]
    rows = []
    for i, item in enumerate(inputs):
        param = "input" if single else f"input[{i}]"
        if isinstance(item, str):
            item = _encode(model.embedder, item, param, limits)
        if (problem := model.embedder.problem(item)) is not None:
            raise APIError(400, f"{param}: {problem}", param=param)
        rows.append(list(item))
    return rows


def _encode(embedder, text: str, param: str, limits: Limits) -> list[int]:
    """The ids of one text; a 400 when it is blank or longer than the server takes."""
    if len(text) > limits.max_text_chars:
        raise APIError(400, f"{param}: longer than this server's {limits.max_text_chars} characters", param=param)
    if not text.strip():
        raise APIError(400, f"{param}: the text is empty", param=param)
    return embedder.encode([text])[0]


def _is_ids(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and isinstance(value[0], int)


def response(model, body: EmbeddingRequest, rows: list[list[int]], vectors: torch.Tensor) -> EmbeddingResponse:
    """OpenAI's embedding list: one entry per input, in order."""
    as_base64 = body.encoding_format == "base64"
    data = [Embedding(index=i, embedding=_base64(v) if as_base64 else v.tolist()) for i, v in enumerate(vectors)]
    tokens = sum(len(row) + 2 for row in rows)  # with [CLS] and [SEP]
    return EmbeddingResponse(
        data=data, model=model.name, usage=EmbeddingUsage(prompt_tokens=tokens, total_tokens=tokens)
    )


def _base64(vector: torch.Tensor) -> str:
    return base64.b64encode(vector.to(torch.float32).numpy().astype("<f4").tobytes()).decode("ascii")
