// The API reference at /docs: drawn from this server's /openapi.json by this script alone (no CDN, no other file),
// so it works on a machine with no network. Every text from the schema is put in the page as text, never as HTML.
"use strict";

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (key === "class") node.className = value;
    else node.setAttribute(key, value);
  }
  for (const child of children) {
    if (child === null || child === undefined || child === "") continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function resolve(spec, schema) {
  let out = schema || {};
  for (let i = 0; out.$ref && i < 20; i += 1) out = spec.components.schemas[out.$ref.split("/").pop()] || {};
  return out;
}

function typeOf(spec, schema) {
  if (!schema) return "";
  if (schema.$ref) return schema.$ref.split("/").pop();
  if (schema.anyOf || schema.oneOf) return (schema.anyOf || schema.oneOf).map((s) => typeOf(spec, s)).join(" | ");
  if (schema.type === "array") return `array of ${typeOf(spec, schema.items)}`;
  if (schema.enum) return schema.enum.map((v) => JSON.stringify(v)).join(" | ");
  if (schema.const !== undefined) return JSON.stringify(schema.const);
  if (schema.type === "object" && schema.additionalProperties) return `object of ${typeOf(spec, schema.additionalProperties)}`;
  return schema.type || "any";
}

function fields(spec, schema) {
  const resolved = resolve(spec, schema);
  const required = new Set(resolved.required || []);
  const rows = Object.entries(resolved.properties || {}).map(([name, field]) => el("tr", {},
    el("td", { class: "mono" }, name), el("td", { class: "mono" }, typeOf(spec, field)),
    el("td", {}, required.has(name) ? "yes" : "no"),
    el("td", {}, field.description || resolve(spec, field).description || "",
      field.default !== undefined ? el("span", { class: "muted" }, ` (default ${JSON.stringify(field.default)})`) : null)));
  if (!rows.length) return el("p", { class: "mono" }, typeOf(spec, schema));
  return el("table", {}, el("thead", {}, el("tr", {}, ...["field", "type", "required", "what"].map((h) => el("th", {}, h)))),
    el("tbody", {}, ...rows));
}

function operation(spec, path, method, op) {
  const parts = [el("h2", {}, el("span", { class: `method ${method}` }, method.toUpperCase()), path),
    el("p", {}, el("strong", {}, op.summary || "")), el("div", { class: "description" }, op.description || "")];
  const params = op.parameters || [];
  if (params.length) {
    parts.push(el("h3", {}, "Parameters"), el("table", {},
      el("thead", {}, el("tr", {}, ...["name", "in", "type", "required", "what"].map((h) => el("th", {}, h)))),
      el("tbody", {}, ...params.map((p) => el("tr", {}, el("td", { class: "mono" }, p.name), el("td", {}, p.in),
        el("td", { class: "mono" }, typeOf(spec, p.schema)), el("td", {}, p.required ? "yes" : "no"),
        el("td", {}, p.description || (p.schema && p.schema.description) || ""))))));
  }
  const body = op.requestBody && op.requestBody.content && op.requestBody.content["application/json"];
  if (body) parts.push(el("h3", {}, `Request body: ${typeOf(spec, body.schema)}`), fields(spec, body.schema));
  parts.push(el("h3", {}, "Responses"), el("table", {}, el("tbody", {}, ...Object.entries(op.responses || {}).map(([code, r]) => {
    const json = r.content && r.content["application/json"];
    return el("tr", {}, el("td", { class: "mono" }, code), el("td", {}, r.description || ""),
      el("td", { class: "mono" }, json && json.schema ? typeOf(spec, json.schema) : ""));
  }))));
  return el("section", { class: "op", id: `${method}-${path}` }, ...parts);
}

async function start() {
  const main = document.getElementById("docs");
  try {
    const response = await fetch("/openapi.json", { headers: { accept: "application/json" } });
    if (!response.ok) throw new Error(`/openapi.json: HTTP ${response.status}`);
    const spec = await response.json();
    const ops = [];
    for (const [path, item] of Object.entries(spec.paths || {})) {
      for (const [method, op] of Object.entries(item)) ops.push([path, method, op]);
    }
    const schemas = Object.keys((spec.components || {}).schemas || {}).sort();
    main.replaceChildren(
      el("h1", {}, `${spec.info.title} ${spec.info.version}`), el("p", {}, spec.info.summary || spec.info.description || ""),
      el("nav", {}, el("ul", {}, ...ops.map(([path, method]) => el("li", {}, el("a", { href: `#${method}-${path}` }, `${method.toUpperCase()} ${path}`))))),
      ...ops.map(([path, method, op]) => operation(spec, path, method, op)),
      el("h2", {}, "Schemas"),
      ...schemas.map((name) => el("section", { class: "op", id: `schema-${name}` }, el("h2", {}, name),
        el("div", { class: "description" }, spec.components.schemas[name].description || ""), fields(spec, { $ref: `#/components/schemas/${name}` }))));
    document.body.dataset.state = "done";
  } catch (error) {
    main.replaceChildren(el("p", { class: "error" }, error.message));
    document.body.dataset.state = "error";
  }
}

start();
