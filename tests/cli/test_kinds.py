"""A run given to a command that cannot use it: the error says what the run is and which commands
fit it, from the one table of tasks (attnlab.names.TASKS, read by attnlab.cli.kinds) (issue 32:
embed GPT_RUN spoke of --init-from, translate CLASSIFIER_RUN suggested `attnlab sample`)."""

import pytest

from helpers import assert_user_error, cli, shared

TEXT_ARGS = {
    "sample": ["--prompt", "The"],
    "translate": ["Ein Hund."],
    "classify": ["a fine film"],
    "tag": ["a fine film"],
    "embed": ["a fine film"],
}


@pytest.mark.parametrize(
    "run, command, is_, fits",
    [
        ("lm", "embed", "a language-model run, not a BERT encoder", "attnlab sample, attnlab eval, attnlab attention"),
        ("lm", "translate", "a language-model run, not a translation model", "attnlab sample"),
        ("lm", "classify", "a language-model run, not a classification model", "attnlab sample"),
        (
            "sst2-bert",
            "translate",
            "a text-classification run (bert)",
            "attnlab classify, attnlab eval, attnlab embed",
        ),
        ("sst2-bert", "sample", "a text-classification run (bert), not a language model", "attnlab classify"),
        (
            "sst2-bilstm",
            "embed",
            "a text-classification run (bilstm), not a BERT encoder",
            "attnlab classify, attnlab eval",
        ),
        ("mt-transformer", "tag", "a translation run (seq2seq-transformer), not a tagging model", "attnlab translate"),
    ],
)
def test_a_run_of_the_wrong_kind_says_what_it_is_and_what_fits(capsys, tmp_path_factory, run, command, is_, fits):
    run_dir = shared(tmp_path_factory, run)
    capsys.readouterr()  # the training log, when this test trained the run
    result = cli(capsys, command, run_dir, *TEXT_ARGS[command])
    assert_user_error(result, f"{run_dir} is {is_}", f"use it with {fits}")
    advice = result[2].partition("use it with")[2]
    assert "--init-from" not in result[2] and f"attnlab {command}" not in advice


def test_the_bilstm_classifier_is_not_offered_to_embed_or_attention():
    from attnlab.cli.kinds import commands_for
    from attnlab.train import resolve

    bilstm = resolve({"task": "classification", "model": {"kind": "bilstm"}})
    bert = resolve({"task": "classification", "model": {"kind": "bert"}})
    assert commands_for(bilstm) == ["classify", "eval"]
    assert commands_for(bert) == ["classify", "eval", "embed", "attention"]


def test_a_media_run_of_the_wrong_kind_is_named_by_its_task_and_kind():
    from attnlab.cli.kinds import require_kind
    from attnlab.errors import UserError
    from attnlab.train import resolve

    config = resolve({"task": "images", "model": {"kind": "gated_pixelcnn"}})  # the old names
    with pytest.raises(UserError) as e:
        require_kind("runs/x", config, "translate")
    assert str(e.value) == (
        "runs/x is an image-density run (gated-pixelcnn), not a translation model; "
        "use it with attnlab sample, attnlab eval"
    )
