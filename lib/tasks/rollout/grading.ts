/**
 * A rollout's scoring: in the agent's sandbox (shared mode), or in fresh grading sandboxes that
 * get only the declared artifacts plus privately staged tests (isolated mode, also
 * {@link gradeSubmission} for a task's `validate`); then the judges' rewards on top.
 * @module
 */
import process from "node:process";
import { posix } from "node:path";
import type { SandboxSlot } from "../../../runtimes/limits.ts";
import type { SandboxSource } from "../../../runtimes/pool.ts";
import type { Runtime, RuntimeSpec } from "../../../runtimes/runtime.ts";
import { dedicatedHostOf, traitsOf } from "../../../runtimes/config.ts";
import { dedicatedHolderOf } from "../../../runtimes/ssh/runtime.ts";
import { resolveTemplate } from "../../config.ts";
import { ConfigError, InfraError } from "../../errors.ts";
import type { EgressDenial } from "../../gateway/gateway.ts";
import { type NetworkPolicy, OPEN_POLICY, parseNetworkPolicy } from "../../gateway/policy.ts";
import type { Judge } from "../../scoring/judges/judge.ts";
import type { ServicesSpec } from "../../services/compose.ts";
import { Enclosure } from "../enclosure.ts";
import type { SandboxRecord } from "../record.ts";
import { acquireSandbox } from "../sandbox.ts";
import type {
  RuntimeConfig,
  Task,
  TaskData,
  TaskHookContext,
  TaskScores,
  TraceView,
} from "../task.ts";
import type { TaskTrace } from "../trace.ts";
import { collectArtifacts, restoreArtifacts } from "./artifacts.ts";
import { inPhase, phase, settledWithin } from "./phase.ts";
import { resolveNetworkPolicy, resolveRuntimeSpec } from "./spec.ts";
import type { RolloutState } from "./state.ts";

/** Options of {@link gradeIsolated}. */
export interface IsolatedGrading {
  task: Task;
  runId: string;
  /** The run's model (what a grader's gateway would report); default "". */
  model?: string;
  /** The rollout's index in its group (a replay finds its record by it); default 0. */
  rollout?: number;
  /** Where grading sandboxes come from (the run's limits); default: created here. */
  sandboxes?: SandboxSource;
  /** Still being collected: the first grader starts and runs the task's setup meanwhile (unless `agentGone`). */
  artifacts: Promise<Map<string, Uint8Array | null>>;
  /** Fresh sandboxes tried after the first fails. */
  retries: number;
  /** Where the attempts are counted (the trace's `scoring`). */
  scoring: TaskTrace["scoring"];
  /** The hook context of a grading sandbox. */
  hookContext: (runtime: Runtime, signal: AbortSignal) => TaskHookContext;
  /** Each attempt's limit in seconds (the wait for the artifacts not counted); none by default. */
  timeoutSeconds?: number;
  signal?: AbortSignal;
  /** The grader's network policy, and where its refusals go; default: none. */
  egress?: { policy: NetworkPolicy; denied: EgressDenial[] };
  /** Services started fresh for each grading sandbox; default none. */
  services?: ServicesSpec | null;
  /** Where the grading sandboxes' operations are recorded; default: not recorded. */
  records?: SandboxRecord[];
  /** Takes a grader's removal off the critical path: whoever passes it awaits it later. */
  defer?: (removal: Promise<void>) => void;
  /**
   * Settles once the agent's sandbox is removed: no grading sandbox is created before, so
   * nothing of the agent's is running when grading starts; default: not waited for.
   */
  agentGone?: Promise<void>;
}

/**
 * Grade in fresh sandboxes of `spec`: each runs the task's setup, gets the artifacts restored,
 * `stageVerifier` and the rewards; an attempt that fails is tried again in a fresh sandbox.
 * @throws the artifacts' collection failure, which outranks the grader's
 * @throws {InfraError} when grading fails in every fresh sandbox tried
 */
export async function gradeIsolated(
  spec: RuntimeSpec,
  options: IsolatedGrading,
): Promise<TaskScores> {
  const { task, retries, timeoutSeconds, signal, egress, records, defer } = options;
  const services = options.services ?? null;
  // Waiting for the artifacts does not count against the scoring timeout, and a failure to
  // collect them ends grading with that failure (it is not the grader's, so no retry).
  const cancel = new AbortController();
  let collected: Map<string, Uint8Array | null> | null = null;
  let uncollected: { error: unknown } | null = null;
  const arrived = options.artifacts.then(
    (map) => void (collected = map),
    (error) => {
      uncollected = { error };
      cancel.abort(error);
    },
  );
  const outer = signal ? AbortSignal.any([signal, cancel.signal]) : cancel.signal;
  let outcome: { scores: TaskScores } | { error: unknown };
  try {
    // The agent's sandbox goes first (its removal waits for the artifacts): not counted
    // against the scoring timeout either.
    if (options.agentGone) await abortable(options.agentGone, outer);
    outcome = { scores: await attempts() };
  } catch (error) {
    outcome = { error };
  }
  // However grading ended, the collection is over before the caller goes on (it may remove
  // the agent's sandbox next), and its failure outranks the grader's.
  await arrived;
  if (uncollected) throw (uncollected as { error: unknown }).error;
  if ("error" in outcome) throw outcome.error;
  return outcome.scores;

  async function attempts(): Promise<TaskScores> {
    let last: unknown;
    for (let attempt = 0; attempt <= retries; attempt++) {
      options.scoring.attempts = attempt + 1;
      // A failed attempt's grading sandbox is not what a replay should serve.
      const mark = records?.length ?? 0;
      let grader = null as Runtime | null;
      let enclosure = null as Enclosure | null;
      /** Phase 1's own work, which goes on for a while when the phase is cut short. */
      let running: Promise<unknown> = Promise.resolve();
      try {
        let started = performance.now();
        await phase("scoring", async (s, queued) => {
          // Waiting for a sandbox slot under [limits] is not grading taking too long.
          const onQueue = (waiting: boolean) => {
            if (!waiting) started = performance.now();
            queued(waiting);
          };
          let graderSpec = spec;
          let graderSlot: SandboxSlot | undefined;
          const needs = {
            runId: options.runId,
            task: task.key,
            model: options.model ?? "",
            services,
            gateway: false,
            egress: egress !== undefined,
            alias: "grader",
            healthTimeout: timeoutSeconds,
            signal: s,
            onQueue,
          };
          if (Enclosure.needed(needs)) {
            // Fresh services, and a network out only through the proxy: setup, the restore and
            // stageVerifier are unrestricted, the rewards run under the grader's policy.
            const opened = await Enclosure.open(spec, needs, options.sandboxes);
            graderSlot = opened.slot;
            if (s.aborted) {
              // The attempt is over (timeout, a failed collection): nobody else will close it.
              graderSlot?.release();
              await opened.enclosure.close().catch(() => {});
              throw s.reason;
            }
            enclosure = opened.enclosure;
            graderSpec = opened.spec;
          }
          await acquireSandbox(graderSpec, {
            runId: options.runId,
            task: task.key,
            role: "grader",
            rollout: options.rollout ?? 0,
            sandboxes: options.sandboxes,
            records,
            hold: (rt) => void (grader = rt),
            slot: graderSlot,
            onQueue,
            signal: s,
          });
          s.throwIfAborted();
          await task.setup(options.hookContext(grader!, s));
        }, { seconds: timeoutSeconds, signal: outer, running: (work) => (running = work) });
        const spent = (performance.now() - started) / 1000;
        await arrived;
        if (uncollected) throw (uncollected as { error: unknown }).error;
        // What is left of the attempt's timeout, the wait for the artifacts not counted.
        const left = timeoutSeconds && timeoutSeconds > 0
          ? Math.max(timeoutSeconds - spent, 0.001)
          : undefined;
        return await phase("scoring", async (s) => {
          const ctx = options.hookContext(grader!, s);
          await restoreArtifacts(grader!, collected!);
          await task.stageVerifier(ctx);
          if (egress) enclosure?.route?.session.setPhase("grade", egress.policy);
          return await task.score(ctx);
        }, { seconds: left, signal: outer, stated: timeoutSeconds });
      } catch (error) {
        if (uncollected) throw (uncollected as { error: unknown }).error;
        // A fresh sandbox cannot mend a configuration (a limit too small for the grader).
        if (signal?.aborted || error instanceof ConfigError) throw error;
        last = error;
        if (records) records.length = mark;
      } finally {
        // The grader as known now, then again once phase 1's work has settled: a phase cut
        // short (a timeout, a failed collection) may still be starting one.
        // (A hook that ignores its signal and never settles is waited for 30 s, not forever.)
        const stopGrader = () => (grader as Runtime | null)?.stop().catch(() => {});
        const settled = settledWithin(running, 30_000);
        const removal = Promise.all([stopGrader(), settled.then(stopGrader)]).then(() => {});
        if (enclosure || !defer) {
          // An enclosure's network goes only once its sandboxes have.
          await removal;
          const denied = await (enclosure as Enclosure | null)?.close() ?? [];
          egress?.denied.push(...denied);
        } else defer(removal);
      }
    }
    throw new InfraError(
      `Grading failed in ${retries + 1} fresh sandbox${retries ? "es" : ""}: ${
        last instanceof Error ? last.message : String(last)
      }`,
      { cause: last },
    );
  }
}

/** `work`, or the signal's reason as soon as it aborts. */
function abortable(work: Promise<void>, signal: AbortSignal): Promise<void> {
  signal.throwIfAborted();
  return new Promise((resolve, reject) => {
    const onAbort = () => reject(signal.reason);
    signal.addEventListener("abort", onAbort, { once: true });
    work.then(resolve, reject).finally(() => signal.removeEventListener("abort", onAbort));
  });
}

/** Score in the agent's own sandbox: private tests are staged once the agent is done. */
export async function scoreShared(s: RolloutState): Promise<TaskScores> {
  const { task, signal } = s.options;
  if (s.options.keepArtifacts) {
    // Before scoring: private tests staged for grading must not travel with them.
    s.view.artifacts = await inPhase(
      "artifacts",
      () => s.timed("artifacts", () => collectArtifacts(s.agent!, task)),
    );
  }
  s.trace.scoring.attempts = 1;
  return await inPhase(
    "scoring",
    () =>
      s.timed("scoring", () =>
        phase("scoring", async (cut) => {
          // The agent is done: private tests may be staged in its sandbox now
          // (under the setup policy), then graded under the grader's.
          s.gateway?.session.setPhase("setup", OPEN_POLICY);
          await task.stageVerifier(s.ctx(s.agent!, cut));
          s.gateway?.session.setPhase("grade", s.graderPolicy());
          return await task.score(s.ctx(s.agent!, cut));
        }, { seconds: s.timeout("scoring"), signal })),
  );
}

/** The task's scoring env templates, resolved. */
function scoringEnvOf(
  env: Record<string, string> | undefined,
  lookup: (name: string) => string | undefined,
): Record<string, string> {
  const out: Record<string, string> = {};
  for (const [k, v] of Object.entries(env ?? {})) out[k] = resolveTemplate(v, lookup);
  return out;
}

/**
 * Score in fresh grading sandboxes: the artifacts are collected, the agent's sandbox is
 * removed once they are out, and only then is the first grader created (nothing the agent
 * left running overlaps grading).
 */
export async function scoreIsolated(s: RolloutState): Promise<TaskScores> {
  const { task, policy, signal } = s.options;
  const data = task.data;
  const scoring = s.scoring;
  const graderConfig: RuntimeConfig = { ...policy.runtime, ...(scoring.runtime ?? {}) };
  const scoringEnv = scoringEnvOf(scoring.env, s.options.env ?? ((n) => process.env[n]));
  // deno-lint-ignore require-await
  const graderSpec = await inPhase("scoring", async () => {
    const spec = resolveRuntimeSpec(graderConfig, task, "grader", scoringEnv);
    const traits = traitsOf(spec);
    if (!traits.isolation) {
      throw new ConfigError(
        `The grading sandbox must be a fresh, isolated sandbox; a ${traits.label} is not one ` +
          `(task "${task.key}"); ` +
          `use docker or prime for --env.agent.scoring.runtime`,
      );
    }
    // A borrowed sandbox stays up through grading: a grader cannot wait for its host.
    const box = s.options.box?.runtime;
    if (box) requireHostNotKept(spec, { kept: box, task, field: "--env.agent.scoring.runtime" });
    const agentWorkdir = s.agentSpec?.workdir ?? data.workdir;
    const relative = (data.artifacts ?? []).find((a) => !posix.isAbsolute(a.source));
    if (relative && spec.workdir !== agentWorkdir) {
      throw new ConfigError(
        `Relative artifact path "${relative.source}" requires the agent and grading sandboxes to ` +
          `share a workdir ("${agentWorkdir}" vs "${spec.workdir}"); use an absolute path`,
      );
    }
    return spec;
  });
  // The grading sandbox's egress: `scoring.network`, else its runtime's and the task's.
  const graderPolicy = await inPhase("scoring", () => {
    const own = scoring.network;
    const policy = own
      ? parseNetworkPolicy(own, "scoring.network")
      : resolveNetworkPolicy(graderConfig, task, "env.agent.scoring.runtime");
    if (policy && !traitsOf(graderSpec).egress) {
      throw new ConfigError(
        `A network policy is enforced on the docker runtime only; the grading sandbox is ` +
          `${graderSpec.type} (task "${task.key}")`,
      );
    }
    return Promise.resolve(policy);
  });
  // Services for the grader, fresh, when the task asks (`scoring.services`).
  const graderServices = scoring.services && s.compose !== null
    ? await inPhase("scoring", () => s.services())
    : null;
  // The artifacts are collected, then the agent's sandbox is removed, and the grader is
  // created only once it is gone; the toolsets stay up: rewards may still call them.
  const agent = s.agent!;
  let agentGone: Promise<void> = Promise.resolve();
  const artifacts = inPhase(
    "artifacts",
    () => s.timed("artifacts", () => collectArtifacts(agent, task)),
  ).then((collected) => {
    s.view.artifacts = collected;
    // Unless the rollout is already being torn down (dispose() stops the agent then).
    if (s.agent === agent) agentGone = s.agentStopping = s.stopAgent().catch(() => {});
    return collected;
  });
  artifacts.catch(() => {}); // gradeIsolated awaits it, and a failure is thrown from there
  const denied: EgressDenial[] = [];
  try {
    return await inPhase(
      "scoring",
      () =>
        s.timed("scoring", () =>
          gradeIsolated(graderSpec, {
            task,
            runId: s.options.runId,
            model: s.options.model,
            rollout: s.options.rolloutIndex ?? 0,
            sandboxes: policy.sandboxes,
            artifacts,
            retries: scoring.retries ?? 2,
            scoring: s.trace.scoring,
            hookContext: (runtime, signal) => s.ctx(runtime, signal),
            timeoutSeconds: s.timeout("scoring"),
            signal,
            egress: graderPolicy ? { policy: graderPolicy, denied } : undefined,
            services: graderServices,
            records: s.records,
            defer: (removal) => s.graderStopping.push(removal),
            agentGone: artifacts.then(() => agentGone, () => {}),
          })),
    );
  } finally {
    if (graderPolicy) s.recordDenials(denied);
  }
}

/**
 * Grade the work in `ctx.runtime` as an isolated rollout would: its declared artifacts are
 * copied into a fresh grading sandbox (the task's `scoring.runtime`, else its image on
 * Docker), where the task's setup, the restore, `stageVerifier` and its rewards run. For a
 * `validate` hook that exercises the whole flow without a model:
 *
 * ```ts
 * override async validate(ctx: TaskHookContext) {
 *   await ctx.runtime.write("/app/solution.py", GOLD);
 *   return await gradeSubmission(ctx);
 * }
 * ```
 * @throws {InfraError} when grading fails in every fresh sandbox tried (`scoring.retries`)
 */
export async function gradeSubmission(
  ctx: TaskHookContext,
  options: { runtime?: RuntimeConfig } = {},
): Promise<TaskScores> {
  const { task, signal } = ctx;
  const scoring = task.data.scoring ?? {};
  const config: RuntimeConfig = { ...(options.runtime ?? {}), ...(scoring.runtime ?? {}) };
  const scoringEnv = scoringEnvOf(scoring.env, (n) => process.env[n]);
  const spec = resolveRuntimeSpec(config, task, "grader", scoringEnv);
  if (!traitsOf(spec).isolation) {
    throw new ConfigError(
      `gradeSubmission needs a fresh, isolated grading sandbox; a ${spec.type} runtime is not ` +
        `one (task "${task.key}"); use docker or prime for scoring.runtime`,
    );
  }
  requireHostNotKept(spec, { kept: ctx.runtime, task, field: "scoring.runtime" });
  // Collected while the grader starts and runs the task's setup (see gradeIsolated).
  const artifacts = collectArtifacts(ctx.runtime, task).then((collected) => {
    ctx.trace.artifacts = collected;
    return collected;
  });
  artifacts.catch(() => {}); // gradeIsolated awaits it and throws its failure
  return await gradeIsolated(spec, {
    task,
    runId: ctx.runId ?? "validate",
    sandboxes: ctx.sandboxes,
    artifacts,
    retries: scoring.retries ?? 2,
    scoring: { mode: "isolated", attempts: 0 },
    hookContext: (runtime, s) => ({ ...ctx, runtime, signal: s }),
    timeoutSeconds: task.data.timeout?.scoring,
    signal,
  });
}

/**
 * A grader on a dedicated ssh host waits until the sandbox holding the host has stopped. When
 * that sandbox is `kept`, which stays up until grading is done, the wait would never end:
 * refuse it at once.
 * @throws {ConfigError}
 */
function requireHostNotKept(
  spec: RuntimeSpec,
  options: { kept: Runtime; task: Task; field: string },
): void {
  const { kept, task, field } = options;
  const host = dedicatedHostOf(spec);
  const holder = dedicatedHolderOf(spec);
  if (host === undefined || holder === undefined || holder !== kept.id) return;
  throw new ConfigError(
    `The grading sandbox of task "${task.key}" would need dedicated ssh host "${host}", ` +
      `which sandbox "${holder}" holds until grading is done; a dedicated host holds one ` +
      `sandbox at a time: give ${field} a host of its own (host = "...")`,
  );
}

/**
 * Add the judges' rewards to a task's scores: every judge reads the trace (concurrently),
 * each reward weighted by its judge's weight; a judge that fails fails the scoring.
 */
export async function judgeScores(
  scores: TaskScores,
  judges: Judge[],
  data: TaskData,
  view: TraceView,
  signal: AbortSignal,
): Promise<TaskScores> {
  const metrics: Record<string, number> = {};
  const judged = { info: view.info, messages: view.messages, metrics };
  const results = await Promise.all(judges.map((j) => j.score(data, judged, signal)));
  const out: TaskScores = {
    reward: scores.reward,
    rewards: { ...scores.rewards },
    metrics: { ...scores.metrics, ...metrics },
    weights: { ...(scores.weights ?? {}) },
  };
  judges.forEach((judge, i) => {
    const r = results[i];
    for (
      const [name, value] of typeof r === "number" ? [[judge.name, r] as const] : Object.entries(r)
    ) {
      if (!Number.isFinite(value)) throw new TypeError(`Judge "${judge.name}" returned ${value}`);
      out.rewards[name] = value;
      out.weights![name] = judge.weight;
      out.reward += value * judge.weight;
    }
  });
  return out;
}
