/**
 * A taskset run's config, checked whole and once, at the edge (`vf run`, `vf eval <taskset>`,
 * `vf replay`, `vf rescore`, `vf serve <taskset>`): the eval config first, then `[env]`
 * against the Env it names (the Env class is resolved from `env.id`, or the taskset's own,
 * then the table is parsed with that Env's schema). What runs the taskset takes the typed
 * result and trusts it. Issues read `file: path.to.field: message`.
 * @module
 */
import { TASKSETS } from "../../environments/mod.ts";
import {
  cliEnvSchema,
  type EnvClass,
  envClassOf,
  type EnvConfig,
  parseEnvConfig,
  resolveEnvClass,
} from "../agents/load.ts";
import { retypeEnvFlags } from "./args.ts";
import { type EvalConfig, validateEvalConfig } from "../config.ts";
import { ConfigError } from "../errors.ts";
import { resolveEnvironmentModule } from "../legacy/load.ts";
import { wantsSandbox } from "./resolve.ts";

/** A validated taskset run's config: the eval config with `[env]` checked against its Env. */
export interface RunConfig extends Omit<EvalConfig, "env"> {
  env: EnvConfig;
}

/**
 * Validate a merged config for a taskset run.
 * @param raw the config file's tables with the command line's over them
 * @param source the config's name in errors (`run.toml`, `command line`)
 * @throws {ConfigError} `source: path.to.field: message`
 */
export async function validateRunConfig(
  raw: Record<string, unknown>,
  source: string,
): Promise<RunConfig> {
  return await runConfigOf(validateEvalConfig(raw, source), source);
}

/**
 * An eval config, already validated, as a taskset run's: its `[env]` checked against the Env
 * it names.
 * @throws {ConfigError} `source: env.<field>: message`
 */
export async function runConfigOf(config: EvalConfig, source: string): Promise<RunConfig> {
  const env = config.env ?? {};
  const taskset = env.taskset;
  if (!isTable(taskset) || typeof taskset.id !== "string" || !taskset.id) {
    throw new ConfigError(`${source}: env.taskset.id: the taskset to run is required`);
  }
  const tasksetEnv = env.id ? null : await tasksetEnvOf(taskset.id, config);
  return {
    ...config,
    env: await parseEnvConfig(env, { source, trust: config.trust === true, tasksetEnv }),
  };
}

/**
 * Type the `--env.*` flags only an Env from a module declares (its roles' sampling, its own
 * options) by that Env's schema, in `merged`, before the run's config is checked: the command
 * line is typed by the built-in Envs' schemas, and a module's Env is known only once `env.id`
 * (or the taskset's module) is loaded. Nothing changes when the Env cannot be resolved: the
 * check that follows names what is wrong.
 * @param merged the config file's tables with the flags over them; changed in place
 * @param flags what the command line said (`flagsToConfig`)
 */
export async function typeEnvFlags(
  merged: Record<string, unknown>,
  flags: Record<string, unknown>,
): Promise<void> {
  const env = merged.env;
  if (!isTable(flags.env) || !isTable(env)) return;
  let cls: EnvClass | null = null;
  try {
    if (typeof env.id === "string" && env.id) {
      cls = await resolveEnvClass(env.id, { trust: merged.trust === true });
    } else if (isTable(env.taskset) && typeof env.taskset.id === "string") {
      cls = await tasksetEnvOf(env.taskset.id, merged as EvalConfig);
    }
  } catch {
    return;
  }
  if (cls) retypeEnvFlags(merged, flags, cliEnvSchema(cls));
}

/** The Env a taskset's own module exports, if the taskset is a local or built-in module. */
async function tasksetEnvOf(spec: string, config: EvalConfig): Promise<EnvClass | null> {
  if (wantsSandbox(spec, config)) return null; // it runs in a host process: its Env cannot
  try {
    const { module, source } = await resolveEnvironmentModule(
      spec,
      TASKSETS as unknown as Parameters<typeof resolveEnvironmentModule>[1],
      "loadTaskset",
    );
    return envClassOf(module as unknown as Record<string, unknown>, source);
  } catch {
    return null; // loading the taskset reports what is wrong with it
  }
}

function isTable(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}
