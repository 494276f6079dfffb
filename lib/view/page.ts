/**
 * The viewer's single page: plain HTML, CSS and JavaScript over `/api/*`, routed by the URL's
 * hash (`#/`, `#/run/<id>`, `#/rollout/<id>/<line>`, `#/compare/<a>/<b>`). No build step.
 * @module
 */

/** The page `vf view` serves at `/`. */
export const VIEW_PAGE: string = `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>vf view</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
body{font:14px/1.45 system-ui,sans-serif;margin:0;color:#1d2330;background:#f6f7f9}
header{background:#1d2330;color:#fff;padding:10px 18px;display:flex;gap:18px;align-items:center}
header a{color:#fff;text-decoration:none;font-weight:600}
main{padding:16px 18px;max-width:1300px}
table{border-collapse:collapse;width:100%;background:#fff}
th,td{border-bottom:1px solid #e3e6ea;padding:5px 8px;text-align:left;vertical-align:top}
th{background:#eef0f3;font-weight:600}
tr.link{cursor:pointer} tr.link:hover{background:#f0f5ff}
.err{color:#b42318}.ok{color:#067647}.muted{color:#667085}
.cards{display:flex;gap:12px;flex-wrap:wrap;margin:10px 0}
.card{background:#fff;border:1px solid #e3e6ea;border-radius:6px;padding:8px 12px;min-width:110px}
.card b{display:block;font-size:18px}
.hist{display:flex;align-items:flex-end;gap:3px;height:90px;background:#fff;border:1px solid #e3e6ea;padding:6px;margin:10px 0}
.hist div{flex:1;background:#4f7cff;min-height:1px}
.filters{display:flex;gap:8px;flex-wrap:wrap;margin:8px 0}
.msg{background:#fff;border:1px solid #e3e6ea;border-radius:6px;margin:8px 0;padding:8px 10px}
.msg .role{font-weight:600;text-transform:uppercase;font-size:12px;color:#475467}
.msg pre,.box pre{white-space:pre-wrap;word-break:break-word;margin:4px 0;font:12px/1.4 ui-monospace,monospace}
.call{background:#f4f6fb;border-left:3px solid #4f7cff;padding:4px 8px;margin:4px 0}
.box{background:#fff;border:1px solid #e3e6ea;border-radius:6px;padding:8px 10px;margin:10px 0}
.corrupt{background:#fff4f2;border:1px solid #f3b8ad}
</style></head>
<body><header><a href="#/">vf view</a><span id="where" class="muted"></span></header>
<main id="app"><p class="muted">Loading…</p></main>
<script>
const app = document.getElementById("app");
const esc = (s) => String(s ?? "").replace(/[&<>"]/g, (c) => ({"&":"&amp;","<":"&lt;",">":"&gt;",'"':"&quot;"}[c]));
const num = (x, d = 3) => (x === null || x === undefined || Number.isNaN(x)) ? "–" : Number(x).toFixed(d);
const api = async (path) => { const r = await fetch(path); const j = await r.json(); if (!r.ok) throw new Error(j.error || r.statusText); return j; };
const text = (c) => typeof c === "string" ? c : Array.isArray(c) ? c.map((p) => p.text ?? "[" + (p.type || "part") + "]").join("") : c == null ? "" : JSON.stringify(c);
let timer = null;
function live(fn) { clearInterval(timer); timer = setInterval(() => { if (!document.hidden) fn().catch(() => {}); }, 3000); }

async function runsPage() {
  clearInterval(timer);
  const data = await api("/api/runs");
  if (!data.runs.length) {
    app.innerHTML = '<p data-testid="no-runs">No runs under <code>' + esc(data.root) + '</code>: nothing with a results.jsonl or traces.jsonl. Run <code>vf eval</code> or <code>vf run</code> first.</p>';
    return;
  }
  app.innerHTML = '<h2>Runs</h2><p class="muted">' + esc(data.root) + ' · pick two to compare: <button id="cmp" disabled>Compare</button></p>' +
    '<table data-testid="runs"><thead><tr><th></th><th>Run</th><th>Env</th><th>Model</th><th>Date</th><th>Rollouts</th><th>Mean reward</th><th>pass@k</th><th>Errors</th><th>Tokens</th><th>Cost</th></tr></thead><tbody>' +
    data.runs.map((r) => '<tr class="link" data-id="' + esc(r.id) + '"><td><input type="checkbox" data-pick="' + esc(r.id) + '"></td><td>' + esc(r.id) + '</td><td>' + esc(r.env) + '</td><td>' + esc(r.model) + '</td><td>' + esc((r.date || "").slice(0, 19)) + '</td><td data-testid="run-rollouts">' + r.rollouts + '</td><td>' + num(r.avg_reward) + '</td><td>' + esc(r.pass_at_k ? Object.entries(r.pass_at_k).map(([k, v]) => k + ":" + num(v, 2)).join(" ") : "–") + '</td><td class="' + (r.errors ? "err" : "") + '">' + r.errors + '</td><td>' + (r.tokens ?? "–") + '</td><td>' + (r.cost_usd == null ? "–" : "$" + num(r.cost_usd, 4)) + '</td></tr>').join("") + '</tbody></table>';
  const picked = new Set();
  app.querySelectorAll("input[data-pick]").forEach((box) => box.addEventListener("click", (e) => {
    e.stopPropagation();
    box.checked ? picked.add(box.dataset.pick) : picked.delete(box.dataset.pick);
    document.getElementById("cmp").disabled = picked.size !== 2;
  }));
  document.getElementById("cmp").onclick = () => { const [a, b] = [...picked]; location.hash = "#/compare/" + encodeURIComponent(a) + "/" + encodeURIComponent(b); };
  app.querySelectorAll("tr[data-id]").forEach((tr) => tr.onclick = () => location.hash = "#/run/" + encodeURIComponent(tr.dataset.id));
}

const state = { errors: "", error_type: "", example: "", stop: "", min_reward: "", max_reward: "", sort: "line", desc: "", page: 0 };
async function runPage(id) {
  const run = await api("/api/run?id=" + encodeURIComponent(id));
  const h = run.histogram;
  const max = Math.max(1, ...h.buckets);
  const m = run.metadata || {};
  app.innerHTML = '<h2 data-testid="run-title">' + esc(id) + '</h2>' +
    '<div class="cards"><div class="card">Rollouts<b data-testid="count">' + run.rollouts + '</b></div><div class="card">Mean reward<b>' + num(run.avg_reward) + '</b></div><div class="card">Errors<b class="' + (run.errors ? "err" : "") + '">' + run.errors + '</b></div><div class="card">Model<b>' + esc(run.model) + '</b></div><div class="card">Env<b>' + esc(run.env) + '</b></div><div class="card">Cost<b>' + (run.cost_usd == null ? "–" : "$" + num(run.cost_usd, 4)) + '</b></div></div>' +
    '<div class="hist" title="rewards 0 … 1" data-testid="histogram">' + h.buckets.map((n, i) => '<div style="height:' + (100 * n / max) + '%" title="' + (i / 10).toFixed(1) + '–' + ((i + 1) / 10).toFixed(1) + ': ' + n + '"></div>').join("") + '</div>' +
    '<p class="muted">unscored ' + h.unscored + (Object.keys(h.errors).length ? ' · errors: ' + Object.entries(h.errors).map(([k, v]) => esc(k) + " " + v).join(", ") : "") + '</p>' +
    '<form class="filters" id="filters"><select name="errors"><option value="">all rollouts</option><option value="only">errors only</option><option value="none">no errors</option></select>' +
    '<select name="error_type"><option value="">any error type</option>' + Object.keys(h.errors).map((k) => '<option>' + esc(k) + '</option>').join("") + '</select>' +
    '<input name="example" placeholder="task / example"><input name="stop" placeholder="stop condition">' +
    '<input name="min_reward" placeholder="min reward" size="8"><input name="max_reward" placeholder="max reward" size="8">' +
    '<select name="sort"><option value="line">order</option><option value="reward">reward</option><option value="example">example</option><option value="turns">turns</option><option value="tokens">tokens</option></select>' +
    '<label><input type="checkbox" name="desc" value="1"> descending</label><button>Apply</button></form>' +
    '<div id="rows"></div>';
  const form = document.getElementById("filters");
  for (const [k, v] of Object.entries(state)) { const el = form.elements[k]; if (!el) continue; if (el.type === "checkbox") el.checked = v === "1"; else el.value = v; }
  form.onsubmit = (e) => { e.preventDefault(); for (const k of Object.keys(state)) { const el = form.elements[k]; if (el) state[k] = el.type === "checkbox" ? (el.checked ? "1" : "") : el.value; } state.page = 0; rows(id); };
  await rows(id);
  live(async () => { const r = await api("/api/run?id=" + encodeURIComponent(id)); const c = document.querySelector('[data-testid="count"]'); if (c && String(r.rollouts) !== c.textContent) { c.textContent = r.rollouts; await rows(id); } });
}
async function rows(id) {
  const q = new URLSearchParams({ id, page_size: "50" });
  for (const [k, v] of Object.entries(state)) if (v !== "" && v !== null) q.set(k, String(v));
  const res = await api("/api/rollouts?" + q);
  const pages = Math.max(1, Math.ceil(res.total / 50));
  document.getElementById("rows").innerHTML = '<p class="muted" data-testid="matching">' + res.total + ' matching · page ' + (state.page + 1) + ' of ' + pages + ' <button id="prev"' + (state.page ? "" : " disabled") + '>‹ prev</button> <button id="next"' + (state.page + 1 < pages ? "" : " disabled") + '>next ›</button></p>' +
    '<table data-testid="rollouts"><thead><tr><th>#</th><th>Example</th><th>Rollout</th><th>Reward</th><th>Error</th><th>Stop</th><th>Turns</th><th>Tokens</th></tr></thead><tbody>' +
    res.rows.map((r) => '<tr class="link" data-line="' + r.line + '"><td>' + r.line + '</td><td>' + esc(r.example) + '</td><td>' + r.rollout + '</td><td>' + num(r.reward) + '</td><td class="err">' + esc(r.corrupt ? "corrupt line" : r.error || "") + '</td><td>' + esc(r.stop || "") + '</td><td>' + r.turns + '</td><td>' + r.tokens + '</td></tr>').join("") + '</tbody></table>';
  document.getElementById("prev").onclick = () => { state.page--; rows(id); };
  document.getElementById("next").onclick = () => { state.page++; rows(id); };
  document.querySelectorAll("tr[data-line]").forEach((tr) => tr.onclick = () => location.hash = "#/rollout/" + encodeURIComponent(id) + "/" + tr.dataset.line);
}

function kv(title, obj) {
  const entries = Object.entries(obj || {});
  if (!entries.length) return "";
  return '<div class="box"><b>' + esc(title) + '</b><table>' + entries.map(([k, v]) => '<tr><td>' + esc(k) + '</td><td>' + esc(typeof v === "number" ? num(v, 4) : JSON.stringify(v)) + '</td></tr>').join("") + '</table></div>';
}
function transcript(messages) {
  return (messages || []).map((m) => '<div class="msg" data-testid="message" data-role="' + esc(m.role) + '"><div class="role">' + esc(m.role) + (m.tool_call_id ? ' · result of ' + esc(m.tool_call_id) : "") + '</div>' +
    (text(m.content) ? '<pre>' + esc(text(m.content)) + '</pre>' : "") +
    (m.reasoning_content ? '<details><summary>reasoning</summary><pre>' + esc(m.reasoning_content) + '</pre></details>' : "") +
    (m.tool_calls || []).map((c) => { const f = c.function || c; return '<div class="call" data-testid="tool-call"><b>' + esc(f.name) + '</b> <span class="muted">' + esc(c.id || "") + '</span><pre>' + esc(typeof f.arguments === "string" ? f.arguments : JSON.stringify(f.arguments)) + '</pre></div>'; }).join("") + '</div>').join("");
}
function traceView(t) {
  const err = t.error;
  let html = '<div class="cards"><div class="card">Reward<b data-testid="reward">' + num(t.reward) + '</b></div><div class="card">Stop<b>' + esc(t.stop_condition || "–") + '</b></div><div class="card">Task<b>' + esc(t.task ? t.task.key : t.example_id) + '</b></div><div class="card">Role<b>' + esc(t.role || "agent") + '</b></div></div>';
  if (err) html += '<div class="box corrupt" data-testid="error"><b class="err">' + esc(err.error || err.type) + '</b>' + (err.phase ? ' in ' + esc(err.phase) : "") + (err.infra ? ' (infrastructure)' : "") + '<pre>' + esc(err.message) + '</pre></div>';
  html += kv("Rewards", t.rewards) + kv("Metrics", t.metrics);
  const messages = t.messages || [...(t.prompt || []), ...(t.completion || [])];
  html += '<h3>Transcript</h3>' + transcript(messages);
  if ((t.model_calls || []).length) html += '<h3>Model calls</h3><table data-testid="model-calls"><tr><th>Turn</th><th>Duration</th><th>Input</th><th>Output</th><th>Error</th></tr>' + t.model_calls.map((c) => '<tr><td>' + c.turn + '</td><td>' + c.duration_ms + ' ms</td><td>' + ((c.response && c.response.usage) ? c.response.usage.prompt_tokens : "–") + '</td><td>' + ((c.response && c.response.usage) ? c.response.usage.completion_tokens : "–") + '</td><td class="err">' + esc(c.error || "") + '</td></tr>').join("") + '</table>';
  if ((t.tool_calls || []).length) html += '<h3>Sandbox commands and tool calls</h3><table data-testid="commands"><tr><th>Tool</th><th>Arguments</th><th>Exit</th><th>Output</th></tr>' + t.tool_calls.map((c) => '<tr><td>' + esc(c.name) + '</td><td><pre>' + esc(c.arguments) + '</pre></td><td>' + (c.exit_code ?? "–") + '</td><td><pre>' + esc((c.output || "").slice(0, 2000)) + '</pre></td></tr>').join("") + '</table>';
  const info = t.info || {};
  if (info.judge) html += '<div class="box"><b>Judges</b><pre>' + esc(JSON.stringify(info.judge, null, 2)) + '</pre></div>';
  if (info.artifacts || t.artifacts) html += '<div class="box"><b>Artifacts</b><pre>' + esc(JSON.stringify(info.artifacts || t.artifacts, null, 2)) + '</pre></div>';
  if (t.network) html += '<div class="box"><b>Network</b><pre>' + esc(JSON.stringify(t.network, null, 2)) + '</pre></div>';
  return html;
}
async function rolloutPage(id, line) {
  clearInterval(timer);
  const r = await api("/api/rollout?id=" + encodeURIComponent(id) + "&line=" + line);
  let html = '<p><a href="#/run/' + encodeURIComponent(id) + '">‹ ' + esc(id) + '</a></p><h2>Rollout ' + line + '</h2>';
  if (r.corrupt) {
    app.innerHTML = html + '<div class="box corrupt" data-testid="corrupt"><b class="err">This line of the results file is corrupt</b> (it does not parse as JSON); the rest of the run is unaffected.<pre>' + esc(r.text) + '</pre></div>';
    return;
  }
  const rec = r.record;
  if (Array.isArray(rec.traces)) {
    html += '<p class="muted">Episode of ' + rec.traces.length + ' traces' + ((rec.errors || []).length ? ' · <span class="err">' + esc(rec.errors[0].message) + '</span>' : "") + '</p>';
    html += rec.traces.map((t, i) => '<h3>' + esc(t.role || "trace " + i) + '</h3>' + traceView(t)).join("<hr>");
  } else html += traceView(rec);
  app.innerHTML = html;
}
async function comparePage(a, b) {
  clearInterval(timer);
  const c = await api("/api/compare?a=" + encodeURIComponent(a) + "&b=" + encodeURIComponent(b));
  app.innerHTML = '<h2>Compare</h2><p>A <b>' + esc(a) + '</b> · B <b>' + esc(b) + '</b></p>' +
    '<div class="cards"><div class="card">Paired examples<b>' + c.paired + '</b></div><div class="card">Mean A<b>' + num(c.meanA) + '</b></div><div class="card">Mean B<b>' + num(c.meanB) + '</b></div><div class="card">B − A<b data-testid="delta">' + num(c.delta, 4) + '</b></div><div class="card">95% CI<b data-testid="ci">[' + num(c.ci[0], 4) + ', ' + num(c.ci[1], 4) + ']</b></div><div class="card">better / worse / same<b>' + c.better + ' / ' + c.worse + ' / ' + c.ties + '</b></div></div>' +
    '<table data-testid="deltas"><tr><th>Example</th><th>A</th><th>B</th><th>B − A</th></tr>' + c.perExample.map((p) => '<tr><td>' + esc(p.example) + '</td><td>' + num(p.a) + '</td><td>' + num(p.b) + '</td><td class="' + (p.delta < 0 ? "err" : p.delta > 0 ? "ok" : "") + '">' + num(p.delta) + '</td></tr>').join("") + '</table>';
}

async function route() {
  const parts = location.hash.replace(/^#\\/?/, "").split("/").map(decodeURIComponent);
  document.getElementById("where").textContent = parts.filter(Boolean).join(" / ");
  try {
    if (parts[0] === "run" && parts[1]) await runPage(parts[1]);
    else if (parts[0] === "rollout" && parts[1]) await rolloutPage(parts[1], parts[2]);
    else if (parts[0] === "compare" && parts[2]) await comparePage(parts[1], parts[2]);
    else await runsPage();
  } catch (e) {
    app.innerHTML = '<p class="err" data-testid="failure">' + esc(e.message) + '</p>';
  }
}
addEventListener("hashchange", route);
route();
</script></body></html>
`;
