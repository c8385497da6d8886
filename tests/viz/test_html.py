"""The attention page: valid HTML, self-contained, its embedded weights the model's, every layer
and head in its pickers; its script draws the map and shows exact weights (run under Node.js with
a minimal DOM, where Node is installed)."""

import json
import re
import shutil
import subprocess

import numpy as np
import pytest
import torch

import attnlab
from attnlab.errors import UserError
from attnlab.viz.attention import plot_attention
from attnlab.viz.figure import png_size
from attnlab.viz.html import DECIMALS, write_attention_html
from attnlab.viz.maps import AttentionMaps, attention_maps
from helpers import Page, read_page, shared


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    return attnlab.load(shared(tmp_path_factory, "lm"))


def test_page_embeds_the_models_weights_and_pickers_cover_every_layer_and_head(lm, tmp_path):
    text = "ROMEO: Peace!"
    maps = attention_maps(lm, text)
    path = write_attention_html(maps, tmp_path / "attention.html", layer=0, head=1)

    page = read_page(path)
    data = json.loads(page.json_scripts["attention-data"])
    returned = lm.model.attention_weights(torch.tensor([lm.tokenizer.encode(text)]))
    assert len(data["layers"]) == len(returned) == 2
    for layer, r in zip(data["layers"], returned, strict=True):
        np.testing.assert_allclose(np.array(layer), r[0].numpy(), rtol=0, atol=0.5 * 10**-DECIMALS + 1e-9)
    assert data["query_tokens"] == data["key_tokens"] == list(text)
    assert data["causal"] is True
    assert page.selects["attn-layer"] == [("0", "layer 0", True), ("1", "layer 1", False)]
    assert page.selects["attn-head"] == [("0", "head 0", False), ("1", "head 1", True)]


def test_tokens_that_look_like_markup_stay_text(tmp_path):
    tokens = ["</script>", "<b>", "&amp;", '"q"', "Ġhttps://x"]
    weights = np.full((3, 5, 5), 0.2, dtype=np.float32)
    maps = AttentionMaps([weights], tokens, tokens, "self-attention", text="</script><!--")
    text = write_attention_html(maps, tmp_path / "a.html").read_text(encoding="utf-8")
    assert text.count("</script>") == text.count("<script") == 2  # the tokens closed no script early
    page = Page(text)
    assert page.errors == []
    data = json.loads(page.json_scripts["attention-data"])
    assert data["key_tokens"] == tokens and data["key_labels"][-1] == "▁https://x"
    assert data["text"] == "</script><!--"
    assert [v for v, _, _ in page.selects["attn-head"]] == ["0", "1", "2"]


def test_page_path_and_range_errors(lm, tmp_path):
    maps = attention_maps(lm, "ROMEO:")
    with pytest.raises(UserError, match=r"\.html"):
        write_attention_html(maps, tmp_path / "a.txt")
    with pytest.raises(UserError, match="0 to 1"):
        write_attention_html(maps, tmp_path / "a.html", layer=2)
    with pytest.raises(UserError, match="0 to 1"):
        plot_attention(maps, tmp_path / "a.png", head=2)
    assert list(tmp_path.iterdir()) == []


def test_png_grid_and_single_head(lm, tmp_path):
    maps = attention_maps(lm, "ROMEO: Peace!")
    grid = png_size(plot_attention(maps, tmp_path / "grid.png"))
    one = png_size(plot_attention(maps, tmp_path / "one.png", layer=0, head=1))
    assert one[0] > 200 and one[1] > 200
    assert grid[0] > 1.5 * one[0]  # two panels side by side


# A DOM with just what the view's script touches; the script is run as the browser would.
DOM_STUB = r"""
function El(tag) { this.tag = tag; this.children = []; this.style = {}; this.dataset = {}; this.listeners = {};
  this.textContent = ""; this.value = "0"; }
El.prototype.appendChild = function (c) { this.children.push(c); c.parent = this; return c; };
El.prototype.replaceChildren = function (c) { this.children = [c]; };
El.prototype.addEventListener = function (n, f) { this.listeners[n] = f; };
El.prototype.closest = function (t) { for (var e = this; e; e = e.parent) if (e.tag === t) return e; return null; };
var parts = {};
[".attn-layer", ".attn-head", ".attn-grid", ".attn-tip"].forEach(function (s) { parts[s] = new El("x"); });
parts[".attn-layer"].value = "1"; parts[".attn-head"].value = "1";
var root = new El("div"); root.querySelector = function (s) { return parts[s]; };
var dataEl = new El("script"); dataEl.textContent = DATA;
var document = { getElementById: function (id) { return id === ID ? root : dataEl; },
  createElement: function (t) { return new El(t); } };
"""
DOM_CHECK = r"""
var rows = parts[".attn-grid"].children[0].children;
var cell = rows[3].children[2];
parts[".attn-grid"].listeners.mousemove({ target: cell, clientX: 1, clientY: 1 });
console.log(JSON.stringify({ rows: rows.length, cols: rows[1].children.length,
  tip: parts[".attn-tip"].textContent, shown: parts[".attn-tip"].style.display, colour: cell.style.background }));
"""


@pytest.mark.skipif(shutil.which("node") is None, reason="needs Node.js to run the page's script")
def test_script_draws_the_picked_head_and_shows_exact_weights(lm, tmp_path):
    text = "ROMEO: Peace!"
    maps = attention_maps(lm, text)
    page = write_attention_html(maps, tmp_path / "a.html").read_text(encoding="utf-8")
    data = Page(page).json_scripts["attention-data"]
    (script,) = re.findall(r"<script>(.*?)</script>", page, re.S)
    program = DOM_STUB.replace("DATA", json.dumps(data)).replace("ID", '"attention"') + script + DOM_CHECK
    (tmp_path / "run.js").write_text(program, encoding="utf-8")
    out = subprocess.run(["node", str(tmp_path / "run.js")], capture_output=True, text=True, check=True).stdout
    drawn = json.loads(out)
    n = len(text)
    assert drawn["rows"] == n + 1 and drawn["cols"] == n + 1  # a header row and column of tokens
    # Row 3 of the table is query 2; its cell 2 is key 1; layer 1, head 1 were picked.
    weight = maps.weights[1][1, 2, 1]
    assert drawn["tip"].splitlines() == ['query 2 "M"', 'key   1 "O"', f"weight {weight:.6f}"]
    assert drawn["shown"] == "block" and drawn["colour"].startswith("rgb(")
