/**
 * Command-line arguments: yargs-parser settings shared by the commands, and flags turned
 * into config keys (aliases, JSON values, dotted keys).
 * @module
 */

import yargsParser from "npm:yargs-parser@^22.0.0";
import { EvalConfig, readToml, RuntimeTable, setDotted } from "../config.ts";
import { cliEnvSchema } from "../agents/load.ts";
import { ConfigError } from "../errors.ts";

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
export function flagsToConfig(flags: Record<string, unknown>): Record<string, unknown> {
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
    if (key === "cache" && typeof value === "boolean") {
      setDotted(out, "client.cache", value);
      continue;
    }
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
    if (key.includes(".")) setDotted(out, key, coerceFlag(key.split("."), value));
    else out[key] = coerceFlag([key], value);
  }
  if (Object.keys(headers).length) out.headers = headers;
  // -t/-T are sampling keys given on the command line: laid over a config file they must win
  // over the file's sampling_args, as every other flag does (within the command line,
  // sampling_args keeps the last word, as upstream's vf-eval gives it).
  for (const key of ["max_tokens", "temperature"]) {
    if (out[key] === undefined) continue;
    const sampling = out.sampling_args;
    if (sampling === undefined) out.sampling_args = { [key]: out[key] };
    else if (isTable(sampling) && sampling[key] === undefined) {
      out.sampling_args = { ...sampling, [key]: out[key] };
    }
  }
  return out;
}

function isTable(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

/**
 * What the CLI looks up a flag's type in: the eval config, with the `[env]` table of every
 * built-in Env (roles and options) and the `runtime` table.
 */
const CLI_SCHEMA = EvalConfig.extend({ env: cliEnvSchema(), runtime: RuntimeTable });

// deno-lint-ignore no-explicit-any
type Schema = any;

/** The zod schema at `path` of `schema`, or undefined where the config declares nothing. */
function schemaAt(schema: Schema, path: string[]): Schema | undefined {
  let node: Schema = schema;
  for (const key of path) {
    node = unwrap(node);
    const def = node?._zod?.def;
    // A loose table's other keys (`[env.taskset]`'s knobs) are its catchall's: anything.
    if (def?.type === "object") node = def.shape[key] ?? looseCatchall(def.catchall);
    else if (def?.type === "record") node = def.valueType;
    else if (def?.type === "unknown" || def?.type === "any") return node; // anything below, too
    else return undefined;
    if (node === undefined) return undefined;
  }
  return node;
}

function looseCatchall(catchall: Schema): Schema | undefined {
  const type = catchall?._zod?.def?.type;
  return type === "unknown" || type === "any" ? catchall : undefined;
}

function unwrap(schema: Schema): Schema {
  let node = schema;
  for (;;) {
    const def = node?._zod?.def;
    if (!def) return node;
    if (
      ["optional", "nullable", "default", "prefault", "readonly", "nonoptional"].includes(def.type)
    ) {
      node = def.innerType;
    } else if (def.type === "lazy") node = def.getter();
    else if (def.type === "pipe") node = def.in;
    else return node;
  }
}

/** The leaf types a schema accepts ("number", "boolean", "string", "object", ...). */
function leafTypes(schema: Schema): Set<string> {
  const node = unwrap(schema);
  const def = node?._zod?.def;
  if (!def) return new Set(["unknown"]);
  if (def.type === "union") {
    return new Set(def.options.flatMap((o: Schema) => [...leafTypes(o)]));
  }
  return new Set([def.type]);
}

const NUMBER = /^[+-]?(\d+\.?\d*|\.\d+)(e[+-]?\d+)?$/i;

/**
 * A command-line value as the config declares it: a number where the config has a number (in
 * any spelling: "064", "1e2"), a boolean for "true"/"false" where a boolean or anything goes,
 * JSON for a "[" or "{" value where a list, a table or anything goes. Where anything goes (a
 * taskset's knobs, `env_args`, an Env option no schema declares) a number is also a number, as
 * TOML would read it, when the value is that number's own spelling ("3", "0.5", "-2"), so ids
 * such as "590143e8", "00123456" or "0x1f" stay strings. A value in double quotes
 * (`'"12345678"'`) is that string, on any key.
 */
export function coerceFlag(path: string[], value: unknown): unknown {
  return coerceFlagIn(CLI_SCHEMA, path, value);
}

/** {@link coerceFlag} against another schema (an `[env]` table of an Env from a module). */
export function coerceFlagIn(root: Schema, path: string[], value: unknown): unknown {
  if (typeof value !== "string") return value;
  const quoted = quotedString(value);
  if (quoted !== undefined) return quoted;
  const schema = schemaAt(root, path);
  const types = schema === undefined ? new Set(["unknown"]) : leafTypes(schema);
  const any = types.has("unknown") || types.has("any");
  if ((types.has("boolean") || any) && (value === "true" || value === "false")) {
    return value === "true";
  }
  if (types.has("number") && NUMBER.test(value.trim())) return Number(value);
  // Only where the config declares a free-form value: a flag it does not know at all (`--run`,
  // a command's own) keeps its string.
  if (schema !== undefined && any && isCanonicalNumber(value)) return Number(value);
  if (
    (any || types.has("object") || types.has("record") || types.has("array")) && /^[[{]/.test(value)
  ) {
    try {
      return JSON.parse(value);
    } catch { /* keep the string */ }
  }
  return value;
}

/** The string a JSON string literal (`"..."`) spells, else undefined. */
function quotedString(value: string): string | undefined {
  if (value.length < 2 || !value.startsWith('"') || !value.endsWith('"')) return undefined;
  try {
    const parsed = JSON.parse(value);
    return typeof parsed === "string" ? parsed : undefined;
  } catch {
    return undefined;
  }
}

/** Whether `value` is how JavaScript writes the finite number it spells ("3", not "03" or "3e0"). */
function isCanonicalNumber(value: string): boolean {
  if (!NUMBER.test(value)) return false;
  const n = Number(value);
  return Number.isFinite(n) && String(n) === value;
}

/**
 * Flags the CLI could not type (`--env.writer.sampling.temperature 0.5` for a role, or an
 * option, only an Env from a module declares), typed in `merged` by that Env's `[env]` schema:
 * each string leaf of the flags' `env` table that `merged` still holds as given.
 * @param merged the config file's tables with the flags over them; changed in place
 * @param flags what {@link flagsToConfig} made of the command line
 * @param envSchema the `[env]` table's schema of the Env the run names
 */
export function retypeEnvFlags(
  merged: Record<string, unknown>,
  flags: Record<string, unknown>,
  envSchema: Schema,
): void {
  const walk = (given: unknown, into: unknown, path: string[]): void => {
    if (!isTable(given) || !isTable(into)) return;
    for (const [key, value] of Object.entries(given)) {
      const at = [...path, key];
      if (isTable(value)) walk(value, into[key], at);
      else if (
        typeof value === "string" && into[key] === value &&
        schemaAt(CLI_SCHEMA, ["env", ...at]) === undefined
      ) into[key] = coerceFlagIn(envSchema, at, value);
    }
  };
  walk(flags.env, merged.env, []);
}

export function parseArgs(argv: string[]) {
  return yargsParser(argv, {
    configuration: {
      "camel-case-expansion": false,
      "dot-notation": false,
      "boolean-negation": true,
      // Values are strings unless a flag below is declared a number, or the config declares
      // the key a number (coerceFlag): "--run 590143e8" must not become 5.90143e13.
      "parse-numbers": false,
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
      "force",
      "probe",
      "images",
      "cache",
      "kubernetes",
    ],
    string: [
      "run",
      "older-than",
      "kubeconfig",
      "context",
      "namespace",
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
      "format",
      "path",
      "fail-if-worse",
      "top",
      "host",
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
      "max-error-rate",
      "timeout",
      "seed",
    ],
  });
}

export function parseDuration(text: string): number {
  const m = /^(\d+(?:\.\d+)?)(s|m|h|d)?$/.exec(text.trim());
  if (!m) throw new ConfigError(`--older-than "${text}" must look like 30s, 10m, 2h or 1d`);
  const unit = { s: 1e3, m: 60e3, h: 3600e3, d: 86400e3 }[(m[2] ?? "s") as "s" | "m" | "h" | "d"];
  return Number(m[1]) * unit;
}

/**
 * A leading `@ file.toml` (or `@file.toml`) among the positional arguments: the file's
 * config, its path as the source errors name, and the positionals after it.
 */
export async function configFileArg(
  positional: string[],
  command: string,
): Promise<{ fileConfig: Record<string, unknown>; source: string; rest: string[] }> {
  const first = positional[0];
  if (first !== "@" && !first?.startsWith("@")) {
    return { fileConfig: {}, source: "command line", rest: positional };
  }
  const path = first === "@" ? positional[1] : first.slice(1);
  if (!path) {
    throw new ConfigError(`vf ${command} @ needs a config file: vf ${command} @ config.toml`);
  }
  return {
    fileConfig: await readToml(path),
    source: path,
    rest: positional.slice(first === "@" ? 2 : 1),
  };
}
