"""attnlab.accel.plan: how a model decodes is decided once, where it is loaded, and carried down.

The defaults are checked against the rules they stand for (`fused.by_default`, `wavenet.by_default`,
which say where a flagless decoding takes a fused step), and the source is scanned: those rules are
asked from `plan_decoding` alone, and each entry point that loads a model decides its plan at one
place, which the decoders below it receive instead of deciding again.
"""

import ast
from collections import Counter
from pathlib import Path

import pytest
import torch

from attnlab.accel import fused, wavenet
from attnlab.accel.plan import CPU_COMPILE_OPTIONS, EAGER, DecodePlan, plan_decoding
from attnlab.models.wavenet import WaveNet, WaveNetConfig
from decode.conftest import tiny_gpt

SRC = Path(__file__).resolve().parents[2] / "src" / "attnlab"

PLANS = {
    "cli/sample.py": 2,  # the target model's, and the draft model's
    "cli/translate.py": 1,
    "serve/worker.py": 1,  # once per worker, for every request
    "tasks/translation.py": 1,  # `translate_ids` without a plan (a task's evaluation)
    "decode/audio.py": 1,  # `generate_audio(fused=...)`, the public call
    "decode/sampling.py": 1,  # `generate_tokens(fused=..., weights=..., compile=...)`, the public call
    "decode/batching.py": 1,  # `Batcher(fused=..., weights=...)`, the public call
    "decode/speculative.py": 1,  # `speculative_generate(fused=..., weights=...)`, the public call
}
"""Every call of `plan_decoding` outside accel/, by file: the entry points that load a model, and
the public decoding functions that take `fused=`/`weights=`/`compile=` and turn them into a plan
once, at their top."""


def calls(name: str) -> Counter:
    """Calls of (or references to) `name` in src/attnlab outside accel/, by file."""
    found: Counter = Counter()
    for path in SRC.rglob("*.py"):
        where = path.relative_to(SRC).as_posix()
        if where.startswith("accel/"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            named = (isinstance(node, ast.Name) and node.id == name) or (
                isinstance(node, ast.Attribute) and node.attr == name
            )
            if named:
                found[where] += 1
    return found


def test_the_default_rules_are_asked_by_the_plan_alone():
    assert calls("by_default") == Counter(), "ask attnlab.accel.plan.plan_decoding, not the rule itself"


def test_each_entry_point_decides_its_plan_once():
    assert calls("plan_decoding") == Counter(PLANS)


@pytest.fixture
def gpt():
    return tiny_gpt().eval()


def test_no_flag_takes_the_fused_step_where_its_rule_says(gpt):
    post_norm = tiny_gpt(norm="post").eval()
    for model in (gpt, post_norm):
        plan = plan_decoding(model)
        assert plan.fused == fused.by_default(model)
        assert (plan.weights, plan.compile) == ("fp32", False)
    assert not plan_decoding(post_norm).fused  # the step does not cover a post-norm GPT


def test_a_wavenet_asks_its_own_steps_rule():
    model = WaveNet(WaveNetConfig(residual_channels=6, dilation_channels=5, skip_channels=7)).eval()
    assert plan_decoding(model).fused == wavenet.by_default(model)
    assert not plan_decoding(model.half()).fused  # the WaveNet step takes float32 and float64


def test_stored_weights_follow_the_fused_step(gpt):
    assert plan_decoding(gpt, weights="int8") == DecodePlan(fused=fused.supports(gpt, []), weights="int8")
    post_norm = tiny_gpt(norm="post").eval()  # not covered: its fp32 weights on PyTorch's path
    assert plan_decoding(post_norm, weights="int8") == EAGER


def test_compiling_is_never_fused_by_default(gpt):
    plan = plan_decoding(gpt, compile=True)
    assert (plan.fused, plan.compile, dict(plan.compile_options)) == (False, True, CPU_COMPILE_OPTIONS)


def test_what_is_asked_is_kept(gpt):
    assert plan_decoding(gpt, fused=False) == EAGER
    assert plan_decoding(gpt, fused=True, weights="bf16") == DecodePlan(fused=True, weights="bf16")


@pytest.mark.parametrize(
    "asked, refusal",
    [(dict(fused=True, compile=True), "pick one"), (dict(fused=False, weights="int8"), "fused step's")],
)
def test_a_plan_that_cannot_run_is_refused(gpt, asked, refusal):
    with pytest.raises(ValueError, match=refusal):
        plan_decoding(gpt, **asked)


def test_a_plan_decodes_as_the_flags_it_stands_for(gpt):
    from attnlab.decode import greedy_picker
    from attnlab.decode.sampling import generate_tokens, greedy

    prompt = torch.tensor([[1, 2, 3]])
    plan = plan_decoding(gpt, fused=True, weights="int8")
    by_plan = torch.stack(list(generate_tokens(gpt, prompt, 12, greedy_picker(), plan=plan)), dim=1)
    assert torch.equal(by_plan, greedy(gpt, prompt, 12, fused=True, weights="int8")[:, 3:])
