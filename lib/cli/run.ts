/**
 * `vf run`, and the `[env.taskset]` form of `vf eval`: an agent on sandboxed tasks.
 * @module
 */

import { AdaptiveController, allGates } from "../eval/adaptive.ts";
import process from "node:process";
import { existsSync } from "node:fs";
import { readFile } from "node:fs/promises";
import { dirname, join, resolve } from "node:path";
import { TASKSETS } from "../../environments/mod.ts";
import { sandboxLimitsFromConfig } from "../../runtimes/limits.ts";
import { WarmPool } from "../../runtimes/pool.ts";
import { limitModelConnections, type Semaphore } from "../model/limits.ts";
import { buildEnv, roleClient } from "../agents/load.ts";
import type { Env, Episode } from "../agents/env.ts";
import { runTaskset, scoredTraces } from "../agents/run.ts";
import { renderTaskSummary } from "../tasks/summary.ts";
import type { Judge } from "../scoring/judges/judge.ts";
import { buildJudges } from "../scoring/judges/config.ts";
import type { Taskset } from "../tasks/task.ts";
import { loadPluggedHooks } from "../tasks/plugged.ts";
import { loadToolsets } from "../tools/config.ts";
import { ComposeCache } from "../services/cache.ts";
import type { ToolsetSpec } from "../tools/toolset.ts";
import type { ChatClient } from "../model/client.ts";
import { type AgentTable, deepMerge, samplingOf } from "../config.ts";
import { ConfigError } from "../errors.ts";
import { terminalLines, terminalText } from "../util/terminal.ts";
import { writeJsonAtomic } from "../eval/results.ts";
import { configFileArg, flagsToConfig, parseArgs } from "./args.ts";
import {
  budgetOf,
  budgetStopMessage,
  judgeEndpointResolver,
  loadTasksetFor,
  recordRunCosts,
  resolveClient,
  seedCosts,
  wantsSandbox,
} from "./resolve.ts";
import type { CachedChatClient } from "../model/cache.ts";
import type { CostBudget, CostMeter } from "../model/cost.ts";
import type { SandboxSource } from "../../runtimes/pool.ts";
import { onInterrupt } from "./interrupt.ts";
import { controlTaskRun, TASK_RUN_CEILING } from "./ctl.ts";
import { type RunConfig, typeEnvFlags, validateRunConfig } from "./run_config.ts";
import { runOutcome } from "./outcome.ts";

const RUN_HELP = `vf run <taskset> [options]     (same as: vf eval <taskset>)
vf run @ <config.toml> [options]  the taskset and settings from a TOML file ([env.taskset] id)

Runs an agent on each task of a taskset inside sandboxes and grades it.
  -n <tasks>  -r <rollouts per task>  -c <concurrent rollouts (default 4)>
  -m, -b, -k                          model, base URL, API key variable (as vf eval)
  --env.agent.harness.id bash|null    the agent harness (default: the task's choice, else bash)
  --env.agent.runtime.type docker|subprocess   --env.agent.runtime.cpu 2 --env.agent.runtime.memory 4
  --env.agent.scoring.mode shared|isolated      --env.agent.scoring.runtime.image <image>
  --env.id <env>                      single-agent (default), best-of-n (--env.n 4), agentic-judge,
                                      shared-agentic-judge, best-of-n-judge, user-sim, or ./my_env.ts
  --env.<role>.model m --env.<role>.client.base_url URL   a role's own model and endpoint
                                      (roles: agent; solver, judge; assistant, user)
  --env.timeout.episode 600  --env.max_concurrent_agents 2
  --env.agent.runtime.warm_pool 4     keep started agent sandboxes ready
  --env.agent.scoring.runtime.warm_pool 2
                                      keep started, never-used grading sandboxes ready
  --env.fork_group                    each task's setup runs once, then its sandbox is
                                      snapshotted and the task's other rollouts start from it
  -S '{"return_token_ids": true}' --save-tokens
                                      record each call's token ids, masks and logprobs (vLLM)
                                      and write them to traces.jsonl (kept out by default)
  --limits.max_sandboxes 32  --limits.sandbox_create_rate 8  --limits.max_model_connections 64
  -R, --resume <run dir>              re-run only the missing or failed rollouts
  --pass-threshold 1                  the reward a rollout reaches to pass in pass@k (default 0.5)
Writes outputs/evals/<taskset>--<model>/<run_id>/{traces.jsonl,metadata.json,config.json}.
Tasksets: ${Object.keys(TASKSETS).join(", ")}, or a path to a module exporting loadTaskset().
`;

/** Run a taskset (the `[env.taskset]` form of `vf eval`, and `vf run`). */
export async function runTasks(
  config: RunConfig,
  merged: Record<string, unknown>,
  source: string,
  /** A replay's: its model client, its sandboxes, the run folder and what it links to. */
  inject: {
    client?: ChatClient;
    sandboxes?: SandboxSource;
    runDir?: string;
    link?: Record<string, unknown>;
    /** vf rescore: given the loaded taskset and judges, does its work instead of a run. */
    rescore?: (taskset: Taskset, judges: Judge[]) => Promise<number>;
  } = {},
): Promise<number> {
  const { base } = config.env;
  // sampling_args and each role's sampling were checked by their schema (return_token_ids
  // among them) before any sandbox starts; -t/-T fill in what they do not set.
  const samplingArgs = samplingOf(config);
  const resolved = await resolveClient(config);
  const { model, baseUrl, keyVar, cache, meter } = resolved;
  const client = inject.client ?? resolved.client;
  const budget = budgetOf(config, meter);
  const adaptive = config.limits?.adaptive
    ? new AdaptiveController({ max: config.max_concurrent ?? 4 })
    : null;
  const runId = crypto.randomUUID().slice(0, 8);
  const resumeDir = typeof config.resume === "string" ? resolve(config.resume) : null;
  // Sandboxes come through the limits and the warm pool; model calls through their own limit.
  const pooled = sandboxSourceOf(config, resumeDir ? resumeDir.split("/").pop()! : runId);
  const sandboxes = inject.sandboxes ?? pooled;
  // Relative paths in a TOML config (rubrics, judge prompts, hooks, toolsets, Compose) are
  // read from its folder; on the command line, from the cwd.
  const baseDir = source.endsWith(".toml") ? dirname(resolve(source)) : undefined;
  const maxModel = config.limits?.max_model_connections;
  /** Each endpoint's connection permits, for `vf ctl set max_model_connections=N`. */
  const connections: Semaphore[] = [];
  const limited = (c: ChatClient) => {
    if (!maxModel) return c;
    const l = limitModelConnections(c, maxModel);
    connections.push(l.connections);
    return l;
  };
  const modelClient = limited(client);
  try {
    const env = await buildEnv({
      config: config.env,
      source,
      client: modelClient,
      model,
      samplingArgs,
      // A role on an endpoint of its own is metered alongside the agent's calls.
      makeClient: (c) => limited(meter.alongside(roleClient(c))),
      sandboxes,
      baseDir,
    });
    const { id: tasksetId, task: taskConfig, ...tasksetKnobs } = base.taskset;
    let judges: Judge[];
    try {
      judges = buildJudges([
        { field: "env.judges", entries: base.judges },
        { field: "env.taskset.task.judges", entries: taskConfig?.judges },
      ], {
        baseDir,
        endpointOf: await judgeEndpointResolver(config, { client: modelClient, model }, meter),
      });
    } catch (error) {
      if (error instanceof ConfigError) throw new ConfigError(`${source}: ${error.message}`);
      throw error;
    }
    let pluggedConfig: Record<string, unknown>;
    let toolsets: ToolsetSpec[];
    let compose: string | undefined;
    // The run's Compose files, each parsed once: here, and by every rollout after.
    const composeCache = new ComposeCache();
    try {
      pluggedConfig = await loadPluggedHooks(taskConfig ?? {}, baseDir ?? ".");
      toolsets = await loadToolsets(base.toolsets, baseDir ?? ".");
      const declared = base.services?.compose;
      if (declared) {
        compose = resolve(baseDir ?? ".", declared);
        await composeCache.load(compose); // checked now: a bad file fails before any rollout
      }
    } catch (error) {
      if (error instanceof ConfigError) throw new ConfigError(`${source}: ${error.message}`);
      throw error;
    }
    const plugs = ["rewards", "metrics", "stops"].some((k) => k in (taskConfig ?? {}));
    if (plugs && wantsSandbox(tasksetId, config)) {
      throw new ConfigError(
        `${source}: env.taskset.task: plugged rewards, metrics and stops run in this process, ` +
          `so they cannot be given to a taskset running in a sandbox host (a URL or --sandbox)`,
      );
    }
    const taskset = await loadTasksetFor(
      tasksetId,
      { ...tasksetKnobs, id: tasksetId, task: pluggedConfig },
      config,
      source,
    );
    if (inject.rescore) return await inject.rescore(taskset, judges);
    return await runEnv(env, taskset, {
      config,
      merged,
      modelClient,
      model,
      judges,
      toolsets,
      services: compose,
      composeCache,
      baseUrl,
      keyVar,
      runId,
      resumeDir,
      cache,
      meter,
      budget,
      adaptive,
      pool: pooled ?? null,
      connections,
      inject,
    });
  } finally {
    await sandboxes?.close();
  }
}

/**
 * The sandbox source a run's config asks for: `[limits]`, and warm pools of agent sandboxes
 * (`[env.<role>.runtime] warm_pool`) and of never-used grading sandboxes
 * (`[env.<role>.scoring.runtime] warm_pool`); undefined when it asks for none of them. One pool
 * serves every role and keeps the largest size any role asks for.
 */
export function sandboxSourceOf(config: RunConfig, runId: string): WarmPool | undefined {
  const limits = sandboxLimitsFromConfig(config.limits);
  const roles = Object.values(config.env.roles);
  const largest = (pick: (role: AgentTable) => number | undefined) =>
    Math.max(0, ...roles.map(pick).filter((n) => n !== undefined));
  const size = largest((role) => role.runtime?.warm_pool);
  // Each grading sandbox is used once, by one grader, as fresh as one started on demand.
  const graderSize = largest((role) => role.scoring?.runtime?.warm_pool);
  if (!limits && size === 0 && graderSize === 0) return undefined;
  return new WarmPool({ size, graderSize, runId, limits });
}

async function runEnv(
  env: Env,
  taskset: Taskset,
  o: {
    config: RunConfig;
    merged: Record<string, unknown>;
    modelClient: ChatClient;
    model: string;
    judges: Judge[];
    toolsets: ToolsetSpec[];
    services?: string;
    composeCache: ComposeCache;
    baseUrl: string;
    keyVar: string;
    runId: string;
    resumeDir: string | null;
    cache: CachedChatClient | null;
    meter: CostMeter;
    budget: CostBudget | null;
    adaptive: AdaptiveController | null;
    pool: WarmPool | null;
    connections: Semaphore[];
    inject: { runDir?: string; link?: Record<string, unknown> };
  },
): Promise<number> {
  const { config, model } = o;
  // Resuming: sizes not given again default to those the run was started with.
  const saved = o.resumeDir
    ? await readFile(join(o.resumeDir, "config.json"), "utf8")
      .then((t) => JSON.parse(t) as Record<string, unknown>)
      .catch(() => ({} as Record<string, unknown>))
    : {};
  const savedNum = typeof saved.num_examples === "number" ? saved.num_examples : undefined;
  const savedRollouts = typeof saved.rollouts_per_example === "number"
    ? saved.rollouts_per_example
    : undefined;
  const rollouts = config.rollouts_per_example ?? savedRollouts ?? 1;
  const numTasks = config.num_examples ?? savedNum ?? -1;
  const save = config.save !== false;
  const base = resolve(
    config.output_dir ?? "outputs",
    "evals",
    `${taskset.id}--${model.replaceAll("/", "--")}`,
  );
  let runDir: string | null = o.inject.runDir ?? (save ? join(base, o.runId) : null);
  let resume = false;
  if (o.resumeDir) {
    runDir = o.resumeDir;
    resume = true;
    await seedCosts(o.meter, runDir, { budget: o.budget, linesFile: "traces.jsonl" });
  } else if (config.resume === true) {
    throw new ConfigError("Resuming a taskset run needs the run directory: --resume <dir>");
  }
  if (runDir) {
    const resolved = {
      format_version: 1,
      ...o.merged,
      model,
      client: { ...(config.client ?? {}), base_url: o.baseUrl, api_key_var: o.keyVar },
      num_examples: numTasks,
      rollouts_per_example: rollouts,
      env: o.merged.env, // scoring.env templates are kept as written, never resolved here
    };
    delete (resolved as Record<string, unknown>).base_url;
    delete (resolved as Record<string, unknown>).api_key_var;
    await writeJsonAtomic(join(runDir, "config.json"), resolved);
    process.stderr.write(`Saving traces to ${terminalText(runDir)}\n`);
  }
  const quiet = config.quiet ?? false;
  const started = Date.now();
  using interrupt = onInterrupt();
  // vf ctl steers the run through a socket of its own; its actions go into metadata.json.
  const steer = await controlTaskRun({
    runId: runDir ? runDir.split("/").pop()! : o.runId,
    runDir,
    maxConcurrent: config.max_concurrent ?? 4,
    env,
    limits: o.pool?.limits,
    connections: o.connections,
    meter: o.meter,
    budget: o.budget,
    signal: interrupt.signal,
  });
  try {
    const { summary } = await runTaskset({
      taskset,
      env,
      model,
      samplingArgs: samplingOf(config),
      passThreshold: config.pass_threshold,
      numTasks,
      rolloutsPerTask: rollouts,
      maxConcurrent: config.max_concurrent ?? 4,
      shuffleSeed: config.shuffle_seed ?? null,
      runDir,
      runId: runDir ? runDir.split("/").pop()! : o.runId,
      resume,
      judges: o.judges,
      toolsets: o.toolsets,
      services: o.services,
      composeCache: o.composeCache,
      forkGroup: config.env.base.fork_group,
      saveTokens: config.save_tokens,
      requireTaskConfig: ["rewards", "metrics", "stops"].filter((k) =>
        k in (config.env.base.taskset.task ?? {})
      ),
      signal: interrupt.signal,
      gate: allGates([steer.control, o.budget, o.adaptive]),
      steering: steer.control,
      workers: Math.max(config.max_concurrent ?? 4, TASK_RUN_CEILING),
      onEpisode: (e, done, total) => {
        steer.episode(e, total);
        if (quiet) return;
        const rate = done / Math.max(0.001, (Date.now() - started) / 1000);
        process.stderr.write(
          `${terminalText(taskset.id)} ${done}/${total} ${rate.toFixed(2)}/s ${
            describeEpisode(e)
          }` +
            (o.adaptive ? ` (concurrency ${o.adaptive.limit}/${o.adaptive.max})` : "") + "\n",
        );
      },
    });
    await steer.close();
    process.stdout.write(renderTaskSummary(summary) + "\n");
    if (runDir && o.inject.link) {
      const path = join(runDir, "metadata.json");
      const metadata = JSON.parse(await readFile(path, "utf8"));
      await writeJsonAtomic(path, { ...metadata, ...o.inject.link });
    }
    for (const line of await recordRunCosts(runDir ?? undefined, o)) {
      process.stdout.write(terminalLines(line) + "\n");
    }
    if (o.budget?.stopped) {
      process.stderr.write(
        terminalLines(
          budgetStopMessage(o.budget, { command: "run", runDir, done: summary.num_rollouts }),
        ) + "\n",
      );
      return 1;
    }
    if (runDir) process.stdout.write(`traces: ${terminalText(join(runDir, "traces.jsonl"))}\n`);
    const outcome = runOutcome(summary.num_errors, summary.num_rollouts, config.max_error_rate);
    if (outcome.message) process.stderr.write(`error: ${outcome.message}\n`);
    return outcome.code;
  } catch (error) {
    await steer.close().catch(() => {});
    // What was spent before the stop counts toward a resume's budget.
    if (runDir && existsSync(join(runDir, "metadata.json"))) {
      await recordRunCosts(runDir, o).catch(() => {});
    }
    if (interrupt.interrupted) {
      process.stderr.write(
        runDir
          ? `Interrupted; finish with: vf eval @ <config> --resume ${terminalText(runDir)}\n`
          : "Interrupted\n",
      );
      return 130;
    }
    throw error;
  }
}

/** One progress line's worth of an episode: task, reward(s), the first error. */
function describeEpisode(e: Episode): string {
  const scored = scoredTraces([e]);
  const rewards = scored.map((t) => (t.reward === null ? "error" : t.reward.toFixed(3)));
  const error = e.errors[0] ?? e.traces.find((t) => t.error)?.error;
  // The task's key and the error's text come from the taskset and the sandbox.
  const why = error ? ` (${error.phase}: ${error.error}: ${error.message.slice(0, 120)})` : "";
  return terminalText(`task ${e.task.key} reward ${rewards.join(" ") || "error"}${why}`);
}

export async function cmdRun(argv: string[]): Promise<number> {
  const flags = parseArgs(argv);
  if (flags.help || flags.h) {
    process.stdout.write(RUN_HELP);
    return 0;
  }
  const { fileConfig, source, rest: positional } = await configFileArg(flags._.map(String), "run");
  if (positional.length > 1) {
    throw new ConfigError(`Unexpected arguments: ${positional.slice(1).join(" ")}`);
  }
  const fromFile = (fileConfig.env as { taskset?: { id?: unknown } } | undefined)?.taskset?.id;
  if (!positional[0] && !fromFile) {
    throw new ConfigError(
      source === "command line"
        ? "vf run needs a taskset: vf run file-sum -n 1 -r 1, or vf run @ config.toml"
        : `${source}: env.taskset.id: the taskset to run is required`,
    );
  }
  const cliConfig = flagsToConfig(flags as Record<string, unknown>);
  const named = positional[0] ? { env: { taskset: { id: positional[0] } } } : {};
  const merged = deepMerge(deepMerge(fileConfig, named), cliConfig);
  await typeEnvFlags(merged, cliConfig);
  const config = await validateRunConfig(merged, source);
  return await runTasks(config, merged, source);
}
