/**
 * The viewer's single page: an HTML shell, a stylesheet (`/app.css`) and a script (`/app.js`)
 * over `/api/*`, routed by the URL's hash (`#/`, `#/run/<id>`, `#/rollout/<id>/<line>`,
 * `#/compare/<a>/<b>`). No build step: the three are strings here, so the single binary
 * carries them.
 *
 * Run files may be written by untrusted environment code, so the script builds every node
 * with `createElement` and puts every value from a file, the API or the URL into the page as
 * text (`textContent`, `setAttribute`, `style.height` from a checked number); nothing from
 * data ever reaches `innerHTML`. The server's Content-Security-Policy forbids inline script and
 * inline style on top of that, so a field missed here still cannot execute.
 * @module
 */

/** The page `vf view` serves at `/`: no inline script or style. */
export const VIEW_PAGE: string = `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>vf view</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="stylesheet" href="/app.css">
<script src="/app.js" defer></script>
</head>
<body><header><a href="#/">vf view</a><span id="where" class="muted"></span></header>
<main id="app"><p class="muted">Loading…</p></main>
</body></html>
`;

/** The page's stylesheet, served at `/app.css`. */
export const VIEW_STYLE: string = `
body{font:14px/1.45 system-ui,sans-serif;margin:0;color:#1d2330;background:#f6f7f9}
header{background:#1d2330;color:#fff;padding:10px 18px;display:flex;gap:18px;align-items:center}
header a{color:#fff;text-decoration:none;font-weight:600}
main{padding:16px 18px;max-width:1300px}
table{border-collapse:collapse;width:100%;background:#fff}
th,td{border-bottom:1px solid #e3e6ea;padding:5px 8px;text-align:left;vertical-align:top}
th{background:#eef0f3;font-weight:600}
td{overflow-wrap:anywhere}
table.fixed{table-layout:fixed}
col.c-tool{width:12%}col.c-exit{width:6%}
tr.link{cursor:pointer} tr.link:hover{background:#f0f5ff}
.err{color:#b42318}.ok{color:#067647}.muted{color:#667085}
.cards{display:flex;gap:12px;flex-wrap:wrap;margin:10px 0}
.card{background:#fff;border:1px solid #e3e6ea;border-radius:6px;padding:8px 12px;min-width:110px}
.card b{display:block;font-size:18px;overflow-wrap:anywhere}
.histwrap{background:#fff;border:1px solid #e3e6ea;padding:6px 6px 2px 40px;margin:10px 0;position:relative}
.hist{display:flex;align-items:flex-end;gap:3px;height:90px;border-left:1px solid #98a2b3;border-bottom:1px solid #98a2b3}
.hist div{flex:1;background:#4f7cff;min-height:1px}
.hist-y{position:absolute;left:4px;top:6px;height:90px;display:flex;flex-direction:column;justify-content:space-between;font-size:11px;color:#667085;text-align:right;width:30px}
.hist-x{display:flex;justify-content:space-between;font-size:11px;color:#667085;margin-left:-8px;margin-right:-8px}
.hist-x span{width:16px;text-align:center}
.hist-title{font-size:11px;color:#667085;text-align:center}
.filters{display:flex;gap:8px;flex-wrap:wrap;margin:8px 0}
.msg{background:#fff;border:1px solid #e3e6ea;border-radius:6px;margin:8px 0;padding:8px 10px}
.msg .role{font-weight:600;text-transform:uppercase;font-size:12px;color:#475467}
pre{white-space:pre-wrap;overflow-wrap:anywhere;word-break:break-word;margin:4px 0;font:12px/1.4 ui-monospace,monospace}
.call{background:#f4f6fb;border-left:3px solid #4f7cff;padding:4px 8px;margin:4px 0}
.box{background:#fff;border:1px solid #e3e6ea;border-radius:6px;padding:8px 10px;margin:10px 0}
.corrupt{background:#fff4f2;border:1px solid #f3b8ad}
`;

/** The page's script, served at `/app.js`. Plain browser JavaScript (no build step). */
export const VIEW_SCRIPT: string = String.raw`"use strict";
(() => {
const app = document.getElementById("app");

// Any value, whatever its type, as text: strings as they are, other values as JSON.
function txt(v) {
  if (v === null || v === undefined) return "";
  if (typeof v === "string") return v;
  if (typeof v === "number" || typeof v === "boolean") return String(v);
  try { return JSON.stringify(v); } catch { return String(v); }
}
const isNum = (x) => typeof x === "number" && Number.isFinite(x);
// A number with d decimals; a value that is not a number is shown as the text it is.
const num = (x, d = 3) => isNum(x) ? x.toFixed(d) : (x === null || x === undefined ? "–" : txt(x));
const int = (x) => isNum(x) ? String(x) : (x === null || x === undefined ? "–" : txt(x));
const isObj = (x) => x !== null && typeof x === "object" && !Array.isArray(x);

// h(tag, attrs, ...children): an element. Children are nodes, arrays of children, or values
// (shown as text). Attributes are set with setAttribute (values as text) except "class",
// "on<event>" (a function) and "height" (a percentage from a finite number).
function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k.startsWith("on") && typeof v === "function") el.addEventListener(k.slice(2), v);
    else if (k === "class") el.className = txt(v);
    else if (k === "height") { if (isNum(v)) el.style.height = Math.max(0, Math.min(100, v)) + "%"; }
    else if (k === "href") el.setAttribute("href", String(v).startsWith("#") ? String(v) : "#");
    else el.setAttribute(k, v === true ? "" : txt(v));
  }
  add(el, children);
  return el;
}
function add(el, children) {
  for (const c of children) {
    if (c === null || c === undefined || c === false) continue;
    if (c instanceof Node) el.append(c);
    else if (Array.isArray(c)) add(el, c);
    else el.append(document.createTextNode(txt(c)));
  }
}
function show(...nodes) { app.replaceChildren(); add(app, nodes); }
const card = (label, value, attrs) => h("div", { class: "card" }, label, h("b", attrs || {}, value));
const row = (cells, attrs) => h("tr", attrs || {}, cells.map((c) => c instanceof Node && (c.tagName === "TD" || c.tagName === "TH") ? c : h("td", {}, c)));
const head = (names) => h("thead", {}, h("tr", {}, names.map((n) => h("th", {}, n))));

async function api(path) {
  const r = await fetch(path, { headers: { accept: "application/json" } });
  let j = null;
  try { j = await r.json(); } catch { /* not JSON */ }
  if (!r.ok) throw new Error(txt(isObj(j) && j.error ? j.error : r.status + " " + r.statusText));
  return j;
}
const contentText = (c) => typeof c === "string" ? c : Array.isArray(c)
  ? c.map((p) => isObj(p) && typeof p.text === "string" ? p.text : "[" + txt(isObj(p) && p.type || "part") + "]").join("")
  : txt(c);
const runLink = (id) => "#/run/" + encodeURIComponent(id);
let timer = null;
function live(fn) { clearInterval(timer); timer = setInterval(() => { if (!document.hidden) fn().catch(() => {}); }, 3000); }

async function runsPage() {
  clearInterval(timer);
  const data = await api("/api/runs");
  const runs = Array.isArray(data.runs) ? data.runs : [];
  if (!runs.length) {
    show(h("p", { "data-testid": "no-runs" }, "No runs under ", h("code", {}, data.root),
      ": nothing with a results.jsonl or traces.jsonl. Run ", h("code", {}, "vf eval"), " or ", h("code", {}, "vf run"), " first."));
    return;
  }
  const picked = new Set();
  const cmp = h("button", { id: "cmp", disabled: true, onclick: () => {
    const [a, b] = [...picked];
    location.hash = "#/compare/" + encodeURIComponent(a) + "/" + encodeURIComponent(b);
  } }, "Compare");
  const pick = (r) => h("input", { type: "checkbox", "data-pick": r.id, onclick: (e) => {
    e.stopPropagation();
    e.target.checked ? picked.add(r.id) : picked.delete(r.id);
    cmp.disabled = picked.size !== 2;
  } });
  const passAtK = (p) => isObj(p) && Object.keys(p).length
    ? Object.entries(p).map(([k, v]) => k + ":" + num(v, 2)).join(" ") : "–";
  show(
    h("h2", {}, "Runs"),
    h("p", { class: "muted" }, data.root, " · pick two to compare: ", cmp),
    h("table", { "data-testid": "runs" },
      head(["", "Run", "Env", "Model", "Date", "Rollouts", "Mean reward", "pass@k", "Errors", "Tokens", "Cost"]),
      h("tbody", {}, runs.map((r) => row([
        h("td", {}, pick(r)),
        r.id, r.env, r.model,
        typeof r.date === "string" ? r.date.slice(0, 19) : txt(r.date),
        h("td", { "data-testid": "run-rollouts" }, int(r.rollouts)),
        h("td", { "data-testid": "run-reward" }, num(r.avg_reward)),
        h("td", { "data-testid": "run-pass" }, passAtK(r.pass_at_k)),
        h("td", { class: r.errors ? "err" : "", "data-testid": "run-errors" }, int(r.errors)),
        h("td", { "data-testid": "run-tokens" }, int(r.tokens)),
        r.cost_usd === null || r.cost_usd === undefined ? "–" : "$" + num(r.cost_usd, 4),
      ], { class: "link", "data-id": r.id, onclick: () => location.hash = runLink(r.id) })))),
  );
}

function histogram(hist) {
  const buckets = Array.isArray(hist.buckets) ? hist.buckets.map((n) => isNum(n) ? n : 0) : [];
  const max = Math.max(1, ...buckets);
  const top = Math.max(0, ...buckets);
  // The bars span lo … hi: 0 … 1 unless the run's rewards go outside it (a weighted sum).
  const lo = isNum(hist.lo) ? hist.lo : 0, hi = isNum(hist.hi) && hist.hi > lo ? hist.hi : lo + 1;
  const at = (i) => (lo + (hi - lo) * i / 10).toFixed(1);
  return h("div", { class: "histwrap", "data-testid": "histogram-box" },
    h("div", { class: "hist-y", "data-testid": "hist-y" }, h("span", {}, int(top)), h("span", {}, "0")),
    h("div", { class: "hist", title: "rollouts by reward, " + at(0) + " … " + at(10), "data-testid": "histogram" },
      buckets.map((n, i) => h("div", { height: 100 * n / max,
        title: at(i) + "–" + at(i + 1) + ": " + n }))),
    h("div", { class: "hist-x", "data-testid": "hist-x" }, Array.from({ length: 11 }, (_, i) => h("span", {}, at(i)))),
    h("div", { class: "hist-title" }, "x: reward · y: rollouts"));
}

const state = { errors: "", error_type: "", example: "", stop: "", min_reward: "", max_reward: "", sort: "line", desc: "", page: 0 };
async function runPage(asked) {
  const run = await api("/api/run?id=" + encodeURIComponent(asked));
  const id = typeof run.id === "string" ? run.id : asked; // a pasted id, resolved
  const hist = isObj(run.histogram) ? run.histogram : {};
  const errs = isObj(hist.errors) ? hist.errors : {};
  const opt = (value, label) => h("option", { value }, label);
  const field = (name, placeholder, size) => h("input", { name, placeholder, size });
  const form = h("form", { class: "filters", id: "filters" },
    h("select", { name: "errors" }, opt("", "all rollouts"), opt("only", "errors only"), opt("none", "no errors")),
    h("select", { name: "error_type" }, opt("", "any error type"), Object.keys(errs).map((k) => opt(k, k))),
    field("example", "task / example"), field("stop", "stop condition"),
    field("min_reward", "min reward", 8), field("max_reward", "max reward", 8),
    h("select", { name: "sort" }, opt("line", "order"), opt("reward", "reward"), opt("example", "example"), opt("turns", "turns"), opt("tokens", "tokens")),
    h("label", {}, h("input", { type: "checkbox", name: "desc", value: "1" }), " descending"),
    h("button", {}, "Apply"));
  show(
    h("h2", { "data-testid": "run-title" }, id),
    h("div", { class: "cards" },
      card("Rollouts", int(run.rollouts), { "data-testid": "count" }),
      card("Mean reward", num(run.avg_reward), { "data-testid": "mean-reward" }),
      card("Errors", int(run.errors), { class: run.errors ? "err" : "", "data-testid": "errors" }),
      card("Tokens", int(run.tokens), { "data-testid": "tokens" }),
      card("Date", typeof run.date === "string" ? run.date.slice(0, 19) : "–"),
      card("Model", run.model ?? "–"),
      card("Env", run.env ?? "–"),
      card("Cost", run.cost_usd === null || run.cost_usd === undefined ? "–" : "$" + num(run.cost_usd, 4))),
    histogram(hist),
    h("p", { class: "muted", "data-testid": "unscored" }, "unscored ", int(hist.unscored),
      Object.keys(errs).length ? [" · errors: ", Object.entries(errs).map(([k, v]) => k + " " + txt(v)).join(", ")] : null),
    form,
    h("div", { id: "rows" }));
  for (const [k, v] of Object.entries(state)) { const el = form.elements[k]; if (!el) continue; if (el.type === "checkbox") el.checked = v === "1"; else el.value = v; }
  form.onsubmit = (e) => {
    e.preventDefault();
    for (const k of Object.keys(state)) { const el = form.elements[k]; if (el) state[k] = el.type === "checkbox" ? (el.checked ? "1" : "") : el.value; }
    state.page = 0;
    rows(id);
  };
  await rows(id);
  live(async () => {
    const r = await api("/api/run?id=" + encodeURIComponent(id));
    const c = document.querySelector('[data-testid="count"]');
    if (c && int(r.rollouts) !== c.textContent) { c.textContent = int(r.rollouts); await rows(id); }
  });
}
async function rows(id) {
  const q = new URLSearchParams({ id, page_size: "50" });
  for (const [k, v] of Object.entries(state)) if (v !== "" && v !== null) q.set(k, String(v));
  const res = await api("/api/rollouts?" + q);
  const total = isNum(res.total) ? res.total : 0;
  const pages = Math.max(1, Math.ceil(total / 50));
  const list = Array.isArray(res.rows) ? res.rows : [];
  const go = (d) => () => { state.page += d; rows(id); };
  const box = document.getElementById("rows");
  box.replaceChildren();
  add(box, [
    h("p", { class: "muted", "data-testid": "matching" }, total + " matching · page " + (state.page + 1) + " of " + pages + " ",
      h("button", { id: "prev", disabled: !state.page, onclick: go(-1) }, "‹ prev"), " ",
      h("button", { id: "next", disabled: state.page + 1 >= pages, onclick: go(1) }, "next ›")),
    h("table", { "data-testid": "rollouts" },
      head(["#", "Example", "Rollout", "Reward", "Error", "Stop", "Turns", "Tokens"]),
      h("tbody", {}, list.map((r) => row([
        int(r.line), r.example,
        h("td", { "data-testid": "rollout-index" }, int(r.rollout), isNum(r.attempt) ? " · attempt " + r.attempt : null),
        num(r.reward),
        h("td", { class: "err" }, r.corrupt ? "corrupt line" : r.error ?? ""),
        r.stop ?? "",
        int(r.turns),
        h("td", { "data-testid": "rollout-tokens" }, int(r.tokens)),
      ], { class: "link", "data-line": r.line,
        onclick: () => location.hash = "#/rollout/" + encodeURIComponent(id) + "/" + encodeURIComponent(txt(r.line)) }))))]);
}

function kv(title, obj) {
  if (obj === null || obj === undefined) return null;
  const entries = isObj(obj) ? Object.entries(obj) : [["", obj]];
  if (!entries.length) return null;
  return h("div", { class: "box" }, h("b", {}, title),
    h("table", {}, entries.map(([k, v]) => row([k, isNum(v) ? num(v, 4) : txt(v)]))));
}
function jsonBox(title, value, testid) {
  let text;
  try { text = typeof value === "string" ? value : JSON.stringify(value, null, 2); } catch { text = txt(value); }
  return h("div", { class: "box", "data-testid": testid }, h("b", {}, title), h("pre", {}, text));
}
function transcript(messages) {
  return (Array.isArray(messages) ? messages : [messages]).map((m) => {
    if (!isObj(m)) return h("div", { class: "msg", "data-testid": "message" }, h("pre", {}, txt(m)));
    const body = contentText(m.content);
    const calls = Array.isArray(m.tool_calls) ? m.tool_calls : m.tool_calls ? [m.tool_calls] : [];
    return h("div", { class: "msg", "data-testid": "message", "data-role": m.role },
      h("div", { class: "role" }, m.role, m.tool_call_id ? [" · result of ", m.tool_call_id] : null),
      body ? h("pre", {}, body) : null,
      m.reasoning_content ? h("details", {}, h("summary", {}, "reasoning"), h("pre", {}, m.reasoning_content)) : null,
      calls.map((c) => {
        const f = isObj(c) ? (isObj(c.function) ? c.function : c) : { name: c };
        return h("div", { class: "call", "data-testid": "tool-call" },
          h("b", {}, f.name), " ", h("span", { class: "muted" }, isObj(c) ? c.id ?? "" : ""),
          h("pre", {}, txt(f.arguments)));
      }));
  });
}
function usageOf(c, key) {
  const u = isObj(c) && isObj(c.response) && isObj(c.response.usage) ? c.response.usage : null;
  return u ? int(u[key]) : "–";
}
// t: the trace (or vf eval row) as the file has it; indexed: what the index made of it (its
// rollout index counted by example when the file has none), or null.
function traceView(t, indexed) {
  if (!isObj(t)) return [jsonBox("Record", t, "record")];
  const out = [];
  const task = isObj(t.task) ? t.task.key : t.task;
  out.push(h("div", { class: "cards" },
    // Unscored as the index counted it (a vf eval row's errored 0 is not a score).
    card("Reward", indexed && indexed.reward === null ? "–" : num(t.reward), { "data-testid": "reward" }),
    card("Stop", t.stop_condition ?? "–"),
    card("Task", task ?? t.example_id ?? "–"),
    card("Rollout", t.rollout_index !== undefined ? int(t.rollout_index) : indexed ? int(indexed.rollout) : "–", { "data-testid": "trace-rollout" }),
    t.attempt !== undefined ? card("Attempt", int(t.attempt)) : null,
    card("Role", t.role ?? "agent"),
    card("Tokens", tokensOf(t), { "data-testid": "trace-tokens" }),
    card("Duration", durationOf(t), { "data-testid": "trace-duration" })));
  const err = t.error;
  if (err !== null && err !== undefined && err !== false) {
    const e = isObj(err) ? err : { message: err };
    out.push(h("div", { class: "box corrupt", "data-testid": "error" },
      h("b", { class: "err" }, e.error ?? e.type ?? "Error"),
      e.phase !== undefined ? [" in ", e.phase] : null,
      e.infra ? " (infrastructure)" : null,
      h("pre", {}, e.message)));
  }
  out.push(kv("Rewards", t.rewards), kv("Metrics", t.metrics));
  const messages = t.messages ?? [...(Array.isArray(t.prompt) ? t.prompt : t.prompt ? [t.prompt] : []),
    ...(Array.isArray(t.completion) ? t.completion : t.completion ? [t.completion] : [])];
  out.push(h("h3", {}, "Transcript"), transcript(messages));
  const modelCalls = Array.isArray(t.model_calls) ? t.model_calls : [];
  if (modelCalls.length) {
    out.push(h("h3", {}, "Model calls"), h("table", { "data-testid": "model-calls" },
      row(["Turn", "Duration", "Input", "Output", "Error"].map((n) => h("th", {}, n))),
      modelCalls.map((c) => isObj(c) ? row([int(c.turn), isNum(c.duration_ms) ? c.duration_ms + " ms" : int(c.duration_ms),
        usageOf(c, "prompt_tokens"), usageOf(c, "completion_tokens"), h("td", { class: "err" }, c.error ?? "")]) : row([txt(c)]))));
  }
  const toolCalls = Array.isArray(t.tool_calls) ? t.tool_calls : [];
  if (toolCalls.length) {
    out.push(h("h3", {}, "Sandbox commands and tool calls"), h("table", { class: "fixed", "data-testid": "commands" },
      h("colgroup", {}, h("col", { class: "c-tool" }), h("col", {}), h("col", { class: "c-exit" }), h("col", {})),
      row(["Tool", "Arguments", "Exit", "Output"].map((n) => h("th", {}, n))),
      toolCalls.map((c) => isObj(c) ? row([c.name, h("pre", {}, txt(c.arguments)), int(c.exit_code),
        h("pre", {}, txt(c.output).slice(0, 2000))]) : row([txt(c)]))));
  }
  const info = isObj(t.info) ? t.info : {};
  if (t.info !== undefined && t.info !== null) {
    // judge and artifacts have boxes of their own.
    const rest = isObj(t.info) ? Object.fromEntries(Object.entries(t.info).filter(([k]) => k !== "judge" && k !== "artifacts")) : t.info;
    if (!isObj(rest) || Object.keys(rest).length) out.push(jsonBox("Info", rest, "info"));
  }
  if (info.judge !== undefined) out.push(jsonBox("Judges", info.judge, "judges"));
  if (info.artifacts !== undefined || t.artifacts !== undefined) out.push(jsonBox("Artifacts", info.artifacts ?? t.artifacts, "artifacts"));
  if (t.network !== undefined && t.network !== null) out.push(jsonBox("Network", t.network, "network"));
  return out;
}
// How long the rollout took: a trace's timing.total_ms, a vf eval row's timing.total (seconds).
function durationOf(t) {
  const tm = isObj(t.timing) ? t.timing : {};
  if (isNum(tm.total_ms)) return Math.round(tm.total_ms) + " ms";
  if (isNum(tm.total)) return Math.round(tm.total * 1000) + " ms";
  return "–";
}
function tokensOf(t) {
  const u = isObj(t.usage) ? t.usage : isObj(t.token_usage) ? t.token_usage : null;
  if (!u) return "–";
  const i = u.input_tokens, o = u.output_tokens;
  if ((isNum(i) || i === undefined) && (isNum(o) || o === undefined)) return String((i ?? 0) + (o ?? 0));
  return txt(u);
}
async function rolloutPage(id, line) {
  clearInterval(timer);
  if (!/^[0-9]+$/.test(line)) {
    show(h("p", {}, h("a", { href: runLink(id) }, "‹ ", id)),
      h("p", { class: "err", "data-testid": "failure" }, "Rollout \"" + line + "\" is not a line number; open one from the run's table"));
    return;
  }
  const r = await api("/api/rollout?id=" + encodeURIComponent(id) + "&line=" + encodeURIComponent(line));
  const runId = typeof r.id === "string" ? r.id : id;
  const back = h("p", {}, h("a", { href: runLink(runId) }, "‹ ", runId));
  const rows = Array.isArray(r.rows) ? r.rows : [];
  const first = isObj(rows[0]) ? rows[0] : {};
  const title = h("h2", { "data-testid": "rollout-title" },
    r.corrupt ? "Line " + line : ["Example ", first.example ?? "–", " · rollout ", int(first.rollout)],
    h("span", { class: "muted" }, " (line " + line + " of the file)"));
  if (r.corrupt) {
    show(back, title, h("div", { class: "box corrupt", "data-testid": "corrupt" },
      isNum(r.oversize)
        ? [h("b", { class: "err" }, "This line of the results file is too long to show"),
          " (" + r.oversize + " bytes, over the viewer's limit of " + r.limit + "); it starts:"]
        : [h("b", { class: "err" }, "This line of the results file is corrupt"),
          " (it does not parse as JSON); the rest of the run is unaffected."],
      h("pre", {}, r.text)));
    return;
  }
  const rec = r.record;
  const indexedAt = (i) => rows.find((x) => isObj(x) && x.trace === i) || null;
  if (isObj(rec) && Array.isArray(rec.traces)) {
    const errors = Array.isArray(rec.errors) ? rec.errors : [];
    const firstError = errors.length ? (isObj(errors[0]) ? errors[0].message : errors[0]) : null;
    show(back, title,
      h("p", { class: "muted" }, "Episode of " + rec.traces.length + " traces",
        errors.length ? [" · ", h("span", { class: "err", "data-testid": "episode-error" }, firstError)] : null),
      rec.traces.map((t, i) => [i ? h("hr") : null,
        h("h3", { id: "trace-" + i }, isObj(t) && t.role !== undefined && t.role !== null ? t.role : "trace " + i),
        traceView(t, indexedAt(i))]));
  } else show(back, title, traceView(rec, isObj(rows[0]) ? rows[0] : null));
}
async function comparePage(a, b) {
  clearInterval(timer);
  const c = await api("/api/compare?a=" + encodeURIComponent(a) + "&b=" + encodeURIComponent(b));
  const ci = Array.isArray(c.ci) ? c.ci : [];
  const per = Array.isArray(c.perExample) ? c.perExample : [];
  show(
    h("h2", {}, "Compare"),
    h("p", {}, "A ", h("b", {}, a), " · B ", h("b", {}, b)),
    h("div", { class: "cards" },
      card("Paired examples", int(c.paired)),
      card("Mean A", num(c.meanA)), card("Mean B", num(c.meanB)),
      card("B − A", num(c.delta, 4), { "data-testid": "delta" }),
      card("95% CI", "[" + num(ci[0], 4) + ", " + num(ci[1], 4) + "]", { "data-testid": "ci" }),
      card("better / worse / same", int(c.better) + " / " + int(c.worse) + " / " + int(c.ties))),
    h("table", { "data-testid": "deltas" },
      row(["Example", "A", "B", "B − A"].map((n) => h("th", {}, n))),
      per.map((p) => row([p.example, num(p.a), num(p.b),
        h("td", { class: p.delta < 0 ? "err" : p.delta > 0 ? "ok" : "" }, num(p.delta))]))));
}

function decode(part) { try { return decodeURIComponent(part); } catch { return part; } }
// Two run ids pasted unencoded ("#/compare/evals/a/x/evals/b/y"): the first split where both
// are runs. Each reply is read to its end, so its connection is free for the next request.
async function compareSplit(parts) {
  if (parts.length === 2) return parts;
  for (let i = 1; i < parts.length; i++) {
    const a = parts.slice(0, i).join("/"), b = parts.slice(i).join("/");
    const found = await Promise.all([a, b].map((id) => fetch("/api/run?id=" + encodeURIComponent(id)).then((r) => r.text().then(() => r.ok), () => false)));
    if (found[0] && found[1]) return [a, b];
  }
  return [parts[0], parts.slice(1).join("/")];
}
async function route() {
  // Tolerant of ids pasted unencoded (slashes), a missing leading slash, a trailing one.
  const parts = location.hash.replace(/^#\/?/, "").split("/").map(decode);
  while (parts.length > 1 && parts[parts.length - 1] === "") parts.pop();
  document.getElementById("where").textContent = parts.filter(Boolean).join(" / ");
  try {
    const rest = parts.slice(1);
    if (parts[0] === "run" && rest.join("")) await runPage(rest.join("/"));
    else if (parts[0] === "rollout" && rest.join("")) await rolloutPage(rest.length > 1 ? rest.slice(0, -1).join("/") : rest[0], rest.length > 1 ? rest[rest.length - 1] : "");
    else if (parts[0] === "compare" && rest.length > 1) await comparePage(...await compareSplit(rest));
    else await runsPage();
  } catch (e) {
    show(h("p", { class: "err", "data-testid": "failure" }, e && e.message ? e.message : txt(e)));
  }
}
addEventListener("hashchange", route);
route();
})();
`;
