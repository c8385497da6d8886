"""attnlab.studies.cost: the counted steps against a brute-force graph search, the fits against exact power
laws, the cost models' two forward paths against each other, and the memory reading of a real
case in a fresh process against the tensors it must hold."""

import dataclasses
import itertools
import json
import math
import re
from collections import deque

import pytest
import torch

from attnlab.nn.sparse import BigBirdAttention
from attnlab.studies.cost import (
    ATTENTION_CHUNK,
    ATTENTION_MODELS,
    MODELS,
    QUANTITIES,
    RNNLM,
    THEORY,
    AttentionRNNLM,
    CostResult,
    CostSettings,
    Count,
    Measurement,
    RNNLMConfig,
    _Server,
    build_model,
    count_on_key_masks,
    count_steps,
    fit_exponent,
    fit_table,
    format_table,
    measure_cost,
    model_groups,
)

pytestmark = pytest.mark.slow


# -- counting -------------------------------------------------------------------------------------
def brute_force_graph(
    model: str, t: int, layers: int, *, window: int = 0, masks: list | None = None
) -> tuple[dict, list, list]:
    """The dependency graph written out node by node: edges[node] = the nodes it needs. `window`:
    the keys a query of "transformer-window" sees; `masks`: the key mask `(t, t)` of each layer of
    "transformer-bigbird", as nested lists."""
    sublayers = {
        "rnn": ["recurrent"],
        "rnn-attention": ["recurrent", "attention"],
        "transformer": ["attention"],
        "transformer-window": ["window"],
        "transformer-bigbird": ["mask"],
    }
    kinds = sublayers[model] * layers
    edges: dict = {(0, i): [] for i in range(t)}
    for s, kind in enumerate(kinds, start=1):
        layer = (s - 1) // len(sublayers[model])
        for i in range(t):
            if kind == "recurrent":
                edges[(s, i)] = [(s - 1, i)] + ([(s, i - 1)] if i > 0 else [])
            elif kind == "attention":
                edges[(s, i)] = [(s - 1, j) for j in range(i + 1)]
            elif kind == "window":
                edges[(s, i)] = [(s - 1, j) for j in range(max(0, i - window + 1), i + 1)]
            else:
                edges[(s, i)] = [(s - 1, j) for j in range(t) if masks[layer][i][j]]
    return edges, [(0, i) for i in range(t)], [(len(kinds), i) for i in range(t)]


def brute_force_distances(edges: dict) -> dict:
    """{(input position j, output node): fewest edges} for every pair that a path connects."""
    forward: dict = {n: [] for n in edges}
    for node, needs in edges.items():
        for n in needs:
            forward[n].append(node)
    found = {}
    for source in [n for n in edges if n[0] == 0]:  # breadth-first search from every input position
        dist = {source: 0}
        queue = deque([source])
        while queue:
            node = queue.popleft()
            for nxt in forward[node]:
                if nxt not in dist:
                    dist[nxt] = dist[node] + 1
                    queue.append(nxt)
        found.update({(source[1], node): d for node, d in dist.items()})
    return found


def brute_force_counts(model: str, t: int, layers: int, **graph) -> tuple[int, int | None]:
    edges, inputs, outputs = brute_force_graph(model, t, layers, **graph)
    depth: dict = {}
    for node in sorted(edges):  # (sublayer, position) order is a topological order
        depth[node] = 0 if node[0] == 0 else 1 + max(depth[n] for n in edges[node])
    dist = brute_force_distances(edges)
    pairs = [(j, o) for j in range(t) for o in outputs if o[1] >= j]
    longest = None if any(p not in dist for p in pairs) else max(dist[p] for p in pairs)
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


def test_window_counts_computed_by_hand():
    # t = 8, w = 3, d = 2: a query sees itself and 2 keys back, so two layers reach 4 back: 0 -> 4
    # (through 2) but not 0 -> 5. Every path has one edge per layer.
    edges, _, outputs = brute_force_graph("transformer-window", 8, 2, window=3)
    reached = {(j, o[1]) for (j, o), _ in brute_force_distances(edges).items() if o in outputs}
    assert reached == {(j, i) for i in range(8) for j in range(8) if 0 <= i - j <= 4}
    assert count_steps("transformer-window", 8, 2, CostSettings(attention_window=3)) == (2, None)
    assert count_steps("transformer-window", 5, 2, CostSettings(attention_window=3)) == (2, 2)  # 4 back: all
    assert count_steps("transformer-window", 6, 2, CostSettings(attention_window=3)) == (2, None)
    assert count_steps("transformer-window", 8, 2, CostSettings(attention_window=5)) == (2, 2)


@pytest.mark.parametrize("window", [1, 2, 3, 5, 20])
@pytest.mark.parametrize(("t", "layers"), [(1, 1), (2, 1), (7, 3), (12, 2), (13, 4)])
def test_window_counts_match_a_brute_force_search_of_the_graph(window, t, layers):
    settings = CostSettings(attention_window=window)
    assert count_steps("transformer-window", t, layers, settings) == brute_force_counts(
        "transformer-window", t, layers, window=window
    )


def bigbird_masks(t: int, layers: int, block: int, global_blocks: int, random_blocks: int) -> list:
    """Each layer's key mask as nested lists, its random blocks seeded by the layer's index (as GPT does)."""
    patterns = [BigBirdAttention(block, global_blocks, random_blocks, seed=i) for i in range(layers)]
    return [p.key_mask(torch.arange(t), t, causal=True).tolist() for p in patterns]


def test_bigbird_counts_computed_by_hand():
    # Blocks of 2, t = 8: blocks 0..3, each seeing its own block (up to itself), the one before and
    # global block 0. Without random blocks, block 3 misses block 1 (2 -> 6 unconnected in one layer),
    # which two layers reach through block 2. With one random block, block 3's only candidate is
    # block 1 (strictly before its window, after the global block): one layer connects every pair.
    # A causal global block is no hub: it sees nothing after itself.
    def settings(random_blocks):
        return CostSettings(attention_block=2, global_blocks=1, random_blocks=random_blocks)

    assert count_steps("transformer-bigbird", 8, 1, settings(0)) == (1, None)
    assert count_steps("transformer-bigbird", 8, 2, settings(0)) == (2, 2)
    assert count_steps("transformer-bigbird", 8, 1, settings(1)) == (1, 1)


@pytest.mark.parametrize(("t", "layers", "block"), [(8, 1, 2), (12, 2, 2), (20, 2, 3), (24, 3, 2)])
@pytest.mark.parametrize("random_blocks", [0, 1, 2])
def test_bigbird_counts_match_a_brute_force_search_of_its_masks(t, layers, block, random_blocks):
    settings = CostSettings(attention_block=block, global_blocks=1, random_blocks=random_blocks)
    masks = bigbird_masks(t, layers, block, 1, random_blocks)
    assert count_steps("transformer-bigbird", t, layers, settings) == brute_force_counts(
        "transformer-bigbird", t, layers, masks=masks
    )


@pytest.mark.parametrize(("t", "layers"), [(7, 2), (9, 2), (17, 3)])
def test_counts_on_key_masks_agree_with_the_rules(t, layers):
    full = torch.ones(t, t, dtype=torch.bool).tril()
    assert count_on_key_masks([full] * layers) == count_steps("transformer", t, layers)
    settings = CostSettings(layers=layers, attention_window=4)
    blocks = build_model("transformer-window", settings, t).blocks
    masks = [block.attn.pattern.key_mask(torch.arange(t), t, causal=True) for block in blocks]
    assert count_on_key_masks(masks) == count_steps("transformer-window", t, layers, settings)


def test_counts_of_the_patterns_at_the_default_sizes():
    # w = 64, d = 2 reaches 126 positions back; BigBird's blocks of 32 with one random block leave
    # pairs unconnected once t is a few times d·b.
    assert count_steps("transformer-window", 127, 2) == (2, 2)
    assert count_steps("transformer-window", 128, 2) == (2, None)
    assert count_steps("transformer-bigbird", 128, 2) == (2, 2)
    assert count_steps("transformer-bigbird", 512, 2) == (2, None)


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


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(attention=("lstm",)), "attention must be among window, bigbird, got 'lstm'"),
        (dict(attention=("linformer",)), "no causal model"),
        (dict(attention=("window", "window")), "twice"),
        (dict(attention_window=0), "attention_window must be >= 1"),
        (dict(attention_block=0), "attention_block must be >= 1"),
        (dict(random_blocks=-1), "random_blocks must be >= 0"),
    ],
)
def test_bad_attention_settings_name_the_field(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        CostSettings(**kwargs)


def test_attention_adds_models_after_the_lectures_three():
    assert CostSettings().models == MODELS
    settings = CostSettings(attention=("bigbird", "window"))
    assert settings.models == (*MODELS, "transformer-bigbird", "transformer-window")
    # As the measuring server receives them: through JSON, which has no tuples.
    assert CostSettings.from_json(json.loads(json.dumps(dataclasses.asdict(settings)))) == settings


def test_model_groups_put_the_patterns_beside_full_attention():
    assert model_groups(MODELS) == [MODELS]
    assert model_groups(CostSettings(attention=("window", "bigbird")).models) == [
        MODELS,
        ("transformer", "transformer-window", "transformer-bigbird"),
    ]


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
    model = cls(RNNLMConfig(vocab_size=11, d_model=8, n_layers=2, block_size=t)).eval()
    idx = torch.randint(0, 11, (1, t))
    with torch.no_grad():
        full = model(idx)
        stepped = incremental_logits(model, idx)
    assert full.shape == (1, t, 11)
    torch.testing.assert_close(stepped, full, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("pattern", list(ATTENTION_MODELS))
def test_pattern_models_are_the_transformer_with_their_pattern(pattern):
    settings = CostSettings(width=16, heads=2, attention_window=5, attention_block=4, random_blocks=2)
    model = build_model(ATTENTION_MODELS[pattern], settings, max_len=40)
    full = build_model("transformer", settings, max_len=40)
    # Same shape and positions as the Transformer: only the pattern differs (it has no parameters).
    assert model.config.positions == full.config.positions == "sinusoidal"
    assert [n for n, _ in model.named_parameters()] == [n for n, _ in full.named_parameters()]
    patterns = [block.attn.pattern for block in model.blocks]
    assert {type(p).__name__ for p in patterns} == {"WindowAttention" if pattern == "window" else "BigBirdAttention"}
    if pattern == "window":
        assert patterns[0].window == 5
    else:
        assert (patterns[0].block, patterns[0].global_blocks, patterns[0].random_blocks) == (4, 1, 2)
    # The window: a token changed at position 0 reaches d·(w - 1) = 8 positions ahead, no further.
    idx = torch.randint(0, 64, (1, 40))
    changed = idx.clone()
    changed[0, 0] = (idx[0, 0] + 1) % 64
    with torch.no_grad():
        a, b = model(idx), model(changed)
    assert a.shape == (1, 40, 64)
    if pattern == "window":
        torch.testing.assert_close(a[:, 9:], b[:, 9:])
        assert not torch.equal(a[:, 8], b[:, 8])


def test_attention_rnn_attends_to_the_past_only():
    torch.manual_seed(0)
    model = AttentionRNNLM(RNNLMConfig(vocab_size=11, d_model=8, n_layers=1, block_size=80)).eval()
    idx = torch.randint(0, 11, (1, 80))
    changed = idx.clone()
    changed[0, 70] = (idx[0, 70] + 1) % 11
    with torch.no_grad():
        a, b = model(idx), model(changed)
    torch.testing.assert_close(a[:, :70], b[:, :70])  # the positions before 70 do not see it
    assert not torch.allclose(a[:, 70:], b[:, 70:])


def test_attention_rnn_is_one_sequence_at_a_time():
    model = AttentionRNNLM(RNNLMConfig(vocab_size=11, d_model=8, n_layers=1, block_size=8))
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


def made_up_result(lengths: list[int], settings: CostSettings, missing: tuple = ()) -> CostResult:
    """A CostResult of readings c·t² (time) and t/2 (memory) for `settings.models`, without the case
    (model, kind, t) `missing`, counted and fitted on the larger three lengths."""
    measurements = [
        Measurement(m, k, t, None if (m, k, t) == missing else 0.001 * t**2, 0.5 * t)
        for m in settings.models
        for k in ("train", "generate")
        for t in lengths
    ]
    result = CostResult(
        date="2026-11-22", device="cpu", machine="x", threads=1, torch="2", lengths=lengths, fit_lengths=lengths[-3:],
        width=8, layers=settings.layers, heads=1, vocab=64, batch=1, repeats=1, passes=1, max_memory_mib=1.0,
        timing_method="t", memory_method="m", measurements=measurements, counts=[], table=[],
        models=list(settings.models), attention_window=settings.attention_window,
        attention_block=settings.attention_block,
    )  # fmt: skip
    result.counts = [
        Count(m, t, *count_steps(m, t, settings.layers, settings)) for m in settings.models for t in lengths
    ]
    result.table = fit_table(result)
    return result


def test_a_skipped_length_is_left_out_of_the_fit_and_said_so():
    result = made_up_result([8, 16, 32, 64], CostSettings(layers=1), missing=("rnn", "train", 64))
    rows = {(r.model, r.quantity): r for r in result.table}
    assert rows[("rnn", "train_time")].fit_lengths == [16, 32]
    assert rows[("rnn", "train_time")].fitted_exponent == pytest.approx(2.0)
    assert rows[("transformer", "train_time")].fit_lengths == [16, 32, 64]
    assert rows[("rnn", "train_memory")].fitted_exponent == pytest.approx(1.0)
    text = format_table(result)
    assert "2.00†" in text and "† fitted on the lengths that ran: RNN training step time on t = 16, 32" in text


def test_the_patterns_get_rows_and_tables_of_their_own():
    settings = CostSettings(layers=1, attention=("window", "bigbird"), attention_window=4, attention_block=4)
    result = made_up_result([8, 16, 32, 64], settings)
    rows = {(r.model, r.quantity): r for r in result.table}
    assert set(rows) == {(m, q) for m in settings.models for q in QUANTITIES}
    assert rows[("transformer-window", "train_time")].fitted_exponent == pytest.approx(2.0)
    assert rows[("transformer-window", "train_time")].theory == THEORY[("transformer-window", "train_time")].formula
    # One layer of 4 keys leaves pairs unconnected at every fitted length: an infinite path, no fit.
    assert [c.max_path_length for c in result.counts if c.model == "transformer-window"] == [None] * 4
    assert rows[("transformer-window", "max_path_length")].fitted_exponent is None
    assert rows[("transformer-window", "sequential_steps")].fitted_exponent == pytest.approx(0.0)

    text = format_table(result)
    lines = text.splitlines()
    assert "attention patterns: window w=4; BigBird blocks b=4, 1 global, 1 random" in lines
    path_rows = [line for line in lines if line.startswith("max path length")]
    assert len(path_rows) == 2  # the lectures' three, then full, window and BigBird attention
    # Window and BigBird: "∞ ..." in the theory, no exponent ("-"), and "∞" for the fit.
    assert path_rows[1].count("∞") == 4 and path_rows[1].count(f"{'-':>4} {'∞':>9}") == 2
    assert "Transformer (window) ∞, Transformer (BigBird) ∞" in lines[-1]
    # The lectures' three read as in a run without the patterns.
    plain = format_table(made_up_result([8, 16, 32, 64], CostSettings(layers=1))).splitlines()
    assert set(plain[:-1]) <= set(lines)
