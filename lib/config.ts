/**
 * Evaluation configs: TOML files with snake_case keys, overridden by CLI flags and dotted
 * keys (`--env.agent.scoring.mode isolated`), validated strictly with zod.
 * @module
 */
import { readFile } from "node:fs/promises";
import { parse as parseToml } from "npm:smol-toml@^1.4.0";
import { z } from "npm:zod@^4.6.0";
import { ConfigError } from "./errors.ts";
import { NetworkPolicyTable, RuntimeTable } from "../runtimes/config.ts";

// The schemas' types are written out, since they are part of the public API (`EnvConfig`), and
// each schema is built with its shape's type as the type argument, so a key the type lacks or
// a field of another type is a type error.
type Num = z.ZodOptional<z.ZodNumber>;
type Str = z.ZodOptional<z.ZodString>;
type Bool = z.ZodOptional<z.ZodBoolean>;
type JsonObject = z.ZodRecord<z.ZodString, z.ZodUnknown>;
type StringRecord = z.ZodOptional<z.ZodRecord<z.ZodString, z.ZodString>>;
type Strings = z.ZodOptional<z.ZodArray<z.ZodString>>;
type Choice<T extends string> = z.ZodOptional<z.ZodEnum<{ [K in T]: K }>>;

const jsonObject: JsonObject = z.record(z.string(), z.unknown());
const nonNegative: Num = z.number().min(0).optional();
const count: Num = z.number().int().min(1).optional();

/** The fields of {@link SamplingSection}. */
type SamplingShape = {
  temperature: Num;
  top_p: Num;
  top_k: Num;
  min_p: Num;
  max_tokens: Num;
  max_completion_tokens: Num;
  min_tokens: Num;
  n: Num;
  seed: Num;
  stop: z.ZodOptional<z.ZodNullable<z.ZodUnion<readonly [z.ZodString, z.ZodArray<z.ZodString>]>>>;
  presence_penalty: Num;
  frequency_penalty: Num;
  repetition_penalty: Num;
  logprobs: Bool;
  top_logprobs: Num;
  logit_bias: z.ZodOptional<z.ZodRecord<z.ZodString, z.ZodNumber>>;
  response_format: z.ZodOptional<JsonObject>;
  tool_choice: z.ZodOptional<z.ZodUnion<readonly [z.ZodString, JsonObject]>>;
  parallel_tool_calls: Bool;
  reasoning_effort: Str;
  reasoning: z.ZodOptional<JsonObject>;
  verbosity: Str;
  service_tier: Str;
  user: Str;
  metadata: StringRecord;
  store: Bool;
  return_token_ids: z.ZodOptional<z.ZodUnion<readonly [z.ZodBoolean, z.ZodLiteral<"required">]>>;
  extra_body: z.ZodOptional<JsonObject>;
};

/**
 * Sampling arguments (`sampling_args`, `[env.<role>.sampling]`): the chat-completions fields
 * vf knows, typed, so `--sampling_args.max_tokens 100` reaches the endpoint as a number and a
 * typo is refused. Keys only one server takes go under `extra_body`, as with the OpenAI SDK
 * upstream's `verifiers` passes them to.
 */
export const SamplingSection: z.ZodObject<SamplingShape, z.core.$strict> = z.strictObject<
  SamplingShape
>({
  temperature: nonNegative,
  top_p: nonNegative,
  top_k: z.number().int().optional(),
  min_p: nonNegative,
  max_tokens: count,
  max_completion_tokens: count,
  min_tokens: z.number().int().min(0).optional(),
  n: count,
  seed: z.number().int().optional(),
  stop: z.union([z.string(), z.array(z.string())]).nullable().optional(),
  presence_penalty: z.number().optional(),
  frequency_penalty: z.number().optional(),
  repetition_penalty: nonNegative,
  logprobs: z.boolean().optional(),
  top_logprobs: z.number().int().min(0).optional(),
  logit_bias: z.record(z.string(), z.number()).optional(),
  response_format: jsonObject.optional(),
  tool_choice: z.union([z.string(), jsonObject]).optional(),
  parallel_tool_calls: z.boolean().optional(),
  reasoning_effort: z.string().optional(),
  reasoning: jsonObject.optional(),
  verbosity: z.string().optional(),
  service_tier: z.string().optional(),
  user: z.string().optional(),
  metadata: z.record(z.string(), z.string()).optional(),
  store: z.boolean().optional(),
  /** Record token data: true, false, or "required" (fail when the endpoint returns none). */
  return_token_ids: z.union([z.boolean(), z.literal("required")], {
    error: (issue) => `must be true, false or "required", got ${JSON.stringify(issue.input)}`,
  }).optional(),
  /** Fields sent as they are, merged into the request body (vLLM's own, for instance). */
  extra_body: jsonObject.optional(),
});

/** The sampling keys vf knows, for messages. */
export const SAMPLING_KEYS: readonly string[] = Object.keys(SamplingSection.shape);

/**
 * One schema issue as text: unknown keys listed by name, and for a sampling table the keys it
 * takes and where the others go.
 */
export function describeIssue(issue: z.core.$ZodIssue, root?: string): string {
  if (issue.code !== "unrecognized_keys") return issue.message;
  const keys = issue.keys;
  let message = `unknown key${keys.length > 1 ? "s" : ""} ${keys.map((k) => `"${k}"`).join(", ")}`;
  const last = issue.path[issue.path.length - 1];
  if (last === "sampling" || last === "sampling_args") {
    // The table's whole path (env.agent.sampling), a flag where one can reach it.
    const at = [...(root ? [root] : []), ...issue.path.map(String), "extra_body", keys[0]]
      .join(".");
    message += `; sampling takes ${SAMPLING_KEYS.join(", ")}; put other fields your endpoint ` +
      `accepts under extra_body (e.g. ${at.includes("[") ? at : `--${at}`})`;
  }
  return message;
}

/**
 * A schema issue as `path: message`, its path under `root` when given (`env`,
 * `endpoint[2]`), or the message alone when it has no path: the one formatter of schema
 * issues, for config files and wire input alike.
 */
export function formatIssue(issue: z.core.$ZodIssue, root?: string): string {
  const path = [...(root ? [root] : []), ...issue.path.map(String)].join(".");
  return path ? `${path}: ${describeIssue(issue, root)}` : describeIssue(issue, root);
}

/**
 * A schema's first issues (at most five) as {@link formatIssue} writes them, joined by `; `.
 * @param error what `safeParse` failed with
 * @param root a path in front of every issue's own, e.g. `task_data`
 */
export function describeIssues(error: z.ZodError, root?: string): string {
  return error.issues.slice(0, 5).map((issue) => formatIssue(issue, root)).join("; ");
}

/** The `[client]` table's fields. */
type ClientShape = {
  base_url: Str;
  api_key_var: Str;
  timeout: Num;
  max_retries: Num;
  headers: StringRecord;
  transport: Choice<"auto" | "http1" | "fetch">;
  max_output_tokens: Num;
  reasoning: Bool;
  cache: Bool;
  cache_repeats: Bool;
  cache_path: Str;
  session_header: Bool;
  cache_salt: Choice<"group" | "rollout">;
};

/** The `[client]` table: how to reach the model. */
export const ClientSection: z.ZodObject<ClientShape, z.core.$strict> = z.strictObject<
  ClientShape
>({
  base_url: z.string().optional(),
  api_key_var: z.string().optional(),
  timeout: z.number().positive().optional(),
  max_retries: z.number().int().min(0).optional(),
  headers: z.record(z.string(), z.string()).optional(),
  /** "auto" (default): plain-http endpoints use vf's HTTP/1.1 pool; "fetch": always fetch. */
  transport: z.enum(["auto", "http1", "fetch"]).optional(),
  /** The endpoint's output-token limit: a request's larger cap is clamped to it. */
  max_output_tokens: z.number().int().positive().optional(),
  /** The endpoint's model takes `reasoning_effort` (a gateway program's `thinking` is sent). */
  reasoning: z.boolean().optional(),
  /** Answer repeated calls from the model-call cache (`--cache`). */
  cache: z.boolean().optional(),
  /** Let the `-r` repeats of one example share cached answers (default: each its own). */
  cache_repeats: z.boolean().optional(),
  /** The cache database; default `$VF_CACHE_DB`, else `~/.cache/vf/model-cache.sqlite`. */
  cache_path: z.string().optional(),
  /** Send `X-Session-ID: <trace id>` on every model call of a rollout. */
  session_header: z.boolean().optional(),
  /** vLLM's prefix-cache salt in each request: one per task group, or per rollout. */
  cache_salt: z.enum(["group", "rollout"]).optional(),
});

/** One evaluation's settings (the file's top level, after CLI overrides). */
export const EvalConfig = z.strictObject({
  env_id: z.string().optional(),
  env_args: jsonObject.optional(),
  env: jsonObject.optional(),
  model: z.string().optional(),
  base_url: z.string().optional(),
  api_base_url: z.string().optional(),
  api_key_var: z.string().optional(),
  client: ClientSection.optional(),
  endpoints_path: z.string().optional(),
  num_examples: z.number().int().optional(),
  rollouts_per_example: z.number().int().min(1).optional(),
  max_concurrent: z.number().int().optional(),
  sampling_args: SamplingSection.optional(),
  max_tokens: z.number().int().positive().optional(),
  temperature: z.number().min(0).optional(),
  save_results: z.boolean().optional(),
  save: z.boolean().optional(),
  output_dir: z.string().optional(),
  resume: z.union([z.boolean(), z.string()]).optional(),
  independent_scoring: z.boolean().optional(),
  max_retries: z.number().int().min(0).optional(),
  /**
   * pass@k and pass^k count a rollout correct when its reward is at least this (the summed,
   * weighted reward, as upstream); default the environment's `passThreshold`, else 0.5.
   */
  pass_threshold: z.number().finite().optional(),
  /** Exit 1 when more than this fraction of rollouts errored (default: only when all did). */
  max_error_rate: z.number().min(0).max(1).optional(),
  state_columns: z.array(z.string()).optional(),
  /**
   * Write each rollout's token data (the message graph's `token_ids`/`mask`/`logprobs`, from
   * `sampling_args.return_token_ids`) to results.jsonl; it is large. Default false.
   */
  save_tokens: z.boolean().optional(),
  /** Divide group advantages (reward minus the example's mean) by the group's deviation. */
  advantage_std: z.boolean().optional(),
  extra_env_kwargs: jsonObject.optional(),
  timeout: z.number().positive().optional(),
  shuffle_seed: z.number().int().optional(),
  headers: z.record(z.string(), z.string()).optional(),
  verbose: z.boolean().optional(),
  quiet: z.boolean().optional(),
  /** Run the environment under Deno's permission sandbox (always on for URLs). */
  sandbox: z.strictObject({
    enabled: z.boolean().optional(),
    allow_net: z.array(z.string()).optional(),
    allow_read: z.array(z.string()).optional(),
    allow_env: z.array(z.string()).optional(),
    allow_import: z.array(z.string()).optional(),
  }).optional(),
  /** Run a URL environment with every permission instead of the sandbox (explicit opt-out). */
  trust: z.boolean().optional(),
  /** Accept changed remote modules and re-pin them in the lock file. */
  reload: z.boolean().optional(),
  /** The lock file pinning remote modules; default vf.lock beside the config (or in the cwd). */
  lock_file: z.string().optional(),
  /** Sandbox and model-connection limits (`[limits]`). */
  limits: z.lazy(() => LimitsSection).optional(),
  /** Run rollouts on this env server (`vf serve`) instead of loading the environment here. */
  server: z.string().optional(),
  /** Prices per model id, in USD per million tokens (`[models."gpt-x"]`). */
  models: z.record(
    z.string(),
    z.strictObject({
      input_per_mtok: z.number().min(0),
      output_per_mtok: z.number().min(0),
    }),
  ).optional(),
  /** Stop starting rollouts once this many USD would be spent (`--max-cost`). */
  max_cost: z.number().positive().optional(),
});

/** A validated evaluation config. */
export type EvalConfig = z.infer<typeof EvalConfig>;

/**
 * The run's sampling arguments: `sampling_args` with the `-t/--max-tokens` and
 * `-T/--temperature` shorthands filled in where it does not set them (`vf eval` and `vf run`
 * alike).
 */
export function samplingOf(config: Omit<EvalConfig, "env">): Record<string, unknown> {
  const sampling: Record<string, unknown> = { ...(config.sampling_args ?? {}) };
  if (config.max_tokens !== undefined && sampling.max_tokens === undefined) {
    sampling.max_tokens = config.max_tokens;
  }
  if (config.temperature !== undefined && sampling.temperature === undefined) {
    sampling.temperature = config.temperature;
  }
  return sampling;
}

/** Read and parse a TOML file, naming the file and line on syntax errors. */
export async function readToml(path: string): Promise<Record<string, unknown>> {
  let text: string;
  try {
    text = await readFile(path, "utf8");
  } catch (error) {
    throw new ConfigError(`Cannot read config "${path}": ${(error as Error).message}`);
  }
  try {
    return parseToml(text) as Record<string, unknown>;
  } catch (error) {
    const msg = (error as Error).message.split("\n")[0];
    // deno-lint-ignore no-explicit-any
    const line = (error as any).line;
    throw new ConfigError(`${path}${line ? `:${line}` : ""}: invalid TOML: ${msg}`);
  }
}

/** Deep-merge `over` into `base` (objects merge, everything else replaces). */
export function deepMerge(
  base: Record<string, unknown>,
  over: Record<string, unknown>,
): Record<string, unknown> {
  const out: Record<string, unknown> = { ...base };
  for (const [k, v] of Object.entries(over)) {
    const b = out[k];
    if (isPlainObject(b) && isPlainObject(v)) out[k] = deepMerge(b, v);
    else out[k] = v;
  }
  return out;
}

function isPlainObject(v: unknown): v is Record<string, unknown> {
  return typeof v === "object" && v !== null && !Array.isArray(v);
}

/** Set `a.b.c = value` in a nested object, creating tables as needed. */
export function setDotted(target: Record<string, unknown>, key: string, value: unknown): void {
  const parts = key.split(".");
  let node = target;
  for (const p of parts.slice(0, -1)) {
    if (!isPlainObject(node[p])) node[p] = {};
    node = node[p] as Record<string, unknown>;
  }
  node[parts[parts.length - 1]] = value;
}

/** Validate a merged config; issues become `source: path.to.field: message`. */
export function validateEvalConfig(raw: Record<string, unknown>, source: string): EvalConfig {
  const result = EvalConfig.safeParse(raw);
  if (!result.success) throw new ConfigError(`${source}: ${formatIssue(result.error.issues[0])}`);
  return result.data;
}

/** Resolve `${VAR}` and `${VAR:-default}` templates against an environment. */
export function resolveTemplate(
  text: string,
  env: (name: string) => string | undefined,
): string {
  return text.replace(/\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}/g, (_m, name, fallback) => {
    const v = env(name);
    if (v !== undefined && v !== "") return v;
    if (fallback !== undefined) return fallback;
    throw new ConfigError(`Environment variable "${name}" is not set and has no default`);
  });
}

/** A runtime table (`[env.agent.runtime]`, `[env.agent.scoring.runtime]`): runtimes/ owns it. */
export { RuntimeTable };

const SandboxLimitTable = z.strictObject({
  /** Sandboxes alive at once. */
  max_sandboxes: z.number().int().min(1).optional(),
  /** Sandbox creations per second. */
  sandbox_create_rate: z.number().positive().optional(),
  /** Creations allowed back to back before the rate applies (default 1). */
  sandbox_create_burst: z.number().int().min(1).optional(),
});

/**
 * The `[limits]` table: sandbox limits for every runtime type (overridable per type in
 * `[limits.runtime.<type>]`) and, separately, the model-connection limit.
 */
export const LimitsSection = SandboxLimitTable.extend({
  /** Model requests in flight at once. */
  max_model_connections: z.number().int().min(1).optional(),
  /**
   * Find how much runs at once instead of fixing it: start low, grow while healthy, halve on
   * infrastructure errors or rising latency, never past the configured concurrency.
   */
  adaptive: z.boolean().optional(),
  runtime: z.record(z.string(), SandboxLimitTable).optional(),
});

const positive: Num = z.number().positive().optional();

/** The `[client]` keys a role's own endpoint takes. */
type RoleClientKey =
  | "base_url"
  | "api_key_var"
  | "timeout"
  | "max_retries"
  | "headers"
  | "max_output_tokens"
  | "reasoning";

/** The fields of {@link AgentTable}. */
type AgentShape = {
  model: Str;
  client: z.ZodOptional<z.ZodObject<Pick<ClientShape, RoleClientKey>, z.core.$strict>>;
  sampling: z.ZodOptional<typeof SamplingSection>;
  harness: z.ZodOptional<
    z.ZodObject<{
      id: Str;
      edit: Bool;
      max_turns: Num;
      tool_timeout: Num;
      command: z.ZodOptional<z.ZodUnion<readonly [z.ZodString, z.ZodArray<z.ZodString>]>>;
      agent: Choice<"python" | "sh">;
      env: StringRecord;
      forward_env: Strings;
      timeout: Num;
      version: Str;
      model: Str;
      api: Str;
      args: Strings;
      install: Choice<"image" | "archive">;
    }, z.core.$strict>
  >;
  runtime: z.ZodOptional<typeof RuntimeTable>;
  scoring: z.ZodOptional<
    z.ZodObject<{
      mode: Choice<"shared" | "isolated">;
      retries: Num;
      env: StringRecord;
      runtime: z.ZodOptional<typeof RuntimeTable>;
      network: z.ZodOptional<typeof NetworkPolicyTable>;
      services: Bool;
    }, z.core.$strict>
  >;
  max_turns: Num;
  max_input_tokens: Num;
  max_output_tokens: Num;
  max_total_tokens: Num;
  timeout: z.ZodOptional<
    z.ZodObject<{ setup: Num; agent: Num; finalize: Num; scoring: Num }, z.core.$strict>
  >;
};

/**
 * One role's agent (`[env.agent]`, `[env.solver]`, `[env.judge]`, `[env.user]`, ...): what a
 * user writes is deep-merged over the Env's defaults for that role.
 */
export const AgentTable: z.ZodObject<AgentShape, z.core.$strict> = z.strictObject<AgentShape>({
  /** Default: the run's model. */
  model: z.string().optional(),
  /**
   * The role's own endpoint; default the run's. A role with its own endpoint names its model.
   * Its keys are `[client]`'s that describe an endpoint, checked the same way.
   */
  client: ClientSection.pick({
    base_url: true,
    api_key_var: true,
    timeout: true,
    max_retries: true,
    headers: true,
    max_output_tokens: true,
    reasoning: true,
  }).optional(),
  /** Sampling arguments merged over the run's. */
  sampling: SamplingSection.optional(),
  harness: z.strictObject({
    /** Default: the task's choice (`Task.HARNESS`), else `bash`. */
    id: z.string().optional(),
    edit: z.boolean().optional(),
    max_turns: z.number().int().min(1).optional(),
    tool_timeout: positive,
    /** program: the command run in the sandbox (default vf's agent program). */
    command: z.union([z.string().min(1), z.array(z.string()).min(1)]).optional(),
    /** program: which shipped agent runs when no command is given. */
    agent: z.enum(["python", "sh"]).optional(),
    /** program: extra environment, and evaluator variables passed through by name. */
    env: z.record(z.string(), z.string()).optional(),
    forward_env: z.array(z.string()).optional(),
    /** program: seconds the program may run. */
    timeout: positive,
    /** An agent CLI (claude-code, codex, pi, qwen-code): its npm version, default pinned. */
    version: z.string().min(1).optional(),
    /** An agent CLI: the model name it is told, default the run's. */
    model: z.string().min(1).optional(),
    /** An agent CLI: the API it speaks to the gateway, where it has a choice. */
    api: z.string().min(1).optional(),
    /** An agent CLI: extra arguments of its command line. */
    args: z.array(z.string()).optional(),
    /** An agent CLI: baked into a cached image of the task's (default, docker) or uploaded. */
    install: z.enum(["image", "archive"]).optional(),
  }).optional(),
  runtime: RuntimeTable.optional(),
  scoring: z.strictObject({
    mode: z.enum(["shared", "isolated"]).optional(),
    retries: z.number().int().min(0).optional(),
    env: z.record(z.string(), z.string()).optional(),
    runtime: RuntimeTable.optional(),
    /** Where grading may connect; default the agent's policy. */
    network: NetworkPolicyTable.optional(),
    /** Isolated grading: the task's services, started fresh for the grading sandbox. */
    services: z.boolean().optional(),
  }).optional(),
  max_turns: z.number().int().min(1).optional(),
  /** Token budgets over a rollout, checked before each model call (soft by one call). */
  max_input_tokens: z.number().int().min(1).optional(),
  max_output_tokens: z.number().int().min(1).optional(),
  max_total_tokens: z.number().int().min(1).optional(),
  /** Per-phase limits in seconds that beat the task's own. */
  timeout: z.strictObject({
    setup: positive,
    agent: positive,
    finalize: positive,
    scoring: positive,
  }).optional(),
});

/** A validated role table. */
export type AgentTable = z.infer<typeof AgentTable>;

/** The fields of {@link EnvBase}. */
type EnvBaseShape = {
  id: Str;
  taskset: z.ZodObject<
    { id: z.ZodString; task: z.ZodOptional<z.ZodRecord<z.ZodString, z.ZodUnknown>> },
    z.core.$loose
  >;
  timeout: z.ZodOptional<z.ZodObject<{ episode: Num; finalize: Num }, z.core.$strict>>;
  max_concurrent_agents: Num;
  judges: z.ZodOptional<z.ZodArray<JsonObject>>;
  toolsets: z.ZodOptional<z.ZodArray<JsonObject>>;
  services: z.ZodOptional<z.ZodObject<{ compose: z.ZodString }, z.core.$strict>>;
  fork_group: Bool;
};

/** The `[env]` fields every Env has (its roles and own options come on top). */
export const EnvBase: z.ZodObject<EnvBaseShape, z.core.$strict> = z.strictObject<EnvBaseShape>({
  /** A built-in Env id, or a path or URL to a module exporting an Env. */
  id: z.string().min(1).optional(),
  taskset: z.looseObject({
    id: z.string().min(1),
    task: z.record(z.string(), z.unknown()).optional(),
  }),
  /** Wall-clock limits in seconds on the Env's own run (setup + run) and finalize. */
  timeout: z.strictObject({ episode: positive, finalize: positive }).optional(),
  /** Agent runs of one episode active at once; default 1. */
  max_concurrent_agents: z.number().int().min(1).optional(),
  /** Judges scoring every trainable trace (validated by the judges' own schemas). */
  judges: z.array(z.record(z.string(), z.unknown())).optional(),
  /** Toolsets (MCP) offered to every trainable agent (validated by the toolset loader). */
  toolsets: z.array(z.record(z.string(), z.unknown())).optional(),
  /** Services (a Compose file) for tasks that declare none of their own. */
  services: z.strictObject({ compose: z.string().min(1) }).optional(),
  /**
   * Fork-per-group: a task's first rollout runs setup and its sandbox is snapshotted; the
   * task's other rollouts start from the snapshot (docker). Default the taskset's choice.
   */
  fork_group: z.boolean().optional(),
});

/** The validated `[env]` fields every Env has. */
export type EnvBase = z.infer<typeof EnvBase>;
