/**
 * `vf eval`: evaluate a model on an environment, from flags or a TOML config.
 * @module
 */

import { AdaptiveController, allGates } from "../eval/adaptive.ts";
import process from "node:process";
import { readdir, stat } from "node:fs/promises";
import { existsSync } from "node:fs";
import { basename, join, resolve } from "node:path";
import { BUILTINS, TASKSETS } from "../../environments/mod.ts";
import { type ChatClient, tokenCapture } from "../model/client.ts";
import { deepMerge, type EvalConfig, samplingOf, validateEvalConfig } from "../config.ts";
import type { Environment } from "../legacy/environment.ts";
import { ConfigError, describeError } from "../errors.ts";
import { terminalLines, terminalText } from "../util/terminal.ts";
import { evaluate } from "../eval/evaluate.ts";
import { RunControl, serveControl } from "../eval/control.ts";
import { loadEnvironment, resolveEnvironmentModule } from "../legacy/load.ts";
import { forwardableConfig, ServerEnvironment } from "../serve/client.ts";
import {
  RemoteEnvironment,
  startSandboxHost,
  TasksetNotEnvironmentError,
} from "../sandbox/remote.ts";
import { ProgressDisplay, renderSummary } from "../eval/progress.ts";
import { loadMetadata, loadOutputs, writeJsonAtomic } from "../eval/results.ts";
import { configFileArg, flagsToConfig, parseArgs } from "./args.ts";
import {
  budgetOf,
  budgetStopMessage,
  costRecord,
  env,
  lockFileFor,
  recordRunCosts,
  resolveClient,
  sandboxPermissions,
  seedCosts,
  wantsSandbox,
} from "./resolve.ts";
import { onInterrupt } from "./interrupt.ts";
import { runOutcome } from "./outcome.ts";
import { runTasks } from "./run.ts";
import { runConfigOf, typeEnvFlags, validateRunConfig } from "./run_config.ts";

/** Workers a run starts, so `vf ctl concurrency N` can raise its limit up to this. */
const CONTROL_CEILING = 1024;

export const EVAL_HELP = `vf eval <env | @ config.toml> [options]

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
      --pass-threshold <x>      reward at or above which a rollout counts as correct for
                                pass@k and pass^k (default the env's, else 0.5); the reward
                                is the weighted sum, so with format points set it higher
  -q, --quiet                   no progress display
Any config key can be set with a dotted flag, e.g. --client.timeout 30.

Writes outputs/evals/<env>--<model>/<run_id>/{results.jsonl,metadata.json,config.json}.
`;

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
export async function resolveEval(config: EvalConfig, source: string) {
  const envSpec = config.env_id ?? (config.env?.id as string | undefined) ?? config.server;
  if (!envSpec) {
    throw new ConfigError(
      `${source}: no environment given; pass one (vf eval gsm8k) or set env_id`,
    );
  }
  const { client, model, baseUrl, keyVar, cache, meter } = await resolveClient(config);
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
  const sampling = samplingOf(config);
  tokenCapture(sampling.return_token_ids); // a bad value fails here, before the run starts
  return {
    env: environmentTyped,
    envId: environmentTyped.envId || id,
    client,
    cache,
    meter,
    budget: budgetOf(config, meter),
    // One slot per group in flight: the controller limits groups.
    adaptive: config.limits?.adaptive
      ? new AdaptiveController({
        max: Math.max(
          1,
          Math.ceil(
            (config.max_concurrent ?? 32) /
              Math.max(1, config.rollouts_per_example ?? defaults.rollouts_per_example ?? 3),
          ),
        ),
      })
      : null,
    model,
    baseUrl,
    keyVar,
    numExamples: config.num_examples ?? defaults.num_examples ?? 5,
    rollouts: config.rollouts_per_example ?? defaults.rollouts_per_example ?? 3,
    maxConcurrent: config.max_concurrent ?? 32,
    sampling,
  };
}

async function findResumable(
  base: string,
  envId: string,
  model: string,
  r: number,
  n: number,
  seed: number | null,
) {
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
      if (meta.env_id !== envId || meta.model !== model || meta.rollouts_per_example !== r) {
        continue;
      }
      if ((meta.shuffle_seed ?? null) !== seed) continue; // selects other rows
      const rows = (await loadOutputs(dir, { onCorrupt: () => {} })).length;
      if (meta.num_examples > n || rows >= n * r) continue;
      candidates.push({ dir, mtime: (await stat(join(dir, "metadata.json"))).mtimeMs });
    } catch { /* not a run directory */ }
  }
  candidates.sort((a, b) => b.mtime - a.mtime);
  return candidates[0]?.dir ?? null;
}

/** An environment spec as saved with a run: a local path made absolute, anything else as is. */
/**
 * Whether `spec` names a taskset rather than an environment: a built-in taskset, or a local
 * module exporting `loadTaskset()` and no `loadEnvironment()`. A URL loads in a host process,
 * so it is tried as an environment first and run as a taskset when its host says it is one.
 */
async function isTaskset(spec: string): Promise<boolean> {
  if (BUILTINS[spec] || BUILTINS[spec.replaceAll("_", "-")]) return false;
  if (TASKSETS[spec] || TASKSETS[spec.replaceAll("_", "-")]) return true;
  if (/^https?:\/\//.test(spec) || !/[./\\]/.test(spec)) return false;
  try {
    const { module } = await resolveEnvironmentModule(spec, {}, "loadTaskset");
    return typeof (module as unknown as Record<string, unknown>).loadEnvironment !== "function";
  } catch {
    return false; // loading it as an environment names what is wrong
  }
}

function envSource(spec: string): string {
  return /^[./]/.test(spec) && existsSync(spec) ? resolve(spec) : spec;
}

export async function cmdEval(argv: string[]): Promise<number> {
  const flags = parseArgs(argv);
  if (flags.help || flags.h) {
    process.stdout.write(EVAL_HELP);
    return 0;
  }
  const { fileConfig, source, rest: positional } = await configFileArg(flags._.map(String), "eval");
  const cliConfig = flagsToConfig(flags as Record<string, unknown>);
  if (positional.length > 1) {
    throw new ConfigError(`Unexpected arguments: ${positional.slice(1).join(" ")}`);
  }
  const spec = positional[0] ?? (fileConfig.env_id as string | undefined);
  // A taskset named where an environment goes: run it, as vf run would.
  const asTaskset = async (id: string) => {
    const merged = deepMerge(deepMerge(fileConfig, cliConfig), { env: { taskset: { id } } });
    delete merged.env_id;
    await typeEnvFlags(merged, cliConfig);
    return await runTasks(await validateRunConfig(merged, source), merged, source);
  };
  if (typeof spec === "string" && await isTaskset(spec)) return await asTaskset(spec);
  if (positional[0]) cliConfig.env_id = positional[0];
  const merged = deepMerge(fileConfig, cliConfig);
  if (isTable(merged.env) && "taskset" in merged.env) await typeEnvFlags(merged, cliConfig);
  const config = validateEvalConfig(merged, source);
  if (config.env && "taskset" in config.env) {
    return await runTasks(await runConfigOf(config, source), merged, source);
  }
  if (typeof config.resume === "string") {
    // Resuming a named run: sizes not given again are the run's own, not the env's defaults.
    const saved = await loadMetadata(resolve(config.resume));
    config.num_examples ??= saved.num_examples;
    config.rollouts_per_example ??= saved.rollouts_per_example;
  }
  let run: Awaited<ReturnType<typeof resolveEval>>;
  try {
    run = await resolveEval(config, source);
  } catch (error) {
    // A URL loads in its sandbox host, so only loading it tells a taskset from an environment.
    if (error instanceof TasksetNotEnvironmentError && typeof spec === "string") {
      return await asTaskset(spec);
    }
    throw error;
  }
  // As upstream's set_kwargs would: the flag (or TOML key) wins over the environment's own.
  if (config.pass_threshold !== undefined) run.env.passThreshold = config.pass_threshold;

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
      runDir = await findResumable(
        base,
        run.envId,
        run.model,
        run.rollouts,
        run.numExamples,
        config.shuffle_seed ?? null,
      );
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
  const adaptive = run.adaptive;
  const display = quiet ? null : new ProgressDisplay(
    out,
    terminalText(run.envId),
    adaptive ? () => ` concurrency ${adaptive.limit}/${adaptive.max}` : undefined,
  );
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
      // What was asked for (a local module's path made absolute): vf replay loads it again.
      env_source: envSource(config.env_id ?? (config.env?.id as string | undefined) ?? run.envId),
    };
    await writeJsonAtomic(join(runDir, "config.json"), resolved);
    process.stderr.write(`Saving results to ${terminalText(runDir)}\n`);
  }
  if (resume && runDir) {
    await seedCosts(run.meter, runDir, { budget: run.budget, linesFile: "results.jsonl" });
  }
  // The spend goes into metadata.json with every rewrite, so a run that dies keeps it.
  const cost = () => ({ cost: costRecord(run.meter, run.budget) });
  const liveCost = costRecord(run.meter, run.budget) ? cost : undefined;
  // vf ctl steers the run through a socket of its own (lib/eval/control.ts).
  const control = new RunControl(runDir ? basename(runDir) : crypto.randomUUID().slice(0, 8), {
    maxConcurrent: run.maxConcurrent > 0 ? run.maxConcurrent : CONTROL_CEILING,
    // Known up front when -n is; the first progress report tells it otherwise.
    total: run.numExamples > 0 ? run.numExamples * run.rollouts : 0,
    live: liveCost,
  });
  interrupt.signal.addEventListener("abort", () => control.stop(), { once: true });
  const served = await serveControl(control).catch((error) => {
    process.stderr.write(
      `warning: no control socket (vf ctl): ${terminalLines(describeError(error))}\n`,
    );
    return null;
  });
  try {
    const result = await evaluate(run.env, run.client, run.model, {
      numExamples: run.numExamples,
      rolloutsPerExample: run.rollouts,
      // Workers up to the ceiling; the control's limit (max_concurrent) bounds what runs.
      maxConcurrent: Math.max(run.maxConcurrent, CONTROL_CEILING),
      samplingArgs: run.sampling,
      independentScoring: config.independent_scoring,
      maxRetries: config.max_retries,
      stateColumns: config.state_columns,
      saveTokens: config.save_tokens,
      advantageStd: config.advantage_std,
      shuffleSeed: config.shuffle_seed ?? null,
      resultsDir: runDir,
      resume,
      // The summary comes from the tally: memory stays flat however many rollouts run.
      keepOutputs: false,
      signal: interrupt.signal,
      onProgress: (p) => {
        control.progress(p);
        display?.update(p);
      },
      metadataExtra: runDir ? { run_dir: runDir } : {},
      metadataLive: () => ({ ...liveCost?.(), ...control.metadata() }),
      gate: allGates([control, run.budget, run.adaptive]),
      steering: control,
    });
    display?.finish();
    process.stdout.write(renderSummary(result.metadata, result.tally) + "\n");
    for (const line of await recordRunCosts(runDir ?? undefined, run)) {
      process.stdout.write(terminalLines(line) + "\n");
    }
    if (run.budget?.stopped) {
      process.stderr.write(
        terminalLines(
          budgetStopMessage(run.budget, { command: "eval", runDir, done: result.tally.count }),
        ) + "\n",
      );
      return 1;
    }
    if (runDir) process.stdout.write(`results: ${terminalText(join(runDir, "results.jsonl"))}\n`);
    const outcome = runOutcome(result.tally.errors, result.tally.count, config.max_error_rate);
    if (outcome.message) process.stderr.write(`error: ${outcome.message}\n`);
    return outcome.code;
  } catch (error) {
    display?.finish();
    // What was spent before the stop counts toward a resume's budget.
    if (runDir && existsSync(join(runDir, "metadata.json"))) {
      await recordRunCosts(runDir, run).catch(() => {});
    }
    if (interrupt.interrupted) {
      const saved = runDir ? (await loadOutputs(runDir)).length : 0;
      process.stderr.write(
        runDir
          ? `Interrupted: ${saved} rollouts saved in ${terminalText(runDir)}; finish with: ` +
            `vf eval ... --resume ${terminalText(runDir)}\n`
          : "Interrupted\n",
      );
      return 130;
    }
    if (runDir) {
      const saved = (await loadOutputs(runDir).catch(() => [])).length;
      if (saved) {
        process.stderr.write(`${saved} finished rollouts are saved in ${terminalText(runDir)}\n`);
      }
    }
    throw error;
  } finally {
    await served?.close();
    await run.env.teardown().catch(() => {});
  }
}

function isTable(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}
