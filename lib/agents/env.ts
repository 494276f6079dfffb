/**
 * The Env layer: an {@link Env} decides how the agents of one episode work on a task (one
 * agent, n attempts, a solver and its judge, an assistant and a simulated user, a game), and
 * {@link runEpisode} runs it: fresh per-role agents, `setup` → `run` under `timeout.episode`,
 * `finalize` under `timeout.finalize`, and an {@link Episode} holding every trace.
 *
 * ```ts
 * class Debate extends Env {
 *   static override roles = { pro: {}, con: {} };
 *   async run(task: Task, agents: Agents) {
 *     await using pro = await agents.pro.interaction(task);
 *     await using con = await agents.con.interaction(task, { promptless: true });
 *     const opening = await pro.turn();
 *     await con.turn(opening.lastReply);
 *   }
 * }
 * ```
 * @module
 */
import type { z } from "npm:zod@^4.6.0";
import { EnvError, JudgeVerdictError, type SerializedError, serializeError } from "../errors.ts";
import { Semaphore } from "../model/limits.ts";
import type { ComposeCache } from "../services/cache.ts";
import type { Task } from "../tasks/task.ts";
import { type TaskTrace, TRACE_FORMAT_VERSION } from "../tasks/trace.ts";
import type { RolloutRecord } from "../tasks/rollout/mod.ts";
import { type AgentRole, EpisodeAgent, type EpisodeScope, type Interaction } from "./agent.ts";

/** Version of episode lines in `traces.jsonl`. */
export const EPISODE_FORMAT_VERSION = 2;

/** The agents of one episode, by role. */
export type Agents = Record<string, EpisodeAgent>;

/** An error of the episode itself (not of one agent's run). */
export type EpisodeError = SerializedError & { phase: string };

/** One task's episode: every agent's trace, in completion order. One line of `traces.jsonl`. */
export interface Episode {
  format_version: number;
  kind: "episode";
  episode_id: string;
  run_id: string;
  env_id: string;
  taskset: string;
  task: { key: string; idx: number; hash: string };
  example_id: number;
  episode_index: number;
  /** Every trace ok and no error of the episode's own. */
  ok: boolean;
  /**
   * Failures of the Env's own setup, run or finalize (phase `env`), and timeouts; a judge's
   * that gave no verdict (a `JudgeVerdictError`) is in phase `judge`.
   */
  errors: EpisodeError[];
  traces: TaskTrace[];
  timing: { started_at: number; total_ms?: number };
}

/** What an Env is built from (the CLI resolves it from `[env]`; code may build it directly). */
export interface EnvInit {
  /** The id the run was asked for (a built-in name, a path or a URL). */
  id: string;
  /** The Env's validated `[env]` options (its own fields plus `timeout`, `max_concurrent_agents`). */
  options?: Record<string, unknown>;
  /** Every declared role, resolved. */
  roles: Record<string, AgentRole>;
  /** Where relative paths in the options (rubric files) are read from; default the cwd. */
  baseDir?: string;
}

/**
 * An environment over tasks: how the agents of one episode work on a task. Subclass it,
 * declare the roles (their default agent configs) and, when needed, extra `[env]` options;
 * implement {@link Env.run}.
 */
export abstract class Env {
  /**
   * Roles and their default agent configs (the `[env.<role>]` table's snake_case keys):
   * `--env.<role>.*` is deep-merged over these.
   */
  static roles: Record<string, Record<string, unknown>> = { agent: {} };
  /** Extra `[env]` fields this Env accepts, as zod schemas (all optional or defaulted). */
  static options: Record<string, z.ZodType> = {};
  readonly id: string;
  readonly options: Record<string, unknown>;
  readonly roles: Record<string, AgentRole>;
  readonly baseDir: string;

  constructor(init: EnvInit) {
    this.id = init.id;
    this.options = init.options ?? {};
    this.roles = init.roles;
    this.baseDir = init.baseDir ?? ".";
    const declared = Object.keys((this.constructor as typeof Env).roles);
    const missing = declared.filter((r) => !init.roles[r]);
    if (missing.length) {
      throw new TypeError(
        `Env "${this.id}" needs role${missing.length > 1 ? "s" : ""} ${
          missing.map((r) => `"${r}"`).join(", ")
        }`,
      );
    }
  }

  /** Once per episode, before `run`: e.g. mark a judge untrainable. */
  setup(_agents: Agents): void | Promise<void> {}

  /**
   * The episode's control flow: run agents on the task. Each finished run joins the episode
   * by itself; a failed run is data on its trace, a throw fails the episode.
   */
  abstract run(task: Task, agents: Agents): Promise<void>;

  /**
   * Judgement across the episode's traces, after every sandbox is gone: read `trace.info`,
   * write rewards and metrics onto the traces. A throw fails the episode.
   */
  finalize(_task: Task, _episode: Episode): void | Promise<void> {}

  /** Whether `--resume` keeps this episode; default: it is ok. */
  complete(episode: Episode): boolean {
    return episode.ok;
  }

  /** Shared resources for the whole run, created before the first episode. */
  start(): void | Promise<void> {}

  /** Releases what {@link Env.start} made; must tolerate a partial start. */
  stop(): void | Promise<void> {}

  /** Whether an episode is written as its one trace (the single-agent line shape). */
  get flat(): boolean {
    return false;
  }
}

/** Options of {@link runEpisode}. */
export interface RunEpisodeOptions {
  tasksetId: string;
  runId: string;
  episodeIndex?: number;
  signal?: AbortSignal;
  /** The run's configured judges: they score every run of a trainable role. */
  judges?: EpisodeScope["judges"];
  /** The run's toolsets: offered to every run of a trainable role. */
  toolsets?: EpisodeScope["toolsets"];
  /** The run's shared toolsets, open for the whole run. */
  sharedTools?: EpisodeScope["sharedTools"];
  /** The run's Compose file (`[env.services] compose`). */
  services?: string;
  /** Where Compose specs are parsed, once for every episode sharing it; default each rollout's own. */
  composeCache?: ComposeCache;
  /** The run's fork groups (`fork_group`): trainable roles' rollouts of a task share one setup. */
  forks?: EpisodeScope["forks"];
  /**
   * Told, as each trace joins the episode, what its sandboxes and toolsets did (what a run
   * writes to `record.jsonl` for `vf replay`); not called for a trace that used neither.
   */
  onRecord?: (trace: TaskTrace, record: RolloutRecord) => void;
}

/** Race `fn` against a limit in seconds; the inner signal aborts when the limit passes. */
async function within<T>(
  what: string,
  seconds: number | undefined,
  outer: AbortSignal | undefined,
  fn: (signal: AbortSignal | undefined) => Promise<T>,
): Promise<T> {
  if (!seconds) return await fn(outer);
  // The timer aborts with an EnvError: agent runs cut short by it record it on their traces.
  const timer = new AbortController();
  const handle = setTimeout(
    () => timer.abort(new EnvError(`The episode's ${what} timed out after ${seconds}s`)),
    seconds * 1000,
  );
  const signal = outer ? AbortSignal.any([outer, timer.signal]) : timer.signal;
  let onAbort = () => {};
  const expired = new Promise<never>((_, reject) => {
    onAbort = () => reject(signal.reason);
    signal.addEventListener("abort", onAbort, { once: true });
  });
  expired.catch(() => {});
  const work = fn(signal);
  try {
    return await Promise.race([work, expired]);
  } catch (error) {
    // Let the aborted work wind down (its sandboxes stop) before the episode is written;
    // work that ignores the signal gets 30 s.
    let grace: ReturnType<typeof setTimeout> | undefined;
    await Promise.race([
      work.catch(() => {}),
      new Promise((r) => (grace = setTimeout(r, 30_000))),
    ]);
    clearTimeout(grace);
    // Whatever the cut-short work threw, the episode's error is the timeout.
    if (timer.signal.aborted && !outer?.aborted) throw timer.signal.reason;
    throw error;
  } finally {
    clearTimeout(handle);
    signal.removeEventListener("abort", onAbort);
  }
}

/**
 * Run one episode of `env` on `task`: fresh agents, `setup` and `run` under
 * `timeout.episode`, `finalize` under `timeout.finalize`. Failures of the Env itself are
 * recorded in `episode.errors`; only an interrupt (the signal) throws.
 */
export async function runEpisode(
  env: Env,
  task: Task,
  options: RunEpisodeOptions,
): Promise<Episode> {
  const t0 = performance.now();
  const episode: Episode = {
    format_version: EPISODE_FORMAT_VERSION,
    kind: "episode",
    episode_id: crypto.randomUUID(),
    run_id: options.runId,
    env_id: env.id,
    taskset: options.tasksetId,
    task: { key: task.key, idx: task.data.idx ?? 0, hash: task.hash },
    example_id: task.data.idx ?? 0,
    episode_index: options.episodeIndex ?? 0,
    ok: false,
    errors: [],
    traces: [],
    timing: { started_at: Date.now() / 1000 },
  };
  const timeouts = (env.options.timeout ?? {}) as { episode?: number; finalize?: number };
  const permits = new Semaphore((env.options.max_concurrent_agents as number | undefined) ?? 1);
  const fail = (phase: string, error: unknown) => {
    if (options.signal?.aborted) throw options.signal.reason;
    episode.errors.push({
      ...serializeError(error instanceof Error ? error : new EnvError(String(error))),
      // A judge that gave no verdict is the judge's failure, whoever's code noticed it.
      phase: error instanceof JudgeVerdictError ? "judge" : phase,
    });
  };
  let ran = false;
  const interactions = new Set<Interaction>();
  try {
    await within("run", timeouts.episode, options.signal, async (signal) => {
      const scope: EpisodeScope = {
        tasksetId: options.tasksetId,
        runId: options.runId,
        episodeIndex: episode.episode_index,
        permits,
        signal,
        onTrace: (trace, record) => {
          trace.episode_id = episode.episode_id;
          scope.traces.add(trace);
          episode.traces.push(trace);
          if (record) options.onRecord?.(trace, record);
        },
        judges: options.judges,
        toolsets: options.toolsets,
        sharedTools: options.sharedTools,
        services: options.services,
        composeCache: options.composeCache,
        forks: options.forks,
        interactions,
        traces: new Set(),
      };
      const agents: Agents = {};
      for (const [name, role] of Object.entries(env.roles)) {
        agents[name] = new EpisodeAgent(role, scope);
      }
      await env.setup(agents);
      await env.run(task, agents);
    });
    ran = true;
  } catch (error) {
    fail("env", error);
  } finally {
    // An Env that left an interaction open (it threw, or forgot): finish it, so its sandbox
    // goes and its trace joins the episode.
    for (const open of [...interactions]) await open.close().catch(() => {});
  }
  if (ran && episode.traces.length === 0) {
    fail("env", new EnvError(`Env "${env.id}" ran no agent on task "${task.key}"`));
  }
  if (ran && episode.errors.length === 0) {
    try {
      await within("finalize", timeouts.finalize, options.signal, async () => {
        await env.finalize(task, episode);
      });
    } catch (error) {
      fail("env", error);
    }
  }
  episode.ok = episode.errors.length === 0 && episode.traces.every((t) => t.ok);
  episode.timing.total_ms = Math.round(performance.now() - t0);
  return episode;
}

/** The single-agent line shape of an episode: its one trace, carrying the episode's errors. */
export function flatTrace(episode: Episode): TaskTrace | null {
  if (episode.traces.length !== 1) return null;
  const trace = episode.traces[0];
  const error = episode.errors[0];
  if (error && !trace.error) {
    trace.ok = false;
    trace.error = { ...error };
  }
  return trace;
}

/**
 * What is wrong with a line of `traces.jsonl` read back (null: nothing): the fields the run's
 * readers (resume, compare, export, replay, rescore) rely on, so a line environment code or a
 * crash left malformed is skipped by file and line instead of failing them with a TypeError.
 */
export function traceLineProblem(line: Record<string, unknown>): string | null {
  if (line.kind === "episode") {
    if (!hasKey(line.task)) return `"task.key" is not a string`;
    if (!Array.isArray(line.traces)) return `"traces" is not a list`;
    if (!Array.isArray(line.errors)) return `"errors" is not a list`;
    for (const [i, t] of line.traces.entries()) {
      const problem = traceProblem(t, `traces[${i}].`);
      if (problem) return problem;
    }
    return null;
  }
  return traceProblem(line, "");
}

const isRecord = (v: unknown): v is Record<string, unknown> =>
  v !== null && typeof v === "object" && !Array.isArray(v);
const hasKey = (task: unknown) => isRecord(task) && typeof task.key === "string";

function traceProblem(t: unknown, at: string): string | null {
  if (!isRecord(t)) return `"${at.slice(0, -1) || "line"}" is not an object`;
  if (typeof t.trace_id !== "string") return `"${at}trace_id" is not a string`;
  if (!hasKey(t.task)) return `"${at}task.key" is not a string`;
  for (const key of ["messages", "model_calls", "tool_calls"]) {
    if (t[key] != null && !Array.isArray(t[key])) return `"${at}${key}" is not a list`;
  }
  const index = t.rollout_index;
  if (index !== undefined && !(Number.isInteger(index) && (index as number) >= 0)) {
    return `"${at}rollout_index" is not a whole number`;
  }
  return null;
}

/**
 * An episode from one line of `traces.jsonl`: an episode line as is, or a single-agent trace
 * line (format 1) wrapped as a one-trace episode. Null for anything else.
 */
export function episodeOfLine(line: unknown): Episode | null {
  const rec = line as Partial<Episode> & Partial<TaskTrace>;
  if (!rec || typeof rec !== "object" || typeof rec.task?.key !== "string") return null;
  if (rec.kind === "episode" && Array.isArray(rec.traces)) return rec as Episode;
  if (typeof rec.trace_id !== "string") return null;
  const trace = rec as TaskTrace;
  return {
    format_version: trace.format_version ?? TRACE_FORMAT_VERSION,
    kind: "episode",
    episode_id: trace.episode_id ?? trace.trace_id,
    run_id: trace.run_id,
    env_id: "single-agent",
    taskset: trace.taskset,
    task: trace.task,
    example_id: trace.example_id,
    episode_index: trace.rollout_index ?? 0,
    ok: trace.ok && !trace.error,
    errors: [],
    traces: [trace],
    timing: { started_at: trace.timing?.started_at ?? 0 },
  };
}
