/**
 * `vf serve <taskset>`: the taskset half of `vf serve` — whether a name is a taskset, and the
 * runner of its episodes (served over HTTP's `/run` and ZeroMQ's `run` alike), its `[env]`
 * (roles, runtime, harness) read from the `--env.*` flags.
 * @module
 */
import { TASKSETS } from "../../environments/mod.ts";
import { buildEnv, roleClient } from "../agents/load.ts";
import { deepMerge } from "../config.ts";
import { ConfigError } from "../errors.ts";
import { resolveEnvironmentModule } from "../legacy/load.ts";
import { OpenAIChatClient } from "../model/client.ts";
import { type EpisodeRunner, type RoleDefaults, tasksetRunner } from "../serve/episode_runner.ts";
import { loadPluggedHooks } from "../tasks/plugged.ts";
import { ComposeCache } from "../services/cache.ts";
import { loadToolsets } from "../tools/config.ts";
import { Toolbox } from "../tools/toolbox.ts";
import { resolve } from "node:path";
import { flagsToConfig, parseArgs } from "./args.ts";
import { loadTasksetFor } from "./resolve.ts";
import { sandboxSourceOf } from "./run.ts";
import { typeEnvFlags, validateRunConfig } from "./run_config.ts";

/** Whether `spec` names a taskset (built-in, or a module exporting loadTaskset() only). */
export async function isTasksetSpec(
  spec: string,
  builtinEnvs: Record<string, unknown>,
): Promise<boolean> {
  const key = spec.replaceAll("_", "-");
  if (builtinEnvs[spec] || builtinEnvs[key]) return false;
  if (TASKSETS[spec] || TASKSETS[key]) return true;
  try {
    const { module } = await resolveEnvironmentModule(
      spec,
      TASKSETS as unknown as Parameters<typeof resolveEnvironmentModule>[1],
      "loadTaskset",
    );
    return typeof (module as unknown as Record<string, unknown>).loadEnvironment !== "function";
  } catch {
    return false; // loading it as an environment reports what is wrong
  }
}

/** Flags of `vf serve` that are not part of the eval config. */
const SERVE_KEYS = [
  "zmq",
  "zmq_impl",
  "wire",
  "workers",
  "port",
  "host",
  "allow_key_var",
  "tls_cert",
  "tls_key",
  "c",
  "max_concurrent",
  "env_args",
  "x",
  "extra_env_kwargs",
  "timeout",
];

/**
 * The runner of a served taskset: `--env.*` flags configure its Env (roles,
 * runtime, harness, scoring) and `--env.taskset.*` its knobs, as for `vf run`; each request
 * brings the model endpoint, model and sampling.
 * @throws {ConfigError} naming the flag that is wrong
 */
export async function tasksetServeRunner(spec: string, argv: string[]): Promise<EpisodeRunner> {
  const flags = flagsToConfig(parseArgs(argv) as Record<string, unknown>);
  for (const key of SERVE_KEYS) delete flags[key];
  const merged = deepMerge({ env: { taskset: { id: spec } } }, flags);
  await typeEnvFlags(merged, flags);
  const config = await validateRunConfig(merged, "command line");
  const { base } = config.env;
  if (base.judges !== undefined) {
    throw new ConfigError(
      "command line: env.judges: a served taskset takes no judges yet; score with the task's " +
        "own rewards, or run the judge as a role of the Env (--env.id agentic-judge)",
    );
  }
  const { id: tasksetId, task: taskConfig, ...knobs } = base.taskset;
  const baseDir = ".";
  const pluggedConfig = await loadPluggedHooks(taskConfig ?? {}, baseDir);
  const toolsets = await loadToolsets(base.toolsets, baseDir);
  const declared = base.services?.compose;
  const services = declared ? resolve(baseDir, declared) : undefined;
  // The served taskset's Compose files, each parsed once for the server's life.
  const composeCache = new ComposeCache();
  if (services) await composeCache.load(services);
  const taskset = await loadTasksetFor(
    tasksetId,
    { ...knobs, id: tasksetId, task: pluggedConfig },
    config,
    "command line",
  );
  const runId = `serve-${crypto.randomUUID().slice(0, 8)}`;
  // [limits] and warm pools (agents', graders') as `vf run` has them.
  const sandboxes = sandboxSourceOf(config, runId);
  const makeEnv = (defaults: RoleDefaults) =>
    buildEnv({
      config: config.env,
      source: "command line",
      client: defaults.client,
      model: defaults.model,
      samplingArgs: defaults.samplingArgs,
      makeClient: roleClient,
      sandboxes,
      baseDir,
    });
  // A bad [env] fails now, not on the first request.
  await makeEnv({
    client: new OpenAIChatClient({ base_url: "http://127.0.0.1:9/v1" }),
    model: "check",
    samplingArgs: {},
  });
  const shared = toolsets.filter((t) => t.shared);
  const sharedTools = shared.length
    ? await Toolbox.open(shared, { state: {}, run: runId })
    : undefined;
  return tasksetRunner(taskset, {
    makeEnv,
    runId,
    toolsets,
    sharedTools,
    services,
    composeCache,
    onClose: async () => {
      await sharedTools?.close();
      await sandboxes?.close();
    },
  });
}
