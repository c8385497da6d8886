"""Product key memory (Lample et al. 2019) against a brute force over all n² full keys, and inside
the GPT (which blocks get it, cached decoding, config errors)."""

import pytest
import torch

from attnlab.models import GPT, GPTConfig
from attnlab.nn import FeedForward
from attnlab.nn.memory import ProductKeyMemory


def brute_force(memory: ProductKeyMemory, x: torch.Tensor) -> torch.Tensor:
    """m(x) = Σ_heads Σ_{top k of all n² keys [c_i; c'_j]} softmax(q · key) v, one token at a time."""
    n, half = memory.n_keys, memory.half
    out = torch.zeros_like(x)
    for t in range(x.size(0)):
        q = memory.query(x[t]).view(memory.heads, 2 * half)
        for h in range(memory.heads):
            c, c2 = memory.sub_keys[h, 0], memory.sub_keys[h, 1]
            keys = torch.stack([torch.cat([c[i], c2[j]]) for i in range(n) for j in range(n)])  # (n², C)
            scores, index = (keys @ q[h]).topk(memory.top_k)
            weights = torch.softmax(scores, dim=0)
            out[t] += sum(w * memory.values.weight[i] for w, i in zip(weights, index, strict=True))
    return out


@pytest.mark.parametrize(("n_keys", "top_k", "heads"), [(6, 3, 1), (10, 4, 2), (5, 5, 3)])
def test_memory_equals_a_brute_force_over_every_key(n_keys, top_k, heads):
    torch.manual_seed(0)
    memory = ProductKeyMemory(8, n_keys, top_k=top_k, heads=heads)
    with torch.no_grad():
        memory.query.weight.normal_()  # queries of unit size: scores far apart, no near-ties
        x = torch.randn(2, 7, 8)
        torch.testing.assert_close(memory(x), brute_force(memory, x.view(14, 8)).view(2, 7, 8))


def test_memory_reads_top_k_values_per_head_and_learns_only_those():
    torch.manual_seed(0)
    memory = ProductKeyMemory(8, 6, top_k=2, heads=1)
    memory(torch.randn(1, 8)).sum().backward()
    touched = memory.values.weight.grad.abs().sum(dim=1) > 0
    assert int(touched.sum()) == 2  # 2 of the 36 values


V = 30


def gpt(**overrides) -> GPT:
    torch.manual_seed(0)
    fields = dict(vocab_size=V, block_size=16, n_layers=3, n_heads=2, d_model=16, memory_keys=6, memory_top_k=3)
    return GPT(GPTConfig(**(fields | overrides))).eval()


def test_gpt_memory_replaces_the_feed_forward_of_every_nth_block():
    kinds = [type(block.ffn) for block in gpt(memory_every=2).blocks]
    assert kinds == [FeedForward, ProductKeyMemory, FeedForward]
    assert [type(block.ffn) for block in gpt(memory_every=1).blocks] == [ProductKeyMemory] * 3


def test_gpt_with_memory_decodes_with_a_cache_as_it_computes_the_whole_sequence():
    model = gpt(memory_heads=2)
    seq = torch.randint(0, V, (2, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full = model(seq)
        cache = model.new_cache(2)
        steps = [model(seq[:, :4], cache=cache)] + [model(seq[:, t : t + 1], cache=cache) for t in range(4, 16)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=0, atol=1e-5)


@pytest.mark.parametrize(
    ("fields", "fragment"),
    [
        ({"memory_top_k": 7}, "memory_top_k must be between 1 and memory_keys"),
        ({"memory_keys": -1}, "memory_keys must be >= 0"),
        ({"experts": 4}, "choose one"),
        ({"memory_every": 0}, "memory_every"),
    ],
)
def test_config_refuses_a_memory_that_cannot_be_built(fields, fragment):
    with pytest.raises(ValueError, match=fragment):
        GPTConfig(**({"vocab_size": V, "memory_keys": 6, "memory_top_k": 3} | fields))
