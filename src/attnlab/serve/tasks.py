"""`POST /v1/translations`, `/v1/classifications` and `/v1/tags`: a trained run of a text task
applied by its task object (`attnlab.tasks.open_task`, the server's `ServedModel.helper`), as
`attnlab translate`, `classify` and `tag` apply it. Each call runs in a thread of the pool, one at
a time per model (`ServedModel.call`)."""

import functools

from fastapi import Request

from attnlab.names import API
from attnlab.serve.errors import APIError
from attnlab.serve.requests import check_beam, check_text, check_texts, encode, find, server_limits
from attnlab.serve.schemas import (
    Classification,
    ClassificationResponse,
    TaggedWord,
    Tagging,
    TaggingResponse,
    TextsRequest,
    TranslationRequest,
    TranslationResponse,
)


async def translate(body: TranslationRequest, request: Request) -> TranslationResponse:
    """Translate a sentence by beam search; with the decoder's cross-attention over it."""
    from attnlab.viz.attention import display_token

    model, limits = find(request, body.model, API.translations), server_limits(request)
    beam = check_beam(body.beam, limits)
    text = check_text(body.input, "input", limits)
    ids = encode(model.helper.tokenizer, text.strip(), "input")  # as `attnlab translate` reads a line
    limit = model.helper.data_config.max_len
    if len(ids) > limit:
        raise APIError(400, f"input: {len(ids)} tokens, but this model takes at most {limit}", param="input")
    align = functools.partial(model.helper.align, model.run.model, ids, model.device, beam=beam)
    found = await model.call(limits.max_queue, align)
    return TranslationResponse(
        model=model.name,
        input=body.input,
        translation=found.translation,
        source_tokens=found.source_tokens,
        target_tokens=found.target_tokens,
        source_labels=[display_token(t) for t in found.source_tokens],
        target_labels=[display_token(t) for t in found.target_tokens],
        attention=found.weights.tolist(),
    )


async def classify(body: TextsRequest, request: Request) -> ClassificationResponse:
    """The label of each text, with every label's probability."""
    model, limits = find(request, body.model, API.classifications), server_limits(request)
    texts = check_texts(body, limits)
    found = await model.call(limits.max_queue, model.helper.classify, model.run.model, texts, model.device)
    data = [
        Classification(index=i, input=t, label=r["label"], probabilities=by_probability(r["probabilities"]))
        for i, (t, r) in enumerate(zip(texts, found, strict=True))
    ]
    return ClassificationResponse(model=model.name, data=data)


async def tag(body: TextsRequest, request: Request) -> TaggingResponse:
    """Each word's tag (words split off as in UD English), with every tag's probability."""
    model, limits = find(request, body.model, API.tags), server_limits(request)
    texts = check_texts(body, limits)
    found = await model.call(limits.max_queue, model.helper.tag_probabilities, model.run.model, texts, model.device)
    data = [
        Tagging(index=i, input=t, words=[tagged_word(w, p) for w, p in words])
        for i, (t, words) in enumerate(zip(texts, found, strict=True))
    ]
    return TaggingResponse(model=model.name, data=data)


def by_probability(probabilities: dict[str, float]) -> dict[str, float]:
    return dict(sorted(probabilities.items(), key=lambda item: -item[1]))


def tagged_word(word: str, probabilities: dict[str, float]) -> TaggedWord:
    """A word and its most likely tag; "?" with probability 0 for a word the model never read."""
    ranked = by_probability(probabilities)
    tag = next(iter(ranked), "?")
    return TaggedWord(word=word, tag=tag, probability=ranked.get(tag, 0.0), probabilities=ranked)
