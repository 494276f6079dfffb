/**
 * The summary of a run of tasks: what counts as scored, the aggregates over the traces
 * (rewards, metrics, pass@k, errors by where they happened, tokens) and the lines `vf run`
 * prints.
 * @module
 */
import { passAtK } from "../eval/results.ts";
import type { TaskTrace } from "./trace.ts";
import { VERSION } from "../version.ts";
import { terminalLines, terminalText } from "../util/terminal.ts";

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
  /**
   * The weight in `reward` of each named reward whose weight is not 1 (0: kept beside the reward,
   * not in it, as a Harbor task's other keys beside its `reward` key), from the traces; null
   * where the traces that have it weigh it differently.
   */
  reward_weights?: Record<string, number | null>;
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
    ...rewardLines(summary),
    ...Object.entries(summary.avg_metrics).map(([k, v]) =>
      `  metric ${terminalText(k)}: ${v.toFixed(4)}`
    ),
    ...Object.entries(summary.pass_at_k).map(([k, v]) => `  pass@${k}: ${v.toFixed(3)}`),
    ...(summary.num_failed_episodes
      ? [`episodes failed: ${summary.num_failed_episodes} of ${summary.num_episodes}`]
      : []),
    `tokens: input ${summary.usage.input_tokens}, output ${summary.usage.output_tokens}`,
    ...Object.entries(summary.usage_by_role ?? {}).map(([role, u]) =>
      `  tokens ${terminalText(role)}: input ${u.input_tokens}, output ${u.output_tokens}`
    ),
    ...(summary.judge_usage
      ? [
        `  tokens judges: input ${summary.judge_usage.input_tokens}, output ${summary.judge_usage.output_tokens}`,
      ]
      : []),
    ...(summary.num_model_retries ? [`model retries: ${summary.num_model_retries}`] : []),
  ];
  // Reward, metric and role names come from the taskset's code: no terminal escapes.
  return terminalLines(lines.join("\n"));
}

/**
 * Each named reward under the headline, its name quoted (a reward may be named "reward") and its
 * weight when not 1. A reward named "reward" that alone makes the headline (a Harbor task's: its
 * other keys, if any, have weight 0) is the headline, not repeated.
 */
function rewardLines(summary: TaskRunSummary): string[] {
  const weights = summary.reward_weights ?? {};
  const names = Object.keys(summary.avg_rewards);
  const weight = (k: string) => (Object.hasOwn(weights, k) ? weights[k] : 1);
  const headline = Object.hasOwn(summary.avg_rewards, "reward") && weight("reward") === 1 &&
    names.every((k) => k === "reward" || weight(k) === 0);
  return Object.entries(summary.avg_rewards)
    .filter(([k]) => !(headline && k === "reward"))
    .map(([k, v]) => {
      const w = weight(k);
      const note = w === null
        ? " (weight differs between rollouts)"
        : w === 0
        ? " (weight 0: beside the reward, not in it)"
        : w === 1
        ? ""
        : ` (weight ${w})`;
      return `  reward "${terminalText(k)}": ${v.toFixed(4)}${note}`;
    });
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

/**
 * The weights not 1 of the traces' named rewards: null for a name whose weight differs between
 * the traces that have it (tasks that score it differently).
 */
function rewardWeights(traces: TaskTrace[]): Pick<TaskRunSummary, "reward_weights"> {
  const seen = new Map<string, number | null>();
  for (const t of traces) {
    for (const k of Object.keys(t.rewards ?? {})) {
      // Traces on disk are hostile: a weight that is not a number is not known.
      const raw = t.reward_weights && Object.hasOwn(t.reward_weights, k) ? t.reward_weights[k] : 1;
      const w = typeof raw === "number" && Number.isFinite(raw) ? raw : null;
      if (!seen.has(k)) seen.set(k, w);
      else if (seen.get(k) !== w) seen.set(k, null);
    }
  }
  const out = Object.fromEntries([...seen].filter(([, w]) => w !== 1));
  return Object.keys(out).length ? { reward_weights: out } : {};
}

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
    ...rewardWeights(traces),
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
