"""The documentation cannot drift from the code: its examples run, its commands parse, its links
resolve, and the generated command-line reference matches the parsers.

A fenced block in docs/ (or the README) is one of:
- run (no marker): a ```python block is executed; a ```console block's `$ attnlab ...` commands are
  run on a tiny trained run standing in for `runs/shakespeare-char-cpu` and `runs/demo`, and must
  exit as their shown output says (2 for an `attnlab X: error: ...` line, whose text must match,
  0 otherwise); a `--json` output must have the keys shown; other output must match with every
  number masked.
- `<!-- runs: why -->` on the line before the fence: run as above, but the output is not compared
  (it depends on the trained weights, e.g. a sample).
- `<!-- illustrative: why -->`: not run (it needs a data set, a long training, a server); its
  `attnlab` commands must still parse.
"""

import json
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from attnlab.cli import build_parser, main

pytestmark = pytest.mark.slow

ROOT = Path(__file__).parents[1]
DOCS = ROOT / "docs"
RUN_NAMES = ("shakespeare-char-cpu", "demo")  # the run folders the docs' examples name
MARKER = re.compile(r"^<!--\s*(illustrative|runs)\b.*-->\s*$")


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # of the opening fence, 1-based
    lang: str
    text: str
    marker: str | None  # "illustrative", "runs" or None

    def __str__(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def pages() -> list[Path]:
    return sorted(DOCS.rglob("*.md")) + [ROOT / "README.md"]


def blocks(page: Path) -> list[Block]:
    """The fenced blocks of a Markdown page (indented fences included), with their markers."""
    found, lines, i = [], page.read_text(encoding="utf-8").split("\n"), 0
    while i < len(lines):
        opening = re.match(r"^(\s*)```(\w*)\s*$", lines[i])
        if not opening:
            i += 1
            continue
        indent, lang, start = opening[1], opening[2], i
        i += 1
        body = []
        while i < len(lines) and lines[i].strip() != "```":
            body.append(lines[i][len(indent) :])
            i += 1
        previous = lines[start - 1].strip() if start else ""
        marker = MARKER.match(previous)
        found.append(Block(page, start + 1, lang, "\n".join(body), marker[1] if marker else None))
        i += 1
    return found


ALL_BLOCKS = [b for page in pages() for b in blocks(page)]


def shell_commands(block: Block) -> list[tuple[list[str], str]]:
    """Each `attnlab` command of a console or sh block as argv (after `attnlab`), with the output
    shown under it (console blocks only)."""
    lines, out = block.text.split("\n"), []
    if block.lang == "console":
        entries, current = [], None
        for line in lines:
            if line.startswith("$ "):
                current = [line[2:], []]
                entries.append(current)
            elif current is not None:
                current[1].append(line)
        pairs = [(cmd, "\n".join(shown).strip()) for cmd, shown in entries]
    else:  # sh: one command a line, `\` continues it
        joined = re.sub(r"\\\n\s*", " ", block.text)
        pairs = [(line, "") for line in joined.split("\n")]
    for command, shown in pairs:
        command = command.replace("$'\\n\\n'", "'\n\n'")  # bash's $'...' quoting, as bash reads it
        try:
            words = shlex.split(command, comments=True)
        except ValueError as e:
            raise AssertionError(f"{block}: cannot split {command!r}: {e}") from None
        cut = next((k for k, w in enumerate(words) if w in {">", ">>", "<", "|", "&&", ";", "2>&1"}), len(words))
        words = words[:cut]
        while words and re.match(r"^\w+=", words[0]):  # VAR=value before the command
            words = words[1:]
        if words[:2] in (["python", "-m"], ["python3", "-m"]) and words[2:3] == ["attnlab"]:
            words = words[2:]
        if words[:1] == ["attnlab"]:
            out.append((words[1:], shown))
    return out


def test_the_pages_have_examples_of_each_kind():
    kinds = {(b.lang, b.marker) for b in ALL_BLOCKS}
    assert {("python", None), ("console", None), ("console", "runs"), ("sh", "illustrative")} <= kinds


@pytest.mark.parametrize("block", [b for b in ALL_BLOCKS if b.lang in ("console", "sh")], ids=str)
def test_every_attnlab_command_in_the_docs_parses(block, capsys):
    parser = build_parser()
    for argv, _ in shell_commands(block):
        try:
            parser.parse_args(argv)
        except SystemExit as e:
            raise AssertionError(
                f"{block}: `attnlab {shlex.join(argv)}` does not parse: {capsys.readouterr().err}"
            ) from e


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    """A folder whose runs/shakespeare-char-cpu and runs/demo are one tiny trained run (a second of
    training) and whose docs/ takes the pictures the examples write there."""
    root = tmp_path_factory.mktemp("docs-examples")
    run = root / "runs" / RUN_NAMES[0]
    settings = ("train.max_iters=2", "train.eval_iters=1", "model.n_layers=1", "model.d_model=32")
    assert main(["train", "shakespeare-char-cpu", "--out", str(run), "--quiet"] + [f"--set={s}" for s in settings]) == 0
    for name in RUN_NAMES[1:]:
        (root / "runs" / name).symlink_to(run, target_is_directory=True)
    (root / "docs").mkdir()
    return root


def masked(text: str) -> list[str]:
    """Output lines with every number as N and runs of spaces as one, for a comparison of form."""
    return [re.sub(r"\s+", " ", re.sub(r"\d[\d,.]*", "N", line)).strip() for line in text.strip().split("\n")]


def run_command(argv: list[str], capsys) -> tuple[int, str, str]:
    try:
        code = main(argv)
    except SystemExit as e:  # argparse's own errors
        code = e.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize(
    "block", [b for b in ALL_BLOCKS if b.lang == "console" and b.marker != "illustrative"], ids=str
)
def test_the_docs_console_examples_run(block, workdir, capsys, monkeypatch):
    monkeypatch.chdir(workdir)
    commands = shell_commands(block)
    assert commands, f"{block}: a console block to run has no `$ attnlab` command"
    for argv, shown in commands:
        code, out, err = run_command(argv, capsys)
        where = f"{block}: `attnlab {shlex.join(argv)}`"
        if re.match(r"^attnlab [\w-]+: error: ", shown):
            assert code == 2, f"{where} exited {code}, the page shows an error:\n{out}{err}"
            assert err.strip() == shown, f"{where}: the page's error is not the command's:\n{err}"
            continue
        assert code == 0, f"{where} exited {code}:\n{err[-2000:]}"
        if block.marker == "runs" or not shown:
            continue
        if "--json" in argv:
            assert set(json.loads(out)) == set(json.loads(shown)), f"{where}: other keys than the page's:\n{out}"
        else:
            assert masked(out + err) == masked(shown), f"{where}: the output differs from the page's:\n{out}{err}"


def python_pages() -> dict[str, str]:
    """Each docs page's runnable Python blocks, joined in order (the README's: tests/test_readme.py)."""
    code: dict[str, list[str]] = {}
    for b in ALL_BLOCKS:
        if b.lang == "python" and b.marker != "illustrative" and b.page.parent != ROOT:
            code.setdefault(str(b.page.relative_to(ROOT)), []).append(b.text)
    return {page: "\n".join(parts) for page, parts in code.items()}


RUNNER = """
import sys, traceback
pages = {pages!r}
for page, code in pages.items():
    try:
        exec(compile(code, page, "exec"), {{"__name__": "__main__"}})
    except BaseException:
        traceback.print_exc()
        sys.exit(f"FAILED {{page}}")
    print(f"\\nOK {{page}}", flush=True)
"""


def test_the_docs_python_examples_run(workdir):
    """Every page's Python, one page after another in one fresh interpreter, each page in its own
    namespace; an example that talks to `attnlab serve` gets the tiny run served on a free port."""
    from attnlab.serve.app import create_app
    from attnlab.serve.registry import load_runs
    from attnlab.serve.server import BackgroundServer

    code = python_pages()
    assert code, "no runnable Python in docs/"
    runs = load_runs([f"{RUN_NAMES[0]}={workdir / 'runs' / RUN_NAMES[0]}"])
    with BackgroundServer(create_app(runs)) as server:
        code = {page: text.replace("http://127.0.0.1:8000", server.url) for page, text in code.items()}
        done = subprocess.run(
            [sys.executable, "-c", RUNNER.format(pages=code)],
            cwd=workdir,
            capture_output=True,
            text=True,
            timeout=600,
        )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    assert [line[3:] for line in done.stdout.split("\n") if line.startswith("OK ")] == list(code)


def test_the_cli_reference_is_current():
    """docs/reference/cli.md is what scripts/cli_reference.py writes from today's parsers."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "cli_reference.py"), "--check"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr + "run: python scripts/cli_reference.py"


def slug(heading: str) -> str:
    """GitHub's (and MkDocs') anchor of a heading: lower case, punctuation dropped, spaces as '-'."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


@pytest.mark.parametrize("page", ["README.md", "BENCHMARKS.md"])
def test_the_root_pages_links_resolve(page):
    """The site checks the links of docs/ (mkdocs build --strict); these two are read on GitHub."""
    text = (ROOT / page).read_text(encoding="utf-8")
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"^[a-z]+://", target):
            continue
        path, _, anchor = target.partition("#")
        file = ROOT / path if path else ROOT / page
        assert file.exists(), f"{page}: a link to {target}, which does not exist"
        if anchor and file.suffix == ".md":
            headings = re.findall(r"^#+ (.*)$", file.read_text(encoding="utf-8"), flags=re.M)
            assert anchor in {slug(h) for h in headings}, f"{page}: a link to {target}, which has no such heading"


def test_the_readme_stays_short():
    """The README is what a person reads first; the rest lives in docs/ (issue 33: at most 250 lines)."""
    assert len((ROOT / "README.md").read_text(encoding="utf-8").splitlines()) <= 250
