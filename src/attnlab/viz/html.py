"""Self-contained HTML: an interactive attention view, and the page that holds it.

Everything a page needs is inside it: CSS and JavaScript inline, the weights as JSON in a
`<script type="application/json">` element, pictures as `data:` URIs. It opens offline, from a
file, and can be mailed around; it never loads anything from the network.

The attention view: a layer and a head picker (`<select>`, one option per layer and per head,
written into the page so the choice exists before any script runs), a heatmap drawn as a table
whose cells are coloured with viridis (the colour map of the PNG pictures), and a tooltip with the
exact weight and the query and key tokens under the pointer. The weights are rounded to 6
decimals (the tooltip's precision), which keeps a 6-layer, 8-head, 60-token page near 1 MB.
"""

import html
import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from attnlab.fileio import atomic_write_text
from attnlab.viz.attention import display_token
from attnlab.viz.figure import check_output_path
from attnlab.viz.maps import AttentionMaps

DECIMALS = 6
# matplotlib's viridis at 0, 1/8, ..., 1: the same colours as the PNG pictures.
VIRIDIS = ["#440154", "#472d7b", "#3b528b", "#2c728e", "#21918c", "#28ae80", "#5ec962", "#addc30", "#fde725"]

PAGE_CSS = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 2em auto; max-width: 70em; padding: 0 1em; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 2em; border-bottom: 1px solid #ddd; }
pre { background: #f6f6f6; padding: .8em; overflow-x: auto; }
table.rows { border-collapse: collapse; } table.rows td, table.rows th { border: 1px solid #ddd; padding: .2em .5em; }
table.rows th { background: #f3f3f3; text-align: left; }
img { max-width: 100%; }
"""

ATTENTION_CSS = """
.attn-controls { margin: .5em 0; } .attn-controls label { margin-right: 1em; }
.attn-grid table { border-collapse: collapse; font: 11px monospace; }
.attn-grid td { width: 14px; height: 14px; padding: 0; border: 1px solid #fff; }
.attn-grid th { font-weight: normal; white-space: pre; padding: 0 3px; }
.attn-grid th.k { vertical-align: bottom; height: 6em; }
.attn-grid th.k span { writing-mode: vertical-rl; transform: rotate(180deg); }
.attn-grid th.q { text-align: right; }
.attn-tip { position: fixed; display: none; pointer-events: none; background: #222; color: #fff;
  font: 12px monospace; padding: 3px 6px; border-radius: 3px; white-space: pre; z-index: 10; }
"""

# One function per view, told its element id: several views can share a page.
ATTENTION_JS = """
(function (id) {
  var root = document.getElementById(id);
  var data = JSON.parse(document.getElementById(id + "-data").textContent);
  var layerPick = root.querySelector(".attn-layer"), headPick = root.querySelector(".attn-head");
  var grid = root.querySelector(".attn-grid"), tip = root.querySelector(".attn-tip");
  var stops = data.colours.map(function (c) {
    return [1, 3, 5].map(function (i) { return parseInt(c.substr(i, 2), 16); });
  });
  function colour(w) {
    var x = Math.max(0, Math.min(1, w)) * (stops.length - 1);
    var i = Math.min(Math.floor(x), stops.length - 2), f = x - i;
    var rgb = stops[i].map(function (a, j) { return Math.round(a + f * (stops[i + 1][j] - a)); });
    return "rgb(" + rgb.join(",") + ")";
  }
  function cell(tag, text, cls) {
    var el = document.createElement(tag);
    if (cls) el.className = cls;
    if (text !== null) {
      var span = document.createElement("span");
      span.textContent = text;
      el.appendChild(span);
    }
    return el;
  }
  function draw() {
    var m = data.layers[+layerPick.value][+headPick.value];
    var table = document.createElement("table"), head = document.createElement("tr");
    head.appendChild(cell("th", null));
    data.key_labels.forEach(function (t) { head.appendChild(cell("th", t, "k")); });
    table.appendChild(head);
    m.forEach(function (row, q) {
      var tr = document.createElement("tr");
      tr.appendChild(cell("th", data.query_labels[q], "q"));
      row.forEach(function (w, k) {
        var td = document.createElement("td");
        td.style.background = colour(w);
        td.dataset.q = q; td.dataset.k = k;
        tr.appendChild(td);
      });
      table.appendChild(tr);
    });
    grid.replaceChildren(table);
  }
  grid.addEventListener("mousemove", function (e) {
    var td = e.target.closest("td");
    if (!td) { tip.style.display = "none"; return; }
    var q = +td.dataset.q, k = +td.dataset.k;
    var w = data.layers[+layerPick.value][+headPick.value][q][k];
    tip.textContent = "query " + q + " " + JSON.stringify(data.query_labels[q]) + "\\nkey   " + k + " " +
      JSON.stringify(data.key_labels[k]) + "\\nweight " + w.toFixed(data.decimals);
    tip.style.left = (e.clientX + 14) + "px"; tip.style.top = (e.clientY + 14) + "px";
    tip.style.display = "block";
  });
  grid.addEventListener("mouseleave", function () { tip.style.display = "none"; });
  layerPick.addEventListener("change", draw);
  headPick.addEventListener("change", draw);
  draw();
})
"""


def attention_data(maps: AttentionMaps) -> dict:
    """What the view embeds: tokens, labels and `layers` `[L][H][Tq][Tk]`, rounded to `DECIMALS`."""
    return {
        "kind": maps.kind,
        "causal": maps.causal,
        "text": maps.text,
        "output": maps.output,
        "query_tokens": list(maps.query_tokens),
        "key_tokens": list(maps.key_tokens),
        "query_labels": [display_token(t) for t in maps.query_tokens],
        "key_labels": [display_token(t) for t in maps.key_tokens],
        "layers": [np.round(w.astype(np.float64), DECIMALS).tolist() for w in maps.weights],
        "decimals": DECIMALS,
        "colours": VIRIDIS,
    }


def attention_view(
    maps: AttentionMaps, element_id: str = "attention", *, layer: int | None = None, head: int | None = None
) -> str:
    """The interactive view of `maps` as an HTML fragment (a `<div>` and its scripts), for any page
    that also carries `ATTENTION_CSS`. `layer` and `head` are the ones shown first (default the last
    layer, head 0); a `UserError` names the valid range when they do not exist."""
    maps.check(layer, head)
    first = maps.n_layers - 1 if layer is None else layer
    layer_options = _options([f"layer {i}" for i in range(maps.n_layers)], first)
    head_options = _options([f"head {h}" for h in range(maps.n_heads)], head or 0)
    caption = f"{maps.kind}: {_quote(maps.text)}" + (f" → {_quote(maps.output)}" if maps.output else "")
    # "<" escaped as \u003c: the JSON stays valid and can never close its <script> element early.
    data = json.dumps(attention_data(maps), ensure_ascii=False, separators=(",", ":")).replace("<", "\\u003c")
    return f"""<div class="attn" id="{element_id}">
<p class="attn-caption">{html.escape(caption)}</p>
<div class="attn-controls">
<label>layer <select class="attn-layer">{layer_options}</select></label>
<label>head <select class="attn-head">{head_options}</select></label>
<span>rows: queries, columns: keys; hover a cell for its weight</span>
</div>
<div class="attn-grid"></div>
<div class="attn-tip"></div>
</div>
<script type="application/json" id="{element_id}-data">{data}</script>
<script>{ATTENTION_JS}("{element_id}");</script>
"""


def html_page(title: str, body: str, *, css: str = "") -> str:
    """A whole self-contained page: `body` (HTML) under an `<h1>` of `title`, styles inline."""
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{html.escape(title)}</title>
<style>{PAGE_CSS}{css}</style>
</head>
<body>
<h1>{html.escape(title)}</h1>
{body}
</body>
</html>
"""


def write_attention_html(
    maps: AttentionMaps, path: str | Path, *, layer: int | None = None, head: int | None = None
) -> Path:
    """Save the interactive view of `maps` as one self-contained HTML page at `path` (.html);
    `layer` and `head` are the ones shown first."""
    path = check_html_path(path)
    page = html_page(f"attnlab: {maps.kind}", attention_view(maps, layer=layer, head=head), css=ATTENTION_CSS)
    atomic_write_text(path, page)
    return path


def check_html_path(path: str | Path) -> Path:
    """`path` as a Path, or a `UserError` when it does not end in .html or its folder is missing."""
    return check_output_path(path, (".html",), "pages are saved as HTML")


def _options(names: Sequence[str], selected: int) -> str:
    return "".join(
        f'<option value="{i}"{" selected" if i == selected else ""}>{html.escape(n)}</option>'
        for i, n in enumerate(names)
    )


def _quote(text: str) -> str:
    return f"“{text}”"
