// attnlab serve: the page. It speaks only the server's own HTTP API (/v1/...), as any client would:
// completions stream in as server-sent events read from fetch's ReadableStream; Stop aborts the
// fetch, and the server cancels the generation when the connection goes. A model with a chat
// template also gets a chat: the conversation is kept here and sent whole with each message.
"use strict";

(function () {
  const $ = (id) => document.getElementById(id);
  const KEY = "attnlab-api-key", MODEL = "attnlab-model";
  const API = window.attnlabApi, CHAT = API.chat;  // the server's paths (/static/api.js)
  const state = {
    models: [], key: localStorage.getItem(KEY) || "", controller: null, views: 0, mode: "chat", conversation: [],
    pending: [], results: [],  // the last reply's tool calls, and the results typed for them so far
  };

  // -- talking to the server -----------------------------------------------------------------
  async function api(path, body, signal) {
    const headers = { "Content-Type": "application/json" };
    if (state.key) headers.Authorization = "Bearer " + state.key;
    const response = await fetch(path, {
      method: body === undefined ? "GET" : "POST",
      headers: headers,
      body: body === undefined ? undefined : JSON.stringify(body),
      signal: signal,
    });
    if (response.status === 401) {
      $("key-panel").hidden = false;
      $("api-key").focus();
    }
    if (!response.ok) {
      let message = response.status + " " + response.statusText;
      try { message = (await response.json()).error.message; } catch (e) { /* not JSON */ }
      throw new Error(message);
    }
    return response;
  }

  function showError(message) {
    $("error").textContent = message;
    $("error").hidden = !message;
  }

  // -- models ----------------------------------------------------------------------------------
  async function loadModels() {
    const response = await api(API.models);
    state.models = (await response.json()).data;
    const picker = $("model");
    picker.replaceChildren(...state.models.map((m) => new Option(m.id + "  ·  " + m.task, m.id)));
    const saved = localStorage.getItem(MODEL);
    if (state.models.some((m) => m.id === saved)) picker.value = saved;
    selectModel();
  }

  function current() {
    return state.models.find((m) => m.id === $("model").value);
  }

  function has(model, endpoint) {
    return model.endpoints.includes(endpoint);
  }

  function selectModel() {
    const model = current();
    if (!model) return;
    if (state.controller) state.controller.abort();
    localStorage.setItem(MODEL, model.id);
    showError("");
    // The model's own context (a language model reads a longer prompt's last `context` tokens).
    $("model-info").textContent = model.task + (model.context ? " · context " + model.context + " tokens" : "");
    $("mode").hidden = !(has(model, CHAT) && has(model, API.completions));
    clearChat();
    showMode();
    $("mt-view").hidden = !has(model, API.translations);
    // An encoder's text box; a model that only shows its attention (a masked LM) gets the box alone.
    const tags = has(model, API.tags), classify = has(model, API.classifications);
    const attentionOnly = !tags && !classify && has(model, API.attention) && !has(model, API.completions) && !has(model, API.translations);
    $("enc-view").hidden = !(tags || classify || attentionOnly);
    $("enc-title").textContent = tags ? "Tag each word" : classify ? "Classify" : "A text to look at";
    $("enc-run").textContent = tags ? "Tag" : "Classify";
    $("enc-run").hidden = attentionOnly;
    $("enc-result").hidden = true;
    $("mt-result").hidden = true;
    $("attn-section").hidden = !has(model, API.attention);
    $("attention-box").replaceChildren();
    $("attn-status").textContent = "";
  }

  // A language model with a chat template: Chat or Complete a text (the tabs); without one, completion only.
  function showMode() {
    const model = current(), chat = has(model, CHAT) && (state.mode === "chat" || !has(model, API.completions));
    $("chat-view").hidden = !chat;
    $("lm-view").hidden = chat || !has(model, API.completions);
    $("mode-chat").setAttribute("aria-selected", String(chat));
    $("mode-complete").setAttribute("aria-selected", String(!chat));
  }

  function setMode(mode) {
    if (state.controller) state.controller.abort();
    state.mode = mode;
    showMode();
  }

  // -- chat ------------------------------------------------------------------------------------
  // A reply may call tools (`tool_calls`, streamed as OpenAI streams them: the first delta of a
  // call names it, the next ones carry its arguments in pieces). Each call is shown as an item of
  // its own; the user types each call's result in the message box, sent as a `tool` message with
  // the call's id, and once every call has its result the model is asked again.
  function addTurn(role, text) {
    const turn = element("div", "turn " + role, text);
    $("conversation").querySelector(".placeholder").hidden = true;
    $("conversation").append(turn);
    return turn;
  }

  function addToolTurn(kind, label, text) {
    const turn = addTurn(kind, undefined);
    turn.append(element("span", "label", label), element("code", "body", text));
    return turn;
  }

  function clearChat() {
    if (state.controller) state.controller.abort();
    state.conversation = [];
    state.pending = [];
    state.results = [];
    $("conversation").querySelectorAll(".turn").forEach((t) => t.remove());
    $("conversation").querySelector(".placeholder").hidden = false;
    $("chat-status").textContent = "";
    askForResult();
  }

  function setChatRunning(running) {
    $("send").disabled = running;
    $("chat-stop").disabled = !running;
    $("conversation").dataset.state = running ? "running" : "idle";
  }

  // The tools typed on the page: an array, or null when the box is empty (a message naming what is wrong).
  function typedTools() {
    const text = $("tools").value.trim();
    if (!text) return null;
    let tools;
    try { tools = JSON.parse(text); } catch (e) { throw new Error("Tools: not JSON (" + e.message + ")"); }
    if (!Array.isArray(tools)) throw new Error("Tools: a JSON array of tools, as OpenAI's `tools`");
    return tools;
  }

  // tool choice: auto, none, required, or one of the typed tools by name.
  function listToolChoices() {
    let names = [];
    try { names = (typedTools() || []).map((t) => t && t.function && t.function.name).filter(Boolean); } catch (e) { /* not yet JSON */ }
    const picker = $("tool-choice"), chosen = picker.value;
    picker.replaceChildren(...["auto", "required", "none"].map((c) => new Option(c, c)),
      ...names.map((n) => new Option("call " + n, "function:" + n)));
    if ([...picker.options].some((o) => o.value === chosen)) picker.value = chosen;
  }

  function addTools(body, answeringTools) {
    const tools = typedTools();
    if (!tools) return;
    const choice = $("tool-choice").value || "auto";
    body.tools = tools;
    if (answeringTools) body.tool_choice = choice === "none" ? "none" : "auto";  // a forced call again would loop
    else body.tool_choice = choice.startsWith("function:") ? { type: "function", function: { name: choice.slice(9) } } : choice;
  }

  // The message box asks for the next call's result while calls wait for theirs.
  function askForResult() {
    const call = state.pending[state.results.length];
    $("message").placeholder = call ? "The result of " + call.function.name + " (call " + call.id + "); Ctrl+Enter sends it."
      : "Write a message; Ctrl+Enter sends it.";
    $("send").textContent = call ? "Send result" : "Send";
    $("conversation").dataset.waiting = call ? call.id : "";
  }

  function send() {
    const text = $("message").value;
    if (state.controller || !text.trim()) return;
    showError("");
    const call = state.pending[state.results.length];
    if (!call) {
      reply([{ role: "user", content: text }], [addTurn("user", text)]);
      return;
    }
    const message = { role: "tool", tool_call_id: call.id, content: text };
    state.results.push({ message: message, turn: addToolTurn("tool", call.function.name + " returned", text) });
    $("message").value = "";
    if (state.results.length < state.pending.length) return askForResult();
    const results = state.results;
    reply(results.map((r) => r.message), results.map((r) => r.turn), true);
  }

  function chatRequest(messages, answeringTools) {
    const system = $("system").value.trim();
    const body = {
      model: current().id,
      messages: (system ? [{ role: "system", content: system }] : []).concat(messages),
      max_tokens: numberOr("chat-max-tokens", 200),
      temperature: Number($("chat-temperature").value),
      stream: true,
      stream_options: { include_usage: true },
    };
    if ($("json-mode").checked) body.response_format = { type: "json_object" };
    addTools(body, answeringTools);
    return body;
  }

  // One streamed reply: its text into `reply`, its tool calls into items of their own.
  function replyView() {
    const view = { text: addTurn("assistant", ""), calls: [] };
    view.take = (delta) => {
      if (delta.content) view.text.append(delta.content);
      for (const d of delta.tool_calls || []) {
        let call = view.calls[d.index];
        if (!call) {
          const fn = d.function || {};
          call = view.calls[d.index] = { id: d.id, type: "function", function: { name: fn.name, arguments: "" } };
          call.turn = addToolTurn("tool-call", "calls " + fn.name, "");
          call.turn.dataset.callId = d.id;
          if (!view.text.textContent) view.text.remove();  // the reply is the calls alone
        }
        call.function.arguments += (d.function && d.function.arguments) || "";
        call.turn.querySelector(".body").textContent = call.function.arguments;
      }
    };
    view.message = (complete) => {  // the assistant's turn for the conversation (calls only when complete)
      const calls = complete ? view.calls.map((c) => ({ id: c.id, type: c.type, function: c.function })) : [];
      const message = { role: "assistant", content: view.text.textContent };
      if (calls.length) {
        message.tool_calls = calls;
        if (!message.content) delete message.content;
      }
      return message;
    };
    return view;
  }

  async function reply(added, shown, answeringTools) {
    let body;
    try {
      body = chatRequest(state.conversation.concat(added), answeringTools);
    } catch (e) {  // the tools box is not a list of tools: nothing was sent
      return refused(shown, e.message);
    }
    const view = replyView(), controller = new AbortController(), started = performance.now();
    state.controller = controller;
    setChatRunning(true);
    let finish = null, usage = null;
    try {
      const response = await api(CHAT, body, controller.signal);
      $("chat-status").textContent = "replying…";
      for await (const chunk of events(response)) {
        if (chunk.usage) usage = chunk.usage;
        for (const choice of chunk.choices) {
          if (choice.delta) view.take(choice.delta);
          if (choice.finish_reason) finish = choice.finish_reason;
        }
      }
      const seconds = (performance.now() - started) / 1000, tokens = usage ? usage.completion_tokens : 0;
      $("chat-status").textContent = tokens + " tokens in " + seconds.toFixed(1) + " s · " + finished(finish, view.calls);
      $("conversation").dataset.finish = finish || "";
      view.text.classList.add("ended");  // an empty reply says so, not "…"
      answered(added, view, true);
    } catch (e) {
      if (e.name === "AbortError") {  // what was written stays in the conversation
        $("chat-status").textContent = "stopped";
        $("conversation").dataset.finish = "stopped";
        const shownStill = view.text.isConnected || view.calls.some((c) => c.turn.isConnected);
        if (shownStill) answered(added, view, false);  // not a stop by "New chat" or another model
      } else {  // the message was not taken (a refusal of the template, a full queue): try again
        view.text.remove();
        view.calls.forEach((c) => c.turn.remove());
        refused(shown, e.message);
      }
    } finally {
      if (state.controller === controller) state.controller = null;
      setChatRunning(false);
    }
  }

  function finished(finish, calls) {
    if (calls.length) return "called " + calls.map((c) => c.function.name).join(", ") + ": type the result below";
    return finish === "length" ? "reached max tokens" : "end of the model's turn";
  }

  // The reply is part of the conversation; its calls (unless it was stopped) wait for their results.
  function answered(added, view, complete) {
    const message = view.message(complete);
    state.conversation = state.conversation.concat(added, [message]);
    state.pending = message.tool_calls || [];
    state.results = [];
    $("message").value = "";
    askForResult();
  }

  // A request not taken: what it added leaves the conversation's view; the calls wait for their results again.
  function refused(shown, message) {
    shown.forEach((t) => t.remove());
    state.results = [];
    askForResult();
    showError(message);
    $("chat-status").textContent = "";
  }

  // -- completion ------------------------------------------------------------------------------
  function numberOr(id, fallback) {
    const text = $(id).value.trim();
    return text === "" ? fallback : Number(text);
  }

  function completionRequest() {
    const body = {
      model: current().id,
      prompt: $("prompt").value,
      max_tokens: numberOr("max-tokens", 300),
      temperature: Number($("temperature").value),
      top_p: Number($("top-p").value),
      stream: true,
      stream_options: { include_usage: true },
    };
    const topK = numberOr("top-k", null), seed = numberOr("seed", null);
    if (topK !== null) body.top_k = topK;
    if (seed !== null) body.seed = seed;
    return body;
  }

  // Server-sent events: blocks separated by a blank line, each `data: <json>` or `data: [DONE]`.
  async function* events(response) {
    const reader = response.body.getReader(), decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buffer += decoder.decode(value, { stream: true });
      let end;
      while ((end = buffer.indexOf("\n\n")) >= 0) {
        const block = buffer.slice(0, end);
        buffer = buffer.slice(end + 2);
        for (const line of block.split("\n")) {
          const data = line.startsWith("data:") ? line.slice(5).trim() : "";
          if (data && data !== "[DONE]") yield JSON.parse(data);
        }
      }
    }
  }

  function setRunning(running) {
    $("generate").disabled = running;
    $("stop").disabled = !running;
    $("completion").querySelector(".cursor").hidden = !running;
    $("completion").dataset.state = running ? "running" : "idle";
  }

  async function generate() {
    showError("");
    const out = $("completion"), generated = out.querySelector(".generated");
    const body = completionRequest(), controller = new AbortController();
    out.querySelector(".placeholder").hidden = true;
    out.querySelector(".echo").textContent = body.prompt;
    generated.replaceChildren();
    out.dataset.pieces = "0";
    state.controller = controller;
    setRunning(true);
    const started = performance.now();
    let pieces = 0, finish = null, usage = null;
    const seconds = () => (performance.now() - started) / 1000;
    try {
      const response = await api(API.completions, body, controller.signal);
      $("lm-status").textContent = "generating…";
      for await (const chunk of events(response)) {
        if (chunk.usage) usage = chunk.usage;
        for (const choice of chunk.choices) {
          if (choice.text) {
            generated.append(choice.text);
            out.dataset.pieces = String(++pieces);
          }
          if (choice.finish_reason) finish = choice.finish_reason;
        }
        $("lm-status").textContent = pieces + " pieces · " + seconds().toFixed(1) + " s";
      }
      const tokens = usage ? usage.completion_tokens : pieces;
      const why = finish === "length" ? "reached max tokens" : "the model ended the text";
      $("lm-status").textContent = tokens + " tokens in " + seconds().toFixed(1) + " s (" +
        (tokens / seconds()).toFixed(0) + " tokens/s) · " + why;
      out.dataset.finish = finish || "";
    } catch (e) {
      if (e.name === "AbortError") {
        $("lm-status").textContent = "stopped after " + pieces + " pieces";
        out.dataset.finish = "stopped";
      } else {
        showError(e.message);
        $("lm-status").textContent = "";
      }
    } finally {
      if (state.controller === controller) state.controller = null;
      setRunning(false);
    }
  }

  function stop() {
    if (state.controller) state.controller.abort();
  }

  // -- translation and its heatmap ---------------------------------------------------------------
  async function translate() {
    showError("");
    $("mt-status").textContent = "translating…";
    try {
      const body = { model: current().id, input: $("source").value, beam: numberOr("beam", 5) };
      const result = await (await api(API.translations, body)).json();
      $("translation").textContent = result.translation;
      $("mt-result").hidden = false;
      drawHeatmap(result.source_labels, result.target_labels, result.attention);
      $("mt-status").textContent = "beam " + body.beam;
    } catch (e) {
      showError(e.message);
      $("mt-status").textContent = "";
    }
  }

  function colour(w) {
    const stops = window.attentionColours;
    const x = Math.max(0, Math.min(1, w)) * (stops.length - 1);
    const i = Math.min(Math.floor(x), stops.length - 2), f = x - i;
    const a = parseInt(stops[i].slice(1), 16), b = parseInt(stops[i + 1].slice(1), 16);
    const mix = (shift) => Math.round(((a >> shift) & 255) * (1 - f) + ((b >> shift) & 255) * f);
    return "rgb(" + mix(16) + "," + mix(8) + "," + mix(0) + ")";
  }

  // A heatmap on a canvas: rows are the translation's tokens, columns the source's; weights 0..1
  // coloured with viridis, as in the PNG pictures of `attnlab translate --attention`.
  function drawHeatmap(columns, rows, weights) {
    const canvas = $("heatmap"), ctx = canvas.getContext("2d");
    const font = "12px " + getComputedStyle(document.body).getPropertyValue("--mono");
    ctx.font = font;
    const widest = (labels) => Math.max(...labels.map((t) => ctx.measureText(t).width), 10);
    const left = widest(rows) + 12, top = widest(columns) + 12;
    const room = canvas.parentElement.clientWidth - left - 4;
    const cell = Math.max(14, Math.min(34, Math.floor(room / columns.length)));
    const width = left + cell * columns.length, height = top + cell * rows.length;
    const scale = window.devicePixelRatio || 1;
    canvas.width = width * scale;
    canvas.height = height * scale;
    canvas.style.width = width + "px";
    canvas.style.height = height + "px";
    ctx.setTransform(scale, 0, 0, scale, 0, 0);
    ctx.font = font;
    ctx.fillStyle = getComputedStyle(document.body).color;
    ctx.textBaseline = "middle";
    ctx.textAlign = "right";
    rows.forEach((t, r) => ctx.fillText(t, left - 6, top + r * cell + cell / 2));
    columns.forEach((t, c) => {
      ctx.save();
      ctx.translate(left + c * cell + cell / 2, top - 6);
      ctx.rotate(-Math.PI / 2);
      ctx.textAlign = "left";
      ctx.fillText(t, 0, 0);
      ctx.restore();
    });
    weights.forEach((row, r) => row.forEach((w, c) => {
      ctx.fillStyle = colour(w);
      ctx.fillRect(left + c * cell, top + r * cell, cell - 1, cell - 1);
    }));
    canvas.onmousemove = (e) => {
      const box = canvas.getBoundingClientRect();
      const c = Math.floor((e.clientX - box.left - left) / cell), r = Math.floor((e.clientY - box.top - top) / cell);
      const tip = $("heat-tip");
      if (c < 0 || r < 0 || c >= columns.length || r >= rows.length) { tip.hidden = true; return; }
      tip.textContent = rows[r] + "  →  " + columns[c] + "\nweight " + weights[r][c].toFixed(4);
      tip.style.left = e.clientX + 14 + "px";
      tip.style.top = e.clientY + 14 + "px";
      tip.hidden = false;
    };
    canvas.onmouseleave = () => { $("heat-tip").hidden = true; };
  }

  // -- classification and tagging ------------------------------------------------------------
  function bar(probability) {
    const outer = document.createElement("div"), inner = document.createElement("span");
    outer.className = "bar";
    inner.style.width = (100 * probability).toFixed(1) + "%";
    outer.append(inner);
    return outer;
  }

  function element(tag, className, text) {
    const el = document.createElement(tag);
    if (className) el.className = className;
    if (text !== undefined) el.textContent = text;
    return el;
  }

  const percent = (p) => (100 * p).toFixed(1) + "%";

  function classificationView(item) {
    const box = element("div", "sentence");
    box.append(element("p", "quote", "“" + item.input + "”"));
    box.append(element("p", "verdict", item.label + " · " + percent(item.probabilities[item.label])));
    const bars = element("div", "bars");
    Object.entries(item.probabilities).forEach(([label, p], i) => {
      const row = element("div", "bar-row" + (i === 0 ? " best" : ""));
      row.append(element("span", "name", label), bar(p), element("span", "value", percent(p)));
      bars.append(row);
    });
    box.append(bars);
    return box;
  }

  function taggingView(item) {
    const box = element("div", "sentence"), words = element("div", "words");
    box.append(element("p", "quote", "“" + item.input + "”"));
    item.words.forEach((w) => {
      const chip = element("div", "word");
      chip.title = Object.entries(w.probabilities).slice(0, 3).map(([t, p]) => t + " " + percent(p)).join("\n");
      chip.append(element("span", "w", w.word), element("span", "t", w.tag), bar(w.probability),
        element("span", "p", percent(w.probability)));
      words.append(chip);
    });
    box.append(words);
    return box;
  }

  async function runEncoder() {
    showError("");
    const model = current(), tags = has(model, API.tags);
    const lines = $("enc-input").value.split("\n").filter((l) => l.trim());
    $("enc-status").textContent = "…";
    try {
      const path = tags ? API.tags : API.classifications;
      const result = await (await api(path, { model: model.id, input: lines.length ? lines : "" })).json();
      $("enc-result").replaceChildren(...result.data.map(tags ? taggingView : classificationView));
      $("enc-result").hidden = false;
      $("enc-status").textContent = lines.length > 1 ? lines.length + " sentences, one per line" : "";
    } catch (e) {
      showError(e.message);
      $("enc-status").textContent = "";
    }
  }

  // -- the attention explorer of `attnlab attention`, fed by /v1/attention --------------------
  function typedText(model) {
    if (!$("chat-view").hidden) return $("message").value;
    if (has(model, API.completions)) return $("prompt").value;
    if (has(model, API.translations)) return $("source").value;
    return $("enc-input").value.split("\n").find((l) => l.trim()) || "";  // the first sentence
  }

  function select(className, names, chosen) {
    const el = element("select", className);
    names.forEach((name, i) => el.append(new Option(name, String(i), i === chosen, i === chosen)));
    return el;
  }

  async function showAttention() {
    showError("");
    const model = current();
    $("attn-status").textContent = "…";
    try {
      const body = { model: model.id, input: typedText(model) };
      if (has(model, API.translations)) body.beam = numberOr("beam", 5);
      const data = await (await api(API.attention, body)).json();
      const id = "attention-" + ++state.views, root = element("div", "attn");
      root.id = id;
      const caption = data.kind + ": “" + data.text + "”" + (data.output ? " → “" + data.output + "”" : "");
      const controls = element("div", "attn-controls");
      const layer = element("label", "", "layer "), head = element("label", "", "head ");
      layer.append(select("attn-layer", data.layers.map((_, i) => "layer " + i), data.layers.length - 1));
      head.append(select("attn-head", data.layers[0].map((_, h) => "head " + h), 0));
      controls.append(layer, head, element("span", "hint", "hover a cell for its weight"));
      const json = element("script");
      json.type = "application/json";
      json.id = id + "-data";
      json.textContent = JSON.stringify(data);
      root.append(element("p", "attn-caption", caption), controls, element("div", "attn-grid"),
        element("div", "attn-tip"));
      $("attention-box").replaceChildren(root, json);
      window.attentionView(id);
      $("attn-status").textContent = data.layers.length + " layers × " + data.layers[0].length + " heads";
    } catch (e) {
      showError(e.message);
      $("attn-status").textContent = "";
    }
  }

  // -- wiring ----------------------------------------------------------------------------------
  function start() {
    $("model").addEventListener("change", selectModel);
    $("generate").addEventListener("click", generate);
    $("stop").addEventListener("click", stop);
    $("translate").addEventListener("click", translate);
    $("enc-run").addEventListener("click", runEncoder);
    $("show-attention").addEventListener("click", showAttention);
    $("send").addEventListener("click", send);
    $("chat-stop").addEventListener("click", stop);
    $("chat-clear").addEventListener("click", clearChat);
    $("tools").addEventListener("input", listToolChoices);
    listToolChoices();
    $("mode-chat").addEventListener("click", () => setMode("chat"));
    $("mode-complete").addEventListener("click", () => setMode("complete"));
    $("message").addEventListener("keydown", (e) => {
      if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) send();
    });
    $("prompt").addEventListener("keydown", (e) => {
      if (e.key === "Enter" && (e.ctrlKey || e.metaKey) && !$("generate").disabled) generate();
    });
    ["temperature", "top-p", "chat-temperature"].forEach((id) => {
      $(id).addEventListener("input", () => { $(id + "-value").textContent = $(id).value; });
    });
    $("key-form").addEventListener("submit", (e) => {
      e.preventDefault();
      state.key = $("api-key").value.trim();
      localStorage.setItem(KEY, state.key);
      $("key-panel").hidden = true;
      loadModels().catch((err) => showError(err.message));
    });
    loadModels().catch((err) => showError(err.message));
  }

  start();
})();
