"""An instruction mix from the lectures' data sets, in OpenAI's fine-tuning JSONL: one model taught
to translate, judge sentiment, tag parts of speech, continue a speech and do arithmetic with a tool.

`write_mix(root, out)` reads the data sets under `root` (as `attnlab data download` lays them out:
multi30k/, sst2/, ud-english-ewt/, tinyshakespeare/) and writes

    out/train.jsonl, out/val.jsonl      the tasks' conversations, shuffled together
    out/test/TASK.jsonl                 each task's test conversations, the reference the last reply
    out/pretrain.txt                    the training split's texts, for pretraining the model first
    out/mix.json                        the options and the counts

The tasks (user's message -> assistant's; train / val / test):
- translation: "Translate to English: <German>" -> the English; Multi30k train / val / test2016.
- sentiment: "Is the sentiment of this review positive or negative? <text>" -> "positive" or
  "negative"; SST-2 train / a seeded slice held out of train / dev (GLUE's test has no public labels).
- tagging: "Tag the parts of speech: <words>" -> "word/UPOS word/UPOS ..." (`format_tags`, read
  back by `parse_tags`); UD English EWT train / dev / test.
- continuation: "Continue this speech:\n<speaker and two lines>" -> the next two lines; Tiny
  Shakespeare's first 90% / next 5% / last 5% of the text, by where a speech starts.
- arithmetic: a word problem -> a calculator call, its result, the number; `arithmetic-direct`:
  the number at once (`attnlab.data.arithmetic`); generated, test problems first.

The splits are kept apart: an example of train or val whose input or reply is also a test (or,
for train, a val) example's is dropped, so no test sentence is trained on (nor pretrained on:
pretrain.txt holds the training examples' texts only). Everything is drawn from one seed.

A training or validation conversation whose text is longer than `max_chars` characters is left
out and counted: the tokenizer is not known yet (pretraining trains it on pretrain.txt), so the fit
is judged by characters; `task = "chat"` then skips, with a count, any conversation still past the
model's context in tokens (`data.too_long`). Test files keep every example: one that does not fit
the context is scored as wrong.
"""

import json
import random
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from attnlab.data import arithmetic
from attnlab.errors import UserError
from attnlab.fileio import atomic_write_text

TASKS = ("translation", "sentiment", "tagging", "continuation", "arithmetic")
FOLDERS = {
    "translation": "multi30k",
    "sentiment": "sst2",
    "tagging": "ud-english-ewt",
    "continuation": "tinyshakespeare",
}
"""Each data set's folder under the root, named as `attnlab data download` names it."""
PROMPTS = {
    "translation": "Translate to English: ",
    "sentiment": "Is the sentiment of this review positive or negative? ",
    "tagging": "Tag the parts of speech: ",
    "continuation": "Continue this speech:\n",
}
SENTIMENTS = {"0": "negative", "1": "positive"}  # SST-2's labels
UPOS = frozenset(
    "ADJ ADP ADV AUX CCONJ DET INTJ NOUN NUM PART PRON PROPN PUNCT SCONJ SYM VERB X".split()
)  # the 17 universal part-of-speech tags (de Marneffe et al. 2021)
SPEECH_PROMPT_LINES, SPEECH_REPLY_LINES = 2, 2
FREE_REPLIES = ("translation", "continuation")  # tasks whose reply is a text of its own, not a label
SST2_VAL_SHARE = 0.02  # of SST-2's training rows, held out as the validation pool

Example = tuple[str, str]
"""(input, reply): the text the prompt is about (a German sentence, a review, ...) and the answer."""


@dataclass(frozen=True)
class MixOptions:
    """How many examples of each task, and how the mix is drawn."""

    translation: int = 6000
    """Multi30k pairs in training, drawn from its train split."""
    sentiment: int = 3000
    """SST-2 reviews and phrases in training."""
    tagging: int = 3000
    """EWT sentences in training."""
    continuation: int = 1500
    """Tiny Shakespeare passages in training."""
    arithmetic: int = 1500
    """Arithmetic problems in training, each written twice: with the calculator and answered directly."""
    val: int = 50
    """Validation conversations per task (arithmetic: problems, each in both forms)."""
    arithmetic_test: int = 500
    """Test problems (the data sets' tests are used whole)."""
    max_chars: int = 600
    """The longest training or validation conversation, in characters of its messages' text."""
    seed: int = 1337
    """The seed of every draw: the same seed and data sets, the same files."""

    def __post_init__(self) -> None:
        for name in (*TASKS, "val", "arithmetic_test"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.max_chars < 1:
            raise ValueError(f"max_chars must be >= 1, got {self.max_chars}")


@dataclass
class TaskCounts:
    """What one task contributed: conversations per split, and the examples left out, and why."""

    train: int = 0
    val: int = 0
    test: int = 0
    too_long: int = 0
    """Training and validation examples over max_chars."""
    overlap: int = 0
    """Training and validation examples whose input or reply is a held-out (val or test) example's."""


@dataclass
class Mix:
    """The conversations of each split, the pretraining texts and the counts, before writing."""

    train: list[dict[str, Any]] = field(default_factory=list)
    val: list[dict[str, Any]] = field(default_factory=list)
    test: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    pretrain: list[str] = field(default_factory=list)
    counts: dict[str, TaskCounts] = field(default_factory=dict)


# ------------------------------------------------------------------ the tagging replies


def format_tags(words: list[str], tags: list[str]) -> str:
    """The tagging reply: each word and its tag joined by "/", the pairs by spaces.
    Example: (["I", "run", "."], ["PRON", "VERB", "PUNCT"]) -> "I/PRON run/VERB ./PUNCT"."""
    if len(words) != len(tags):
        raise ValueError(f"{len(words)} words but {len(tags)} tags")
    return " ".join(f"{w}/{t}" for w, t in zip(words, tags, strict=True))


def parse_tags(reply: str) -> list[tuple[str, str]] | None:
    """The (word, tag) pairs of a tagging reply, or None where it does not parse: an item without
    "/" or without a word, or a tag that is not one of the 17 UPOS tags. A word may hold "/" itself
    (the tag is after the last one). Example: "and/or/CCONJ ./PUNCT" -> [("and/or", "CCONJ"), (".", "PUNCT")]."""
    items = reply.split()
    if not items:
        return None
    pairs = []
    for item in items:
        word, sep, tag = item.rpartition("/")
        if not sep or not word or tag not in UPOS:
            return None
        pairs.append((word, tag))
    return pairs


# ------------------------------------------------------------------ reading the data sets


def data_folder(root: Path, task: str) -> Path:
    """The folder of `task`'s data set under `root`; a `UserError` naming it and how to get it."""
    name = FOLDERS[task]
    folder = root / name
    if not folder.is_dir():
        raise UserError(
            f"{root} has no {name}/ folder, the {task} task's data; get it with "
            f"`attnlab data download {name} --to {folder}` (or point --data-dir at a folder that has it)"
        )
    return folder


def read_translation(root: Path, rng: random.Random) -> dict[str, list[Example]]:
    """Multi30k German -> English: train, val, and test2016 as the test."""
    from attnlab.data.parallel import load_multi30k

    folder = data_folder(root, "translation")
    return {
        split: load_multi30k(folder, name).pairs
        for split, name in (("train", "train"), ("val", "val"), ("test", "test2016"))
    }


def read_sentiment(root: Path, rng: random.Random) -> dict[str, list[Example]]:
    """SST-2: a seeded share of train held out for val; dev is the test (GLUE's test has no labels)."""
    from attnlab.data.tsv import read_labelled_tsv

    folder = data_folder(root, "sentiment")
    splits = {}
    for split, name in (("train", "train.tsv"), ("test", "dev.tsv")):
        rows = read_labelled_tsv(folder / name)
        for label, line in zip(rows.labels, rows.line_numbers, strict=True):
            if label not in SENTIMENTS:
                raise UserError(f"{rows.path}:{line}: label {label!r} is not SST-2's 0 (negative) or 1 (positive)")
        splits[split] = [(s, SENTIMENTS[label]) for s, label in zip(rows.sentences, rows.labels, strict=True)]
    train = splits["train"]
    held = set(rng.sample(range(len(train)), max(1, round(len(train) * SST2_VAL_SHARE))))
    splits["val"] = [e for i, e in enumerate(train) if i in held]
    splits["train"] = [e for i, e in enumerate(train) if i not in held]
    return splits


def _conllu(folder: Path, split: str) -> Path:
    for name in (f"en_ewt-ud-{split}.conllu", f"en_ewt-ud-{split}.conllu.gz"):
        if (folder / name).is_file():
            return folder / name
    raise UserError(
        f"{folder} lacks en_ewt-ud-{split}.conllu (or .conllu.gz); get it with `attnlab data download ud-english-ewt`"
    )


def read_tagging(root: Path, rng: random.Random) -> dict[str, list[Example]]:
    """UD English EWT, UPOS: train, dev as val, test; the input is the words joined by spaces."""
    from attnlab.data.conllu import read_conllu

    folder = data_folder(root, "tagging")
    splits = {}
    for split, name in (("train", "train"), ("val", "dev"), ("test", "test")):
        sentences = read_conllu(_conllu(folder, name), column="upos")
        splits[split] = [
            (" ".join(s.words), format_tags(s.words, s.tags))
            for s in sentences
            if not any(c.isspace() for w in s.words for c in w)  # a word with a space would split in two
        ]
    return splits


def shakespeare_text(root: Path) -> str:
    """root/tinyshakespeare/input.txt, or the copy attnlab ships (the same file) where there is none."""
    from attnlab.data.text import bundled_shakespeare, read_corpus

    path = root / FOLDERS["continuation"] / "input.txt"
    return read_corpus(str(path)) if path.is_file() else bundled_shakespeare()


def read_continuation(root: Path, rng: random.Random) -> dict[str, list[Example]]:
    """Tiny Shakespeare's speeches, each cut into passages of a speaker, two lines and the two
    lines that follow; a speech belongs to train, val or test by where it starts in the text (the
    first 90%, the next 5%, the last 5%), so no passage straddles two splits."""
    text = shakespeare_text(root)
    splits: dict[str, list[Example]] = {"train": [], "val": [], "test": []}
    offset, size = 0, SPEECH_PROMPT_LINES + SPEECH_REPLY_LINES
    for speech in text.split("\n\n"):
        where = offset / len(text)
        offset += len(speech) + 2
        speaker, *lines = speech.strip("\n").split("\n")
        split = "train" if where < 0.9 else "val" if where < 0.95 else "test"
        for i in range(0, len(lines) - size + 1, size):
            prompt = "\n".join([speaker, *lines[i : i + SPEECH_PROMPT_LINES]])
            splits[split].append((prompt, "\n".join(lines[i + SPEECH_PROMPT_LINES : i + size])))
    return splits


READERS: dict[str, Callable[[Path, random.Random], dict[str, list[Example]]]] = {
    "translation": read_translation,
    "sentiment": read_sentiment,
    "tagging": read_tagging,
    "continuation": read_continuation,
}


# ------------------------------------------------------------------ the mix


def conversation(task: str, example: Example) -> dict[str, Any]:
    """One JSONL line's object: the task's prompt about the input, and the reply."""
    return {
        "messages": [
            {"role": "user", "content": PROMPTS[task] + example[0]},
            {"role": "assistant", "content": example[1]},
        ]
    }


def chars(line: dict[str, Any]) -> int:
    """The characters of a conversation's messages: their text and their tool calls' arguments."""
    total = 0
    for m in line["messages"]:
        total += len(m.get("content") or "")
        total += sum(len(c["function"]["name"]) + len(c["function"]["arguments"]) for c in m.get("tool_calls") or [])
    return total


def _apart(task: str, examples: list[Example], held: set[str], counts: TaskCounts) -> list[Example]:
    """The examples none of whose texts (`_texts`) is in `held`; the rest counted as overlap."""
    kept = [e for e in examples if held.isdisjoint(_texts(task, [e]))]
    counts.overlap += len(examples) - len(kept)
    return kept


def _fitting(task: str, examples: list[Example], max_chars: int, counts: TaskCounts) -> list[Example]:
    kept = [e for e in examples if chars(conversation(task, e)) <= max_chars]
    counts.too_long += len(examples) - len(kept)
    return kept


def _texts(task: str, examples: list[Example]) -> set[str]:
    """The texts a held-out example must not share with a training one: its input, and its reply
    where that is a text of the data set (a translation, a passage) rather than a label or tags
    that follow from the input."""
    return {text for e in examples for text in (e if task in FREE_REPLIES else e[:1])}


def select(
    task: str, splits: dict[str, list[Example]], n: int, options: MixOptions, rng: random.Random, mix: Mix
) -> None:
    """Add one data set's task to `mix`: every test example; up to `options.val` validation and `n`
    training examples drawn from those apart from the test (and, for training, the validation)
    examples and within max_chars; their texts (all of the training pool's) to pretrain on."""
    counts = mix.counts.setdefault(task, TaskCounts())
    test = splits["test"]
    val_pool = _apart(task, splits["val"], _texts(task, test), counts)
    train_pool = _apart(task, splits["train"], _texts(task, test) | _texts(task, val_pool), counts)
    val_fit = _fitting(task, val_pool, options.max_chars, counts)
    train_fit = _fitting(task, train_pool, options.max_chars, counts)
    val = rng.sample(val_fit, min(options.val, len(val_fit)))
    train = rng.sample(train_fit, min(n, len(train_fit)))
    mix.test[task] = [conversation(task, e) for e in test]
    mix.val += [conversation(task, e) for e in val]
    mix.train += [conversation(task, e) for e in train]
    mix.pretrain += ["\n".join(e) if task in FREE_REPLIES else e[0] for e in train_pool]
    counts.train, counts.val, counts.test = len(train), len(val), len(test)


def add_arithmetic(options: MixOptions, rng: random.Random, mix: Mix) -> None:
    """The word problems: test first, then val and train, each computation in one split only;
    every problem written in the tool form and the direct form (test: two files)."""
    counts = mix.counts.setdefault("arithmetic", TaskCounts())
    test = arithmetic.problems(options.arithmetic_test, rng)
    val = arithmetic.problems(options.val, rng, exclude=[p.key for p in test])
    train = arithmetic.problems(options.arithmetic, rng, exclude=[p.key for p in test + val])
    mix.test["arithmetic"] = [arithmetic.with_tool(p) for p in test]
    mix.test["arithmetic-direct"] = [arithmetic.direct(p) for p in test]
    for split, problems in (("val", val), ("train", train)):
        lines = [form(p) for p in problems for form in (arithmetic.with_tool, arithmetic.direct)]
        fit = [line for line in lines if chars(line) <= options.max_chars]
        counts.too_long += len(lines) - len(fit)
        getattr(mix, split).extend(fit)
        setattr(counts, split, len(fit))
    counts.test = len(test)


def build_mix(root: str | Path, options: MixOptions = MixOptions()) -> Mix:
    """The mix of every task from the data sets under `root`, drawn from `options.seed`."""
    root = Path(root).expanduser()
    if not root.is_dir():
        raise UserError(f"--data-dir {root} is not a folder; give the folder holding {', '.join(FOLDERS.values())}")
    for task in ("translation", "sentiment", "tagging"):  # all missing folders are found before any is read
        data_folder(root, task)
    rng = random.Random(options.seed)
    mix = Mix()
    for task, read in READERS.items():
        select(task, read(root, rng), getattr(options, task), options, rng, mix)
    add_arithmetic(options, rng, mix)
    rng.shuffle(mix.train)
    rng.shuffle(mix.val)
    rng.shuffle(mix.pretrain)
    return mix


def _jsonl(lines: list[dict[str, Any]]) -> str:
    return "".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines)


def write_mix(root: str | Path, out: str | Path, options: MixOptions = MixOptions()) -> Mix:
    """`build_mix`, written to `out` (see the module's docstring for the files)."""
    mix = build_mix(root, options)
    out = Path(out).expanduser()
    (out / "test").mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "train.jsonl", _jsonl(mix.train))
    atomic_write_text(out / "val.jsonl", _jsonl(mix.val))
    for task, lines in mix.test.items():
        atomic_write_text(out / "test" / f"{task}.jsonl", _jsonl(lines))
    atomic_write_text(out / "pretrain.txt", "\n\n".join(mix.pretrain) + "\n")
    manifest = {"options": asdict(options), "counts": {task: asdict(c) for task, c in mix.counts.items()}}
    atomic_write_text(out / "mix.json", json.dumps(manifest, indent=1) + "\n")
    return mix
