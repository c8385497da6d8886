"""Block parts (issue 28) in every family: cached decoding equals recomputation, sharing and
factorized embeddings compute what they say, the experts' losses reach training, and the C++ fast
paths step aside for what they do not compute."""

import csv

import pytest
import torch

from attnlab.accel import for_training, kernels, uncovered_parts
from attnlab.accel.fused import supports, supports_decoder
from attnlab.decode.sampling import generate_tokens, greedy_picker
from attnlab.models import GPT, Bert, BertConfig, GPTConfig, Seq2SeqConfig, Seq2SeqTransformer
from attnlab.nn import sinusoidal_positions
from helpers import cli

V = 40
PARTS = {
    "llama": dict(normalization="rmsnorm", activation="swiglu", n_kv_heads=1, positions="rope", bias=False),
    "gqa": dict(n_kv_heads=2, n_heads=4),
    "rezero+layernorm": dict(normalization="rezero+layernorm"),
    "geglu": dict(activation="geglu"),
    "moe": dict(experts=3, expert_top_k=2),
    "switch": dict(experts=3, expert_top_k=1, capacity_factor=0.0, expert_every=2),
    "albert": dict(block_sharing="all"),
    "universal": dict(block_sharing="universal"),
    "factorized": dict(embedding_dim=8),
}


def gpt(**overrides) -> GPT:
    torch.manual_seed(0)
    fields = dict(vocab_size=V, block_size=24, n_layers=2, n_heads=2, d_model=16)
    model = GPT(GPTConfig(**(fields | overrides))).eval()
    with torch.no_grad():  # ReZero's α starts at 0; give every part something to do
        for name, p in model.named_parameters():
            if name.endswith("alpha"):
                p.fill_(0.7)
    return model


@pytest.mark.parametrize("name", sorted(PARTS))
def test_gpt_cached_logits_equal_full_recomputation(name):
    model = gpt(**PARTS[name])
    seq = torch.randint(0, V, (3, 20), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full = model(seq)
        cache = model.new_cache(3)
        steps = [model(seq[:, :6], cache=cache)]
        steps += [model(seq[:, t : t + 1], cache=cache) for t in range(6, 20)]
        static = model.new_cache(3)
        fixed = [model(seq[:, :6], cache=static, positions=torch.arange(6))]
        fixed += [model(seq[:, t : t + 1], cache=static, positions=torch.tensor([t])) for t in range(6, 20)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=0, atol=1e-5)
    torch.testing.assert_close(torch.cat(fixed, dim=1), full, rtol=0, atol=1e-5)
    prompt = seq[:2, :4]
    run = [list(generate_tokens(model, prompt, 12, greedy_picker(), use_cache=c)) for c in (True, False)]
    assert torch.equal(torch.stack(run[0]), torch.stack(run[1]))


def test_kv_cache_holds_the_shared_heads_alone():
    model = gpt(n_heads=4, n_kv_heads=1)
    cache = model.new_cache(2)
    assert cache[0].k.shape == (2, 1, 24, 4)


def test_albert_sharing_is_one_block_in_every_layer():
    shared, plain = gpt(block_sharing="all", n_layers=4), gpt(n_layers=4)
    assert all(b is shared.blocks[0] for b in shared.blocks)
    per_block = sum(p.numel() for p in plain.blocks[0].parameters())
    assert plain.num_parameters() - shared.num_parameters() == 3 * per_block
    idx = torch.randint(0, V, (2, 10))
    with torch.no_grad():
        x = shared._embed(idx, torch.arange(10))
        for _ in range(4):
            x = shared.blocks[0](x, causal=True)[0]
        expected = shared.lm_head(shared.final_norm(x))
        torch.testing.assert_close(shared(idx), expected)


def test_universal_transformer_adds_position_and_step_signals_before_each_step():
    model = gpt(block_sharing="universal", n_layers=3)
    idx = torch.randint(0, V, (2, 10))
    table = sinusoidal_positions(24, 16)
    with torch.no_grad():
        x = model._embed(idx, torch.arange(10))
        for t in range(3):  # Dehghani et al. §2.1: P_pos + P_t (at the embeddings' 0.02), then the shared block
            x = model.blocks[0](x + 0.02 * (table[:10] + table[t]), causal=True)[0]
        torch.testing.assert_close(model(idx), model.lm_head(model.final_norm(x)))


def test_factorized_embeddings_project_up_and_back_down():
    model, plain = gpt(embedding_dim=4), gpt()
    assert model.token_embedding.weight.shape == (V, 4)
    assert model.lm_head.weight is model.token_embedding.weight  # tied, at E
    assert plain.num_parameters() - model.num_parameters() == V * 16 - (V * 4 + 2 * 4 * 16)
    idx = torch.randint(0, V, (2, 7))
    with torch.no_grad():
        x = model.token_embedding(idx) @ model.embedding_proj.weight.T + model.positions(torch.arange(7))
        for block in model.blocks:
            x = block(x, causal=True)[0]
        expected = model.final_norm(x) @ model.head_proj.weight.T @ model.token_embedding.weight.T
    torch.testing.assert_close(model(idx), expected, rtol=1e-5, atol=1e-5)


def test_moe_auxiliary_loss_is_added_in_training_only():
    model = gpt(experts=4, expert_top_k=2, router_aux_weight=1.0)
    idx = torch.randint(0, V, (2, 10))
    with torch.no_grad():
        ce = torch.nn.functional.cross_entropy(model(idx).view(-1, V), idx.view(-1))
        assert model(idx, idx)[1] == pytest.approx(ce.item(), abs=1e-6)  # eval: the cross-entropy
        model.train()
        loss = model(idx, idx)[1]
    layers = [b.ffn for b in model.blocks]
    aux = sum(m.last_aux for m in layers)  # each layer's balance loss at weight 1, near 1 itself
    assert aux.item() > 1.0
    assert loss.item() == pytest.approx(ce.item() + aux.item(), abs=1e-5)


@pytest.mark.parametrize("name", ["llama", "rezero+layernorm", "moe", "albert", "factorized", "geglu"])
def test_cpp_kernels_and_fused_decoding_step_aside(name):
    model = gpt(**PARTS[name])
    assert uncovered_parts(model) is not None
    # The fused decoding step computes Llama's and Mixtral's parts too (tests/accel/test_fused_llama.py).
    assert supports(model, model.new_cache(1)) == (name in ("llama", "moe", "geglu"))
    assert supports(gpt(), gpt().new_cache(1)) and uncovered_parts(gpt()) is None
    idx = torch.randint(0, V, (2, 8))
    other = gpt(**PARTS[name])
    if kernels.is_built():  # whatever builds here, the same result each time, in training too
        for_training(model), for_training(other)
    with torch.no_grad():
        torch.testing.assert_close(model.train()(idx), other.train()(idx), rtol=0, atol=0)


def seq2seq(**overrides) -> Seq2SeqTransformer:
    torch.manual_seed(0)
    fields = dict(vocab_size=V, d_model=16, n_heads=4, n_encoder_layers=2, n_decoder_layers=2, d_ff=32, dropout=0.0)
    return Seq2SeqTransformer(Seq2SeqConfig(**(fields | overrides))).eval()


@pytest.mark.parametrize(
    "parts",
    [
        dict(normalization="rmsnorm", activation="swiglu", n_kv_heads=2, norm="pre"),
        dict(experts=2, expert_top_k=1, block_sharing="all"),
    ],
)
def test_seq2seq_with_parts_decodes_like_teacher_forcing(parts):
    model = seq2seq(**parts)
    assert not supports_decoder(model)
    src, tgt = torch.randint(3, V, (2, 9)), torch.randint(3, V, (2, 8))
    src[1, 6:] = 0
    with torch.no_grad():
        full = model(src, tgt)
        state = model.start(src, 16)
        steps = [model.step(tgt[:, t], state) for t in range(8)]
    torch.testing.assert_close(torch.stack(steps, 1), full, rtol=0, atol=1e-5)


def test_seq2seq_refuses_what_it_does_not_have():
    with pytest.raises(ValueError, match="universal.*GPT and BERT"):
        Seq2SeqConfig(vocab_size=V, block_sharing="universal")
    with pytest.raises(ValueError, match="embedding_dim"):
        Seq2SeqConfig(vocab_size=V, embedding_dim=8)


def test_bert_with_parts():
    config = BertConfig(
        vocab_size=V, d_model=16, n_heads=4, n_layers=3, d_ff=32, dropout=0.0, max_len=16,
        normalization="rmsnorm", activation="reglu", embedding_dim=8, block_sharing="universal", n_kv_heads=2,
    )  # fmt: skip
    model = Bert(config).eval()
    ids = torch.randint(1, V, (2, 10))
    assert model(ids).shape == (2, 10, V)
    assert model.embeddings.token.weight.shape == (V, 8) and model.head.decoder.weight.shape == (V, 8)
    assert model.blocks[0] is model.blocks[2]
    assert model.blocks[0].ffn.fc1.weight.shape == (2 * 21, 16)  # 2/3 of d_ff, [W; V]


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("model.normalization=rmsnrom", "did you mean 'rmsnorm'"),
        ("model.activation=swigl", "did you mean 'swiglu'"),
        ("model.block_sharing=alll", "block_sharing must be one of"),
        ("model.expert_top_k=3", "expert_top_k must be between 1 and experts"),
        ("model.n_kv_heads=3", "n_kv_heads (3) must divide"),
    ],
)
def test_cli_refuses_bad_parts_in_one_line(capsys, tmp_path, override, message):
    extra = ["--set", "model.experts=2"] if "top_k" in override else []
    code, out, err = cli(capsys, "train", "demo", "--out", tmp_path / "run", "--set", override, *extra)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not (tmp_path / "run").exists()


def test_training_logs_the_experts_auxiliary_loss(capsys, tmp_path):
    out = tmp_path / "run"
    sets = ["model.experts=2", "model.expert_top_k=1", "model.capacity_factor=1.0", "train.max_iters=4"]
    sets += ["train.eval_interval=2", "train.eval_iters=1", "train.log_interval=1"]
    args = ["train", "demo", "--out", out, "--quiet"] + [a for s in sets for a in ("--set", s)]
    code, _, err = cli(capsys, *args)
    assert code == 0, err
    rows = [r for r in csv.DictReader(open(out / "metrics.csv")) if r["kind"] == "eval" and r["step"] != "0"]
    assert rows and all(0.001 < float(r["aux_loss"]) < 0.1 for r in rows)  # weight 0.01 × balance, about 1
    assert all(0.0 <= float(r["dropped_tokens"]) < 1.0 for r in rows)
