"""The fused decoding step with bf16 and int8 weights (`attnlab.accel.fused.WEIGHT_FORMATS`).

The step is held to a PyTorch reference written here: the model itself with each product's weight
replaced by what the stored copy holds (int8: blocks of 32 values of a row, s = max |w| / 127,
q = round(w / s), w' = s q; bf16: w rounded to bf16), run by the model's own forward. The two
compute the same function in another order, so their logits agree within float32 rounding
(`tests/tolerance.py`) at every step; and on a trained model the stored weights change the logits
little and the greedy tokens not at all.
"""

import copy

import pytest
import torch
from torch import nn

from attnlab.accel.fused import NATIVE_BF16, WEIGHT_FORMATS, FusedStep, extension, quantize_q8_0, weights_refusal
from attnlab.accel.projection import MKLDNN
from attnlab.cli.arguments import WEIGHTS as CLI_WEIGHTS
from attnlab.decode import greedy
from attnlab.decode.batching import Batcher
from attnlab.nn import MixtureOfExperts
from decode.conftest import tiny_gpt
from decode.test_batching import REQUESTS, alone, prompts, run_staggered
from helpers import cli
from tolerance import assert_float32_close, gpt_sums

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(extension() is None, reason="the fused step could not be built here"),
]

LLAMA = dict(normalization="rmsnorm", activation="swiglu", positions="rope", bias=False, n_heads=4, n_kv_heads=2)
ARCHITECTURES = {
    "gpt2": dict(),
    "gpt2-tied": dict(tie_weights=True),
    "llama": LLAMA,
    "mixtral": LLAMA | dict(experts=3, expert_top_k=2),
    # 40 wide: every row ends in a short block of 8 values (and fc2's in a full one)
    "short-blocks": LLAMA | dict(d_model=40, n_heads=2, n_kv_heads=1),
}
STORED = ("bf16", "int8")


def reference_q8_0(w: torch.Tensor) -> torch.Tensor:
    """What q8_0 keeps of w `(..., out, in)`, written independently of attnlab: per block of 32
    values of a row (the last one shorter), s = max |w| / 127, q = round(w / s), w' = s q."""
    out = torch.empty_like(w)
    for start in range(0, w.size(-1), 32):
        block = w[..., start : start + 32]
        s = block.abs().amax(-1, keepdim=True) / 127
        q = torch.round(block / torch.where(s > 0, s, 1.0))
        out[..., start : start + 32] = s * q
    return out


def reference_weight(w: torch.Tensor, weights: str) -> torch.Tensor:
    return reference_q8_0(w) if weights == "int8" else w.to(torch.bfloat16).float()


def reference_model(model: nn.Module, weights: str) -> nn.Module:
    """A copy of the model whose products (attention's, the feed-forward layers' or experts', the
    head's) have the weights the step stores; the embedding stays fp32 (a tied head is untied)."""
    ref = copy.deepcopy(model)
    with torch.no_grad():
        for block in ref.blocks:
            layers = [block.attn.in_proj, block.attn.out_proj]
            if isinstance(block.ffn, MixtureOfExperts):
                for name in ("fc1", "fc2"):
                    p = getattr(block.ffn.experts, name)
                    p.copy_(reference_weight(p, weights))
            else:
                layers += [block.ffn.fc1, block.ffn.fc2]
            for layer in layers:
                layer.weight.copy_(reference_weight(layer.weight, weights))
        ref.lm_head.weight = nn.Parameter(reference_weight(model.lm_head.weight.detach(), weights))
    return ref.eval()


def test_quantize_q8_0_is_the_reference_quantization():
    w = torch.randn(5, 70, generator=torch.Generator().manual_seed(0))  # blocks of 32, 32 and 6
    w[1, 32:64] = 0.0  # an all-zero block: scale 0, values 0
    q, s = quantize_q8_0(w)
    assert q.dtype == torch.int8 and q.shape == (5, 70) and s.shape == (5, 3)
    assert s[1, 1] == 0 and not q[1, 32:64].any()
    assert q.abs().max() == 127  # each block's largest value is ±127
    dequantized = (q.float().view(5, 70) * s.repeat_interleave(32, dim=1)[:, :70]).view(5, 70)
    assert torch.equal(dequantized, reference_q8_0(w))
    assert (dequantized - w).abs().max() <= s.max() / 2 + 1e-7  # within half a step of each value


@pytest.mark.parametrize("weights", STORED)
@pytest.mark.parametrize("name", ARCHITECTURES)
def test_the_step_computes_the_model_with_the_stored_weights(name, weights):
    """Prefill, then 60 greedy steps: logits within the float32 bound of the reference model's, the
    same token picked, and the same keys and values in the caches."""
    model = tiny_gpt(block_size=64, **ARCHITECTURES[name])
    ref = reference_model(model, weights)
    prompt = torch.randint(0, 23, (2, 4), generator=torch.Generator().manual_seed(0))
    bound = gpt_sums(model.config)
    with torch.inference_mode():
        ours, theirs = model.new_cache(2), ref.new_cache(2)
        step = FusedStep(model, extension(), ours, weights)
        got = step.prefill(prompt.tolist(), 0)
        expected = ref(prompt, cache=theirs, last_only=True)
        assert_float32_close(got, expected[:, -1], **bound)
        for position in range(4, 64):
            token = expected[:, -1].argmax(-1, keepdim=True)
            expected = ref(token, cache=theirs, last_only=True)
            got = step(token, ours, position)
            assert_float32_close(got, expected, **bound)
            assert torch.equal(got[:, -1].argmax(-1), expected[:, -1].argmax(-1)), position
    for a, b in zip(ours, theirs, strict=True):
        assert_float32_close(a.k, b.k, **bound)
        assert_float32_close(a.v, b.v, **bound)


@pytest.mark.parametrize("weights", STORED)
@pytest.mark.parametrize("name", ARCHITECTURES)
def test_a_long_prefill_equals_its_prompts_in_streamed_groups(name, weights):
    """From 16 rows on the products widen the stored weights for a matrix product, below that they
    stream them: 5 prompts of 8 tokens prefilled in one call (40 rows) give the logits and caches
    of each prompt prefilled alone (8 rows), within the float32 bound of a change of sum order.
    (bf16 widened as on a CPU without bf16 instructions: `test_native_bf16_...` has the others.)"""
    model = tiny_gpt(block_size=64, **ARCHITECTURES[name])
    prompts = torch.randint(0, 23, (5, 8), generator=torch.Generator().manual_seed(7)).tolist()
    bound = gpt_sums(model.config)
    with torch.inference_mode():
        together, apart = model.new_cache(5), model.new_cache(5)
        got = FusedStep(model, extension(), together, weights, native_bf16=False).prefill(prompts, 0)
        alone = FusedStep(model, extension(), apart, weights)
        expected = torch.cat([alone.prefill([p], row) for row, p in enumerate(prompts)])
    assert_float32_close(got, expected, **bound)
    assert not torch.equal(got[0], got[1])  # the rows are different prompts' logits
    for a, b in zip(together, apart, strict=True):
        assert_float32_close(a.k[:, :, :8], b.k[:, :, :8], **bound)
        assert_float32_close(a.v[:, :, :8], b.v[:, :, :8], **bound)


@pytest.mark.parametrize("weights", STORED)
@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_a_long_prompt_prefills_as_its_tokens_decode_one_by_one(name, weights):
    """A 40-token prompt in one call (the widened products) against the same tokens stepped one at
    a time (the streamed ones) and the reference model: the logits after it and the caches."""
    model = tiny_gpt(block_size=64, **ARCHITECTURES[name])
    prompt = torch.randint(0, 23, (1, 40), generator=torch.Generator().manual_seed(8))
    bound = gpt_sums(model.config)
    with torch.inference_mode():
        whole, stepped = model.new_cache(1), model.new_cache(1)
        got = FusedStep(model, extension(), whole, weights, native_bf16=False).prefill(prompt.tolist(), 0)
        step = FusedStep(model, extension(), stepped, weights)
        for position in range(40):
            expected = step(prompt[:, position : position + 1], stepped, position)
        reference = reference_model(model, weights)(prompt, last_only=True)
    assert_float32_close(got, expected[:, -1], **bound)
    assert_float32_close(got, reference[:, -1], **bound)
    for a, b in zip(whole, stepped, strict=True):
        assert_float32_close(a.k[:, :, :40], b.k[:, :, :40], **bound)
        assert_float32_close(a.v[:, :, :40], b.v[:, :, :40], **bound)


def bf16_rows(model: nn.Module) -> nn.Module:
    """`model` with each block product's input rows and outputs rounded to bf16, as a product
    multiplied in bf16 with fp32 sums gives them (its weights already bf16: `reference_model`)."""
    for block in model.blocks:
        products = [
            block.attn.in_proj,
            block.attn.out_proj,
            getattr(block.ffn, "fc1", None),
            getattr(block.ffn, "fc2", None),
        ]
        for layer in products:
            if isinstance(layer, nn.Linear):  # a mixture's experts keep fp32 rows
                layer.register_forward_pre_hook(lambda _, args: (args[0].to(torch.bfloat16).float(),))
                layer.register_forward_hook(lambda _, __, out: out.to(torch.bfloat16).float())
    return model


@pytest.mark.parametrize("name", ARCHITECTURES)
def test_native_bf16_prefill_multiplies_the_blocks_rows_in_bf16(name):
    """On a CPU with bf16 instructions a bf16 prefill of 16 rows or more multiplies the blocks'
    products in bf16 (rows rounded to bf16, fp32 sums, bf16 outputs; the head in fp32): its logits
    and caches are the reference model's with exactly those roundings, within one bf16 rounding
    (2^-8), and the fp32 rows of the widened products fall outside that."""
    model = tiny_gpt(block_size=64, **ARCHITECTURES[name])
    prompts = torch.randint(0, 23, (5, 8), generator=torch.Generator().manual_seed(7))
    one_rounding = {"rtol": 2**-8, "atol": 2**-8}
    with torch.inference_mode():
        native, widened = model.new_cache(5), model.new_cache(5)
        got = FusedStep(model, extension(), native, "bf16", native_bf16=True).prefill(prompts.tolist(), 0)
        fp32_rows = FusedStep(model, extension(), widened, "bf16", native_bf16=False).prefill(prompts.tolist(), 0)
        want_cache = model.new_cache(5)
        want = bf16_rows(reference_model(model, "bf16"))(prompts, cache=want_cache, last_only=True)[:, -1]
    torch.testing.assert_close(got, want, **one_rounding)
    for a, b in zip(native, want_cache, strict=True):
        torch.testing.assert_close(a.k[:, :, :8], b.k[:, :, :8], **one_rounding)
        torch.testing.assert_close(a.v[:, :, :8], b.v[:, :, :8], **one_rounding)
    with pytest.raises(AssertionError):
        torch.testing.assert_close(fp32_rows, want, **one_rounding)


def test_native_bf16_is_the_default_where_the_cpu_has_bf16_instructions():
    model = tiny_gpt(block_size=64)
    with torch.inference_mode():
        step = FusedStep(model, extension(), model.new_cache(1), "bf16")
        assert step.native_bf16 == (NATIVE_BF16 and MKLDNN)
        assert not FusedStep(model, extension(), model.new_cache(1), "int8").native_bf16
        assert not FusedStep(model, extension(), model.new_cache(1), "fp32").native_bf16


@pytest.mark.parametrize("weights", STORED)
def test_batched_rows_read_the_stored_weights_too(weights):
    """Continuous batching with more than 8 rows at a step (past the streamed products of fp32):
    each sequence gets the tokens the reference model gives it decoded alone."""
    model = tiny_gpt(**LLAMA)
    ref = reference_model(model, weights)
    requests = [(p, m) for p, (_, m) in zip(prompts(seed=5), REQUESTS, strict=True)] * 2
    batcher = Batcher(model, max_batch=12, fused=True, weights=weights)
    finished = run_staggered(batcher, requests)
    assert len(finished) == len(requests)
    for seq in finished:
        assert seq.tokens == alone(ref, seq.prompt, seq.max_new_tokens), len(seq.prompt)


@pytest.mark.parametrize("weights", STORED)
def test_greedy_reads_the_stored_weights_in_its_prompt_steps_and_slid_windows(weights):
    """`greedy(..., fused=True, weights=...)` past the block size: the prompt, every step and
    every slid window through the stored weights, as the reference model decodes."""
    model = tiny_gpt(**LLAMA)  # block 16: 30 new tokens slide the window
    prompt = torch.randint(0, 23, (2, 6), generator=torch.Generator().manual_seed(4))
    got = greedy(model, prompt, 30, fused=True, weights=weights)
    assert torch.equal(got, greedy(reference_model(model, weights), prompt, 30))
    assert not torch.equal(got, greedy(model, prompt, 30))  # std 0.5 weights: the stored ones differ


def trained_gpt(steps: int = 300, **overrides) -> nn.Module:
    """A small character GPT trained for a few hundred steps on Tiny Shakespeare: weights of a
    trained model's sizes (not the tests' std 0.5), logits that pick confidently. `overrides`:
    GPTConfig fields in place of Llama's parts (tests/accel/test_q4.py: a hidden width of whole
    blocks); a wider model learns as much in fewer `steps`."""
    from attnlab.data.text import bundled_shakespeare
    from attnlab.models import GPT, GPTConfig

    text = bundled_shakespeare()[:20_000]
    chars = sorted(set(text))
    data = torch.tensor([chars.index(c) for c in text])
    torch.manual_seed(0)
    shape = dict(vocab_size=len(chars), block_size=64, n_layers=2, n_heads=2, d_model=64)
    model = GPT(GPTConfig(**shape | LLAMA_PARTS | overrides))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(steps):
        starts = torch.randint(0, data.numel() - 65, (16,))
        batch = torch.stack([data[s : s + 65] for s in starts])
        _, loss = model(batch[:, :-1], batch[:, 1:])
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 2.6  # learnt something: a uniform guess is ln 65 = 4.2
    return model.eval()


LLAMA_PARTS = dict(normalization="rmsnorm", activation="swiglu", positions="rope", bias=False)


@pytest.fixture(scope="module")
def trained():
    return trained_gpt()


@pytest.mark.parametrize("weights", STORED)
def test_a_trained_model_keeps_its_greedy_tokens_and_nearly_its_logits(trained, weights):
    prompt = torch.randint(0, trained.config.vocab_size, (3, 8), generator=torch.Generator().manual_seed(6))
    fp32 = greedy(trained, prompt, 48, fused=True)
    assert torch.equal(greedy(trained, prompt, 48, fused=True, weights=weights), fp32)
    with torch.inference_mode():  # teacher-forced along the fp32 tokens: every step's distribution
        ours, theirs = trained.new_cache(3), trained.new_cache(3)
        stored, exact = FusedStep(trained, extension(), ours, weights), FusedStep(trained, extension(), theirs)
        kl, moved = 0.0, 0.0  # the largest KL(fp32 || stored) and change of a probability, over the steps
        for position in range(fp32.size(1) - 1):
            token = fp32[:, position : position + 1]
            a = stored(token, ours, position).log_softmax(-1)
            b = exact(token, theirs, position).log_softmax(-1)
            kl = max(kl, (b.exp() * (b - a)).sum(-1).max().item())
            moved = max(moved, (a.exp() - b.exp()).abs().max().item())
    # Measured 3e-5 and 0.0014 (bf16), 5e-4 and 0.009 (int8): int8 keeps 8 bits of each block's
    # largest value, bf16 8 bits of every value.
    assert kl < {"bf16": 2e-4, "int8": 2e-3}[weights] and moved < {"bf16": 0.01, "int8": 0.03}[weights], (kl, moved)


def test_a_model_the_step_does_not_cover_decodes_eagerly_in_fp32_saying_why():
    model = tiny_gpt(positions="alibi")
    line = weights_refusal(model, "int8")
    assert "int8 weights are read by the fused decoding step alone" in line and "fp32 weights on PyTorch's path" in line
    assert "\n" not in line and weights_refusal(tiny_gpt(), "int8") is None and weights_refusal(model, "fp32") is None
    prompt = torch.tensor([[1, 2, 3]])
    with pytest.warns(UserWarning, match="int8 weights are read by the fused decoding step alone"):
        got = greedy(model, prompt, 8, fused=True, weights="int8")
    assert torch.equal(got, greedy(model, prompt, 8))


def test_stored_weights_without_the_fused_step_are_refused():
    with pytest.raises(ValueError, match="fused"):
        greedy(tiny_gpt(), torch.tensor([[1, 2]]), 4, weights="int8")
    with pytest.raises(ValueError, match="weights must be one of fp32, bf16, int8, int4"):
        weights_refusal(tiny_gpt(), "int2")


def test_the_command_line_offers_the_library_formats():
    assert CLI_WEIGHTS == WEIGHT_FORMATS


def train_run(folder, *overrides: str):
    """A tiny character run (one layer, 6 steps) in `folder`, as `attnlab train` writes it."""
    from attnlab.cli import main
    from attnlab.data.text import bundled_shakespeare

    corpus = folder / "corpus.txt"
    corpus.write_text(bundled_shakespeare()[:20_000])
    settings = ["train.max_iters=6", "train.eval_interval=3", "train.eval_iters=2", "model.block_size=16"]
    settings += ["model.n_layers=1", "model.d_model=32", "model.n_heads=2", *overrides]
    args = ["train", "shakespeare-char-cpu", "--out", str(folder / "run"), "--quiet", "--set", f"data.path={corpus}"]
    assert main(args + [f"--set={kv}" for kv in settings]) == 0
    return folder / "run"


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    return train_run(tmp_path_factory.mktemp("int8"))


SAMPLE = ("--prompt", "ROMEO:", "--temperature", "0", "--max-new-tokens", "40", "--json")


@pytest.mark.parametrize("weights", STORED)
def test_attnlab_sample_decodes_with_the_weights_asked_for(run_dir, capsys, monkeypatch, weights):
    import json

    from attnlab import load
    from attnlab.accel import fused
    from attnlab.decode import encode_prompt

    asked = []
    gpt_step = fused.gpt_step
    monkeypatch.setattr(fused, "gpt_step", lambda *a: asked.append(a[2]) or gpt_step(*a))
    code, out, err = cli(capsys, "sample", run_dir, *SAMPLE, "--weights", weights)
    assert code == 0 and asked == [weights], err
    run = load(run_dir)
    ids = greedy(reference_model(run.model, weights), encode_prompt(run.tokenizer, "ROMEO:", "cpu"), 40)
    assert json.loads(out)["samples"] == [run.tokenizer.decode(ids[0, 6:].tolist())]


def test_attnlab_sample_refuses_an_unknown_precision_in_one_line(run_dir, capsys):
    code, _, err = cli(capsys, "sample", run_dir, *SAMPLE, "--weights", "int2")
    assert code == 2 and err.count("\n") == 1 and "--weights: invalid choice: 'int2'" in err and "'int4'" in err


@pytest.mark.parametrize("other", ["--no-fused", "--compile"])
def test_attnlab_sample_refuses_stored_weights_without_the_fused_step(run_dir, capsys, other):
    code, _, err = cli(capsys, "sample", run_dir, *SAMPLE, "--weights", "bf16", other)
    assert code == 2 and err.count("\n") == 1 and f"leave out {other}" in err


def test_attnlab_sample_of_a_model_the_step_does_not_cover_says_what_it_runs_instead(tmp_path, capsys):
    run = train_run(tmp_path, "model.positions=alibi")
    capsys.readouterr()  # the training's lines
    code, out, err = cli(capsys, "sample", run, *SAMPLE, "--weights", "int8")
    assert code == 0 and err.count("\n") == 1, err
    assert err.startswith("attnlab sample: int8 weights are read by the fused decoding step alone")
    assert err.rstrip().endswith("decoding it with its fp32 weights on PyTorch's path")
    assert cli(capsys, "sample", run, *SAMPLE)[1] == out


def test_attnlab_bench_and_serve_take_the_option(capsys, run_dir):
    for command in ("bench", "serve"):
        code, out, _ = cli(capsys, command, "--help")
        assert code == 0 and "--weights {" + ",".join(WEIGHT_FORMATS) + "}" in out
    code, _, err = cli(capsys, "bench", "--weights", "int8", "--no-fused")
    assert code == 2 and err.count("\n") == 1 and "leave out --no-fused" in err
    code, _, err = cli(capsys, "serve", run_dir, "--weights", "int8", "--no-fused", "--port", "0")
    assert code == 2 and err.count("\n") == 1 and "leave out --no-fused" in err


@pytest.mark.parametrize("weights", STORED)
def test_the_server_worker_decodes_with_the_stored_weights(weights, monkeypatch):
    """`attnlab serve --weights` reaches each model's worker (its fused step by default, whether
    built or not): concurrent completions are the reference model's, each decoded alone. (bf16's
    prompts widened: multiplied in bf16, a prompt's rows round with the batch it is prefilled in,
    which `test_native_bf16_prefill_multiplies_the_blocks_rows_in_bf16` checks.)"""
    monkeypatch.setattr("attnlab.accel.fused.NATIVE_BF16", False)
    from attnlab.data.tokenizers import CharTokenizer
    from attnlab.decode import complete, greedy_picker
    from attnlab.serve.worker import Sampling
    from serve.test_worker import CORPUS, collect, run_worker
    from serve.test_worker import REQUESTS as COMPLETIONS

    tok = CharTokenizer.train(CORPUS)
    model = tiny_gpt(vocab_size=tok.vocab_size, **LLAMA)

    async def body(worker):
        import asyncio

        assert worker.batcher.runner.fused is not None and worker.batcher.runner.fused.format == weights
        from attnlab.decode.text import encode_prompt

        sampling = [
            (encode_prompt(tok, p)[0].tolist(), Sampling(n, temperature=0, stop=stop)) for p, n, stop in COMPLETIONS
        ]
        streams = [worker.submit(ids, how) for ids, how in sampling]
        return await asyncio.gather(*(collect(s) for s in streams))

    texts = run_worker(model, tok, body, max_batch=8, weights=weights)
    ref = reference_model(model, weights)
    for (prompt, n, stop), text in zip(COMPLETIONS, texts, strict=True):
        assert text == complete(ref, tok, prompt, n, greedy_picker(), stop=stop), prompt
