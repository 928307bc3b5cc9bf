/* The documents view (lm_eval_probes/reports/documents.py writes its data). Every string of a document goes into the
   page as text (textContent, setAttribute): never as markup. State lives in the URL fragment:
   #docs=<task>&filter=<wrong|confident-wrong|disagree|a-right-b-wrong>&model=<label>&doc=<doc_id>&threshold=<t>&q=<text>&b=<label>
   Colours: one scale per quantity shared by the models side by side, viridis (readable with every common colour-vision
   deficiency, and in greyscale), each with its legend. */
(function () {
  "use strict";
  var manifest = JSON.parse(document.getElementById("documents-manifest").textContent);
  var view = document.getElementById("documents-view");
  if (!view) { return; }
  var LIMIT = 500;
  var DEFAULT_THRESHOLD = 0.8;
  var state = { sort: null, descending: false, all: false, traceName: null };
  var loading = {};
  var FILTERS = ["", "wrong", "confident-wrong", "disagree", "a-right-b-wrong"];
  var TRACE_MEANING = {
    logprob: ["log-probability of the token", "nats", "higher: the model found the token more likely"],
    tcb_log10: ["log10 δ_TCB at the token", "log10", "higher: a wider top-class buffer"],
    entropy: ["entropy of the next-token distribution", "nats", "higher: less certain"],
    logit_margin: ["top-2 logit margin", "logits", "higher: a clearer winner"],
    bte_step: ["BTE: mean JS divergence between consecutive layers (central window)", "nats", "higher: belief still moving"],
    omega: ["Ω at the token: Σ over source layers of (1 − top-K mass)", "", "higher: confidence settles later"],
    margin: ["stability margin of the first attention layer", "", "lower: a support token"]
  };
  /* viridis, 9 stops (matplotlib's): dark purple (low) → yellow (high) */
  var VIRIDIS = [[68, 1, 84], [71, 44, 122], [59, 81, 139], [44, 113, 142], [33, 144, 141], [39, 173, 129],
                 [92, 200, 99], [170, 220, 50], [253, 231, 37]];

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

  function sides(data, params) {
    /* the two models compared: A (the model filter, or the first model) and B (params.b, or the next one) */
    var a = params.model && data.models.indexOf(params.model) >= 0 ? params.model : data.models[0];
    var others = data.models.filter(function (m) { return m !== a; });
    var b = params.b && others.indexOf(params.b) >= 0 ? params.b : others[0];
    return [a, b];
  }

  function rightWrong(data, a, b) {
    /* documents where model a is right and model b wrong */
    var ia = data.models.indexOf(a), ib = data.models.indexOf(b);
    var right = {}, wrong = {};
    data.pairs.forEach(function (p) {
      if (p[0] === ia && p[3] === 1) { right[p[1]] = true; }
      if (p[0] === ib && p[3] === 0) { wrong[p[1]] = true; }
    });
    var out = {};
    Object.keys(right).forEach(function (d) { if (wrong[d]) { out[d] = true; } });
    return out;
  }

  function selected(data, params) {
    var filter = params.filter || "";
    var t = threshold(params);
    var query = (params.q || "").toLowerCase();
    var model = params.model ? data.models.indexOf(params.model) : -1;
    var disagree = filter === "disagree" ? disagreeing(data) : null;
    var ab = filter === "a-right-b-wrong" ? sides(data, params) : null;
    var aRight = ab && ab[1] ? rightWrong(data, ab[0], ab[1]) : null;
    if (ab) { model = data.models.indexOf(ab[0]); }
    return data.pairs.filter(function (p) {
      if (model >= 0 && p[0] !== model) { return false; }
      if (ab && !(aRight && aRight[p[1]])) { return false; }
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
      var tr = el("tr", { "data-model": data.models[p[0]], "data-doc-id": doc.id, tabindex: "0",
                          "aria-label": "open document " + doc.id + " of " + data.models[p[0]] });
      if (params.doc === doc.id && (!params.model || params.model === data.models[p[0]])) { tr.className = "open"; }
      columns.forEach(function (c) {
        var value = columnValue(data, p, c[0]);
        var td = el("td", null, c[0] === "response" || c[0] === "gold" || c[0] === "model" || c[0] === "doc" ? value : fmt(value));
        if (c[0] === "response" || c[0] === "gold" || c[0] === "model") { td.className = "name text"; }
        if (c[0] === "correct") { td.className = p[3] === 0 ? "wrong" : p[3] === 1 ? "right" : "missing"; }
        tr.appendChild(td);
      });
      var open = function () { update({ doc: doc.id, model: params.model || data.models[p[0]] }); };
      tr.addEventListener("click", open);
      tr.addEventListener("keydown", function (event) {
        if (event.key === "Enter" || event.key === " ") { event.preventDefault(); open(); }
      });
      fragment.appendChild(tr);
    });
    body.appendChild(fragment);
    var ab = sides(data, params);
    var filterText = params.filter === "confident-wrong" ? "confident and wrong (confidence ≥ " + threshold(params) + ")"
                     : params.filter === "wrong" ? "wrong" : params.filter === "disagree" ? "where the models disagree"
                     : params.filter === "a-right-b-wrong" ? ab[0] + " right, " + (ab[1] || "—") + " wrong" : "all";
    state.order = pairs.map(function (p) { return [data.models[p[0]], data.documents[p[1]].id]; });
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
    var ab = sides(data, params);
    $("doc-b-box").hidden = params.filter !== "a-right-b-wrong";
    var b = $("doc-b");
    b.textContent = "";
    data.models.forEach(function (m) { if (m !== ab[0]) { b.appendChild(el("option", { value: m }, m)); } });
    if (ab[1]) { b.value = ab[1]; }
    if (params.filter === "a-right-b-wrong" && !params.model) { model.value = ab[0]; }
  }

  function viridis(t) {
    /* t in [0, 1] → an rgb() string of the viridis map; its text colour: white on the dark half, black on the light */
    var x = Math.max(0, Math.min(1, t)) * (VIRIDIS.length - 1);
    var i = Math.min(VIRIDIS.length - 2, Math.floor(x)), f = x - i;
    var c = [0, 1, 2].map(function (k) { return Math.round(VIRIDIS[i][k] + f * (VIRIDIS[i + 1][k] - VIRIDIS[i][k])); });
    return "rgb(" + c.join(",") + ")";
  }
  function ink(t) { return t < 0.55 ? "#fff" : "#111"; }
  function unit(value, low, high) {
    if (typeof value !== "number" || !isFinite(value)) { return null; }
    return high > low ? Math.max(0, Math.min(1, (value - low) / (high - low))) : 0.5;
  }
  function range(lists) {
    /* [min, max] over every finite number of the given arrays (one shared scale) */
    var finite = [];
    lists.forEach(function (values) {
      (values || []).forEach(function (v) { if (typeof v === "number" && isFinite(v)) { finite.push(v); } });
    });
    return finite.length ? [Math.min.apply(null, finite), Math.max.apply(null, finite)] : [0, 0];
  }

  function legend(label, low, high, direction, ticks) {
    /* a colour bar from low to high with its values, the quantity's name and which way is which */
    var box = el("div", { "class": "legend", role: "img",
                          "aria-label": label + ": colour from " + fmt(low) + " (dark purple) to " + fmt(high) + " (yellow)" });
    box.appendChild(el("span", { "class": "legend-name" }, label));
    var bar = el("span", { "class": "legend-bar" });
    var stops = VIRIDIS.map(function (c, i) { return "rgb(" + c.join(",") + ") " + Math.round(100 * i / (VIRIDIS.length - 1)) + "%"; });
    bar.style.background = "linear-gradient(to right, " + stops.join(", ") + ")";
    var scale = el("span", { "class": "legend-scale" });
    scale.appendChild(bar);
    var marks = el("span", { "class": "legend-ticks" });
    (ticks || [low, high]).forEach(function (v) { marks.appendChild(el("span", null, fmt(v))); });
    scale.appendChild(marks);
    box.appendChild(scale);
    if (direction) { box.appendChild(el("span", { "class": "legend-direction" }, direction)); }
    return box;
  }

  function tokens(list, values, label, scale, kind) {
    /* the tokens, each tinted on the shared scale, its value written under it */
    var box = el("div", { "class": "tokens " + (kind || ""), "aria-label": label + " per token" });
    list.forEach(function (token, i) {
      var v = values ? values[i] : null;
      var t = unit(v, scale[0], scale[1]);
      var chip = el("span", { "class": "token", title: JSON.stringify(token) + " — " + label + " " + fmt(v) });
      var text = el("span", { "class": "token-text" }, token);
      if (t !== null) { text.style.background = viridis(t); text.style.color = ink(t); }
      chip.appendChild(text);
      if (kind !== "prompt") { chip.appendChild(el("span", { "class": "token-value" }, fmt(v))); }
      box.appendChild(chip);
    });
    return box;
  }

  var SVG = "http://www.w3.org/2000/svg";
  function svg(tag, attrs, text) {
    var node = document.createElementNS(SVG, tag);
    Object.keys(attrs).forEach(function (k) { node.setAttribute(k, attrs[k]); });
    if (text !== undefined) { node.textContent = text; }
    return node;
  }
  function plot(values, name, scale) {
    /* the array per response position: named axes, the shared value range as the y axis's ends */
    var w = 360, h = 130, left = 52, right = 10, top = 10, bottom = 34;
    var meaning = TRACE_MEANING[name];
    var yName = name + (meaning && meaning[1] ? " (" + meaning[1] + ")" : "");
    var box = svg("svg", { viewBox: "0 0 " + w + " " + h, "class": "trace-plot", role: "img",
                           "aria-label": name + " per response position, from " + fmt(scale[0]) + " to " + fmt(scale[1]) });
    var n = values.length;
    var x = function (i) { return left + (n > 1 ? i * (w - left - right) / (n - 1) : (w - left - right) / 2); };
    var y = function (v) { return scale[1] > scale[0] ? top + (scale[1] - v) * (h - top - bottom) / (scale[1] - scale[0]) : (h - bottom + top) / 2; };
    box.appendChild(svg("line", { x1: left, y1: top, x2: left, y2: h - bottom, stroke: "#888" }));
    box.appendChild(svg("line", { x1: left, y1: h - bottom, x2: w - right, y2: h - bottom, stroke: "#888" }));
    [scale[1], scale[0]].forEach(function (v) {
      box.appendChild(svg("text", { x: left - 4, y: y(v) + 4, "text-anchor": "end", "class": "tick" }, fmt(v)));
    });
    [0, n - 1].filter(function (i, k, all) { return i >= 0 && all.indexOf(i) === k; }).forEach(function (i) {
      box.appendChild(svg("text", { x: x(i), y: h - bottom + 13, "text-anchor": "middle", "class": "tick" }, String(i)));
    });
    box.appendChild(svg("text", { x: (left + w - right) / 2, y: h - 4, "text-anchor": "middle", "class": "axis" },
                        "response position (token index)"));
    box.appendChild(svg("text", { x: 11, y: (top + h - bottom) / 2, "text-anchor": "middle", "class": "axis",
                                  transform: "rotate(-90 11 " + (top + h - bottom) / 2 + ")" }, yName));
    var points = [];
    values.forEach(function (v, i) { if (typeof v === "number" && isFinite(v)) { points.push([x(i), y(v), v]); } });
    if (points.length > 1) {
      box.appendChild(svg("polyline", { points: points.map(function (p) { return p[0].toFixed(1) + "," + p[1].toFixed(1); }).join(" "),
                                        fill: "none", stroke: "#3b528b", "stroke-width": "1.5" }));
    }
    points.forEach(function (p) {
      var dot = svg("circle", { cx: p[0].toFixed(1), cy: p[1].toFixed(1), r: "2.5", fill: "#3b528b" });
      dot.appendChild(svg("title", {}, fmt(p[2])));
      box.appendChild(dot);
    });
    if (points.length === 1) {
      box.appendChild(svg("text", { x: points[0][0] + 6, y: points[0][1] - 4, "class": "tick" }, fmt(points[0][2])));
    }
    var figure = el("figure", { "class": "trace-figure" });
    figure.appendChild(box);
    return figure;
  }

  function traceArrays(trace) {
    var n = trace.tokens ? trace.tokens.length : 0;
    return Object.keys(trace).filter(function (k) {
      return k !== "tokens" && k.indexOf("lens") !== 0 && Array.isArray(trace[k]) && trace[k].length === n &&
             typeof trace[k][0] !== "string";
    });
  }

  var LENS_TICKS = [0, 0.25, 0.5, 0.75, 1];
  function lensGrid(trace) {
    /* layers (rows, the output layer L on top) × response positions (columns); colour = the lens's probability of the
       emitted token (0 → 1, the same scale for every model); the lens's top token written where it is another one;
       the commitment layer outlined; Ω's focal depth marked on its row */
    var lens = trace.lens, layers = trace.lens_layers || [], n = (trace.tokens || []).length;
    var names = trace.lens_tokens || {};
    var last = layers.length ? layers[layers.length - 1] : 0;
    var focal = typeof trace.focal_depth === "number" ? last - trace.focal_depth : null;
    var box = el("div", { "class": "lens-scroll", tabindex: "0", "aria-label": "logit-lens grid, scrolls sideways" });
    var grid = el("div", { "class": "lens-grid", role: "grid" });
    grid.style.gridTemplateColumns = "max-content repeat(" + Math.max(n, 1) + ", minmax(3.4em, max-content))";
    grid.appendChild(el("div", { "class": "lens-corner" }, "layer ╲ token"));
    (trace.tokens || []).forEach(function (token, j) {
      grid.appendChild(el("div", { "class": "lens-head", title: "position " + j + ": " + JSON.stringify(token) }, token));
    });
    for (var row = layers.length - 1; row >= 0; row--) {
      var layer = layers[row];
      var label = layer === last ? "L = " + layer : String(layer);
      var head = el("div", { "class": "lens-layer" + (layer === focal ? " focal" : ""),
                             title: layer === focal ? "Ω's focal depth: the last " + trace.focal_depth + " blocks run after this layer" : "hidden_states index " + layer },
                    label + (layer === focal ? " ◂ Ω m=" + trace.focal_depth : ""));
      grid.appendChild(head);
      for (var j = 0; j < n; j++) {
        var p = lens.emitted_prob[row][j], top = lens.top_token[row][j], topP = lens.top_prob[row][j];
        var emittedIsTop = top === undefined || p === topP;
        var topText = names[String(top)];
        var sameText = topText !== undefined && topText === trace.tokens[j];
        var t = typeof p === "number" ? p : null;
        var cell = el("div", { "class": "lens-cell" + (lens.commit_layer && lens.commit_layer[j] === layer ? " commit" : "") +
                                        (layer === focal ? " focal" : ""),
                               "data-lens-cell": layer + "," + j, role: "gridcell",
                               title: "layer " + layer + ", position " + j + ": P(emitted " + JSON.stringify(trace.tokens[j]) + ") = " + fmt(p) +
                                      "; top " + JSON.stringify(topText === undefined ? top : topText) + " " + fmt(topP) });
        if (t !== null) { cell.style.background = viridis(t); cell.style.color = ink(t); }
        if (!emittedIsTop && !sameText) { cell.textContent = topText === undefined ? "#" + top : topText; }
        grid.appendChild(cell);
      }
    }
    box.appendChild(grid);
    var figure = el("figure", { "class": "lens-figure" });
    figure.appendChild(el("figcaption", null, "Logit lens, layer by layer (rows: hidden_states index, output layer L on top; " +
                                              "columns: response tokens). Text in a cell: the lens's top token where it is not the emitted one."));
    figure.appendChild(box);
    var key = el("p", { "class": "note lens-key" });
    key.appendChild(el("span", { "class": "lens-swatch commit" }, " "));
    key.appendChild(document.createTextNode(" commitment layer: from it up to L the top token is the emitted one" +
      (focal !== null ? "; ◂ Ω's focal depth m = " + trace.focal_depth + " (dashed row: its decoder runs the last m blocks after it)" : "")));
    figure.appendChild(key);
    return figure;
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

  function pairOf(data, label, docIndex) {
    var m = data.models.indexOf(label);
    return data.pairs.filter(function (p) { return p[0] === m && p[1] === docIndex; })[0];
  }

  function modelColumn(data, docIndex, label) {
    var column = el("div", { "class": "doc-model", "data-model": label });
    var pair = pairOf(data, label, docIndex);
    column.appendChild(el("h4", null, label));
    if (!pair) { column.appendChild(el("p", { "class": "note" }, "this model did not run this document")); return column; }
    var facts = el("dl", { "class": "facts" });
    function fact(name, value, cls) {
      facts.appendChild(el("dt", null, name));
      facts.appendChild(el("dd", cls ? { "class": cls } : null, value));
    }
    fact("response", pair[2]);
    fact(data.metric || "correct", pair[3] === null ? "—" : pair[3] ? "1 (right)" : "0 (wrong)",
         pair[3] === 1 ? "right" : pair[3] === 0 ? "wrong" : null);
    fact("confidence", fmt(pair[4]));
    data.columns.forEach(function (c, i) { if (c.name !== "confidence") { fact(c.name, fmt(pair[5][i])); } });
    column.appendChild(facts);
    if (pair[7] && data.documents[docIndex].options.length) {
      var wrap = el("div", { "class": "scroll" });
      wrap.appendChild(choiceTable(data.documents[docIndex], pair[7]));
      column.appendChild(wrap);
    }
    var slot = el("div", { "class": "trace" });
    column.appendChild(slot);
    if (!pair[6]) { slot.appendChild(el("p", { "class": "note" }, "no trace (run with probe_traces=true)")); }
    return column;
  }

  function drawTraces(data, task, docIndex, labels, columns) {
    /* both models' traces, each quantity on one scale shared by them */
    var entry = manifest[task];
    var traced = labels.some(function (label) { var p = pairOf(data, label, docIndex); return p && p[6]; });
    var block = Math.floor(docIndex / (entry.trace_documents || 1));
    var path = entry.traces ? entry.traces[block] : null;
    if (!traced || !path) { return; }
    load("LEP_TRACES", path, task + "#" + block, function (traces) {
      var found = labels.map(function (label) {
        var p = pairOf(data, label, docIndex);
        return p && p[6] && traces ? traces[data.models.indexOf(label) + ":" + data.documents[docIndex].id] || null : null;
      });
      var names = [];
      found.forEach(function (trace) {
        if (trace) { traceArrays(trace).forEach(function (k) { if (names.indexOf(k) < 0) { names.push(k); } }); }
      });
      var name = names.indexOf(state.traceName) >= 0 ? state.traceName : (names.indexOf("logprob") >= 0 ? "logprob" : names[0]);
      var scale = range(found.map(function (trace) { return trace ? trace[name] : null; }));
      var margins = range(found.map(function (trace) { return trace && trace.sequence_tokens ? trace.margin : null; }));
      found.forEach(function (trace, k) {
        var slot = columns[k].querySelector(".trace");
        if (!slot || !pair6(data, labels[k], docIndex)) { return; }
        slot.textContent = "";
        if (!trace) { slot.appendChild(el("p", { "class": "note" }, "no trace")); return; }
        if (trace.lens && trace.lens_layers) {
          slot.appendChild(el("h5", null, "Layer by layer"));
          slot.appendChild(legend("lens P(emitted token)", 0, 1, "higher (yellow): that layer already predicts the token",
                                  LENS_TICKS));
          slot.appendChild(lensGrid(trace));
        }
        slot.appendChild(el("h5", null, "Token by token"));
        var pick = el("select", { "class": "trace-name", "aria-label": "the per-token value that tints the response" });
        names.forEach(function (n) { pick.appendChild(el("option", { value: n }, n)); });
        pick.value = name;
        pick.addEventListener("change", function () { state.traceName = pick.value; render(); });
        var line = el("p", { "class": "note" }, "response tokens tinted by ");
        line.appendChild(pick);
        var meaning = TRACE_MEANING[name];
        if (meaning) { line.appendChild(document.createTextNode(" — " + meaning[0])); }
        slot.appendChild(line);
        slot.appendChild(legend(name + (meaning && meaning[1] ? " (" + meaning[1] + ")" : "") +
                                (labels.length > 1 ? ", one scale for both models" : ""), scale[0], scale[1],
                                meaning ? meaning[2] : "yellow: the highest value"));
        slot.appendChild(tokens(trace.tokens || [], trace[name], name, scale, "response"));
        slot.appendChild(plot(trace[name] || [], name, scale));
        if (trace.sequence_tokens && trace.margin) {
          var prompt = el("details", { "class": "prompt-margins" });
          prompt.appendChild(el("summary", null, "prompt tokens (and the response's inputs) tinted by stability margin"));
          prompt.appendChild(legend("stability margin" + (labels.length > 1 ? ", one scale for both models" : ""),
                                    margins[0], margins[1], "darkest: the smallest margins, the support tokens"));
          prompt.appendChild(tokens(trace.sequence_tokens, trace.margin, "margin", margins, "prompt"));
          slot.appendChild(prompt);
        }
      });
    });
  }
  function pair6(data, label, docIndex) { var p = pairOf(data, label, docIndex); return p && p[6]; }

  function splitPrompt(prompt) {
    /* the document's own question (the text after the prompt's last blank line: lm_eval's few-shot delimiter) and
       what precedes it (a description, the few-shot examples) */
    var cut = prompt.lastIndexOf("\n\n");
    if (cut < 0 || cut + 2 >= prompt.length) { return ["", prompt]; }
    return [prompt.slice(0, cut + 2), prompt.slice(cut + 2)];
  }

  function neighbour(params, step) {
    /* the previous (step −1) or next (+1) document of the current listing, by its order */
    var order = state.order || [];
    var ids = [];
    order.forEach(function (o) { if (ids.indexOf(o[1]) < 0) { ids.push(o[1]); } });
    var at = ids.indexOf(params.doc);
    var next = at < 0 ? null : ids[at + step];
    return next === undefined ? null : next;
  }

  function detail(data, params) {
    var panel = $("document-detail");
    panel.textContent = "";
    var docIndex = -1;
    data.documents.forEach(function (d, i) { if (d.id === params.doc) { docIndex = i; } });
    if (docIndex < 0) { panel.hidden = true; return; }
    panel.hidden = false;
    var doc = data.documents[docIndex];
    var title = el("h3", null, "Document " + doc.id + " ");
    var nav = el("span", { "class": "doc-nav" });
    [["previous", -1, "← previous"], ["next", 1, "next →"]].forEach(function (b) {
      var target = neighbour(params, b[1]);
      var button = el("button", { type: "button", "class": b[0], title: b[0] + " document of the list (keys " +
                                  (b[1] < 0 ? "k or ←" : "j or →") + ")" }, b[2]);
      if (target === null) { button.disabled = true; }
      button.addEventListener("click", function () { if (target !== null) { update({ doc: target }); } });
      nav.appendChild(button);
    });
    var close = el("button", { type: "button", "class": "close", title: "close (Esc)" }, "close");
    close.addEventListener("click", function () { update({ doc: "" }); });
    nav.appendChild(close);
    title.appendChild(nav);
    panel.appendChild(title);
    var parts = splitPrompt(doc.prompt);
    if (parts[0]) {
      var before = el("details", { "class": "fewshot" });
      before.appendChild(el("summary", null, "the prompt before the question (description, few-shot examples): " +
                                             parts[0].split("\n\n").length + " block(s)"));
      before.appendChild(el("pre", { "class": "prompt" }, parts[0]));
      panel.appendChild(before);
    }
    panel.appendChild(el("h4", null, parts[0] ? "Question" : "Prompt"));
    panel.appendChild(el("pre", { "class": "prompt question" }, parts[1]));
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
    var ab = sides(data, params);
    var chooser = el("p", { "class": "note" }, "side by side: ");
    [["model", ab[0]], ["b", ab[1]]].forEach(function (which) {
      if (!which[1] && which[0] === "b") { return; }
      var select = el("select", { id: "doc-side-" + which[0], "aria-label": which[0] === "model" ? "left model (A)" : "right model (B)" });
      data.models.forEach(function (m) { select.appendChild(el("option", { value: m }, m)); });
      select.value = which[1];
      select.addEventListener("change", function () { var c = {}; c[which[0]] = select.value; update(c); });
      chooser.appendChild(select);
      chooser.appendChild(document.createTextNode(" "));
    });
    panel.appendChild(chooser);
    var row = el("div", { "class": "side-by-side" });
    var labels = ab[1] ? [ab[0], ab[1]] : [ab[0]];
    var columns = labels.map(function (label) { return modelColumn(data, docIndex, label); });
    columns.forEach(function (c) { row.appendChild(c); });
    panel.appendChild(row);
    drawTraces(data, params.docs, docIndex, labels, columns);
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
  $("doc-b").addEventListener("change", function () { update({ b: $("doc-b").value }); });
  document.addEventListener("keydown", function (event) {
    /* an open document: j / → the next one of the list, k / ← the previous one, Esc closes it */
    var params = parseHash();
    if (!params || !params.doc || event.altKey || event.ctrlKey || event.metaKey) { return; }
    var target = event.target;
    if (target && (target.tagName === "INPUT" || target.tagName === "SELECT" || target.tagName === "TEXTAREA")) { return; }
    var step = event.key === "j" || event.key === "ArrowRight" ? 1 : event.key === "k" || event.key === "ArrowLeft" ? -1 : 0;
    if (target && target.classList && target.classList.contains("lens-scroll") && step) { return; }  // scrolls the grid
    if (event.key === "Escape") { update({ doc: "" }); return; }
    if (step) {
      var next = neighbour(params, step);
      if (next !== null) { event.preventDefault(); update({ doc: next }); }
    }
  });
  window.addEventListener("hashchange", function () {
    state.all = false;
    render();
    if (parseHash()) { view.scrollIntoView(); }
  });
  render();
  if (parseHash() && manifest[parseHash().docs]) { view.scrollIntoView(); }
})();
