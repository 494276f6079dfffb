/**
 * `vf view` in a real headless Chromium (Debian's `chromium`, driven by puppeteer-core; tests/
 * setup.sh installs it): the runs list, a 10k-rollout run paged from its on-disk index and
 * filtered to errors, a corrupt line shown as corrupt, a transcript with tool calls and
 * sandbox commands, a running run's page following new lines, the compare page, a folder with
 * no runs, and a screenshot that fails when the page renders blank. What the page shows is
 * checked against the files.
 * @module
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import puppeteer from "npm:puppeteer-core@^25.0.0";
import { serveHttp } from "../lib/model/http_server.ts";
import { viewApp } from "../lib/view/server.ts";
import { pairedComparison } from "../lib/eval/compare.ts";
import { cliCommand, collect, tempDir, transcript } from "./_cli.ts";

// deno-lint-ignore no-explicit-any
type Json = any;
/** The page's objects, seen from this (DOM-less) program. */
// deno-lint-ignore no-explicit-any
type Dom = any;

const CHROMIUM = "/usr/bin/chromium";

function legacyRow(i: number, examples: number, shift = 0): Json {
  const example_id = i % examples;
  const errored = i % 97 === 5;
  return {
    example_id,
    prompt: [{ role: "user", content: `Question ${example_id}` }],
    completion: [{ role: "assistant", content: `Answer ${i}` }],
    reward: errored ? 0 : (example_id + shift) % 3 === 0 ? 0 : 1,
    error: errored ? { error: "InfraError", message: "sandbox gone" } : null,
    stop_condition: errored ? "has_error" : "no_tools_called",
  };
}

async function writeRun(dir: string, lines: string[], metadata: Json): Promise<void> {
  await Deno.mkdir(dir, { recursive: true });
  await Deno.writeTextFile(join(dir, "results.jsonl"), lines.join("\n") + "\n");
  await Deno.writeTextFile(join(dir, "metadata.json"), JSON.stringify(metadata));
}

const TRACE = {
  format_version: 2,
  trace_id: "t-1",
  run_id: "ccc",
  taskset: "files",
  task: { key: "sum-files", idx: 0, hash: "h" },
  example_id: 0,
  rollout_index: 0,
  model: "m",
  harness: "bash",
  role: "agent",
  trainable: true,
  messages: [
    { role: "user", content: "Sum the numbers in /data." },
    {
      role: "assistant",
      content: null,
      tool_calls: [{ id: "call_1", name: "bash", arguments: '{"command":"cat /data/*"}' }],
    },
    { role: "tool", tool_call_id: "call_1", content: "exit code: 0\nstdout:\n3\n4" },
    {
      role: "assistant",
      content: null,
      tool_calls: [{
        id: "call_2",
        name: "edit",
        arguments: '{"path":"/out","old_str":"","new_str":"7"}',
      }],
    },
    { role: "tool", tool_call_id: "call_2", content: "edited /out" },
    { role: "assistant", content: "The sum is 7." },
  ],
  model_calls: [
    {
      turn: 0,
      started_at: 1,
      duration_ms: 12,
      request_messages: 1,
      response: { usage: { prompt_tokens: 30, completion_tokens: 5 } },
    },
    {
      turn: 1,
      started_at: 2,
      duration_ms: 9,
      request_messages: 3,
      response: { usage: { prompt_tokens: 40, completion_tokens: 6 } },
    },
    {
      turn: 2,
      started_at: 3,
      duration_ms: 8,
      request_messages: 5,
      response: { usage: { prompt_tokens: 50, completion_tokens: 4 } },
    },
  ],
  tool_calls: [
    {
      id: "call_1",
      name: "bash",
      arguments: '{"command":"cat /data/*"}',
      output: "exit code: 0\nstdout:\n3\n4",
      exit_code: 0,
      duration_ms: 40,
    },
    {
      id: "call_2",
      name: "edit",
      arguments: '{"path":"/out"}',
      output: "edited /out",
      duration_ms: 30,
    },
  ],
  stop_condition: "no_tools_called",
  reward: 1,
  rewards: { correct: 1 },
  metrics: { turns: 3 },
  ok: true,
  error: null,
  usage: { input_tokens: 120, output_tokens: 15 },
  timing: {},
  info: { judge: [{ judge: "style", verdict: "A", score: 1 }] },
};

Deno.test("vf view in headless Chromium: runs list, a 10k-rollout run filtered to errors, a corrupt line, a transcript with tool calls, a live run, compare, and no blank page", async () => {
  await using tmp = await tempDir("vf_view_");
  const root = join(tmp.path, "outputs");
  const big = Array.from({ length: 10_000 }, (_, i) => JSON.stringify(legacyRow(i, 1000)));
  big.splice(4321, 0, '{"example_id": 7, "reward": 1, "comp'); // a torn, corrupt line
  const bigDir = join(root, "evals/gsm8k--m/aaa");
  await writeRun(bigDir, big, {
    env_id: "gsm8k",
    model: "m",
    avg_reward: 0.66,
    date: "2026-12-01T10:00:00Z",
  });
  const other = Array.from({ length: 3000 }, (_, i) => JSON.stringify(legacyRow(i, 1000, 1)));
  const otherDir = join(root, "evals/gsm8k--m2/bbb");
  await writeRun(otherDir, other, { env_id: "gsm8k", model: "m2", date: "2026-12-01T09:00:00Z" });
  const traceDir = join(root, "evals/files--m/ccc");
  await Deno.mkdir(traceDir, { recursive: true });
  await Deno.writeTextFile(join(traceDir, "traces.jsonl"), JSON.stringify(TRACE) + "\n");
  await Deno.writeTextFile(
    join(traceDir, "metadata.json"),
    JSON.stringify({ taskset: "files", model: "m" }),
  );
  const errorsInFile = big.filter((l) => l.includes('"InfraError"')).length + 1; // + the corrupt one

  const app = viewApp(root, { indexDir: join(tmp.path, "index") });
  const server = await serveHttp((r) => app.fetch(r), { port: 0 });
  const emptyRoot = join(tmp.path, "empty");
  await Deno.mkdir(emptyRoot);
  const emptyApp = viewApp(emptyRoot, { indexDir: join(tmp.path, "index") });
  const empty = await serveHttp((r) => emptyApp.fetch(r), { port: 0 });
  const browser = await puppeteer.launch({
    executablePath: CHROMIUM,
    args: ["--no-sandbox", "--headless=new", "--disable-gpu", "--disable-dev-shm-usage"],
  });
  try {
    const page = await browser.newPage();
    const base = `http://127.0.0.1:${server.port}/`;
    const textOf = (sel: string) => page.$eval(sel, (el) => (el as Dom).innerText);

    // The runs list: every run, with the rollouts its file holds.
    await page.goto(base, { waitUntil: "networkidle0" });
    await page.waitForSelector('[data-testid="runs"]');
    const listed = await page.$$eval(
      "tr[data-id]",
      (rows) =>
        rows.map((
          r,
        ) => [
          r.getAttribute("data-id"),
          (r.querySelector('[data-testid="run-rollouts"]') as Dom).innerText,
        ]),
    );
    assert.deepEqual(
      new Map(listed as Array<[string, string]>),
      new Map([
        ["evals/gsm8k--m/aaa", "10001"],
        ["evals/gsm8k--m2/bbb", "3000"],
        ["evals/files--m/ccc", "1"],
      ]),
    );

    // A screenshot of it is not blank: many distinct colours.
    const png = await page.screenshot({ encoding: "base64" }) as string;
    const colours = await page.evaluate(async (b64: string) => {
      const img = new (globalThis as Dom).Image();
      img.src = "data:image/png;base64," + b64;
      await img.decode();
      const canvas = (globalThis as Dom).document.createElement("canvas");
      canvas.width = img.width;
      canvas.height = img.height;
      const ctx = canvas.getContext("2d")!;
      ctx.drawImage(img, 0, 0);
      const data = ctx.getImageData(0, 0, img.width, img.height).data;
      const seen = new Set<number>();
      for (let i = 0; i < data.length; i += 4 * 7) {
        seen.add((data[i] << 16) | (data[i + 1] << 8) | data[i + 2]);
      }
      return seen.size;
    }, png);
    assert.ok(colours > 20, `the screenshot has ${colours} colours: a blank page`);

    // The big run: its count, then only the errors.
    await page.goto(`${base}#/run/${encodeURIComponent("evals/gsm8k--m/aaa")}`);
    await page.waitForSelector('[data-testid="rollouts"] tr[data-line]');
    assert.equal(await textOf('[data-testid="count"]'), "10001");
    assert.match(await textOf('[data-testid="matching"]'), /^10001 matching · page 1 of 201/);
    await page.select('select[name="errors"]', "only");
    await page.click("#filters button");
    await page.waitForFunction(
      (n: number) =>
        (globalThis as Dom).document.querySelector('[data-testid="matching"]')?.textContent
          ?.startsWith(
            `${n} matching`,
          ),
      {},
      errorsInFile,
    );
    const errorCells = await page.$$eval(
      '[data-testid="rollouts"] tr[data-line] td.err',
      (tds) => tds.map((t) => (t as Dom).innerText),
    );
    assert.ok(
      errorCells.every((t) => t === "InfraError" || t === "corrupt line"),
      errorCells.join(","),
    );
    assert.ok(errorCells.includes("corrupt line"));

    // The corrupt line opens as corrupt, not as a crash.
    await page.goto(`${base}#/rollout/${encodeURIComponent("evals/gsm8k--m/aaa")}/4321`);
    await page.waitForSelector('[data-testid="corrupt"]');
    assert.match(await textOf('[data-testid="corrupt"]'), /corrupt[\s\S]*"comp/);

    // A transcript with tool calls, model calls and sandbox commands, as the file has them.
    await page.goto(`${base}#/rollout/${encodeURIComponent("evals/files--m/ccc")}/0`);
    await page.waitForSelector('[data-testid="tool-call"]');
    assert.equal((await page.$$('[data-testid="message"]')).length, TRACE.messages.length);
    const calls = await page.$$eval(
      '[data-testid="tool-call"] b',
      (bs) => bs.map((b) => (b as Dom).innerText),
    );
    assert.deepEqual(calls, ["bash", "edit"]);
    assert.equal(
      (await page.$$('[data-testid="model-calls"] tr')).length,
      1 + TRACE.model_calls.length,
    );
    assert.equal(
      (await page.$$('[data-testid="commands"] tr')).length,
      1 + TRACE.tool_calls.length,
    );
    assert.equal(await textOf('[data-testid="reward"]'), "1.000");
    assert.match(await page.content(), /Judges[\s\S]*style/);

    // Live: the run's page follows lines as they land.
    await page.goto(`${base}#/run/${encodeURIComponent("evals/gsm8k--m2/bbb")}`);
    await page.waitForSelector('[data-testid="count"]');
    assert.equal(await textOf('[data-testid="count"]'), "3000");
    const more = Array.from({ length: 25 }, (_, i) => JSON.stringify(legacyRow(3000 + i, 1000, 1)));
    await Deno.writeTextFile(join(otherDir, "results.jsonl"), more.join("\n") + "\n", {
      append: true,
    });
    await page.waitForFunction(
      () =>
        (globalThis as Dom).document.querySelector('[data-testid="count"]')?.textContent === "3025",
      { timeout: 30_000 },
    );
    // A requeued rollout (`vf ctl requeue`): its errored row lands, then its retry naming it and
    // one more row; the page counts the rollout once.
    const otherFile = join(otherDir, "results.jsonl");
    const errored = { ...legacyRow(3025, 1000, 1), trajectory_id: "live-bad", reward: null };
    const bad = JSON.stringify({ ...errored, error: { error: "ModelError" } });
    await Deno.writeTextFile(otherFile, bad + "\n", { append: true });
    const countIs = (...want: string[]) =>
      page.waitForFunction(
        (w: string[]) =>
          w.includes(
            (globalThis as Dom).document.querySelector('[data-testid="count"]')?.textContent,
          ),
        { timeout: 60_000 },
        want,
      );
    await countIs("3026");
    const retry = { ...legacyRow(3025, 1000, 1), trajectory_id: "live-good", retry_of: "live-bad" };
    const late = [retry, legacyRow(3026, 1000, 1)].map((r) => JSON.stringify(r));
    await Deno.writeTextFile(otherFile, late.join("\n") + "\n", { append: true });
    await countIs("3027", "3028"); // 3028 counts the errored row and its retry both
    assert.equal(await textOf('[data-testid="count"]'), "3027");

    // Compare: the page's delta is the paired comparison of the two files.
    const rewards = (lines: string[]) => {
      const m = new Map<string, number[]>();
      for (const l of lines) {
        try {
          const r = JSON.parse(l);
          if (r.error) continue;
          m.set(String(r.example_id), [...(m.get(String(r.example_id)) ?? []), r.reward]);
        } catch { /* the corrupt line */ }
      }
      return m;
    };
    const expected = pairedComparison(rewards(big), rewards([...other, ...more, ...late]));
    await page.goto(
      `${base}#/compare/${encodeURIComponent("evals/gsm8k--m/aaa")}/${
        encodeURIComponent("evals/gsm8k--m2/bbb")
      }`,
    );
    await page.waitForSelector('[data-testid="delta"]');
    assert.equal(await textOf('[data-testid="delta"]'), expected.delta.toFixed(4));

    // A folder without runs says so.
    await page.goto(`http://127.0.0.1:${empty.port}/`);
    await page.waitForSelector('[data-testid="no-runs"]');
    assert.match(await textOf('[data-testid="no-runs"]'), /No runs under/);
  } finally {
    await browser.close();
    await server.close();
    await empty.close();
  }

  // The command: a folder that does not exist is an error naming it.
  const missing = await collect(
    cliCommand(["view", join(tmp.path, "nowhere")], { cwd: tmp.path, env: {}, registry: false }),
  );
  assert.notEqual(missing.code, 0, transcript(missing));
  assert.match(missing.stderr, /nowhere: no such folder/);
});
