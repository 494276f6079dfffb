/**
 * Agents inside an episode: each role of an Env is an {@link EpisodeAgent} that can run a
 * task to completion, hold an {@link Interaction} (the caller plays the user, turn by turn),
 * or provision a sandbox that several runs share. Every finished run joins the episode.
 * @module
 */
import type { ChatClient } from "../model/client.ts";
import type { ComposeCache } from "../services/cache.ts";
import type { Semaphore } from "../model/limits.ts";
import { ConfigError, EnvError, serializeError } from "../errors.ts";
import type { Harness } from "../tasks/harness.ts";
import { getHarness } from "../tasks/harness_registry.ts";
import {
  type AgentPolicy,
  type Box,
  resolveRuntimeSpec,
  type RolloutRecord,
  type Segment,
  TaskRollout,
  type TaskTrace,
} from "../tasks/rollout/mod.ts";
import type { Task, TraceView } from "../tasks/task.ts";
import type { GroupForks } from "../tasks/fork.ts";
import { acquireSandbox } from "../tasks/sandbox.ts";
import type { Judge } from "../scoring/judges/judge.ts";
import type { ToolsetSpec } from "../tools/toolset.ts";
import type { Toolbox } from "../tools/toolbox.ts";
import type { Messages, SamplingArgs } from "../types.ts";

/** A role's harness: an object, or a config whose `id` names a built-in (none: the task's choice). */
export type HarnessChoice = Harness | { id?: string; [key: string]: unknown };

/** One role of an Env, resolved: which model it talks to and how its runs are set up. */
export interface AgentRole {
  /** The role's name (`agent`, `solver`, `judge`, `user`, ...). */
  name: string;
  client: ChatClient;
  model: string;
  samplingArgs?: SamplingArgs;
  /** Runtime, scoring, limits and sandbox source of the role's runs. */
  policy: Omit<AgentPolicy, "harness">;
  /** Default: the task's {@link Task.HARNESS}, else `bash`. */
  harness?: HarnessChoice;
  /** Default true; an Env's `setup` may change it for the episode. */
  trainable?: boolean;
}

/** What the agents of one episode share. */
export interface EpisodeScope {
  tasksetId: string;
  runId: string;
  episodeIndex: number;
  /** Agent runs of this episode active at once. */
  permits: Semaphore;
  signal?: AbortSignal;
  /**
   * Called with every finished trace, in completion order, and what its sandboxes and
   * toolsets did (for `vf replay`; null when it used neither).
   */
  onTrace: (trace: TaskTrace, record?: RolloutRecord | null) => void;
  /** The run's configured judges: they score every run of a trainable role. */
  judges?: Judge[];
  /** The run's toolsets: offered to every run of a trainable role. */
  toolsets?: ToolsetSpec[];
  /** The run's shared toolsets, open for the whole run. */
  sharedTools?: Toolbox;
  /** The run's Compose file for tasks without services of their own (trainable roles). */
  services?: string;
  /** Where the run's Compose specs are parsed, once for the whole run. */
  composeCache?: ComposeCache;
  /** The run's fork groups (`fork_group`), for trainable roles' runs. */
  forks?: GroupForks;
  /** Interactions not closed yet: the episode closes them if its Env did not. */
  interactions: Set<Interaction>;
  /** The traces that joined the episode. */
  traces: Set<TaskTrace>;
}

/** A finished agent run: its trace plus what stays in evaluator memory. */
export interface AgentRun {
  trace: TaskTrace;
  /** Collected artifact archives by path (with `keepArtifacts`, or isolated scoring). */
  artifacts: TraceView["artifacts"];
  /** The run's state object (never persisted). */
  state: Record<string, unknown>;
  /** What the run's sandboxes and toolsets did (null when it used neither). */
  record: RolloutRecord | null;
}

/** Options of {@link EpisodeAgent.run} and {@link EpisodeAgent.interaction}. */
export interface AgentRunOptions {
  /** Work in this sandbox (from {@link EpisodeAgent.provision}); it is never stopped by the run. */
  box?: Box;
  /** Keep the declared artifacts in evaluator memory (for a judge that restores them elsewhere). */
  keepArtifacts?: boolean;
  /** The task's prompt is not sent: the first turn brings the user's message. */
  promptless?: boolean;
}

const harnessCache = new WeakMap<AgentRole, Map<string, Harness>>();

/** The harness a role uses for a task: its own choice, else the task's, else `bash`. */
export function harnessFor(role: AgentRole, task: Pick<Task, "defaultHarness">): Harness {
  const choice = role.harness;
  if (choice && typeof (choice as Harness).run === "function") return choice as Harness;
  const config = (choice ?? {}) as { id?: string };
  const id = config.id ?? task.defaultHarness ?? "bash";
  let cache = harnessCache.get(role);
  if (!cache) harnessCache.set(role, cache = new Map());
  let harness = cache.get(id);
  if (!harness) cache.set(id, harness = getHarness(id, config));
  return harness;
}

/** A role's agent inside one episode. */
export class EpisodeAgent {
  readonly role: string;
  /** Whether this role's traces are training data; an Env's `setup` may turn it off. */
  trainable: boolean;
  readonly #spec: AgentRole;
  readonly #scope: EpisodeScope;
  #runs = 0;

  constructor(spec: AgentRole, scope: EpisodeScope) {
    this.role = spec.name;
    this.trainable = spec.trainable ?? true;
    this.#spec = spec;
    this.#scope = scope;
  }

  /** The model this role talks to. */
  get model(): string {
    return this.#spec.model;
  }

  #rollout(task: Task, options: AgentRunOptions): TaskRollout {
    const harness = harnessFor(this.#spec, task);
    const rollout = new TaskRollout({
      task,
      tasksetId: this.#scope.tasksetId,
      policy: { ...this.#spec.policy, harness },
      client: this.#spec.client,
      model: this.#spec.model,
      samplingArgs: this.#spec.samplingArgs,
      runId: this.#scope.runId,
      rolloutIndex: this.#scope.episodeIndex,
      signal: this.#scope.signal,
      role: this.role,
      trainable: this.trainable,
      box: options.box,
      keepArtifacts: options.keepArtifacts,
      promptless: options.promptless,
      judges: this.trainable ? this.#scope.judges : undefined,
      toolsets: this.trainable ? this.#scope.toolsets : undefined,
      sharedTools: this.trainable ? this.#scope.sharedTools : undefined,
      services: this.trainable ? this.#scope.services : undefined,
      composeCache: this.#scope.composeCache,
      forks: this.trainable ? this.#scope.forks : undefined,
    });
    rollout.trace.attempt = this.#runs++;
    return rollout;
  }

  /**
   * A run the episode's timeout cut short keeps its trace, with the timeout as its error; an
   * interrupt of the whole run (anything else that aborts) leaves nothing.
   */
  recordCutShort(rollout: TaskRollout): void {
    const reason = this.#scope.signal?.reason;
    if (!this.#scope.signal?.aborted || !(reason instanceof EnvError)) return;
    const trace = rollout.trace;
    if (this.#scope.traces.has(trace)) return;
    trace.ok = false;
    trace.error ??= { ...serializeError(reason), phase: "env" };
    trace.stop_condition ??= "has_error";
    this.#scope.onTrace(trace, rollout.record);
  }

  // deno-lint-ignore require-await
  async #finish(rollout: TaskRollout, _task: Task): Promise<AgentRun> {
    const { trace, record } = rollout;
    this.#scope.onTrace(trace, record);
    return { trace, artifacts: rollout.view.artifacts, state: rollout.state, record };
  }

  /**
   * Run `task` to completion: sandbox, setup, the harness until the agent answers, finalize,
   * scoring. A failed run is data (its trace holds the error); only an interrupt throws.
   */
  async run(task: Task, options: AgentRunOptions = {}): Promise<AgentRun> {
    // Built first: a bad harness id throws here, before a permit is held.
    const rollout = this.#rollout(task, options);
    const release = await this.#scope.permits.acquire({ signal: this.#scope.signal });
    try {
      await rollout.run();
    } catch (error) {
      this.recordCutShort(rollout);
      throw error;
    } finally {
      release();
    }
    return await this.#finish(rollout, task);
  }

  /**
   * Open a run the caller drives turn by turn: `turn()` runs one harness segment, `close()`
   * (or leaving an `await using` block) finalizes and scores it. The role's harness must be
   * able to resume.
   * @throws {ConfigError} when the harness cannot resume
   * @throws {EnvError} when the run cannot be opened (its trace still joins the episode)
   */
  async interaction(task: Task, options: AgentRunOptions = {}): Promise<Interaction> {
    const harness = harnessFor(this.#spec, task);
    if (!task.freshSessions && (!harness.supportsResume || !harness.resume)) {
      throw new ConfigError(
        `Harness "${harness.id}" cannot resume a conversation, so role "${this.role}" cannot ` +
          `hold an interaction; use a harness that can (bash, null)`,
      );
    }
    const rollout = this.#rollout(task, options);
    const release = await this.#scope.permits.acquire({ signal: this.#scope.signal });
    try {
      if (!await rollout.open()) {
        await rollout.close();
        const run = await this.#finish(rollout, task);
        const e = run.trace.error;
        throw new EnvError(
          `Role "${this.role}" could not open its run of task "${task.key}": ${e?.error}: ${e?.message}`,
        );
      }
    } catch (error) {
      await rollout.dispose();
      this.recordCutShort(rollout);
      throw error;
    } finally {
      release();
    }
    return new Interaction(
      rollout,
      this.#scope,
      () => this.#finish(rollout, task),
      () => this.recordCutShort(rollout),
    );
  }

  /**
   * A started sandbox built from this role's runtime policy for `task`, for runs that share
   * it (`run(task, { box })`); stopped when disposed.
   */
  async provision(task: Task): Promise<Box & AsyncDisposable> {
    const spec = resolveRuntimeSpec(this.#spec.policy.runtime, task, "agent");
    const runtime = await acquireSandbox(spec, {
      runId: this.#scope.runId,
      task: task.key,
      role: "agent",
      sandboxes: this.#spec.policy.sandboxes,
      signal: this.#scope.signal,
    });
    return { runtime, spec, [Symbol.asyncDispose]: () => runtime.stop() };
  }
}

/** A run the caller drives turn by turn (see {@link EpisodeAgent.interaction}). */
export class Interaction implements AsyncDisposable {
  readonly #rollout: TaskRollout;
  readonly #scope: EpisodeScope;
  readonly #finish: () => Promise<AgentRun>;
  readonly #cutShort: () => void;
  #result: Promise<AgentRun> | null = null;
  #terminated = false;
  #turns = 0;

  constructor(
    rollout: TaskRollout,
    scope: EpisodeScope,
    finish: () => Promise<AgentRun>,
    cutShort: () => void,
  ) {
    this.#rollout = rollout;
    this.#scope = scope;
    this.#finish = finish;
    this.#cutShort = cutShort;
    scope.interactions.add(this);
  }

  /** The run's trace (final once closed). */
  get trace(): TaskTrace {
    return this.#rollout.trace;
  }

  /** The run's state object. */
  get state(): Record<string, unknown> {
    return this.#rollout.state;
  }

  /**
   * One harness segment. A prompted task opens with a bare `turn()`; a prompt-less one (and
   * every later turn) passes the user's message.
   */
  async turn(message?: string | Messages): Promise<Segment> {
    if (this.#result) throw new TypeError("This interaction is closed");
    const messages: Messages | undefined = message === undefined
      ? undefined
      : typeof message === "string"
      ? [{ role: "user", content: message }]
      : message;
    const release = await this.#scope.permits.acquire({ signal: this.#scope.signal });
    try {
      const segment = await this.#rollout.step(messages);
      this.#turns++;
      if (segment.terminated) this.#terminated = true;
      return segment;
    } finally {
      release();
    }
  }

  /** Finish the run (finalize, scoring, teardown); idempotent. */
  close(): Promise<AgentRun> {
    this.#result ??= (async () => {
      this.#scope.interactions.delete(this);
      try {
        await this.#rollout.finish(this.#terminated ? {} : { stopCondition: "user_closed" });
      } catch (error) {
        this.#cutShort();
        throw error;
      }
      return await this.#finish();
    })();
    return this.#result;
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.close();
  }
}
