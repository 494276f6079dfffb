/**
 * The numbers `vf view` shows for runs with errors, in a real headless Chromium, against a
 * `vf eval` run and a `vf run` taskset run the real CLI wrote against a scripted loopback model:
 * some rollouts right, some wrong, and some whose reward throws (errored, never scored). Every
 * number is computed here from the run's own files and compared with the page: the runs list's
 * rollouts, mean reward, pass@k, errors and tokens; the run page's cards, histogram (bars,
 * axis, unscored) and each row's reward, error, turns and tokens; each rollout's reward,
 * tokens and duration, and a trace's model calls (duration, input and output tokens); and the
 * histogram of a run whose summed rewards go past 1.
 * @module
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import puppeteer from "npm:puppeteer-core@^25.0.0";
import { serveHttp } from "../lib/model/http_server.ts";
import { viewApp } from "../lib/view/server.ts";
import { type CliResult, MOD_URL, runCli, tempDir, transcript } from "./_cli.ts";
import { lastUserText, startModelServer } from "./model_server.ts";

// deno-lint-ignore no-explicit-any
type Json = any;
// deno-lint-ignore no-explicit-any
type Dom = any;

const CHROMIUM = "/usr/bin/chromium";

/** q0 right, q1 right then wrong, q2 a reply the reward throws on. */
const ENV = `import { Rubric, SingleTurnEnv } from "${MOD_URL}";
const text = (c) => String(c.at(-1)?.content ?? "");
export function loadEnvironment() {
  return new SingleTurnEnv({
    envId: "mixed",
    evalDataset: [0, 1, 2].map((i) => ({ question: "q" + i, answer: "a" + i })),
    rubric: new Rubric({
      funcs: [
        function correct({ completion, answer }) {
          if (text(completion).includes("boom")) throw new Error("boom");
          return text(completion) === answer ? 1 : 0;
        },
      ],
    }),
  });
}
`;

const TASKSET = `import { reward, Task, Taskset } from "${MOD_URL}";
class Q extends Task {
  static override HARNESS = "null";
  correct = reward(({ trace }) => {
    const text = String(trace.messages.at(-1)?.content ?? "");
    if (text.includes("boom")) throw new Error("boom");
    return text.startsWith("a") ? 1 : 0;
  });
}
class Qs extends Taskset {
  get id() { return "mixed-tasks"; }
  *load() { for (const i of [0, 1, 2]) yield new Q({ id: "t" + i, prompt: "q" + i }); }
}
export function loadTaskset(config) { return new Qs(config); }
`;

/** Two rewards summed (upstream's weighted sum): a right answer scores 2, a wrong one 1. */
const SUMMED = `import { Rubric, SingleTurnEnv } from "${MOD_URL}";
const text = (c) => String(c.at(-1)?.content ?? "");
export function loadEnvironment() {
  return new SingleTurnEnv({
    envId: "summed",
    evalDataset: [3, 4].map((i) => ({ question: "q" + i, answer: "a" + i })),
    rubric: new Rubric({
      funcs: [
        function correct({ completion, answer }) { return text(completion) === answer ? 1 : 0; },
        function replied({ completion }) { return text(completion) ? 1 : 0; },
      ],
    }),
  });
}
`;

interface Run {
  id: string;
  lines: Json[];
  metadata: Json;
  res: CliResult;
}

/** What a run's files say, computed here the way the run counts: unscored rollouts left out. */
interface Expected {
  rollouts: number;
  errors: number;
  tokens: number;
  meanReward: number;
  passAtK: Record<string, number>;
  /** Per row: example, reward (null when unscored), error type, turns, tokens, duration. */
  rows: Array<
    {
      example: string;
      reward: number | null;
      error: string;
      turns: number;
      tokens: number;
      ms: number;
    }
  >;
}

const tokensOf = (u: Json) => (u?.input_tokens ?? 0) + (u?.output_tokens ?? 0);

function comb(n: number, k: number): number {
  let r = 1;
  for (let i = 1; i <= k; i++) r = (r * (n - k + i)) / i;
  return r;
}

function expectedOf(run: Run, r: number): Expected {
  const evalLayout = run.lines[0].trace_id === undefined;
  const rows = run.lines.map((l) => ({
    example: String(evalLayout ? l.example_id : l.task.key),
    reward: l.error ? null : l.reward as number,
    error: l.error ? String(l.error.error) : "",
    turns: (evalLayout ? l.completion : l.messages).filter((m: Json) => m.role === "assistant")
      .length,
    tokens: tokensOf(evalLayout ? l.token_usage : l.usage),
    ms: Math.round(evalLayout ? l.timing.total * 1000 : l.timing.total_ms),
  }));
  const scored = rows.filter((x) => x.reward !== null);
  const groups = new Map<string, number[]>();
  for (const x of scored) groups.set(x.example, [...(groups.get(x.example) ?? []), x.reward!]);
  const passAtK: Record<string, number> = {};
  for (let k = 1; k <= r; k++) {
    const per = [...groups.values()].filter((g) => g.length >= k).map((g) => {
      const c = g.filter((v) => v >= 0.5).length;
      return g.length - c < k ? 1 : 1 - comb(g.length - c, k) / comb(g.length, k);
    });
    if (per.length) passAtK[String(k)] = per.reduce((a, b) => a + b, 0) / per.length;
  }
  return {
    rollouts: rows.length,
    errors: rows.filter((x) => x.error).length,
    tokens: rows.reduce((a, x) => a + x.tokens, 0),
    meanReward: scored.reduce((a, x) => a + x.reward!, 0) / scored.length,
    passAtK,
    rows,
  };
}

Deno.test("vf view shows the numbers of runs with errors as their files hold them, for vf eval and vf run: mean reward, pass@k, errors, unscored rollouts, durations, model calls", async () => {
  await using tmp = await tempDir("vf_view_errors_");
  const root = join(tmp.path, "outputs");
  const asked = new Map<string, number>();
  await using server = await startModelServer({
    responder: (request) => {
      const q = lastUserText(request);
      const n = asked.get(q) ?? 0;
      asked.set(q, n + 1);
      if (q === "q0") return { content: "a0" };
      if (q === "q1") return { content: n % 2 === 0 ? "a1" : "nope" };
      if (q === "q3") return { content: "a3" };
      if (q === "q4") return { content: "nope" };
      return { content: "boom" };
    },
  });
  await Deno.writeTextFile(join(tmp.path, "mixed.ts"), ENV);
  await Deno.writeTextFile(join(tmp.path, "tasks.ts"), TASKSET);
  await Deno.writeTextFile(join(tmp.path, "summed.ts"), SUMMED);
  const common = ["-m", "m", "-b", server.url, "-r", "2", "-o", "outputs"];
  const readRun = async (res: CliResult, word: "results" | "traces"): Promise<Run> => {
    assert.equal(res.code, 0, transcript(res));
    const dir = new RegExp(`^Saving ${word} to (.+)$`, "m").exec(res.stderr)?.[1].trim();
    assert.ok(dir, transcript(res));
    return {
      id: dir.slice(root.length + 1),
      lines: (await Deno.readTextFile(join(dir, `${word}.jsonl`))).trim().split("\n")
        .map((l) => JSON.parse(l)),
      metadata: JSON.parse(await Deno.readTextFile(join(dir, "metadata.json"))),
      res,
    };
  };
  const evalRun = await readRun(
    await runCli(["eval", "./mixed.ts", "-n", "3", ...common], { cwd: tmp.path }),
    "results",
  );
  const taskRun = await readRun(
    await runCli(["run", "./tasks.ts", ...common, "--env.agent.runtime.type", "subprocess"], {
      cwd: tmp.path,
    }),
    "traces",
  );

  const summedRun = await readRun(
    await runCli([
      "eval",
      "./summed.ts",
      "-n",
      "2",
      ...common.slice(0, 4),
      "-r",
      "1",
      "-o",
      "outputs",
    ], {
      cwd: tmp.path,
    }),
    "results",
  );
  assert.deepEqual(summedRun.lines.map((l) => l.reward).sort(), [1, 2]);

  const runs = [evalRun, taskRun].map((run) => ({ run, want: expectedOf(run, 2) }));
  for (const { run, want } of runs) {
    // The runs hold what this test is about: right, wrong and unscored rollouts.
    assert.equal(want.rollouts, 6, transcript(run.res));
    assert.equal(want.errors, 2, transcript(run.res));
    assert.equal(want.meanReward, 0.75, transcript(run.res));
    assert.deepEqual(want.passAtK, { "1": 0.75, "2": 1 });
    assert.ok(want.rows.some((x) => x.ms > 0));
    // The CLI's own summary says the same.
    assert.equal(run.metadata.avg_reward, want.meanReward);
    assert.deepEqual(run.metadata.pass_at_k, want.passAtK);
    assert.equal(run.metadata.num_errors, want.errors);
  }
  // The vf eval row of an unscored rollout holds reward 0 (upstream's column): not a score.
  assert.ok(evalRun.lines.some((l) => l.error && l.reward === 0));

  const app = viewApp(root, { indexDir: join(tmp.path, "index") });
  const view = await serveHttp((r) => app.fetch(r), { port: 0 });
  const browser = await puppeteer.launch({
    executablePath: CHROMIUM,
    args: ["--no-sandbox", "--headless=new", "--disable-gpu", "--disable-dev-shm-usage"],
  });
  try {
    const page = await browser.newPage();
    page.setDefaultTimeout(120_000); // generous: the suite runs at load ~10
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
    const fixed = (x: number | null, d = 3) => x === null ? "–" : x.toFixed(d);

    await go("#/", '[data-testid="runs"]');
    const listed = await page.$$eval("tr[data-id]", (trs) =>
      trs.map((tr) => {
        const cell = (id: string) => (tr.querySelector(`[data-testid="${id}"]`) as Dom).textContent;
        return {
          id: tr.getAttribute("data-id")!,
          rollouts: cell("run-rollouts"),
          reward: cell("run-reward"),
          pass: cell("run-pass"),
          errors: cell("run-errors"),
          tokens: cell("run-tokens"),
        };
      }));
    for (const { run, want } of runs) {
      assert.deepEqual(listed.find((r) => r.id === run.id), {
        id: run.id,
        rollouts: String(want.rollouts),
        reward: fixed(want.meanReward),
        pass: Object.entries(want.passAtK).map(([k, v]) => `${k}:${v.toFixed(2)}`).join(" "),
        errors: String(want.errors),
        tokens: String(want.tokens),
      }, run.id);
    }

    for (const { run, want } of runs) {
      await go(`#/run/${encodeURIComponent(run.id)}`, '[data-testid="rollouts"] tr[data-line]');
      assert.equal(await textOf('[data-testid="count"]'), String(want.rollouts));
      assert.equal(await textOf('[data-testid="mean-reward"]'), fixed(want.meanReward));
      assert.equal(await textOf('[data-testid="errors"]'), String(want.errors));
      assert.equal(await textOf('[data-testid="tokens"]'), String(want.tokens));
      // The histogram counts scored rollouts only; the unscored are counted beside it.
      const buckets = new Array(10).fill(0);
      for (const x of want.rows) {
        if (x.reward !== null) buckets[Math.min(9, Math.floor(x.reward * 10))]++;
      }
      const bars = await page.$$eval(
        '[data-testid="histogram"] div',
        (ds) => ds.map((d) => (d as Dom).getAttribute("title")),
      );
      assert.deepEqual(
        bars,
        buckets.map((n, i) => `${(i / 10).toFixed(1)}–${((i + 1) / 10).toFixed(1)}: ${n}`),
        run.id,
      );
      assert.equal(
        await page.$eval('[data-testid="hist-y"] span', (s) => (s as Dom).textContent),
        String(Math.max(...buckets)),
      );
      assert.equal(
        await textOf('[data-testid="unscored"]'),
        `unscored ${want.rows.filter((x) => x.reward === null).length} · errors: RewardError 2`,
      );
      const rows = await page.$$eval(
        '[data-testid="rollouts"] tr[data-line]',
        (trs) =>
          trs.map((tr) => {
            const td = [...tr.children].map((c) => (c as Dom).textContent as string);
            return { example: td[1], reward: td[3], error: td[4], turns: td[6], tokens: td[7] };
          }),
      );
      assert.deepEqual(
        rows,
        want.rows.map((x) => ({
          example: x.example,
          reward: fixed(x.reward),
          error: x.error,
          turns: String(x.turns),
          tokens: String(x.tokens),
        })),
        run.id,
      );

      // Each rollout: its reward, tokens and duration; a trace's model calls as recorded.
      for (const [line, x] of want.rows.entries()) {
        await go(
          `#/rollout/${encodeURIComponent(run.id)}/${line}`,
          '[data-testid="trace-duration"]',
        );
        assert.equal(await textOf('[data-testid="reward"]'), fixed(x.reward), `${run.id} ${line}`);
        assert.equal(await textOf('[data-testid="trace-tokens"]'), String(x.tokens));
        assert.equal(await textOf('[data-testid="trace-duration"]'), `${x.ms} ms`);
        const calls = run.lines[line].model_calls;
        if (!calls) continue;
        const shown = await page.$$eval(
          '[data-testid="model-calls"] tr',
          (trs) => trs.slice(1).map((tr) => [...tr.children].map((c) => (c as Dom).textContent)),
        );
        assert.deepEqual(
          shown,
          calls.map((c: Json) => [
            String(c.turn),
            `${c.duration_ms} ms`,
            String(c.response.usage.prompt_tokens),
            String(c.response.usage.completion_tokens),
            "",
          ]),
        );
      }
    }

    // Rewards past 1 (a weighted sum): the bars and the axis span 0 … 2, and a 2 is not
    // counted in a 0.9–1.0 bar.
    await go(`#/run/${encodeURIComponent(summedRun.id)}`, '[data-testid="histogram"]');
    assert.equal(await textOf('[data-testid="mean-reward"]'), "1.500");
    assert.deepEqual(
      await page.$$eval('[data-testid="hist-x"] span', (s) => s.map((e) => (e as Dom).textContent)),
      Array.from({ length: 11 }, (_, i) => (i / 5).toFixed(1)),
    );
    assert.deepEqual(
      await page.$$eval(
        '[data-testid="histogram"] div',
        (ds) => ds.map((d) => (d as Dom).getAttribute("title")),
      ),
      Array.from(
        { length: 10 },
        (_, i) =>
          `${(i / 5).toFixed(1)}–${((i + 1) / 5).toFixed(1)}: ${i === 5 || i === 9 ? 1 : 0}`,
      ),
    );
  } finally {
    await browser.close();
    await view.close();
  }
});
