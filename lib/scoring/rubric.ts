/**
 * Rubrics turn finished rollouts into a reward and named metrics.
 *
 * A reward function receives one context object and destructures what it needs:
 * `({ completion, answer, parser }) => number`. Group functions (flagged with
 * {@link groupReward}) see the whole group at once: `({ completions, answers }) => number[]`.
 * @module
 */
import { Parser } from "./parser.ts";
import type { State } from "../state.ts";
import type { Messages } from "../types.ts";
import { RewardError, ToolError } from "../errors.ts";
import { userFrame } from "../util/_user_frame.ts";

/** What an individual reward function receives. */
export interface RewardContext {
  prompt: Messages;
  completion: Messages;
  answer: string;
  state: State;
  task: string;
  info: Record<string, unknown>;
  example_id: number;
  parser: Parser<unknown>;
  // deno-lint-ignore no-explicit-any
  [classObject: string]: any;
}

/** What a group reward function receives: the plural lists, index-aligned with the group. */
export interface GroupRewardContext {
  prompts: Messages[];
  completions: Messages[];
  answers: string[];
  states: State[];
  tasks: string[];
  infos: Record<string, unknown>[];
  parser: Parser<unknown>;
  // deno-lint-ignore no-explicit-any
  [classObject: string]: any;
}

/** A reward or metric function over one rollout. */
export type RewardFunc = (ctx: RewardContext) => number | boolean | Promise<number | boolean>;
/** A reward or metric function over a whole group of rollouts. */
export type GroupRewardFunc = (ctx: GroupRewardContext) => number[] | Promise<number[]>;

const GROUP = Symbol.for("vf.group_reward");

/**
 * Mark a function as a group reward function. The result can go wherever a
 * {@link RewardFunc} goes (`funcs`, `addRewardFunc`, `addMetric`).
 */
export function groupReward(fn: GroupRewardFunc, name?: string): RewardFunc {
  Object.defineProperty(fn, GROUP, { value: true });
  if (name) Object.defineProperty(fn, "name", { value: name });
  return fn as unknown as RewardFunc;
}

function isGroupFunc(fn: unknown): fn is GroupRewardFunc {
  return typeof fn === "function" && (fn as unknown as Record<symbol, unknown>)[GROUP] === true;
}

/** One registered function. */
export interface RubricEntry {
  name: string;
  weight: number;
  fn: RewardFunc;
  group: boolean;
}

/** Options for {@link Rubric}. */
export interface RubricOptions {
  /** Reward functions in execution order (group functions flagged with `groupReward`). */
  funcs?: RewardFunc[];
  /** One weight per function; default (or an empty list) 1.0 each. */
  weights?: number[];
  /** The parser handed to reward functions as `parser`; default `new Parser()`. */
  parser?: Parser<unknown>;
}

/** Name a function for metrics: an explicit name, else `fn.name`, else `reward_<i>`. */
function funcName(fn: { name: string }, fallback: string): string {
  return fn.name && fn.name !== "anonymous" ? fn.name : fallback;
}

/** Weighted reward functions plus weight-0 metrics. */
export class Rubric {
  entries: RubricEntry[] = [];
  parser: Parser<unknown>;
  // deno-lint-ignore no-explicit-any
  classObjects: Record<string, any>;
  #cleanups: Array<{ name: string; priority: number; fn: (state: State) => unknown }> = [];
  #teardowns: Array<{ name: string; priority: number; fn: () => unknown }> = [];

  constructor(options: RubricOptions = {}) {
    const funcs = options.funcs ?? [];
    // An empty list means the default, as upstream's `weights or []` does.
    const weights = options.weights?.length ? options.weights : funcs.map(() => 1.0);
    if (weights.length !== funcs.length) {
      throw new RangeError(
        `Rubric got ${funcs.length} functions but ${weights.length} weights; give one weight per function`,
      );
    }
    this.parser = options.parser ?? new Parser();
    this.classObjects = { parser: this.parser };
    funcs.forEach((fn, i) => this.#add(fn, weights[i], undefined));
  }

  #add(fn: RewardFunc, weight: number, name: string | undefined): void {
    if (typeof fn !== "function") throw new TypeError("Reward functions must be functions");
    this.entries.push({
      fn,
      weight,
      group: isGroupFunc(fn),
      name: name ?? funcName(fn, `reward_${this.entries.length}`),
    });
  }

  /** Add a reward function (default weight 1.0). */
  addRewardFunc(fn: RewardFunc, weight = 1.0, name?: string): void {
    this.#add(fn, weight, name);
  }

  /** Add a metric: a function recorded in `metrics` with weight 0 by default. */
  addMetric(fn: RewardFunc, weight = 0.0, name?: string): void {
    this.#add(fn, weight, name);
  }

  /** Make an object available to reward functions under `name`. */
  addClassObject(name: string, obj: unknown): void {
    this.classObjects[name] = obj;
  }

  /** Register a per-rollout cleanup hook. */
  addCleanup(fn: (state: State) => unknown, options: { name?: string; priority?: number } = {}) {
    this.#cleanups.push({ fn, name: options.name ?? fn.name, priority: options.priority ?? 0 });
    sortHandlers(this.#cleanups);
  }

  /** Register a teardown hook, run once when the environment shuts down. */
  addTeardown(fn: () => unknown, options: { name?: string; priority?: number } = {}) {
    this.#teardowns.push({ fn, name: options.name ?? fn.name, priority: options.priority ?? 0 });
    sortHandlers(this.#teardowns);
  }

  /** Names of all functions, in order. */
  get funcNames(): string[] {
    return this.entries.map((e) => e.name);
  }

  /** Weights of all functions, in order. */
  get funcWeights(): number[] {
    return this.entries.map((e) => e.weight);
  }

  #context(state: State): RewardContext {
    // Most rubrics hold no class object but the parser: a literal of fixed shape is cheaper
    // than spreading them into every call's context.
    for (const key in this.classObjects) {
      if (key !== "parser") return { ...this.classObjects, ...this.#plainContext(state) };
    }
    return this.#plainContext(state);
  }

  #plainContext(state: State): RewardContext {
    return {
      prompt: state.prompt,
      completion: state.completion,
      answer: state.answer ?? "",
      state,
      task: state.task,
      info: state.info ?? {},
      example_id: state.example_id,
      parser: this.parser,
    };
  }

  /**
   * A score, or a promise of one when the function is async (sync ones skip the microtasks).
   * null when the function failed; the failure is then recorded on the state.
   */
  #callOne(entry: RubricEntry, state: State): number | null | Promise<number | null> {
    let value: unknown;
    try {
      value = (entry.fn as RewardFunc)(this.#context(state));
    } catch (error) {
      return rewardFailed(entry, error, state);
    }
    if (isThenable(value)) {
      return Promise.resolve(value).then(
        (v) => toScore(entry, v, state),
        (error) => rewardFailed(entry, error, state),
      );
    }
    return toScore(entry, value, state);
  }

  /** Score one rollout with individual functions only, sequentially. */
  async scoreRollout(state: State): Promise<void> {
    if (this.entries.some((e) => e.group)) {
      throw new TypeError(
        "scoreRollout() cannot run group reward functions; use scoreGroup() (drop independent scoring)",
      );
    }
    let reward = 0;
    const metrics: Record<string, number> = {};
    for (const entry of this.entries) {
      const called = this.#callOne(entry, state);
      const score = called instanceof Promise ? await called : called;
      if (score === null) continue;
      reward += score * entry.weight;
      metrics[entry.name] = score;
    }
    state.reward = reward;
    state.metrics = metrics;
  }

  /**
   * Score a group: functions in order; individual ones run concurrently across states. While
   * every function answers synchronously the whole group is scored without an async step.
   */
  scoreGroup(states: State[]): Promise<void> {
    if (states.length === 0) return RESOLVED;
    const sums = newSums(states.length);
    for (let e = 0; e < this.entries.length; e++) {
      const entry = this.entries[e];
      if (entry.group) return this.#scoreFrom(states, e, sums, null);
      const called = this.#callAll(entry, states);
      if (hasPromise(called)) return this.#scoreFrom(states, e, sums, called);
      addScores(entry, called as (number | null)[], sums);
    }
    applyGroupScores(states, sums.totals, sums.metrics);
    return RESOLVED;
  }

  /** The rest of {@link scoreGroup} from entry `from` on, once a function went async. */
  async #scoreFrom(
    states: State[],
    from: number,
    sums: Sums,
    pending: Array<number | null | Promise<number | null>> | null,
  ): Promise<void> {
    for (let e = from; e < this.entries.length; e++) {
      const entry = this.entries[e];
      let scores: (number | null)[];
      if (e === from && pending) scores = await Promise.all(pending);
      else if (entry.group) scores = await this.#groupScores(entry, states);
      else {
        const called = this.#callAll(entry, states);
        scores = hasPromise(called) ? await Promise.all(called) : called as (number | null)[];
      }
      addScores(entry, scores, sums);
    }
    applyGroupScores(states, sums.totals, sums.metrics);
  }

  #callAll(entry: RubricEntry, states: State[]): Array<number | null | Promise<number | null>> {
    // Sized up front: a push onto an empty array reserves 17 slots (this runs per function
    // per group, and groups are mostly of one).
    const called = new Array<number | null | Promise<number | null>>(states.length);
    for (let i = 0; i < states.length; i++) called[i] = this.#callOne(entry, states[i]);
    return called;
  }

  async #groupScores(entry: RubricEntry, states: State[]): Promise<(number | null)[]> {
    try {
      const ctx: GroupRewardContext = {
        ...this.classObjects,
        prompts: states.map((s) => s.prompt),
        completions: states.map((s) => s.completion),
        answers: states.map((s) => s.answer ?? ""),
        states,
        tasks: states.map((s) => s.task),
        infos: states.map((s) => s.info ?? {}),
        parser: this.parser,
      };
      const out = await (entry.fn as unknown as GroupRewardFunc)(ctx);
      if (!Array.isArray(out) || out.length !== states.length) {
        throw new TypeError(
          `returned ${Array.isArray(out) ? `${out.length} scores` : typeof out} ` +
            `for a group of ${states.length}`,
        );
      }
      return states.map((s, i) => toScore(entry, out[i], s));
    } catch (error) {
      return states.map((s) => rewardFailed(entry, error, s));
    }
  }

  /** Run the per-rollout cleanup hooks. */
  cleanup(state: State): Promise<void> {
    // Most rubrics have none: no async call per rollout then.
    return this.#cleanups.length ? this.#runCleanups(state) : RESOLVED;
  }

  async #runCleanups(state: State): Promise<void> {
    for (const h of this.#cleanups) await h.fn(state);
  }

  /** Run the teardown hooks. */
  async teardown(): Promise<void> {
    for (const h of this.#teardowns) await h.fn();
  }
}

/**
 * The promise `scoreGroup` and `cleanup` return when they finished synchronously: callers may
 * skip awaiting it.
 */
export const RESOLVED: Promise<void> = Promise.resolve();

/** Whether a hook returned something to wait for (a promise, or any thenable). */
export function isThenable(value: unknown): value is PromiseLike<unknown> {
  return typeof (value as PromiseLike<unknown> | null | undefined)?.then === "function";
}

/** Like Python's float(): null, "", [] and objects are not numbers (Number() says 0). */
function toScore(entry: RubricEntry, value: unknown, state: State): number | null {
  const n = typeof value === "boolean"
    ? (value ? 1 : 0)
    : typeof value === "number" || (typeof value === "string" && value.trim() !== "")
    ? Number(value)
    : NaN;
  if (Number.isFinite(n)) return n;
  let shown: string;
  try {
    shown = `returned ${JSON.stringify(value) ?? String(value)}, not a number`;
  } catch {
    shown = `returned a ${typeof value}, not a number`; // e.g. a bigint
  }
  return rewardFailed(entry, new TypeError(shown), state);
}

/**
 * A rubric function that failed did not score the rollout: the failure becomes the rollout's
 * error (unless it already has one), which leaves it out of averages and pass@k. Never a 0.
 */
function rewardFailed(entry: RubricEntry, error: unknown, state: State): null {
  const detail = error instanceof Error ? error.message : String(error);
  // Where the user's function threw goes before the message, which summaries clip.
  const at = userFrame(error);
  // An earlier error wins, except one the model caused (a tool call): that rollout would count
  // as scored, and it was not.
  if (!state.error || state.error instanceof ToolError) {
    state.error = new RewardError(
      `Reward function "${entry.name}" failed${at ? ` (at ${at})` : ""}: ${detail}`,
      {
        cause: error,
      },
    );
  }
  return null;
}

/** Set reward, metrics and advantage (reward minus the group mean) on each state. */
export function applyGroupScores(
  states: State[],
  totals: number[],
  metrics: Record<string, number>[],
): void {
  let sum = 0;
  for (const t of totals) sum += t;
  const mean = sum / totals.length;
  for (let i = 0; i < states.length; i++) {
    const state = states[i];
    state.reward = totals[i];
    state.metrics = metrics[i];
    state.advantage = totals[i] - mean;
    for (const step of state.trajectory) {
      if (step.reward === null) step.reward = totals[i];
      if (step.advantage === null) step.advantage = state.advantage;
    }
  }
}

/** Per-state reward totals and metrics while a group is scored. */
interface Sums {
  totals: number[];
  metrics: Record<string, number>[];
}

function newSums(n: number): Sums {
  // Sized up front, as in #callAll: two pushed arrays were half a KB for a group of one.
  const sums: Sums = { totals: new Array<number>(n), metrics: new Array(n) };
  for (let i = 0; i < n; i++) {
    sums.totals[i] = 0;
    sums.metrics[i] = {};
  }
  return sums;
}

function hasPromise(values: unknown[]): boolean {
  for (const v of values) if (v instanceof Promise) return true;
  return false;
}

function addScores(entry: RubricEntry, scores: (number | null)[], sums: Sums): void {
  for (let i = 0; i < scores.length; i++) {
    const score = scores[i];
    if (score === null) continue;
    sums.totals[i] += score * entry.weight;
    sums.metrics[i][entry.name] = score;
  }
}

/** Add what one member of a RubricGroup set on each state to the group's sums. */
function addMemberScores(states: State[], sums: Sums): void {
  for (let i = 0; i < states.length; i++) {
    const s = states[i];
    sums.totals[i] += s.reward ?? 0;
    const sum = sums.metrics[i];
    const own = s.metrics ?? {};
    for (const k in own) sum[k] = (sum[k] ?? 0) + own[k];
  }
}

/**
 * Members filled the steps from their own rewards: restore what was set before scoring, fill
 * the rest from the summed reward, and set the summed scores.
 */
function finishGroup(
  states: State[],
  sums: Sums,
  preset: Array<number | null>,
  steps: number[],
): void {
  let at = 0;
  for (let i = 0; i < states.length; i++) {
    const trajectory = states[i].trajectory;
    for (let j = 0; j < trajectory.length; j++) {
      const before = j < steps[i];
      trajectory[j].reward = before ? preset[at + 2 * j] : null;
      trajectory[j].advantage = before ? preset[at + 2 * j + 1] : null;
    }
    at += 2 * steps[i];
  }
  applyGroupScores(states, sums.totals, sums.metrics);
}

/** Sort hooks by descending priority, then name, as verifiers does. */
export function sortHandlers<T extends { name: string; priority: number }>(list: T[]): void {
  list.sort((a, b) => b.priority - a.priority || (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
}

/** Several rubrics whose rewards and metrics are summed. */
export class RubricGroup extends Rubric {
  rubrics: Rubric[];

  constructor(rubrics: Rubric[]) {
    if (rubrics.length === 0) throw new RangeError("RubricGroup needs at least one rubric");
    super({ parser: rubrics[0].parser });
    this.rubrics = rubrics;
  }

  override get funcNames(): string[] {
    return this.rubrics.flatMap((r) => r.funcNames);
  }

  override get funcWeights(): number[] {
    return this.rubrics.flatMap((r) => r.funcWeights);
  }

  override addRewardFunc(fn: RewardFunc, weight = 1.0, name?: string): void {
    this.rubrics[0].addRewardFunc(fn, weight, name);
  }

  override addMetric(fn: RewardFunc, weight = 0.0, name?: string): void {
    this.rubrics[0].addMetric(fn, weight, name);
  }

  override addClassObject(name: string, obj: unknown): void {
    this.rubrics[0].addClassObject(name, obj);
  }

  override async scoreRollout(state: State): Promise<void> {
    let reward = 0;
    const metrics: Record<string, number> = {};
    for (const rubric of this.rubrics) {
      await rubric.scoreRollout(state);
      reward += state.reward ?? 0;
      for (const [k, v] of Object.entries(state.metrics ?? {})) metrics[k] = (metrics[k] ?? 0) + v;
    }
    state.reward = reward;
    state.metrics = metrics;
  }

  override scoreGroup(states: State[]): Promise<void> {
    if (states.length === 0) return RESOLVED;
    const sums = newSums(states.length);
    // Each step's reward and advantage as set before scoring, state after state (sized up
    // front, as in newSums).
    const steps = new Array<number>(states.length);
    let stepCount = 0;
    for (let i = 0; i < states.length; i++) stepCount += steps[i] = states[i].trajectory.length;
    const preset = new Array<number | null>(2 * stepCount);
    let at = 0;
    for (const s of states) {
      for (const step of s.trajectory) {
        preset[at++] = step.reward;
        preset[at++] = step.advantage;
      }
    }
    for (let r = 0; r < this.rubrics.length; r++) {
      const scoring = this.rubrics[r].scoreGroup(states);
      if (scoring !== RESOLVED) return this.#sumFrom(states, r, scoring, sums, preset, steps);
      addMemberScores(states, sums);
    }
    finishGroup(states, sums, preset, steps);
    return RESOLVED;
  }

  /** The rest of {@link scoreGroup} once member `from`, whose scoring is `running`, went async. */
  async #sumFrom(
    states: State[],
    from: number,
    running: Promise<void>,
    sums: Sums,
    preset: Array<number | null>,
    steps: number[],
  ): Promise<void> {
    await running;
    addMemberScores(states, sums);
    for (let r = from + 1; r < this.rubrics.length; r++) {
      await this.rubrics[r].scoreGroup(states);
      addMemberScores(states, sums);
    }
    finishGroup(states, sums, preset, steps);
  }

  override cleanup(state: State): Promise<void> {
    // In order, each after the one before; without an async step while none has hooks.
    const own = super.cleanup(state);
    if (own !== RESOLVED) return this.#cleanupFrom(state, own, 0);
    for (let i = 0; i < this.rubrics.length; i++) {
      const done = this.rubrics[i].cleanup(state);
      if (done !== RESOLVED) return this.#cleanupFrom(state, done, i + 1);
    }
    return RESOLVED;
  }

  async #cleanupFrom(state: State, running: Promise<void>, next: number): Promise<void> {
    await running;
    for (let i = next; i < this.rubrics.length; i++) await this.rubrics[i].cleanup(state);
  }

  override async teardown(): Promise<void> {
    await super.teardown();
    for (const r of this.rubrics) await r.teardown();
  }
}
