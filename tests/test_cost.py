"""attnlab.cost: the counted steps against a brute-force graph search, the fits against exact power
laws, the cost models' two forward paths against each other, and the memory reading of a real
case in a fresh process against the tensors it must hold."""

import itertools
import math
from collections import deque

import pytest
import torch

from attnlab.cost import (
    ATTENTION_CHUNK,
    MODELS,
    RNNLM,
    AttentionRNNLM,
    CostSettings,
    RNNLMConfig,
    _Server,
    count_steps,
    fit_exponent,
    measure_cost,
)


# -- counting -------------------------------------------------------------------------------------
def brute_force_graph(model: str, t: int, layers: int) -> tuple[dict, list, list]:
    """The dependency graph written out node by node: edges[node] = the nodes it needs."""
    sublayers = {"rnn": ["recurrent"], "rnn-attention": ["recurrent", "attention"], "transformer": ["attention"]}
    kinds = sublayers[model] * layers
    edges: dict = {(0, i): [] for i in range(t)}
    for s, kind in enumerate(kinds, start=1):
        for i in range(t):
            if kind == "recurrent":
                edges[(s, i)] = [(s - 1, i)] + ([(s, i - 1)] if i > 0 else [])
            else:
                edges[(s, i)] = [(s - 1, j) for j in range(i + 1)]
    return edges, [(0, i) for i in range(t)], [(len(kinds), i) for i in range(t)]


def brute_force_counts(model: str, t: int, layers: int) -> tuple[int, int]:
    edges, inputs, outputs = brute_force_graph(model, t, layers)
    depth: dict = {}
    for node in sorted(edges):  # (sublayer, position) order is a topological order
        depth[node] = 0 if node[0] == 0 else 1 + max(depth[n] for n in edges[node])
    forward: dict = {n: [] for n in edges}
    for node, needs in edges.items():
        for n in needs:
            forward[n].append(node)
    longest = 0
    for source in inputs:  # breadth-first search from every input position
        dist = {source: 0}
        queue = deque([source])
        while queue:
            node = queue.popleft()
            for nxt in forward[node]:
                if nxt not in dist:
                    dist[nxt] = dist[node] + 1
                    queue.append(nxt)
        longest = max([longest] + [dist[o] for o in outputs if o in dist])
    return max(depth.values()), longest


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize(("t", "layers"), [(1, 1), (2, 1), (7, 3), (12, 2)])
def test_counts_match_a_brute_force_search_of_the_graph(model, t, layers):
    assert count_steps(model, t, layers) == brute_force_counts(model, t, layers)


@pytest.mark.parametrize(("t", "d"), list(itertools.product([16, 1000], [1, 4])))
def test_counts_grow_as_the_lectures_say(t, d):
    # RNN: a wavefront of t + d - 1 cells, and the first input reaches the last output through all of them.
    assert count_steps("rnn", t, d) == (t + d - 1, t + d - 1)
    # Each layer adds an attention step: sequential t + 2d - 1, but any pair is 2 steps per layer apart.
    assert count_steps("rnn-attention", t, d) == (t + 2 * d - 1, 2 * d)
    assert count_steps("transformer", t, d) == (d, d)


# -- fitting --------------------------------------------------------------------------------------
@pytest.mark.parametrize("exponent", [0.0, 1.0, 1.5, 2.0])
def test_fit_recovers_the_exponent_of_a_power_law(exponent):
    lengths = [64, 128, 256, 512]
    assert fit_exponent(lengths, [3.7 * t**exponent for t in lengths]) == pytest.approx(exponent, abs=1e-9)


def test_fit_of_a_sum_of_powers_lies_between_them():
    lengths = [256, 512, 1024]
    fitted = fit_exponent(lengths, [t * 64**2 + t**2 * 64 for t in lengths])  # t·k² + t²·k, k = 64
    assert 1.0 < fitted < 2.0


def test_fit_without_usable_values_is_none():
    assert fit_exponent([1, 2], [1.0, None]) is None
    assert fit_exponent([1, 2], [1.0, 0.0]) is None
    with pytest.raises(ValueError, match="2 lengths but 3"):
        fit_exponent([1, 2], [1.0, 2.0, 3.0])


# -- settings -------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(lengths=(64, 64)), "strictly increasing"),
        (dict(lengths=(128, 64)), "strictly increasing"),
        (dict(lengths=(0, 64)), ">= 2"),
        (dict(lengths=(64,)), "at least two"),
        (dict(width=30, heads=4), "divisible by heads"),
        (dict(layers=0), "layers must be >= 1"),
        (dict(lengths=(8, 16, 32), fit_from=32), "fewer than two"),
    ],
)
def test_bad_settings_name_the_field(kwargs, message):
    with pytest.raises(ValueError, match=message):
        CostSettings(**kwargs)


def test_fit_lengths_are_the_larger_half_unless_chosen():
    assert CostSettings(lengths=(64, 128, 256, 512, 1024)).fit_lengths == (256, 512, 1024)
    assert CostSettings(lengths=(8, 16)).fit_lengths == (8, 16)
    assert CostSettings(lengths=(8, 16, 32, 64), fit_from=16).fit_lengths == (16, 32, 64)


# -- the models -----------------------------------------------------------------------------------
def incremental_logits(model: torch.nn.Module, idx: torch.Tensor) -> torch.Tensor:
    """Logits `(1, T, V)` fed one token at a time through the generation state, as decoding does."""
    cache = model.new_cache(1, idx.size(1))
    return torch.cat([model(idx[:, i : i + 1], cache=cache) for i in range(idx.size(1))], dim=1)


@pytest.mark.parametrize("cls", [RNNLM, AttentionRNNLM])
def test_the_generation_state_gives_the_training_forward(cls):
    torch.manual_seed(0)
    t = ATTENTION_CHUNK + 6  # crosses a chunk boundary of the attention's training forward
    model = cls(RNNLMConfig(vocab_size=11, n_embd=8, n_layer=2, block_size=t)).eval()
    idx = torch.randint(0, 11, (1, t))
    with torch.no_grad():
        full = model(idx)
        stepped = incremental_logits(model, idx)
    assert full.shape == (1, t, 11)
    torch.testing.assert_close(stepped, full, rtol=1e-5, atol=1e-5)


def test_attention_rnn_attends_to_the_past_only():
    torch.manual_seed(0)
    model = AttentionRNNLM(RNNLMConfig(vocab_size=11, n_embd=8, n_layer=1, block_size=80)).eval()
    idx = torch.randint(0, 11, (1, 80))
    changed = idx.clone()
    changed[0, 70] = (idx[0, 70] + 1) % 11
    with torch.no_grad():
        a, b = model(idx), model(changed)
    torch.testing.assert_close(a[:, :70], b[:, :70])  # the positions before 70 do not see it
    assert not torch.allclose(a[:, 70:], b[:, 70:])


def test_attention_rnn_is_one_sequence_at_a_time():
    model = AttentionRNNLM(RNNLMConfig(vocab_size=11, n_embd=8, n_layer=1, block_size=8))
    with pytest.raises(ValueError, match="one sequence"):
        model(torch.zeros(2, 4, dtype=torch.long))


# -- measuring in fresh processes -----------------------------------------------------------------
@pytest.fixture(scope="module")
def server():
    s = _Server()
    yield s
    s.close()


def test_training_memory_holds_the_attention_pairs(server):
    # Additive attention keeps tanh(W_a h_i + U_a h_j), k floats, for every pair j <= i (in chunks
    # of query positions, so a little more than t²/2 pairs) for the backward pass.
    t, k = 256, 32
    settings = CostSettings(lengths=(128, t), width=k, layers=1, heads=1, repeats=1)
    reply = server.measure("rnn-attention", "train", t, settings, threads=1)
    pairs = sum(
        min(start + ATTENTION_CHUNK, t) * min(ATTENTION_CHUNK, t - start) for start in range(0, t, ATTENTION_CHUNK)
    )
    assert pairs > t * t / 2
    assert reply["peak_mib"] >= pairs * k * 4 / 2**20
    assert reply["seconds"] > 0


def test_a_failing_case_raises_with_the_childs_traceback(server):
    settings = CostSettings(lengths=(8, 16), width=8, layers=1, heads=1, repeats=1)
    with pytest.raises(RuntimeError, match="model must be one of"):
        server.measure("lstm", "train", 8, settings, threads=1)
    # The server survives a failed case.
    assert server.measure("rnn", "generate", 8, settings, threads=1)["seconds"] > 0


def test_cases_over_the_memory_limit_are_skipped_not_run(capsys):
    # Every reading is at least one page, which quadrupled is far above 1e-6 MiB: only the first
    # length runs, and the fits that need two lengths are missing, not made up. The second pass
    # repeats only what the first could run.
    settings = CostSettings(lengths=(8, 16, 32), width=8, layers=1, heads=1, repeats=1, passes=2, max_memory_mib=1e-6)
    result = measure_cost(settings, threads=1, progress=True)
    assert {(m.length, m.seconds is None) for m in result.measurements} == {(8, False), (16, True), (32, True)}
    lines = capsys.readouterr().err.splitlines()
    assert sum(line.startswith("cost: pass 1/2, ") for line in lines) == 18
    assert sum(line.startswith("cost: pass 1/2, ") and "skipped: about" in line for line in lines) == 6
    assert sum(line.startswith("cost: pass 2/2, ") and " t=8:" in line for line in lines) == 6
    assert sum(line.startswith("cost: pass 2/2, ") for line in lines) == 6
    measured = [row for row in result.table if row.quantity not in ("sequential_steps", "max_path_length")]
    assert all(row.fitted_exponent is None for row in measured)
    counted = [row for row in result.table if row.quantity in ("sequential_steps", "max_path_length")]
    assert all(math.isfinite(row.fitted_exponent) for row in counted)


def test_a_skipped_length_is_left_out_of_the_fit_and_said_so():
    from attnlab.cost import CostResult, Count, Measurement, fit_table, format_table

    lengths = [8, 16, 32, 64]
    measurements = [
        Measurement(m, k, t, None if (m, k, t) == ("rnn", "train", 64) else 0.001 * t**2, 0.5 * t)
        for m in MODELS
        for k in ("train", "generate")
        for t in lengths
    ]
    result = CostResult(
        date="2026-11-22", device="cpu", machine="x", threads=1, torch="2", lengths=lengths, fit_lengths=[16, 32, 64],
        width=8, layers=1, heads=1, vocab=64, batch=1, repeats=1, passes=1, max_memory_mib=1.0, timing_method="t",
        memory_method="m", measurements=measurements, counts=[], table=[],
    )  # fmt: skip
    result.counts = [Count(m, t, *count_steps(m, t, 1)) for m in MODELS for t in lengths]
    result.table = fit_table(result)
    rows = {(r.model, r.quantity): r for r in result.table}
    assert rows[("rnn", "train_time")].fit_lengths == [16, 32]
    assert rows[("rnn", "train_time")].fitted_exponent == pytest.approx(2.0)
    assert rows[("transformer", "train_time")].fit_lengths == [16, 32, 64]
    assert rows[("rnn", "train_memory")].fitted_exponent == pytest.approx(1.0)
    text = format_table(result)
    assert "2.00†" in text and "† fitted on the lengths that ran: RNN training step time on t = 16, 32" in text
