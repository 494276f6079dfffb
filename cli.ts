#!/usr/bin/env -S deno run -A
/**
 * The `vf` command line: `vf eval`, `vf demo`, `vf --help`, `vf --version`.
 * @module
 */
import process from "node:process";
import { existsSync } from "node:fs";
import { readdir, stat } from "node:fs/promises";
import { join, resolve } from "node:path";
import yargsParser from "npm:yargs-parser@^22.0.0";
import { BUILTINS } from "./environments/mod.ts";
import { OpenAIChatClient, type ChatClient } from "./lib/client.ts";
import {
  deepMerge,
  type EvalConfig,
  readToml,
  setDotted,
  validateEvalConfig,
} from "./lib/config.ts";
import { loadEndpoints, RoundRobinClient } from "./lib/endpoints.ts";
import type { Environment } from "./lib/environment.ts";
import { ConfigError, describeError, VfError } from "./lib/errors.ts";
import { evaluate } from "./lib/evaluate.ts";
import { loadExampleDataset } from "./lib/example_datasets.ts";
import { loadEnvironment } from "./lib/load_env.ts";
import { demoResponder, startModelServer } from "./lib/local_model_server.ts";
import { ProgressDisplay, renderSummary } from "./lib/progress.ts";
import { loadMetadata, loadOutputs, writeJsonAtomic } from "./lib/results.ts";
import { VERSION } from "./lib/version.ts";

const HELP = `vf ${VERSION}: build, share and run LLM evaluation environments

Usage:
  vf eval <env> [options]        evaluate a model on an environment
  vf eval @ <config.toml> [opts] evaluate from a TOML config (flags override it)
  vf demo [env]                  evaluate a built-in environment against vf's scripted
                                 local demo model (no API key, no network)
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
const STRING_KEYS = new Set(["model", "base_url", "api_key_var", "output_dir", "endpoints_path", "env_id"]);

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
        throw new ConfigError(`--${rawKey}: ${JSON.stringify(value)} is not valid JSON`);
      }
    }
    if (STRING_KEYS.has(key) && value !== undefined) value = String(value);
    if (key === "state_columns") value = [value].flat().flatMap((v) => String(v).split(",")).filter(Boolean);
    if (key === "resume" && value === "") value = true;
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
    boolean: ["s", "save-results", "i", "independent-scoring", "v", "verbose", "q", "quiet", "help", "h", "version", "save"],
    string: ["m", "model", "b", "base-url", "k", "api-key-var", "a", "S", "sampling-args", "env-args", "x", "extra-env-kwargs", "o", "output-dir", "e", "endpoints-path", "header", "C", "state-columns", "R", "resume"],
    number: ["n", "num-examples", "r", "rollouts-per-example", "c", "max-concurrent", "t", "max-tokens", "T", "temperature", "max-retries", "timeout", "seed"],
  });
}

function env(name: string): string | undefined {
  return process.env[name];
}

/** Resolve everything `vf eval` needs from the merged config. */
async function resolveEval(config: EvalConfig, source: string) {
  const envSpec = config.env_id ?? (config.env?.id as string | undefined);
  if (!envSpec) {
    throw new ConfigError(`${source}: no environment given; pass one (vf eval gsm8k) or set env_id`);
  }
  let model = config.model ?? "gpt-4.1-mini";
  let baseUrl = config.base_url ?? config.api_base_url ?? config.client?.base_url;
  let keyVar = config.api_key_var ?? config.client?.api_key_var;
  const headers = { ...(config.client?.headers ?? {}), ...(config.headers ?? {}) };
  const clientOpts = {
    timeout: config.client?.timeout,
    max_retries: config.client?.max_retries,
    extra_headers: headers,
  };
  let client: ChatClient | null = null;
  const registryPath = config.endpoints_path ?? (existsSync("configs/endpoints.toml") ? "configs/endpoints.toml" : null);
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
  const { env: environment, module, id } = await loadEnvironment(envSpec, config.env_args ?? {}, BUILTINS);
  const environmentTyped = environment as Environment;
  if (config.extra_env_kwargs) environmentTyped.setKwargs(config.extra_env_kwargs);
  if (config.timeout) environmentTyped.setKwargs({ timeout_seconds: config.timeout });
  const defaults = module.evalDefaults ?? {};
  const sampling: Record<string, unknown> = { ...(config.sampling_args ?? {}) };
  if (config.max_tokens !== undefined && sampling.max_tokens === undefined) sampling.max_tokens = config.max_tokens;
  if (config.temperature !== undefined && sampling.temperature === undefined) sampling.temperature = config.temperature;
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
      if (meta.env_id !== envId || meta.model !== model || meta.rollouts_per_example !== r) continue;
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
  const run = await resolveEval(config, source);

  const save = config.save !== false;
  const base = resolve(config.output_dir ?? "outputs", "evals", `${run.envId}--${run.model.replaceAll("/", "--")}`);
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
  const out = { write: (t: string) => process.stderr.write(t), isTTY: Boolean(process.stderr.isTTY) };
  const display = quiet ? null : new ProgressDisplay(out, run.envId);
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
      signal: controller.signal,
      onProgress: display ? (p) => display.update(p) : undefined,
      metadataExtra: runDir ? { run_dir: runDir } : {},
    });
    display?.finish();
    process.stdout.write(renderSummary(result.metadata, result.outputs) + "\n");
    if (runDir) process.stdout.write(`results: ${join(runDir, "results.jsonl")}\n`);
    return 0;
  } catch (error) {
    display?.finish();
    if (interrupted) {
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
    process.off("SIGINT", onSignal);
    process.off("SIGTERM", onSignal);
    await run.env.teardown().catch(() => {});
  }
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
      default:
        process.stderr.write(`error: unknown command "${command}"; run vf --help\n`);
        return 2;
    }
  } catch (error) {
    const verbose = argv.includes("-v") || argv.includes("--verbose");
    process.stderr.write(`error: ${error instanceof ConfigError ? error.message : describeError(error)}\n`);
    if (verbose && error instanceof Error && error.stack) process.stderr.write(error.stack + "\n");
    return 1;
  }
}

if (import.meta.main) {
  const code = await main(process.argv.slice(2));
  process.exit(code);
}
