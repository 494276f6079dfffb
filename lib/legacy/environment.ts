/**
 * The base of every legacy environment: dataset sources, rollouts and their stop conditions,
 * scoring and generation (the rollout loop itself is `multi_turn.ts`).
 * @module
 */
import { withCacheSalt } from "../model/cache.ts";
import type { ChatClient } from "../model/client.ts";
import { EndpointUnreachableError } from "../model/client.ts";
import { Dataset, type RowOrigin, rowOrigin } from "../data/dataset.ts";
import {
  AuthenticationError,
  ConfigError,
  InfraError,
  InvalidModelResponseError,
} from "../errors.ts";
import { formatRows, parseInfo } from "../data/formatting.ts";
import { copyPlain } from "../util/_plain.ts";
import { noteActivity, withRolloutActivity } from "../util/activity.ts";
import { normalizeMessages, normalizeToolDefs } from "../messages.ts";
import { Parser } from "../scoring/parser.ts";
import { isThenable, RESOLVED, Rubric, RubricGroup, sortHandlers } from "../scoring/rubric.ts";
import {
  newTiming,
  nowSeconds,
  releasedStateToOutput,
  type RolloutOutput,
  roomForOne,
  type State,
} from "../state.ts";
import type {
  Message,
  Messages,
  Response,
  RolloutInput,
  Row,
  SamplingArgs,
  Tool,
} from "../types.ts";

/** A function that builds a dataset on first access. */
export type DatasetBuilder = () => Dataset | Row[] | Promise<Dataset | Row[]>;

/** Anything accepted as a dataset source. */
export type DatasetSource = Dataset | Row[] | DatasetBuilder;

/** Options shared by every environment. */
export interface EnvironmentOptions {
  /** Training rows: a Dataset, a list of rows, or a builder called on first access. */
  dataset?: DatasetSource | null;
  /** Evaluation rows; `evaluate()` falls back to `dataset` when absent. */
  evalDataset?: DatasetSource | null;
  /** System prompt (see the formatting rules in the README). */
  systemPrompt?: string | null;
  /** Few-shot messages, applied only when rows are built from `question`. */
  fewShot?: Message[] | null;
  /** Default `new Parser()`. */
  parser?: Parser<unknown>;
  /** Default an empty `Rubric`. */
  rubric?: Rubric;
  /** Merged into the defaults for every model call. */
  samplingArgs?: SamplingArgs;
  /** Tools shown to the model (rows may override with `info.tool_defs`). */
  toolDefs?: Tool[] | null;
  /** Environment id: default `task`, metadata, output paths. */
  envId?: string;
  /** Arguments the environment was loaded with (recorded in metadata). */
  envArgs?: Record<string, unknown>;
  /** Accepted for parity with verifiers' `map_kwargs` (e.g. `{ num_proc: 8 }`); formatting is in-process. */
  mapKwargs?: Record<string, unknown>;
  /** When false, rollouts get reward 0 and no metrics; default true. */
  scoreRollouts?: boolean;
  /** Reward at or above which a rollout counts as correct for pass@k; default 0.5. */
  passThreshold?: number;
}

/** Options of one rollout call. */
export interface RolloutOptions {
  samplingArgs?: SamplingArgs;
  signal?: AbortSignal;
}

/**
 * Tool definitions as upstream's `Tool` takes them: the OpenAI shape refused, and a
 * `description` required (the model reads it to decide when to call the tool).
 * @throws {ConfigError} naming the definition without a description
 */
function toolDefsOf(value: unknown, where: string): Tool[] {
  const defs = normalizeToolDefs(value, where);
  (value as Array<Record<string, unknown>> | null | undefined)?.forEach((raw, i) => {
    if (typeof raw.description !== "string") {
      throw new ConfigError(
        `${where}[${i}] ("${raw.name}") has no "description"; give one (the model reads it ` +
          `to decide when to call the tool), or "" for none`,
      );
    }
  });
  return defs;
}

/** Errors that end the whole run instead of one rollout. */
export function isFatalError(error: unknown): boolean {
  return error instanceof AuthenticationError || error instanceof EndpointUnreachableError;
}

interface Handler<F> {
  name: string;
  priority: number;
  fn: F;
}

/** The base of every environment. */
export abstract class Environment {
  envId: string;
  envArgs: Record<string, unknown>;
  systemPrompt: string | null;
  fewShot: Message[] | null;
  parser: Parser<unknown>;
  rubric: Rubric;
  samplingArgs: SamplingArgs;
  toolDefs: Tool[];
  mapKwargs: Record<string, unknown>;
  scoreRollouts: boolean;
  passThreshold: number;
  #sources: { train: DatasetSource | null; eval: DatasetSource | null };
  #built: { train: Dataset | null; eval: Dataset | null } = { train: null, eval: null };
  #building: { train: Promise<Dataset> | null; eval: Promise<Dataset> | null } = {
    train: null,
    eval: null,
  };
  #stops: Handler<(state: State) => boolean | Promise<boolean>>[] = [];
  #cleanups: Handler<(state: State) => unknown>[] = [];
  #teardowns: Handler<() => unknown>[] = [];

  constructor(options: EnvironmentOptions = {}) {
    this.toolDefs = toolDefsOf(options.toolDefs ?? null, "toolDefs");
    this.systemPrompt = options.systemPrompt ?? null;
    this.fewShot = options.fewShot ?? null;
    this.parser = options.parser ?? new Parser();
    this.rubric = options.rubric ?? new Rubric({ parser: this.parser });
    if (this.rubric.parser.constructor !== this.parser.constructor) {
      console.warn(
        `The environment's parser (${this.parser.constructor.name}) differs from the rubric's (${this.rubric.parser.constructor.name})`,
      );
    }
    this.envId = options.envId ?? "";
    this.envArgs = options.envArgs ?? {};
    this.mapKwargs = options.mapKwargs ?? {};
    this.scoreRollouts = options.scoreRollouts ?? true;
    this.passThreshold = options.passThreshold ?? 0.5;
    this.samplingArgs = { ...(options.samplingArgs ?? {}) };
    this.#sources = { train: options.dataset ?? null, eval: options.evalDataset ?? null };
    // Raw datasets are formatted eagerly so bad rows fail at construction.
    for (const split of ["train", "eval"] as const) {
      const src = this.#sources[split];
      if (src instanceof Dataset || Array.isArray(src)) {
        this.#built[split] = this.#format(src, split);
      }
    }
    if (!this.#sources.train && !this.#sources.eval) {
      throw new TypeError("Either dataset or evalDataset must be provided");
    }
  }

  #format(src: Dataset | Row[], split: "train" | "eval"): Dataset {
    // A Dataset read from a file knows where each row came from, for errors about a row.
    const origin = src instanceof Dataset ? (i: number) => rowOrigin(src, i) : undefined;
    const rows = src instanceof Dataset ? src.toList() : src;
    return Dataset.fromList(
      this.formatDataset(rows, split === "train" ? "dataset" : "eval_dataset", origin),
    );
  }

  /**
   * Format raw rows into rollout inputs; EnvGroup overrides this. `origin` tells where row
   * `i` came from, so an error names its file.
   */
  protected formatDataset(
    rows: Row[],
    label: string,
    origin?: (index: number) => RowOrigin | null,
  ): Row[] {
    return formatRows(rows, {
      systemPrompt: this.systemPrompt,
      fewShot: this.fewShot,
      envId: this.envId,
      label,
      origin,
    });
  }

  async #build(split: "train" | "eval"): Promise<Dataset | null> {
    if (this.#built[split]) return this.#built[split];
    const src = this.#sources[split];
    if (!src) return null;
    if (typeof src !== "function") return this.#built[split];
    // Concurrent first accesses share one build, so the builder runs once.
    this.#building[split] ??= (async () => {
      const made = await (src as DatasetBuilder)();
      return this.#format(made, split);
    })().finally(() => (this.#building[split] = null));
    this.#built[split] = await this.#building[split];
    return this.#built[split];
  }

  /** Whether an evaluation dataset source was given. */
  get hasEvalDataset(): boolean {
    return this.#sources.eval !== null;
  }

  /** Whether a training dataset source was given. */
  get hasDataset(): boolean {
    return this.#sources.train !== null;
  }

  /** The formatted training dataset; shuffled copy when `seed` is given, then the first `n`. */
  async getDataset(n = -1, seed?: number | null): Promise<Dataset> {
    const ds = await this.#build("train");
    if (!ds) throw new TypeError("dataset is not set");
    return sample(ds, n, seed);
  }

  /** The formatted evaluation dataset, falling back to the training one. */
  async getEvalDataset(n = -1, seed?: number | null): Promise<Dataset> {
    const ds = await this.#build("eval");
    if (!ds) return this.getDataset(n, seed);
    return sample(ds, n, seed);
  }

  /** Register a stop condition; checked before every turn in priority order. */
  addStopCondition(
    name: string,
    fn: (state: State) => boolean | Promise<boolean>,
    priority = 0,
  ): void {
    this.#stops.push({ name, fn, priority });
    sortHandlers(this.#stops);
  }

  /** Register a per-rollout cleanup hook (runs even on timeout or error). */
  addCleanup(name: string, fn: (state: State) => unknown, priority = 0): void {
    this.#cleanups.push({ name, fn, priority });
    sortHandlers(this.#cleanups);
  }

  /** Register a teardown hook, run once by {@link Environment.teardown}. */
  addTeardown(name: string, fn: () => unknown, priority = 0): void {
    this.#teardowns.push({ name, fn, priority });
    sortHandlers(this.#teardowns);
  }

  /** Names of the registered stop conditions, in evaluation order. */
  get stopConditionNames(): string[] {
    return this.#stops.map((s) => s.name);
  }

  /** Add a rubric: it joins (or becomes) a RubricGroup with the current one. */
  addRubric(rubric: Rubric): void {
    if (this.rubric instanceof RubricGroup) this.rubric.rubrics.push(rubric);
    else this.rubric = new RubricGroup([this.rubric, rubric]);
  }

  /** Apply settings by name, e.g. from `--extra-env-kwargs`: `setX(value)` if present, else a field. */
  setKwargs(kwargs: Record<string, unknown>): void {
    for (const [key, value] of Object.entries(kwargs)) {
      const camel = key.replace(/_([a-z])/g, (_, c: string) => c.toUpperCase());
      const setter = `set${camel[0].toUpperCase()}${camel.slice(1)}`;
      // deno-lint-ignore no-explicit-any
      const self = this as any;
      if (typeof self[setter] === "function") self[setter](value);
      else self[camel] = value;
    }
  }

  /** Build the initial state of a rollout. */
  initState(input: Row, client: ChatClient, model: string, samplingArgs: SamplingArgs = {}): State {
    const copy = copyPlain(input) as RolloutInput;
    const raw = copy.info;
    // A row's info is mostly absent or already an object: then no message text is built for it.
    const info = raw === undefined || raw === null || raw === ""
      ? {}
      : typeof raw === "object" && !Array.isArray(raw)
      ? raw as Record<string, unknown>
      : parseInfo(raw, `info of example ${copy.example_id}`);
    if ("oai_tools" in info) {
      throw new TypeError("info.oai_tools is not supported; use info.tool_defs");
    }
    copy.info = info;
    if (copy.task === undefined) copy.task = this.envId || "default";
    const toolDefs = "tool_defs" in info
      ? toolDefsOf(info.tool_defs, `info.tool_defs of example ${copy.example_id}`)
      : [...this.toolDefs];
    const prompt = normalizedCopy(copy.prompt);
    copy.prompt = prompt;
    return {
      input: copy,
      prompt,
      answer: copy.answer === undefined || copy.answer === null ? "" : String(copy.answer),
      task: String(copy.task),
      info,
      example_id: Number(copy.example_id ?? 0),
      client,
      model,
      sampling_args: { ...this.samplingArgs, ...samplingArgs },
      is_completed: false,
      is_truncated: false,
      tool_defs: toolDefs,
      trajectory: roomForOne(),
      completion: [],
      usage: { input_tokens: 0, output_tokens: 0, seen: false },
      trajectory_id: trajectoryId(),
      reward: null,
      advantage: null,
      metrics: null,
      error: null,
      final_env_response: null,
      stop_condition: null,
      prompt_too_long: false,
      timed_out: false,
      timing: newTiming(),
    };
  }

  /**
   * Ask the model for the next message, tracking usage on the state. A then() instead of an
   * async frame: one per rollout in flight, held while the model answers.
   */
  getModelResponse(state: State, prompt: Messages): Promise<Response> {
    let call: Promise<Response>;
    try {
      let headers: Record<string, string> | undefined;
      const fromState = state.client.headersFromState;
      for (const header in fromState) {
        const value = state[fromState[header]];
        if (value !== undefined && value !== null) (headers ??= {})[header] = String(value);
      }
      noteActivity("model call");
      call = state.client.getResponse(prompt, state.model, {
        tools: state.tool_defs,
        samplingArgs: state.sampling_args,
        headers,
        signal: state.signal,
        session: { traceId: String(state.trajectory_id), group: `example-${state.example_id}` },
      });
    } catch (error) {
      return Promise.reject(error);
    }
    return call.then((response) => {
      noteActivity("model reply");
      if (response.usage) {
        state.usage.seen = true;
        state.usage.input_tokens += response.usage.prompt_tokens;
        state.usage.output_tokens += response.usage.completion_tokens;
      }
      return response;
    });
  }

  /**
   * Whether a stop condition fires; records which one. Synchronous while the conditions are
   * (most are): a promise only once one returns a promise.
   */
  isCompleted(state: State): boolean | Promise<boolean> {
    const stops = this.#stops;
    for (let i = 0; i < stops.length; i++) {
      const fired = stops[i].fn(state);
      if (typeof (fired as PromiseLike<boolean> | null)?.then === "function") {
        return this.#completedFrom(state, i, fired as Promise<boolean>);
      }
      if (fired) return this.#complete(state, stops[i].name);
    }
    return false;
  }

  async #completedFrom(state: State, at: number, first: Promise<boolean>): Promise<boolean> {
    const stops = this.#stops;
    for (let i = at; i < stops.length; i++) {
      if (await (i === at ? first : stops[i].fn(state))) {
        return this.#complete(state, stops[i].name);
      }
    }
    return false;
  }

  #complete(state: State, name: string): true {
    state.is_completed = true;
    state.is_truncated ||= anyTruncated(state.trajectory);
    state.stop_condition = name;
    return true;
  }

  /**
   * Run one rollout to completion (not scored). `input` may be the dataset's own row (`generate`
   * does not copy rows): read it, or copy it as {@link initState} does, but never change it.
   */
  abstract rollout(
    input: Row,
    client: ChatClient,
    model: string,
    options?: RolloutOptions,
  ): Promise<State>;

  /** Run the environment's cleanup hooks (nothing to wait for when there are none). */
  runCleanups(state: State): Promise<void> | void {
    if (this.#cleanups.length) return this.#runCleanups(state);
  }

  async #runCleanups(state: State): Promise<void> {
    for (const c of this.#cleanups) {
      try {
        await c.fn(state);
      } catch (error) {
        console.warn(`Cleanup "${c.name}" failed: ${error}`);
      }
    }
  }

  /**
   * Run a group of rollouts concurrently, then score them together. A group of one (the
   * common case) is a then() on its rollout instead of an async frame held while it runs.
   */
  runGroup(
    inputs: Row[],
    client: ChatClient,
    model: string,
    options: RolloutOptions & { independentScoring?: boolean } = {},
  ): Promise<State[]> {
    if (inputs.length !== 1) return this.#runGroupOf(inputs, client, model, options);
    return this.#runOne(inputs[0], client, model, options, sameStates);
  }

  /**
   * A group of one: its rollout, scored, then `after` on its states, all in one then() (for
   * `runGroupOutputs` too, whose serialising would otherwise be a promise hop of its own).
   */
  #runOne<T>(
    input: Row,
    client: ChatClient,
    model: string,
    options: RolloutOptions & { independentScoring?: boolean },
    after: (states: State[]) => T,
  ): Promise<T> {
    let rollout: Promise<State>;
    try {
      // Each rollout of the group tells its calls which one it is (the cache keeps them apart).
      rollout = this.rollout(input, withCacheSalt(client, "0"), model, options);
    } catch (error) {
      return Promise.reject(error);
    }
    return rollout.then((state) => {
      const states = [state];
      const scoring = this.scoreStates(states, options.independentScoring ?? false);
      return scoring === RESOLVED ? after(states) : scoring.then(() => after(states));
    });
  }

  async #runGroupOf(
    inputs: Row[],
    client: ChatClient,
    model: string,
    options: RolloutOptions & { independentScoring?: boolean },
  ): Promise<State[]> {
    const states = await Promise.all(
      // Each is its own rollout for `vf ctl status --stall` when the run tracks them.
      inputs.map((input, i) =>
        withRolloutActivity(
          i,
          () => this.rollout(input, withCacheSalt(client, String(i)), model, options),
        )
      ),
    );
    const scoring = this.scoreStates(states, options.independentScoring ?? false);
    if (scoring !== RESOLVED) await scoring;
    return states;
  }

  /**
   * Run a group and serialise it: what `generate` calls. `retryable` tells whether a
   * rollout hit an infrastructure or invalid-response error worth a fresh attempt.
   */
  runGroupOutputs(
    inputs: Row[],
    client: ChatClient,
    model: string,
    options: RolloutOptions & { independentScoring?: boolean; stateColumns?: string[] } = {},
  ): Promise<{ outputs: RolloutOutput[]; retryable: boolean }> {
    // One `then` instead of an async frame of its own: this runs once per group.
    try {
      const columns = options.stateColumns;
      const serialise = columns === undefined
        ? groupOutputs
        : (states: State[]) => groupOutputs(states, columns);
      // A group of one is run here unless a subclass runs groups its own way (EnvGroup).
      if (inputs.length === 1 && this.runGroup === Environment.prototype.runGroup) {
        return this.#runOne(inputs[0], client, model, options, serialise);
      }
      return this.runGroup(inputs, client, model, options).then(serialise);
    } catch (error) {
      return Promise.reject(error);
    }
  }

  /**
   * Score finished states (group scoring by default). Synchronous while the rubric and its
   * cleanups are (the returned promise is then the shared resolved one).
   */
  scoreStates(states: State[], independent = false): Promise<void> {
    try {
      const start = nowSeconds();
      for (const s of states) s.timing.scoring.start = start;
      if (!this.scoreRollouts) {
        for (const s of states) {
          s.reward = 0;
          s.metrics = {};
        }
      } else if (independent) {
        return this.#scoreEach(states);
      } else {
        const scoring = this.rubric.scoreGroup(states);
        if (scoring !== RESOLVED && isThenable(scoring)) {
          return Promise.resolve(scoring).then(() => this.#afterScoring(states, 0));
        }
      }
      return this.#afterScoring(states, 0);
    } catch (error) {
      return Promise.reject(error);
    }
  }

  async #scoreEach(states: State[]): Promise<void> {
    for (const s of states) await this.rubric.scoreRollout(s);
    await this.#afterScoring(states, 0);
  }

  /** Stamps the end of scoring (at `from` = 0), then runs the rubric's cleanup from `from` on. */
  #afterScoring(states: State[], from: number): Promise<void> {
    if (from === 0) {
      const end = nowSeconds();
      for (const s of states) s.timing.scoring.end = end;
    }
    for (let i = from; i < states.length; i++) {
      let cleaning: Promise<void>;
      try {
        cleaning = this.rubric.cleanup(states[i]);
      } catch (error) {
        console.warn(`Rubric cleanup failed: ${error}`);
        continue;
      }
      // A rubric written in JavaScript may return nothing: that is a cleanup done.
      if (cleaning !== RESOLVED && isThenable(cleaning)) {
        return Promise.resolve(cleaning).then(
          () => this.#afterScoring(states, i + 1),
          (error) => {
            console.warn(`Rubric cleanup failed: ${error}`);
            return this.#afterScoring(states, i + 1);
          },
        );
      }
    }
    return RESOLVED;
  }

  /** Run the teardown hooks: the rubric's, then the environment's. */
  async teardown(): Promise<void> {
    await this.rubric.teardown();
    for (const t of this.#teardowns) await t.fn();
  }
}

/**
 * The messages of a prompt that is already a private copy, normalised. Messages normalisation
 * would only copy again (system, user and text messages with string content: the same keys
 * and values) are kept as they are; anything else goes through {@link normalizeMessages}.
 */
function normalizedCopy(prompt: unknown): Messages {
  if (!Array.isArray(prompt)) return normalizeMessages(prompt);
  for (let i = 0; i < prompt.length; i++) {
    const m = prompt[i];
    if (
      typeof m !== "object" || m === null || Object.getPrototypeOf(m) !== Object.prototype ||
      (m.role !== "system" && m.role !== "user" && m.role !== "text") ||
      typeof m.content !== "string"
    ) return normalizeMessages(prompt);
  }
  return prompt as Messages;
}

/** What `runGroup` hands on: the states themselves. */
function sameStates(states: State[]): State[] {
  return states;
}

/**
 * The outputs of a finished group; `retryable` tells whether a rollout hit an infrastructure
 * or invalid-response error worth a fresh attempt.
 */
function groupOutputs(
  states: State[],
  columns?: string[],
): { outputs: RolloutOutput[]; retryable: boolean } {
  const outputs = new Array<RolloutOutput>(states.length);
  let retryable = false;
  for (let i = 0; i < states.length; i++) {
    const s = states[i];
    // The group's states are let go once serialised: their outputs may share their messages.
    outputs[i] = releasedStateToOutput(s, columns);
    retryable ||= s.error instanceof InfraError || s.error instanceof InvalidModelResponseError;
  }
  return { outputs, retryable };
}

/** Whether a step was truncated: a loop, not `some()` with a closure made per rollout. */
function anyTruncated(trajectory: State["trajectory"]): boolean {
  for (let i = 0; i < trajectory.length; i++) if (trajectory[i].is_truncated) return true;
  return false;
}

const HEX_DIGITS = new TextEncoder().encode("0123456789abcdef");
/** Random bytes for 256 ids, drawn at once. */
const idBytes = new Uint8Array(16 * 256);
let idAt = idBytes.length;
const idText = new Uint8Array(32);
const idDecoder = new TextDecoder();

/**
 * A new rollout's id: a random (version 4) UUID as 32 lowercase hex digits, as upstream's
 * `uuid4().hex`. Written from pooled random bytes into one flat string (about 50 bytes; a
 * `randomUUID()` with its dashes replaced allocates about 330).
 */
export function trajectoryId(): string {
  if (idAt === idBytes.length) {
    crypto.getRandomValues(idBytes);
    idAt = 0;
  }
  for (let i = 0; i < 16; i++) {
    let b = idBytes[idAt + i];
    if (i === 6) b = (b & 0x0f) | 0x40; // version 4
    else if (i === 8) b = (b & 0x3f) | 0x80; // the RFC 4122 variant
    idText[2 * i] = HEX_DIGITS[b >> 4];
    idText[2 * i + 1] = HEX_DIGITS[b & 15];
  }
  idAt += 16;
  return idDecoder.decode(idText);
}

function sample(ds: Dataset, n: number, seed?: number | null): Dataset {
  let out = ds;
  if (seed !== undefined && seed !== null) out = out.shuffle(seed);
  if (n > 0 && n < out.length) out = out.select([...Array(n).keys()]);
  return out;
}
