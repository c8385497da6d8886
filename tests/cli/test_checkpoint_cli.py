"""--checkpoint (best, last or a step) wherever a command takes it, and `attnlab eval` on a study
folder of runs (what `attnlab ablate` and `attnlab scale` write) rather than on a run."""

import argparse

import pytest

from attnlab.cli import build_parser
from attnlab.cli.arguments import checkpoint_choice
from helpers import assert_user_error, cli


def commands_with_checkpoint(parser: argparse.ArgumentParser, prefix: str = "") -> dict[str, argparse.Action]:
    """{"attnlab eval": its --checkpoint action, ...}, through every level of subcommands."""
    found = {}
    for action in parser._actions:
        if "--checkpoint" in action.option_strings:
            found[prefix] = action
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found |= commands_with_checkpoint(sub, f"{prefix} {name}".strip())
    return found


def test_every_checkpoint_option_takes_a_step():
    found = commands_with_checkpoint(build_parser())
    assert {"eval", "translate", "export", "report", "attention", "serve", "classify", "tag"} <= set(found)
    for command, action in found.items():
        assert action.type is checkpoint_choice and action.default == "best", command
    assert [checkpoint_choice(t) for t in ("best", "last", "1500", "0")] == ["best", "last", 1500, 0]
    for bad in ("-1", "1.5", "latest", "١٢"):  # the last: Arabic-Indic digits, which int() would take
        with pytest.raises(argparse.ArgumentTypeError, match="expected best, last or a step number"):
            checkpoint_choice(bad)


@pytest.mark.parametrize(
    ("layout", "n_runs"),
    [
        (["swiglu/seed0", "swiglu/seed1", "vanilla/seed0", "vanilla/seed1"], 4),  # attnlab ablate
        (["1x32", "2x64"], 2),  # attnlab scale
    ],
)
def test_eval_on_a_study_folder_points_to_its_runs(tmp_path, capsys, layout, n_runs):
    study = tmp_path / "study"
    for run in layout:
        (study / run).mkdir(parents=True)
        (study / run / "config.toml").write_text('task = "lm"\n')
    (study / "ablation.csv").write_text("variant\n")
    result = cli(capsys, "eval", study)
    first = study / layout[0]
    assert_user_error(result, f"{study} is not a run folder but holds {n_runs} runs ({first}, ", "pass one of them")
    assert (", ...)" in result[2]) == (n_runs > 3)  # a few named, not all


def test_eval_on_an_empty_folder_says_it_is_no_run(tmp_path, capsys):
    assert_user_error(
        cli(capsys, "eval", tmp_path),
        f"{tmp_path} is not a checkpoint: a folder with neither config.toml (an attnlab run) nor config.json",
    )
