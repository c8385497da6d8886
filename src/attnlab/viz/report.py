"""One self-contained HTML page about a trained run: what `attnlab report` writes.

Sections: the run (task, model, step, parameters), its configuration (the resolved config.toml),
the training curves (`draw_run`, inlined as a PNG `data:` URI), what the model does (a language
model's sample from a fixed seed; a translation model's translations of a few validation sentences
beside their references; a classifier's or tagger's validation accuracy and a few predictions; a
masked LM's validation metrics), and the attention view (`attention_view`) for one text.

A section that cannot be made (the run's data folder is gone, the model has no attention) says why
in the page instead of failing the whole report.
"""

import html
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from attnlab.checkpoints import CONFIG
from attnlab.errors import UserError
from attnlab.fileio import atomic_write_text
from attnlab.viz.html import ATTENTION_CSS, attention_view, check_html_path, html_page

SAMPLE_TOKENS = 300
SEED = 1337
FALLBACK_TEXT = "the quick brown fox jumps over the lazy dog ."  # masked LM: no sentence of its own to show


@dataclass
class Report:
    """What `write_report` put in the page: section titles in order, the examples shown as
    (input, output, reference) rows ("" where there is none), the text of the attention view
    (None when the section could not be made) and the notes that replaced missing sections."""

    path: Path
    sections: list[str] = field(default_factory=list)
    examples: list[tuple[str, str, str]] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)
    attention_text: str | None = None
    notes: list[str] = field(default_factory=list)


def write_report(
    run_dir: str | Path,
    path: str | Path,
    *,
    text: str | None = None,
    n_examples: int = 4,
    device: str | torch.device = "cpu",
    checkpoint: str = "best",
) -> Report:
    """Write the report page of the run in `run_dir` to `path` (.html) and return what it holds.

    text: the text of the attention view; default the first example shown (a validation sentence,
    or the start of the language model's sample). n_examples: sentences translated, classified or
    tagged. Raises `UserError` for a bad path or a run that cannot be loaded.
    """
    from attnlab.train.load import load_run

    path = check_html_path(path)
    run = load_run(run_dir, device=device, checkpoint=checkpoint)
    page = _Page(Report(path))
    _run_sections(page, run, checkpoint)
    title, make = EXAMPLES[run.config.task]
    try:
        body = make(run, next(run.model.parameters()).device, n_examples, page.report)
    except UserError as e:
        body = page.note(str(e))
    page.section(title, body)
    _attention_section(page, run, text)
    html_text = html_page(f"attnlab report: {run.path.name}", "\n".join(page.parts), css=ATTENTION_CSS + REPORT_CSS)
    atomic_write_text(path, html_text)
    return page.report


@dataclass
class _Page:
    """The report's HTML sections as they are written, and the `Report` that lists them."""

    report: Report
    parts: list[str] = field(default_factory=list)

    def section(self, title: str, body: str) -> None:
        self.report.sections.append(title)
        self.parts.append(f"<h2>{html.escape(title)}</h2>\n{body}")

    def note(self, message: str) -> str:
        """A section's body when it cannot be made: why, in the page and in `Report.notes`."""
        self.report.notes.append(message)
        return f'<p class="note">Not shown: {html.escape(message)}</p>'


def _run_sections(page: _Page, run, checkpoint: str) -> None:
    """The run's facts, its configuration and its training curves."""
    from attnlab.viz.curves import draw_run
    from attnlab.viz.figure import png_bytes, png_data_uri

    n_params = sum(p.numel() for p in run.model.parameters())
    page.section(
        "Run",
        _table(
            [
                ("folder", str(run.path)),
                ("task", run.config.task),
                ("model", type(run.model).__name__),
                ("parameters", f"{n_params:,}"),
                ("step", str(run.step)),
                ("weights", checkpoint),
            ]
        ),
    )
    config_text = (run.path / CONFIG).read_text(encoding="utf-8")
    page.section("Configuration", f"<pre>{html.escape(config_text)}</pre>")
    try:
        curves = draw_run(run.path)
        page.section("Training curves", f'<img alt="training curves" src="{png_data_uri(png_bytes(curves.figure))}">')
    except UserError as e:
        page.section("Training curves", page.note(str(e)))


def _attention_section(page: _Page, run, text: str | None) -> None:
    """The attention view of `text`, else of the first example shown, else of `FALLBACK_TEXT`."""
    report = page.report
    wanted = text if text is not None else (report.examples[0][0] if report.examples else FALLBACK_TEXT)
    try:
        from attnlab.viz.maps import attention_maps

        maps = attention_maps(run, wanted)
        report.attention_text = wanted
        page.section("Attention", attention_view(maps))
    except UserError as e:
        page.section("Attention", page.note(str(e)))


REPORT_CSS = ".note { color: #a33; }\n"


def _table(rows: list[tuple[str, str]]) -> str:
    """Name/value rows, the name as the row's header."""
    body = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in rows)
    return f'<table class="rows">{body}</table>'


def _cells(values: tuple[str, ...]) -> str:
    return "".join(f"<td>{html.escape(v)}</td>" for v in values)


def _rows_table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    head = "<tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in header) + "</tr>"
    return f'<table class="rows">{head}{"".join(f"<tr>{_cells(r)}</tr>" for r in rows)}</table>'


def _metrics_table(metrics: dict[str, object], report: Report) -> str:
    report.metrics.update({k: float(v) for k, v in metrics.items() if isinstance(v, int | float)})
    shown = [(k, f"{v:.4f}" if isinstance(v, float) else str(v)) for k, v in metrics.items()]
    return _table(shown)


# -- what the model does, per task ----------------------------------------------------------------
def _lm_sample(run, device: torch.device, n_examples: int, report: Report) -> str:
    from attnlab.decode import encode_prompt, sampling_picker, stream_text

    generator = torch.Generator(device=device).manual_seed(SEED)
    pick = sampling_picker(0.8, None, None, generator)
    prompt = encode_prompt(run.tokenizer, "", device)
    sample = "".join(stream_text(run.model, run.tokenizer, prompt, SAMPLE_TOKENS, pick))
    # The attention view gets the sample's first line, cut to what the model can take at once.
    first = next((line for line in sample.splitlines() if line.strip()), sample)
    cut = run.tokenizer.decode(run.tokenizer.encode(first)[: min(48, run.model.config.block_size)])
    report.examples.append((cut, sample, ""))
    return (
        f"<p>{SAMPLE_TOKENS} tokens from an empty prompt, temperature 0.8, seed {SEED} "
        f"(<code>attnlab sample RUN --max-new-tokens {SAMPLE_TOKENS} --seed {SEED}</code>):</p>"
        f"<pre>{html.escape(sample)}</pre>"
    )


def _translations(run, device: torch.device, n_examples: int, report: Report) -> str:
    from attnlab.tasks import Translation

    task = Translation(run.config.data, run.config.model, run.path, resume=True, splits=("val",))
    pairs = task.corpora["val"].pairs[:n_examples]
    outputs = task.translate_ids(run.model, task.encoded["val"].src[:n_examples], device, beam=5)
    report.examples += [(src, out, ref) for (src, ref), out in zip(pairs, outputs, strict=True)]
    rows = [(src, ref, out) for src, out, ref in report.examples]
    return f"<p>The first {len(rows)} validation sentences, beam 5:</p>" + _rows_table(
        ("source", "reference", "model"), rows
    )


def _task_for(run, split: str):
    from attnlab.tasks import TASKS

    return TASKS[run.config.task](run.config.data, run.config.model, run.path, resume=True, splits=(split,))


def _classifications(run, device: torch.device, n_examples: int, report: Report) -> str:
    task = _task_for(run, "val")
    metrics = task.evaluate(run.model, device, split="val")
    texts, labels = (x[:n_examples] for x in task.data["val"])
    found = task.classify(run.model, texts, device)
    rows = []
    for t, r, y in zip(texts, found, labels, strict=True):
        report.examples.append((t, r["label"], y))
        rows.append((t, y, f"{r['label']} ({r['probabilities'][r['label']]:.3f})"))
    return (
        "<p>Validation split:</p>"
        + _metrics_table(metrics, report)
        + _rows_table(("sentence", "label", "model (probability)"), rows)
    )


def _taggings(run, device: torch.device, n_examples: int, report: Report) -> str:
    task = _task_for(run, "val")
    metrics = task.evaluate(run.model, device, split="val")
    sentences = task.sentences["val"][:n_examples]
    texts = [" ".join(s.words) for s in sentences]
    tagged = task.tag(run.model, texts, device)
    rows = []
    for text, sentence, pairs in zip(texts, sentences, tagged, strict=True):
        output = " ".join(f"{w}/{t}" for w, t in pairs)
        reference = " ".join(f"{w}/{t}" for w, t in zip(sentence.words, sentence.tags, strict=True))
        report.examples.append((text, output, reference))
        rows.append((reference, output))
    return (
        "<p>Validation split, one tag per word:</p>"
        + _metrics_table(metrics, report)
        + _rows_table(("reference", "model"), rows)
    )


def _mlm_metrics(run, device: torch.device, n_examples: int, report: Report) -> str:
    metrics = _task_for(run, "val").evaluate(run.model, device, split="val")
    return "<p>Validation split:</p>" + _metrics_table(metrics, report)


EXAMPLES: dict[str, tuple[str, Callable[..., str]]] = {
    "language-model": ("Sample", _lm_sample),
    "translation": ("Translations", _translations),
    "text-classification": ("Predictions", _classifications),
    "token-classification": ("Predictions", _taggings),
    "masked-lm": ("Metrics", _mlm_metrics),
}
