/**
 * The numbers `vf view` shows, checked in a real headless Chromium against runs the real CLI
 * wrote, in both layouts: `vf demo -r 2` (a `vf eval` run: results.jsonl with `token_usage` and
 * no `rollout_index`), `vf run file-sum -r 2` and `vf run file-sum --env.id best-of-n` (traces
 * of a Docker taskset; best-of-n writes one episode line holding each task's attempts). The
 * runs list's rollouts and total tokens match what the CLI printed and what the files hold,
 * every row's rollout index and tokens match the file, runs sort newest first by their
 * metadata date, the histogram has axes, a long command output wraps, `trace.info` is shown,
 * and run ids pasted into the URL unencoded (or as the run's folder) are found.
 * @module
 */
import assert from "node:assert/strict";
import { basename, join } from "node:path";
import puppeteer from "npm:puppeteer-core@^25.0.0";
import { serveHttp } from "../lib/model/http_server.ts";
import { viewApp } from "../lib/view/server.ts";
import { type CliResult, runCli, tempDir, transcript } from "./_cli.ts";
import { bashModel, startModelServer } from "./model_server.ts";

// deno-lint-ignore no-explicit-any
type Json = any;
/** The page's objects, seen from this (DOM-less) program. */
// deno-lint-ignore no-explicit-any
type Dom = any;

const CHROMIUM = "/usr/bin/chromium";
const CAT_INPUT = "cat /app/input.txt";
const WRITE_SUM = "awk '{ s += $1 } END { print s }' /app/input.txt > /app/output/answer.txt";
/** One 3000-character line without a space: it must wrap in the commands table. */
const LONG_LINE = "head -c 3000 /dev/zero | tr '\\0' x";

interface Run {
  id: string;
  dir: string;
  lines: Json[];
  metadata: Json;
  res: CliResult;
}

async function readRun(root: string, dir: string, res: CliResult): Promise<Run> {
  const file = (await Deno.stat(join(dir, "traces.jsonl")).then(() => true, () => false))
    ? "traces.jsonl"
    : "results.jsonl";
  const text = await Deno.readTextFile(join(dir, file));
  return {
    id: dir.slice(root.length + 1),
    dir,
    lines: text.split("\n").filter(Boolean).map((l) => JSON.parse(l)),
    metadata: JSON.parse(await Deno.readTextFile(join(dir, "metadata.json"))),
    res,
  };
}

/** What the CLI's summary said: rollouts and tokens. */
function cliSaid(res: CliResult): { rollouts: number; tokens: number } {
  const rollouts = Number(/\brollouts (\d+)/.exec(res.stdout)?.[1]);
  const tok = /tokens: input (\d+)(?: \([^)]*\))?, output (\d+)/.exec(res.stdout);
  assert.ok(rollouts && tok, transcript(res));
  return { rollouts, tokens: Number(tok[1]) + Number(tok[2]) };
}

const tokensOf = (u: Json) => (u?.input_tokens ?? 0) + (u?.output_tokens ?? 0);

Deno.test("vf view shows the numbers vf eval and vf run wrote: rollouts, total tokens, rollout indexes, best-of-n attempts; sorts by date, has axes, wraps, shows info, finds pasted ids", async () => {
  await using tmp = await tempDir("vf_view_numbers_");
  const root = join(tmp.path, "outputs");
  const dirOf = (res: CliResult, word: "results" | "traces") => {
    const m = new RegExp(`^Saving ${word} to (.+)$`, "m").exec(res.stderr + "\n" + res.stdout);
    assert.ok(m, transcript(res));
    return m[1].trim();
  };

  // A vf eval run (the demo model answers with token usage), -r 2.
  const demo = await runCli(["demo", "-n", "3", "-r", "2"], {
    cwd: tmp.path,
    env: {},
    registry: false,
  });
  assert.equal(demo.code, 0, transcript(demo));
  const evalRun = await readRun(root, dirOf(demo, "results"), demo);

  // Two vf run runs of a Docker taskset: -r 2, and best-of-n with 3 attempts.
  await using server = await startModelServer({
    responder: bashModel(CAT_INPUT, LONG_LINE, WRITE_SUM),
  });
  const vfRun = async (...flags: string[]) => {
    const res = await runCli(
      ["run", "file-sum", "-m", "vf-test", "-b", server.url, "-o", "outputs", "-n", "2", ...flags],
      { cwd: tmp.path, env: {}, registry: false, docker: true },
    );
    assert.equal(res.code, 0, transcript(res));
    return await readRun(root, dirOf(res, "traces"), res);
  };
  const taskRun = await vfRun("-r", "2");
  const bestRun = await vfRun("--env.id", "best-of-n", "--env.n", "3");
  assert.equal(bestRun.lines.length, 2, "best-of-n writes one episode a task");

  // A run whose trace has info (a real trace of the run above, with info added).
  const infoDir = join(root, "evals/file-sum--vf-test/with-info");
  await Deno.mkdir(infoDir, { recursive: true });
  const INFO = { judge_note: "the answer file was written once", retries: [1, 2] };
  await Deno.writeTextFile(
    join(infoDir, "traces.jsonl"),
    JSON.stringify({ ...taskRun.lines[0], info: INFO }) + "\n",
  );
  await Deno.writeTextFile(
    join(infoDir, "metadata.json"),
    JSON.stringify({ ...taskRun.metadata, date: "2020-01-01T00:00:00.000Z" }),
  );
  // The oldest run's file is touched last: the list must still follow the metadata's dates.
  await Deno.utime(join(evalRun.dir, "results.jsonl"), new Date(), new Date(Date.now() + 60_000));

  const app = viewApp(root, { indexDir: join(tmp.path, "index") });
  const view = await serveHttp((r) => app.fetch(r), { port: 0 });
  const browser = await puppeteer.launch({
    executablePath: CHROMIUM,
    args: ["--no-sandbox", "--headless=new", "--disable-gpu", "--disable-dev-shm-usage"],
  });
  try {
    const page = await browser.newPage();
    page.setDefaultTimeout(120_000); // generous: the suite runs at load ~10
    await page.setViewport({ width: 1200, height: 900 });
    const base = `http://127.0.0.1:${view.port}/`;
    const go = async (hash: string, selector: string) => {
      await page.goto("about:blank");
      try {
        await page.goto(base + hash, { waitUntil: "networkidle0" });
        await page.waitForSelector(selector);
      } catch (error) {
        throw new Error(`${hash}: ${selector} did not show`, { cause: error });
      }
    };
    const textOf = (sel: string) => page.$eval(sel, (el) => (el as Dom).textContent as string);
    const table = () =>
      page.$$eval('[data-testid="rollouts"] tr[data-line]', (trs) =>
        trs.map((tr) => ({
          line: Number((tr as Dom).dataset.line),
          example: (tr.children[1] as Dom).textContent,
          rollout: (tr.querySelector('[data-testid="rollout-index"]') as Dom).textContent,
          tokens: Number((tr.querySelector('[data-testid="rollout-tokens"]') as Dom).textContent),
        })));

    // The runs list: newest first by metadata date; rollouts and total tokens as the CLI said
    // and as the files hold.
    await go("#/", '[data-testid="runs"]');
    const listed = await page.$$eval("tr[data-id]", (trs) =>
      trs.map((tr) => ({
        id: tr.getAttribute("data-id")!,
        rollouts: Number((tr.querySelector('[data-testid="run-rollouts"]') as Dom).textContent),
        tokens: Number((tr.querySelector('[data-testid="run-tokens"]') as Dom).textContent),
      })));
    const byDate = [evalRun, taskRun, bestRun].sort((a, b) =>
      Date.parse(b.metadata.date) - Date.parse(a.metadata.date)
    );
    assert.deepEqual(listed.map((r) => r.id), [
      ...byDate.map((r) => r.id),
      "evals/file-sum--vf-test/with-info",
    ]);
    const evalTokens = evalRun.lines.reduce((a, l) => a + tokensOf(l.token_usage), 0);
    const traceTokens = (run: Run) =>
      run.lines.flatMap((l) => l.traces ?? [l]).reduce((a, t) => a + tokensOf(t.usage), 0);
    const expected = new Map([
      [evalRun.id, { rollouts: evalRun.lines.length, tokens: evalTokens }],
      [taskRun.id, { rollouts: taskRun.lines.length, tokens: traceTokens(taskRun) }],
      [bestRun.id, { rollouts: 6, tokens: traceTokens(bestRun) }],
    ]);
    for (const run of [evalRun, taskRun, bestRun]) {
      const shown = listed.find((r) => r.id === run.id)!;
      assert.deepEqual(shown, { id: run.id, ...expected.get(run.id)! });
      assert.deepEqual(
        { rollouts: shown.rollouts, tokens: shown.tokens },
        cliSaid(run.res),
        transcript(run.res),
      );
      assert.equal(shown.rollouts, run.metadata.num_rollouts);
    }
    assert.ok(
      evalTokens > 0 &&
        evalTokens ===
          evalRun.metadata.usage.total_input_tokens + evalRun.metadata.usage.total_output_tokens,
    );

    // The vf eval run: each row's rollout index is its place among its example's rows, and
    // its tokens are its token_usage.
    await go(`#/run/${encodeURIComponent(evalRun.id)}`, '[data-testid="rollouts"] tr[data-line]');
    assert.equal(await textOf('[data-testid="count"]'), String(evalRun.lines.length));
    assert.equal(await textOf('[data-testid="tokens"]'), String(evalTokens));
    const seen = new Map<number, number>();
    const want = evalRun.lines.map((l, line) => {
      const n = seen.get(l.example_id) ?? 0;
      seen.set(l.example_id, n + 1);
      return {
        line,
        example: String(l.example_id),
        rollout: String(n),
        tokens: tokensOf(l.token_usage),
      };
    });
    assert.deepEqual(await table(), want);
    assert.ok(want.some((w) => w.rollout === "1"), "-r 2 gives every example a rollout 1");

    // The histogram has axes: rewards 0 … 1 along x, rollout counts up y.
    const buckets = new Array(10).fill(0);
    for (const l of evalRun.lines) buckets[Math.min(9, Math.floor(l.reward * 10))]++;
    const xs = await page.$$eval(
      '[data-testid="hist-x"] span',
      (s) => s.map((e) => (e as Dom).textContent),
    );
    assert.deepEqual(xs, [
      "0.0",
      "0.1",
      "0.2",
      "0.3",
      "0.4",
      "0.5",
      "0.6",
      "0.7",
      "0.8",
      "0.9",
      "1.0",
    ]);
    const ys = await page.$$eval(
      '[data-testid="hist-y"] span',
      (s) => s.map((e) => (e as Dom).textContent),
    );
    assert.deepEqual(ys, [String(Math.max(...buckets)), "0"]);
    assert.match(await textOf('[data-testid="histogram-box"]'), /reward[\s\S]*rollouts/);

    // One of its rollouts: the index and tokens of that row.
    const second = want.find((w) => w.rollout === "1")!;
    await go(
      `#/rollout/${encodeURIComponent(evalRun.id)}/${second.line}`,
      '[data-testid="trace-rollout"]',
    );
    assert.equal(await textOf('[data-testid="trace-rollout"]'), "1");
    assert.equal(await textOf('[data-testid="trace-tokens"]'), String(second.tokens));
    assert.match(
      await textOf('[data-testid="rollout-title"]'),
      new RegExp(`Example ${second.example} · rollout 1`),
    );

    // The vf run runs: rollout indexes from the traces; best-of-n lists its 6 attempts.
    await go(`#/run/${encodeURIComponent(taskRun.id)}`, '[data-testid="rollouts"] tr[data-line]');
    assert.deepEqual(
      await table(),
      taskRun.lines.map((t, line) => ({
        line,
        example: t.task.key,
        rollout: String(t.rollout_index),
        tokens: tokensOf(t.usage),
      })),
    );
    await go(`#/run/${encodeURIComponent(bestRun.id)}`, '[data-testid="rollouts"] tr[data-line]');
    assert.equal(await textOf('[data-testid="count"]'), "6");
    assert.equal(await textOf('[data-testid="matching"]').then((t) => t.split(" ")[0]), "6");
    assert.deepEqual(
      await table(),
      bestRun.lines.flatMap((e, line) =>
        e.traces.map((t: Json) => ({
          line,
          example: t.task.key,
          rollout: `${t.rollout_index} · attempt ${t.attempt}`,
          tokens: tokensOf(t.usage),
        }))
      ),
    );

    // A long command output wraps inside the commands table; nothing scrolls sideways.
    await go(`#/rollout/${encodeURIComponent(taskRun.id)}/0`, '[data-testid="commands"]');
    assert.ok(
      taskRun.lines[0].tool_calls.some((c: Json) => String(c.output).includes("x".repeat(2500))),
      "the run's trace holds the long line",
    );
    const widths = await page.evaluate(() => {
      const g = globalThis as Dom;
      const t = g.document.querySelector('[data-testid="commands"]');
      return {
        table: t.getBoundingClientRect().width,
        box: g.document.getElementById("app").clientWidth,
        page: g.document.documentElement.scrollWidth,
        window: g.innerWidth,
        cells: [...t.querySelectorAll("td")].map((td: Dom) => td.scrollWidth - td.clientWidth),
      };
    });
    assert.ok(widths.table <= widths.box, JSON.stringify(widths));
    assert.ok(widths.page <= widths.window, JSON.stringify(widths));
    assert.ok(widths.cells.every((d: number) => d <= 1), JSON.stringify(widths));

    // trace.info is shown.
    await go(
      `#/rollout/${encodeURIComponent("evals/file-sum--vf-test/with-info")}/0`,
      '[data-testid="info"]',
    );
    const info = await textOf('[data-testid="info"]');
    assert.ok(info.includes(INFO.judge_note), info);
    assert.deepEqual(JSON.parse(info.slice(info.indexOf("{"))), INFO);

    // Pasted ids: unencoded slashes, the run's short id, the run's folder, a trailing slash.
    for (const pasted of [evalRun.id, basename(evalRun.dir), evalRun.dir, `${evalRun.id}/`]) {
      await go(`#/run/${pasted}`, '[data-testid="run-title"]');
      assert.equal(await textOf('[data-testid="run-title"]'), evalRun.id, pasted);
    }
    await go(`#/rollout/${evalRun.id}/${second.line}`, '[data-testid="trace-rollout"]');
    assert.equal(await textOf('[data-testid="trace-rollout"]'), "1");
    await go(`#/compare/${taskRun.id}/${bestRun.id}`, '[data-testid="delta"]');
    assert.match(await textOf("#app"), new RegExp(`A ${taskRun.id} · B ${bestRun.id}`));
  } finally {
    await browser.close();
    await view.close();
  }
});
