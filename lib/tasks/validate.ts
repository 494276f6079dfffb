/**
 * `validateTaskset`, for `vf validate`: each task's gold answer must score 1.0 and an untouched
 * workspace 0.0, in sandboxes started as a run's (services, network policy, limits), with the
 * integrity probes on request.
 * @module
 */
import type { SandboxLimits } from "../../runtimes/limits.ts";
import { type SandboxSource, WarmPool } from "../../runtimes/pool.ts";
import { Semaphore } from "../model/limits.ts";
import { isFatalError } from "../legacy/environment.ts";
import { ConfigError } from "../errors.ts";
import { type ProbeResult, PROBES, runProbe } from "./probe.ts";
import {
  requireRewards,
  type Task,
  type TaskHookContext,
  type Taskset,
  type TraceView,
} from "./task.ts";
import { type AgentPolicy, resolveNetworkPolicy, resolveRuntimeSpec } from "./rollout/mod.ts";
import { servicesOf, startChecked } from "./checked.ts";
import { ComposeCache } from "../services/cache.ts";

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
    /** Compose specs parsed once for the whole validation; default a cache of its own. */
    composeCache?: ComposeCache;
  },
): Promise<ValidationResult[]> {
  const composeCache = options.composeCache ?? new ComposeCache();
  const tasks = await taskset.tasks(
    options.numTasks && options.numTasks > 0 ? options.numTasks : -1,
  );
  for (const task of tasks) requireRewards(task);
  const sandboxes = options.limits
    ? new WarmPool({ size: 0, runId: options.runId, limits: options.limits })
    : undefined;
  try {
    const budget = await sandboxBudget(tasks, { ...options, composeCache });
    return await validateTasks(tasks, { ...options, sandboxes, budget, composeCache });
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
  options: { runtime: AgentPolicy["runtime"]; limits?: SandboxLimits; composeCache: ComposeCache },
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
      each += (await servicesOf(task, options.composeCache))?.services.length ?? 0;
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
    composeCache: ComposeCache;
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
        services: await servicesOf(task, options.composeCache),
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
