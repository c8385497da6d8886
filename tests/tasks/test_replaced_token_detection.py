"""ELECTRA's replaced-token detection (Clark et al. 2020), checked against the paper's description
written out here: the discriminator's labels, the generator's sampling, the shared embeddings, the
combined loss, the gradient that the samples stop, training, and fine-tuning from the discriminator."""

import csv
import math
from pathlib import Path

import pytest
import torch
from scipy import stats

from attnlab import load
from attnlab.config import load_preset_or_file
from attnlab.data.mlm import IGNORE_INDEX
from attnlab.models.electra import Electra, ElectraConfig, sample_tokens
from attnlab.tasks import TokenClassification
from attnlab.tasks.replaced_token_detection import REPLACE_PROB, ReplacedTokenDetection, electra_losses
from attnlab.train import resolve, train
from attnlab.train.config import apply_overrides
from helpers import UD, WIKITEXT, assert_user_error, cli

pytestmark = pytest.mark.slow

SMALL = {"vocab_size": 40, "max_len": 16, "d_model": 32, "n_heads": 4, "n_layers": 2, "d_ff": 64, "dropout": 0.0}
PAD, MASK = 0, 3


def electra(**overrides) -> Electra:
    torch.manual_seed(0)
    return Electra(ElectraConfig(**(SMALL | overrides))).eval()


def rtd_doc(**train) -> dict:
    """A tiny ELECTRA on the WikiText fixture."""
    return {
        "task": "replaced-token-detection",
        "model": {"kind": "electra", **SMALL, "max_len": 64, "vocab_size": 400, "generator_size": 0.5},
        "data": {"data_dir": str(WIKITEXT), "vocab_size": 400},
        "train": {
            "max_iters": 20,
            "batch_size": 16,
            "learning_rate": 3e-3,
            "min_lr": 3e-4,
            "warmup_iters": 5,
            "eval_interval": 10,
            "eval_iters": 2,
            "log_interval": 5,
            "weight_decay": 0.0,
            "device": "cpu",
            **train,
        },
    }


@pytest.fixture(scope="module")
def rtd_run(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("rtd") / "run"
    train(resolve(rtd_doc()), run_dir, progress=False)
    return run_dir


def test_labels_are_one_exactly_where_the_sample_differs_from_the_original():
    model = electra()
    # A generator that puts half its mass on token 5 and half on token 7 (the bias swamps the
    # small initial scores), so the uniforms decide: u < 1/2 -> 5 (the lower id comes first), else 7.
    with torch.no_grad():
        model.generator.head.decoder.bias.fill_(-1e4)
        model.generator.head.decoder.bias[[5, 7]] = 1e4
    originals = torch.tensor([[1, 5, 7, 5, 9, 2], [1, 7, 8, 9, 2, PAD]])
    chosen = torch.tensor([[0, 1, 1, 1, 0, 0], [0, 1, 1, 0, 0, 0]], dtype=torch.bool)
    inputs = originals.masked_fill(chosen, MASK)
    uniforms = torch.full(originals.shape, 0.5)
    uniforms[0, 1:4] = torch.tensor([0.2, 0.7, 0.9])  # -> 5, 7, 7
    uniforms[1, 1:3] = torch.tensor([0.3, 0.6])  # -> 5, 7
    out = model(inputs, originals, chosen, uniforms)
    # Sampled 5 over 5 and 7 over 7: "the correct token ... is considered real" (§3).
    assert out.corrupted.tolist() == [[1, 5, 7, 7, 9, 2], [1, 5, 7, 9, 2, PAD]]
    assert out.replaced.int().tolist() == [[0, 0, 0, 1, 0, 0], [0, 1, 1, 0, 0, 0]]
    assert out.generator_logits.shape == (5, SMALL["vocab_size"])


def chi_square_p(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = probs.double() * counts.sum()
    return stats.chisquare(counts.double().numpy(), expected.numpy()).pvalue


def test_samples_follow_the_generators_softmax_not_its_argmax():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0, 0.5, -float("inf")], [0.0, 0.0, 3.0, 0.0, -2.0, 1.0]])
    n = 20_000
    g = torch.Generator().manual_seed(11)
    uniforms = torch.rand(n, 2, generator=g)
    drawn = torch.stack([sample_tokens(logits, u) for u in uniforms])  # (n, 2)
    for row in range(2):
        counts = torch.bincount(drawn[:, row], minlength=6)
        probs = torch.softmax(logits[row].double(), -1)
        if row == 0:
            assert counts[5] == 0  # probability 0: never drawn
            counts, probs = counts[:5], probs[:5]
        # A wrong law (the argmax, a temperature, an off-by-one in the cdf) fails by far; the right
        # one fails by chance once in a thousand seeds.
        assert chi_square_p(counts, probs) > 1e-3, (row, counts)
    # The same law as PyTorch's own sampler from the same logits, by a test of homogeneity.
    theirs = torch.multinomial(torch.softmax(logits[1], -1), n, replacement=True, generator=g)
    table = torch.stack([torch.bincount(drawn[:, 1], minlength=6), torch.bincount(theirs, minlength=6)])
    assert stats.chi2_contingency(table.numpy()).pvalue > 1e-3


def test_generator_and_discriminator_share_the_embeddings_as_the_same_parameters():
    model = electra(generator_size=0.25)
    disc, gen = model.discriminator.embeddings, model.generator.embeddings
    assert gen.shared is disc
    assert gen.shared.token.weight is disc.token.weight
    assert gen.shared.position.weight is disc.position.weight
    assert model.generator.head.decoder.weight is disc.token.weight  # the generator decodes with them
    # Smaller generator: the shared C-wide embeddings projected to its width, its head back to C.
    assert model.generator.config.d_model == 8 and gen.proj.weight.shape == (8, 32)
    assert model.generator.head.dense.weight.shape == (32, 8)
    shared_ids = {id(p) for p in disc.parameters()}
    generator_only = [p for p in model.generator.parameters() if id(p) not in shared_ids]
    n_disc, n_head = len(list(model.discriminator.parameters())), len(list(model.replaced_head.parameters()))
    assert len(list(model.parameters())) == n_disc + len(generator_only) + n_head  # the shared ones once
    same_width = electra(generator_size=1.0)
    assert isinstance(same_width.generator.embeddings.proj, torch.nn.Identity)


def tiny_batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(inputs, labels, uniforms) with a padded row: the ids, the chosen positions and the draws."""
    originals = torch.tensor([[1, 5, 7, 5, 9, 11, 2], [1, 17, 8, 9, 2, PAD, PAD]])
    chosen = torch.tensor([[0, 1, 0, 1, 1, 0, 0], [0, 1, 1, 0, 0, 0, 0]], dtype=torch.bool)
    labels = originals.masked_fill(~chosen, IGNORE_INDEX)
    inputs = originals.masked_fill(chosen, MASK)
    return inputs, labels, torch.rand(originals.shape, generator=torch.Generator().manual_seed(4))


def test_the_loss_is_the_generators_cross_entropy_plus_lambda_times_the_discriminators():
    model = electra()
    with torch.no_grad():  # a generator that often samples the original, so both labels occur
        model.generator.head.decoder.bias[[5, 9, 17]] = 4.0
    inputs, labels, uniforms = tiny_batch()
    losses = electra_losses(model, inputs, labels, uniforms, pad_id=PAD, discriminator_weight=50.0)
    out = losses.output
    chosen = labels != IGNORE_INDEX
    assert 0 < int(out.replaced.sum()) < int(chosen.sum())
    # The generator's scores are its masked-LM head at the chosen positions of the masked input;
    # the discriminator's, its head on the corrupted text.
    with torch.no_grad():
        torch.testing.assert_close(out.generator_logits, model.generator(inputs)[chosen])
        hidden = model.discriminator.encode(out.corrupted)
        torch.testing.assert_close(out.discriminator_logits, model.replaced_head(hidden))
    # L_MLM: -1/N Σ log p_G(x_i | masked x) over the N chosen positions.
    log_p = torch.log_softmax(out.generator_logits.double(), -1)
    targets = labels[chosen]
    mlm = -sum(log_p[i, targets[i]] for i in range(len(targets))) / len(targets)
    # L_Disc: -1/M Σ [y log D + (1 - y) log (1 - D)] over the M tokens that are not padding.
    d = torch.sigmoid(out.discriminator_logits.double())
    y = out.replaced.double()
    real = torch.where(chosen, labels, inputs) != PAD
    assert int(real.sum()) == 12
    disc = -(y * d.log() + (1 - y) * (1 - d).log())[real].sum() / 12
    torch.testing.assert_close(losses.generator.double(), mlm)
    torch.testing.assert_close(losses.discriminator.double(), disc)
    torch.testing.assert_close(losses.total.double(), mlm + 50.0 * disc)


def test_no_gradient_reaches_the_generator_through_its_samples():
    model = electra(generator_size=0.25).train()
    losses = electra_losses(model, *tiny_batch(), pad_id=PAD, discriminator_weight=50.0)
    assert not losses.output.corrupted.requires_grad
    shared = {id(p) for p in model.discriminator.embeddings.parameters()}
    generator_only = {n: p for n, p in model.generator.named_parameters() if id(p) not in shared}
    (losses.discriminator * 50.0).backward(retain_graph=True)
    for name, p in generator_only.items():
        assert p.grad is None or not p.grad.any(), name
    # The shared embeddings do learn from the discriminator (they are its embeddings) ...
    assert model.discriminator.embeddings.token.weight.grad.abs().sum() > 0
    # ... and the generator from its own loss, so the check above is not vacuous.
    losses.generator.backward()
    assert all(p.grad is not None and p.grad.any() for n, p in generator_only.items() if "blocks.0" in n)


def test_masking_is_electras_85_percent_mask_15_percent_kept_and_no_random_tokens(rtd_run):
    run = load(rtd_run)
    task = ReplacedTokenDetection(run.config.data, run.config.model, rtd_run, resume=True, batch_size=64)
    inputs, labels, uniforms = task.train_batch(0, torch.Generator().manual_seed(5))
    chosen = labels != IGNORE_INDEX
    originals = torch.where(chosen, labels, inputs)
    is_mask = inputs[chosen] == task.tokenizer.mask_id
    assert bool((is_mask | (inputs[chosen] == originals[chosen])).all())  # [MASK] or kept, nothing else
    assert torch.equal(inputs[~chosen], originals[~chosen])
    n, k = int(chosen.sum()), int(is_mask.sum())
    assert stats.binomtest(k, n, REPLACE_PROB).pvalue > 1e-3, (k, n)
    assert stats.binomtest(n, inputs.numel() - 2 * len(inputs), 0.15).pvalue > 1e-3  # [CLS], [SEP] never chosen
    assert uniforms.shape == inputs.shape and 0 <= float(uniforms.min()) and float(uniforms.max()) < 1


def test_twenty_steps_lower_the_loss_and_the_run_reloads_with_its_ties(rtd_run):
    with open(rtd_run / "metrics.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    evals = [r for r in rows if r["kind"] == "eval"]
    trains = [float(r["train_loss"]) for r in rows if r["kind"] == "train"]
    assert [int(r["step"]) for r in evals] == [0, 10, 20]
    assert float(evals[-1]["val_loss"]) < float(evals[0]["val_loss"]) - 1.0, evals
    assert trains[-1] < trains[0] - 1.0, trains
    assert not (rtd_run / "best.json").exists()  # the last checkpoint is the one fine-tuning takes
    model = load(rtd_run).model
    assert model.generator.head.decoder.weight is model.discriminator.embeddings.token.weight
    assert model.generator.embeddings.shared is model.discriminator.embeddings
    run = load(rtd_run)
    task = ReplacedTokenDetection(run.config.data, run.config.model, rtd_run, resume=True, batch_size=16)
    m = task.evaluate(model, torch.device("cpu"), split="val")
    assert m["val_loss"] == pytest.approx(m["generator_loss"] + 50.0 * m["discriminator_loss"], rel=1e-6)
    during = task.evaluate_during_training(model, torch.device("cpu"), eval_iters=2)
    assert during["val_loss"] == pytest.approx(float(evals[-1]["val_loss"]), rel=1e-4)
    generator_loss = task._metrics(model, torch.device("cpu"), "val", 32)["generator_loss"]
    assert during["val_ppl"] == pytest.approx(math.exp(generator_loss))


def test_init_from_an_electra_run_gives_the_tagger_the_discriminators_encoder(rtd_run, tmp_path):
    _, doc = load_preset_or_file("ud-pos")
    config = resolve(apply_overrides(doc, {"data": {"data_dir": str(UD), "init_from": str(rtd_run)}}))
    task = TokenClassification(config.data, config.model, tmp_path)
    source = load(rtd_run).model.discriminator
    assert task.model_config.d_model == SMALL["d_model"] and task.model_config.head == "token"
    model = task.build_model()
    task.initialize(model)
    ours = {k: v for k, v in model.state_dict().items() if not k.startswith("head.")}
    theirs = source.state_dict()
    assert ours.keys() == theirs.keys()
    for name, tensor in theirs.items():
        assert torch.equal(ours[name], tensor), name
    generator = load(rtd_run).model.generator.state_dict()
    assert not any(torch.equal(t, generator[n]) for n, t in ours.items() if n in generator and "blocks" in n)


def test_configuration_mistakes_are_one_line_errors(rtd_run, capsys, tmp_path):
    base = ["train", "wikitext2-electra", "--data-dir", WIKITEXT, "--out", tmp_path / "x"]
    assert_user_error(cli(capsys, *base, "--set=model.kind=bert"), "model.kind", "electra")
    assert_user_error(cli(capsys, *base, "--set=model.generator_size=0"), "generator_size", "(0, 1]")
    assert_user_error(cli(capsys, *base, "--init-from", rtd_run), "init_from", "from scratch")
    # 48 * 0.4 rounds to a 19-wide generator with round(16 * 0.4) = 6 heads, which do not divide it.
    with pytest.raises(ValueError, match="generator_size 0.4 .* cannot be built: d_model"):
        ElectraConfig(**(SMALL | {"d_model": 48, "n_heads": 16, "generator_size": 0.4}))
