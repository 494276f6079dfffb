/**
 * `vf view` against hostile run files, in a real headless Chromium (Debian's `chromium`,
 * driven by puppeteer-core). Run files are written by environment code, which may be
 * untrusted: every field the pages show holds an HTML payload that would set
 * `window.__pwned` or open an `alert` if it ran (numbers replaced by strings, ids, roles, tool
 * names, error types, metadata, info, folder names, the URL's hash). Every page is loaded and
 * must run none of it, show the payload as text, and not crash on the odd shapes (a
 * metadata.json that is an array or null, `usage` as a string, a line that is `null`).
 * The server half: a foreign `Host` (DNS rebinding, tried for real through Chromium's host
 * resolver) and a foreign `Origin` are refused, only GET answers, and the CSP blocks inline
 * script in the browser.
 * @module
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import puppeteer from "npm:puppeteer-core@^25.0.0";
import { serveHttp } from "../lib/model/http_server.ts";
import { hostAllowed, viewApp } from "../lib/view/server.ts";
import { cliCommand, tempDir } from "./_cli.ts";

// deno-lint-ignore no-explicit-any
type Json = any;
/** The page's objects, seen from this (DOM-less) program. */
// deno-lint-ignore no-explicit-any
type Dom = any;

const CHROMIUM = "/usr/bin/chromium";
const BROWSER_ARGS = ["--no-sandbox", "--headless=new", "--disable-gpu", "--disable-dev-shm-usage"];

/** A payload that records `tag` in `window.__pwned` if it ever runs. */
const P = (tag: string) =>
  `<img src=x onerror="(window.__pwned=window.__pwned||[]).push('${tag}')">`;
/** One that breaks out of a quoted attribute and opens an alert if it runs. */
const A = (tag: string) => `"'><img src=x onerror=alert('${tag}')><svg onload=alert('${tag}')>`;

/** A trace of `vf run` with a payload in every field the rollout page shows. */
function hostileTrace(tag: string): Json {
  return {
    format_version: 2,
    trace_id: P(`${tag}-trace_id`),
    task: { key: P(`${tag}-task.key`) },
    example_id: P(`${tag}-example_id`),
    rollout_index: P(`${tag}-rollout_index`),
    role: P(`${tag}-role`),
    trainable: true,
    messages: [
      { role: P(`${tag}-msg.role`), content: P(`${tag}-msg.content`) },
      {
        role: "assistant",
        content: [{ type: P(`${tag}-part.type`) }, { type: "text", text: P(`${tag}-part.text`) }],
        reasoning_content: P(`${tag}-reasoning`),
        tool_calls: [{ id: P(`${tag}-call.id`), name: A(`${tag}-call.name`), arguments: 7 }],
      },
      { role: "tool", tool_call_id: P(`${tag}-tool_call_id`), content: { html: P(`${tag}-obj`) } },
      {
        role: "assistant",
        tool_calls: [{
          id: 1,
          function: { name: P(`${tag}-fn.name`), arguments: { a: P(`${tag}-fn.args`) } },
        }],
      },
    ],
    model_calls: [
      {
        turn: P(`${tag}-turn`),
        duration_ms: P(`${tag}-duration_ms`),
        response: {
          usage: { prompt_tokens: P(`${tag}-prompt_tokens`), completion_tokens: A(`${tag}-ct`) },
        },
        error: P(`${tag}-mc.error`),
      },
      {
        turn: { x: P(`${tag}-turn.obj`) },
        duration_ms: [P(`${tag}-dur.arr`)],
        response: { usage: P(`${tag}-usage.str`) },
      },
      P(`${tag}-mc.string`),
    ],
    tool_calls: [
      {
        name: P(`${tag}-tc.name`),
        arguments: P(`${tag}-tc.arguments`),
        output: P(`${tag}-tc.output`),
        exit_code: P(`${tag}-exit_code`),
      },
      {
        name: { n: 1 },
        arguments: { a: P(`${tag}-tc.args.obj`) },
        output: 5,
        exit_code: [A(`${tag}-exit.arr`)],
      },
    ],
    stop_condition: P(`${tag}-stop`),
    reward: P(`${tag}-reward`),
    rewards: { [P(`${tag}-rewards.key`)]: P(`${tag}-rewards.value`) },
    metrics: P(`${tag}-metrics.string`),
    error: {
      error: P(`${tag}-error.error`),
      message: P(`${tag}-error.message`),
      phase: P(`${tag}-phase`),
      infra: true,
    },
    usage: { input_tokens: P(`${tag}-usage.in`), output_tokens: A(`${tag}-usage.out`) },
    info: {
      judge: P(`${tag}-judge`),
      artifacts: { [P(`${tag}-art.key`)]: P(`${tag}-art`) },
      note: P(`${tag}-info`),
    },
    network: { [P(`${tag}-net.key`)]: P(`${tag}-net`) },
  };
}

/** A row of `vf eval`'s results.jsonl, hostile throughout. */
function hostileRow(): Json {
  return {
    example_id: P("row-example_id"),
    rollout_index: A("row-rollout_index"),
    prompt: [{ role: P("row-prompt.role"), content: P("row-prompt") }],
    completion: [
      {
        role: "assistant",
        content: P("row-completion"),
        tool_calls: [{
          id: P("row-call.id"),
          type: "function",
          function: { name: P("row-tool"), arguments: P("row-args") },
        }],
      },
      { role: "tool", tool_call_id: A("row-tool_call_id"), content: P("row-tool-result") },
    ],
    reward: P("row-reward"),
    error: { error: P("row-error.error"), message: P("row-error.message"), phase: A("row-phase") },
    stop_condition: P("row-stop"),
    metrics: { [P("row-metric.key")]: P("row-metric") },
    info: { [P("row-info.key")]: P("row-info") },
    token_usage: { input_tokens: P("row-tu.in"), output_tokens: P("row-tu.out") },
  };
}

const plainRow = (example: number, reward: number) =>
  JSON.stringify({
    example_id: example,
    prompt: [{ role: "user", content: `q${example}` }],
    completion: [{ role: "assistant", content: "a" }],
    reward,
    error: null,
  });

async function writeRun(dir: string, file: string, lines: string[], metadata: string) {
  await Deno.mkdir(dir, { recursive: true });
  await Deno.writeTextFile(join(dir, file), lines.join("\n") + "\n");
  await Deno.writeTextFile(join(dir, "metadata.json"), metadata);
}

Deno.test("vf view runs no script from hostile run files or URLs on any page, shows the payloads as text, and survives odd shapes", async () => {
  await using tmp = await tempDir("vf_view_hostile_");
  const root = join(tmp.path, "outputs");
  // Folder names are run ids: they carry payloads too.
  const evalId = `evals/${P("dir-eval")}`;
  const runId = `runs/${A("dir-run")}`;
  const hrefId = "runs/javascript:alert('href')";
  await writeRun(
    join(root, evalId),
    "results.jsonl",
    [
      JSON.stringify(hostileRow()),
      plainRow(0, 1),
      `{"example_id": 1, "corrupt": "${P("corrupt-line")}`,
      plainRow(1, 0),
    ],
    JSON.stringify({
      env_id: P("meta.env_id"),
      model: A("meta.model"),
      date: P("meta.date"),
      avg_reward: P("meta.avg_reward"),
      pass_at_k: { [P("meta.pass.key")]: P("meta.pass.value"), "1": 0.5 },
      usage: { input_tokens: P("meta.usage.in"), output_tokens: A("meta.usage.out") },
      avg_input_tokens: P("meta.avg_in"),
      cost: { usd: P("meta.cost") },
    }),
  );
  await writeRun(
    join(root, runId),
    "traces.jsonl",
    [
      JSON.stringify(hostileTrace("t")),
      JSON.stringify({
        episode_index: P("ep-index"),
        traces: [hostileTrace("ep1"), null, {
          ...hostileTrace("ep2"),
          role: { r: P("ep2-role.obj") },
        }],
        errors: [{ message: P("ep-errors.message") }],
      }),
      "null",
      JSON.stringify(P("line-string")),
      JSON.stringify([P("line-array")]),
      JSON.stringify({ ...hostileTrace("key-obj"), task: { key: { k: P("task.key.obj") } } }),
    ],
    JSON.stringify({
      taskset: A("meta.taskset"),
      model: { m: P("meta.model.obj") },
      usage: P("meta.usage.string"),
      pass_at_k: 5,
      date: 12345,
      cost: P("meta.cost.string"),
    }),
  );
  // metadata.json of every odd shape.
  const odd = [
    "[1, 2]",
    "null",
    JSON.stringify(P("meta.string")),
    "42",
    '{"usage": {"input_tokens": {}}, "date": {}}',
    "{torn",
  ];
  for (const [i, text] of odd.entries()) {
    await writeRun(join(root, `odd/${i}`), "results.jsonl", [plainRow(0, 1)], text);
  }
  await writeRun(join(root, hrefId), "results.jsonl", [plainRow(0, 1)], "{}");

  let port = 0;
  const app = viewApp(root, { indexDir: join(tmp.path, "index"), port: () => port });
  const server = await serveHttp((r) => app.fetch(r), { port: 0 });
  port = server.port;
  const base = `http://127.0.0.1:${server.port}/`;

  // The API answers every run with 200, whatever its metadata.json holds.
  const runs = await (await fetch(`${base}api/runs`)).json();
  assert.equal(runs.runs.length, 3 + odd.length, JSON.stringify(runs));
  for (const r of runs.runs) {
    const res = await fetch(`${base}api/run?id=${encodeURIComponent(r.id)}`);
    const body = await res.text();
    assert.equal(res.status, 200, `${r.id}: ${body}`);
    for (const n of ["tokens", "avg_reward", "cost_usd"]) {
      assert.ok(
        r[n] === null || typeof r[n] === "number",
        `${r.id}: ${n} = ${JSON.stringify(r[n])}`,
      );
    }
    assert.ok(r.date === null || typeof r.date === "string", `${r.id}: date`);
  }

  const browser = await puppeteer.launch({ executablePath: CHROMIUM, args: BROWSER_ARGS });
  try {
    const page = await browser.newPage();
    page.setDefaultTimeout(120_000); // generous: the suite runs at load ~10
    const dialogs: string[] = [];
    const pageErrors: string[] = [];
    page.on("dialog", (d) => {
      dialogs.push(d.message());
      d.dismiss().catch(() => {});
    });
    page.on("pageerror", (e) => pageErrors.push(String(e)));
    const enc = encodeURIComponent;

    /** Loads `hash` fresh, waits for the page to settle, and checks that nothing ran. */
    const visit = async (hash: string, visible: string[], selector = "#app > :not(p.muted)") => {
      await page.goto("about:blank");
      await page.goto(base + hash, { waitUntil: "networkidle0" });
      await page.waitForSelector(selector);
      await page.waitForNetworkIdle({ idleTime: 300 });
      const pwned = await page.evaluate(() => (globalThis as Dom).__pwned);
      assert.equal(
        pwned,
        undefined,
        `${hash}: script from the files ran: ${JSON.stringify(pwned)}`,
      );
      assert.deepEqual(dialogs, [], `${hash}: an alert opened`);
      assert.deepEqual(pageErrors, [], `${hash}: the page threw`);
      const text = await page.evaluate(() =>
        (globalThis as Dom).document.body.textContent as string
      );
      for (const v of visible) {
        // A payload inside an object is shown as that object's JSON, its quotes escaped.
        const shown = text.includes(v) || text.includes(JSON.stringify(v).slice(1, -1));
        assert.ok(shown, `${hash}: "${v}" is not shown as text`);
      }
      assert.equal(
        await page.$("#app img, #app svg, #app script"),
        null,
        `${hash}: markup from data`,
      );
      return text;
    };

    // The runs list: ids, env, model, and the odd shapes rendered with "–".
    await visit("#/", [
      evalId,
      runId,
      P("meta.env_id"),
      A("meta.model"),
      A("meta.taskset"),
      P("meta.model.obj"),
    ], '[data-testid="runs"]');
    const tokens = await page.$$eval(
      "tr[data-id]",
      (rows) =>
        rows.map((
          r,
        ) => [
          r.getAttribute("data-id"),
          (r.querySelector('[data-testid="run-tokens"]') as Dom).textContent,
        ]),
    );
    for (const [id, shown] of tokens) {
      if (id === evalId || id === runId || id!.startsWith("odd/")) {
        assert.equal(shown, "–", `${id}: tokens`);
      }
    }
    // Clicking a row opens it (its id went through data-id, not markup).
    await page.click(`tr[data-id="${CSS_ESCAPE(evalId)}"]`);
    await page.waitForSelector('[data-testid="run-title"]');
    assert.equal(
      await page.$eval('[data-testid="run-title"]', (el) => (el as Dom).textContent),
      evalId,
    );

    // The runs' pages.
    await visit(`#/run/${enc(evalId)}`, [
      evalId,
      P("row-example_id"),
      P("row-error.error"),
      P("row-stop"),
    ], '[data-testid="rollouts"]');
    await visit(`#/run/${enc(runId)}`, [
      runId,
      P("t-task.key"),
      P("t-error.error"),
      JSON.stringify({ m: P("meta.model.obj") }),
    ], '[data-testid="rollouts"]');
    for (let i = 0; i < odd.length; i++) {
      await visit(`#/run/odd%2F${i}`, [`odd/${i}`], '[data-testid="rollouts"]');
    }

    // Every rollout page.
    await visit(`#/rollout/${enc(evalId)}/0`, [
      P("row-prompt"),
      P("row-prompt.role"),
      P("row-completion"),
      P("row-tool"),
      P("row-args"),
      A("row-tool_call_id"),
      P("row-tool-result"),
      // row-reward: an errored row is unscored, so its card shows "–", not the payload.
      P("row-error.error"),
      P("row-error.message"),
      A("row-phase"),
      P("row-stop"),
      P("row-metric.key"),
      P("row-metric"),
      P("row-info"),
      P("row-example_id"),
    ], '[data-testid="message"]');
    await visit(`#/rollout/${enc(evalId)}/2`, [P("corrupt-line")], '[data-testid="corrupt"]');
    const traceFields = (tag: string) => [
      P(`${tag}-task.key`),
      P(`${tag}-msg.role`),
      P(`${tag}-msg.content`),
      P(`${tag}-part.text`),
      P(`${tag}-reasoning`),
      A(`${tag}-call.name`),
      P(`${tag}-call.id`),
      P(`${tag}-tool_call_id`),
      P(`${tag}-obj`),
      P(`${tag}-fn.name`),
      P(`${tag}-fn.args`),
      P(`${tag}-turn`),
      P(`${tag}-duration_ms`),
      P(`${tag}-prompt_tokens`),
      A(`${tag}-ct`),
      P(`${tag}-mc.error`),
      P(`${tag}-turn.obj`),
      P(`${tag}-mc.string`),
      P(`${tag}-tc.name`),
      P(`${tag}-tc.arguments`),
      P(`${tag}-tc.output`),
      P(`${tag}-exit_code`),
      A(`${tag}-exit.arr`),
      P(`${tag}-stop`),
      // ${tag}-reward: an errored trace is unscored, so its card shows "–", not the payload.
      P(`${tag}-rewards.key`),
      P(`${tag}-rewards.value`),
      P(`${tag}-metrics.string`),
      P(`${tag}-error.error`),
      P(`${tag}-error.message`),
      P(`${tag}-phase`),
      P(`${tag}-judge`),
      P(`${tag}-art`),
      P(`${tag}-info`),
      P(`${tag}-net`),
      P(`${tag}-rollout_index`),
      P(`${tag}-role`),
    ];
    await visit(`#/rollout/${enc(runId)}/0`, traceFields("t"), '[data-testid="model-calls"]');
    await visit(`#/rollout/${enc(runId)}/1`, [
      ...traceFields("ep1"),
      ...traceFields("ep2").slice(0, -1),
      P("ep-errors.message"),
      P("ep2-role.obj"),
    ], '[data-testid="episode-error"]');
    await visit(`#/rollout/${enc(runId)}/2`, ["null"], '[data-testid="record"]');
    await visit(`#/rollout/${enc(runId)}/3`, [P("line-string")], '[data-testid="record"]');
    await visit(`#/rollout/${enc(runId)}/4`, [P("line-array")], '[data-testid="record"]');
    await visit(`#/rollout/${enc(runId)}/5`, [P("task.key.obj")], '[data-testid="model-calls"]');

    // Compare, with payload ids; and hostile URLs: a line number that carries markup, an id
    // that does, a broken escape, a route that does.
    await visit(
      `#/compare/${enc(evalId)}/${enc(hrefId)}`,
      [evalId, hrefId],
      '[data-testid="deltas"]',
    );
    await visit(
      `#/compare/${enc(P("url-a"))}/${enc(A("url-b"))}`,
      ["no such run"],
      '[data-testid="failure"]',
    );
    await visit(
      `#/rollout/${enc(evalId)}/0&x=${P("url-line")}`,
      [P("url-line")],
      '[data-testid="failure"]',
    );
    await visit(
      `#/rollout/${enc(evalId)}/${enc(`0&x=${A("url-line-enc")}`)}`,
      [A("url-line-enc")],
      '[data-testid="failure"]',
    );
    await visit(`#/run/${P("url-id")}`, ["no such run"], '[data-testid="failure"]');
    await visit(
      `#/run/%E0%A4%A${enc(P("url-escape"))}`,
      ["no such run"],
      '[data-testid="failure"]',
    );
    await visit(`#/${A("url-route")}`, [evalId], '[data-testid="runs"]');

    // A run id that is a javascript: URL: its links stay inside the page.
    await visit(`#/rollout/${enc(hrefId)}/0`, [hrefId], '[data-testid="message"]');
    const hrefs = await page.$$eval("a[href]", (as) => as.map((a) => a.getAttribute("href") ?? ""));
    assert.ok(hrefs.every((h) => h.startsWith("#")), hrefs.join(" "));
    await page.click("#app a[href]");
    await page.waitForSelector('[data-testid="run-title"]');
    assert.deepEqual(dialogs, []);
    assert.equal(await page.evaluate(() => (globalThis as Dom).__pwned), undefined);
  } finally {
    await browser.close();
    await server.close();
  }
});

/** `CSS.escape` for an attribute selector's quoted value. */
function CSS_ESCAPE(value: string): string {
  return value.replace(/["\\]/g, (c) => `\\${c}`);
}

/** One raw HTTP/1.1 request (so the Host header is exactly what a rebinding browser sends). */
async function rawRequest(port: number, head: string): Promise<{ status: number; text: string }> {
  const conn = await Deno.connect({ hostname: "127.0.0.1", port });
  try {
    await conn.write(new TextEncoder().encode(head));
    let text = "";
    const buf = new Uint8Array(65536);
    for (;;) {
      const n = await conn.read(buf);
      if (n === null) break;
      text += new TextDecoder().decode(buf.subarray(0, n));
    }
    return { status: Number(text.match(/^HTTP\/1\.[01] (\d{3})/)?.[1] ?? 0), text };
  } finally {
    try {
      conn.close();
    } catch { /* closed by the server */ }
  }
}

Deno.test("vf view refuses a foreign Host (DNS rebinding) and Origin, answers only GET, and its CSP blocks inline script", async () => {
  await using tmp = await tempDir("vf_view_host_");
  const root = join(tmp.path, "outputs");
  await writeRun(
    join(root, "r1"),
    "results.jsonl",
    [plainRow(0, 1)],
    JSON.stringify({ env_id: "secret-env" }),
  );
  let port = 0;
  const app = viewApp(root, { indexDir: join(tmp.path, "index"), port: () => port });
  const server = await serveHttp((r) => app.fetch(r), { port: 0 });
  port = server.port;
  const get = (path: string, headers: Record<string, string>) =>
    rawRequest(
      port,
      `GET ${path} HTTP/1.1\r\n${
        Object.entries(headers).map(([k, v]) => `${k}: ${v}\r\n`).join("")
      }connection: close\r\n\r\n`,
    );
  try {
    // Host: loopback names and the bound address at this port only.
    for (
      const host of [`127.0.0.1:${port}`, `localhost:${port}`, `[::1]:${port}`, `LOCALHOST:${port}`]
    ) {
      const res = await get("/api/runs", { host });
      assert.equal(res.status, 200, `${host}: ${res.text}`);
      assert.match(res.text, /secret-env/);
    }
    for (
      const host of [
        `evil.example:${port}`,
        "evil.example",
        `127.0.0.1:${port + 1}`,
        `127.0.0.1.evil.example:${port}`,
        `localhost.evil.example:${port}`,
        `user@127.0.0.1:${port}`,
        `127.0.0.1:${port}/x`,
        "",
      ]
    ) {
      for (const path of ["/api/runs", "/", "/app.js", `/api/run?id=r1`]) {
        const res = await get(path, { host });
        assert.equal(res.status, 403, `${host} ${path}: ${res.text}`);
        assert.doesNotMatch(res.text, /secret-env/);
      }
    }
    // Origin: anything but GET/HEAD needs this origin, and then is refused as a method.
    const send = (method: string, headers: Record<string, string>) =>
      fetch(`http://127.0.0.1:${port}/api/runs`, {
        method,
        headers,
        body: method === "POST" ? "{}" : undefined,
      });
    for (
      const origin of [
        "http://evil.example",
        `http://evil.example:${port}`,
        "null",
        `http://localhost:${port + 1}`,
      ]
    ) {
      for (const method of ["POST", "PUT", "DELETE", "GET"]) {
        const res = await send(method, { origin });
        const body = await res.text();
        assert.equal(res.status, 403, `${method} with Origin ${origin}: ${body}`);
      }
    }
    const noOrigin = await send("POST", {});
    assert.equal(noOrigin.status, 403, await noOrigin.text());
    const same = await send("POST", { origin: `http://127.0.0.1:${port}` });
    assert.equal(same.status, 405, await same.text());
    assert.equal(same.headers.get("allow"), "GET, HEAD");
    const head = await fetch(`http://127.0.0.1:${port}/api/runs`, { method: "HEAD" });
    assert.equal(head.status, 200);

    // The headers: a CSP without inline script, nosniff, on the page, its script and the API.
    for (const path of ["/", "/app.js", "/api/runs", "/nowhere"]) {
      const res = await fetch(`http://127.0.0.1:${port}${path}`);
      await res.body?.cancel();
      const csp = res.headers.get("content-security-policy") ?? "";
      assert.match(csp, /(^|;\s*)default-src 'none'(;|$)/, `${path}: ${csp}`);
      assert.match(csp, /(^|;\s*)script-src 'self'(;|$)/, `${path}: ${csp}`);
      assert.doesNotMatch(csp, /unsafe-inline|unsafe-eval/, `${path}: ${csp}`);
      assert.match(csp, /frame-ancestors 'none'/);
      assert.equal(res.headers.get("x-content-type-options"), "nosniff", path);
    }
    const page = await (await fetch(`http://127.0.0.1:${port}/`)).text();
    assert.doesNotMatch(page, /<script(?![^>]*\ssrc=)[^>]*>/, "the page has an inline script");
    assert.doesNotMatch(page, /<style|\sstyle=/, "the page has inline style");

    // In the browser: the page works under its CSP, and an inline script does not run.
    const browser = await puppeteer.launch({
      executablePath: CHROMIUM,
      // DNS rebinding, for real: evil.example resolves to this machine's loopback.
      args: [...BROWSER_ARGS, "--host-resolver-rules=MAP evil.example 127.0.0.1"],
    });
    try {
      const tab = await browser.newPage();
      tab.setDefaultTimeout(120_000); // generous: the suite runs at load ~10
      const violations: string[] = [];
      tab.on("console", (m) => {
        if (/Content Security Policy/i.test(m.text())) violations.push(m.text());
      });
      await tab.goto(`http://127.0.0.1:${port}/`, { waitUntil: "networkidle0" });
      await tab.waitForSelector('[data-testid="runs"]');
      assert.deepEqual(violations, [], "the page itself breaks its CSP");
      const result = await tab.evaluate(() =>
        new Promise((resolve) => {
          const g = globalThis as Dom;
          const seen: string[] = [];
          g.document.addEventListener("securitypolicyviolation", (e: Dom) => {
            seen.push(e.effectiveDirective);
            if (seen.length === 2) {
              resolve({ seen, inline: g.__inline, color: g.getComputedStyle(div).color });
            }
          });
          const div = g.document.createElement("div");
          div.setAttribute("style", "color: rgb(255, 0, 0)");
          g.document.body.append(div);
          const s = g.document.createElement("script");
          s.textContent = "window.__inline = 1";
          g.document.body.append(s);
          setTimeout(
            () => resolve({ seen, inline: g.__inline, color: g.getComputedStyle(div).color }),
            20_000,
          );
        })
      ) as { seen: string[]; inline: unknown; color: string };
      assert.equal(result.inline, undefined, "an inline script ran");
      assert.deepEqual(
        result.seen.sort(),
        ["script-src-elem", "style-src-attr"],
        JSON.stringify(result),
      );
      assert.notEqual(result.color, "rgb(255, 0, 0)");

      // A page on evil.example (rebound to 127.0.0.1) gets 403 and cannot read the API.
      const evil = await browser.newPage();
      evil.setDefaultTimeout(120_000); // generous: the suite runs at load ~10
      const res = await evil.goto(`http://evil.example:${port}/`, { waitUntil: "networkidle0" });
      assert.equal(res?.status(), 403);
      const read = await evil.evaluate(async () => {
        const r = await fetch("/api/runs");
        return { status: r.status, text: await r.text() };
      });
      assert.equal(read.status, 403);
      assert.doesNotMatch(read.text, /secret-env/);
    } finally {
      await browser.close();
    }
  } finally {
    await server.close();
  }
});

Deno.test("hostAllowed(): loopback spellings at the viewer's port only; a trailing dot, another port, a name under a wildcard bind and IPv6 forms of other hosts are refused", () => {
  const p = 8400;
  const yes = (host: string, hostname?: string) =>
    assert.equal(hostAllowed(host, { hostname, port: p }), true, `${host} (bound ${hostname})`);
  const no = (host: string, hostname?: string) =>
    assert.equal(hostAllowed(host, { hostname, port: p }), false, `${host} (bound ${hostname})`);
  // Bound to 127.0.0.1 (the default): loopback names and numeric spellings of 127.0.0.1.
  // (127.0.0.1. is the address too: an IP literal, not a name DNS can rebind.)
  for (
    const h of [
      "127.0.0.1",
      "localhost",
      "LocalHost",
      "[::1]",
      "[0:0:0:0:0:0:0:1]",
      "127.1",
      "127.0.0.1.",
    ]
  ) {
    yes(`${h}:${p}`);
  }
  for (
    const h of [
      `localhost.:${p}`, // a name with its root dot is another name to a resolver's search list
      `127.0.0.2:${p}`,
      `[::ffff:127.0.0.2]:${p}`,
      `[::2]:${p}`,
      `localhost:${p + 1}`,
      `[::1]:${p + 1}`,
      `127.0.0.1:${p + 65536}`,
      "localhost", // no port: port 80
      `localhost:${p}.`,
      ` localhost:${p}`,
      `localhost:${p}\t`,
      `[::1%25lo]:${p}`,
      `evil.example:${p}`,
    ]
  ) no(h);
  // Bound to IPv6 loopback.
  yes(`[::1]:${p}`, "::1");
  yes(`localhost:${p}`, "::1");
  no(`evil.example:${p}`, "::1");
  // Bound to every interface: any IP literal (rebinding needs a name), never a name.
  for (const bound of ["0.0.0.0", "::"]) {
    yes(`10.0.0.5:${p}`, bound);
    yes(`[fe80::1]:${p}`, bound);
    no(`10.0.0.5.nip.io:${p}`, bound);
    no(`evil.example:${p}`, bound);
    no(`10.0.0.5:${p + 1}`, bound);
  }
  // Bound to a name: that name, not another spelling of it.
  yes(`box.lan:${p}`, "box.lan");
  no(`box.lan.:${p}`, "box.lan");
  no(`box.lan.evil.example:${p}`, "box.lan");
});

Deno.test("vf view bound beyond loopback warns that anyone who reaches the port can read every run; on loopback it does not", async () => {
  await using tmp = await tempDir("vf_view_bind_");
  await writeRun(join(tmp.path, "r1"), "results.jsonl", [plainRow(0, 1)], "{}");
  const serve = async (host: string[]) => {
    const child = cliCommand(["view", tmp.path, "--port", "0", ...host], {
      cwd: tmp.path,
      registry: false,
    }).spawn();
    const out = child.stdout.pipeThrough(new TextDecoderStream()).getReader();
    let stdout = "";
    // The address line comes once the server listens (after any warning on stderr).
    while (!/vf view: .* at http/.test(stdout)) {
      const { value, done } = await out.read();
      if (done) break;
      stdout += value;
    }
    child.kill("SIGTERM");
    out.releaseLock();
    await child.stdout.cancel().catch(() => {});
    const stderr = await new Response(child.stderr).text();
    await child.status;
    return { stdout, stderr };
  };
  const open = await serve(["--host", "0.0.0.0"]);
  assert.match(open.stdout, /vf view: 1 run at http:\/\/127\.0\.0\.1:\d+\//, open.stdout);
  assert.match(
    open.stderr,
    /listening on "0\.0\.0\.0" port \d+, not loopback: anyone who can reach it can read every run/,
  );
  const local = await serve([]);
  assert.match(local.stdout, /vf view: 1 run at http:\/\/127\.0\.0\.1:\d+\//, local.stdout);
  assert.doesNotMatch(local.stderr, /not loopback/);
});
