// The search playground (GET /ui): plain JS, no build step, no network beyond this service's own API.
// Every document string is inserted as text (textContent, never innerHTML); highlights are rebuilt as
// text nodes and <mark> elements from the server's escaped snippets.
"use strict";

const KEY_STORAGE = "hybrid.apiKey";
const CONFIG_FIELDS = ["mode", "fusion", "alpha", "norm", "rrf_k", "hubness", "rerank", "weight", "typo", "text_fields", "boosts", "sort",
                       "pinned", "hidden"];
const CONFIG_DEFAULTS = {mode: "", fusion: "", alpha: "0.5", norm: "zscore", rrf_k: "60", hubness: "", rerank: "", weight: "1",
                         typo: "", text_fields: "", boosts: "", sort: "", pinned: "", hidden: ""};
const CHOICES = {
  mode: [["", "index default"], ["hybrid", "hybrid"], ["bm25", "BM25"], ["dense", "dense"]],
  fusion: [["", "index default"], ["rrf", "RRF"], ["cc", "convex combination"]],
  norm: [["minmax", "min-max"], ["zscore", "z-score"], ["tmm", "theoretical min-max"], ["dbsf", "DBSF"], ["none", "none"]],
  hubness: [["", "index default"], ["none", "none"], ["qbnorm", "QB-Norm"], ["qbnorm+dis", "QB-Norm (dynamic)"],
            ["dbnorm", "DBNorm"], ["dbnorm+dis", "DBNorm (dynamic)"]],
  rerank: [["", "service default"], ["on", "on"], ["off", "off"]],
  typo: [["", "index default"], ["auto", "auto"], ["0", "off"], ["1", "1 edit"], ["2", "2 edits"]],
};

const $ = (id) => document.getElementById(id);

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (name === "text") node.textContent = value;
    else if (name === "className") node.className = value;
    else node.setAttribute(name, value);
  }
  for (const child of children) node.append(child);
  return node;
}

// --- state: the URL holds it, so a view can be shared as a link ---

function readState() {
  const params = new URLSearchParams(location.search);
  const config = (prefix) => Object.fromEntries(CONFIG_FIELDS.map((f) => [f, params.get(`${prefix}.${f}`) ?? CONFIG_DEFAULTS[f]]));
  return {
    q: params.get("q") ?? "", k: params.get("k") ?? "10", page: Math.max(1, parseInt(params.get("page") ?? "1", 10) || 1),
    filter: params.get("filter") ?? "", highlight: params.get("highlight") !== "0", compare: params.get("compare") === "1",
    collection: params.get("c") ?? "",
    a: config("a"), b: config("b"),
  };
}

function writeState(state) {
  const params = new URLSearchParams();
  if (state.collection) params.set("c", state.collection);
  if (state.q) params.set("q", state.q);
  if (state.k !== "10") params.set("k", state.k);
  if (state.page > 1) params.set("page", String(state.page));
  if (state.filter.trim()) params.set("filter", state.filter);
  if (!state.highlight) params.set("highlight", "0");
  if (state.compare) params.set("compare", "1");
  for (const prefix of state.compare ? ["a", "b"] : ["a"]) {
    for (const field of CONFIG_FIELDS) {
      if (state[prefix][field] !== CONFIG_DEFAULTS[field]) params.set(`${prefix}.${field}`, state[prefix][field]);
    }
  }
  const query = params.toString();
  history.replaceState(null, "", query ? `?${query}` : location.pathname);
}

function formState(page) {
  const config = (prefix) => Object.fromEntries(CONFIG_FIELDS.map((f) => [f, $(`${prefix}-${f}`).value]));
  return {q: $("q").value, k: $("k").value, page, filter: $("filter").value, highlight: $("highlight").checked,
          collection: $("collection").value,
          compare: $("compare").checked, a: config("a"), b: config("b")};
}

// --- the configuration controls (one builder for A and B) ---

function buildConfig(prefix) {
  const box = $(`config-${prefix}`);
  const id = (field) => `${prefix}-${field}`;
  const select = (field, label) => {
    const node = el("select", {id: id(field), name: id(field)});
    for (const [value, text] of CHOICES[field]) node.append(el("option", {value, text}));
    return el("div", {className: `control control-${field}`}, el("label", {for: id(field), text: label}), node);
  };
  const range = (field, label, min, max, step) => {
    const input = el("input", {id: id(field), name: id(field), type: "range", min, max, step});
    const output = el("output", {id: id(`${field}-value`), for: id(field)});
    input.addEventListener("input", () => { output.textContent = input.value; });
    return el("div", {className: `control control-${field}`}, el("label", {for: id(field), text: label}), input, output);
  };
  const number = (field, label, min, max) => el("div", {className: `control control-${field}`},
    el("label", {for: id(field), text: label}), el("input", {id: id(field), name: id(field), type: "number", min, max, step: "any"}));
  const text = (field, label, placeholder) => el("div", {className: `control control-${field}`},
    el("label", {for: id(field), text: label}),
    el("input", {id: id(field), name: id(field), type: "text", placeholder, spellcheck: "false"}));
  box.append(select("mode", "Mode"), select("fusion", "Fusion"), range("alpha", "Dense weight (alpha)", "0", "1", "0.05"),
             select("norm", "Normalisation"), number("rrf_k", "rrf_k", "0", "100000"), select("hubness", "Hubness correction"),
             select("rerank", "Rerank"), range("weight", "Reranker weight", "0", "1", "0.05"), select("typo", "Typo tolerance"),
             text("text_fields", "Field weights (BM25)", "title=3, text=1"),
             text("boosts", "Boosts (JSON list)", '[{"field": "year", "modifier": "log1p", "weight": 0.1}]'),
             text("sort", "Sort (fields, comma-separated)", "year:desc, _score"),
             text("pinned", "Pinned ids (comma-separated)", "id1, id2"), text("hidden", "Hidden ids (comma-separated)", "id3"));
  box.addEventListener("change", () => showRelevantControls(prefix));
}

function showRelevantControls(prefix) {
  const value = (field) => $(`${prefix}-${field}`).value;
  const show = (field, visible) => { $(`${prefix}-${field}`).closest(".control").hidden = !visible; };
  const fused = value("mode") !== "bm25" && value("mode") !== "dense";
  show("fusion", fused);
  show("alpha", fused && value("fusion") === "cc");
  show("norm", fused && value("fusion") === "cc");
  show("rrf_k", fused && value("fusion") === "rrf");
  show("hubness", value("mode") !== "bm25");
  show("weight", value("rerank") === "on");
  show("typo", value("mode") !== "dense");
  show("text_fields", value("mode") !== "dense");
}

function fillForm(state) {
  $("q").value = state.q;
  $("k").value = state.k;
  $("filter").value = state.filter;
  $("highlight").checked = state.highlight;
  $("compare").checked = state.compare;
  if (state.filter.trim()) $("filter-box").open = true;
  for (const prefix of ["a", "b"]) {
    for (const field of CONFIG_FIELDS) $(`${prefix}-${field}`).value = state[prefix][field];
    for (const field of ["alpha", "weight"]) $(`${prefix}-${field}-value`).textContent = state[prefix][field];
    showRelevantControls(prefix);
  }
  showCompare(state.compare);
}

function showCompare(on) {
  $("config-b").hidden = !on;
  $("column-b").hidden = !on;
  $("columns").classList.toggle("comparing", on);
}

// --- requests ---

function requestBody(state, config) {
  const body = {query: state.q, k: parseInt(state.k, 10), offset: (state.page - 1) * parseInt(state.k, 10), explain: true,
                include_text: true};
  if (config.mode) body.mode = config.mode;
  if (config.mode !== "bm25" && config.mode !== "dense") {
    if (config.fusion === "cc") body.fusion = {method: "cc", alpha: Number(config.alpha), norm: config.norm};
    if (config.fusion === "rrf") body.fusion = {method: "rrf", rrf_k: Number(config.rrf_k)};
  }
  if (config.hubness && config.mode !== "bm25") {
    const [method, dynamic] = config.hubness.split("+");
    body.hubness = {method, dynamic: dynamic === "dis"};
  }
  if (config.rerank === "on") body.rerank = {enabled: true, weight: Number(config.weight)};
  if (config.rerank === "off") body.rerank = {enabled: false};
  if (config.typo && config.mode !== "dense") body.typo = config.typo === "auto" ? "auto" : Number(config.typo);
  if (config.boosts.trim()) body.boosts = parseJson("Boosts", config.boosts);
  const list = (text) => text.split(",").map((item) => item.trim()).filter(Boolean);
  if (list(config.text_fields).length && config.mode !== "dense") {
    body.text_fields = Object.fromEntries(list(config.text_fields).map((pair) => {
      const [name, weight] = pair.split("=").map((part) => part.trim());
      return [name, weight === undefined ? 1 : Number(weight)];
    }));
  }
  if (list(config.sort).length) body.sort = list(config.sort);
  if (list(config.pinned).length) body.pinned = list(config.pinned);
  if (list(config.hidden).length) body.hidden = list(config.hidden);
  if (state.filter.trim()) body.filter = parseJson("The filter", state.filter);
  if (state.highlight) body.highlight = true;
  return body;
}

function parseJson(what, text) {
  try {
    return JSON.parse(text);
  } catch (error) {
    throw new SyntaxError(`${what} is not valid JSON: ${error.message}`);
  }
}

function headers() {
  const h = {"content-type": "application/json"};
  const key = sessionStorage.getItem(KEY_STORAGE);
  if (key) h["X-API-Key"] = key;
  return h;
}

class RequestError extends Error {
  constructor(status, message) { super(message); this.status = status; }
}

// the picked collection's search route ("" picks the default collection, which the unprefixed route serves)
function searchPath() {
  const name = $("collection").value;
  return name ? `/collections/${encodeURIComponent(name)}/search` : "/search";
}

async function post(body) {
  const response = await fetch(searchPath(), {method: "POST", headers: headers(), body: JSON.stringify(body)});
  const payload = await response.json().catch(() => ({}));
  if (!response.ok) throw new RequestError(response.status, describeError(response, payload));
  return payload;
}

function describeError(response, payload) {
  const detail = payload.detail;
  if (response.status === 401 || response.status === 403) {
    return `${response.status}: ${typeof detail === "string" ? detail : "this service needs an API key"}. Enter a valid key under "API key".`;
  }
  if (response.status === 422 && Array.isArray(detail)) {
    return "422, the request is invalid: " + detail.map((d) => `${(d.loc || []).join(".")}: ${d.msg}`).join("; ");
  }
  if (response.status === 503) {
    const retry = response.headers.get("Retry-After");
    return `503, the service is busy or loading${retry ? `: retry in ${retry} s` : ""}. ${typeof detail === "string" ? detail : ""}`;
  }
  return `${response.status}: ${typeof detail === "string" ? detail : JSON.stringify(detail ?? payload)}`;
}

function curlFor(body) {
  const json = JSON.stringify(body).replaceAll("'", "'\\''");
  const key = sessionStorage.getItem(KEY_STORAGE) ? " -H \"X-API-Key: $HYBRID_API_KEY\"" : "";
  return `curl -s ${location.origin}${searchPath()} -H 'content-type: application/json'${key} -d '${json}'`;
}

// --- rendering ---

const ENTITIES = {"&lt;": "<", "&gt;": ">", "&amp;": "&", "&quot;": "\"", "&#x27;": "'", "&#39;": "'"};

function unescapeHtml(text) {
  return text.replace(/&(lt|gt|amp|quot|#x27|#39);/g, (entity) => ENTITIES[entity]);
}

// The server's snippet is escaped text with <mark> tags: split on the tags, insert the pieces as text.
function highlighted(snippet) {
  const node = el("span", {className: "snippet"});
  let marked = false;
  for (const piece of snippet.split(/(<mark>|<\/mark>)/)) {
    if (piece === "<mark>") marked = true;
    else if (piece === "</mark>") marked = false;
    else if (piece) node.append(marked ? el("mark", {text: unescapeHtml(piece)}) : document.createTextNode(unescapeHtml(piece)));
  }
  return node;
}

function snippetOf(hit) {
  const text = hit.highlight?.text?.[0];
  if (text) return highlighted(text.text);
  const plain = hit.text ?? "";
  return el("span", {className: "snippet", text: plain.length > 240 ? `${plain.slice(0, 240)}…` : plain});
}

function titleOf(hit) {
  const title = hit.highlight?.title?.[0];
  return title && title.matches.length ? highlighted(title.text) : document.createTextNode(hit.title || "(untitled)");
}

let panelCount = 0;
const fmt = (value) => (value === null || value === undefined ? "–" : Number(value).toFixed(4));

function bar(label, value, scale, detail, kind) {
  const width = scale > 0 ? Math.min(100, (Math.abs(value) / scale) * 100) : 0;
  const fill = el("span", {className: `bar-fill bar-${kind}`});
  fill.style.width = `${width}%`;
  return el("div", {className: "bar-row", "data-component": kind},
    el("span", {className: "bar-label", text: label}),
    el("span", {className: "bar-track"}, fill),
    el("span", {className: "bar-value", "data-value": String(value), text: fmt(value)}),
    el("span", {className: "bar-detail", text: detail}));
}

function explainPanel(hit) {
  const explain = hit.explain;
  const panel = el("div", {className: "explain", id: `explain-${++panelCount}`});
  if (!explain) {
    panel.append(el("p", {text: `Score ${fmt(hit.score)}: one retriever ranked this hit (nothing was fused, reranked or boosted).`}));
    return panel;
  }
  if (explain.bm25 && explain.dense) {
    const scale = Math.abs(explain.bm25.contribution) + Math.abs(explain.dense.contribution);
    const detail = (c) => `raw ${fmt(c.score)}, rank ${c.rank ?? "outside the top"}${c.normalized === null ? "" : `, normalised ${fmt(c.normalized)}`}`;
    panel.append(el("p", {className: "explain-title", text: `Fused score ${fmt(explain.fused)} = BM25 + dense contributions`}),
                 bar("BM25", explain.bm25.contribution, scale, detail(explain.bm25), "bm25"),
                 bar("Dense", explain.dense.contribution, scale, detail(explain.dense), "dense"));
  }
  if (explain.pinned) panel.append(el("p", {className: "explain-title", text: `Pinned: ${explain.pinned} of the curated documents`}));
  if (explain.boosted) {
    const b = explain.boosted;
    const scale = Math.max(Math.abs(b.base), ...b.boosts.map((x) => Math.abs(x.contribution)));
    panel.append(el("p", {className: "explain-title", text: `Final ${fmt(explain.final)} = score ${fmt(b.base)} + boosts (${b.mode})`}),
                 bar("Score", b.base, scale, "before boosts", "base"),
                 ...b.boosts.map((x) => bar(x.filter ? "Filter boost" : `${x.decay ?? "Boost"} ${x.field ?? ""}`.trim(), x.contribution, scale,
                                            `value ${fmt(x.value)} × weight ${x.weight}`, "boost")));
  }
  if (explain.rerank) {
    const r = explain.rerank;
    panel.append(el("p", {className: "explain-title",
                          text: `Reranked: final ${fmt(explain.final)}; first-stage rank ${r.first_stage_rank} (score ${fmt(r.first_stage_score)})`}),
                 bar("Reranker share", r.weight, 1, `cross-encoder logit ${fmt(r.score)}`, "rerank"),
                 bar("First-stage share", 1 - r.weight, 1, `score ${fmt(r.first_stage_score)}`, "first-stage"));
  }
  return panel;
}

function renderHits(column, data, other) {
  column.replaceChildren();
  if (!data.hits.length) {
    column.append(el("p", {className: "empty", text: "No results."}));
    return;
  }
  const otherRank = other ? new Map(other.hits.map((h) => [h.id, h.rank])) : null;
  const list = el("ol", {className: "hits", start: String(data.hits[0].rank)});
  for (const hit of data.hits) {
    const item = el("li", {className: "hit", "data-id": hit.id, "data-rank": String(hit.rank)});
    const head = el("div", {className: "hit-head"},
      el("span", {className: "rank", text: `#${hit.rank}`}),
      el("span", {className: "title"}, titleOf(hit)),
      el("span", {className: "score", "data-score": String(hit.score), text: fmt(hit.score)}));
    const meta = el("div", {className: "hit-meta"}, el("span", {className: "doc-id", text: `id ${hit.id}`}));
    const stage = hit.explain?.rerank?.first_stage_rank;
    if (stage !== undefined) meta.append(el("span", {className: "first-stage", text: `first stage #${stage}`}));
    if (otherRank) meta.append(rankChange(hit, otherRank));
    const panel = explainPanel(hit);
    panel.hidden = true;
    const toggle = el("button", {type: "button", className: "explain-toggle", "aria-expanded": "false", "aria-controls": panel.id,
                                 text: "Explain score"});
    toggle.addEventListener("click", () => {
      panel.hidden = !panel.hidden;
      toggle.setAttribute("aria-expanded", String(!panel.hidden));
      drawLinks();
    });
    item.append(head, meta, snippetOf(hit), toggle, panel);
    list.append(item);
  }
  column.append(el("p", {className: "column-head", text: describeSpec(data)}), list);
}

function rankChange(hit, otherRank) {
  const before = otherRank.get(hit.id);
  if (before === undefined) return el("span", {className: "change change-new", text: "only here"});
  const delta = before - hit.rank;
  if (delta === 0) return el("span", {className: "change", text: "same rank"});
  return el("span", {className: `change ${delta > 0 ? "change-up" : "change-down"}`,
                     text: `${delta > 0 ? "▲" : "▼"}${Math.abs(delta)} (was #${before})`});
}

function describeSpec(data) {
  const spec = data.spec;
  const parts = [spec.mode];
  if (spec.mode === "hybrid") {
    const f = spec.fusion;
    parts.push(f.method === "cc" ? `cc ${f.norm} alpha ${f.alpha}` : `rrf k=${f.rrf_k}`);
  }
  if (spec.hubness && spec.hubness.method !== "none") parts.push(`${spec.hubness.method}${spec.hubness.dynamic ? " (dynamic)" : ""}`);
  if (spec.rerank?.enabled) parts.push(`reranked, weight ${spec.rerank.weight}`);
  if (spec.mode !== "dense" && spec.typo !== "auto") parts.push(spec.typo ? `typos within ${spec.typo}` : "no typo tolerance");
  if (spec.text_fields && spec.mode !== "dense") {
    parts.push(`fields ${Object.entries(spec.text_fields).filter(([, w]) => w > 0).map(([f, w]) => `${f}×${w}`).join(" ")}`);
  }
  if (spec.boosts?.length) parts.push(`${spec.boosts.length} boost${spec.boosts.length > 1 ? "s" : ""} (${spec.boost_mode})`);
  if (spec.sort?.length) parts.push(`sorted by ${spec.sort.map((key) => `${key.field} ${key.order}`).join(", ")}`);
  const pinned = data.hits.filter((h) => h.explain?.pinned).length;
  if (pinned) parts.push(`${pinned} pinned`);
  for (const [term, variants] of Object.entries(data.typos ?? {})) {
    parts.push(`${term} → ${variants.length ? variants.map((v) => v.term).join(", ") : "nothing near"}`);
  }
  return parts.join(" · ");
}

function drawLinks() {
  const svg = $("links");
  svg.replaceChildren();
  if (!$("columns").classList.contains("comparing") || getComputedStyle(svg).display === "none") return;
  const box = svg.getBoundingClientRect();
  const right = new Map([...$("column-b").querySelectorAll(".hit")].map((item) => [item.dataset.id, item]));
  for (const left of $("column-a").querySelectorAll(".hit")) {
    const match = right.get(left.dataset.id);
    if (!match) continue;
    const a = left.querySelector(".hit-head").getBoundingClientRect();
    const b = match.querySelector(".hit-head").getBoundingClientRect();
    const line = document.createElementNS("http://www.w3.org/2000/svg", "line");
    line.setAttribute("x1", "0");
    line.setAttribute("y1", String(a.top + a.height / 2 - box.top));
    line.setAttribute("x2", String(box.width));
    line.setAttribute("y2", String(b.top + b.height / 2 - box.top));
    line.setAttribute("data-id", left.dataset.id);
    line.setAttribute("class", left.dataset.rank === match.dataset.rank ? "link same" : "link moved");
    svg.append(line);
  }
}

function renderTimings(results) {
  const table = el("table", {className: "timings"});
  const stages = [...new Set(results.flatMap(({data}) => Object.keys(data.timings_ms)))];
  table.append(el("thead", {}, el("tr", {}, el("th", {scope: "col", text: "stage"}),
    ...results.map(({name}) => el("th", {scope: "col", text: `${name} (ms)`})))));
  const body = el("tbody");
  for (const stage of stages) {
    body.append(el("tr", {}, el("th", {scope: "row", text: stage}),
      ...results.map(({data}) => el("td", {text: stage in data.timings_ms ? data.timings_ms[stage].toFixed(2) : "–"}))));
  }
  table.append(body);
  $("timings").replaceChildren(table);
}

function message(text) {
  const box = $("message");
  box.textContent = text;
  box.hidden = !text;
}

// --- the search itself ---

async function search(page = 1) {
  const state = formState(page);
  writeState(state);
  if (!state.q.trim()) {
    message("Type a query to search.");
    return;
  }
  let bodies;
  try {
    bodies = (state.compare ? ["a", "b"] : ["a"]).map((prefix) => requestBody(state, state[prefix]));
  } catch (error) {
    message(error.message);
    if (error.message.startsWith("The filter")) $("filter-box").open = true;
    return;
  }
  message("");
  document.body.classList.add("busy");
  const ticket = ++searchTicket;
  try {
    const results = await Promise.all(bodies.map(post));
    if (ticket !== searchTicket) return;  // a newer search was sent meanwhile: its answer is the one to show
    const [a, b] = results;
    renderHits($("column-a"), a, b);
    if (b) renderHits($("column-b"), b, a);
    const overlap = b ? a.hits.filter((h) => b.hits.some((o) => o.id === h.id)).length : 0;
    $("overlap").hidden = !b;
    $("overlap").textContent = b ? `Overlap: ${overlap} of ${Math.max(a.hits.length, b.hits.length)} hits appear in both lists.` : "";
    $("pager").hidden = false;
    $("page-label").textContent = `Page ${page}`;
    $("prev").disabled = page <= 1;
    $("next").disabled = !results.some((r) => r.has_more);
    $("details").hidden = false;
    renderTimings(results.map((data, i) => ({name: i ? "B" : "A", data})));
    $("curl").value = bodies.map(curlFor).join("\n");
    currentPage = page;
    requestAnimationFrame(drawLinks);
  } catch (error) {
    if (ticket !== searchTicket) return;
    if (error.status === 401 || error.status === 403) {
      $("key-box").open = true;
      $("api-key").focus();
    }
    message(error instanceof RequestError ? error.message : `The request failed: ${error.message}`);
  } finally {
    if (ticket === searchTicket) document.body.classList.remove("busy");
  }
}

let currentPage = 1;
let searchTicket = 0;

// the collections (and aliases) this key may search, for the picker; the default collection stays first
async function loadCollections(picked) {
  const select = $("collection");
  try {
    const [collections, aliases] = await Promise.all(["/collections", "/aliases"].map(async (path) => {
      const response = await fetch(path, {headers: headers()});
      if (!response.ok) throw new RequestError(response.status, describeError(response, await response.json().catch(() => ({}))));
      return response.json();
    }));
    const names = [...collections.collections.map((c) => [c.name, `${c.name} (${c.documents.toLocaleString()} documents)`]),
                   ...Object.entries(aliases.aliases).map(([alias, target]) => [alias, `${alias} → ${target}`])];
    select.replaceChildren(el("option", {value: "", text: "default collection"}),
                           ...names.map(([value, text]) => el("option", {value, text})));
  } catch {
    select.replaceChildren(el("option", {value: "", text: "default collection"}));  // e.g. a key is needed to list them
  }
  if (picked && ![...select.options].some((option) => option.value === picked)) select.append(el("option", {value: picked, text: picked}));
  select.value = picked ?? "";
}

async function loadSummary() {
  const name = $("collection").value;
  try {
    const response = await fetch(name ? `/collections/${encodeURIComponent(name)}` : "/ready", {headers: headers()});
    const ready = await response.json();
    if (!response.ok) throw new Error(typeof ready.detail === "string" ? ready.detail : `${response.status}`);
    if (name) {
      ready.model = ready.settings?.embedder?.model;  // a collection's description: GET /collections/{name}
    } else if (!ready.ready) {
      throw new Error("the index is not loaded yet");
    } else if (ready.documents == null) {
      $("summary").textContent = `${ready.collections} collections; no default collection: pick one`;
      return;
    }
    const fusion = ready.defaults?.fusion ?? {};
    const tuned = ready.fusion_tuning;
    const parts = [`${ready.documents.toLocaleString()} documents`, `model ${ready.model ?? "?"}`,
                   `default ${ready.defaults?.mode ?? "hybrid"} ${fusion.method === "cc" ? `cc ${fusion.norm} alpha ${fusion.alpha}` : `rrf k=${fusion.rrf_k}`}`];
    parts.push(tuningSummary(tuned));
    if (ready.created_at) parts.push(`built ${ready.created_at}`);
    $("summary").textContent = parts.join(" · ");
  } catch (error) {
    $("summary").textContent = `Index summary unavailable: ${error.message}`;
  }
}

// The served default's own figure (hybrid tune records it as `value`); a sweep's in-sample best only labelled as such.
function tuningSummary(tuned) {
  if (!tuned) return "fusion not tuned";
  const split = `${tuned.queries} queries of ${tuned.qrels.split("/").slice(-3).join("/")}`;
  const when = tuned.tuned_at ? ` at ${tuned.tuned_at}` : "";
  if (tuned.decision === "tuned") return `fusion tuned on ${split} (${tuned.metric} ${tuned.value} cross-validated)${when}`;
  if (tuned.decision) {
    return `untuned default kept on ${split} (${tuned.metric} ${tuned.value}; ` +
           `the tuned candidate's ${tuned.best_in_sample} was in-sample, rejected)${when}`;
  }
  return `fusion tuned on ${split} (${tuned.metric} ${tuned.value}, the sweep's best in-sample)${when}`;
}

function start() {
  buildConfig("a");
  buildConfig("b");
  const state = readState();
  fillForm(state);
  const key = $("api-key");
  key.value = sessionStorage.getItem(KEY_STORAGE) ?? "";
  key.addEventListener("change", () => {
    if (key.value) sessionStorage.setItem(KEY_STORAGE, key.value);
    else sessionStorage.removeItem(KEY_STORAGE);
  });
  $("search-form").addEventListener("submit", (event) => { event.preventDefault(); search(1); });
  $("compare").addEventListener("change", () => { showCompare($("compare").checked); if ($("q").value.trim()) search(1); });
  $("prev").addEventListener("click", () => search(Math.max(1, currentPage - 1)));
  $("next").addEventListener("click", () => search(currentPage + 1));
  $("copy-curl").addEventListener("click", async () => {
    try {
      await navigator.clipboard.writeText($("curl").value);
      message("Copied the curl command.");
    } catch {
      $("curl").select();
      message("Select-all done: copy the command with Ctrl+C.");
    }
  });
  window.addEventListener("resize", () => requestAnimationFrame(drawLinks));
  $("collection").addEventListener("change", () => { loadSummary(); if ($("q").value.trim()) search(1); });
  key.addEventListener("change", () => loadCollections($("collection").value));
  loadCollections(state.collection).then(() => {
    loadSummary();
    if (state.q.trim()) search(state.page);
  });
}

document.addEventListener("DOMContentLoaded", start);
