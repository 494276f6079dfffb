/**
 * What a run of tasks shares: task selection, the summary of its traces (what counts as
 * scored), the configured judges, and `validateTaskset` for `vf validate`. The run itself
 * (episodes of an Env) is `lib/agents/run.ts`.
 * @module
 */
import type { SandboxLimits } from "../../runtimes/limits.ts";
import { type SandboxSource, WarmPool } from "../../runtimes/pool.ts";
import { traitsOfConfig } from "../../runtimes/config.ts";
import { Semaphore } from "../model/limits.ts";
import { isFatalError } from "../envs/environment.ts";
import { ConfigError } from "../errors.ts";
import { seededShuffle } from "../random.ts";
import { type ProbeResult, PROBES, runProbe } from "./probe.ts";
import { passAtK } from "../eval/results.ts";
import {
  requireRewards,
  type Task,
  type TaskHookContext,
  type Taskset,
  type TraceView,
} from "./task.ts";
import {
  type AgentPolicy,
  resolveNetworkPolicy,
  resolveRuntimeSpec,
  type TaskTrace,
} from "./rollout/mod.ts";
import { servicesOf, startChecked } from "./checked.ts";
import { VERSION } from "../version.ts";

/** Aggregates of a task run. */
export interface TaskRunSummary {
  format_version: number;
  run_id: string;
  taskset: string;
  model: string;
  env_id: string;
  num_tasks: number;
  rollouts_per_task: number;
  num_rollouts: number;
  num_errors: number;
  /**
   * Rollouts lost to infrastructure (sandbox, engine, model endpoint) after retries; not in
   * `avg_reward`.
   */
  num_infra_errors: number;
  /**
   * Errored rollouts that were never scored and so are left out of `avg_reward` and pass@k:
   * the infrastructure errors plus failures of the task's own hooks or rewards (phases
   * `config`, `setup`, `finalize`, `scoring`), of a judge (`judge`) or of the episode's Env
   * (`env`). An agent-phase failure is the agent's: it counts.
   */
  num_unscored: number;
  /** Mean reward of the scored rollouts; null when none was scored (see `no_score_reason`). */
  avg_reward: number | null;
  /** Why `avg_reward` is null. */
  no_score_reason?: string;
  avg_rewards: Record<string, number>;
  avg_metrics: Record<string, number>;
  /** pass@k over each task's scored rollouts; unscored ones are left out, as from `avg_reward`. */
  pass_at_k: Record<string, number>;
  /** Rollouts left out of `pass_at_k` and `avg_reward` (`num_unscored`). */
  pass_at_k_excluded: number;
  /** The reward a rollout reaches to count as passed in `pass_at_k` (default 0.5). */
  pass_threshold?: number;
  /** Model requests retried (429, 5xx, timeouts) over the run, summed from the traces. */
  num_model_retries: number;
  /** Tokens of the trainable traces (the agents being evaluated). */
  usage: { input_tokens: number; output_tokens: number };
  /** Tokens the judges' calls used, counted apart from the agents' (present when any judge ran). */
  judge_usage?: { input_tokens: number; output_tokens: number };
  /** Episodes run (each holds one or more traces; a single-agent episode is one rollout). */
  num_episodes?: number;
  /** Episodes that failed as a whole (their Env's run or finalize); none of their traces is scored. */
  num_failed_episodes?: number;
  /** Tokens by role, judges and simulated users included (present when more than one role ran). */
  usage_by_role?: Record<string, { input_tokens: number; output_tokens: number }>;
  vf_version: string;
  date: string;
}

/**
 * The end-of-run summary `vf run` prints: sizes, the reward (or why there is none), errors
 * and what was left unscored, each reward, metric and pass@k, failed episodes, tokens (the
 * agents', by role, the judges').
 */
export function renderTaskSummary(summary: TaskRunSummary): string {
  const lines = [
    `taskset ${summary.taskset}  model ${summary.model}  tasks ${summary.num_tasks}  ` +
    `rollouts/task ${summary.rollouts_per_task}  rollouts ${summary.num_rollouts}`,
    `reward ${
      summary.avg_reward === null
        ? `n/a (${summary.no_score_reason})`
        : summary.avg_reward.toFixed(4)
    }  errors ${summary.num_errors} of ${summary.num_rollouts}${
      summary.num_unscored
        ? ` (${summary.num_unscored} never scored${
          summary.num_infra_errors ? `, ${summary.num_infra_errors} on infrastructure` : ""
        }: left out of reward and pass@k)`
        : ""
    }`,
    // A lone reward named "reward" (Harbor's) is the headline above, not a breakdown of it.
    ...Object.entries(summary.avg_rewards)
      .filter(([k]) => !(k === "reward" && Object.keys(summary.avg_rewards).length === 1))
      .map(([k, v]) => `  reward ${k}: ${v.toFixed(4)}`),
    ...Object.entries(summary.avg_metrics).map(([k, v]) => `  metric ${k}: ${v.toFixed(4)}`),
    ...Object.entries(summary.pass_at_k).map(([k, v]) => `  pass@${k}: ${v.toFixed(3)}`),
    ...(summary.num_failed_episodes
      ? [`episodes failed: ${summary.num_failed_episodes} of ${summary.num_episodes}`]
      : []),
    `tokens: input ${summary.usage.input_tokens}, output ${summary.usage.output_tokens}`,
    ...Object.entries(summary.usage_by_role ?? {}).map(([role, u]) =>
      `  tokens ${role}: input ${u.input_tokens}, output ${u.output_tokens}`
    ),
    ...(summary.judge_usage
      ? [
        `  tokens judges: input ${summary.judge_usage.input_tokens}, output ${summary.judge_usage.output_tokens}`,
      ]
      : []),
    ...(summary.num_model_retries ? [`model retries: ${summary.num_model_retries}`] : []),
  ];
  return lines.join("\n");
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

/** Model requests of a trace that were retried (on calls that succeeded and that failed). */
export function modelRetries(trace: TaskTrace): number {
  return (trace.model_calls ?? []).reduce(
    (n, c) => n + ((c.response as { retries?: number } | null)?.retries ?? c.retries ?? 0),
    0,
  );
}

/**
 * Phases whose failure is the task's, a judge's, the Env's or vf's, never the agent's: the
 * rollout was not scored.
 */
const UNSCORED_PHASES = new Set([
  "config",
  "setup",
  "finalize",
  "scoring",
  "judge",
  "env",
  "stop",
]);

/** An errored trace that was never scored: infrastructure, or the task's own hooks or rewards. */
export function isUnscored(trace: TaskTrace): boolean {
  return Boolean(trace.error && (trace.error.infra || UNSCORED_PHASES.has(trace.error.phase)));
}

/** Summarise traces. */
export function summarizeTraces(
  traces: TaskTrace[],
  base: Pick<
    TaskRunSummary,
    "run_id" | "taskset" | "model" | "env_id" | "num_tasks" | "rollouts_per_task"
  >,
  options: { passThreshold?: number } = {},
): TaskRunSummary {
  const threshold = options.passThreshold ?? 0.5;
  const mean = (xs: number[]) => (xs.length ? xs.reduce((a, b) => a + b, 0) / xs.length : 0);
  const keyed = (pick: (t: TaskTrace) => Record<string, number>) => {
    const acc = new Map<string, number[]>();
    for (const t of traces) {
      for (const [k, v] of Object.entries(pick(t))) acc.set(k, [...(acc.get(k) ?? []), v]);
    }
    return Object.fromEntries([...acc].map(([k, xs]) => [k, mean(xs)]));
  };
  const r = base.rollouts_per_task;
  // Rollouts that were never scored (infrastructure, the task's own hooks or rewards) are not
  // the model's failures: left out of the average and of pass@k alike, never scored 0. pass@k
  // of a task uses the rollouts it has left (n >= k).
  const counted = traces.filter((t) => !isUnscored(t));
  const passAt: Record<string, number> = {};
  if (r > 1) {
    const byTask = new Map<string, TaskTrace[]>();
    for (const t of counted) byTask.set(t.task.key, [...(byTask.get(t.task.key) ?? []), t]);
    for (let k = 1; k <= r; k *= 2) {
      const groups = [...byTask.values()].filter((g) => g.length >= k);
      if (!groups.length) continue;
      passAt[String(k)] = mean(
        groups.map((g) =>
          passAtK(g.length, g.filter((t) => !t.error && (t.reward ?? 0) >= threshold).length, k)
            .pass
        ),
      );
    }
  }
  const infra = traces.filter((t) => t.error?.infra).length;
  const unscored = traces.length - counted.length;
  const inPhases = (phases: string[]) =>
    traces.filter((t) => t.error && !t.error.infra && phases.includes(t.error.phase)).length;
  const blame = [
    `${infra} failed on infrastructure`,
    `${inPhases(["config", "setup", "finalize", "scoring"])} in the task's own hooks or rewards`,
    ...[["judge", "in judges"], ["env", "in the env's own code"], ["stop", "in stop conditions"]]
      .map(([phase, where]) => [inPhases([phase]), where] as const)
      .filter(([n]) => n > 0).map(([n, where]) => `${n} ${where}`),
  ];
  return {
    format_version: 1,
    ...base,
    num_rollouts: traces.length,
    num_errors: traces.filter((t) => t.error).length,
    num_infra_errors: infra,
    num_unscored: unscored,
    avg_reward: counted.length ? mean(counted.map((t) => t.reward ?? 0)) : null,
    ...(counted.length ? {} : {
      no_score_reason: !traces.length
        ? "no rollout ran"
        : infra === traces.length
        ? `every rollout (${traces.length}) failed on infrastructure`
        : `no rollout (of ${traces.length}) was scored: ${blame.join(", ")}`,
    }),
    avg_rewards: keyed((t) => t.rewards),
    avg_metrics: keyed((t) => t.metrics),
    pass_at_k: passAt,
    pass_at_k_excluded: unscored,
    pass_threshold: threshold,
    num_model_retries: traces.reduce((n, t) => n + modelRetries(t), 0),
    usage: {
      input_tokens: traces.reduce((a, t) => a + t.usage.input_tokens, 0),
      output_tokens: traces.reduce((a, t) => a + t.usage.output_tokens, 0),
    },
    ...(traces.some((t) => t.judge_usage) && {
      judge_usage: {
        input_tokens: traces.reduce((a, t) => a + (t.judge_usage?.input_tokens ?? 0), 0),
        output_tokens: traces.reduce((a, t) => a + (t.judge_usage?.output_tokens ?? 0), 0),
      },
    }),
    vf_version: VERSION,
    date: new Date().toISOString(),
  };
}

/** One task's validation result. */
export interface ValidationResult {
  task: string;
  idx: number;
  gold_reward: number | null;
  empty_reward: number | null;
  ok: boolean;
  error: string | null;
  /** With `probe`: what each integrity probe earned (any reward above 0 fails the task). */
  probes?: ProbeResult[];
}

/**
 * Per task: the gold answer (via `validate`) must score 1.0 and an untouched workspace 0.0.
 * With `limits`, every sandbox it starts (agents, services, graders, probes) counts against
 * them, as in a run.
 */
export async function validateTaskset(
  taskset: Taskset,
  options: {
    numTasks?: number;
    runtime: AgentPolicy["runtime"];
    runId: string;
    maxConcurrent?: number;
    signal?: AbortSignal;
    /** Also run the integrity probes (PROBES) against each task's grader. */
    probe?: boolean;
    /** Sandbox limits (`--limits.max_sandboxes`, `--limits.sandbox_create_rate`). */
    limits?: SandboxLimits;
  },
): Promise<ValidationResult[]> {
  const tasks = await taskset.tasks(
    options.numTasks && options.numTasks > 0 ? options.numTasks : -1,
  );
  for (const task of tasks) requireRewards(task);
  const sandboxes = options.limits
    ? new WarmPool({ size: 0, runId: options.runId, limits: options.limits })
    : undefined;
  try {
    const budget = await sandboxBudget(tasks, options);
    return await validateTasks(tasks, { ...options, sandboxes, budget });
  } finally {
    await sandboxes?.close();
  }
}

/** The sandboxes a check may hold at once, taken before it starts (see `sandboxBudget`). */
interface SandboxBudget {
  /** Waits for the check's share of the limit; returns its release. */
  take(task: Task, gold: boolean): Promise<() => void>;
  /**
   * Null when the check's share covers a grader beside its own sandbox; else why a grader
   * cannot start (its own sandbox and the grader together exceed the limit).
   */
  graderRefusal(task: Task): string | null;
}

/**
 * How many sandboxes each check of a task holds at once, under a live-sandbox limit. A gold
 * check may hold its agent's sandbox while `gradeSubmission` waits for a fresh grader (one
 * sandbox, without services): each check takes its whole share (its sandbox with its services
 * and relay, and for a gold check one grader of the same runtime type) before it starts, so
 * that wait always ends (two checks each holding an agent and waiting for a grader would wait
 * forever). A share larger than the limit is capped at it: such a check runs alone, and a
 * grader it asks for is refused with the reason.
 */
async function sandboxBudget(
  tasks: Task[],
  options: { runtime: AgentPolicy["runtime"]; limits?: SandboxLimits },
): Promise<SandboxBudget | null> {
  const type = (options.runtime as { type?: string }).type ?? "docker";
  const max = options.limits?.for(type).limit.maxLive;
  if (max === undefined) return null;
  // Per task: its sandbox, each Compose service and a network policy's relay, as a rollout's;
  // and whether gradeSubmission's grader (the task's scoring.runtime) counts against the limit.
  const own = new Map<Task, { each: number; grader: number }>();
  for (const task of tasks) {
    let each = 1;
    let grader = 1;
    try {
      each += (await servicesOf(task))?.services.length ?? 0;
      if (resolveNetworkPolicy(options.runtime, task) !== null) each += 1;
      const scoring = task.data.scoring?.runtime ?? {};
      if (resolveRuntimeSpec({ ...scoring }, task, "grader").type !== type) grader = 0;
    } catch {
      // A broken Compose file or policy: the task's own check reports it.
    }
    own.set(task, { each, grader });
  }
  const need = (task: Task, gold: boolean): number => {
    const { each, grader } = own.get(task)!;
    return gold ? each + grader : each;
  };
  const permits = new Semaphore(max);
  // One check takes its permits at a time, so no two hold part of what they need.
  const turn = new Semaphore(1);
  return {
    async take(task, gold) {
      const releases: Array<() => void> = [];
      const done = await turn.acquire();
      try {
        for (let i = Math.min(need(task, gold), max); i > 0; i--) {
          releases.push(await permits.acquire());
        }
      } finally {
        done();
      }
      return () => releases.forEach((release) => release());
    },
    graderRefusal(task) {
      const both = need(task, true);
      if (own.get(task)!.grader === 0 || both <= max) return null;
      const { each } = own.get(task)!;
      return `limits.max_sandboxes: grading task "${task.key}"'s gold answer in a fresh ` +
        `sandbox beside its own needs ${both} ${type} sandboxes at once (its own` +
        `${each > 1 ? ` with ${each - 1} beside it` : ""}, and the grader), more than the ` +
        `limit of ${max}`;
    },
  };
}

/** A source that refuses graders (see `SandboxBudget.graderRefusal`). */
function refusingGraders(source: SandboxSource, reason: string): SandboxSource {
  return {
    acquire: (spec, options) =>
      options?.role === "grader"
        ? Promise.reject(new ConfigError(reason))
        : source.acquire(spec, options),
    close: () => Promise.resolve(),
    ...(source.reserve ? { reserve: source.reserve.bind(source) } : {}),
  };
}

async function validateTasks(
  tasks: Task[],
  options: {
    runtime: AgentPolicy["runtime"];
    runId: string;
    maxConcurrent?: number;
    signal?: AbortSignal;
    probe?: boolean;
    sandboxes?: SandboxSource;
    budget: SandboxBudget | null;
  },
): Promise<ValidationResult[]> {
  const { sandboxes } = options;
  const graderSource = (task: Task): SandboxSource => {
    const refusal = options.budget?.graderRefusal(task);
    return refusal ? refusingGraders(sandboxes!, refusal) : sandboxes!;
  };
  const check = async (task: Task, gold: boolean): Promise<number> => {
    const release = await options.budget?.take(task, gold);
    try {
      return await checkOnce(task, gold);
    } finally {
      release?.();
    }
  };
  const checkOnce = async (task: Task, gold: boolean): Promise<number> => {
    // The task's services and network policy, as a rollout would have them.
    await using sandbox = await startChecked(
      task,
      resolveRuntimeSpec(options.runtime, task, "agent"),
      {
        runId: options.runId,
        role: "agent",
        services: await servicesOf(task),
        egress: resolveNetworkPolicy(options.runtime, task),
        sandboxes,
        signal: options.signal,
      },
    );
    const view: TraceView = { info: {}, messages: [], artifacts: new Map() };
    const ctx: TaskHookContext = {
      runtime: sandbox.runtime,
      task,
      data: task.data,
      trace: view,
      state: task.initialState(),
      runId: options.runId,
      signal: options.signal,
      sandboxes: gold && sandboxes ? graderSource(task) : sandboxes,
    };
    await task.setup(ctx);
    sandbox.phase("agent");
    // As the seed has it: validate never stages private tests or moves artifacts by itself; a
    // task graded in isolation returns gradeSubmission(ctx) from its validate hook.
    if (gold) {
      const v = await task.validate(ctx);
      if (v === false) throw new Error("validate() returned false");
      if (v && typeof v === "object") return v.reward;
    }
    sandbox.phase("grade");
    return (await task.score(ctx)).reward;
  };
  const out: ValidationResult[] = new Array(tasks.length);
  let next = 0;
  const worker = async () => {
    while (next < tasks.length) {
      const i = next++;
      const task = tasks[i];
      const result: ValidationResult = {
        task: task.key,
        idx: task.data.idx ?? i,
        gold_reward: null,
        empty_reward: null,
        ok: false,
        error: null,
      };
      try {
        const [g, e] = await Promise.all([check(task, true), check(task, false)]);
        result.gold_reward = g;
        result.empty_reward = e;
        result.ok = Math.abs(g - 1) < 1e-9 && Math.abs(e) < 1e-9;
        if (!result.ok) {
          result.error = `gold scored ${g} (expected 1.0), untouched scored ${e} (expected 0.0)`;
        }
        if (options.probe) {
          result.probes = await Promise.all(
            PROBES.map((p) => runProbe(task, p, { ...options, take: options.budget?.take })),
          );
          const flagged = result.probes.filter((p) => p.flagged);
          if (flagged.length) {
            result.ok = false;
            result.error = [
              result.error,
              `gameable: ${flagged.map((p) => `${p.probe} scored ${p.reward}`).join(", ")}`,
            ].filter(Boolean).join("; ");
          }
        }
      } catch (error) {
        if (isFatalError(error)) throw error;
        result.error = error instanceof Error ? `${error.name}: ${error.message}` : String(error);
      }
      out[i] = result;
    }
  };
  await Promise.all(
    Array.from({ length: Math.max(1, Math.min(options.maxConcurrent ?? 4, tasks.length)) }, worker),
  );
  return out;
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
