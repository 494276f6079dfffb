/**
 * Tasks whose agents work inside sandboxes: the data a task carries, its lifecycle hooks
 * (setup, finalize, rewards, metrics, validate, stageVerifier) and Tasksets that load them.
 *
 * ```ts
 * class FileSumTask extends Task {
 *   static override NEEDS_CONTAINER = true;
 *   override async setup({ runtime }: TaskHookContext) {
 *     await runtime.write("/app/input.txt", "1\n2\n3\n");
 *     await runtime.write("/app/output/answer.txt", "");
 *   }
 *   correct = reward(async ({ runtime }) =>
 *     new TextDecoder().decode(await runtime.read("/app/output/answer.txt")).trim() === "6" ? 1 : 0
 *   );
 * }
 * ```
 * @module
 */
import { createHash } from "node:crypto";
import { ConfigError, RewardError, VfError } from "../errors.ts";
import { describeWhere } from "../util/_user_frame.ts";
import type { Runtime } from "../../runtimes/runtime.ts";
import type { TaskData } from "./task_data.ts";
import type { SandboxSource } from "../../runtimes/pool.ts";
import type { Messages } from "../types.ts";
import { promptText } from "../scoring/judges/reference.ts";
import type { ToolsetSpec } from "../tools/toolset.ts";
import type { Toolbox } from "../tools/toolbox.ts";

/** A runtime as configured in TOML; the schema it is inferred from is runtimes/config.ts'. */
export type { RuntimeConfig } from "../../runtimes/config.ts";

/** Task data and its parts; the type is inferred from the wire's schema (task_data.ts). */
export type { Artifact, ScoringConfig, TaskData, TaskTimeouts } from "./task_data.ts";

/** Run-time knobs passed to every task (`[env.taskset.task]`). */
export interface TaskConfig {
  [key: string]: unknown;
}

/** Dataset-level options (`[env.taskset]`). */
export interface TasksetConfig {
  id?: string;
  task?: TaskConfig;
  [key: string]: unknown;
}

/** The default artifact bound: 32 MiB. */
export const DEFAULT_ARTIFACT_MAX_BYTES = 32 * 1024 * 1024;

/** A rollout's record, handed to hooks; `info` is persisted with the trace. */
export interface TraceView {
  /** JSON-serialisable notes persisted on the trace. */
  info: Record<string, unknown>;
  /** The conversation so far. */
  messages: Messages;
  /** Collected artifact archives by source (evaluator memory only). */
  artifacts: Map<string, Uint8Array | null>;
}

/** What every task hook receives. */
export interface TaskHookContext<S extends Record<string, unknown> = Record<string, unknown>> {
  runtime: Runtime;
  task: Task;
  data: TaskData;
  trace: TraceView;
  /**
   * This rollout's own state (from {@link Task.initialState}): one object per rollout, shared
   * by the task's hooks, its rewards and the harness; never persisted.
   */
  state: S;
  /** The run's id (sandbox labels); set by the rollout and by `vf validate`. */
  runId?: string;
  /** The rollout's toolsets, open until teardown: rewards may call their tools. */
  tools?: Toolbox;
  /**
   * Where `gradeSubmission` starts its grading sandbox: `vf validate` sets it when sandbox
   * limits apply, so the grader counts against them. Default: started directly.
   */
  sandboxes?: SandboxSource;
  signal?: AbortSignal;
}

/** What {@link Task.userMessage} receives after each of the agent's turns. */
export interface UserTurnContext<S extends Record<string, unknown> = Record<string, unknown>> {
  /** User turns sent so far (the prompt is not one). */
  turn: number;
  /** The text of the agent's last reply. */
  lastReply: string;
  /** The whole conversation so far. */
  messages: Messages;
  data: TaskData;
  state: S;
  /** The rollout's persisted notes (`trace.info`). */
  info: Record<string, unknown>;
}

/** A reward or metric function of a task. */
export type TaskScoreFunc = (
  // deno-lint-ignore no-explicit-any
  ctx: TaskHookContext<any>,
) => number | boolean | Record<string, number> | Promise<number | boolean | Record<string, number>>;

const SCORE = Symbol.for("vf.task_score");

interface ScoreMark {
  kind: "reward" | "metric" | "stop";
  weight: number;
  priority: number;
  /** Scores from the trace alone (no live sandbox): it runs in offline rescoring. */
  offline?: boolean;
}

/** A marked scoring function, callable like the original. */
export type MarkedScoreFunc = TaskScoreFunc & { [SCORE]: ScoreMark };

/** What a method decorator receives as its second argument (TC39 decorators). */
interface MethodDecoratorContext {
  kind: "method";
  name: string | symbol;
}

function isDecoratorContext(value: unknown): value is MethodDecoratorContext {
  return typeof value === "object" && value !== null &&
    (value as { kind?: unknown }).kind === "method";
}

/**
 * Mark a task field as a reward (weight default 1.0); its field name is the reward name.
 * Also a method decorator: `@reward async correct(ctx) { ... }`.
 */
export function reward<F extends TaskScoreFunc>(fn: F, context: MethodDecoratorContext): F;
export function reward(
  fn: TaskScoreFunc,
  options?: { weight?: number; priority?: number; offline?: boolean },
): MarkedScoreFunc;
export function reward(
  fn: TaskScoreFunc,
  options: { weight?: number; priority?: number; offline?: boolean } | MethodDecoratorContext = {},
): MarkedScoreFunc {
  const o = isDecoratorContext(options) ? {} : options;
  return Object.assign(fn, {
    [SCORE]: {
      kind: "reward",
      weight: o.weight ?? 1,
      priority: o.priority ?? 0,
      offline: o.offline,
    } as ScoreMark,
  });
}

/**
 * Mark a task field as a metric (recorded, never summed into the reward). Also a method
 * decorator: `@metric async turns(ctx) { ... }`.
 */
export function metric<F extends TaskScoreFunc>(fn: F, context: MethodDecoratorContext): F;
export function metric(
  fn: TaskScoreFunc,
  options?: { priority?: number; offline?: boolean },
): MarkedScoreFunc;
export function metric(
  fn: TaskScoreFunc,
  options: { priority?: number; offline?: boolean } | MethodDecoratorContext = {},
): MarkedScoreFunc {
  const o = isDecoratorContext(options) ? {} : options;
  return Object.assign(fn, {
    [SCORE]: {
      kind: "metric",
      weight: 0,
      priority: o.priority ?? 0,
      offline: o.offline,
    } as ScoreMark,
  });
}

/** What a stop condition sees before each model call. */
export interface StopContext {
  data: TaskData;
  /** The conversation so far. */
  messages: Messages;
  /** Model calls made so far. */
  turn: number;
  usage: { input_tokens: number; output_tokens: number };
  state: Record<string, unknown>;
}

/** A stop condition: true ends the rollout before the next model call (a clean end). */
export type StopFunc = (ctx: StopContext) => boolean | Promise<boolean>;

/**
 * Mark a task field as a stop condition, checked before every model call: the first that
 * returns true ends the rollout with its name as `stop_condition`, and the rollout is still
 * finalized and scored.
 */
export function stop(fn: StopFunc, options: { priority?: number } = {}): StopFunc {
  return Object.assign(fn, {
    [SCORE]: { kind: "stop", weight: 0, priority: options.priority ?? 0 } as ScoreMark,
  });
}

/** One discovered scoring hook. */
export interface ScoreHook {
  name: string;
  kind: "reward" | "metric";
  weight: number;
  priority: number;
  /** Runs in offline rescoring (from the trace alone). */
  offline?: boolean;
  fn: TaskScoreFunc;
}

/** One stop condition of a task. */
export interface StopHook {
  name: string;
  priority: number;
  fn: StopFunc;
}

/**
 * A hook plugged in from the task config (`[env.taskset.task.rewards.<name>]`, `metrics`,
 * `stops`): `fn` replaces (or adds) the hook of that name; without `fn`, only its weight or
 * priority change.
 */
export interface PluggedHook {
  fn?: TaskScoreFunc | StopFunc;
  weight?: number;
  priority?: number;
  offline?: boolean;
}

/** Results of scoring one rollout. */
export interface TaskScores {
  reward: number;
  rewards: Record<string, number>;
  metrics: Record<string, number>;
  /** Each reward's weight in `reward` (default 1 where absent). */
  weights?: Record<string, number>;
}

function sortedKeysJson(value: unknown): string {
  if (Array.isArray(value)) return `[${value.map(sortedKeysJson).join(",")}]`;
  if (value && typeof value === "object") {
    const entries = Object.entries(value as Record<string, unknown>)
      .filter(([, v]) => v !== undefined && v !== null)
      .sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
    return `{${entries.map(([k, v]) => `${JSON.stringify(k)}:${sortedKeysJson(v)}`).join(",")}}`;
  }
  return JSON.stringify(value);
}

/** A task: data plus hooks. Subclass it and override the hooks you need. */
export class Task<
  D extends TaskData = TaskData,
  S extends Record<string, unknown> = Record<string, unknown>,
> {
  /** When true, the subprocess runtime is refused before any work starts. */
  static NEEDS_CONTAINER = false;
  /**
   * The harness this task's agents use unless the run names one (`--env.<role>.harness.id`):
   * a task that needs no code execution can say `"null"`. Default: `bash`.
   */
  static HARNESS: string | null = null;
  readonly data: D;
  readonly config: TaskConfig;

  constructor(data: D, config: TaskConfig = {}) {
    this.data = data;
    this.config = config;
  }

  /** sha256 of the data's canonical JSON (the resume key when no id is set). */
  get hash(): string {
    const { idx: _idx, ...rest } = this.data;
    return createHash("sha256").update(sortedKeysJson(rest)).digest("hex");
  }

  /** Stable identity: `data.id`, else the hash. */
  get key(): string {
    return this.data.id ?? this.hash;
  }

  /** The harness id this task asks for when the run names none ({@link Task.HARNESS}). */
  get defaultHarness(): string | null {
    return (this.constructor as typeof Task).HARNESS;
  }

  /** A fresh state object for one rollout (see {@link TaskHookContext.state}). */
  initialState(): S {
    return {} as S;
  }

  /**
   * Script the user across turns: called after each of the agent's replies, it returns the
   * next user message, or null/undefined to end the rollout. Overriding it makes the run an
   * interaction (the agent's harness must be able to resume).
   */
  userMessage(
    _ctx: UserTurnContext<S>,
  ): string | Messages | null | undefined | Promise<string | Messages | null | undefined> {
    return undefined;
  }

  /**
   * Whether each scripted user turn starts the agent afresh: a new session of its harness (a
   * new conversation, the same sandbox) given the turn's message as its prompt, instead of
   * the conversation resumed; any harness can then run it. Default false.
   */
  get freshSessions(): boolean {
    return false;
  }

  /**
   * A limit of the task's own for the agent's session `session` (0-based: the first run, then
   * one per scripted user turn), in seconds; undefined (the default) for the rollout's one agent
   * budget over all sessions, whose end fails the rollout. A session that outlasts its own
   * limit (the policy's agent timeout, when set, stands in for it) is stopped, the task is told
   * ({@link Task.sessionTimedOut}) and the rollout goes on: its next user turn, its scoring.
   */
  sessionTimeout(_session: number): number | undefined {
    return undefined;
  }

  /** Told that the agent's session `session` outlasted its {@link Task.sessionTimeout}. */
  sessionTimedOut(
    _ctx: { session: number; seconds: number; message: string; state: S },
  ): void | Promise<void> {}

  /** Whether this task scripts user turns ({@link Task.userMessage} is overridden). */
  get scriptsUser(): boolean {
    return this.userMessage !== Task.prototype.userMessage;
  }

  /** Whether this task's class needs a container runtime. */
  get needsContainer(): boolean {
    return (this.constructor as typeof Task).NEEDS_CONTAINER || Boolean(this.data.image);
  }

  /**
   * The prompt as text: each message's text (its text parts joined by newlines, images
   * dropped), messages with text joined by blank lines; the same as {@link promptText}.
   */
  get promptText(): string {
    return promptText(this.data.prompt);
  }

  /** Prepare the sandbox (runs in the agent sandbox and again in a grading sandbox). */
  setup(_ctx: TaskHookContext<S>): Promise<void> | void {}

  /** After the agent, before scoring, with the agent sandbox alive. */
  finalize(_ctx: TaskHookContext<S>): Promise<void> | void {}

  /** Grading sandbox only, after artifacts are restored: stage private tests here. */
  stageVerifier(_ctx: TaskHookContext<S>): Promise<void> | void {}

  /**
   * A model-free gold check: make the workspace solved; `vf validate` expects reward 1.0
   * after it, scored in this sandbox. `vf validate` never calls `stageVerifier` or moves
   * artifacts by itself: a task graded in isolation returns
   * `await gradeSubmission(ctx)` here (the full flow: artifacts into a fresh grading sandbox,
   * `stageVerifier`, scoring), and those scores are the gold result.
   */
  validate(
    _ctx: TaskHookContext<S>,
  ): Promise<boolean | void | TaskScores> | boolean | void | TaskScores {
    return true;
  }

  /**
   * This task's toolsets (MCP servers, or tools written in TypeScript): opened for each
   * rollout after setup, offered to the agent as `<toolset>_<tool>`, closed at teardown.
   */
  toolsets(): ToolsetSpec[] {
    return [];
  }

  /**
   * Services the agent works with (an app and its database): a Compose document (an object)
   * or the path of a Compose file, in the subset `lib/services/compose.ts` names. On Docker
   * each rollout gets them fresh on a network of its own, reached by service name. Default
   * none.
   */
  deploymentSpec(): string | Record<string, unknown> | null {
    return null;
  }

  /** Environment variables for the sandbox and every process in it (never traced). */
  runtimeEnv(): Record<string, string> {
    return { ...(this.data.env ?? {}) };
  }

  /**
   * Reward and metric fields of this task (and methods marked `@reward` / `@metric`), by
   * descending priority then name.
   */
  scoreHooks(): ScoreHook[] {
    return this.#hooks().filter((h): h is ScoreHook & { kind: "reward" | "metric" } =>
      h.kind !== "stop"
    );
  }

  /** Stop conditions of this task (fields marked with `stop()`, and plugged ones), by priority. */
  stopHooks(): StopHook[] {
    return this.#hooks().filter((h) => h.kind === "stop").map((h) => ({
      name: h.name,
      priority: h.priority,
      fn: h.fn as unknown as StopFunc,
    }));
  }

  /** Marked fields and methods, then the task config's plugged hooks merged by name. */
  #hooks(): Array<Omit<ScoreHook, "kind"> & { kind: ScoreMark["kind"] }> {
    type Hook = Omit<ScoreHook, "kind"> & { kind: ScoreMark["kind"] };
    const hooks: Hook[] = [];
    const seen = new Set<string>();
    const add = (name: string, value: unknown, bind: boolean) => {
      if (seen.has(name) || typeof value !== "function") return;
      const mark = (value as Partial<MarkedScoreFunc>)[SCORE];
      if (!mark) return;
      seen.add(name);
      const fn = bind ? (value as TaskScoreFunc).bind(this) : value as TaskScoreFunc;
      hooks.push({ name, fn, ...mark });
    };
    for (const [name, value] of Object.entries(this)) add(name, value, false);
    for (const name of ownMethodNames(this)) {
      add(name, (this as unknown as Record<string, unknown>)[name], true);
    }
    const plugged: Array<["reward" | "metric" | "stop", string]> = [
      ["reward", "rewards"],
      ["metric", "metrics"],
      ["stop", "stops"],
    ];
    for (const [kind, key] of plugged) {
      const table = this.config[key] as Record<string, PluggedHook> | undefined;
      for (const [name, entry] of Object.entries(table ?? {})) {
        const at = hooks.findIndex((h) => h.name === name && h.kind === kind);
        const old = at >= 0 ? hooks[at] : undefined;
        if (typeof entry?.fn === "string") {
          throw new ConfigError(
            `env.taskset.task.${key}.${name}.fn: "${entry.fn}" was not loaded; plugged hooks are ` +
              `resolved by vf run / vf eval (or pass the function itself)`,
          );
        }
        if (!entry?.fn && !old) {
          throw new ConfigError(
            `env.taskset.task.${key}.${name}: the task has no ${kind} named "${name}"; give fn ` +
              `to add one`,
          );
        }
        const hook: Hook = {
          name,
          kind,
          fn: (entry.fn ?? old!.fn) as TaskScoreFunc,
          weight: kind === "reward" ? entry.weight ?? old?.weight ?? 1 : 0,
          priority: entry.priority ?? old?.priority ?? 0,
          offline: entry.offline ?? (entry.fn ? undefined : old?.offline),
        };
        if (old) hooks[at] = hook;
        else hooks.push(hook);
      }
    }
    return hooks.sort((a, b) => b.priority - a.priority || (a.name < b.name ? -1 : 1));
  }

  /**
   * Run rewards and metrics; a throwing hook propagates (the caller decides retry vs error).
   * With `offline` (rescoring a saved trace, no sandbox), only hooks marked `offline` run;
   * the names of the others are returned in `skipped`.
   */
  async score(
    ctx: TaskHookContext<S>,
    options: { offline?: boolean } = {},
  ): Promise<TaskScores & { skipped?: string[] }> {
    const rewards: Record<string, number> = {};
    const metrics: Record<string, number> = {};
    const weights: Record<string, number> = {};
    const skipped: string[] = [];
    let total = 0;
    for (const hook of this.scoreHooks()) {
      if (options.offline && !hook.offline) {
        skipped.push(hook.name);
        continue;
      }
      let value;
      try {
        value = await hook.fn(ctx);
      } catch (error) {
        // vf's own errors (a sandbox gone, a timeout) keep their type: the caller retries or
        // records them. Anything else is the hook's own failure, named.
        if (error instanceof VfError) throw error;
        throw new RewardError(`${hook.kind} "${hook.name}" failed: ${describeWhere(error)}`, {
          cause: error,
        });
      }
      const entries: Array<[string, number]> = typeof value === "object"
        ? Object.entries(value).map(([k, v]) => [k, Number(v)])
        : [[hook.name, typeof value === "boolean" ? (value ? 1 : 0) : Number(value)]];
      for (const [name, v] of entries) {
        if (!Number.isFinite(v)) {
          throw new RewardError(`${hook.kind} "${name}" returned ${v}, not a number`);
        }
        if (hook.kind === "reward") {
          rewards[name] = v;
          weights[name] = hook.weight;
          total += v * hook.weight;
        } else metrics[name] = v;
      }
    }
    return { reward: total, rewards, metrics, weights, ...(options.offline && { skipped }) };
  }
}

/** Loads tasks. Subclass and implement `load()`; selection (-n, shuffle) is the run's job. */
export abstract class Taskset<T extends Task = Task> {
  readonly config: TasksetConfig;

  constructor(config: TasksetConfig = {}) {
    this.config = config;
  }

  /** The taskset's id (used for output paths). */
  abstract get id(): string;

  /**
   * Fork-per-group by default for this taskset: a task's first rollout runs setup and its
   * sandbox is snapshotted, the task's other rollouts start from that snapshot without setup.
   * Only for a setup whose work is all in the sandbox's files, `trace.info` and a cloneable
   * state (no processes it leaves running). `fork_group` under `[env]` overrides it.
   */
  readonly forkGroup: boolean = false;

  /** The tasks, in a stable order. May be a (lazy) iterable. */
  abstract load(): Iterable<T> | AsyncIterable<T> | Promise<Iterable<T>>;

  /**
   * A view of the first `n` tasks, as upstream's `Taskset.head(n)`: lazy and bounded, so a lazy
   * `load()` builds no more than `n`; the taskset itself is left as it was. The view answers
   * everything else as the taskset does.
   * @throws {RangeError} when `n` is not a whole number
   * @example
   * ```ts ignore
   * const firstThree = await taskset.head(3).tasks();
   * ```
   */
  head(n: number): this {
    if (!Number.isInteger(n) || n < 0) {
      throw new RangeError(`Taskset.head(n) takes a whole number of tasks, got ${n}`);
    }
    const source = () => this.load();
    async function* load(): AsyncIterable<T> {
      if (n === 0) return;
      let taken = 0;
      for await (const task of (await source()) as AsyncIterable<T>) {
        yield task;
        if (++taken >= n) return; // stops the source before it builds another
      }
    }
    return new Proxy(this, {
      get(target, prop, receiver) {
        if (prop === "load") return load;
        // Taskset's own methods read the view; a subclass's run on the taskset (its #fields).
        if (prop === "tasks" || prop === "head") return Reflect.get(target, prop, receiver);
        const value = Reflect.get(target, prop, target);
        return typeof value === "function" ? value.bind(target) : value;
      },
    });
  }

  /**
   * Load up to `limit` tasks (all with a negative limit), assigning `idx` from load order.
   * A lazy `load()` is asked for no more than `limit` tasks: the loop stops as the last one
   * arrives, before the generator builds another.
   */
  async tasks(limit = -1): Promise<T[]> {
    const out: T[] = [];
    if (limit === 0) return out;
    const source = await this.load();
    for await (const task of source as AsyncIterable<T>) {
      (task.data as TaskData).idx ??= out.length;
      out.push(task);
      if (limit > 0 && out.length >= limit) break;
    }
    const keys = new Set<string>();
    for (const t of out) {
      if (keys.has(t.key)) {
        throw new RangeError(`Taskset "${this.id}" has two tasks with key "${t.key}"`);
      }
      keys.add(t.key);
    }
    return out;
  }
}

/** What a taskset package exports. */
export interface TasksetModule {
  loadTaskset: (config: TasksetConfig) => Taskset | Promise<Taskset>;
}

/** Text of a UTF-8 file read from a runtime. */
export async function readText(runtime: Runtime, path: string, maxBytes?: number): Promise<string> {
  return new TextDecoder().decode(await runtime.read(path, { maxBytes }));
}

/** Methods a Task subclass defines beyond Task's own (getters excluded). */
function ownMethodNames(task: Task): string[] {
  // Task's own hooks and members are never mistaken for a reward written as a method.
  const taskMembers = new Set(Object.getOwnPropertyNames(Task.prototype));
  const names: string[] = [];
  for (
    let proto = Object.getPrototypeOf(task);
    proto && proto !== Task.prototype && proto !== Object.prototype;
    proto = Object.getPrototypeOf(proto)
  ) {
    for (const name of Object.getOwnPropertyNames(proto)) {
      const desc = Object.getOwnPropertyDescriptor(proto, name);
      if (taskMembers.has(name) || !desc || typeof desc.value !== "function") continue;
      if (!names.includes(name)) names.push(name);
    }
  }
  return names;
}

/**
 * A task that could never earn a reward: it overrides no `score()`, declares no reward, and
 * no judge adds one. Every rollout would score 0, so the load fails instead, naming the class
 * and the methods that look like rewards written as plain methods.
 * @throws {ConfigError}
 */
export function requireRewards(task: Task, options: { judges?: number } = {}): void {
  if (task.score !== Task.prototype.score || (options.judges ?? 0) > 0) return;
  if (task.scoreHooks().some((h) => h.kind === "reward")) return;
  const cls = task.constructor.name || "Task";
  const methods = ownMethodNames(task).filter((m) =>
    !(task as unknown as Record<string, { [SCORE]?: unknown }>)[m]?.[SCORE]
  );
  const hint = methods.length
    ? `its method${methods.length > 1 ? "s" : ""} ${methods.map((m) => `${m}()`).join(", ")} ${
      methods.length > 1 ? "are" : "is"
    } not a reward: declare a field ` +
      `(${methods[0]} = reward(async (ctx) => ...)) or mark the method @reward`
    : `declare one as a field: correct = reward(async (ctx) => ...)`;
  throw new ConfigError(
    `Task class "${cls}" has no rewards, so every rollout would score 0; ${hint}`,
  );
}
