/**
 * `generate` runs rollouts for given inputs, grouped by `example_id`, concurrently, scoring
 * each group when it finishes and appending results to disk; `evaluate` picks the inputs
 * from the environment's evaluation dataset.
 * @module
 */
import type { ChatClient } from "../model/client.ts";
import { Dataset, sharedRows } from "../data/dataset.ts";
import { type Environment, isFatalError } from "../legacy/environment.ts";

/** What `generate`/`evaluate` need of an environment (in-process or sandboxed). */
export type EnvironmentHandle = Pick<
  Environment,
  "envId" | "envArgs" | "samplingArgs" | "passThreshold" | "runGroupOutputs" | "getEvalDataset"
>;
import { ConfigError } from "../errors.ts";
import {
  isUnscoredOutput,
  loadMetadata,
  MetadataBuilder,
  RESOLVED as METADATA_LATER,
  ResultsWriter,
  type RunMetadata,
} from "./results.ts";
import type { Row, SamplingArgs } from "../types.ts";
import { VERSION } from "../version.ts";
import type { RolloutOutput } from "../state.ts";
import { groupAdvantages } from "../scoring/advantages.ts";
import { OutputTally } from "./tally.ts";
import { eachSavedOutput } from "./saved.ts";
import { WorkerPool } from "./pool.ts";
import type { RolloutLabels } from "../util/activity.ts";

/** Outputs that may wait in memory for the disk before workers wait with them. */
const MAX_UNWRITTEN = 4096;

/** A progress event, sent after each finished group. */
export interface Progress {
  done: number;
  total: number;
  avgReward: number;
  errors: number;
  elapsedMs: number;
  newOutputs: RolloutOutput[];
}

/** Options of {@link generate}. */
export interface GenerateOptions {
  /** Merged over the environment's sampling args. */
  samplingArgs?: SamplingArgs;
  /** Rollouts in flight at once (converted to group slots of `ceil(c / r)`); ≤ 0 = unlimited. Default 32. */
  maxConcurrent?: number;
  /** Score each rollout alone instead of per group. Default false. */
  independentScoring?: boolean;
  /** Re-run a group whose rollout hit an infrastructure or invalid-response error. Default 0. */
  maxRetries?: number;
  /** Extra state keys copied into each output. */
  stateColumns?: string[];
  /** Directory to write `results.jsonl` and `metadata.json` into; nothing is saved when absent. */
  resultsDir?: string | null;
  /** Continue the run saved in `resultsDir`, skipping finished rollouts. */
  resume?: boolean;
  /** Called after each finished group. */
  onProgress?: (progress: Progress) => void;
  /** Stops scheduling and aborts in-flight rollouts; finished ones stay on disk. */
  signal?: AbortSignal;
  /** Extra fields recorded in the metadata. */
  metadataExtra?: Record<string, unknown>;
  /** Fields computed afresh each time the metadata is written (the run's spend, say). */
  metadataLive?: () => Record<string, unknown>;
  /**
   * Keep outputs in memory for the return value. Default true; off, memory stays flat however
   * long the run (the outputs are on disk, and the result's `tally` summarises them).
   */
  keepOutputs?: boolean;
  /** Asked before each group starts (`--max-cost`); told when one finishes. */
  gate?: StartGate;
  /** `vf ctl`: interrupts groups back to the queue (`pause --now`), requeues errored rollouts. */
  steering?: RunSteering;
  /**
   * Divide each group's advantages (reward minus the mean of the example's scored rollouts)
   * by the group's standard deviation. Default false.
   */
  advantageStd?: boolean;
  /**
   * Write each output's token data (`nodes`, from `return_token_ids`) to `results.jsonl` too;
   * it is large. The returned outputs keep it either way. Default false.
   */
  saveTokens?: boolean;
}

/**
 * Decides whether more work may start (a budget, an adaptive limit): what already runs always
 * finishes. `finished` hears how a unit went (null: it was let start but never ran).
 */
export interface StartGate {
  /**
   * May a unit of `size` rollouts (default 1) start? `wanted`, when given, says whether the
   * caller still has the unit to start: gates composed by `allGates` ask it between them, so a
   * gate that held the caller while the queue ran dry does not send it on to a budget.
   */
  allows(size?: number, wanted?: () => boolean): boolean | Promise<boolean>;
  /** The unit let start with `size` rollouts finished. */
  finished(outcome?: { ok: boolean; latencyMs?: number } | null, size?: number): void;
}

/**
 * What a run loop hears from its control (`vf ctl`, lib/eval/control.ts): a signal that aborts
 * the units in flight when they are to go back to the queue (`pause --now`), and a place to
 * hand the function that queues errored units again.
 */
export interface RunSteering {
  /** The signal units starting now run under; it aborts on `pause --now`. */
  readonly interrupt: AbortSignal;
  /** The loop's requeue: sends its errored units back to the queue, returns how many rollouts. */
  onRequeue(requeue: () => number): void;
  /** The loop put `n` interrupted rollouts back into its queue. */
  interrupted(n: number): void;
  /** The run's size, once the loop knows it, and how many of it a resume found done. */
  planned?(total: number, done: number): void;
  /**
   * Runs one unit as `id`, tracking its progress (`vf ctl status --stall N`): a rollout, or a
   * group whose `labels.members` are tracked one by one.
   */
  track?<T>(id: string, fn: () => Promise<T>, labels?: RolloutLabels): Promise<T>;
}

/** What {@link generate} returns. */
export interface GenerateOutputs {
  /** The outputs, sorted by example; empty with `keepOutputs: false`. */
  outputs: RolloutOutput[];
  metadata: RunMetadata;
  /** What a summary needs from every output (resumed ones included), kept or not. */
  tally: OutputTally;
}

function groupByExample(inputs: readonly Row[]): Row[][] {
  const groups = new Map<unknown, Row[]>();
  for (const row of inputs) {
    if (row.example_id === undefined) {
      throw new ConfigError(
        'Every input needs an "example_id"; use env.getEvalDataset() to format rows',
      );
    }
    const g = groups.get(row.example_id);
    if (g) g.push(row);
    else groups.set(row.example_id, [row]);
  }
  return [...groups.values()];
}

/** The output without its token data (a shallow copy, only when it has any). */
function withoutTokens(output: RolloutOutput): RolloutOutput {
  if (output.nodes === undefined) return output;
  const { nodes: _nodes, ...rest } = output;
  return rest as RolloutOutput;
}

function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}

/**
 * Run rollouts for `inputs` (rows with `prompt` and `example_id`) and score them. The rows go
 * to the environment as they are, not copied: environments read them and never change them.
 */
export async function generate(
  env: EnvironmentHandle,
  inputs: readonly Row[] | Dataset,
  client: ChatClient,
  model: string,
  options: GenerateOptions = {},
): Promise<GenerateOutputs> {
  // Rows are read, never changed, here; each rollout's initState copies its own.
  const rows = inputs instanceof Dataset ? sharedRows(inputs) : inputs;
  const groups = groupByExample(rows);
  const numExamples = groups.length;
  const r = numExamples ? Math.floor(rows.length / numExamples) : 0;
  const sampling = { ...env.samplingArgs, ...(options.samplingArgs ?? {}) };
  const builder = new MetadataBuilder({
    format_version: 1,
    env_id: env.envId,
    env_args: env.envArgs,
    model,
    base_url: client.baseUrl,
    num_examples: numExamples,
    rollouts_per_example: r,
    sampling_args: sampling,
    pass_threshold: env.passThreshold,
    vf_version: VERSION,
    ...(options.metadataExtra ?? {}),
  });
  const writer = options.resultsDir ? new ResultsWriter(options.resultsDir) : null;
  const keep = options.keepOutputs ?? true;
  const all: RolloutOutput[] = [];
  const tally = new OutputTally();

  let pending = groups;
  /**
   * The rollout indices of a group that is not its example's rollouts 0..n-1 (what a resume
   * left of it, errored rollouts sent back by a requeue). A repeated example's rows are one
   * object, so a rollout is its example and index, never its row.
   */
  const indicesOf = new Map<Row[], number[]>();
  /** Rewards of the saved rollouts of a group the resumed run completes (null: unscored). */
  let savedRewards: Map<number, Array<number | null>> | undefined;
  if (options.resume && writer) {
    // The saved outputs are visited one at a time, not loaded: a million-rollout file held
    // whole made the resume, and the run after it, slower per rollout the larger it was.
    // At most r saved rollouts count per example; extras (a crash between two writes of one
    // group, say) stay in the file but out of the results and the aggregates.
    const ids = new Set(groups.map((g) => Number(g[0].example_id)));
    /** Up to 5 saved example ids this run does not select, in the order first seen. */
    const strangers = new Set<number>();
    const done = new Map<number, number>();
    /** Rewards of the saved rollouts of examples with fewer than r (null: unscored). */
    const short = new Map<number, Array<number | null>>();
    let extra = 0;
    const count = await eachSavedOutput(writer.dir, (o) => {
      if (!ids.has(o.example_id)) {
        if (strangers.size < 5) strangers.add(o.example_id);
        return;
      }
      const n = done.get(o.example_id) ?? 0;
      if (n >= r) {
        extra++;
        return;
      }
      done.set(o.example_id, n + 1);
      builder.add([o]);
      tally.add([o]);
      if (keep) all.push(o);
      // A group cut short gets its advantages over all of its rollouts, the saved ones too.
      const reward = isUnscoredOutput(o) ? null : o.reward;
      if (n + 1 >= r) short.delete(o.example_id);
      else {
        const rewards = short.get(o.example_id);
        if (rewards) rewards.push(reward);
        else short.set(o.example_id, [reward]);
      }
    });
    if (count > 0) {
      const meta = await loadMetadata(writer.dir);
      const problems: string[] = [];
      if (meta.env_id !== env.envId) problems.push(`env_id "${meta.env_id}" != "${env.envId}"`);
      if (meta.model !== model) problems.push(`model "${meta.model}" != "${model}"`);
      if (meta.rollouts_per_example !== r) {
        problems.push(`rollouts_per_example ${meta.rollouts_per_example} != ${r}`);
      }
      // A larger n extends the run (the saved examples stay a prefix of the selection); a
      // smaller one would drop saved examples, which the check below names.
      if (meta.num_examples > numExamples) {
        problems.push(`num_examples ${meta.num_examples} > ${numExamples}`);
      }
      // Which rows run depends on the shuffle seed too (runs saved before it was recorded
      // count as unshuffled).
      const savedSeed = meta.shuffle_seed ?? null;
      const seed = builder.base.shuffle_seed ?? null;
      if ("shuffle_seed" in builder.base && savedSeed !== seed) {
        problems.push(`shuffle_seed ${savedSeed} != ${seed}`);
      }
      if (strangers.size) {
        problems.push(
          `saved rollouts of example_id ${[...strangers].join(", ")} are not among this ` +
            `run's examples`,
        );
      }
      if (problems.length) {
        throw new ConfigError(`Cannot resume "${writer.dir}": ${problems.join("; ")}`);
      }
      if (extra) {
        console.warn(
          `${writer.resultsPath}: ${extra} saved rollout${extra > 1 ? "s" : ""} beyond ` +
            `rollouts_per_example ${r} left out`,
        );
      }
      savedRewards = short;
      pending = [];
      for (const g of groups) {
        const from = Math.min(g.length, done.get(Number(g[0].example_id)) ?? 0);
        if (from === 0) pending.push(g);
        else if (from < g.length) {
          const rest = g.slice(from);
          indicesOf.set(rest, rest.map((_, i) => from + i));
          pending.push(rest);
        }
      }
    }
  }

  const total = rows.length;
  const controller = new AbortController();
  const outer = options.signal;
  const onAbort = () => controller.abort(outer?.reason);
  if (outer?.aborted) controller.abort(outer.reason);
  outer?.addEventListener("abort", onAbort, { once: true });
  const maxC = options.maxConcurrent ?? 32;
  const slots = maxC > 0 ? Math.max(1, Math.ceil(maxC / Math.max(1, r))) : Infinity;
  const started = Date.now();
  let fatal: unknown = null;
  let errors = 0;
  const stop = (error: unknown) => {
    fatal ??= error;
    controller.abort(error);
  };

  const buildMetadata = (): RunMetadata => ({ ...builder.build(), ...options.metadataLive?.() });
  if (writer) await writer.writeMetadata(buildMetadata());

  const steering = options.steering;
  /**
   * The run's signal joined with the steering's current interrupt (one per pause --now), and
   * the group options under it: made once per interrupt, not per group.
   */
  let joined: { interrupt: AbortSignal; options: typeof groupOptions } | null = null;
  const steeredOptions = (interrupt: AbortSignal): typeof groupOptions => {
    if (joined?.interrupt !== interrupt) {
      const signal = AbortSignal.any([controller.signal, interrupt]);
      joined = { interrupt, options: { ...groupOptions, signal } };
    }
    return joined.options;
  };
  /**
   * Errored rollouts by `example_id#rollout index` with their row, for `vf ctl requeue` (none
   * kept without steering).
   */
  const errored = new Map<string, { row: Row; index: number; output: RolloutOutput }>();
  /** Rollouts sent back by a requeue: the errored output their retry replaces. */
  const retrying = new Map<string, RolloutOutput>();
  /** The options of every group's call (one object for the run, not one per group). */
  const groupOptions = {
    samplingArgs: options.samplingArgs,
    signal: controller.signal,
    independentScoring: options.independentScoring,
    stateColumns: options.stateColumns,
  };
  /** Tracks a group under the steering: a lone rollout as itself, a larger one member by member. */
  const trackGroup = <T>(s: RunSteering, group: Row[], run1: () => Promise<T>): Promise<T> => {
    const exampleId = Number(group[0].example_id);
    const indices = indicesOf.get(group);
    if (group.length === 1) {
      const rolloutIndex = indices?.[0] ?? 0;
      return s.track!(`example ${exampleId} rollout ${rolloutIndex}`, run1, {
        exampleId,
        rolloutIndex,
      });
    }
    return s.track!(`example ${exampleId}`, run1, {
      exampleId,
      members: indices ? (i) => indices[i] : (i) => i,
    });
  };
  /** The last append's promise (a batch's appends share one). */
  let lastWritten: Promise<void> | null = null;
  const retries = options.maxRetries ?? 0;
  const advantageOptions = { normalizeStd: options.advantageStd };
  /**
   * Runs a group, retrying it while it is retryable, under the steering's interrupt; resolves
   * with its outputs, or "interrupted" when `vf ctl pause --now` sent it back to the queue.
   */
  const attempts = async (group: Row[]): Promise<RolloutOutput[] | "interrupted"> => {
    let outputs: RolloutOutput[] = [];
    // `vf ctl pause --now` aborts this: the group goes back to the queue, uncounted.
    const interrupt = steering?.interrupt;
    const runOptions = interrupt ? steeredOptions(interrupt) : groupOptions;
    for (let attempt = 0; attempt <= retries; attempt++) {
      let result;
      try {
        const run1 = () => env.runGroupOutputs(group, client, model, runOptions);
        result = await (steering?.track ? trackGroup(steering, group, run1) : run1());
      } catch (error) {
        if (interrupt?.aborted && !controller.signal.aborted) return "interrupted";
        throw error;
      }
      if (interrupt?.aborted && !controller.signal.aborted) return "interrupted";
      outputs = result.outputs;
      if (!result.retryable || attempt === retries) break;
      await sleep(Math.min(1000 * 2 ** attempt, 60_000) * (0.5 + Math.random() / 2));
    }
    return outputs;
  };
  /**
   * One attempt under the steering (`vf eval`'s usual run: `vf ctl` steers it, no retries):
   * the attempt loop's single pass as then()s, so no frame is held per group in flight.
   */
  const steeredOnce = (
    s: RunSteering,
    group: Row[],
  ): Promise<"ok" | "infra" | "interrupted"> => {
    const interrupt = s.interrupt;
    const runOptions = steeredOptions(interrupt);
    const run1 = () => env.runGroupOutputs(group, client, model, runOptions);
    const interrupted = () => interrupt.aborted && !controller.signal.aborted;
    return (s.track ? trackGroup(s, group, run1) : run1()).then(
      (result) => record(group, interrupted() ? "interrupted" : result.outputs),
      (error) => {
        if (interrupted()) return "interrupted";
        throw error;
      },
    );
  };
  /**
   * Counts a finished group and appends its lines; a promise only when the disk is behind by
   * MAX_UNWRITTEN outputs and the worker is to wait for it.
   */
  const record = (
    group: Row[],
    outputs: RolloutOutput[] | "interrupted",
  ): "ok" | "infra" | "interrupted" | Promise<"ok" | "infra"> => {
    if (outputs === "interrupted") return outputs;
    if (steering) {
      // A retried rollout replaces its errored one: the reader keeps the latest, and the
      // run's counts drop the old one.
      const replaced: RolloutOutput[] = [];
      const indices = indicesOf.get(group);
      for (let i = 0; i < outputs.length; i++) {
        if (!retrying.size && !outputs[i].error) continue;
        const index = indices?.[i] ?? i;
        const key = `${group[i].example_id}#${index}`;
        const old = retrying.get(key);
        if (old) {
          retrying.delete(key);
          outputs[i].retry_of = old.trajectory_id;
          replaced.push(old);
          if (old.error) errors--;
        }
        if (outputs[i].error) errored.set(key, { row: group[i], index, output: outputs[i] });
      }
      if (replaced.length) {
        builder.remove(replaced);
        tally.remove(replaced);
      }
    }
    // Advantages over the example's group: rollouts that were never scored stay out.
    // An error nobody scored (the endpoint, the engine) tells an adaptive limit to back off.
    let infra = false;
    // Sized up front: a push onto an empty array reserves 17 slots, and groups are mostly of one.
    const rewards = new Array<number | null>(outputs.length);
    for (let i = 0; i < outputs.length; i++) {
      const o = outputs[i];
      const unscored = isUnscoredOutput(o);
      infra ||= unscored;
      rewards[i] = unscored ? null : o.reward;
      if (o.error) errors++;
    }
    const saved = savedRewards?.get(Number(group[0].example_id));
    const advantages = saved
      ? groupAdvantages([...saved, ...rewards], advantageOptions).slice(saved.length)
      : groupAdvantages(rewards, advantageOptions);
    for (let i = 0; i < outputs.length; i++) outputs[i].advantage = advantages[i];
    builder.add(outputs);
    tally.add(outputs);
    if (keep) { for (const o of outputs) all.push(o); }
    const onProgress = options.onProgress;
    const progress: Progress | null = onProgress
      ? {
        done: builder.count,
        total,
        avgReward: builder.meanReward,
        errors,
        elapsedMs: Date.now() - started,
        newOutputs: outputs,
      }
      : null;
    const outcome = infra ? "infra" : "ok";
    if (!writer) {
      if (progress) onProgress!(progress);
      return outcome;
    }
    // Rollouts go on while their lines reach the disk; progress is reported once they are
    // there, and a write error ends the run. When the disk falls behind by MAX_UNWRITTEN
    // outputs, workers wait for it, so memory stays flat.
    const written = writer.append(
      options.saveTokens || !hasNodes(outputs) ? outputs : outputs.map(withoutTokens),
    );
    // Appends of one batch share its promise: one catch for the batch is enough.
    if (progress) written.then(() => onProgress!(progress)).catch(stop);
    else if (written !== lastWritten) written.catch(stop);
    lastWritten = written;
    const meta = writer.writeMetadata(buildMetadata);
    if (meta !== METADATA_LATER) meta.catch(stop);
    if (writer.unwritten > MAX_UNWRITTEN) return written.then(() => outcome);
    return outcome;
  };
  /**
   * One group: without retries or steering (`vf eval`'s usual run) a then() on the
   * environment's call instead of the async attempt loop, whose frame each group in flight
   * would hold; both end in the same `record`.
   */
  const runOne = (group: Row[]): Promise<"ok" | "infra" | "interrupted"> => {
    try {
      if (retries === 0 && !steering) {
        return env.runGroupOutputs(group, client, model, groupOptions)
          .then((result) => record(group, result.outputs));
      }
      if (retries === 0) return steeredOnce(steering!, group);
      return attempts(group).then((outputs) => record(group, outputs));
    } catch (error) {
      return Promise.reject(error);
    }
  };

  // A fixed pool of workers pulling groups keeps memory flat for huge runs.
  const pool = new WorkerPool(pending, {
    workers: slots,
    signal: controller.signal,
    gate: options.gate,
    sizeOf: (group) => group.length,
    // Back at the front of the queue; it never ran as far as a budget is concerned.
    onInterrupted: (group) => steering?.interrupted(group.length),
    run: runOne,
    onError: (error) => {
      if (!controller.signal.aborted || isFatalError(error)) stop(error);
    },
  });
  steering?.planned?.(total, builder.count);
  steering?.onRequeue(() => {
    if (!pool.open) return 0;
    const again = [...errored.entries()].filter(([key]) => !retrying.has(key));
    if (!again.length) return 0;
    /** The errored rollouts of each example, one group each, with their indices. */
    const byExample = new Map<unknown, Row[]>();
    for (const [key, { row, index, output }] of again) {
      retrying.set(key, output);
      errored.delete(key);
      let g = byExample.get(row.example_id);
      if (!g) {
        byExample.set(row.example_id, g = []);
        indicesOf.set(g, []);
      }
      g.push(row);
      indicesOf.get(g)!.push(index);
    }
    pool.requeue([...byExample.values()]);
    return again.length;
  });
  try {
    await pool.run();
  } finally {
    outer?.removeEventListener("abort", onAbort);
    if (writer) {
      // Queue the final metadata first so flush() writes it now, not a throttle interval later.
      await writer.writeMetadata(buildMetadata);
      await writer.flush();
    }
  }
  if (fatal) throw fatal;
  if (outer?.aborted) throw outer.reason;
  const sorted = all
    .map((o, i) => [o, i] as const)
    .sort((a, b) => a[0].example_id - b[0].example_id || a[1] - b[1])
    .map(([o]) => o);
  return { outputs: sorted, metadata: buildMetadata(), tally };
}

/** Whether any output holds token nodes (a loop: no closure per group). */
function hasNodes(outputs: RolloutOutput[]): boolean {
  for (let i = 0; i < outputs.length; i++) if (outputs[i].nodes !== undefined) return true;
  return false;
}

/** Options of {@link evaluate}. */
export interface EvaluateOptions extends GenerateOptions {
  /** Examples to evaluate; ≤ 0 means all. Default -1. */
  numExamples?: number;
  /** Rollouts per example (the dataset is repeated, then grouped by `example_id`). Default 1. */
  rolloutsPerExample?: number;
  /** Shuffle the evaluation set with this seed before taking `numExamples`. */
  shuffleSeed?: number | null;
}

/** Evaluate a model on the environment's evaluation dataset. */
export async function evaluate(
  env: EnvironmentHandle,
  client: ChatClient,
  model: string,
  options: EvaluateOptions = {},
): Promise<GenerateOutputs> {
  const ds = await env.getEvalDataset(options.numExamples ?? -1, options.shuffleSeed ?? null);
  const r = options.rolloutsPerExample ?? 1;
  if (!Number.isInteger(r) || r < 1) {
    throw new RangeError(`rolloutsPerExample must be ≥ 1, got ${r}`);
  }
  const inputs = r > 1 ? ds.repeat(r) : ds;
  return generate(env, inputs, client, model, {
    ...options,
    // Recorded so a resumed run can check it selects the same rows.
    metadataExtra: { shuffle_seed: options.shuffleSeed ?? null, ...options.metadataExtra },
  });
}
