#!/usr/bin/env -S deno run -A
/**
 * The `vf` command line: `vf eval`, `vf demo`, `vf --help`, `vf --version`.
 * @module
 */
import process from "node:process";
import { existsSync } from "node:fs";
import { readdir, readFile, stat } from "node:fs/promises";
import { dirname, join, resolve } from "node:path";
import yargsParser from "npm:yargs-parser@^22.0.0";
import { BUILTINS, TASKSETS } from "./environments/mod.ts";
import { cleanupContainers } from "./runtimes/docker/mod.ts";
import { cleanupLedger, defaultLedger } from "./runtimes/ledger.ts";
import { SandboxUnavailableError } from "./runtimes/errors.ts";
import { sandboxLimitsFromConfig } from "./runtimes/limits.ts";
import { WarmPool } from "./runtimes/pool.ts";
import { limitModelConnections } from "./lib/limits.ts";
import { setAppHandlesSignals, stopAllRuntimes } from "./runtimes/registry.ts";
import { getHarness } from "./lib/harness.ts";
import type { AgentPolicy } from "./lib/task_rollout.ts";
import { runTaskset, validateTaskset } from "./lib/task_run.ts";
import { type ChatClient, OpenAIChatClient } from "./lib/client.ts";
import {
  deepMerge,
  type EvalConfig,
  readToml,
  RuntimeTable,
  setDotted,
  validateEvalConfig,
  validateTaskEnv,
} from "./lib/config.ts";
import { loadEndpoints, RoundRobinClient } from "./lib/endpoints.ts";
import type { Environment } from "./lib/environment.ts";
import { ConfigError, describeError, VfError } from "./lib/errors.ts";
import { initPackage, PACKAGE_KINDS, type PackageKind } from "./lib/init.ts";
import { evaluate } from "./lib/evaluate.ts";
import { loadExampleDataset } from "./lib/example_datasets.ts";
import { loadEnvironment, loadTasksetSpec } from "./lib/load_env.ts";
import { startEnvServer } from "./lib/env_server.ts";
import { forwardableConfig, ServerEnvironment } from "./lib/env_client.ts";
import {
  RemoteEnvironment,
  RemoteTaskset,
  type SandboxPermissions,
  startSandboxHost,
} from "./lib/sandbox/remote.ts";
import { demoResponder, startModelServer } from "./lib/local_model_server.ts";
import { ProgressDisplay, renderSummary } from "./lib/progress.ts";
import { loadMetadata, loadOutputs, writeJsonAtomic } from "./lib/results.ts";
import { VERSION } from "./lib/version.ts";

const HELP = `vf ${VERSION}: build, share and run LLM evaluation environments

Usage:
  vf eval <env> [options]        evaluate a model on an environment
  vf eval @ <config.toml> [opts] evaluate from a TOML config (flags override it)
  vf run <taskset> [options]     run an agent on sandboxed tasks (see vf run --help)
  vf validate <taskset> [-n N]   check gold answers score 1.0 and untouched workspaces 0.0
  vf cleanup [--run ID] [--older-than 1h]  remove leftover sandboxes
  vf init <name> [--kind taskset|environment]  scaffold an environment package
  vf demo [env]                  evaluate a built-in environment against vf's scripted
                                 local demo model (no API key, no network)
  vf serve <env> [--port 8123]   serve an environment over HTTP to trainers and evaluators
                                 (vf eval <env> --server <url>; see vf serve --help)
  vf --help | vf <command> --help
  vf --version

Environments: ${Object.keys(BUILTINS).join(", ")}, or a path to a module exporting
loadEnvironment(args) (a folder means its mod.ts).
`;

const EVAL_HELP = `vf eval <env | @ config.toml> [options]

Model endpoint:
  -m, --model <id>              model id or endpoint alias (default gpt-4.1-mini)
  -b, --base-url <url>          OpenAI-compatible base URL (default $OPENAI_BASE_URL or
                                https://api.openai.com/v1)
  -k, --api-key-var <NAME>      environment variable holding the key (default OPENAI_API_KEY)
  -e, --endpoints-path <file>   endpoint registry (default ./configs/endpoints.toml if present)
      --header "Name: value"    extra request header (repeatable)
Run size:
  -n, --num-examples <n>        examples to evaluate, -1 for all (env default, else 5)
  -r, --rollouts-per-example <r> rollouts per example (env default, else 3)
  -c, --max-concurrent <c>      rollouts in flight (default 32)
      --seed <s>                shuffle the eval set with this seed before taking n
Sampling:
  -a, -S, --sampling-args <json> sampling args passed to the API, e.g. '{"temperature":0.7}'
  -t, --max-tokens <n>          shorthand for sampling max_tokens
  -T, --temperature <x>         shorthand for sampling temperature
Environment:
      --env-args <json>         arguments for loadEnvironment()
  -x, --extra-env-kwargs <json> settings applied to the loaded env (e.g. '{"max_turns":5}')
      --timeout <seconds>       wall-clock limit per rollout
      --server <url>            run the rollouts on an env server started with vf serve; the
                                endpoint and the key from -k are sent to it in each request
URL environments (always in a separate Deno process, modules pinned in the lock file):
      --allow-net <h:p,...>     hosts the sandboxed environment may reach (also --allow-read,
                                --allow-env, --allow-import); vf.json beside mod.ts may declare net
      --sandbox                 run a local environment under the same permission sandbox
      --trust                   no sandbox: every permission, this process's env and cwd
      --reload                  accept changed remote modules and pin them again
      --lock-file <file>        lock file (default vf.lock beside the TOML, else ./vf.lock)
Results:
  -s, --save-results            save results (the default; kept for verifiers users)
      --no-save                 do not write results
  -o, --output-dir <dir>        base directory (default ./outputs)
  -R, --resume [dir]            finish an interrupted run (latest matching one if no dir)
  -C, --state-columns <a,b>     extra state keys to save per rollout
  -i, --independent-scoring     score rollouts one by one instead of per group
      --max-retries <n>         re-run groups hit by infrastructure errors (default 0)
  -q, --quiet                   no progress display
Any config key can be set with a dotted flag, e.g. --client.timeout 30.

Writes outputs/evals/<env>--<model>/<run_id>/{results.jsonl,metadata.json,config.json}.
`;

const RUN_HELP = `vf run <taskset> [options]     (same as: vf eval @ cfg.toml with [env.taskset] id)

Runs an agent on each task of a taskset inside sandboxes and grades it.
  -n <tasks>  -r <rollouts per task>  -c <concurrent rollouts (default 4)>
  -m, -b, -k                          model, base URL, API key variable (as vf eval)
  --env.agent.harness.id bash|null    the agent harness (default bash)
  --env.agent.runtime.type docker|subprocess   --env.agent.runtime.cpu 2 --env.agent.runtime.memory 4
  --env.agent.scoring.mode shared|isolated      --env.agent.scoring.runtime.image <image>
  --env.id best-of-n --env.n 4        best-of-n (adds best / pass_at_n metrics)
  --env.agent.runtime.warm_pool 4     keep started agent sandboxes ready (grading stays fresh)
  --limits.max_sandboxes 32  --limits.sandbox_create_rate 8  --limits.max_model_connections 64
  -R, --resume <run dir>              re-run only the missing or failed rollouts
Writes outputs/evals/<taskset>--<model>/<run_id>/{traces.jsonl,metadata.json,config.json}.
Tasksets: ${Object.keys(TASKSETS).join(", ")}, or a path to a module exporting loadTaskset().
`;

const VALIDATE_HELP = `vf validate <taskset> [-n N] [--runtime.type docker|subprocess]

Per task, in fresh sandboxes: the gold answer (Task.validate) must score 1.0 and an
untouched workspace 0.0. Prints a table and a JSON summary; exits 1 when any task fails.
`;

function validateRuntimeTable(raw: Record<string, unknown>) {
  const r = RuntimeTable.safeParse(raw);
  if (!r.success) {
    const issue = r.error.issues[0];
    throw new ConfigError(`command line: runtime.${issue.path.join(".")}: ${issue.message}`);
  }
  return r.data;
}

const ALIASES: Record<string, string> = {
  n: "num_examples",
  r: "rollouts_per_example",
  c: "max_concurrent",
  m: "model",
  b: "base_url",
  "api-base-url": "base_url",
  k: "api_key_var",
  a: "sampling_args",
  S: "sampling_args",
  t: "max_tokens",
  T: "temperature",
  s: "save_results",
  o: "output_dir",
  R: "resume",
  i: "independent_scoring",
  C: "state_columns",
  e: "endpoints_path",
  x: "extra_env_kwargs",
  v: "verbose",
  q: "quiet",
  seed: "shuffle_seed",
  save: "save",
};
const JSON_KEYS = new Set(["sampling_args", "env_args", "extra_env_kwargs"]);
const STRING_KEYS = new Set([
  "model",
  "base_url",
  "api_key_var",
  "output_dir",
  "endpoints_path",
  "env_id",
  "server",
]);

/** Turn parsed flags into config keys (snake_case, dotted keys nested). */
function flagsToConfig(flags: Record<string, unknown>): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  const headers: Record<string, string> = {};
  for (const [rawKey, rawValue] of Object.entries(flags)) {
    if (rawKey === "_" || rawKey === "--" || rawKey === "help" || rawKey === "h") continue;
    const key = ALIASES[rawKey] ?? rawKey.replaceAll("-", "_");
    let value = rawValue;
    if (key === "header") {
      for (const h of [rawValue].flat()) {
        const at = String(h).indexOf(":");
        if (at < 1) throw new ConfigError(`--header "${h}" must look like "Name: value"`);
        headers[String(h).slice(0, at).trim()] = String(h).slice(at + 1).trim();
      }
      continue;
    }
    if (Array.isArray(value) && key !== "state_columns") value = value[value.length - 1];
    if (JSON_KEYS.has(key) && typeof value === "string") {
      try {
        value = JSON.parse(value);
      } catch {
        const flag = `${rawKey.length === 1 ? "-" : "--"}${rawKey}`;
        throw new ConfigError(`${flag}: ${JSON.stringify(value)} is not valid JSON`);
      }
    }
    if (STRING_KEYS.has(key) && value !== undefined) value = String(value);
    if (key === "state_columns") {
      value = [value].flat().flatMap((v) => String(v).split(",")).filter(Boolean);
    }
    if (key === "resume" && value === "") value = true;
    if (key === "sandbox" && typeof value === "boolean") {
      setDotted(out, "sandbox.enabled", value);
      continue;
    }
    if (["allow_net", "allow_read", "allow_env", "allow_import"].includes(key)) {
      setDotted(
        out,
        `sandbox.${key}`,
        [value].flat().flatMap((v) => String(v).split(",")).filter(Boolean),
      );
      continue;
    }
    if (key.includes(".")) setDotted(out, key, coerce(value));
    else out[key] = value;
  }
  if (Object.keys(headers).length) out.headers = headers;
  return out;
}

function coerce(value: unknown): unknown {
  if (typeof value !== "string") return value;
  if (value === "true") return true;
  if (value === "false") return false;
  if (/^-?\d+(\.\d+)?$/.test(value)) return Number(value);
  if (/^[[{]/.test(value)) {
    try {
      return JSON.parse(value);
    } catch { /* keep the string */ }
  }
  return value;
}

function parseArgs(argv: string[]) {
  return yargsParser(argv, {
    configuration: {
      "camel-case-expansion": false,
      "dot-notation": false,
      "boolean-negation": true,
      "parse-positional-numbers": false,
    },
    boolean: [
      "sandbox",
      "trust",
      "reload",
      "s",
      "save-results",
      "i",
      "independent-scoring",
      "v",
      "verbose",
      "q",
      "quiet",
      "help",
      "h",
      "version",
      "save",
    ],
    string: [
      "allow-net",
      "allow-read",
      "allow-env",
      "allow-import",
      "lock-file",
      "m",
      "model",
      "b",
      "base-url",
      "k",
      "api-key-var",
      "a",
      "S",
      "sampling-args",
      "env-args",
      "x",
      "extra-env-kwargs",
      "o",
      "output-dir",
      "e",
      "endpoints-path",
      "header",
      "C",
      "state-columns",
      "R",
      "resume",
      "server",
    ],
    number: [
      "n",
      "num-examples",
      "r",
      "rollouts-per-example",
      "c",
      "max-concurrent",
      "t",
      "max-tokens",
      "T",
      "temperature",
      "max-retries",
      "timeout",
      "seed",
    ],
  });
}

function env(name: string): string | undefined {
  return process.env[name];
}

function isUrlSpec(spec: string): boolean {
  return /^https?:\/\//.test(spec);
}

/**
 * URL environments always run in a separate host process pinned by the lock file: under the
 * permission sandbox, or with every permission when --trust is given. Local ones run
 * in-process unless --sandbox is given.
 */
function wantsSandbox(spec: string, config: EvalConfig): boolean {
  return isUrlSpec(spec) || config.sandbox?.enabled === true;
}

function sandboxPermissions(config: EvalConfig): SandboxPermissions {
  return {
    allowNet: config.sandbox?.allow_net,
    allowRead: config.sandbox?.allow_read,
    allowEnv: config.sandbox?.allow_env,
    allowImport: config.sandbox?.allow_import,
  };
}

function lockFileFor(config: EvalConfig, source: string): string {
  if (config.lock_file) return resolve(config.lock_file);
  return source.endsWith(".toml") ? join(dirname(resolve(source)), "vf.lock") : resolve("vf.lock");
}

/** Load a taskset: in a host process for URLs (or --sandbox), in-process otherwise. */
async function loadTasksetFor(
  spec: string,
  tasksetConfig: Record<string, unknown>,
  config: EvalConfig,
  source: string,
) {
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

/**
 * Turn SIGINT/SIGTERM into an abort of the run (finished results stay on disk); a second
 * signal exits at once. Disposing removes the handlers.
 */
function onInterrupt(): Disposable & { signal: AbortSignal; readonly interrupted: boolean } {
  const controller = new AbortController();
  let interrupted = false;
  const onSignal = (sig: string) => {
    if (interrupted) process.exit(130);
    interrupted = true;
    process.stderr.write(`\n${sig}: stopping; finished rollouts are saved\n`);
    controller.abort(new VfError(`Interrupted by ${sig}`));
  };
  process.on("SIGINT", onSignal);
  process.on("SIGTERM", onSignal);
  return {
    signal: controller.signal,
    get interrupted() {
      return interrupted;
    },
    [Symbol.dispose]() {
      process.off("SIGINT", onSignal);
      process.off("SIGTERM", onSignal);
    },
  };
}

/** Resolve the model endpoint: registry aliases, flags, `[client]`, defaults. */
async function resolveClient(config: EvalConfig) {
  let model = config.model ?? "gpt-4.1-mini";
  let baseUrl = config.base_url ?? config.api_base_url ?? config.client?.base_url;
  let keyVar = config.api_key_var ?? config.client?.api_key_var;
  const headers = { ...(config.client?.headers ?? {}), ...(config.headers ?? {}) };
  const clientOpts = {
    timeout: config.client?.timeout,
    max_retries: config.client?.max_retries,
    transport: config.client?.transport,
    extra_headers: headers,
  };
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
            extra_headers: { ...(r.headers ?? {}), ...headers },
          })
        ));
      }
      baseUrl ??= replicas[0].url;
      keyVar ??= replicas[0].key;
      Object.assign(headers, { ...(replicas[0].headers ?? {}), ...headers });
    }
  }
  baseUrl ??= env("OPENAI_BASE_URL") ?? "https://api.openai.com/v1";
  keyVar ??= "OPENAI_API_KEY";
  client ??= new OpenAIChatClient({ base_url: baseUrl, api_key_var: keyVar, ...clientOpts });
  return { client, model, baseUrl, keyVar };
}

/** `vf eval --server`: the environment lives in a `vf serve` process, loaded with its own args. */
async function connectEnvServer(config: EvalConfig, envSpec: string, client: ChatClient) {
  const misplaced = [
    ["--env-args", config.env_args],
    ["-x/--extra-env-kwargs", config.extra_env_kwargs],
    ["--timeout", config.timeout],
    ["--sandbox", config.sandbox?.enabled || undefined],
  ].filter(([, v]) => v !== undefined).map(([k]) => k);
  if (misplaced.length) {
    throw new ConfigError(
      `${misplaced.join(", ")} apply where the environment is loaded; pass them to vf serve`,
    );
  }
  forwardableConfig(client); // fails now, not in the first rollout, when it cannot be forwarded
  const served = await ServerEnvironment.connect(config.server!, { token: env("VF_SERVER_TOKEN") });
  const norm = (s: string) =>
    s.replace(/\/mod\.ts$/, "").replace(/\/+$/, "").split("/").pop()!.replace(/\.(ts|js)$/, "")
      .replaceAll("_", "-");
  if (envSpec !== config.server && served.envId && norm(envSpec) !== norm(served.envId)) {
    throw new ConfigError(
      `The env server at "${config.server}" serves "${served.envId}", not "${envSpec}"`,
    );
  }
  return served;
}

/** Resolve everything `vf eval` needs from the merged config. */
async function resolveEval(config: EvalConfig, source: string) {
  const envSpec = config.env_id ?? (config.env?.id as string | undefined) ?? config.server;
  if (!envSpec) {
    throw new ConfigError(
      `${source}: no environment given; pass one (vf eval gsm8k) or set env_id`,
    );
  }
  const { client, model, baseUrl, keyVar } = await resolveClient(config);
  let environmentTyped: Environment;
  let defaults: { num_examples?: number; rollouts_per_example?: number } = {};
  let id: string;
  if (config.server) {
    const served = await connectEnvServer(config, envSpec, client);
    environmentTyped = served as unknown as Environment;
    defaults = served.evalDefaults ?? {};
    id = served.envId;
  } else if (wantsSandbox(envSpec, config)) {
    const { host, info } = await startSandboxHost({
      spec: envSpec,
      kind: "environment",
      args: config.env_args ?? {},
      permissions: sandboxPermissions(config),
      lockFile: lockFileFor(config, source),
      reload: config.reload,
      trusted: config.trust === true,
    });
    const remote = new RemoteEnvironment(host, info);
    environmentTyped = remote as unknown as Environment;
    defaults = remote.evalDefaults ?? {};
    id = remote.envId;
  } else {
    const loaded = await loadEnvironment(envSpec, config.env_args ?? {}, BUILTINS);
    environmentTyped = loaded.env as Environment;
    defaults = loaded.module.evalDefaults ?? {};
    id = loaded.id;
  }
  try {
    // Build the (cached) eval dataset now, so a bad dataset fails before the run starts and
    // the error names the environment.
    await environmentTyped.getEvalDataset();
  } catch (error) {
    const reason = error instanceof ConfigError ? error.message : describeError(error);
    throw new ConfigError(`Environment "${envSpec}": ${reason}`, { cause: error });
  }
  if (config.extra_env_kwargs) environmentTyped.setKwargs(config.extra_env_kwargs);
  if (config.timeout) environmentTyped.setKwargs({ timeout_seconds: config.timeout });
  const sampling: Record<string, unknown> = { ...(config.sampling_args ?? {}) };
  if (config.max_tokens !== undefined && sampling.max_tokens === undefined) {
    sampling.max_tokens = config.max_tokens;
  }
  if (config.temperature !== undefined && sampling.temperature === undefined) {
    sampling.temperature = config.temperature;
  }
  return {
    env: environmentTyped,
    envId: environmentTyped.envId || id,
    client,
    model,
    baseUrl,
    keyVar,
    numExamples: config.num_examples ?? defaults.num_examples ?? 5,
    rollouts: config.rollouts_per_example ?? defaults.rollouts_per_example ?? 3,
    maxConcurrent: config.max_concurrent ?? 32,
    sampling,
  };
}

async function findResumable(base: string, envId: string, model: string, r: number, n: number) {
  let entries: string[];
  try {
    entries = await readdir(base);
  } catch {
    return null;
  }
  const candidates: Array<{ dir: string; mtime: number }> = [];
  for (const name of entries) {
    const dir = join(base, name);
    try {
      const meta = await loadMetadata(dir);
      const rows = (await loadOutputs(dir)).length;
      if (meta.env_id !== envId || meta.model !== model || meta.rollouts_per_example !== r) {
        continue;
      }
      if (meta.num_examples > n || rows >= n * r) continue;
      candidates.push({ dir, mtime: (await stat(join(dir, "metadata.json"))).mtimeMs });
    } catch { /* not a run directory */ }
  }
  candidates.sort((a, b) => b.mtime - a.mtime);
  return candidates[0]?.dir ?? null;
}

async function cmdEval(argv: string[]): Promise<number> {
  const flags = parseArgs(argv);
  if (flags.help || flags.h) {
    process.stdout.write(EVAL_HELP);
    return 0;
  }
  const positional = flags._.map(String);
  let fileConfig: Record<string, unknown> = {};
  let source = "command line";
  if (positional[0] === "@" || positional[0]?.startsWith("@")) {
    const path = positional[0] === "@" ? positional[1] : positional[0].slice(1);
    if (!path) throw new ConfigError("vf eval @ needs a config file: vf eval @ config.toml");
    fileConfig = await readToml(path);
    source = path;
    positional.splice(0, positional[0] === "@" ? 2 : 1);
  }
  const cliConfig = flagsToConfig(flags as Record<string, unknown>);
  if (positional[0]) cliConfig.env_id = positional[0];
  if (positional.length > 1) {
    throw new ConfigError(`Unexpected arguments: ${positional.slice(1).join(" ")}`);
  }
  const merged = deepMerge(fileConfig, cliConfig);
  const config = validateEvalConfig(merged, source);
  if (config.env && "taskset" in config.env) return await runTasks(config, merged, source);
  const run = await resolveEval(config, source);

  const save = config.save !== false;
  const base = resolve(
    config.output_dir ?? "outputs",
    "evals",
    `${run.envId}--${run.model.replaceAll("/", "--")}`,
  );
  let runDir: string | null = null;
  let resume = false;
  if (config.resume) {
    resume = true;
    if (typeof config.resume === "string") {
      runDir = resolve(config.resume);
      await loadMetadata(runDir); // validates that it is a run directory
    } else {
      runDir = await findResumable(base, run.envId, run.model, run.rollouts, run.numExamples);
      if (!runDir) process.stderr.write("No unfinished matching run found; starting a new one\n");
    }
  }
  if (save && !runDir) runDir = join(base, crypto.randomUUID().slice(0, 8));
  if (!save && !resume) runDir = null;

  const quiet = config.quiet ?? false;
  const out = {
    write: (t: string) => process.stderr.write(t),
    isTTY: Boolean(process.stderr.isTTY),
  };
  const display = quiet ? null : new ProgressDisplay(out, run.envId);
  using interrupt = onInterrupt();

  if (runDir) {
    const resolved = {
      format_version: 1,
      ...merged,
      env_id: run.envId,
      model: run.model,
      base_url: run.baseUrl,
      api_key_var: run.keyVar,
      num_examples: run.numExamples,
      rollouts_per_example: run.rollouts,
      max_concurrent: run.maxConcurrent,
      sampling_args: run.sampling,
    };
    await writeJsonAtomic(join(runDir, "config.json"), resolved);
    process.stderr.write(`Saving results to ${runDir}\n`);
  }
  try {
    const result = await evaluate(run.env, run.client, run.model, {
      numExamples: run.numExamples,
      rolloutsPerExample: run.rollouts,
      maxConcurrent: run.maxConcurrent,
      samplingArgs: run.sampling,
      independentScoring: config.independent_scoring,
      maxRetries: config.max_retries,
      stateColumns: config.state_columns,
      shuffleSeed: config.shuffle_seed ?? null,
      resultsDir: runDir,
      resume,
      signal: interrupt.signal,
      onProgress: display ? (p) => display.update(p) : undefined,
      metadataExtra: runDir ? { run_dir: runDir } : {},
    });
    display?.finish();
    process.stdout.write(renderSummary(result.metadata, result.outputs) + "\n");
    if (runDir) process.stdout.write(`results: ${join(runDir, "results.jsonl")}\n`);
    return 0;
  } catch (error) {
    display?.finish();
    if (interrupt.interrupted) {
      const saved = runDir ? (await loadOutputs(runDir)).length : 0;
      process.stderr.write(
        runDir
          ? `Interrupted: ${saved} rollouts saved in ${runDir}; finish with: vf eval ... --resume ${runDir}\n`
          : "Interrupted\n",
      );
      return 130;
    }
    if (runDir) {
      const saved = (await loadOutputs(runDir).catch(() => [])).length;
      if (saved) process.stderr.write(`${saved} finished rollouts are saved in ${runDir}\n`);
    }
    throw error;
  } finally {
    await run.env.teardown().catch(() => {});
  }
}

function parseDuration(text: string): number {
  const m = /^(\d+(?:\.\d+)?)(s|m|h|d)?$/.exec(text.trim());
  if (!m) throw new ConfigError(`--older-than "${text}" must look like 30s, 10m, 2h or 1d`);
  const unit = { s: 1e3, m: 60e3, h: 3600e3, d: 86400e3 }[(m[2] ?? "s") as "s" | "m" | "h" | "d"];
  return Number(m[1]) * unit;
}

/** Run a taskset (the `[env.taskset]` form of `vf eval`, and `vf run`). */
async function runTasks(
  config: EvalConfig,
  merged: Record<string, unknown>,
  source: string,
): Promise<number> {
  const envSection = validateTaskEnv(config.env, source);
  const { client, model, baseUrl, keyVar } = await resolveClient(config);
  const { id: tasksetId, task: taskConfig, ...tasksetKnobs } = envSection.taskset;
  const taskset = await loadTasksetFor(
    tasksetId,
    { ...tasksetKnobs, id: tasksetId, task: taskConfig ?? {} },
    config,
    source,
  );
  const agent = envSection.agent ?? {};
  const harnessConfig = agent.harness ?? { id: "bash" };
  const policy: AgentPolicy = {
    runtime: agent.runtime ?? {},
    harness: getHarness(harnessConfig.id ?? "bash", harnessConfig),
    scoring: agent.scoring,
    maxTurns: harnessConfig.max_turns ?? agent.max_turns,
    toolTimeoutSeconds: harnessConfig.tool_timeout,
  };
  const bestOfN = envSection.id === "best-of-n";
  // Resuming: sizes not given again default to those the run was started with.
  const saved = typeof config.resume === "string"
    ? await readFile(join(resolve(config.resume), "config.json"), "utf8")
      .then((t) => JSON.parse(t) as Record<string, unknown>)
      .catch(() => ({} as Record<string, unknown>))
    : {};
  const savedNum = typeof saved.num_examples === "number" ? saved.num_examples : undefined;
  const savedRollouts = typeof saved.rollouts_per_example === "number"
    ? saved.rollouts_per_example
    : undefined;
  const rollouts = bestOfN
    ? envSection.n ?? config.rollouts_per_example ?? savedRollouts ?? 4
    : config.rollouts_per_example ?? savedRollouts ?? 1;
  const numTasks = config.num_examples ?? savedNum ?? -1;
  const runId = crypto.randomUUID().slice(0, 8);
  const save = config.save !== false;
  const base = resolve(
    config.output_dir ?? "outputs",
    "evals",
    `${taskset.id}--${model.replaceAll("/", "--")}`,
  );
  let runDir: string | null = save ? join(base, runId) : null;
  let resume = false;
  if (typeof config.resume === "string") {
    runDir = resolve(config.resume);
    resume = true;
  } else if (config.resume === true) {
    throw new ConfigError("Resuming a taskset run needs the run directory: --resume <dir>");
  }
  if (runDir) {
    const resolved = {
      format_version: 1,
      ...merged,
      model,
      client: { ...(config.client ?? {}), base_url: baseUrl, api_key_var: keyVar },
      num_examples: numTasks,
      rollouts_per_example: rollouts,
      env: envSection, // scoring.env templates are kept as written, never resolved here
    };
    delete (resolved as Record<string, unknown>).base_url;
    delete (resolved as Record<string, unknown>).api_key_var;
    await writeJsonAtomic(join(runDir, "config.json"), resolved);
    process.stderr.write(`Saving traces to ${runDir}\n`);
  }
  // Sandboxes come through the limits and the warm pool; model calls through their own limit.
  const sandboxLimits = sandboxLimitsFromConfig(config.limits);
  const warmPool = agent.runtime?.warm_pool ?? 0;
  const sandboxes = sandboxLimits || warmPool > 0
    ? new WarmPool({
      size: warmPool,
      runId: runDir ? runDir.split("/").pop()! : runId,
      limits: sandboxLimits,
    })
    : undefined;
  policy.sandboxes = sandboxes;
  const maxModel = config.limits?.max_model_connections;
  const modelClient = maxModel ? limitModelConnections(client, maxModel) : client;
  const quiet = config.quiet ?? false;
  const started = Date.now();
  using interrupt = onInterrupt();
  try {
    const { summary } = await runTaskset({
      taskset,
      policy,
      client: modelClient,
      model,
      samplingArgs: config.sampling_args,
      numTasks,
      rolloutsPerTask: rollouts,
      maxConcurrent: config.max_concurrent ?? 4,
      shuffleSeed: config.shuffle_seed ?? null,
      runDir,
      runId: runDir ? runDir.split("/").pop()! : runId,
      resume,
      envId: envSection.id,
      bestOfNThreshold: envSection.threshold,
      judges: envSection.judges,
      signal: interrupt.signal,
      onTrace: quiet ? undefined : (t, done, total) => {
        const rate = done / Math.max(0.001, (Date.now() - started) / 1000);
        process.stderr.write(
          `${taskset.id} ${done}/${total} ${rate.toFixed(2)}/s task ${t.task.key} reward ${
            t.reward === null ? "error" : t.reward.toFixed(3)
          }${
            t.error ? ` (${t.error.phase}: ${t.error.error}: ${t.error.message.slice(0, 120)})` : ""
          }\n`,
        );
      },
    });
    const lines = [
      `taskset ${summary.taskset}  model ${summary.model}  tasks ${summary.num_tasks}  rollouts/task ${summary.rollouts_per_task}  rollouts ${summary.num_rollouts}`,
      `reward ${
        summary.avg_reward.toFixed(4)
      }  errors ${summary.num_errors} of ${summary.num_rollouts}`,
      ...Object.entries(summary.avg_rewards).map(([k, v]) => `  reward ${k}: ${v.toFixed(4)}`),
      ...Object.entries(summary.avg_metrics).map(([k, v]) => `  metric ${k}: ${v.toFixed(4)}`),
      ...Object.entries(summary.pass_at_k).map(([k, v]) => `  pass@${k}: ${v.toFixed(3)}`),
      `tokens: input ${summary.usage.input_tokens}, output ${summary.usage.output_tokens}`,
    ];
    process.stdout.write(lines.join("\n") + "\n");
    if (runDir) process.stdout.write(`traces: ${join(runDir, "traces.jsonl")}\n`);
    return 0;
  } catch (error) {
    if (interrupt.interrupted) {
      process.stderr.write(
        runDir
          ? `Interrupted; finish with: vf eval @ <config> --resume ${runDir}\n`
          : "Interrupted\n",
      );
      return 130;
    }
    throw error;
  } finally {
    await sandboxes?.close();
  }
}

async function cmdRun(argv: string[]): Promise<number> {
  const flags = parseArgs(argv);
  if (flags.help || flags.h) {
    process.stdout.write(RUN_HELP);
    return 0;
  }
  const positional = flags._.map(String);
  if (!positional[0]) throw new ConfigError("vf run needs a taskset: vf run file-sum -n 1 -r 1");
  const cliConfig = flagsToConfig(flags as Record<string, unknown>);
  const merged = deepMerge({ env: { taskset: { id: positional[0] } } }, cliConfig);
  const config = validateEvalConfig(merged, "command line");
  return await runTasks(config, merged, "command line");
}

async function cmdValidate(argv: string[]): Promise<number> {
  const flags = parseArgs(argv);
  if (flags.help || flags.h) {
    process.stdout.write(VALIDATE_HELP);
    return 0;
  }
  const positional = flags._.map(String);
  if (!positional[0]) throw new ConfigError("vf validate needs a taskset: vf validate file-sum");
  const raw = flagsToConfig(flags as Record<string, unknown>);
  const runtime = validateRuntimeTable((raw.runtime ?? {}) as Record<string, unknown>);
  const evalConfig = validateEvalConfig(
    Object.fromEntries(
      Object.entries(raw).filter(([k]) => ["sandbox", "trust", "reload", "lock_file"].includes(k)),
    ),
    "command line",
  );
  const taskset = await loadTasksetFor(
    positional[0],
    { id: positional[0] },
    evalConfig,
    "command line",
  );
  const runId = `validate-${crypto.randomUUID().slice(0, 8)}`;
  const results = await validateTaskset(taskset, {
    numTasks: typeof raw.num_examples === "number" ? raw.num_examples : -1,
    runtime,
    runId,
    maxConcurrent: typeof raw.max_concurrent === "number" ? raw.max_concurrent : 4,
  });
  const rows = [
    ["task", "gold", "untouched", "result"],
    ...results.map((r) => [
      r.task,
      r.gold_reward === null ? "-" : r.gold_reward.toFixed(2),
      r.empty_reward === null ? "-" : r.empty_reward.toFixed(2),
      r.ok ? "ok" : `FAIL ${r.error ?? ""}`,
    ]),
  ];
  const widths = rows[0].map((_, c) => Math.max(...rows.map((r) => r[c].length)));
  process.stdout.write(
    rows.map((r) => r.map((c, i) => c.padEnd(widths[i])).join("  ").trimEnd()).join("\n") + "\n",
  );
  const failed = results.filter((r) => !r.ok).length;
  process.stdout.write(
    JSON.stringify({
      taskset: taskset.id,
      runtime: runtime.type ?? "docker",
      tasks: results.length,
      passed: results.length - failed,
      failed,
      results,
    }) + "\n",
  );
  return failed ? 1 : 0;
}

const INIT_HELP = `vf init <name> [--kind taskset|environment] [--vf <url or path>]

Creates the folder <name>/ with mod.ts, mod_test.ts, deno.json and README.md: a working
minimal taskset (default; try: vf validate ./<name>) or, with --kind environment, a
single-turn environment (try: vf eval ./<name>). Refuses a folder that is not empty.
  --vf <url or path>   where the package imports vf's mod.ts from (default: this vf)
`;

async function cmdInit(argv: string[]): Promise<number> {
  const flags = yargsParser(argv, { string: ["kind", "vf"], boolean: ["help", "h"] });
  if (flags.help || flags.h) {
    process.stdout.write(INIT_HELP);
    return 0;
  }
  const positional = flags._.map(String);
  if (positional.length !== 1) {
    throw new ConfigError(
      "vf init needs one package name: vf init my_taskset [--kind taskset|environment]",
    );
  }
  const kind = String(flags.kind ?? "taskset");
  if (!(PACKAGE_KINDS as readonly string[]).includes(kind)) {
    throw new ConfigError(`--kind "${kind}" is not one of: ${PACKAGE_KINDS.join(", ")}`);
  }
  const result = await initPackage(positional[0], { kind: kind as PackageKind, vf: flags.vf });
  // A bare name would be read as a built-in id, so point at the folder explicitly.
  const path = /^[./]/.test(positional[0]) ? positional[0] : `./${positional[0]}`;
  const next = kind === "taskset"
    ? `vf validate ${path}`
    : `vf eval ${path} -m <model> -b <base url>`;
  process.stdout.write(
    `Created ${kind} package "${result.name}" in ${result.dir}: ${result.files.join(", ")}\n` +
      `vf is imported from ${result.vfSpecifier}\n` +
      `Next: (cd ${path} && deno test -A) and ${next}\n`,
  );
  return 0;
}

async function cmdCleanup(argv: string[]): Promise<number> {
  const flags = parseArgs(argv);
  if (flags.help || flags.h) {
    process.stdout.write(
      "vf cleanup [--run ID] [--older-than 30m]\n\nRemove sandboxes vf left behind: Docker containers labelled vf.managed=1 on\n" +
        "DOCKER_HOST, and every sandbox the local ledger (VF_LEDGER, default ~/.cache/vf/ledger.jsonl)\n" +
        "still lists as live, on every runtime type and host it was created on.\n",
    );
    return 0;
  }
  const runId = flags.run === undefined ? undefined : String(flags.run);
  const older = flags["older-than"] === undefined
    ? undefined
    : parseDuration(String(flags["older-than"]));
  let removed: string[] = [];
  let dockerError: unknown;
  try {
    removed = await cleanupContainers({ runId, olderThanMs: older });
  } catch (error) {
    // No engine on DOCKER_HOST: the ledger may still reach sandboxes on other hosts and runtimes.
    if (!(error instanceof SandboxUnavailableError)) throw error;
    dockerError = error;
  }
  const ledger = await cleanupLedger({ runId, olderThanMs: older });
  process.stdout.write(`removed ${removed.length} container${removed.length === 1 ? "" : "s"}\n`);
  for (const id of removed) process.stdout.write(`  ${id.slice(0, 12)}\n`);
  if (ledger.removed.length) {
    process.stdout.write(
      `removed ${ledger.removed.length} more sandbox${
        ledger.removed.length === 1 ? "" : "es"
      } listed in the ledger\n`,
    );
    for (const key of ledger.removed) process.stdout.write(`  ${key}\n`);
  }
  await defaultLedger()?.compact().catch(() => {});
  if (dockerError) process.stderr.write(`warning: docker: ${describeError(dockerError)}\n`);
  for (const f of ledger.failed) {
    process.stderr.write(`warning: ${f.type} sandbox "${f.key}" remains: ${f.error}\n`);
  }
  return ledger.failed.length ? 1 : 0;
}

async function cmdDemo(argv: string[]): Promise<number> {
  const flags = parseArgs(argv);
  if (flags.help || flags.h) {
    process.stdout.write(
      `vf demo [env] [-n N] [-r R]\n\nStarts vf's scripted demo model on 127.0.0.1 (a deterministic stand-in that\n` +
        `answers from the bundled answer key about 75% of the time, not a language model) and\n` +
        `evaluates a built-in environment (default gsm8k) against it end to end.\n`,
    );
    return 0;
  }
  const envId = String(flags._[0] ?? "gsm8k");
  const answers = new Map<string, string>();
  for (const row of loadExampleDataset("gsm8k-sample", { split: "test" })) {
    answers.set(String(row.question), String(row.answer));
  }
  await using server = await startModelServer({ responder: demoResponder({ answers }) });
  process.stderr.write(`Demo model (scripted, not an LLM) listening at ${server.url}\n`);
  const rest = argv.filter((a, i) => !(i === 0 && a === flags._[0]));
  return await cmdEval([envId, "-m", "vf-demo", "-b", server.url, "-k", "VF_DEMO_KEY", ...rest]);
}

const SERVE_HELP = `vf serve <env> [options]

Serves one environment over HTTP so trainers and evaluators elsewhere can run rollouts with
it: GET /health, GET /info, POST /dataset, POST /rollouts (NDJSON stream), POST /cancel.
Evaluate through it with: vf eval <env> --server http://HOST:PORT -m <model> -b <url> -k <VAR>
  --port <p>                  port (default 8123; 0 picks a free one)
  --host <addr>               interface (default 127.0.0.1)
  -c, --max-concurrent <n>    groups running at once across all requests (default 32)
  --env-args <json>           arguments for loadEnvironment()
  -x, --extra-env-kwargs <json>  settings applied to the loaded env
  --timeout <seconds>         wall-clock limit per rollout
  --allow-key-var <NAME>      a variable requests may name as client.api_key_var to use this
                              server's key (repeatable; by default none is ever read)
Requests carry the model endpoint and its API key: keep the server on loopback, or behind
TLS on a trusted network. When VF_SERVER_TOKEN is set, requests must send it as a bearer
token (vf eval --server sends $VF_SERVER_TOKEN). Runs until SIGINT or SIGTERM.
`;

async function cmdServe(argv: string[]): Promise<number> {
  const flags = yargsParser(argv, {
    configuration: { "camel-case-expansion": false, "parse-positional-numbers": false },
    boolean: ["help", "h"],
    string: ["host", "env-args", "x", "extra-env-kwargs", "allow-key-var"],
    number: ["port", "c", "max-concurrent", "timeout"],
  });
  if (flags.help || flags.h) {
    process.stdout.write(SERVE_HELP);
    return 0;
  }
  const positional = flags._.map(String);
  if (positional.length !== 1) {
    throw new ConfigError("vf serve needs one environment: vf serve gsm8k --port 8123");
  }
  const config = flagsToConfig(flags as Record<string, unknown>);
  const last = (v: unknown) => (Array.isArray(v) ? v[v.length - 1] : v);
  const port = Number(last(flags.port) ?? 8123);
  const maxConcurrent = Number(last(flags.c ?? flags["max-concurrent"]) ?? 32);
  if (!Number.isInteger(port) || port < 0 || port > 65535) {
    throw new ConfigError(`--port ${port} is not a port number`);
  }
  if (!Number.isInteger(maxConcurrent) || maxConcurrent < 1) {
    throw new ConfigError(`-c/--max-concurrent must be an integer ≥ 1, got ${maxConcurrent}`);
  }
  const hostname = String(last(flags.host) ?? "127.0.0.1");
  const loaded = await loadEnvironment(
    positional[0],
    (config.env_args ?? {}) as Record<string, unknown>,
    BUILTINS,
  );
  const environment = loaded.env as Environment;
  try {
    await environment.getEvalDataset();
  } catch (error) {
    const reason = error instanceof ConfigError ? error.message : describeError(error);
    throw new ConfigError(`Environment "${positional[0]}": ${reason}`, { cause: error });
  }
  if (config.extra_env_kwargs) {
    environment.setKwargs(config.extra_env_kwargs as Record<string, unknown>);
  }
  if (flags.timeout !== undefined) {
    environment.setKwargs({ timeout_seconds: Number(last(flags.timeout)) });
  }
  const token = env("VF_SERVER_TOKEN") || undefined;
  const server = await startEnvServer(environment, {
    port,
    hostname,
    maxConcurrent,
    envId: environment.envId || loaded.id,
    evalDefaults: loaded.module.evalDefaults ?? null,
    token,
    allowKeyVars: [flags["allow-key-var"] ?? []].flat().map(String),
  });
  const loopback = ["127.0.0.1", "localhost", "::1"].includes(hostname);
  if (!loopback && !token) {
    process.stderr.write(
      `warning: serving on ${hostname} without VF_SERVER_TOKEN: anyone who reaches the port can run rollouts, ` +
        `and model keys travel in request bodies; use a trusted network and TLS\n`,
    );
  }
  process.stdout.write(
    `vf serve: environment "${
      environment.envId || loaded.id
    }" at ${server.url} (${maxConcurrent} groups at once)\n`,
  );
  const stop = Promise.withResolvers<string>();
  const onSignal = (sig: string) => stop.resolve(sig);
  process.on("SIGINT", onSignal);
  process.on("SIGTERM", onSignal);
  try {
    const sig = await stop.promise;
    process.stderr.write(`${sig}: stopping the env server\n`);
  } finally {
    process.off("SIGINT", onSignal);
    process.off("SIGTERM", onSignal);
    await server.close();
    await environment.teardown().catch(() => {});
  }
  return 0;
}

/** Run the CLI; returns the exit code. */
export async function main(argv: string[]): Promise<number> {
  const [command, ...rest] = argv;
  try {
    switch (command) {
      case undefined:
      case "-h":
      case "--help":
      case "help":
        process.stdout.write(HELP);
        return 0;
      case "-V":
      case "--version":
      case "version":
        process.stdout.write(`vf ${VERSION}\n`);
        return 0;
      case "eval":
        return await cmdEval(rest);
      case "demo":
        return await cmdDemo(rest);
      case "run":
        return await cmdRun(rest);
      case "validate":
        return await cmdValidate(rest);
      case "cleanup":
        return await cmdCleanup(rest);
      case "init":
        return await cmdInit(rest);
      case "serve":
        return await cmdServe(rest);
      default:
        process.stderr.write(`error: unknown command "${command}"; run vf --help\n`);
        return 2;
    }
  } catch (error) {
    const verbose = argv.includes("-v") || argv.includes("--verbose");
    process.stderr.write(
      `error: ${error instanceof ConfigError ? error.message : describeError(error)}\n`,
    );
    if (verbose && error instanceof Error && error.stack) process.stderr.write(error.stack + "\n");
    return 1;
  }
}

if (import.meta.main) {
  // The CLI handles SIGINT/SIGTERM: it aborts the run, keeps finished results and stops
  // its sandboxes; the runtime registry still cleans up at exit.
  setAppHandlesSignals(true);
  const code = await main(process.argv.slice(2));
  await stopAllRuntimes({ timeoutMs: 15_000 });
  process.exit(code);
}
