"""MkDocs hooks: the site's Benchmarks page is the repository's BENCHMARKS.md, included at build time
so that there is one copy. Its links are written for GitHub, where the pictures and pages live
under docs/; on the site they sit beside the page, so the `docs/` prefix is dropped."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
INCLUDES = {"benchmarks.md": ROOT / "BENCHMARKS.md"}


def site_markdown(text: str) -> str:
    """A root-level Markdown file's text as a page of the site: `](docs/x)` -> `](x)`."""
    return re.sub(r"\]\(docs/", "](", text)


def on_page_markdown(markdown, page, config, files):  # noqa: ARG001 (MkDocs' hook signature)
    source = INCLUDES.get(page.file.src_uri)
    return site_markdown(source.read_text(encoding="utf-8")) if source else markdown
