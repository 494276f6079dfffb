/**
 * From `[env]` to a running {@link Env}: the built-in Envs by id, Envs from local modules (or
 * URLs, with `--trust`), and the validation of an Env's roles and options against what it
 * declares (`env.<path>: message`).
 * @module
 */
import { pathToFileURL } from "node:url";
import { isAbsolute, resolve } from "node:path";
import { stat } from "node:fs/promises";
import type { z } from "npm:zod@^4.6.0";
import type { SandboxSource } from "../../runtimes/pool.ts";
import { AgentTable, deepMerge, EnvBase, formatIssue } from "../config.ts";
import { ConfigError } from "../errors.ts";
import { type ChatClient, OpenAIChatClient } from "../model/client.ts";
import { HARNESSES } from "../tasks/harness_registry.ts";
import type { SamplingArgs } from "../types.ts";
import type { AgentRole } from "./agent.ts";
import { Env, type EnvInit } from "./env.ts";
import { AgenticJudgeEnv, SharedAgenticJudgeEnv } from "./builtin/agentic_judge.ts";
import { BestOfNEnv } from "./builtin/best_of_n.ts";
import { BestOfNJudgeEnv } from "./builtin/best_of_n_judge.ts";
import { SingleAgentEnv } from "./builtin/single_agent.ts";
import { UserSimEnv } from "./builtin/user_sim.ts";

/** A concrete Env class. */
export type EnvClass = (new (init: EnvInit) => Env) & {
  roles: Record<string, Record<string, unknown>>;
  options: Record<string, z.ZodType>;
};

/** The built-in Envs by id. */
export const ENVS: Record<string, EnvClass> = {
  "single-agent": SingleAgentEnv,
  "best-of-n": BestOfNEnv,
  "agentic-judge": AgenticJudgeEnv,
  "shared-agentic-judge": SharedAgenticJudgeEnv,
  "best-of-n-judge": BestOfNJudgeEnv,
  "user-sim": UserSimEnv,
};

/** Whether `value` is an Env class (by shape, so an Env imported through another URL counts). */
export function isEnvClass(value: unknown): value is EnvClass {
  if (typeof value !== "function") return false;
  if (value.prototype instanceof Env) return true;
  const v = value as unknown as { roles?: unknown; prototype?: { run?: unknown } };
  return typeof v.prototype?.run === "function" && typeof v.roles === "object" &&
    v.roles !== null && typeof (v.prototype as { complete?: unknown }).complete === "function";
}

/** The one Env class a module exports (its default export first), or null. */
export function envClassOf(module: Record<string, unknown>, source: string): EnvClass | null {
  if (isEnvClass(module.default)) return module.default;
  const found = Object.entries(module).filter(([, v]) => isEnvClass(v));
  if (found.length > 1) {
    throw new ConfigError(
      `${source} exports several Envs (${found.map(([k]) => k).join(", ")}); ` +
        `export the one to run as default`,
    );
  }
  return found[0]?.[1] as EnvClass ?? null;
}

function looksLikeModule(id: string): boolean {
  return id.startsWith(".") || id.startsWith("/") || /\.(ts|js|mjs)$/.test(id) ||
    id.includes("/");
}

/**
 * The Env class an `env.id` names: a built-in, a local module (path from the cwd) or, with
 * `trust`, a URL.
 * @throws {ConfigError} for an unknown id (listing the built-ins), a module without an Env, or a URL without trust
 */
export async function resolveEnvClass(
  id: string,
  options: { trust?: boolean } = {},
): Promise<EnvClass> {
  const builtin = ENVS[id];
  if (builtin) return builtin;
  const known = Object.keys(ENVS).map((k) => `"${k}"`).join(", ");
  const isUrl = /^https?:\/\//.test(id);
  if (!isUrl && !looksLikeModule(id)) {
    throw new ConfigError(
      `env.id: unknown Env "${id}"; built-ins: ${known}; or a path to a module exporting an Env`,
    );
  }
  if (isUrl && !options.trust) {
    throw new ConfigError(
      `env.id: "${id}" is an Env from a URL; an Env drives agents, sandboxes and models from ` +
        `inside the evaluator, so it runs only with --trust (a sandboxed Env is not supported)`,
    );
  }
  let href = id;
  if (!isUrl) {
    const path = isAbsolute(id) ? id : resolve(id);
    try {
      await stat(path);
    } catch {
      throw new ConfigError(`env.id: Env module "${id}" does not exist`);
    }
    href = pathToFileURL(path).href;
  }
  let module: Record<string, unknown>;
  try {
    module = await import(href);
  } catch (error) {
    throw new ConfigError(
      `env.id: Env module "${id}" failed to load: ${(error as Error).message}`,
      {
        cause: error,
      },
    );
  }
  const cls = envClassOf(module, `Env module "${id}"`);
  if (!cls) throw new ConfigError(`env.id: Env module "${id}" exports no Env class`);
  return cls;
}

/** A role's own endpoint, as written in `[env.<role>.client]`. */
export interface RoleClientConfig {
  base_url?: string;
  api_key_var?: string;
  timeout?: number;
  max_retries?: number;
  headers?: Record<string, string>;
  /** The endpoint's output-token limit, as `[client] max_output_tokens`. */
  max_output_tokens?: number;
  /** Whether the endpoint takes `reasoning_effort` from a gateway program, as `[client] reasoning`. */
  reasoning?: boolean;
}

/**
 * The client of a role with its own endpoint; its key is read from `api_key_var`, and its
 * output limit and reasoning hold for that endpoint as `[client]`'s do for the run's.
 */
export function roleClient(c: RoleClientConfig): OpenAIChatClient {
  return new OpenAIChatClient({
    base_url: c.base_url!,
    api_key_var: c.api_key_var ?? "OPENAI_API_KEY",
    timeout: c.timeout,
    max_retries: c.max_retries,
    extra_headers: c.headers,
    max_output_tokens: c.max_output_tokens,
    reasoning: c.reasoning,
  });
}

/** `[env]` checked against the Env it names ({@link parseEnvConfig}): what {@link buildEnv} builds. */
export interface EnvConfig {
  /** The Env's id: `env.id`, else `taskset:<class>` for the taskset's own Env, else `single-agent`. */
  id: string;
  /** The Env class the id names. */
  cls: EnvClass;
  /** The fields every Env has, typed: the taskset, judges, toolsets, services, fork_group... */
  base: EnvBase;
  /** Each role's table: what the config writes, deep-merged over the Env's defaults, checked. */
  roles: Record<string, AgentTable>;
  /** The Env's options as its schemas parsed them (`timeout` and `max_concurrent_agents` too). */
  options: Record<string, unknown>;
}

/** Options of {@link parseEnvConfig}. */
export interface ParseEnvOptions {
  /** The config's name in errors (`run.toml`, `command line`). */
  source: string;
  /** Let `env.id` name a module by URL. */
  trust?: boolean;
  /** An Env the taskset's module exports: used when `env.id` is not given (id `taskset:<class>`). */
  tasksetEnv?: EnvClass | null;
}

/** `[env]` keys that are the run's, not the Env's options. */
const RUN_KEYS = ["taskset", "id", "judges", "toolsets", "services", "fork_group"];

/**
 * Check `[env]` against the Env it names, once: the Env class is resolved from `env.id`
 * first, then the table is parsed with that Env's schema (its roles and options over the
 * fields every Env has), and each role's table is merged over the Env's defaults.
 * @param raw the `[env]` table as written (after CLI overrides)
 * @throws {ConfigError} naming the file and field (`run.toml: env.judge.model: ...`)
 * @throws {TypeError} for an Env whose role shadows an `[env]` field or whose role defaults are not a role table
 */
export async function parseEnvConfig(
  raw: Record<string, unknown>,
  options: ParseEnvOptions,
): Promise<EnvConfig> {
  const { source } = options;
  const at = (field: string, message: string) => new ConfigError(`${source}: ${field}: ${message}`);
  if ("harness" in raw) {
    throw at(
      "env.harness",
      "a harness belongs to a role; use --env.agent.harness.* ([env.agent.harness] in TOML, or the role's name for other Envs)",
    );
  }
  const id = typeof raw.id === "string" && raw.id
    ? raw.id
    : options.tasksetEnv
    ? `taskset:${options.tasksetEnv.name || "Env"}`
    : "single-agent";
  let cls: EnvClass;
  try {
    cls = options.tasksetEnv && !raw.id ? options.tasksetEnv : await resolveEnvClass(id, options);
  } catch (error) {
    if (error instanceof ConfigError) throw new ConfigError(`${source}: ${error.message}`);
    throw error;
  }
  const baseKeys = Object.keys(EnvBase.shape);
  for (const role of Object.keys(cls.roles)) {
    if (baseKeys.includes(role) || role in cls.options) {
      throw new TypeError(`Env "${id}": role "${role}" shadows an [env] field of the same name`);
    }
  }
  const schema = EnvBase.extend({
    ...Object.fromEntries(Object.keys(cls.roles).map((r) => [r, AgentTable.optional()])),
    ...cls.options,
  });
  const parsed = schema.safeParse(raw);
  if (!parsed.success) {
    const issue = parsed.error.issues[0];
    let message = `${source}: ${formatIssue(issue, "env")}`;
    if (issue.code === "unrecognized_keys" && issue.path.length === 0) {
      message += `; "${id}" takes ${
        [...baseKeys, ...Object.keys(cls.roles), ...Object.keys(cls.options)]
          .map((k) => `"${k}"`).join(", ")
      }`;
    }
    throw new ConfigError(message);
  }
  // The fields every Env has, typed: this parse succeeds on what the one above accepted.
  const base = EnvBase.parse(pick(parsed.data, baseKeys));
  const roles: Record<string, AgentTable> = {};
  for (const [name, defaults] of Object.entries(cls.roles)) {
    const written = parsed.data[name];
    const merged = AgentTable.safeParse(deepMerge(defaults, isTable(written) ? written : {}));
    if (!merged.success) {
      throw new TypeError(
        `Env "${id}": role "${name}"'s defaults are not a role table: ` +
          formatIssue(merged.error.issues[0], name),
      );
    }
    const config = merged.data;
    if (config.client && !config.client.base_url) {
      throw at(
        `env.${name}.client.base_url`,
        `role "${name}" sets a client but no base_url; give the endpoint or drop env.${name}.client`,
      );
    }
    if (config.client && !config.model) {
      throw at(
        `env.${name}.model`,
        `role "${name}" has its own endpoint (env.${name}.client.base_url) but no model; set env.${name}.model`,
      );
    }
    const harnessId = config.harness?.id;
    if (harnessId && !HARNESSES[harnessId]) {
      throw at(
        `env.${name}.harness.id`,
        `unknown harness "${harnessId}"; known: ${
          Object.keys(HARNESSES).map((h) => `"${h}"`).join(", ")
        }`,
      );
    }
    roles[name] = config;
  }
  const envOptions: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(parsed.data)) {
    if (!(k in cls.roles) && !RUN_KEYS.includes(k)) envOptions[k] = v;
  }
  return { id, cls, base, roles, options: envOptions };
}

function pick(table: Record<string, unknown>, keys: string[]): Record<string, unknown> {
  return Object.fromEntries(Object.entries(table).filter(([k]) => keys.includes(k)));
}

function isTable(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

/** Options of {@link buildEnv}. */
export interface BuildEnvOptions {
  /** The `[env]` table as written (after CLI overrides); or give {@link config}. */
  raw?: Record<string, unknown>;
  /** `[env]` as {@link parseEnvConfig} checked it; default parsed from `raw` here. */
  config?: EnvConfig;
  /** The config's name in errors (`run.toml`, `command line`). */
  source: string;
  /** The run's endpoint, model and sampling: each role's default. */
  client: ChatClient;
  model: string;
  samplingArgs?: SamplingArgs;
  /** Builds a client for a role with its own endpoint (`[env.<role>.client]`). */
  makeClient: (client: RoleClientConfig) => ChatClient;
  /** Where every role's sandboxes come from (limits, warm pool). */
  sandboxes?: SandboxSource;
  trust?: boolean;
  /** An Env the taskset's module exports: used when `env.id` is not given (id `taskset:<class>`). */
  tasksetEnv?: EnvClass | null;
  /** Where relative paths in options (rubric files) are read from; default the cwd. */
  baseDir?: string;
}

/**
 * Build the Env `[env]` names: each role with its model, endpoint, sampling and runtime
 * policy, over the run's defaults. `[env]` is checked first unless `config` is given.
 * @throws {ConfigError} naming the file and field
 */
export async function buildEnv(options: BuildEnvOptions): Promise<Env> {
  const { source } = options;
  const { id, cls, roles: tables, options: envOptions } = options.config ??
    await parseEnvConfig(options.raw ?? {}, options);
  const roles: Record<string, AgentRole> = {};
  for (const [name, config] of Object.entries(tables)) {
    roles[name] = {
      name,
      client: config.client ? options.makeClient(config.client) : options.client,
      model: config.model ?? options.model,
      samplingArgs: { ...(options.samplingArgs ?? {}), ...(config.sampling ?? {}) },
      harness: config.harness,
      policy: {
        runtime: config.runtime ?? {},
        scoring: config.scoring,
        maxTurns: config.harness?.max_turns ?? config.max_turns,
        tokenLimits: config.max_input_tokens || config.max_output_tokens || config.max_total_tokens
          ? {
            max_input_tokens: config.max_input_tokens,
            max_output_tokens: config.max_output_tokens,
            max_total_tokens: config.max_total_tokens,
          }
          : undefined,
        toolTimeoutSeconds: config.harness?.tool_timeout,
        timeouts: config.timeout,
        sandboxes: options.sandboxes,
      },
    };
  }
  try {
    return new cls({ id, options: envOptions, roles, baseDir: options.baseDir });
  } catch (error) {
    if (error instanceof ConfigError) throw new ConfigError(`${source}: ${error.message}`);
    throw error;
  }
}

/**
 * The `[env]` schema the CLI types its `--env.*` flags with: every built-in's roles and options,
 * and those of `extra` (an Env from a module).
 */
export function cliEnvSchema(...extra: EnvClass[]): z.ZodType {
  const shape: Record<string, z.ZodType> = {};
  for (const cls of [...Object.values(ENVS), ...extra]) {
    for (const role of Object.keys(cls.roles)) shape[role] = AgentTable.optional();
    Object.assign(shape, cls.options);
  }
  return EnvBase.extend(shape);
}
