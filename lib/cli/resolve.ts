/**
 * What the commands resolve from a merged config: the model client (endpoint registry,
 * flags, `[client]`), and where an environment or taskset runs (in-process, or in a sandbox
 * host process pinned by the lock file).
 * @module
 */

import process from "node:process";
import { existsSync } from "node:fs";
import { readFile } from "node:fs/promises";
import { dirname, join, resolve } from "node:path";
import { TASKSETS } from "../../environments/mod.ts";
import { type ChatClient, OpenAIChatClient } from "../model/client.ts";
import { CachedChatClient, defaultCachePath, ModelCache } from "../model/cache.ts";
import { CostBudget, CostMeter, type ModelPrice } from "../model/cost.ts";
import type { AdaptiveController } from "../eval/adaptive.ts";
import type { WarmPool } from "../../runtimes/pool.ts";
import { writeJsonAtomic } from "../eval/results.ts";
import { eachJsonLine } from "../eval/jsonl.ts";
import type { EvalConfig } from "../config.ts";
import { loadEndpoints, RoundRobinClient } from "../model/endpoints.ts";
import { ConfigError } from "../errors.ts";
import type { JudgeEndpoint } from "../scoring/judges/judge.ts";
import type { JudgeEndpointEntry } from "../scoring/judges/config.ts";
import { loadTasksetSpec } from "../legacy/load.ts";
import { RemoteTaskset, type SandboxPermissions, startSandboxHost } from "../sandbox/remote.ts";
import { HarborTaskset, isHarborFolder } from "../harbor/taskset.ts";

export function env(name: string): string | undefined {
  return process.env[name];
}

export function isUrlSpec(spec: string): boolean {
  return /^https?:\/\//.test(spec);
}

/**
 * URL environments always run in a separate host process pinned by the lock file: under the
 * permission sandbox, or with every permission when --trust is given. Local ones run
 * in-process unless --sandbox is given.
 */
export function wantsSandbox(spec: string, config: Omit<EvalConfig, "env">): boolean {
  return isUrlSpec(spec) || config.sandbox?.enabled === true;
}

export function sandboxPermissions(config: Omit<EvalConfig, "env">): SandboxPermissions {
  return {
    allowNet: config.sandbox?.allow_net,
    allowRead: config.sandbox?.allow_read,
    allowEnv: config.sandbox?.allow_env,
    allowImport: config.sandbox?.allow_import,
  };
}

export function lockFileFor(config: Omit<EvalConfig, "env">, source: string): string {
  if (config.lock_file) return resolve(config.lock_file);
  return source.endsWith(".toml") ? join(dirname(resolve(source)), "vf.lock") : resolve("vf.lock");
}

/** Load a taskset: in a host process for URLs (or --sandbox), in-process otherwise. */
export async function loadTasksetFor(
  spec: string,
  tasksetConfig: Record<string, unknown>,
  config: Omit<EvalConfig, "env">,
  source: string,
) {
  if (!wantsSandbox(spec, config) && !isUrlSpec(spec) && isHarborFolder(spec)) {
    // A Harbor task folder (task.toml), or a folder of them.
    return new HarborTaskset({ ...tasksetConfig, path: spec });
  }
  if (wantsSandbox(spec, config)) {
    const { host, info } = await startSandboxHost({
      spec,
      kind: "taskset",
      args: tasksetConfig,
      permissions: sandboxPermissions(config),
      lockFile: lockFileFor(config, source),
      reload: config.reload,
      trusted: config.trust === true,
    });
    return new RemoteTaskset(host, info);
  }
  return await loadTasksetSpec(spec, tasksetConfig, TASKSETS);
}

/** Resolve the model endpoint: registry aliases, flags, `[client]`, defaults. */
export async function resolveClient(config: Omit<EvalConfig, "env">) {
  let model = config.model ?? "gpt-4.1-mini";
  const requested = model;
  let baseUrl = config.base_url ?? config.api_base_url ?? config.client?.base_url;
  let keyVar = config.api_key_var ?? config.client?.api_key_var;
  const headers = { ...(config.client?.headers ?? {}), ...(config.headers ?? {}) };
  const clientOpts = {
    timeout: config.client?.timeout,
    max_retries: config.client?.max_retries,
    transport: config.client?.transport,
    session_header: config.client?.session_header,
    cache_salt: config.client?.cache_salt,
    extra_headers: headers,
  };
  // An endpoint's limits: `[client]`'s, else its registry entry's (when the URL is the entry's).
  const limits = (r?: { max_output_tokens?: number; reasoning?: boolean }) => ({
    max_output_tokens: config.client?.max_output_tokens ?? r?.max_output_tokens,
    reasoning: config.client?.reasoning ?? r?.reasoning,
  });
  let registryEntry: Parameters<typeof limits>[0];
  let client: ChatClient | null = null;
  const registryPath = config.endpoints_path ??
    (existsSync("configs/endpoints.toml") ? "configs/endpoints.toml" : null);
  if (registryPath) {
    const registry = await loadEndpoints(registryPath);
    const replicas = registry.get(model);
    if (replicas) {
      model = replicas[0].model;
      if (!baseUrl && replicas.length > 1) {
        client = new RoundRobinClient(replicas.map((r) =>
          new OpenAIChatClient({
            base_url: r.url,
            api_key_var: keyVar ?? r.key,
            ...clientOpts,
            ...limits(r),
            extra_headers: { ...(r.headers ?? {}), ...headers },
          })
        ));
      }
      if (!baseUrl) registryEntry = replicas[0];
      baseUrl ??= replicas[0].url;
      keyVar ??= replicas[0].key;
      Object.assign(headers, { ...(replicas[0].headers ?? {}), ...headers });
    }
  }
  baseUrl ??= env("OPENAI_BASE_URL") ?? "https://api.openai.com/v1";
  keyVar ??= "OPENAI_API_KEY";
  client ??= new OpenAIChatClient({
    base_url: baseUrl,
    api_key_var: keyVar,
    ...clientOpts,
    ...limits(registryEntry),
  });
  // What the calls cost (real calls only: the meter sits under the cache).
  const prices: Record<string, ModelPrice> = {};
  for (const r of registryPath ? (await loadEndpoints(registryPath)).get(requested) ?? [] : []) {
    if (r.price) prices[r.model] = r.price;
  }
  Object.assign(prices, config.models ?? {});
  const meter = new CostMeter(client, prices);
  client = meter;
  // The model-call cache, when asked for (a cache that cannot be opened warns and is skipped).
  let cache: CachedChatClient | null = null;
  if (config.client?.cache) {
    const db = await ModelCache.open(config.client.cache_path ?? defaultCachePath());
    if (db) {
      client = cache = new CachedChatClient(client, db, { repeats: config.client.cache_repeats });
    }
  }
  return { client, model, baseUrl, keyVar, cache, meter };
}

/**
 * After a run: the cache's hits and misses and the model spend go into its metadata.json, and
 * lines of the summary say them. Returns those lines.
 */
export async function recordRunCosts(
  runDir: string | undefined,
  o: {
    cache: CachedChatClient | null;
    meter: CostMeter;
    budget: CostBudget | null;
    adaptive?: AdaptiveController | null;
    pool?: WarmPool | null;
  },
): Promise<string[]> {
  const lines: string[] = [];
  const extra: Record<string, unknown> = {};
  if (o.pool && (o.pool.size > 0 || o.pool.graderSize > 0)) {
    const { hits, misses, fresh, failures } = o.pool.stats;
    extra.sandbox_pool = {
      size: o.pool.size,
      grader_size: o.pool.graderSize,
      hits,
      misses,
      fresh_graders: fresh,
      failures,
    };
  }
  if (o.adaptive) {
    const a = o.adaptive.stats();
    extra.adaptive = a;
    lines.push(
      `adaptive concurrency: ended at ${a.limit} of ${a.max} (highest ${a.highest}; ` +
        `${a.increases} increases, ${a.backoffs} back-offs)`,
    );
  }
  if (o.cache) {
    extra.cache = { ...o.cache.counts, path: o.cache.cache.path };
    lines.push(`cache: ${o.cache.counts.hits} hits, ${o.cache.counts.misses} misses`);
  }
  const s = o.meter.summary;
  const cost = costRecord(o.meter, o.budget);
  if (cost) {
    extra.cost = cost;
    lines.push(
      `cost: $${s.usd.toFixed(4)} over ${s.calls} model calls` +
        (s.unpriced_calls ? ` (${s.unpriced_calls} of a model without a price)` : "") +
        (o.budget ? ` (budget $${o.budget.maxUsd})` : ""),
    );
  }
  if (runDir && Object.keys(extra).length) {
    const path = join(runDir, "metadata.json");
    const metadata = JSON.parse(await readFile(path, "utf8").catch(() => "{}"));
    await writeJsonAtomic(path, { ...metadata, ...extra });
  }
  return lines;
}

/** A run's spend as `metadata.json` keeps it (`cost`); null when nothing is priced or capped. */
export function costRecord(
  meter: CostMeter,
  budget: CostBudget | null,
): Record<string, unknown> | null {
  if (Object.keys(meter.prices).length === 0 && !budget) return null;
  const s = meter.summary;
  return {
    ...s,
    usd: Math.round(s.usd * 1e6) / 1e6,
    ...(budget ? { max_cost: budget.maxUsd, stopped_at_budget: budget.stopped } : {}),
  };
}

/**
 * A resumed run's spend so far (its metadata.json's `cost`) counts toward its total and
 * budget, and so do the rollouts that spend paid for: the records of `linesFile` (one a
 * rollout in results.jsonl, one an episode in traces.jsonl), so the budget's estimate per
 * rollout is the run's own and not this session's alone.
 */
export async function seedCosts(
  meter: CostMeter,
  runDir: string,
  o: { budget: CostBudget | null; linesFile: "results.jsonl" | "traces.jsonl" },
): Promise<void> {
  const path = join(runDir, "metadata.json");
  const text = await readFile(path, "utf8").catch(() => null);
  let c: Record<string, unknown> | undefined;
  if (text !== null) {
    try {
      c = JSON.parse(text)?.cost;
    } catch (error) {
      throw new ConfigError(
        `${path}: invalid metadata: ${(error as Error).message}; the run's spend so far cannot ` +
          `be read, so its budget cannot be kept`,
      );
    }
  }
  if (c && typeof c === "object") {
    for (const k of ["usd", "input_tokens", "output_tokens", "calls", "unpriced_calls"] as const) {
      const v = c[k];
      // Run files are not trusted: a negative spend would lift the budget.
      if (typeof v === "number" && Number.isFinite(v) && v >= 0) meter.summary[k] += v;
    }
  }
  // Corrupt lines are reported when the run reads the file itself.
  if (o.budget) {
    // Counted line by line: a resumed run's file may be far larger than the heap.
    o.budget.carryOver(await eachJsonLine(join(runDir, o.linesFile), () => {}, () => {}));
  }
}

/**
 * Why the budget stopped the run, for stderr: what was spent on what, and how to go on. A
 * resume that started nothing says that the budget was already reached.
 */
export function budgetStopMessage(
  budget: CostBudget,
  o: { command: string; runDir: string | null; done: number },
): string {
  const usd = (n: number) => `$${n.toFixed(2)}`;
  const { usd: before, rollouts } = budget.carried;
  const what = budget.startedHere === 0 && rollouts > 0
    ? `${usd(before)} of it was spent before this resume, on ${rollouts} rollouts; the next ` +
      `would cost about ${usd(budget.perRollout)}, so none was started`
    : `${o.done} rollouts done, ${usd(budget.meter.summary.usd)} spent`;
  return `Stopped at the cost budget ($${budget.maxUsd}): ${what}${
    o.runDir
      ? `; finish with: vf ${o.command} ... --resume ${o.runDir} (and a larger --max-cost)`
      : ""
  }`;
}

/** The `--max-cost` gate of a run, when one is asked for. */
export function budgetOf(config: Omit<EvalConfig, "env">, meter: CostMeter): CostBudget | null {
  if (config.max_cost === undefined) return null;
  if (Object.keys(meter.prices).length === 0) {
    throw new ConfigError(
      `--max-cost needs prices: give [models."<model>"] input_per_mtok and output_per_mtok ` +
        `(or input_per_mtok/output_per_mtok in the endpoint registry)`,
    );
  }
  return new CostBudget(meter, config.max_cost);
}

/**
 * How judge entries find their endpoints: an alias from the endpoint registry, their own
 * `base_url` (and `api_key_var`; no key when none is named), or, only with
 * `use_agent_endpoint`, the agent's endpoint and key. Null when an entry names none.
 */
export async function judgeEndpointResolver(
  config: Omit<EvalConfig, "env">,
  agent: { client: ChatClient; model: string },
  /** The run's meter: a judge on an endpoint of its own is metered alongside the agent. */
  meter?: CostMeter,
): Promise<(entry: JudgeEndpointEntry) => JudgeEndpoint | null> {
  const registryPath = config.endpoints_path ??
    (existsSync("configs/endpoints.toml") ? "configs/endpoints.toml" : null);
  const registry = registryPath ? await loadEndpoints(registryPath) : new Map();
  const metered = (client: ChatClient): ChatClient => meter?.alongside(client) ?? client;
  return (entry) => {
    const samplingArgs = entry.sampling;
    if (entry.endpoint) {
      const replicas = registry.get(entry.endpoint);
      if (!replicas) {
        throw new ConfigError(
          `endpoint alias "${entry.endpoint}" is not in ${
            registryPath ?? "the endpoint registry (no configs/endpoints.toml)"
          }`,
        );
      }
      const r = replicas[0];
      const model = entry.model ?? r.model;
      // The registry's price for the alias's own model, unless [models."<model>"] gives one.
      if (meter && r.price && model === r.model && !meter.prices[model]) {
        meter.prices[model] = r.price;
      }
      return {
        client: metered(
          new OpenAIChatClient({
            base_url: entry.base_url ?? r.url,
            api_key_var: entry.api_key_var ?? r.key,
            extra_headers: { ...(r.headers ?? {}), ...(entry.headers ?? {}) },
            // The entry's limits hold for its own URL.
            ...(entry.base_url
              ? {}
              : { max_output_tokens: r.max_output_tokens, reasoning: r.reasoning }),
          }),
        ),
        model,
        samplingArgs,
      };
    }
    if (entry.base_url) {
      return {
        client: metered(
          new OpenAIChatClient({
            base_url: entry.base_url,
            api_key_var: entry.api_key_var,
            extra_headers: entry.headers,
          }),
        ),
        model: entry.model!,
        samplingArgs,
      };
    }
    if (entry.use_agent_endpoint) {
      return { client: agent.client, model: entry.model ?? agent.model, samplingArgs };
    }
    return null;
  };
}
