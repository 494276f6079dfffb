/**
 * `vf view`'s web app (hono): a JSON API over the runs under a folder, and one page that
 * renders it (no build step; the page, its script and its stylesheet are strings in
 * {@link VIEW_PAGE}, {@link VIEW_SCRIPT} and {@link VIEW_STYLE}, so the single binary carries
 * them). Runs are found by their `metadata.json` beside `results.jsonl` or `traces.jsonl`;
 * each run's rows come from its {@link RunIndex}, refreshed on every request so a running
 * eval's page follows it.
 *
 * Run files may be written by untrusted environment code and the pages hold transcripts, so
 * the server answers only GET and HEAD, only to a `Host` that names loopback or the address
 * it is bound to (a page elsewhere cannot DNS-rebind its own name onto this port and read
 * `/api/*`), refuses a foreign `Origin`, and sends a Content-Security-Policy without inline
 * script or style. Every field read from a run's files is type-checked first: a hostile
 * `metadata.json` shows "–", never a 500.
 * @module
 */
import { closeSync, existsSync, fstatSync, readdirSync, realpathSync, statSync } from "node:fs";
import { join, relative, resolve } from "node:path";
import { Hono } from "npm:hono@^4.13.0";
import { pairedComparison, type RewardsByExample } from "../eval/compare.ts";
import { serveHttp } from "../model/http_server.ts";
import { MAX_LINE_BYTES, type RowQuery, RunIndex } from "./run_index.ts";
import { VIEW_PAGE, VIEW_SCRIPT, VIEW_STYLE } from "./page.ts";
import { insideRoot, openConfined, readConfined } from "../util/confined.ts";

/** The page's Content-Security-Policy: no inline script or style, nothing from elsewhere. */
export const VIEW_CSP: string = "default-src 'none'; script-src 'self'; style-src 'self'; " +
  "connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; " +
  "frame-ancestors 'none'";

/** One run found under the root. */
export interface RunEntry {
  id: string;
  dir: string;
  file: string;
  layout: "results" | "traces";
  /** Its `metadata.json` when that is a file under the root, else null. */
  metadata: string | null;
  /**
   * The real path of the root it was found under: every file of the run is opened through
   * {@link openConfined} against it, so one swapped for a link out after it was found is
   * refused when it is opened, not only when it was listed.
   */
  root: string;
}

/**
 * Run folders under `root` (itself when it is one), newest first by the date in their
 * `metadata.json` (the results file's modification time when it has none); at most 6
 * levels down. Nothing outside `root` is read: a symlinked folder or run file whose real
 * path leaves it is passed over (a run folder handed around may hold a link to `~/.ssh`),
 * and each real folder is visited once (a link back up cannot loop).
 */
export function findRuns(root: string): RunEntry[] {
  const out: RunEntry[] = [];
  let top: string;
  try {
    top = realpathSync(resolve(root));
  } catch {
    return out;
  }
  const seen = new Set<string>();
  const visit = (dir: string, depth: number) => {
    const real = insideRoot(top, dir);
    if (real === null || seen.has(real)) return;
    seen.add(real);
    const results = runFile(top, join(dir, "results.jsonl"));
    const traces = runFile(top, join(dir, "traces.jsonl"));
    if (results || traces) {
      out.push({
        id: relative(root, dir) || ".",
        dir,
        file: (traces ?? results)!,
        layout: traces ? "traces" : "results",
        metadata: runFile(top, join(dir, "metadata.json")),
        root: top,
      });
      return;
    }
    // A results file that leads outside the root is no run, and is not looked through either.
    if (existsSync(join(dir, "results.jsonl")) || existsSync(join(dir, "traces.jsonl"))) return;
    if (depth >= 6) return;
    // Listed by its real path; a folder swapped for a link after that check lists what the
    // link leads to, but each entry is confined again by its own visit and runFile.
    let entries: string[];
    try {
      entries = readdirSync(real);
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
  const when = new Map(out.map((r) => [r, runTime(r)]));
  return out.sort((a, b) => when.get(b)! - when.get(a)! || a.id.localeCompare(b.id));
}

/** `path` when it is a regular file whose real path lies under the real root `top`. */
function runFile(top: string, path: string): string | null {
  const real = insideRoot(top, path);
  if (real === null) return null;
  try {
    return statSync(real).isFile() ? path : null;
  } catch {
    return null;
  }
}

/** When a run ran: its metadata's `date`, else its results file's modification time. */
function runTime(run: RunEntry): number {
  const m = metadataOf(run);
  const date = typeof m.date === "string" ? Date.parse(m.date) : NaN;
  if (Number.isFinite(date)) return date;
  try {
    const fd = openConfined(run.root, run.file);
    try {
      return fstatSync(fd).mtimeMs;
    } finally {
      closeSync(fd);
    }
  } catch {
    return 0;
  }
}

type Json = Record<string, unknown>;

const isObject = (v: unknown): v is Json =>
  v !== null && typeof v === "object" && !Array.isArray(v);
const finite = (v: unknown): number | null =>
  typeof v === "number" && Number.isFinite(v) ? v : null;

/** The longest label the runs list shows, in characters; a longer one is cut with "…". */
const MAX_LABEL = 300;

/**
 * A label from a file: a string as it is, another value as its JSON, nothing as null; cut at
 * {@link MAX_LABEL} characters (a run's env or model, shown in a table cell on every row).
 */
function label(v: unknown): string | null {
  if (v === null || v === undefined) return null;
  let text: string;
  if (typeof v === "string") text = v;
  else {
    try {
      text = JSON.stringify(v) ?? String(v);
    } catch {
      text = String(v);
    }
  }
  return text.length > MAX_LABEL ? text.slice(0, MAX_LABEL) + "…" : text;
}

/**
 * The largest `metadata.json` read, in bytes: vf writes a few kilobytes, and the runs list
 * reads every run's on every request, so a huge one is passed over instead of read again.
 */
export const MAX_METADATA_BYTES = 4 << 20;

/**
 * The run's `metadata.json` when it is an object; anything else (absent, torn, an array,
 * over {@link MAX_METADATA_BYTES}, outside the root) is {}.
 */
function metadataOf(run: RunEntry): Json {
  if (run.metadata === null) return {};
  try {
    const m = JSON.parse(readConfined(run.root, run.metadata, MAX_METADATA_BYTES).toString("utf8"));
    return isObject(m) ? m : {};
  } catch {
    return {};
  }
}

/** `pass_at_k` when it is an object of numbers (other entries dropped), else null. */
function passAtKOf(v: unknown): Record<string, number> | null {
  if (!isObject(v)) return null;
  const out: Record<string, number> = {};
  for (const [k, x] of Object.entries(v)) {
    const n = finite(x);
    if (n !== null) out[k] = n;
  }
  return Object.keys(out).length ? out : null;
}

/**
 * The run's tokens (input and output) from its metadata: `vf eval` writes per-rollout means
 * in `usage` and the totals in `total_*_tokens`; `vf run` writes the totals in `usage`.
 */
function metadataTokens(m: Json, run: RunEntry): number | null {
  const usage = isObject(m.usage) ? m.usage : {};
  const pair = (a: unknown, b: unknown) =>
    finite(a) === null && finite(b) === null ? null : (finite(a) ?? 0) + (finite(b) ?? 0);
  const totals = pair(usage.total_input_tokens, usage.total_output_tokens);
  if (totals !== null) return totals;
  const plain = pair(usage.input_tokens, usage.output_tokens);
  if (run.layout === "traces") return plain;
  const rollouts = finite(m.num_rollouts);
  const mean = plain ?? pair(m.avg_input_tokens, m.avg_output_tokens);
  return mean === null || rollouts === null ? null : Math.round(mean * rollouts);
}

/** The row shown in the runs list. Every field is typed here, whatever the file held. */
function runSummary(run: RunEntry, index: RunIndex): Json {
  const m = metadataOf(run);
  const cost = isObject(m.cost) ? m.cost : {};
  const errors = index.histogram().errors;
  return {
    id: run.id,
    layout: run.layout,
    env: label(m.env_id ?? m.taskset),
    model: label(m.model),
    date: typeof m.date === "string" ? m.date : typeof m.time === "string" ? m.time : null,
    rollouts: index.count,
    avg_reward: finite(m.avg_reward),
    pass_at_k: passAtKOf(m.pass_at_k),
    errors: Object.values(errors).reduce((a, b) => a + b, 0),
    // What the rollouts carry (a live run's metadata lags behind), else what metadata says.
    tokens: index.tokens || metadataTokens(m, run),
    cost_usd: finite(cost.usd),
  };
}

/** Options of {@link viewApp}. */
export interface ViewOptions {
  /** Where the run indexes are kept (default `~/.cache/vf/view`). */
  indexDir?: string;
  /**
   * The address the server is bound to (default `127.0.0.1`): a `Host` naming it is answered,
   * as are the loopback names. Bound to every interface (`0.0.0.0`, `::`), a `Host` that is an
   * IP address is answered too (rebinding needs a name).
   */
  hostname?: string;
  /** The port the server listens on, once known: a `Host` must name it. Unset: any port. */
  port?: () => number | undefined;
}

const LOOPBACK_NAMES = new Set(["localhost", "127.0.0.1", "[::1]"]);
const IP_LITERAL = /^(\d{1,3}(\.\d{1,3}){3}|\[[0-9a-f:.]+\])$/;
const HOST_SHAPE = /^[A-Za-z0-9.-]+(:\d{1,5})?$|^\[[0-9A-Fa-f:.]+\](:\d{1,5})?$/;

/**
 * Whether a `Host` header names this server: a loopback name or the bound address, with the
 * port it listens on (when given). The defence against DNS rebinding: a page on another
 * origin that points its own name at 127.0.0.1 still sends its own name.
 */
export function hostAllowed(
  host: string | undefined,
  options: { hostname?: string; port?: number } = {},
): boolean {
  if (!host || !HOST_SHAPE.test(host)) return false;
  let url: URL;
  try {
    url = new URL(`http://${host}/`);
  } catch {
    return false;
  }
  const name = url.hostname.toLowerCase();
  const bound = (options.hostname ?? "127.0.0.1").toLowerCase();
  const boundName = bound.includes(":") && !bound.startsWith("[") ? `[${bound}]` : bound;
  const wildcard = bound === "0.0.0.0" || boundName === "[::]";
  const known = LOOPBACK_NAMES.has(name) || name === boundName ||
    (wildcard && IP_LITERAL.test(name));
  if (!known) return false;
  return options.port === undefined || Number(url.port || "80") === options.port;
}

const SAFE_METHODS = new Set(["GET", "HEAD"]);

/** The viewer's app over the runs under `root`. */
export function viewApp(root: string, options: ViewOptions = {}): Hono {
  const indexes = new Map<string, Promise<RunIndex>>();
  const runs = () => findRuns(root);
  // A pasted id is found too: the run folder's path, or the end of its id ("a1b2c3d4").
  const runById = (id: string) => {
    const list = runs();
    const want = id.replace(/^\.\/+|\/+$/g, "");
    const exact = list.find((r) => r.id === id || r.id === want || r.dir === resolve(id));
    if (exact || !want) return exact;
    const tail = list.filter((r) => r.id.endsWith(`/${want}`));
    return tail.length === 1 ? tail[0] : undefined;
  };
  const indexOf = async (run: RunEntry) => {
    let p = indexes.get(run.file);
    if (!p) {
      // Read through a descriptor checked to be the run's file under the root, on every open.
      const openFile = (file: string) => {
        try {
          return openConfined(run.root, file);
        } catch {
          return null;
        }
      };
      p = RunIndex.open(run.file, options.indexDir, { openFile });
      indexes.set(run.file, p);
    }
    const index = await p;
    index.refresh();
    return index;
  };

  const app = new Hono();
  app.use("*", async (c, next) => {
    const host = c.req.header("host");
    const origin = c.req.header("origin");
    const method = c.req.method;
    if (!hostAllowed(host, { hostname: options.hostname, port: options.port?.() })) {
      c.res = c.json({
        error: `Host "${host ?? ""}" is not this viewer's address; open the viewer at the ` +
          `address "vf view" printed`,
      }, 403);
    } else if ((origin !== undefined || !SAFE_METHODS.has(method)) && origin !== `http://${host}`) {
      c.res = c.json({ error: `Origin "${origin ?? ""}" is not this viewer's address` }, 403);
    } else if (!SAFE_METHODS.has(method)) {
      c.res = c.json({ error: `The viewer answers only GET and HEAD, not "${method}"` }, 405);
      c.res.headers.set("allow", "GET, HEAD");
    } else {
      await next();
    }
    const headers = c.res.headers;
    headers.set("content-security-policy", VIEW_CSP);
    headers.set("x-content-type-options", "nosniff");
    headers.set("x-frame-options", "DENY");
    headers.set("referrer-policy", "no-referrer");
    headers.set("cross-origin-resource-policy", "same-origin");
    headers.set("cross-origin-opener-policy", "same-origin");
    headers.set("cache-control", "no-store");
  });
  app.onError((error, c) =>
    c.json({ error: `The viewer failed to answer: ${(error as Error).message}` }, 500)
  );
  app.get("/", (c) => c.html(VIEW_PAGE));
  app.get(
    "/app.js",
    (c) => c.body(VIEW_SCRIPT, 200, { "content-type": "text/javascript; charset=utf-8" }),
  );
  app.get(
    "/app.css",
    (c) => c.body(VIEW_STYLE, 200, { "content-type": "text/css; charset=utf-8" }),
  );
  app.get("/favicon.ico", (c) => c.body(null, 204));
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
    const num = (v: string | undefined) => {
      const n = v === undefined || v === "" ? NaN : Number(v);
      return Number.isFinite(n) ? n : undefined;
    };
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
    const line = c.req.query("line") ?? "";
    const index = await indexOf(run);
    const got = /^\d+$/.test(line) ? index.read(Number(line)) : null;
    if (!got) return c.json({ error: "no such rollout" }, 404);
    const limit = got.oversize === undefined ? {} : { limit: `${MAX_LINE_BYTES >> 20} MiB` };
    return c.json({
      id: run.id,
      layout: run.layout,
      rows: index.rowsAt(Number(line)),
      ...got,
      ...limit,
    });
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

/** A running viewer: its port, the address to open, and how to stop it. */
export interface ViewServer {
  port: number;
  url: string;
  close(): Promise<void>;
}

/**
 * Serves {@link viewApp} on `hostname:port` (default `127.0.0.1` and a free port); the app
 * answers only a `Host` that names that port.
 */
export async function serveView(
  root: string,
  options: { port?: number; hostname?: string; indexDir?: string } = {},
): Promise<ViewServer> {
  const hostname = options.hostname ?? "127.0.0.1";
  const bound: { port?: number } = {};
  const app = viewApp(root, { indexDir: options.indexDir, hostname, port: () => bound.port });
  const listener = await serveHttp((request) => app.fetch(request), {
    port: options.port ?? 0,
    hostname,
  });
  const port = bound.port = listener.port;
  const shown = hostname === "0.0.0.0" || hostname === "::"
    ? "127.0.0.1"
    : hostname.includes(":")
    ? `[${hostname}]`
    : hostname;
  return { port, url: `http://${shown}:${port}/`, close: () => listener.close() };
}
