/* The documents view (lm_eval_probes/reports/documents.py writes its data). Every string of a document goes into the
   page as text (textContent, setAttribute): never as markup. State lives in the URL fragment:
   #docs=<task>&filter=<wrong|confident-wrong|disagree>&model=<label>&doc=<doc_id>&threshold=<t>&q=<text>&b=<label> */
(function () {
  "use strict";
  var manifest = JSON.parse(document.getElementById("documents-manifest").textContent);
  var view = document.getElementById("documents-view");
  if (!view) { return; }
  var LIMIT = 500;
  var DEFAULT_THRESHOLD = 0.8;
  var state = { sort: null, descending: false, all: false, traceName: null };
  var loading = {};
  var FILTERS = ["", "wrong", "confident-wrong", "disagree"];

  function el(tag, attrs, text) {
    var node = document.createElement(tag);
    if (attrs) { Object.keys(attrs).forEach(function (k) { node.setAttribute(k, attrs[k]); }); }
    if (text !== undefined && text !== null) { node.textContent = String(text); }
    return node;
  }
  function $(id) { return document.getElementById(id); }
  function fmt(v) {
    if (v === null || v === undefined) { return "—"; }
    if (typeof v !== "number") { return String(v); }
    var a = Math.abs(v);
    return (a !== 0 && (a < 1e-3 || a >= 1e5)) ? v.toExponential(3) : String(Number(v.toPrecision(4)));
  }

  function parseHash() {
    var out = {};
    var hash = location.hash.replace(/^#/, "");
    if (hash.indexOf("docs=") !== 0) { return null; }
    hash.split("&").forEach(function (part) {
      var i = part.indexOf("=");
      if (i > 0) { out[decodeURIComponent(part.slice(0, i))] = decodeURIComponent(part.slice(i + 1).replace(/\+/g, " ")); }
    });
    return out;
  }
  function setHash(params) {
    var keys = ["docs", "filter", "model", "doc", "b", "threshold", "q"];
    var parts = [];
    keys.forEach(function (k) {
      if (params[k] !== undefined && params[k] !== null && params[k] !== "") {
        parts.push(k + "=" + encodeURIComponent(params[k]));
      }
    });
    var hash = "#" + parts.join("&");
    if (location.hash !== hash) { history.replaceState(null, "", hash); }
    render();
  }
  function update(changes) {
    var params = parseHash() || {};
    Object.keys(changes).forEach(function (k) { params[k] = changes[k]; });
    setHash(params);
  }

  function load(globalName, path, task, done) {
    var store = window[globalName];
    if (store && store[task]) { done(store[task]); return; }
    var key = globalName + ":" + task;
    if (loading[key]) { loading[key].push(done); return; }
    loading[key] = [done];
    var script = el("script", { src: path });
    script.onload = function () {
      var waiting = loading[key]; delete loading[key];
      var data = (window[globalName] || {})[task];
      waiting.forEach(function (fn) { fn(data); });
    };
    script.onerror = function () {
      delete loading[key];
      $("doc-count").textContent = "could not load " + path;
    };
    document.head.appendChild(script);
  }

  function threshold(params) {
    var t = parseFloat(params.threshold);
    return isNaN(t) ? DEFAULT_THRESHOLD : t;
  }

  function disagreeing(data) {
    var responses = {};
    data.pairs.forEach(function (p) {
      (responses[p[1]] = responses[p[1]] || {})[p[2]] = true;
    });
    var out = {};
    Object.keys(responses).forEach(function (d) { out[d] = Object.keys(responses[d]).length > 1; });
    return out;
  }

  function selected(data, params) {
    var filter = params.filter || "";
    var t = threshold(params);
    var query = (params.q || "").toLowerCase();
    var model = params.model ? data.models.indexOf(params.model) : -1;
    var disagree = filter === "disagree" ? disagreeing(data) : null;
    return data.pairs.filter(function (p) {
      if (model >= 0 && p[0] !== model) { return false; }
      if (filter === "wrong" && p[3] !== 0) { return false; }
      if (filter === "confident-wrong" && !(p[3] === 0 && p[4] !== null && p[4] >= t)) { return false; }
      if (disagree && !disagree[p[1]]) { return false; }
      if (query) {
        var doc = data.documents[p[1]];
        var text = (doc.prompt + "\u0000" + doc.gold + "\u0000" + p[2] + "\u0000" + doc.id).toLowerCase();
        if (text.indexOf(query) < 0) { return false; }
      }
      return true;
    });
  }

  function columnValue(data, p, column) {
    if (column === "doc") { var id = data.documents[p[1]].id; var n = Number(id); return isNaN(n) ? id : n; }
    if (column === "model") { return data.models[p[0]]; }
    if (column === "response") { return p[2]; }
    if (column === "gold") { return data.documents[p[1]].gold; }
    if (column === "correct") { return p[3]; }
    if (column === "confidence") { return p[4]; }
    return p[5][column];
  }

  function sorted(data, pairs) {
    if (state.sort === null) { return pairs; }
    var sign = state.descending ? -1 : 1;
    return pairs.slice().sort(function (a, b) {
      var x = columnValue(data, a, state.sort), y = columnValue(data, b, state.sort);
      if (x === null && y === null) { return 0; }
      if (x === null) { return 1; }
      if (y === null) { return -1; }
      return x < y ? -sign : x > y ? sign : 0;
    });
  }

  function header(data) {
    var head = $("documents-table").tHead;
    head.textContent = "";
    var row = head.insertRow();
    var columns = [["doc", "doc_id", "the document's doc_id; click a row to open the document"],
                   ["model", "model", "the model"],
                   ["response", "response", "the generated text, or the chosen option of a multiple-choice document"],
                   ["gold", "gold", "the gold answer (lm_eval's target)"],
                   ["correct", data.metric || "correct", "the task's correctness row on this document (1 right, 0 wrong)"],
                   ["confidence", "confidence", "the chosen option's probability / the answer's geometric-mean token probability"]];
    data.columns.forEach(function (c, i) {
      if (c.name !== "confidence") { columns.push([i, c.name, c.description]); }
    });
    columns.forEach(function (c) {
      var th = el("th", { title: c[2], "data-column": String(c[0]) }, c[1]);
      if (state.sort === c[0]) { th.className = state.descending ? "sorted-desc" : "sorted-asc"; }
      th.addEventListener("click", function () {
        state.descending = state.sort === c[0] ? !state.descending : true;
        state.sort = c[0];
        render();
      });
      row.appendChild(th);
    });
    return columns;
  }

  function listing(data, params) {
    var columns = header(data);
    var pairs = sorted(data, selected(data, params));
    var body = $("documents-table").tBodies[0];
    body.textContent = "";
    var shown = state.all ? pairs : pairs.slice(0, LIMIT);
    var fragment = document.createDocumentFragment();
    shown.forEach(function (p) {
      var doc = data.documents[p[1]];
      var tr = el("tr", { "data-model": data.models[p[0]], "data-doc-id": doc.id });
      if (params.doc === doc.id && (!params.model || params.model === data.models[p[0]])) { tr.className = "open"; }
      columns.forEach(function (c) {
        var value = columnValue(data, p, c[0]);
        var td = el("td", null, c[0] === "response" || c[0] === "gold" || c[0] === "model" || c[0] === "doc" ? value : fmt(value));
        if (c[0] === "response" || c[0] === "gold" || c[0] === "model") { td.className = "name text"; }
        if (c[0] === "correct") { td.className = p[3] === 0 ? "wrong" : p[3] === 1 ? "right" : "missing"; }
        tr.appendChild(td);
      });
      tr.addEventListener("click", function () { update({ doc: doc.id, model: params.model || data.models[p[0]] }); });
      fragment.appendChild(tr);
    });
    body.appendChild(fragment);
    var filterText = params.filter === "confident-wrong" ? "confident and wrong (confidence ≥ " + threshold(params) + ")"
                     : params.filter === "wrong" ? "wrong" : params.filter === "disagree" ? "where the models disagree" : "all";
    $("doc-count").textContent = pairs.length + " of " + data.pairs.length + " (model, document) pairs: " + filterText +
      (shown.length < pairs.length ? "; showing the first " + shown.length : "");
    $("doc-more").hidden = shown.length >= pairs.length;
  }

  function controls(data, params) {
    var task = $("doc-task");
    if (task.value !== params.docs) { task.value = params.docs; }
    $("doc-filter").value = FILTERS.indexOf(params.filter || "") >= 0 ? (params.filter || "") : "";
    $("doc-threshold").value = String(threshold(params));
    $("doc-threshold-box").hidden = params.filter !== "confident-wrong";
    if ($("doc-search") !== document.activeElement) { $("doc-search").value = params.q || ""; }
    var model = $("doc-model");
    model.textContent = "";
    model.appendChild(el("option", { value: "" }, "every model"));
    data.models.forEach(function (m) { model.appendChild(el("option", { value: m }, m)); });
    model.value = params.model && data.models.indexOf(params.model) >= 0 ? params.model : "";
  }

  function tint(value, low, high) {
    if (value === null || value === undefined || !(high > low)) { return "transparent"; }
    var t = Math.max(0, Math.min(1, (value - low) / (high - low)));
    return "hsla(" + Math.round(10 + 200 * t) + ", 75%, 62%, 0.55)";
  }
  function range(values) {
    var finite = values.filter(function (v) { return typeof v === "number" && isFinite(v); });
    return finite.length ? [Math.min.apply(null, finite), Math.max.apply(null, finite)] : [0, 0];
  }

  function tokens(list, values, label) {
    var box = el("div", { "class": "tokens", "aria-label": label });
    var r = range(values || []);
    list.forEach(function (token, i) {
      var v = values ? values[i] : null;
      var span = el("span", { "class": "token", title: label + " " + fmt(v) }, token);
      span.style.background = tint(v, r[0], r[1]);
      box.appendChild(span);
    });
    return box;
  }

  var SVG = "http://www.w3.org/2000/svg";
  function plot(values, name) {
    var w = 320, h = 90, pad = 6;
    var svg = document.createElementNS(SVG, "svg");
    svg.setAttribute("viewBox", "0 0 " + w + " " + h);
    svg.setAttribute("class", "trace-plot");
    svg.setAttribute("role", "img");
    svg.setAttribute("aria-label", name + " per response position");
    var r = range(values);
    var n = values.length;
    var points = [];
    values.forEach(function (v, i) {
      if (typeof v !== "number") { return; }
      var x = pad + (n > 1 ? i * (w - 2 * pad) / (n - 1) : (w - 2 * pad) / 2);
      var y = r[1] > r[0] ? h - pad - (v - r[0]) * (h - 2 * pad) / (r[1] - r[0]) : h / 2;
      points.push(x.toFixed(1) + "," + y.toFixed(1));
    });
    var line = document.createElementNS(SVG, "polyline");
    line.setAttribute("points", points.join(" "));
    line.setAttribute("fill", "none");
    line.setAttribute("stroke", "#3a7bd5");
    line.setAttribute("stroke-width", "1.5");
    svg.appendChild(line);
    points.forEach(function (pt) {
      var c = document.createElementNS(SVG, "circle");
      var xy = pt.split(",");
      c.setAttribute("cx", xy[0]); c.setAttribute("cy", xy[1]); c.setAttribute("r", "2"); c.setAttribute("fill", "#3a7bd5");
      svg.appendChild(c);
    });
    var box = el("figure", { "class": "trace-figure" });
    box.appendChild(svg);
    box.appendChild(el("figcaption", null, name + " per position: " + fmt(r[0]) + " … " + fmt(r[1])));
    return box;
  }

  function traceArrays(trace) {
    var n = trace.tokens ? trace.tokens.length : 0;
    return Object.keys(trace).filter(function (k) {
      return k !== "tokens" && Array.isArray(trace[k]) && trace[k].length === n && typeof trace[k][0] !== "string";
    });
  }

  function choiceTable(doc, choices) {
    /* every option with this model's log-likelihood and its probability among the options; chosen and gold marked */
    var gold = doc.gold_options || [];
    var top = Math.max.apply(null, choices.logliks);
    var weights = choices.logliks.map(function (v) { return Math.exp(v - top); });
    var total = weights.reduce(function (a, b) { return a + b; }, 0);
    var table = el("table", { "class": "choices" });
    var head = table.createTHead().insertRow();
    [["option", "the option's text (its continuation, with the task's delimiter)"],
     ["log-likelihood", "log P(option | prompt), summed over the option's tokens (nats)"],
     ["p among options", "softmax of the log-likelihoods over the options"],
     ["", "chosen: the option the model picks; gold: lm_eval's target"]].forEach(function (c) {
      head.appendChild(el("th", { title: c[1] }, c[0]));
    });
    var body = table.createTBody();
    doc.options.forEach(function (text, i) {
      var chosen = choices.chosen === i, isGold = gold.indexOf(i) >= 0;
      var tr = el("tr", { "data-option": String(i), "class": (chosen ? "chosen" : "") + (isGold ? " gold" : "") });
      tr.appendChild(el("td", { "class": "text" }, text));
      tr.appendChild(el("td", { "class": "number" }, fmt(choices.logliks[i])));
      tr.appendChild(el("td", { "class": "number" }, fmt(weights[i] / total)));
      var marks = [];
      if (chosen) { marks.push("◀ chosen"); }
      if (isGold) { marks.push("★ gold"); }
      tr.appendChild(el("td", { "class": "marks" + (chosen && isGold ? " right" : chosen && gold.length ? " wrong" : "") }, marks.join(" ")));
      body.appendChild(tr);
    });
    return table;
  }

  function modelColumn(data, task, docIndex, label, params) {
    var column = el("div", { "class": "doc-model", "data-model": label });
    var m = data.models.indexOf(label);
    var pair = data.pairs.filter(function (p) { return p[0] === m && p[1] === docIndex; })[0];
    column.appendChild(el("h4", null, label));
    if (!pair) { column.appendChild(el("p", { "class": "note" }, "this model did not run this document")); return column; }
    var facts = el("dl", { "class": "facts" });
    function fact(name, value) { facts.appendChild(el("dt", null, name)); facts.appendChild(el("dd", null, value)); }
    fact("response", pair[2]);
    fact(data.metric || "correct", pair[3] === null ? "—" : pair[3] ? "1 (right)" : "0 (wrong)");
    fact("confidence", fmt(pair[4]));
    data.columns.forEach(function (c, i) { if (c.name !== "confidence") { fact(c.name, fmt(pair[5][i])); } });
    column.appendChild(facts);
    if (pair[7] && data.documents[docIndex].options.length) { column.appendChild(choiceTable(data.documents[docIndex], pair[7])); }
    var slot = el("div", { "class": "trace" });
    column.appendChild(slot);
    if (!pair[6]) { slot.appendChild(el("p", { "class": "note" }, "no trace (run with probe_traces=true)")); return column; }
    var entry = manifest[task];
    load("LEP_TRACES", entry.traces, task, function (traces) {
      var trace = traces && traces[m + ":" + data.documents[docIndex].id];
      if (!trace) { slot.appendChild(el("p", { "class": "note" }, "no trace")); return; }
      var names = traceArrays(trace);
      var name = names.indexOf(state.traceName) >= 0 ? state.traceName : (names.indexOf("logprob") >= 0 ? "logprob" : names[0]);
      var pick = el("select", { "class": "trace-name", "aria-label": "the trace that tints the response" });
      names.forEach(function (n) { pick.appendChild(el("option", { value: n }, n)); });
      pick.value = name;
      pick.addEventListener("change", function () { state.traceName = pick.value; render(); });
      var line = el("p", { "class": "note" }, "response tokens tinted by ");
      line.appendChild(pick);
      slot.appendChild(line);
      slot.appendChild(tokens(trace.tokens || [], trace[name], name));
      slot.appendChild(plot(trace[name] || [], name));
      if (trace.sequence_tokens && trace.margin) {
        slot.appendChild(el("p", { "class": "note" }, "prompt tokens (and the response's inputs) tinted by stability margin (red: smallest, the support tokens)"));
        slot.appendChild(tokens(trace.sequence_tokens, trace.margin, "margin"));
      }
    });
    return column;
  }

  function detail(data, params) {
    var panel = $("document-detail");
    panel.textContent = "";
    var docIndex = -1;
    data.documents.forEach(function (d, i) { if (d.id === params.doc) { docIndex = i; } });
    if (docIndex < 0) { panel.hidden = true; return; }
    panel.hidden = false;
    var doc = data.documents[docIndex];
    var close = el("button", { type: "button", "class": "close" }, "close");
    close.addEventListener("click", function () { update({ doc: "", b: "" }); });
    var title = el("h3", null, "Document " + doc.id + " ");
    title.appendChild(close);
    panel.appendChild(title);
    panel.appendChild(el("h4", null, "Prompt"));
    panel.appendChild(el("pre", { "class": "prompt" }, doc.prompt));
    if (doc.options.length) {
      var list = el("ol", { "class": "options", start: "0" });
      doc.options.forEach(function (o, i) {
        var gold = (doc.gold_options || []).indexOf(i) >= 0;
        list.appendChild(el("li", gold ? { "class": "gold" } : null, o + (gold ? "  ★ gold" : "")));
      });
      panel.appendChild(el("h4", null, "Options"));
      panel.appendChild(list);
    }
    panel.appendChild(el("p", null, "gold: " + doc.gold));
    var a = params.model && data.models.indexOf(params.model) >= 0 ? params.model : data.models[0];
    var others = data.models.filter(function (m) { return m !== a; });
    var b = params.b && others.indexOf(params.b) >= 0 ? params.b : others[0];
    var chooser = el("p", { "class": "note" }, "side by side: ");
    [["model", a], ["b", b]].forEach(function (which) {
      if (!which[1] && which[0] === "b") { return; }
      var select = el("select", { id: "doc-side-" + which[0], "aria-label": which[0] === "model" ? "left model" : "right model" });
      data.models.forEach(function (m) { select.appendChild(el("option", { value: m }, m)); });
      select.value = which[1];
      select.addEventListener("change", function () { var c = {}; c[which[0]] = select.value; update(c); });
      chooser.appendChild(select);
      chooser.appendChild(document.createTextNode(" "));
    });
    panel.appendChild(chooser);
    var sides = el("div", { "class": "side-by-side" });
    sides.appendChild(modelColumn(data, params.docs, docIndex, a, params));
    if (b) { sides.appendChild(modelColumn(data, params.docs, docIndex, b, params)); }
    panel.appendChild(sides);
  }

  function render() {
    var params = parseHash();
    if (!params || !manifest[params.docs]) { view.hidden = true; return; }
    view.hidden = false;
    var task = params.docs;
    $("doc-count").textContent = "loading " + task + " …";
    load("LEP_DOCUMENTS", manifest[task].documents, task, function (data) {
      var now = parseHash();
      if (!now || now.docs !== task || !data) { return; }
      view.setAttribute("data-task", task);
      controls(data, now);
      listing(data, now);
      detail(data, now);
      view.setAttribute("data-ready", "1");
    });
  }

  var taskSelect = $("doc-task");
  Object.keys(manifest).forEach(function (t) { taskSelect.appendChild(el("option", { value: t }, t)); });
  taskSelect.addEventListener("change", function () { state.sort = null; state.all = false; setHash({ docs: taskSelect.value }); });
  $("doc-filter").addEventListener("change", function () { state.all = false; update({ filter: $("doc-filter").value }); });
  $("doc-threshold").addEventListener("change", function () { update({ threshold: $("doc-threshold").value }); });
  $("doc-model").addEventListener("change", function () { update({ model: $("doc-model").value }); });
  $("doc-search").addEventListener("input", function () { update({ q: $("doc-search").value }); });
  $("doc-more").addEventListener("click", function () { state.all = true; render(); });
  window.addEventListener("hashchange", function () {
    state.all = false;
    render();
    if (parseHash()) { view.scrollIntoView(); }
  });
  render();
  if (parseHash() && manifest[parseHash().docs]) { view.scrollIntoView(); }
})();
