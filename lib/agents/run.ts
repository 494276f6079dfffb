/**
 * Running a taskset, top to bottom: select tasks, check them against the run (task config,
 * rewards, judges, what a dedicated host can serve), run episodes of an Env concurrently,
 * append one line per episode to `traces.jsonl` (a single-agent episode is written as its one
 * trace) with its sandbox records in `record.jsonl`, aggregate the trainable traces into the
 * run's summary, and resume a run by keeping only its complete episodes. Everything it calls
 * is below it: the Env layer, the rollout, the summary.
 * @module
 */
import { appendFile, mkdir } from "node:fs/promises";
import { join } from "node:path";
import { traitsOfConfig } from "../../runtimes/config.ts";
import type { ChatClient } from "../model/client.ts";
import { ConfigError, EnvError, serializeError } from "../errors.ts";
import { seededShuffle } from "../random.ts";
import { ComposeCache } from "../services/cache.ts";
import type { Judge } from "../scoring/judges/judge.ts";
import type { ToolsetSpec } from "../tools/toolset.ts";
import { Toolbox } from "../tools/toolbox.ts";
import type { RunSteering, StartGate } from "../eval/evaluate.ts";
import { WorkerPool } from "../eval/pool.ts";
import { readJsonLines, repairTrailingLine, writeJsonAtomic } from "../eval/results.ts";
import { requireRewards, type Task, type Taskset } from "../tasks/task.ts";
import type { AgentPolicy, RolloutRecord, TaskTrace } from "../tasks/rollout/mod.ts";
import { modelRetries, summarizeTraces, type TaskRunSummary } from "../tasks/summary.ts";
import type { SamplingArgs } from "../types.ts";
import {
  type Env,
  type Episode,
  episodeOfLine,
  flatTrace,
  runEpisode,
  traceLineProblem,
} from "./env.ts";
import { GroupForks } from "../tasks/fork.ts";
import { groupAdvantages } from "../scoring/advantages.ts";
import { MessageGraph } from "../graph.ts";
import { SingleAgentEnv } from "./builtin/single_agent.ts";

/** Options of {@link runTaskset}. */
export interface RunTasksetOptions {
  taskset: Taskset;
  /**
   * The Env whose episodes run; default a single-agent Env whose agent uses `policy`,
   * `client` and `model`.
   */
  env?: Env;
  /** The single agent's policy when no `env` is given. */
  policy?: AgentPolicy;
  /** The single agent's endpoint when no `env` is given. */
  client?: ChatClient;
  /** The run's model (recorded in the summary). */
  model: string;
  samplingArgs?: SamplingArgs;
  /** Tasks to run (after shuffling); ≤ 0 means all. */
  numTasks?: number;
  /** Episodes per task (for single-agent: rollouts per task). Default 1. */
  rolloutsPerTask?: number;
  /** Episodes in flight. Default 4. */
  maxConcurrent?: number;
  /** Shuffle tasks with this seed before selecting. */
  shuffleSeed?: number | null;
  /** Only these task keys. */
  ids?: string[];
  /** Run directory for traces.jsonl / metadata.json; nothing saved when absent. */
  runDir?: string | null;
  runId: string;
  resume?: boolean;
  /**
   * Judges (`[[env.judges]]`, `[env.taskset.task] judges`): they score every trainable trace
   * after the task's own rewards.
   */
  judges?: Judge[];
  /** `[[env.toolsets]]`: MCP toolsets offered to every trainable agent, opened per rollout. */
  toolsets?: ToolsetSpec[];
  /** `[env.services] compose`: the Compose file of tasks without services of their own. */
  services?: string;
  /** Where Compose specs are parsed (the CLI's, which checked the file); default one for this run. */
  composeCache?: ComposeCache;
  /**
   * Task-config keys every task must have received (plugged `rewards`, `metrics`, `stops`):
   * a taskset that does not pass its task config to its tasks would drop them silently.
   */
  requireTaskConfig?: string[];
  /**
   * Fork-per-group: each task's first rollout runs setup and snapshots its sandbox, the
   * others start from the snapshot (Docker). Default {@link Taskset.forkGroup}.
   */
  forkGroup?: boolean;
  /** Called with each trainable trace as its episode is written. */
  onTrace?: (trace: TaskTrace, done: number, total: number) => void;
  /** The reward a rollout reaches to count as passed in pass@k; default 0.5. */
  passThreshold?: number;
  /** Called with each episode as it is written (`done` counts episodes). */
  onEpisode?: (episode: Episode, done: number, total: number) => void;
  signal?: AbortSignal;
  /** Asked before each episode starts (`--max-cost`); told when one finishes. */
  gate?: StartGate;
  /**
   * `vf ctl`: interrupts episodes back to the queue (`pause --now`) and requeues errored ones,
   * whose new line replaces the old (readers keep the latest per task and index).
   */
  steering?: RunSteering;
  /** Workers started, when a gate bounds what runs below it; default `maxConcurrent`. */
  workers?: number;
  /**
   * Write each trace's token data (the `token_ids`/`mask`/`logprobs` of its message graph,
   * from `return_token_ids`) to `traces.jsonl` too; it is large. Without it a trace's `nodes`
   * are written only when its history was rewritten (more than one branch), and then without
   * token data. The returned traces keep it either way. Default false.
   */
  saveTokens?: boolean;
}

/**
 * The episodes of a run directory, latest per (task, episode index); single-agent lines come
 * back as one-trace episodes. Corrupt lines, and lines without the fields the run's readers
 * rely on ({@link traceLineProblem}), are skipped with a warning naming file and line.
 */
export async function loadEpisodes(runDir: string): Promise<Episode[]> {
  const latest = new Map<string, Episode>();
  const path = join(runDir, "traces.jsonl");
  for (const line of await readJsonLines<unknown>(path, { check: traceLineProblem })) {
    const episode = episodeOfLine(line);
    if (episode) latest.set(`${episode.task.key}#${episode.episode_index}`, episode);
  }
  return [...latest.values()];
}

/** Every trace of a run directory's latest episodes (see {@link loadEpisodes}). */
export async function loadTraces(runDir: string): Promise<TaskTrace[]> {
  return (await loadEpisodes(runDir)).flatMap((e) => e.traces);
}

/**
 * What a run's averages are taken over: each episode's trainable traces, where an episode
 * that failed as a whole leaves every one unscored (an `env` error), and an episode with no
 * trainable trace counts as one unscored rollout.
 */
export function scoredTraces(episodes: Episode[]): TaskTrace[] {
  const out: TaskTrace[] = [];
  for (const e of episodes) {
    const own = e.traces.filter((t) => t.trainable !== false);
    const failure = e.errors[0] ??
      (own.length === 0
        ? {
          ...serializeError(new EnvError(`Episode of "${e.task.key}" has no trainable trace`)),
          phase: "env",
        }
        : undefined);
    if (own.length === 0 && failure) {
      out.push({
        task: e.task,
        example_id: e.example_id,
        rollout_index: e.episode_index,
        reward: null,
        rewards: {},
        metrics: {},
        ok: false,
        error: { ...failure },
        model_calls: [],
        usage: { input_tokens: 0, output_tokens: 0 },
      } as unknown as TaskTrace);
      continue;
    }
    for (const t of own) {
      out.push(failure && !t.error ? { ...t, error: { ...failure }, reward: null } : t);
    }
  }
  return out;
}

function usageByRole(episodes: Episode[]): TaskRunSummary["usage_by_role"] {
  const out: NonNullable<TaskRunSummary["usage_by_role"]> = {};
  for (const t of episodes.flatMap((e) => e.traces)) {
    const u = (out[t.role ?? "agent"] ??= { input_tokens: 0, output_tokens: 0 });
    u.input_tokens += t.usage.input_tokens;
    u.output_tokens += t.usage.output_tokens;
  }
  return Object.keys(out).length > 1 ? out : undefined;
}

/**
 * A judge's reward key must not be one of the task's own rewards (one would overwrite the
 * other in `rewards`).
 * @throws {ConfigError}
 */
function requireDistinctRewardKeys(task: Task, judges: Judge[]): void {
  const own = new Set(task.scoreHooks().filter((h) => h.kind === "reward").map((h) => h.name));
  const clash = judges.find((j) => own.has(j.name));
  if (clash) {
    throw new ConfigError(
      `Judge "${clash.name}" has the name of a reward of task "${task.key}"; give the judge another name`,
    );
  }
}

/** Select tasks: ids filter, seeded shuffle, then the first n. */
export async function selectTasks(
  taskset: Taskset,
  options: { numTasks?: number; shuffleSeed?: number | null; ids?: string[] },
): Promise<Task[]> {
  const needAll = options.shuffleSeed !== undefined && options.shuffleSeed !== null ||
    options.ids?.length;
  let tasks = await taskset.tasks(
    needAll ? -1 : options.numTasks && options.numTasks > 0 ? options.numTasks : -1,
  );
  if (options.ids?.length) {
    const want = new Set(options.ids);
    const missing = options.ids.filter((id) => !tasks.some((t) => t.key === id));
    if (missing.length) {
      throw new ConfigError(
        `Unknown task id${missing.length > 1 ? "s" : ""}: ${missing.join(", ")}`,
      );
    }
    tasks = tasks.filter((t) => want.has(t.key));
  }
  if (options.shuffleSeed !== undefined && options.shuffleSeed !== null) {
    tasks = seededShuffle(tasks, options.shuffleSeed);
  }
  if (options.numTasks && options.numTasks > 0) tasks = tasks.slice(0, options.numTasks);
  return tasks;
}

/**
 * A dedicated ssh host is one sandbox: sandboxes on it take turns (a grader on the agent's
 * host waits until the agent has handed it back), so each dedicated host serves one rollout
 * at a time. Refuse before the run starts what its hosts cannot serve, instead of letting
 * rollouts fail one by one: more rollouts at once than one, on the agent's host or on a
 * grading host of its own, or a warm sandbox that would sit on the host the next one waits for.
 * @param options.tasks the run's tasks, whose own `scoring` may put graders on a dedicated host
 * @param options.role the role whose policy this is, for messages; default `agent`
 * @throws {ConfigError}
 */
export function requireIsolatableConcurrency(
  policy: Pick<AgentPolicy, "runtime" | "scoring">,
  maxConcurrent: number,
  options: { tasks?: Task[]; role?: string } = {},
): void {
  type Host = {
    type?: string;
    dedicated?: boolean;
    host?: string;
    port?: number;
    user?: string;
    warm_pool?: number;
  };
  const role = options.role ?? "agent";
  const dedicated = (r: Host) => traitsOfConfig(r).dedicated;
  const turns = (r: Host, field: string, what: string) => {
    if (maxConcurrent <= 1) return;
    throw new ConfigError(
      `${field}: ssh host "${r.host}" is dedicated, so it holds one sandbox at a time and ` +
        `${what}; run with -c 1 (max_concurrent = 1), got ${maxConcurrent}`,
    );
  };
  const agent = policy.runtime as Host;
  if (dedicated(agent)) {
    turns(agent, `env.${role}.runtime`, "rollouts on it at once would share its files");
    if ((agent.warm_pool ?? 0) > 0) {
      throw new ConfigError(
        `env.${role}.runtime: ssh host "${agent.host}" is dedicated, so it cannot keep warm ` +
          `sandboxes beside the one in use; remove warm_pool`,
      );
    }
  }
  // Graders: the run's scoring.runtime over each isolated task's own, over the agent's runtime.
  const tasks: Array<Task | null> = options.tasks?.length ? options.tasks : [null];
  for (const task of tasks) {
    const scoring = { ...(task?.data.scoring ?? {}), ...(policy.scoring ?? {}) };
    if (scoring.mode !== "isolated") continue;
    const grader = { ...policy.runtime, ...(scoring.runtime ?? {}) } as Host;
    if (!dedicated(grader)) continue;
    const field = policy.scoring?.runtime || !task
      ? `env.${role}.scoring.runtime`
      : `task "${task.key}" scoring.runtime`;
    const agentsHost = dedicated(agent) && grader.host === agent.host &&
      grader.port === agent.port && grader.user === agent.user;
    if (agentsHost && (grader.warm_pool ?? 0) > 0) {
      throw new ConfigError(
        `${field}: ssh host "${grader.host}" is dedicated and holds the agent's sandboxes too, ` +
          `so it cannot keep a warm grading sandbox: an idle one would hold the host the next ` +
          `agent waits for; remove warm_pool, or give the grader a host of its own`,
      );
    }
    if (!agentsHost) turns(grader, field, "grades one rollout at a time");
  }
}

/** The model failures that end a run: no later rollout could reach the model either. */
const FATAL_MODEL_ERRORS = ["AuthenticationError", "EndpointUnreachableError"];

/** Run episodes of an Env over a taskset; lines are appended as episodes finish. */
export async function runTaskset(
  options: RunTasksetOptions,
): Promise<{ traces: TaskTrace[]; episodes: Episode[]; summary: TaskRunSummary }> {
  const env = options.env ?? defaultEnv(options);
  const tasks = await selectTasks(options.taskset, options);
  checkTasks(tasks, env, options);
  const r = Math.max(1, options.rolloutsPerTask ?? 1);
  const done = await resumedEpisodes(env, options);
  const jobs: Job[] = [];
  for (const task of tasks) {
    for (let i = 0; i < r; i++) if (!done.has(`${task.key}#${i}`)) jobs.push({ task, index: i });
  }
  if (options.runDir) await mkdir(options.runDir, { recursive: true });
  // Shared toolsets: opened once, before any rollout, for every rollout of the run.
  const sharedSpecs = (options.toolsets ?? []).filter((t) => t.shared);
  const sharedTools = sharedSpecs.length
    ? await Toolbox.open(sharedSpecs, {
      state: {},
      run: options.runId,
      signal: options.signal,
    })
    : undefined;
  try {
    await env.start();
  } catch (error) {
    await sharedTools?.close();
    throw error;
  }
  const episodes: Episode[] = [...done.values()];
  // Each group (a task, a role) has r rollouts: a leader and r − 1 members.
  const forks = (options.forkGroup ?? options.taskset.forkGroup)
    ? new GroupForks({ members: r - 1 })
    : undefined;
  const writer = new EpisodeWriter(env, options);
  let fatal: unknown = null;
  try {
    fatal = await runJobs(jobs, {
      env,
      options,
      episodes,
      writer,
      total: tasks.length * r,
      written: episodes.length,
      episode: { sharedTools, forks, composeCache: options.composeCache ?? new ComposeCache() },
    });
  } finally {
    try {
      await writer.settled(); // a write that failed is already the run's error
    } finally {
      await env.stop();
      await sharedTools?.close();
      await forks?.close();
    }
  }
  const scored = scoredTraces(episodes);
  const summary = summarize(scored, episodes, { env, tasks, r, options });
  if (options.runDir) await writeJsonAtomic(join(options.runDir, "metadata.json"), summary);
  if (fatal) throw fatal;
  if (options.signal?.aborted) throw options.signal.reason;
  episodes.sort((a, b) => a.example_id - b.example_id || a.episode_index - b.episode_index);
  const traces = episodes.flatMap((e) => e.traces);
  assignAdvantages(traces, scored);
  return { traces, episodes, summary };
}

/** One episode to run: a task and its episode index. */
interface Job {
  task: Task;
  index: number;
}

/**
 * Before anything starts: each task received the task config its plugged hooks need, can be
 * scored, shares no reward name with a judge, and each role's runtime can serve the run's
 * concurrency.
 * @throws {ConfigError}
 */
function checkTasks(tasks: Task[], env: Env, options: RunTasksetOptions): void {
  for (const task of tasks) {
    const dropped = (options.requireTaskConfig ?? []).filter((k) => !(k in task.config));
    if (dropped.length) {
      throw new ConfigError(
        `env.taskset.task.${dropped[0]}: task "${task.key}" of taskset "${options.taskset.id}" ` +
          `did not receive the task config, so its plugged ${dropped.join(", ")} would be ` +
          `ignored; the taskset must pass this.config.task to each Task`,
      );
    }
    requireRewards(task, { judges: options.judges?.length ?? 0 });
    requireDistinctRewardKeys(task, options.judges ?? []);
  }
  for (const role of Object.values(env.roles)) {
    requireIsolatableConcurrency(role.policy, options.maxConcurrent ?? 4, {
      tasks,
      role: role.name,
    });
  }
}

/** A resumed run's complete episodes by `task#index`; torn last lines are repaired first. */
async function resumedEpisodes(
  env: Env,
  options: RunTasksetOptions,
): Promise<Map<string, Episode>> {
  const done = new Map<string, Episode>();
  if (!options.resume || !options.runDir) return done;
  await repairTrailingLine(join(options.runDir, "traces.jsonl"));
  // A torn record would swallow the start of the next one appended after it.
  await repairTrailingLine(join(options.runDir, "record.jsonl"));
  for (const e of await loadEpisodes(options.runDir)) {
    if (env.complete(e)) done.set(`${e.task.key}#${e.episode_index}`, e);
  }
  return done;
}

/**
 * Writes each finished episode to the run directory, one write at a time: its line to
 * `traces.jsonl` (token data left out unless `saveTokens`) after its sandbox records to
 * `record.jsonl`.
 */
class EpisodeWriter {
  #queue = Promise.resolve();
  #env: Env;
  #options: RunTasksetOptions;

  constructor(env: Env, options: RunTasksetOptions) {
    this.#env = env;
    this.#options = options;
  }

  write(episode: Episode, sandboxes: Map<TaskTrace, RolloutRecord>): Promise<void> {
    for (const t of episode.traces) t.model_retries = modelRetries(t);
    const flat = this.#env.flat ? flatTrace(episode) : null;
    const runDir = this.#options.runDir;
    if (!runDir) return Promise.resolve();
    let line: TaskTrace | Episode = flat ?? episode;
    if (!this.#options.saveTokens) {
      line = flat ? withoutTokens(flat) : { ...episode, traces: episode.traces.map(withoutTokens) };
    }
    // What a replay needs of each rollout's sandboxes goes beside the traces.
    const records = episode.traces.flatMap((t) => {
      const record = sandboxes.get(t);
      return record
        ? [JSON.stringify({
          format_version: 1,
          trace_id: t.trace_id,
          task: t.task.key,
          rollout_index: t.rollout_index,
          role: t.role,
          sandboxes: record.sandboxes,
          tools: record.tools,
        })]
        : [];
    });
    const write = this.#queue.then(async () => {
      if (records.length) await appendFile(join(runDir, "record.jsonl"), records.join("\n") + "\n");
      await appendFile(join(runDir, "traces.jsonl"), JSON.stringify(line) + "\n");
    });
    this.#queue = write.catch(() => {});
    return write;
  }

  /** Resolves once every write has ended, failed ones included. */
  settled(): Promise<void> {
    return this.#queue.catch(() => {});
  }
}

/**
 * Runs the jobs on `maxConcurrent` workers until they are done, the run is aborted, or one
 * fails in a way that ends the run; returns that failure (null when none did).
 */
async function runJobs(
  jobs: Job[],
  run: {
    env: Env;
    options: RunTasksetOptions;
    episodes: Episode[];
    writer: EpisodeWriter;
    total: number;
    written: number;
    episode: Pick<Parameters<typeof runEpisode>[2], "sharedTools" | "forks" | "composeCache">;
  },
): Promise<unknown> {
  const { env, options, episodes, writer, total } = run;
  const controller = new AbortController();
  const outer = options.signal;
  outer?.addEventListener("abort", () => controller.abort(outer.reason), { once: true });
  let written = run.written;
  let fatal: unknown = null;
  const steering = options.steering;
  /** The run's signal joined with the steering's current interrupt (one per pause --now). */
  let joined: { interrupt: AbortSignal; signal: AbortSignal } | null = null;
  const signalOf = (interrupt: AbortSignal | undefined): AbortSignal => {
    if (!interrupt) return controller.signal;
    if (joined?.interrupt !== interrupt) {
      joined = { interrupt, signal: AbortSignal.any([controller.signal, interrupt]) };
    }
    return joined.signal;
  };
  /** Errored episodes by `task#index`, for a requeue; and those a requeue sent back. */
  const errored = new Map<string, { job: Job; episode: Episode }>();
  const retrying = new Map<Job, Episode>();
  const failed = (e: Episode) => e.errors.length > 0 || e.traces.some((t) => t.error);
  const runJob = async (
    job: Job,
  ): Promise<{ ok: boolean; latencyMs?: number } | "interrupted" | "stop"> => {
    let episode: Episode | undefined;
    const sandboxes = new Map<TaskTrace, RolloutRecord>();
    const interrupt = steering?.interrupt;
    let interrupted = false;
    try {
      const run1 = () =>
        runEpisode(env, job.task, {
          tasksetId: options.taskset.id,
          runId: options.runId,
          episodeIndex: job.index,
          signal: signalOf(interrupt),
          judges: options.judges,
          toolsets: options.toolsets,
          services: options.services,
          ...run.episode,
          onRecord: (trace, record) => sandboxes.set(trace, record),
        });
      episode = await (steering?.track?.(`${job.task.key}#${job.index}`, run1, {
        exampleId: job.task.data.idx ?? 0,
        rolloutIndex: job.index,
      }) ?? run1());
      interrupted = Boolean(interrupt?.aborted) && !controller.signal.aborted;
    } catch (error) {
      interrupted = Boolean(interrupt?.aborted) && !controller.signal.aborted;
      if (!interrupted && !controller.signal.aborted) {
        fatal = error;
        controller.abort(error);
      }
      if (!interrupted) return "stop";
    }
    // `vf ctl pause --now`: back to the front of the queue, neither written nor counted.
    if (interrupted || !episode) return "interrupted";
    const modelError = episode.traces.find((t) =>
      t.error?.error && FATAL_MODEL_ERRORS.includes(t.error.error)
    );
    if (modelError) fatal = new ConfigError(modelError.error!.message);
    const replaced = retrying.get(job);
    if (replaced) {
      // A requeued episode takes its errored one's place: counted once, its line later.
      retrying.delete(job);
      episodes.splice(episodes.indexOf(replaced), 1, episode);
    } else episodes.push(episode);
    if (steering && failed(episode)) {
      errored.set(`${job.task.key}#${job.index}`, { job, episode });
    }
    try {
      await writer.write(episode, sandboxes);
      // Counted as each is written: episodes.length has grown by the time this runs when
      // several finish at once, and every line said "4/4".
      const done = replaced ? written : ++written;
      options.onEpisode?.(episode, done, total);
      if (options.onTrace) {
        for (const t of scoredTraces([episode])) options.onTrace(t, done, total);
      }
    } catch (error) {
      // Results can no longer be written (disk full, permissions): stop every worker.
      if (!fatal) fatal = error;
      controller.abort(error);
      return "stop";
    }
    if (modelError) {
      controller.abort(fatal);
      return "stop";
    }
    // What the gate hears: infrastructure errors and slow sandbox starts back a limit off.
    const starts = episode.traces.map((t) => t.timing?.sandbox_ms).filter((n): n is number =>
      typeof n === "number"
    );
    return {
      ok: !episode.traces.some((t) => t.error?.infra),
      latencyMs: starts.length ? Math.max(...starts) : undefined,
    };
  };
  // Workers that found the queue empty have ended; a requeue starts new ones up to the limit.
  const pool = new WorkerPool(jobs, {
    workers: Math.max(1, options.workers ?? options.maxConcurrent ?? 4),
    signal: controller.signal,
    gate: options.gate,
    onInterrupted: () => steering?.interrupted(1),
    run: runJob,
  });
  steering?.planned?.(total, written);
  steering?.onRequeue(() => {
    if (!pool.open) return 0;
    const again = [...errored.values()];
    errored.clear();
    for (const { job, episode } of again) retrying.set(job, episode);
    pool.requeue(again.map((a) => a.job));
    return again.length;
  });
  await pool.run();
  return fatal;
}

/** The run's summary over its scored traces, with its episodes' counts and usage by role. */
function summarize(
  scored: TaskTrace[],
  episodes: Episode[],
  run: { env: Env; tasks: Task[]; r: number; options: RunTasksetOptions },
): TaskRunSummary {
  const { options } = run;
  const perTask = new Map<string, number>();
  for (const t of scored) perTask.set(t.task.key, (perTask.get(t.task.key) ?? 0) + 1);
  const summary = summarizeTraces(scored, {
    run_id: options.runId,
    taskset: options.taskset.id,
    model: options.model,
    env_id: run.env.id,
    num_tasks: run.tasks.length,
    rollouts_per_task: Math.max(run.r, ...perTask.values()),
  }, { passThreshold: options.passThreshold });
  summary.num_episodes = episodes.length;
  summary.num_failed_episodes = episodes.filter((e) => e.errors.length > 0).length;
  summary.usage_by_role = usageByRole(episodes);
  if (!summary.usage_by_role) delete summary.usage_by_role;
  return summary;
}

/**
 * Group advantages per task and role over the trainable traces a run returns, resumed ones
 * included (lines already written stay as they were: a group is complete only now).
 */
function assignAdvantages(traces: TaskTrace[], scored: TaskTrace[]): void {
  const unscored = new Set(scored.filter((t) => t.error).map((t) => t.trace_id));
  const groups = new Map<string, TaskTrace[]>();
  for (const t of traces) {
    if (t.trainable === false) continue;
    const key = `${t.role ?? "agent"}\0${t.task.key}`;
    groups.set(key, [...(groups.get(key) ?? []), t]);
  }
  for (const group of groups.values()) {
    const rewards = group.map((t) => (t.error || unscored.has(t.trace_id) ? null : t.reward));
    groupAdvantages(rewards).forEach((a, i) => (group[i].advantage = a));
  }
}

/**
 * The trace as written without `save_tokens`: no token data, and `nodes` only when the
 * history was rewritten (a resumed or inspected run needs its branches). A shallow copy.
 */
function withoutTokens(trace: TaskTrace): TaskTrace {
  if (!trace.nodes) return trace;
  const { nodes, ...rest } = trace;
  if (new MessageGraph(nodes).leaves().length < 2) return rest as TaskTrace;
  const bare = nodes.map(({ token_ids: _ids, mask: _mask, logprobs: _logprobs, ...node }) => node);
  return { ...rest, nodes: bare } as TaskTrace;
}

function defaultEnv(options: RunTasksetOptions): Env {
  if (!options.policy || !options.client) {
    throw new TypeError("runTaskset() needs an env, or a policy and a client for a single agent");
  }
  const { harness, ...policy } = options.policy;
  return new SingleAgentEnv({
    id: "single-agent",
    roles: {
      agent: {
        name: "agent",
        client: options.client,
        model: options.model,
        samplingArgs: options.samplingArgs,
        harness,
        policy,
      },
    },
  });
}
