// The retrieval-test page: runs POST /v1/lookup with one or two setting sets and shows what came back.
// Everything from the knowledge base or the query is put in the page as text (textContent, text nodes), never as
// HTML: a document holding "<script>" shows the tag.
"use strict";

const FIELDS = [
  // name, label, kind, B's default ("" keeps the server's value)
  ["top_k", "top_k", "number", ""],
  ["max_evidence_blocks", "max blocks", "number", ""],
  ["evidence_threshold", "evidence threshold", "number", ""],
  ["reference_threshold", "reference threshold", "number", ""],
  ["document_ranking", "document ranking", "bool", "off"],
  ["lexical_enabled", "BM25", "bool", ""],
  ["context_budget_tokens", "budget tokens", "number", ""],
];

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (key === "class") node.className = value;
    else node.setAttribute(key, value);
  }
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function fmt(value) {
  if (value === null || value === undefined || value === "") return "–";
  if (typeof value === "number") return Number.isInteger(value) ? String(value) : value.toFixed(3);
  if (typeof value === "boolean") return value ? "yes" : "no";
  return String(value);
}

function pairs(object) {
  return Object.entries(object || {}).map(([k, v]) => `${k} ${fmt(v)}`).join(", ") || "–";
}

function table(headers, rows) {
  return el("table", {},
    el("thead", {}, el("tr", {}, ...headers.map((h) => el("th", {}, h)))),
    el("tbody", {}, ...rows.map((row) => el("tr", {}, ...row.map((cell) => el("td", {}, fmt(cell)))))));
}

function buildSet(fieldset, prefix, params, useDefaults) {
  for (const [name, label, kind, bDefault] of FIELDS) {
    const id = `${prefix}-${name}`;
    const given = params.get(`${prefix}.${name}`) ?? (useDefaults ? bDefault : "");
    let input;
    if (kind === "bool") {
      input = el("select", { id, name });
      for (const option of ["", "on", "off"]) input.append(el("option", { value: option }, option || "server"));
      input.value = given;
    } else {
      input = el("input", { id, name, type: "number", step: "any", min: "0", placeholder: "server" });
      input.value = given;
    }
    fieldset.append(el("label", {}, `${label} `, input));
  }
}

function readSet(prefix) {
  const settings = {};
  for (const [name, , kind] of FIELDS) {
    const value = document.getElementById(`${prefix}-${name}`).value;
    if (value === "") continue;
    settings[name] = kind === "bool" ? value === "on" : Number(value);
  }
  return settings;
}

function headers() {
  const out = { "content-type": "application/json", accept: "application/json" };
  const token = document.getElementById("token").value;
  if (token) out.authorization = `Bearer ${token}`;
  return out;
}

async function lookup(query, settings) {
  // The page's own route: the /v1/lookup JSON ("result") and the terminal's words for it ("view").
  const response = await fetch("/page/lookup", { method: "POST", headers: headers(), body: JSON.stringify({ query, settings }) });
  const body = await response.json().catch(() => ({ error: `HTTP ${response.status}` }));
  if (!response.ok) throw new Error(body.error || `HTTP ${response.status}`);
  return body;
}

const PACK_CLASS = { "in pack": "in-pack", "cut": "cut", "left out": "left-out" };

function scroll(child) {
  return el("div", { class: "scroll" }, child);
}

function renderBlocks(result, view) {
  const box = el("div", { class: "blocks" });
  result.evidenceBlocks.forEach((block, i) => {
    const words = view.blocks[i];
    const sections = words.sections.map((s) => el("li", { title: s.breadcrumb },
      el("span", { class: "heading" }, s.heading), el("span", { class: "muted" }, ` — ${s.why}`)));
    box.append(el("div", { class: `block ${PACK_CLASS[words.pack]}`, "data-source": block.source, "data-pack": words.pack },
      el("div", { class: "title" }, `[${i + 1}] ${block.title || block.source} `,
        el("span", { class: `pack ${PACK_CLASS[words.pack]}` }, words.pack)),
      el("div", { class: "source" }, block.source),
      el("div", { class: "muted" }, `breadcrumb: ${block.breadcrumb || "–"} · category ${fmt(block.category)} · ${block.retrievalLayer}`),
      el("div", {}, `relevance ${words.relevance} · score ${fmt(block.score)}`),
      el("div", { class: "why" }, "why: ", el("span", {}, words.why)),
      sections.length ? el("div", { class: "sections" }, "matched sections:", el("ul", {}, ...sections),
        words.sectionsNotMatched ? el("div", { class: "muted" }, `${words.sectionsNotMatched} section(s) not matched`) : null) : null,
      el("details", {}, el("summary", {}, "hit reason codes"), ...block.hitReasons.map((r) => el("span", { class: "reason" }, r))),
      el("details", {}, el("summary", {}, "content"), el("pre", { class: "content" }, block.content))));
  });
  if (!result.evidenceBlocks.length) {
    box.append(el("p", { class: "muted" }, "no evidence block"));
    if (view.nearMisses.length) {
      box.append(el("div", { class: "near-misses" },
        ...view.notFound.map((line) => el("p", { class: "not-found" }, line)),
        scroll(table(["nearest misses", "title", "similarity", "evidence score", "threshold"],
          view.nearMisses.map((m) => [m.source, m.title, m.similarity, m.evidenceScore, m.threshold])))));
    }
  }
  return box;
}

function renderResult(column, label, settings, answer) {
  const { result, view } = answer;
  const t = result.queryTransform;
  const trace = result.retrievalTrace;
  column.replaceChildren(
    el("h2", {}, `${label} `, el("span", { class: "muted mono" }, JSON.stringify(settings))),
    el("p", { class: "summary" },
      el("strong", {}, result.found ? "found" : "not found"),
      ` · ${result.evidenceStatus} · relevance ${result.relevanceLevel} · layer ${result.retrievalLayer} · `,
      el("span", { class: "timing" }, `${fmt(result.elapsedMs)} ms`)),
    el("p", { class: "muted" }, result.message,
      ...(result.found ? [el("br"), `completeness: ${view.completeness}`] : []),
      ...(view.confidence ? [el("br"), `confidence: ${view.confidence}`] : [])),
    el("p", { class: "muted" }, `query as searched: ${t.normalizedQuery}`,
      el("br"), `filter: ${t.categoryFilter || "none"} (${t.filterReason})`,
      el("br"), `L0 hints: keywords ${t.hints.matchedKeywords.join(", ") || "–"}; domains ${t.hints.domains.join(", ") || "–"}; titles ${t.hints.matchedTitles.join(", ") || "–"}`,
      ...(t.notes.length ? [el("br"), `notes: ${t.notes.join("; ")}`] : [])),
    el("h3", {}, "Evidence blocks"),
    renderBlocks(result, view),
    el("h3", {}, "Attempts"),
    el("p", { class: "muted" }, `selected attempt ${fmt(trace.selectedAttempt)} · fallback ${fmt(trace.fallbackReason)} · path served ${fmt(trace.pathServed)}`),
    scroll(table(["#", "filtered", "filter", "path", "path fallback", "lexical", "candidates", "BM25 added", "evidence", "top sim", "threshold", "outcome", "error", "ms"],
      trace.attempts.map((a) => [a.attempt, a.filtered, a.filterExpr || a.categoryFilter, a.path, a.pathFallbackReason,
        a.lexicalMode, a.candidateCount, a.lexicalAdded, a.evidenceCount, a.topSimilarity, a.evidenceThreshold, a.outcome, a.error, a.elapsedMs]))),
    el("h3", {}, "Rerank contributions and document-ranking signals"),
    scroll(table(["rank", "source", "base", "boosts", "ranking signals", "final"],
      result.rerankTrace.entries.map((e) => [e.rank, e.source, e.baseScore, pairs(e.boosts), pairs(e.ranking), e.finalScore]))),
    el("h3", {}, "Stages (ms)"),
    el("p", { class: "mono" }, pairs(result.stageMs)));
}

async function refreshTraces() {
  const box = document.getElementById("traces");
  try {
    const response = await fetch("/v1/traces?limit=10", { headers: headers() });
    const body = await response.json();
    if (!response.ok) throw new Error(body.error || `HTTP ${response.status}`);
    box.replaceChildren(scroll(table(["id", "time", "ms", "status", "layer", "relevance", "fallback", "query", "evidence"],
      body.rows.map((r) => [r.id, r.created_at, r.duration_ms, r.evidence_status, r.retrieval_layer,
        r.retrieval_details.relevance_level, r.retrieval_details.fallback_reason, r.query,
        (r.retrieval_details.evidence_blocks || []).map((b) => b.source).join(", ")]))));
  } catch (error) {
    box.replaceChildren(el("p", { class: "error" }, `traces: ${error.message}`));
  }
}

async function run() {
  const query = document.getElementById("query").value;
  const compare = document.getElementById("compare").checked;
  const status = document.getElementById("status");
  const columns = [["A", "set-a", document.getElementById("result-a")]];
  if (compare) columns.push(["B", "set-b", document.getElementById("result-b")]);
  document.getElementById("result-b").hidden = !compare;
  status.textContent = "looking up…";
  document.body.dataset.state = "running";
  await Promise.all(columns.map(async ([label, prefix, column]) => {
    const settings = readSet(prefix.slice(-1));
    try {
      renderResult(column, label, settings, await lookup(query, settings));
    } catch (error) {
      column.replaceChildren(el("h2", {}, label), el("p", { class: "error" }, error.message));
    }
  }));
  status.textContent = "";
  await refreshTraces();
  document.body.dataset.state = "done";
}

function start() {
  const params = new URLSearchParams(location.search);
  buildSet(document.getElementById("set-a"), "a", params, false);
  buildSet(document.getElementById("set-b"), "b", params, true);
  const token = document.getElementById("token");
  token.value = sessionStorage.getItem("kb-token") || "";
  token.addEventListener("change", () => sessionStorage.setItem("kb-token", token.value));
  document.getElementById("compare").checked = params.get("b") === "1";
  document.getElementById("query-form").addEventListener("submit", (event) => { event.preventDefault(); run(); });
  document.getElementById("refresh-traces").addEventListener("click", refreshTraces);
  if (params.get("q")) {
    document.getElementById("query").value = params.get("q");
    run();
  } else {
    refreshTraces();
  }
}

start();
