/**
 * `vf view`'s web app (hono): a JSON API over the runs under a folder, and one page that
 * renders it (no build step; the page is a string in {@link VIEW_PAGE}, so the single binary
 * carries it). Runs are found by their `metadata.json` beside `results.jsonl` or
 * `traces.jsonl`; each run's rows come from its {@link RunIndex}, refreshed on every request
 * so a running eval's page follows it.
 * @module
 */
import { existsSync, readdirSync, readFileSync, statSync } from "node:fs";
import { join, relative, resolve } from "node:path";
import { Hono } from "npm:hono@^4.13.0";
import { pairedComparison, type RewardsByExample } from "../eval/compare.ts";
import { type RowQuery, RunIndex } from "./index.ts";
import { VIEW_PAGE } from "./page.ts";

/** One run found under the root. */
export interface RunEntry {
  id: string;
  dir: string;
  file: string;
  layout: "results" | "traces";
}

/** Run folders under `root` (itself when it is one), newest first; at most 6 levels down. */
export function findRuns(root: string): RunEntry[] {
  const out: RunEntry[] = [];
  const visit = (dir: string, depth: number) => {
    const results = join(dir, "results.jsonl");
    const traces = join(dir, "traces.jsonl");
    if (existsSync(results) || existsSync(traces)) {
      out.push({
        id: relative(root, dir) || ".",
        dir,
        file: existsSync(traces) ? traces : results,
        layout: existsSync(traces) ? "traces" : "results",
      });
      return;
    }
    if (depth >= 6) return;
    let entries: string[];
    try {
      entries = readdirSync(dir);
    } catch {
      return;
    }
    for (const name of entries) {
      if (name.startsWith(".") || name === "node_modules") continue;
      const full = join(dir, name);
      try {
        if (statSync(full).isDirectory()) visit(full, depth + 1);
      } catch { /* vanished */ }
    }
  };
  visit(resolve(root), 0);
  const mtime = (r: RunEntry) => {
    try {
      return statSync(r.file).mtimeMs;
    } catch {
      return 0;
    }
  };
  return out.sort((a, b) => mtime(b) - mtime(a));
}

function metadataOf(run: RunEntry): Record<string, unknown> {
  try {
    return JSON.parse(readFileSync(join(run.dir, "metadata.json"), "utf8"));
  } catch {
    return {};
  }
}

/** The row shown in the runs list. */
function runSummary(run: RunEntry, index: RunIndex): Record<string, unknown> {
  const m = metadataOf(run);
  const usage = (m.usage ?? {}) as Record<string, number>;
  const cost = (m.cost ?? null) as { usd?: number } | null;
  const errors = index.histogram().errors;
  return {
    id: run.id,
    layout: run.layout,
    env: m.env_id ?? m.taskset ?? null,
    model: m.model ?? null,
    date: m.date ?? m.time ?? null,
    rollouts: index.count,
    avg_reward: m.avg_reward ?? null,
    pass_at_k: m.pass_at_k ?? null,
    errors: Object.values(errors).reduce((a, b) => a + b, 0),
    tokens: (usage.input_tokens ?? 0) + (usage.output_tokens ?? 0) ||
      ((m.avg_input_tokens as number ?? 0) + (m.avg_output_tokens as number ?? 0)) * index.count ||
      null,
    cost_usd: cost?.usd ?? null,
  };
}

/** The viewer's app over the runs under `root`. */
export function viewApp(root: string, options: { indexDir?: string } = {}): Hono {
  const indexes = new Map<string, Promise<RunIndex>>();
  const runs = () => findRuns(root);
  const runById = (id: string) => runs().find((r) => r.id === id);
  const indexOf = async (run: RunEntry) => {
    let p = indexes.get(run.file);
    if (!p) {
      p = RunIndex.open(run.file, options.indexDir);
      indexes.set(run.file, p);
    }
    const index = await p;
    index.refresh();
    return index;
  };

  const app = new Hono();
  app.get("/", (c) => c.html(VIEW_PAGE));
  app.get("/api/runs", async (c) => {
    const list = runs();
    const out = [];
    for (const run of list) out.push(runSummary(run, await indexOf(run)));
    return c.json({ root: resolve(root), runs: out });
  });
  app.get("/api/run", async (c) => {
    const run = runById(c.req.query("id") ?? "");
    if (!run) return c.json({ error: "no such run" }, 404);
    const index = await indexOf(run);
    return c.json({
      ...runSummary(run, index),
      metadata: metadataOf(run),
      histogram: index.histogram(),
    });
  });
  app.get("/api/rollouts", async (c) => {
    const run = runById(c.req.query("id") ?? "");
    if (!run) return c.json({ error: "no such run" }, 404);
    const q = c.req.query();
    const num = (v: string | undefined) => (v === undefined || v === "" ? undefined : Number(v));
    const query: RowQuery = {
      errors: q.errors === "only" || q.errors === "none" ? q.errors : undefined,
      errorType: q.error_type || undefined,
      example: q.example || undefined,
      stop: q.stop || undefined,
      minReward: num(q.min_reward),
      maxReward: num(q.max_reward),
      sort: q.sort as RowQuery["sort"],
      desc: q.desc === "1",
      page: num(q.page),
      pageSize: num(q.page_size),
    };
    return c.json((await indexOf(run)).query(query));
  });
  app.get("/api/rollout", async (c) => {
    const run = runById(c.req.query("id") ?? "");
    if (!run) return c.json({ error: "no such run" }, 404);
    const got = (await indexOf(run)).read(Number(c.req.query("line")));
    if (!got) return c.json({ error: "no such rollout" }, 404);
    return c.json({ layout: run.layout, ...got });
  });
  app.get("/api/compare", async (c) => {
    const a = runById(c.req.query("a") ?? "");
    const b = runById(c.req.query("b") ?? "");
    if (!a || !b) return c.json({ error: "no such run" }, 404);
    const rewards = async (run: RunEntry): Promise<RewardsByExample> => {
      const index = await indexOf(run);
      const out: RewardsByExample = new Map();
      for (let page = 0;; page++) {
        const { rows } = index.query({ errors: "none", page, pageSize: 500 });
        for (const r of rows) {
          if (r.reward === null) continue;
          out.set(r.example, [...(out.get(r.example) ?? []), r.reward]);
        }
        if (rows.length < 500) break;
      }
      return out;
    };
    try {
      return c.json(pairedComparison(await rewards(a), await rewards(b)));
    } catch (error) {
      return c.json({ error: (error as Error).message }, 400);
    }
  });
  return app;
}
