"""`logprobs` and `top_logprobs` of chat completions, in OpenAI's chat shape
(`choices[i].logprobs.content[j]`: token, logprob, bytes, top_logprobs), whole and streamed: each
reply token's log-probability is transformers' log_softmax of the same folder's logits after the
conversation and the reply's tokens before it."""

import json

import httpx
import openai
import pytest
import torch

from serve.test_errors import assert_error

pytestmark = pytest.mark.slow

transformers = pytest.importorskip("transformers")
MESSAGES = [{"role": "user", "content": "ROMEO: What say you?"}]


@pytest.fixture(scope="module")
def reference(json_folders):
    folder = json_folders["chat"]
    model = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    ids = tok.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True)
    return model, tok, list(ids["input_ids"] if hasattr(ids, "keys") else ids)


@torch.no_grad()
def want_logprobs(reference, reply: list[int]) -> torch.Tensor:
    """log_softmax of the logits before each reply token `(N, V)`."""
    model, _, prompt = reference
    logits = model(torch.tensor([prompt + reply])).logits[0, len(prompt) - 1 : len(prompt) + len(reply) - 1]
    return torch.log_softmax(logits.double(), dim=-1)


def check(content: list[dict], reference, top: int) -> None:
    _, tok, _ = reference
    reply = [tok.convert_tokens_to_ids(_raw(row)) for row in content]  # each row's bytes name its token
    want = want_logprobs(reference, reply)
    for j, row in enumerate(content):
        assert row["logprob"] == pytest.approx(float(want[j, reply[j]]), abs=1e-4)
        best = torch.topk(want[j], top)
        assert [t["logprob"] for t in row["top_logprobs"]] == pytest.approx(best.values.tolist(), abs=1e-4)
        assert [bytes(t["bytes"]) for t in row["top_logprobs"]] == [_bytes(tok, i) for i in best.indices.tolist()]
        assert row["token"] == tok.decode([reply[j]])


def _bytes(tok, i: int) -> bytes:
    from attnlab.serve.tokens import gpt2_byte_decoder

    table = gpt2_byte_decoder()
    return bytes(table[c] for c in tok.convert_ids_to_tokens(i))


def _raw(row: dict) -> str:
    """The token as the byte-level BPE's own symbols (its bytes through GPT-2's table)."""
    from attnlab.serve.tokens import gpt2_byte_decoder

    shown = {b: c for c, b in gpt2_byte_decoder().items()}
    return "".join(shown[b] for b in row["bytes"])


def test_whole_reply_logprobs_are_the_models(json_server, reference):
    body = dict(model="chat", messages=MESSAGES, max_tokens=12, temperature=0.8, seed=3, logprobs=True, top_logprobs=3)
    body["logit_bias"] = {"1": -100}  # no end of turn: twelve tokens
    choice = httpx.post(f"{json_server.url}/v1/chat/completions", json=body, timeout=60).json()["choices"][0]
    content = choice["logprobs"]["content"]
    assert len(content) == 12 and choice["logprobs"]["refusal"] is None
    assert (
        b"".join(bytes(r["bytes"]) for r in content).decode(errors="replace").startswith(choice["message"]["content"])
    )
    check(content, reference, 3)


def test_streamed_logprobs_are_the_whole_replys(json_server, reference):
    body = dict(model="chat", messages=MESSAGES, max_tokens=10, temperature=0.9, seed=5, logprobs=True, top_logprobs=2)
    body["logit_bias"] = {"1": -100}
    whole = httpx.post(f"{json_server.url}/v1/chat/completions", json=body, timeout=60).json()["choices"][0]
    with httpx.stream("POST", f"{json_server.url}/v1/chat/completions", json={**body, "stream": True}) as response:
        chunks = [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: {")]
    rows = [r for c in chunks for ch in c["choices"] if ch["logprobs"] for r in ch["logprobs"]["content"]]
    assert rows == whole["logprobs"]["content"]
    check(rows, reference, 2)


def test_the_openai_client_reads_them(json_server):
    client = openai.OpenAI(base_url=f"{json_server.url}/v1", api_key="x", max_retries=0)
    answer = client.chat.completions.create(
        model="chat", messages=MESSAGES, max_tokens=5, logprobs=True, top_logprobs=4, logit_bias={"1": -100}
    )
    content = answer.choices[0].logprobs.content
    assert len(content) == 5 and all(len(row.top_logprobs) == 4 for row in content)
    assert all(row.top_logprobs[0].logprob >= row.logprob for row in content)
    plain = client.chat.completions.create(model="chat", messages=MESSAGES, max_tokens=3)
    assert plain.choices[0].logprobs is None


@pytest.mark.parametrize(
    "fields, param, fragment",
    [
        ({"top_logprobs": 2}, "top_logprobs", "needs logprobs true"),
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs", "less than or equal to 20"),
        ({"logprobs": True, "top_logprobs": -1}, "top_logprobs", "greater than or equal to 0"),
    ],
)
def test_bad_logprobs_are_a_400(json_server, fields, param, fragment):
    body = {"model": "chat", "messages": MESSAGES, "max_tokens": 2, **fields}
    assert_error(httpx.post(f"{json_server.url}/v1/chat/completions", json=body), 400, param, fragment)
