/**
 * One task rollout, start to finish: agent sandbox → setup → harness → finalize → collect
 * artifacts → score (in the agent's sandbox, or in a fresh grading sandbox that gets only the
 * artifacts plus privately staged tests) → trace. Each phase has its own module: `spec.ts`
 * (the sandboxes asked for), `setup.ts`, `phase.ts` (timeouts), `artifacts.ts`,
 * `grading.ts` (scoring and judges) and `rescore.ts` (offline).
 *
 * ```ts
 * const rollout = new TaskRollout({ task, tasksetId, policy, client, model, runId });
 * const trace = await rollout.run();
 * console.log(trace.reward, rollout.record?.sandboxes.length);
 * ```
 * @module
 */
import type { Runtime } from "../../../runtimes/runtime.ts";
import { withCacheSalt } from "../../model/cache.ts";
import {
  ConfigError,
  EnvError,
  InfraError,
  ModelError,
  serializeError,
  TaskError,
} from "../../errors.ts";
import { CLOSED_POLICY } from "../../gateway/policy.ts";
import { judgeUsage } from "../../scoring/judges/judge.ts";
import type { Messages } from "../../types.ts";
import { type HarnessContext, StopFired, StopHookError } from "../harness.ts";
import type { SandboxRecord } from "../record.ts";
import type { StopHook, TaskScores, TraceView } from "../task.ts";
import type { TaskTrace } from "../trace.ts";
import type { RolloutRecord, Segment, TaskRolloutOptions } from "./options.ts";
import { inPhase, phase, PhaseError, settledWithin } from "./phase.ts";
import { judgeScores, scoreIsolated, scoreShared } from "./grading.ts";
import { openTools, setUpAgent } from "./setup.ts";
import { agentSpecOf } from "./spec.ts";
import { lastReplyOf, RolloutState, stoppedBy } from "./state.ts";

export type { AgentPolicy, Box, RolloutRecord, Segment, TaskRolloutOptions } from "./options.ts";
export { collectArtifacts, restoreArtifacts } from "./artifacts.ts";
export { gradeSubmission } from "./grading.ts";
export { rescoreTrace } from "./rescore.ts";
export { resolveNetworkPolicy, resolveRuntimeSpec } from "./spec.ts";
export { type TaskTrace, TRACE_FORMAT_VERSION } from "../trace.ts";
export { lastReplyOf } from "./state.ts";

/**
 * One task rollout in steps: {@link TaskRollout.open} (sandbox and setup), one or more
 * {@link TaskRollout.step}s (harness segments; later ones resume the conversation with the
 * user's turn), then {@link TaskRollout.close} (finalize, harness metrics, artifacts, scoring,
 * teardown). Failures are recorded on the trace, never thrown; an interrupt (the signal) is
 * thrown, and {@link TaskRollout.dispose} then stops what is still running.
 * {@link TaskRollout.run} does all of it for a rollout of one segment.
 */
export class TaskRollout {
  readonly #s: RolloutState;
  #opened = false;
  #failed = false;
  #closed = false;
  #segments = 0;
  #agentMs = 0;
  #stopList: StopHook[] | null = null;
  #record: RolloutRecord | null = null;

  constructor(options: TaskRolloutOptions) {
    this.#s = new RolloutState(options);
  }

  /** The rollout's trace (final once closed). */
  get trace(): TaskTrace {
    return this.#s.trace;
  }

  /** What the task's rewards read: info, messages and (once collected) the artifacts. */
  get view(): TraceView {
    return this.#s.view;
  }

  /** This rollout's own state, shared by the task's hooks, its rewards and the harness. */
  get state(): Record<string, unknown> {
    return this.#s.state;
  }

  /** Every sandbox's operations, in order (what `record.jsonl` keeps for vf replay). */
  get sandboxRecords(): SandboxRecord[] {
    return this.#s.records;
  }

  /**
   * What the rollout's sandboxes and toolsets did, once it is closed (null when it used
   * neither, or before close): the run writes it to `record.jsonl` for `vf replay`.
   */
  get record(): RolloutRecord | null {
    return this.#record;
  }

  /** The agent's sandbox while the rollout holds it (null before open and after close). */
  get runtime(): Runtime | null {
    return this.#s.agent;
  }

  /** Whether the rollout has failed (the error is on the trace). */
  get failed(): boolean {
    return this.#failed;
  }

  get #stops(): StopHook[] {
    return this.#stopList ??= this.#s.options.task.stopHooks();
  }

  /** Record a failure on the trace; an interrupt is thrown instead. */
  #fail(raw: unknown): void {
    const phaseName = raw instanceof PhaseError ? raw.phase : "rollout";
    const error = raw instanceof PhaseError ? raw.error : raw;
    const signal = this.#s.options.signal;
    if (signal?.aborted) throw signal.reason; // interrupted: not a result, nothing to record
    const trace = this.#s.trace;
    this.#failed = true;
    trace.ok = false;
    trace.error = { ...serializeError(error), phase: phaseName };
    // The model endpoint failing after its retries is infrastructure too (a bad key ends the
    // run). That includes replies vf cannot use at all (malformed JSON, no choices, an empty
    // message): the endpoint's or the model's, they cannot be told apart here.
    if (error instanceof InfraError || error instanceof ModelError) trace.error.infra = true;
    trace.stop_condition ??= this.#s.recorder.stop_condition ?? "has_error";
  }

  /** Start (or borrow) the agent's sandbox and run the task's setup; false when it failed. */
  async open(): Promise<boolean> {
    if (this.#opened || this.#failed) return !this.#failed;
    const s = this.#s;
    try {
      s.agentSpec = await inPhase("config", () => Promise.resolve().then(() => agentSpecOf(s)));
      await inPhase("setup", () => s.timed("setup", () => setUpAgent(s)));
      await inPhase("setup", () => openTools(s));
      // The agent works under the task's policy (nothing but vf's own routes without one).
      s.gateway?.session.setPhase("agent", s.egress ?? CLOSED_POLICY);
      this.#opened = true;
      return true;
    } catch (raw) {
      this.#fail(raw);
      return false;
    } finally {
      // A leader that never got to snapshot lets its members set up on their own.
      s.leading?.settle(null);
      s.leading = null;
    }
  }

  /**
   * Run one harness segment: the first runs from the task's prompt (or, for a prompt-less
   * rollout, from `messages`); later ones resume after appending `messages` as the user's turn.
   * The agent timeout is one budget over all segments, unless the task sets a session its own
   * limit (`Task.sessionTimeout`).
   */
  async step(messages?: Messages): Promise<Segment> {
    const s = this.#s;
    const recorder = s.recorder;
    const done = (): Segment => ({
      messages: [],
      terminated: true,
      lastReply: lastReplyOf(recorder.messages),
    });
    if (!this.#opened || this.#failed || this.#closed) return done();
    const { task, policy, signal } = s.options;
    const first = this.#segments === 0;
    const promptless = s.options.promptless === true;
    if (first && promptless !== Boolean(messages?.length)) {
      throw new TypeError(
        promptless
          ? `A prompt-less rollout of task "${task.key}" opens with the user's message: turn("...")`
          : `Task "${task.key}" has a prompt: open its interaction with a bare turn()`,
      );
    }
    if (!first && !messages?.length) {
      throw new TypeError('A later turn needs the user\'s message: turn("...")');
    }
    // A task's fresh session: the harness runs anew from the turn's message, its model seeing
    // none of the earlier conversation, which is put back in front of it afterwards.
    const fresh = !first && task.freshSessions;
    if (!first && !fresh && !policy.harness.resume) {
      throw new ConfigError(`Harness "${policy.harness.id}" cannot resume a conversation`);
    }
    this.#segments++;
    const earlier = fresh ? recorder.messages.splice(0) : [];
    // How the last session ended (its agent done) does not end the new one.
    if (fresh) recorder.stop_condition = null;
    const before = fresh ? 0 : recorder.messages.length + (first ? 0 : messages!.length);
    const session = this.#segments - 1;
    // A session's own limit (a Harbor step's agent timeout) ends that session, not the rollout.
    const own = task.sessionTimeout(session);
    const budget = s.timeout("agent");
    const remaining = own !== undefined
      ? s.options.policy.timeouts?.agent ?? own
      : budget
      ? Math.max(0.001, budget - this.#agentMs / 1000)
      : undefined;
    let work: Promise<unknown> | undefined;
    let timedOut = false;
    const t0 = performance.now();
    try {
      await inPhase("agent", () =>
        phase("agent", (cut) => {
          const ctx: HarnessContext = {
            task,
            data: (first && promptless) || fresh ? { ...task.data, prompt: messages! } : task.data,
            runtime: s.agent!,
            client: withCacheSalt(s.options.client, String(s.options.rolloutIndex ?? 0)),
            model: s.options.model,
            samplingArgs: s.options.samplingArgs ?? {},
            recorder,
            maxTurns: policy.maxTurns ?? 30,
            tokenLimits: policy.tokenLimits,
            toolTimeoutMs: (policy.toolTimeoutSeconds ?? 600) * 1000,
            user: task.data.agent_user,
            state: s.state,
            stops: this.#stops,
            toolbox: s.toolbox ?? undefined,
            gateway: s.gateway ?? undefined,
            session: {
              traceId: s.trace.trace_id,
              group: `${s.trace.run_id ?? ""}:${task.key}`,
            },
            signal: cut,
          };
          return first || fresh ? policy.harness.run(ctx) : policy.harness.resume!(ctx, messages!);
        }, { seconds: remaining, signal, running: (w) => work = w }));
      s.trace.stop_condition = recorder.stop_condition;
    } catch (raw) {
      const error = raw instanceof PhaseError ? raw.error : raw;
      timedOut = own !== undefined && error instanceof TaskError &&
        error.cause instanceof DOMException && error.cause.name === "TimeoutError" &&
        !signal?.aborted;
      // A stop condition that a custom harness let through is a clean end, not a failure.
      if (error instanceof StopFired) s.trace.stop_condition = error.condition;
      else if (timedOut) {
        // The cut harness winds down before the next session starts in its sandbox.
        if (work) await settledWithin(work, 60_000);
        try {
          await task.sessionTimedOut({
            session,
            seconds: remaining!,
            message: (error as Error).message,
            state: s.state as never,
          });
        } catch (hook) {
          this.#fail(new PhaseError("agent", hook));
        }
      } else if (error instanceof StopHookError) this.#fail(new PhaseError("stop", error));
      else this.#fail(raw);
    } finally {
      this.#agentMs += performance.now() - t0;
      s.trace.timing.agent_ms = Math.round(this.#agentMs);
      if (fresh) recorder.messages.unshift(...earlier);
    }
    const added = recorder.messages.slice(before + earlier.length);
    const replied = added.some((m) => m.role === "assistant");
    const stopped = stoppedBy(recorder.stop_condition, this.#stops);
    return {
      messages: added,
      // A session cut at its own limit leaves the rest of the rollout to the task.
      terminated: this.#failed || (!timedOut && (!replied || stopped)),
      lastReply: lastReplyOf(recorder.messages),
    };
  }

  /**
   * Finish the rollout: the task's finalize and the harness's metrics with the agent's sandbox
   * still up, artifacts, scoring (shared or isolated), then teardown. Idempotent.
   */
  async close(options: { stopCondition?: string } = {}): Promise<TaskTrace> {
    const s = this.#s;
    const trace = s.trace;
    if (this.#closed) return trace;
    this.#closed = true;
    const { task, signal } = s.options;
    // The agent is done: its program gets no more model calls.
    if (s.gateway) s.gateway.session.handler = null;
    try {
      if (this.#opened && !this.#failed && this.#segments === 0) {
        // Closed before the agent ever ran (its Env gave up first): nothing to score.
        throw new PhaseError(
          "env",
          new EnvError(`The rollout of task "${task.key}" was closed before the agent ran`),
        );
      }
      if (this.#opened && !this.#failed) {
        if (options.stopCondition) trace.stop_condition = options.stopCondition;
        await inPhase("finalize", () => s.timed("finalize", () => this.#finalize()));
        let scores = s.mode === "shared" ? await scoreShared(s) : await scoreIsolated(s);
        const judges = s.options.judges ?? [];
        if (judges.length) {
          const judged = scores;
          scores = await inPhase(
            "judge",
            () =>
              s.timed("judge", () =>
                phase(
                  "judge",
                  (cut) => judgeScores(judged, judges, task.data, s.view, cut),
                  { seconds: s.timeout("scoring"), signal },
                )),
          );
        }
        this.#scored(scores);
      }
    } catch (raw) {
      this.#fail(raw);
    } finally {
      await this.dispose();
      const judged = judgeUsage(s.view.info);
      if (judged) trace.judge_usage = judged;
      const graph = s.recorder.graph!;
      if (graph.leaves().length > 1 || graph.hasTokens) trace.nodes = graph.nodes;
      trace.timing.total_ms = Math.round(performance.now() - s.t0);
      if (s.records.length || s.toolRecord) {
        this.#record = { sandboxes: s.records, tools: s.toolRecord };
      }
    }
    return trace;
  }

  /** The task's finalize and the harness's own metrics, the agent's sandbox still up. */
  #finalize(): Promise<void> {
    const s = this.#s;
    const { task, policy, signal } = s.options;
    return phase("finalize", async (cut) => {
      await task.finalize(s.ctx(s.agent!, cut));
      const own = await policy.harness.metrics?.({
        task,
        data: task.data,
        runtime: s.agent!,
        client: s.options.client,
        model: s.options.model,
        samplingArgs: s.options.samplingArgs ?? {},
        recorder: s.recorder,
        maxTurns: policy.maxTurns ?? 30,
        toolTimeoutMs: (policy.toolTimeoutSeconds ?? 600) * 1000,
        user: task.data.agent_user,
        state: s.state,
        signal: cut,
      });
      Object.assign(s.recorder.metrics, own ?? {});
    }, { seconds: s.timeout("finalize"), signal });
  }

  /** Put the scores on the trace: it is ok now. */
  #scored(scores: TaskScores): void {
    const trace = this.#s.trace;
    trace.reward = scores.reward;
    trace.rewards = scores.rewards;
    const weights = Object.entries(scores.weights ?? {}).filter(([, w]) => w !== 1);
    if (weights.length) trace.reward_weights = Object.fromEntries(weights);
    trace.metrics = { ...this.#s.recorder.metrics, ...scores.metrics };
    trace.ok = true;
  }

  /** Close the toolsets and stop the agent's sandbox if this rollout owns it and still holds it. */
  async dispose(): Promise<void> {
    const s = this.#s;
    const toolbox = s.toolbox;
    s.toolbox = null;
    await toolbox?.close();
    await s.agentStopping;
    await s.stopAgent();
    await Promise.all(s.graderStopping.splice(0));
  }

  /**
   * {@link TaskRollout.close}, then {@link TaskRollout.dispose} whatever happens: an interrupt
   * during close is thrown once the sandboxes are gone.
   */
  async finish(options: { stopCondition?: string } = {}): Promise<TaskTrace> {
    try {
      return await this.close(options);
    } finally {
      await this.dispose();
    }
  }

  /**
   * The whole rollout of one segment: open, step, close, and dispose whatever happens.
   * Failures are on the returned trace; only an interrupt throws (after the teardown).
   */
  async run(): Promise<TaskTrace> {
    try {
      if (await this.open()) await this.step();
    } catch (error) {
      await this.dispose();
      throw error;
    }
    return await this.finish();
  }
}

/** Run one task rollout and return its trace (errors are recorded on it, never thrown). */
export function runTaskRollout(options: TaskRolloutOptions): Promise<TaskTrace> {
  return new TaskRollout(options).run();
}
