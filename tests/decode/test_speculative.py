"""Speculative decoding is exact: greedy output equals plain greedy decoding token for token (trained
runs, both drafters, k 1 … 8, prompts short and past the block; the target checking the drafts on
PyTorch's step or in one call of the fused C++ step), and sampled output has the target's law,
checked with a chi-square test that rejects a wrong rule (always accepting the draft)."""

from pathlib import Path

import pytest
import torch
from scipy.stats import chisquare

from attnlab.accel.fused import FusedStep, extension
from attnlab.data.text import bundled_shakespeare
from attnlab.data.tokenizers import CharTokenizer
from attnlab.decode import (
    ModelDrafter,
    PromptLookup,
    Speculation,
    greedy,
    greedy_picker,
    sampling_picker,
    speculative_generate,
)
from attnlab.decode.speculative import accept_drafts, check_draft_model, probabilities
from attnlab.errors import UserError
from attnlab.nn.attention import KVCache, ModelCache, RollingKVCache
from attnlab.train import load_run, resolve, train
from decode.conftest import tiny_gpt

pytestmark = pytest.mark.slow

CORPUS = bundled_shakespeare()[:20_000]


def _train(folder: Path, **model) -> Path:
    corpus = folder / "corpus.txt"
    corpus.write_text(CORPUS, encoding="utf-8")
    doc = {
        "task": "lm",
        "model": {"n_heads": 2, **model},
        "data": {"path": str(corpus), "tokenizer": "char"},
        "train": {"max_iters": 40, "batch_size": 8, "learning_rate": 3e-3, "warmup_iters": 4, "eval_interval": 40},
    }
    train(resolve(doc), folder / "run", progress=False)
    return folder / "run"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A trained character GPT (block 48) and a smaller one on the same text (block 24: the
    drafter's own window slides while the target's does not)."""
    target = load_run(_train(tmp_path_factory.mktemp("target"), block_size=48, n_layers=2, d_model=32))
    draft = load_run(_train(tmp_path_factory.mktemp("draft"), block_size=24, n_layers=1, d_model=16))
    return target, draft


PROMPTS = ("ROMEO:", "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.", "a")


def _ids(tokenizer, text: str) -> torch.Tensor:
    return torch.tensor([tokenizer.encode(text)])


def _speculated(model, idx, n, pick, speculation, **target) -> list[int]:
    return [int(t) for t in speculative_generate(model, idx, n, pick, speculation, **target)]


needs_fused = pytest.mark.skipif(extension() is None, reason="the fused step could not be built here")


@pytest.fixture
def extend_calls(monkeypatch) -> list[int]:
    """The number of tokens of each `FusedStep.extend` call that returns every token's logits (the
    real call, counted; the prompts and the drafter's contexts are read with last_only): shows
    that the fused target checked the drafts in one call each."""
    calls: list[int] = []
    real = FusedStep.extend

    def counted(self, tokens, position, row=0, *, last_only=False):
        if not last_only:
            calls.append(tokens.numel())
        return real(self, tokens, position, row, last_only=last_only)

    monkeypatch.setattr(FusedStep, "extend", counted)
    return calls


@pytest.mark.parametrize("k", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("drafter", ["model", "fused model", "lookup"])
def test_greedy_output_is_the_targets_token_for_token(runs, drafter, k):
    target, draft = runs
    made = ModelDrafter(draft.model, fused=drafter == "fused model") if drafter != "lookup" else None
    assert made is None or (made.fused_step is not None) == (drafter == "fused model")
    spec = Speculation(made or PromptLookup(max_ngram=3), k)
    for prompt in PROMPTS:
        for n in (1, 7, 90):  # one token, a few, and past the target's block of 48
            idx = _ids(target.tokenizer, prompt)
            want = greedy(target.model, idx, n)[0, idx.size(1) :].tolist()
            assert _speculated(target.model, idx, n, greedy_picker(), spec) == want, (prompt, n)
    assert spec.stats.drafted > 0 and spec.stats.accepted > 0  # the drafts were used, and some kept
    assert spec.stats.emitted == spec.stats.steps + spec.stats.accepted


@needs_fused
@pytest.mark.parametrize("k", [1, 3, 8])
@pytest.mark.parametrize("drafter", ["fused model", "lookup"])
def test_greedy_on_the_fused_target_is_plain_greedy_token_for_token(runs, drafter, k, extend_calls):
    """The target checks [pending, drafts] in one fused call (`FusedStep.extend`) and takes back
    the rejected drafts' keys: the output is plain greedy decoding's (PyTorch's and the fused
    step's), within the block and past it (the windows slide)."""
    target, draft = runs
    spec = Speculation(ModelDrafter(draft.model, fused=True) if drafter == "fused model" else PromptLookup(), k)
    for prompt in PROMPTS:
        for n in (1, 7, 90):
            idx = _ids(target.tokenizer, prompt)
            want = greedy(target.model, idx, n)[0, idx.size(1) :].tolist()
            assert greedy(target.model, idx, n, fused=True)[0, idx.size(1) :].tolist() == want
            assert _speculated(target.model, idx, n, greedy_picker(), spec, fused=True) == want, (prompt, n)
    assert spec.stats.drafted > 0 and spec.stats.accepted > 0
    # drafts checked in one call with the pending token (a draft model always drafts k here)
    assert max(extend_calls) == k + 1 if drafter == "fused model" else max(extend_calls) >= 2


@needs_fused
@pytest.mark.parametrize("weights", ["bf16", "int8"])
def test_greedy_on_a_fused_target_with_stored_weights_is_its_plain_greedy(runs, weights):
    """bf16 and int8 weights: the target's verification reads the same stored weights as plain
    fused decoding with them, within the block and past it (each window read by the fused step)."""
    target, draft = runs
    spec = Speculation(ModelDrafter(draft.model, fused=True), 4)
    for prompt in PROMPTS:
        idx = _ids(target.tokenizer, prompt)
        want = greedy(target.model, idx, 90, fused=True, weights=weights)[0, idx.size(1) :].tolist()
        assert _speculated(target.model, idx, 90, greedy_picker(), spec, fused=True, weights=weights) == want
    assert spec.stats.accepted > 0


def test_the_fused_drafter_drafts_what_pytorchs_drafts(runs):
    """The draft model's C++ steps over the cache it keeps, cut back and extended between drafts,
    give PyTorch's drafts: contexts that grow, change their tail, and pass its block of 24."""
    _, draft = runs
    text = draft.tokenizer.encode(CORPUS[:200])
    fused, plain = ModelDrafter(draft.model, fused=True), ModelDrafter(draft.model)
    for end, k in ((8, 4), (11, 3), (10, 5), (23, 2), (40, 8), (41, 1), (90, 6), (30, 4)):
        context = text[:end]
        assert fused.draft(context, k, greedy_picker()).tokens == plain.draft(context, k, greedy_picker()).tokens


def test_the_target_drafting_for_itself_is_always_accepted(runs):
    """The rule's other end: with p = q every draft is kept (k + 1 tokens a step)."""
    target, _ = runs
    spec = Speculation(ModelDrafter(target.model), 4)
    idx = _ids(target.tokenizer, "ROMEO:")
    want = greedy(target.model, idx, 30)[0, idx.size(1) :].tolist()
    assert _speculated(target.model, idx, 30, greedy_picker(), spec) == want
    assert spec.stats.accepted == spec.stats.drafted and spec.stats.tokens_per_step == 5


def test_prompt_lookup_copies_after_the_latest_match():
    pick = greedy_picker()
    assert PromptLookup(max_ngram=2).draft([5, 6, 7, 8, 5, 6], 2, pick).tokens == [7, 8]
    assert PromptLookup(max_ngram=2).draft([5, 6, 1, 5, 6, 2, 9, 5, 6], 3, pick).tokens == [2, 9, 5]
    assert PromptLookup(max_ngram=3).draft([1, 2, 3, 4], 4, pick).tokens == []
    assert PromptLookup(max_ngram=3).draft([7], 4, pick).tokens == []
    # The longest n-gram wins over a later, shorter match.
    assert PromptLookup(max_ngram=2).draft([1, 2, 3, 9, 2, 4, 1, 2], 1, pick).tokens == [3]


def _p_value(samples: list[tuple[int, ...]], probs: dict[tuple[int, ...], float]) -> float:
    """Chi-square goodness of fit of samples to probs (outcome -> probability). An outcome of
    probability 0 that was drawn fails at once; the cells expected under 5 times are pooled."""
    n = len(samples)
    counts = {o: 0 for o in probs}
    for s in samples:
        if probs.get(s, 0.0) == 0.0:
            return 0.0
        counts[s] += 1
    big = [o for o in probs if probs[o] * n >= 5]
    small = [o for o in probs if 0 < probs[o] * n < 5]
    observed = [counts[o] for o in big] + ([sum(counts[o] for o in small)] if small else [])
    expected = [probs[o] * n for o in big] + ([sum(probs[o] for o in small) * n] if small else [])
    total = sum(expected)
    return float(chisquare(observed, [e * n / total for e in expected]).pvalue)


def _distributions(generator: torch.Generator, rows: int, vocab: int) -> torch.Tensor:
    return torch.softmax(torch.randn(rows, vocab, generator=generator) * 1.5, dim=-1)


def _always_accept(p, q, drafts, generator):
    """The deliberately wrong rule: every draft kept, then the bonus token."""
    return [*drafts, int(torch.multinomial(p[len(drafts)], 1, generator=generator))]


@pytest.mark.parametrize("draft_kind", ["sampled", "one-hot"])
def test_the_rule_keeps_the_targets_law_and_always_accepting_does_not(draft_kind):
    """Explicit distributions: a target whose next-token law p[j] does not depend on the tokens
    before it, so the first two emitted tokens have law p[0] x p[1]; drafts drawn from q (or
    fixed, q one-hot). The same test rejects the rule that keeps every draft."""
    g = torch.Generator().manual_seed(0)
    vocab, n = 4, 3000
    p, q = _distributions(g, 3, vocab), _distributions(g, 2, vocab)
    law = {(a, b): float(p[0, a] * p[1, b]) for a in range(vocab) for b in range(vocab)}
    results = {}
    for name, rule in (("rule", accept_drafts), ("always", _always_accept)):
        pairs = []
        for _ in range(n):
            if draft_kind == "sampled":
                drafts = [int(torch.multinomial(q[j], 1, generator=g)) for j in range(2)]
                qs = q
            else:
                drafts = [1, 2]
                qs = torch.nn.functional.one_hot(torch.tensor(drafts), vocab).float()
            out = rule(p, qs, drafts, g)
            # Two tokens: a second after the first when the first was a kept draft, else a fresh
            # position whose law is again p[1] (the target's law ignores what came before).
            second = out[1] if len(out) > 1 else int(torch.multinomial(p[1], 1, generator=g))
            pairs.append((out[0], second))
        results[name] = _p_value(pairs, law)
    assert results["rule"] > 1e-3, results
    assert results["always"] < 1e-6, results


def _exact_law(model, prompt: list[int], pick, length: int) -> dict[tuple[int, ...], float]:
    """The target's probability of every sequence of `length` tokens after prompt, from full
    forwards of the last block_size tokens without a cache (the reference: no speculation, no KV
    cache)."""
    law = {(): 1.0}
    for _ in range(length):
        grown = {}
        for seq, prob in law.items():
            with torch.no_grad():
                logits = model(torch.tensor([[*prompt, *seq][-model.config.block_size :]]))[0, -1:]
            dist = probabilities(pick, logits)[0].tolist()
            grown |= {(*seq, t): prob * pt for t, pt in enumerate(dist)}
        law = grown
    return law


@pytest.mark.parametrize(
    ("drafter", "settings", "repeats", "fused"),
    [
        ("model", dict(temperature=1.0), 1, False),
        ("model", dict(temperature=0.7, top_k=3), 1, False),
        ("lookup", dict(top_p=0.9), 1, False),
        ("model", dict(temperature=1.0), 8, False),  # a prompt of 19, past the block of 16: the windows slide
        pytest.param("model", dict(temperature=1.0), 1, True, marks=needs_fused),
        pytest.param("lookup", dict(temperature=0.7, top_k=3), 1, True, marks=needs_fused),
    ],
)
def test_sampling_with_speculation_keeps_the_targets_law(drafter, settings, repeats, fused):
    """Tiny random models over five tokens: the first token and the first two tokens drawn with
    speculation follow the target's probabilities (temperature, top-k and top-p applied to p and
    q as plain sampling applies them), the target on PyTorch's step or the fused one."""
    target = tiny_gpt(vocab_size=5, seed=3, weight_std=0.3)
    prompt = [4, 0] * (repeats - 1) + [1, 2, 3, 1, 2]  # lookup drafts [3, 1, 2] after it
    g = torch.Generator().manual_seed(1)
    pick = sampling_picker(generator=g, **settings)
    made = ModelDrafter(tiny_gpt(vocab_size=5, seed=4, n_layers=1, weight_std=0.3)) if drafter == "model" else None
    spec = Speculation(made or PromptLookup(max_ngram=2), k=3)
    pairs = [tuple(_speculated(target, torch.tensor([prompt]), 2, pick, spec, fused=fused)) for _ in range(1000)]
    assert _p_value([pair[:1] for pair in pairs], _exact_law(target, prompt, pick, 1)) > 1e-3
    assert _p_value(pairs, _exact_law(target, prompt, pick, 2)) > 1e-3
    assert spec.stats.drafted > 0 and 0 < spec.stats.accepted < spec.stats.drafted


def test_a_draft_model_must_share_the_vocabulary_and_tokenizer(runs):
    target, draft = runs
    assert check_draft_model(target.model, draft.model, target.tokenizer, draft.tokenizer) is None
    warning = check_draft_model(draft.model, target.model, draft.tokenizer, target.tokenizer)
    assert "not smaller than the target" in warning
    other_size = tiny_gpt(vocab_size=target.model.config.vocab_size + 1)
    with pytest.raises(UserError, match="vocabulary has"):
        check_draft_model(target.model, other_size, target.tokenizer, target.tokenizer)
    chars = sorted(set(CORPUS))
    shuffled = CharTokenizer([*chars[1:], chars[0]])  # the same size, other ids
    with pytest.raises(UserError, match="another tokenizer"):
        check_draft_model(target.model, draft.model, target.tokenizer, shuffled)


def test_a_ring_cache_cannot_be_rolled_back():
    window_model = tiny_gpt(attention="window", attention_window=4, positions="rope")
    with pytest.raises(UserError, match="full KV cache"):
        list(
            speculative_generate(window_model, torch.tensor([[1, 2]]), 3, greedy_picker(), Speculation(PromptLookup()))
        )
    with pytest.raises(ValueError, match="cannot be truncated"):
        RollingKVCache(1, 1, 4, 2).truncate(0)


def test_truncate_forgets_the_slots_after_it():
    cache = ModelCache([KVCache(1, 1, 8, 2)], length=5)
    cache[0].update(0, torch.ones(1, 1, 5, 2), torch.ones(1, 1, 5, 2))
    cache.truncate(3)
    assert cache.length == 3
    k = cache[0].update(cache.length, torch.full((1, 1, 1, 2), 2.0), torch.zeros(1, 1, 1, 2)).k
    assert k[0, 0, :, 0].tolist() == [1.0, 1.0, 1.0, 2.0]
    with pytest.raises(ValueError, match="0 … 3"):
        cache.truncate(5)
    with pytest.raises(ValueError, match="cannot be truncated"):  # a ring in the model refuses, count unchanged
        ModelCache([KVCache(1, 1, 8, 2), RollingKVCache(1, 1, 4, 2)], length=3).truncate(1)


@pytest.mark.parametrize("k", [0, 17])
def test_k_out_of_range_is_refused(k):
    with pytest.raises(UserError, match="from 1 to 16"):
        Speculation(PromptLookup(), k)
