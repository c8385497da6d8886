"""attnlab.progress: the lines long work prints where a redrawn bar would not show."""

from attnlab.progress import ProgressLines


def test_progress_lines_say_how_far_and_are_silent_for_quick_work():
    lines = []
    due = ProgressLines("validation", 30, "sentences translated", every=0.0, write=lines.append)
    for _ in range(3):
        due.update(10)
    # The last update finishes the work: the caller's result says the rest.
    assert [line.split(" (")[0] for line in lines] == [
        "validation: 10/30 sentences translated",
        "validation: 20/30 sentences translated",
    ]
    quiet = []
    ProgressLines("validation", 30, "sentences", every=3600.0, write=quiet.append).update(20)
    assert quiet == []


def test_a_resumed_count_starts_where_it_was():
    lines = []
    ProgressLines("training", 100, "steps", every=0.0, write=lines.append, done=40).update(1)
    assert lines[0].startswith("training: 41/100 steps (")
