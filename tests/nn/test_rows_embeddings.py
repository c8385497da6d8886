"""Narang et al. 2021's embedding rows: adaptive input (Baevski & Auli 2019), the adaptive softmax
(Grave et al. 2017) against PyTorch's nn.AdaptiveLogSoftmaxWithLoss, the mixture of softmaxes
(Yang et al. 2018) against its formula, and the ties of the GPT and the encoder–decoder."""

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from attnlab.decode import greedy
from attnlab.models import GPT, GPTConfig, Seq2SeqConfig, Seq2SeqTransformer
from attnlab.nn import AdaptiveInput, AdaptiveSoftmax, MixtureOfSoftmaxes, rank_by_frequency

V, C = 40, 16
CUTOFFS = (8, 20)


def torch_adaptive(ours: AdaptiveSoftmax, projected: bool) -> nn.AdaptiveLogSoftmaxWithLoss:
    """PyTorch's module with our weights: its head is [shortlist; cluster rows]; its tails are
    (projection, output); without a projection ours is PyTorch's with div 1 and identity projections."""
    ref = nn.AdaptiveLogSoftmaxWithLoss(C, V, list(CUTOFFS), div_value=4.0 if projected else 1.0)
    with torch.no_grad():
        ref.head.weight.copy_(torch.cat([ours.shortlist, ours.cluster_head]))
        for i, (proj, out) in enumerate(ref.tail):
            proj.weight.copy_(ours.proj[i] if projected else torch.eye(C))
            out.weight.copy_(ours.tails[i])
    return ref


@pytest.mark.parametrize("projected", [True, False])
def test_adaptive_softmax_equals_pytorchs_loss_and_log_probs(projected):
    torch.manual_seed(0)
    ours = AdaptiveSoftmax(C, V, CUTOFFS, 4.0, projected=projected)
    with torch.no_grad():  # larger than the initial weights, so that the clusters differ visibly
        for p in ours.parameters():
            p.normal_()
    ref = torch_adaptive(ours, projected)
    h = torch.randn(50, C)
    targets = torch.randint(0, V, (50,))
    assert [t.shape for t in ours.tails] == [(12, 4 if projected else C), (20, 1 if projected else C)]
    torch.testing.assert_close(ours(h), ref.log_prob(h))
    torch.testing.assert_close(ours.nll(h, targets), ref(h, targets).loss)
    torch.testing.assert_close(F.cross_entropy(ours(h), targets), ref(h, targets).loss)
    torch.testing.assert_close(ours(h).exp().sum(-1), torch.ones(50))


def test_adaptive_softmax_ignores_padding_and_reads_ranks():
    torch.manual_seed(1)
    ours = AdaptiveSoftmax(C, V, CUTOFFS)
    h, targets = torch.randn(10, C), torch.randint(0, V, (10,))
    masked = targets.clone()
    masked[::2] = -1
    torch.testing.assert_close(ours.nll(h, masked), F.cross_entropy(ours(h), masked, ignore_index=-1))
    counts = torch.randint(0, 1000, (V,))
    before = ours(h)
    ours.rank_by_frequency(counts)
    order = torch.sort(counts, descending=True, stable=True).indices
    # the most frequent id now holds the first shortlist slot: its log-probability is rank 0's before
    torch.testing.assert_close(ours(h)[:, order], before)
    torch.testing.assert_close(ours.nll(h, targets), F.cross_entropy(ours(h), targets))


def test_adaptive_input_embeds_each_cluster_at_its_width_and_projects_it():
    torch.manual_seed(2)
    emb = AdaptiveInput(V, C, CUTOFFS, div=4.0)
    assert [e.weight.shape for e in emb.embeddings] == [(8, 16), (12, 4), (20, 1)]
    ids = torch.tensor([[0, 7, 8, 19, 20, 39]])
    out = emb(ids)
    want = [
        emb.embeddings[0].weight[0],
        emb.embeddings[0].weight[7],
        emb.embeddings[1].weight[0] @ emb.proj[0],
        emb.embeddings[1].weight[11] @ emb.proj[0],
        emb.embeddings[2].weight[0] @ emb.proj[1],
        emb.embeddings[2].weight[19] @ emb.proj[1],
    ]
    torch.testing.assert_close(out[0], torch.stack(want))
    rank_by_frequency(emb, torch.arange(V))  # id V-1 the most frequent: it moves to cluster 0's first row
    torch.testing.assert_close(emb(torch.tensor([V - 1])), emb.embeddings[0].weight[:1])


def test_mixture_of_softmaxes_is_the_papers_formula():
    torch.manual_seed(3)
    mos = MixtureOfSoftmaxes(C, V, components=3)
    h = torch.randn(2, 5, C)
    prior = torch.softmax(h @ mos.prior.weight.T, dim=-1)  # π_k = softmax(W_π h)
    total = torch.zeros(2, 5, V)
    for k in range(3):
        pk = mos.latent.weight[k * C : (k + 1) * C]
        bk = mos.latent.bias[k * C : (k + 1) * C]
        hk = torch.tanh(h @ pk.T + bk)  # h_k = tanh(P_k h)
        total += prior[..., k : k + 1] * torch.softmax(hk @ mos.decoder.weight.T + mos.decoder.bias, dim=-1)
    torch.testing.assert_close(mos(h), total.log())
    one = MixtureOfSoftmaxes(C, V, components=1)  # K = 1 is a softmax over W tanh(P h)
    torch.testing.assert_close(one(h), F.log_softmax(one.decoder(torch.tanh(one.latent(h))), dim=-1))


GPT_ROWS = {
    "adaptive-input": dict(input_embedding="adaptive", tie_weights=False),
    "adaptive-softmax": dict(softmax="adaptive", tie_weights=False),
    "adaptive-softmax-unprojected": dict(softmax="adaptive-unprojected", tie_weights=False),
    "adaptive-tied": dict(input_embedding="adaptive", softmax="adaptive"),
    "mos": dict(softmax="mos", mos_components=3),
}


def small_gpt(**kw) -> GPT:
    return GPT(GPTConfig(vocab_size=V, block_size=16, n_layers=2, n_heads=2, d_model=C, adaptive_cutoffs=CUTOFFS, **kw))


@pytest.mark.parametrize("row", list(GPT_ROWS))
def test_each_gpt_row_trains_decodes_with_its_cache_and_round_trips_its_weights(row):
    torch.manual_seed(4)
    model = small_gpt(**GPT_ROWS[row])
    x = torch.randint(0, V, (2, 12))
    rank_by_frequency(model, torch.bincount(x.flatten(), minlength=V))
    logits, loss = model(x[:, :-1], x[:, 1:])
    loss.backward()
    assert all(p.grad is not None for p in model.parameters())
    if model.config.softmax != "full":  # log-probabilities, which are their own logits
        torch.testing.assert_close(logits.logsumexp(-1), torch.zeros(2, 11), atol=1e-5, rtol=0)
    torch.testing.assert_close(loss, F.cross_entropy(logits.reshape(-1, V), x[:, 1:].reshape(-1)))
    model.eval()
    with torch.no_grad():
        cached = greedy(model, x[:1, :4], max_new_tokens=6)
        full = x[:1, :4]
        for _ in range(6):  # recomputation from scratch, greedily
            full = torch.cat([full, model(full)[:, -1:].argmax(-1)], dim=1)
    assert cached.tolist() == full.tolist()
    again = small_gpt(**GPT_ROWS[row])
    again.load_state_dict(model.state_dict())
    torch.testing.assert_close(again(x), model(x))


def test_adaptive_tied_rows_share_their_clusters():
    model = small_gpt(**GPT_ROWS["adaptive-tied"])
    emb, head = model.token_embedding, model.lm_head
    assert head.shortlist is emb.embeddings[0].weight
    assert all(head.tails[i] is emb.embeddings[i + 1].weight for i in range(2))
    assert all(head.proj[i] is emb.proj[i] for i in range(2))
    untied = small_gpt(**GPT_ROWS["adaptive-input"], softmax="adaptive")
    assert untied.num_parameters() > model.num_parameters()


def test_gpt_untied_and_tied_embeddings_differ_by_the_output_matrix():
    tied, untied = small_gpt(), small_gpt(tie_weights=False)
    assert tied.lm_head.weight is tied.token_embedding.weight
    assert untied.lm_head.weight is not untied.token_embedding.weight
    assert untied.num_parameters() - tied.num_parameters() == V * C
    fact = small_gpt(embedding_dim=8)  # factorized and shared: both sides at E, one matrix
    assert fact.lm_head.weight is fact.token_embedding.weight and fact.lm_head.weight.shape == (V, 8)
    fact_untied = small_gpt(embedding_dim=8, tie_weights=False)
    assert fact_untied.num_parameters() - fact.num_parameters() == V * 8


def test_block_sharing_composes_with_factorized_and_shared_embeddings():
    shared = small_gpt(block_sharing="all", embedding_dim=8)
    assert shared.blocks[0] is shared.blocks[1]
    assert shared.lm_head.weight is shared.token_embedding.weight
    x = torch.randint(0, V, (2, 8))
    _, loss = shared(x, x)
    loss.backward()
    assert shared.embedding_proj.weight.grad is not None


@pytest.mark.parametrize(
    "kw, fragment",
    [
        (dict(input_embedding="adaptive"), "tie_weights"),
        (dict(softmax="adaptive"), "tie_weights"),
        (dict(softmax="adaptiv"), "did you mean 'adaptive'"),
        (dict(softmax="mos", embedding_dim=8), "embedding_dim"),
        (dict(softmax="adaptive", tie_weights=False, adaptive_cutoffs=(20, 8)), "adaptive_cutoffs"),
        (dict(softmax="adaptive", tie_weights=False, adaptive_cutoffs=(8, 40)), "adaptive_cutoffs"),
        (dict(block_sharing="encoder"), "one stack"),
    ],
)
def test_gpt_refuses_rows_that_cannot_be_built(kw, fragment):
    base = dict(vocab_size=V, block_size=16, n_layers=2, n_heads=2, d_model=C)
    with pytest.raises(ValueError, match=fragment):
        GPTConfig(**{**base, **kw})


def small_seq2seq(**kw) -> Seq2SeqTransformer:
    base = dict(vocab_size=V, d_model=C, n_heads=2, n_encoder_layers=2, n_decoder_layers=2, d_ff=32, max_len=16)
    return Seq2SeqTransformer(Seq2SeqConfig(**{**base, **kw}))


def test_encoder_decoder_embedding_ties():
    m = {t: small_seq2seq(tie_embeddings=t) for t in (True, "all", False, "none", "source-target", "target-output")}
    for name in (True, "all"):
        assert m[name].src_embedding is m[name].tgt_embedding and m[name].output.weight is m[name].src_embedding.weight
    for name in (False, "none"):
        assert len({id(m[name].src_embedding.weight), id(m[name].tgt_embedding.weight), id(m[name].output.weight)}) == 3
    st, to = m["source-target"], m["target-output"]
    assert st.src_embedding is st.tgt_embedding and st.output.weight is not st.tgt_embedding.weight
    assert to.src_embedding is not to.tgt_embedding and to.output.weight is to.tgt_embedding.weight
    assert m["none"].num_parameters() - m["all"].num_parameters() == 2 * V * C
    with pytest.raises(ValueError, match="tie_embeddings must be"):
        Seq2SeqConfig(tie_embeddings="decoder")


@pytest.mark.parametrize(
    "sharing, encoder_shared, decoder_shared", [("encoder", True, False), ("decoder", False, True)]
)
def test_encoder_only_and_decoder_only_block_sharing(sharing, encoder_shared, decoder_shared):
    torch.manual_seed(5)
    m = small_seq2seq(block_sharing=sharing)
    assert (m.encoder[0] is m.encoder[1]) == encoder_shared
    assert (m.decoder[0] is m.decoder[1]) == decoder_shared
    src, tgt = torch.randint(1, V, (2, 7)), torch.randint(1, V, (2, 5))
    loss = F.cross_entropy(m(src, tgt).reshape(-1, V), tgt.reshape(-1))
    loss.backward()
    per_block = sum(p.numel() for p in m.encoder[0].parameters())
    full = small_seq2seq()
    shared_stack = m.encoder if encoder_shared else m.decoder
    saved = sum(p.numel() for p in shared_stack[1].parameters())
    assert full.num_parameters() - m.num_parameters() == saved and per_block > 0


def test_seq2seq_config_reads_ties_from_toml_values():
    from attnlab.config import build

    assert build(Seq2SeqConfig, {"tie_embeddings": "source-target"}, "model").embedding_ties == "source-target"
    assert build(Seq2SeqConfig, {"tie_embeddings": False}, "model").embedding_ties == "none"
    assert dataclasses.replace(Seq2SeqConfig(), tie_embeddings=True).embedding_ties == "all"
