"""Qwen3-MoE folders written by transformers, imported as attnlab's GPT (Qwen3's attention with a
mixture of experts), against transformers itself: the checks of tests/models/hf/test_families.py
(its token helper and tolerances) on shapes of this family's own.

The two shapes take the router's two rules apart from attnlab's default: k = 2 gates left
unnormalised (`norm_topk_prob` false; attnlab would renormalise two) and one expert renormalised to
gate 1 (`norm_topk_prob` true; attnlab's k = 1 would keep the probability). One keeps a block dense
among the mixtures (`mlp_only_layers`), the other puts a mixture in every second block
(`decoder_sparse_step`); the experts are narrower than the dense layers (`moe_intermediate_size`),
heads are sized apart from the width, and the query heads are odd in one and grouped in both.
"""

import copy
import json
import warnings

import pytest
import torch

from attnlab.accel import coverage
from attnlab.accel.fused import gpt_step
from attnlab.decode.sampling import greedy
from attnlab.errors import CheckpointError
from attnlab.models.gpt import GPT, GPTConfig
from attnlab.models.hf._common import save_hf_checkpoint
from attnlab.models.hf.auto import causal_lm_export, causal_lm_model
from attnlab.nn.moe import MixtureOfExperts
from hf_folders import qwen3_moe_model
from models.hf.test_families import BASE, tokens

transformers = pytest.importorskip("transformers")

CASES = {
    "top2-unnormalised-dense-layer": dict(
        hidden_size=32,
        intermediate_size=40,
        moe_intermediate_size=24,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=12,
        num_experts=5,
        num_experts_per_tok=2,
        norm_topk_prob=False,
        mlp_only_layers=[1],
    ),
    "top1-renormalised-every-second": dict(
        hidden_size=36,
        intermediate_size=28,
        moe_intermediate_size=16,
        num_attention_heads=3,
        num_key_value_heads=1,
        head_dim=10,
        num_experts=4,
        num_experts_per_tok=1,
        norm_topk_prob=True,
        decoder_sparse_step=2,
        tie_word_embeddings=True,
    ),
}


@pytest.fixture(scope="module", params=list(CASES))
def pair(request, tmp_path_factory):
    """(case, transformers model, attnlab model loaded from the folder transformers saved)."""
    theirs = qwen3_moe_model(**{**BASE, **CASES[request.param]})
    folder = tmp_path_factory.mktemp(request.param)
    theirs.save_pretrained(folder)
    return request.param, theirs, causal_lm_model(folder)


def test_the_config_names_each_part(pair):
    case, _, ours = pair
    c, fields = ours.config, CASES[case]
    assert (c.experts, c.expert_top_k, c.expert_renormalize) == (
        fields["num_experts"],
        fields["num_experts_per_tok"],
        fields["norm_topk_prob"],
    )
    want = (fields["moe_intermediate_size"], fields["intermediate_size"], fields["head_dim"], "rmsnorm")
    assert (c.expert_hidden, c.d_ff, c.head_dim, c.qk_norm) == want
    kinds = [isinstance(b.ffn, MixtureOfExperts) for b in ours.blocks]
    assert kinds == ([True, False, True] if case.startswith("top2") else [False, True])


def test_logits_without_padding(pair):
    _, theirs, ours = pair
    idx = tokens(2, 29)
    with torch.no_grad():
        torch.testing.assert_close(ours(idx), theirs(idx).logits, atol=1e-4, rtol=0)


def test_logits_with_right_padding(pair):
    """Row 1 is 11 tokens then padding, which transformers masks; a causal model's real positions
    never see what follows them, and a token's experts depend on that token alone."""
    _, theirs, ours = pair
    idx = tokens(2, 24, seed=2)
    mask = torch.ones_like(idx)
    mask[1, 11:] = 0
    with torch.no_grad():
        want, got = theirs(idx, attention_mask=mask).logits, ours(idx)
    torch.testing.assert_close(got[0], want[0], atol=1e-4, rtol=0)
    torch.testing.assert_close(got[1, :11], want[1, :11], atol=1e-4, rtol=0)


def test_cached_greedy_decoding_equals_transformers(pair):
    _, theirs, ours = pair
    prompt = tokens(1, 9, seed=3)
    with torch.no_grad():
        want = theirs.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=64, do_sample=False)
    assert greedy(ours, prompt, 64, use_cache=True).tolist() == want.tolist()


def test_fused_step_says_why_not(pair):
    """Qwen3's q/k norms are outside the fused step: decoding takes PyTorch's path, and says so."""
    _, _, ours = pair
    assert not coverage.decodes_gpt(ours)
    with pytest.warns(UserWarning, match=r"decoding eagerly") as caught:
        assert gpt_step(ours, ours.new_cache(1, 16), "fp32") is None
    message = str(caught[0].message)
    assert "\n" not in message and "qk_norm" in message


def test_export_back_to_qwen3_moe_loads_in_transformers(pair, tmp_path):
    case, theirs, ours = pair
    save_hf_checkpoint(causal_lm_export(ours), tmp_path)
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert back.config.model_type == "qwen3_moe"
    assert back.config.norm_topk_prob == CASES[case]["norm_topk_prob"]
    idx = tokens(2, 29, seed=5)
    with torch.no_grad():
        torch.testing.assert_close(back(idx).logits, theirs(idx).logits, atol=1e-4, rtol=0)


LLAMA = dict(positions="rope", normalization="rmsnorm", activation="swiglu", bias=False, n_heads=4, d_model=32)


def moe_gpt(**fields) -> GPT:
    """A Llama-shaped GPT with 4 experts, routers spread out (no near ties)."""
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=97, block_size=64, n_layers=3, experts=4, n_kv_heads=2, **LLAMA, **fields)
    model = GPT(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("router.weight"):
                p.normal_(0.0, 1.0)
    return model


def test_the_fused_step_steps_aside_for_other_gates_and_takes_narrow_experts():
    """Without q/k norms the step's one rule decides: gates left unnormalised are refused by name;
    experts narrower than the dense layers (and a dense block among the mixtures) it computes,
    its greedy tokens equal PyTorch's."""
    unnormalised = moe_gpt(expert_renormalize=False)
    assert not coverage.decodes_gpt(unnormalised)
    assert "expert_renormalize=False" in coverage.undecoded_parts(unnormalised)[0]
    narrow = moe_gpt(ffn_hidden=40, expert_hidden=24, dense_blocks=(1,))
    assert [isinstance(b.ffn, MixtureOfExperts) for b in narrow.blocks] == [True, False, True]
    assert narrow.blocks[0].ffn.experts.fc2.shape == (4, 32, 24)
    assert coverage.decodes_gpt(narrow)
    prompt = tokens(1, 9, seed=4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "decoding eagerly": the C++ step ran
        fused = greedy(narrow, prompt, 40, use_cache=True, fused=True)
    assert fused.tolist() == greedy(narrow, prompt, 40, use_cache=True).tolist()


@pytest.mark.parametrize(("renormalize", "top_k"), [(None, 1), (None, 2), (False, 2), (True, 1)])
def test_gates_follow_the_named_rule(renormalize, top_k):
    """The gates against the rule written out: the softmax over all experts, its top k, divided by
    their sum only where the rule says (None: when k > 1)."""
    moe = MixtureOfExperts(8, 12, experts=4, top_k=top_k, activation="swiglu", bias=False, renormalize=renormalize)
    x = torch.randn(5, 8, generator=torch.Generator().manual_seed(0))
    probs = torch.softmax(x @ moe.router.weight.T, dim=-1)
    top, chosen = probs.topk(top_k, dim=-1)
    divide = top_k > 1 if renormalize is None else renormalize
    _, gates, got_chosen = moe.route(x)
    assert torch.equal(got_chosen, chosen)
    torch.testing.assert_close(gates, top / top.sum(-1, keepdim=True) if divide else top)


REFUSED = {
    "mlp-only-out-of-range": ({"mlp_only_layers": [3]}, ["mlp_only_layers", "below 3"]),
    "experts-disagree": ({"num_experts": 6}, ["num_experts and num_local_experts disagree"]),
    "sparse-step": ({"decoder_sparse_step": 0}, ["decoder_sparse_step must be >= 1"]),
    "attention-bias": ({"attention_bias": True}, ["attention_bias"]),
}


@pytest.mark.parametrize("name", list(REFUSED))
def test_refusals_name_the_field(tmp_path, name):
    changes, needles = REFUSED[name]
    qwen3_moe_model(**{**BASE, **CASES["top2-unnormalised-dense-layer"]}).save_pretrained(tmp_path)
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))
    with pytest.raises(CheckpointError) as e:
        causal_lm_model(tmp_path)
    message = str(e.value)
    assert "\n" not in message and "config.json" in message
    for needle in needles:
        assert needle in message, message


def test_a_published_config_without_head_dim_or_local_experts_reads_the_same(tmp_path):
    """The Hub's config.json names num_experts (not num_local_experts, which transformers 5 writes)
    and leaves head_dim out when it is the width over the heads: both read as transformers does."""
    fields = {**CASES["top2-unnormalised-dense-layer"], "head_dim": 8}
    theirs = qwen3_moe_model(**{**BASE, **fields})
    theirs.save_pretrained(tmp_path)
    path = tmp_path / "config.json"
    doc = json.loads(path.read_text())
    doc["num_experts"] = doc.pop("num_local_experts")
    del doc["head_dim"]
    path.write_text(json.dumps(doc))
    ours = causal_lm_model(tmp_path)
    assert ours.config.head_size is None and ours.config.experts == 5
    idx = tokens(1, 17, seed=6)
    with torch.no_grad():
        torch.testing.assert_close(ours(idx), theirs(idx).logits, atol=1e-4, rtol=0)


def test_attention_lora_adapters_equal_peft_and_feedforward_ones_are_refused(pair, tmp_path, monkeypatch):
    """tests/models/hf/test_families.py's LoRA check on this family with attention targets: peft's
    logits on transformers' model. Feed-forward targets are refused by name: peft moves them onto
    the fused experts (the dense block's too), which attnlab's adapters are not."""
    import models.hf.test_families as families
    from attnlab.errors import ExportError
    from attnlab.models.hf.peft import peft_adapter
    from attnlab.nn.lora import add_lora

    monkeypatch.setattr(families, "LORA_TARGETS", ("query", "key", "value", "output"))
    families.test_lora_adapters_equal_peft_on_the_family(pair, tmp_path)
    _, _, ours = pair
    dense = copy.deepcopy(ours)
    add_lora(dense, ("query", "ff-out"), rank=2, alpha=4.0)
    with pytest.raises(ExportError, match="ff-out of a mixture-of-experts model have no peft form"):
        peft_adapter(dense)
