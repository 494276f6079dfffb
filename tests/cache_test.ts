/**
 * The model-call cache through `vf eval --cache` against a loopback model that counts its
 * requests: a second identical run makes none and reproduces the first's completions; the
 * `-r` repeats of one example stay distinct unless `cache_repeats`; a corrupt or locked
 * database turns the cache off with a warning and the run still completes; `vf cache stats`
 * and `clear` report and empty it.
 * @module
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { loadExampleDataset } from "../lib/data/examples.ts";
import { lastUserText, startModelServer } from "./model_server.ts";
import { cliCommand, type CliResult, collect, tempDir, transcript } from "./_cli.ts";

// deno-lint-ignore no-explicit-any
type Json = any;

const ANSWERS = new Map(
  (loadExampleDataset("gsm8k-sample", { split: "test" }).toList() as Array<
    { question: string; answer: string }
  >).map((r) => [r.question, r.answer]),
);

/** Correct answers, each reply numbered so a replayed one is recognisable. */
async function countingModel() {
  let n = 0;
  return await startModelServer({
    responder: (request) => ({
      content: `Reply ${++n}.\n\n\\boxed{${ANSWERS.get(lastUserText(request)) ?? "0"}}`,
      usage: { prompt_tokens: 10, completion_tokens: 5 },
    }),
  });
}

async function evalRun(
  cwd: string,
  url: string,
  db: string,
  extra: string[] = [],
): Promise<CliResult & { rows: Json[]; meta: Json }> {
  const res = await collect(cliCommand(
    ["eval", "gsm8k", "-m", "m", "-b", url, "-n", "3", "-o", "out", "--cache", ...extra],
    { cwd, env: { VF_CACHE_DB: db }, registry: false },
  ));
  const dir = /^Saving results to (.+)$/m.exec(res.stderr)?.[1];
  if (!dir) return { ...res, rows: [], meta: {} };
  const rows = (await Deno.readTextFile(join(dir, "results.jsonl"))).trim().split("\n")
    .map((l) => JSON.parse(l));
  const meta = JSON.parse(await Deno.readTextFile(join(dir, "metadata.json")));
  return { ...res, rows, meta };
}

function completions(rows: Json[]): string[] {
  return rows.map((r) => `${r.example_id}:${r.completion[0].content}`).sort();
}

Deno.test("cache: a second identical run makes no model requests and gives the same completions; -r repeats stay distinct unless cache_repeats", async () => {
  await using tmp = await tempDir("vf_cache_");
  await using model = await countingModel();
  const db = join(tmp.path, "cache.sqlite");

  const first = await evalRun(tmp.path, model.url, db, ["-r", "4"]);
  assert.equal(first.code, 0, transcript(first));
  assert.equal(model.requests.length, 12); // 3 examples × 4 repeats, each its own answer
  assert.equal(new Set(first.rows.map((r) => r.completion[0].content)).size, 12);
  assert.deepEqual(first.meta.cache, { hits: 0, misses: 12, path: db });

  const second = await evalRun(tmp.path, model.url, db, ["-r", "4"]);
  assert.equal(second.code, 0, transcript(second));
  assert.equal(model.requests.length, 12, "the second run asked the model nothing");
  assert.deepEqual(completions(second.rows), completions(first.rows));
  assert.equal(second.meta.avg_reward, first.meta.avg_reward);
  assert.deepEqual(second.meta.cache, { hits: 12, misses: 0, path: db });
  assert.match(second.stdout, /cache: 12 hits, 0 misses/);

  // cache_repeats: the repeats of one example share one cached answer.
  const shared = join(tmp.path, "shared.sqlite");
  const seed = await evalRun(tmp.path, model.url, shared, [
    "-r",
    "1",
    "--client.cache_repeats",
    "true",
  ]);
  assert.equal(seed.code, 0, transcript(seed));
  const before = model.requests.length;
  const repeated = await evalRun(tmp.path, model.url, shared, [
    "-r",
    "4",
    "--client.cache_repeats",
    "true",
  ]);
  assert.equal(repeated.code, 0, transcript(repeated));
  assert.equal(model.requests.length, before);
  assert.equal(repeated.rows.length, 12);
  assert.equal(new Set(repeated.rows.map((r) => r.completion[0].content)).size, 3);

  const stats = await collect(cliCommand(["cache", "stats", "--path", db], {
    cwd: tmp.path,
    env: {},
    registry: false,
  }));
  assert.equal(stats.code, 0, transcript(stats));
  assert.match(stats.stdout, /12 cached responses/);
  assert.match(stats.stdout, /m: 12/);
  const cleared = await collect(cliCommand(["cache", "clear"], {
    cwd: tmp.path,
    env: { VF_CACHE_DB: db },
    registry: false,
  }));
  assert.match(cleared.stdout, /removed 12 cached responses/);
});

Deno.test("cache: a corrupt or locked database turns the cache off with a warning, and the run completes", async () => {
  await using tmp = await tempDir("vf_cache_bad_");
  await using model = await countingModel();
  const corrupt = join(tmp.path, "corrupt.sqlite");
  await Deno.writeTextFile(corrupt, "this is not a database ".repeat(100));
  const res = await evalRun(tmp.path, model.url, corrupt, ["-r", "1"]);
  assert.equal(res.code, 0, transcript(res));
  assert.match(res.stderr, /model cache at .*corrupt\.sqlite (cannot be used|failed)/);
  assert.equal(res.rows.length, 3);
  assert.equal(res.meta.avg_reward, 1);

  // Another process holds the database locked for writing the whole time.
  const locked = join(tmp.path, "locked.sqlite");
  const { DatabaseSync } = await import("node:sqlite");
  const holder = new DatabaseSync(locked);
  holder.exec(
    "CREATE TABLE IF NOT EXISTS calls (key TEXT PRIMARY KEY, model TEXT, response TEXT NOT NULL, created REAL NOT NULL)",
  );
  holder.exec("BEGIN EXCLUSIVE");
  try {
    const before = model.requests.length;
    const blocked = await evalRun(tmp.path, model.url, locked, ["-r", "1"]);
    assert.equal(blocked.code, 0, transcript(blocked));
    assert.match(blocked.stderr, /model cache at .*locked\.sqlite (cannot be used|failed)/);
    assert.equal(blocked.rows.length, 3);
    assert.equal(model.requests.length, before + 3);
  } finally {
    holder.exec("ROLLBACK");
    holder.close();
  }
});
