/**
 * What an env server runs for one `run` request: an episode of a taskset on the task data a
 * trainer sent ({@link tasksetRunner}), or one rollout of a legacy dataset environment on
 * the row that task data maps to ({@link datasetRunner}).
 *
 * Task data → Task: the data is checked against the base TaskData schema
 * ({@link TaskDataSchema}) and then the schema the taskset declares (`static dataSchema`, a
 * zod object), so a bad field is named (`task_data.numbers: …`). The Task is built by the
 * taskset's `taskFromData(data)` when it has one, else as `new TaskClass(data,
 * taskset.config.task)` where `TaskClass` is the taskset's `static taskClass`, else the class
 * of the first task it loads. Null fields are dropped first (verifiers sends unset fields as
 * nil), so a task's key and hash match the ones vf computes for the same data.
 *
 * Task data → a legacy row: `prompt` (text, or messages) is formatted as the environment
 * formats its dataset (a text prompt is the `question`: system prompt and few-shot examples
 * go in front; a messages prompt gets the system prompt when it has none), `system_prompt`
 * replaces the environment's system prompt for that row, `idx` is the `example_id`, and
 * `answer`, `info`, `task` and every other field are the row's columns.
 * @module
 */
// deno-lint-ignore no-import-prefix
import { z } from "npm:zod@^4.6.0";
import type { Env, Episode } from "../agents/env.ts";
import { EPISODE_FORMAT_VERSION, runEpisode, type RunEpisodeOptions } from "../agents/env.ts";
import { formatRows } from "../data/formatting.ts";
import { ComposeCache } from "../services/cache.ts";
import { ConfigError } from "../errors.ts";
import type { EnvironmentHandle } from "../eval/evaluate.ts";
import type { ChatClient } from "../model/client.ts";
import { modelRetries } from "../tasks/summary.ts";
import { requireRewards, Task, type TaskData, type Taskset } from "../tasks/task.ts";
import { MessageWire, TaskDataSchema } from "../tasks/task_data.ts";
import type { Message, Row, SamplingArgs } from "../types.ts";
import { describeIssues } from "./wire.ts";

/** One `run` request, checked, with its model client built. */
export interface EpisodeRequest {
  /** The task's data as the trainer sent it (the runner checks it against its schema). */
  taskData: Record<string, unknown>;
  client: ChatClient;
  model: string;
  samplingArgs: SamplingArgs;
  /** The request's id (32 hex digits over ZeroMQ). */
  requestId: string;
  /** Told the task's key and hash once its Task is built, before any model call. */
  onTask?: (task: { key: string; hash: string }) => void;
}

/** What a `run` request runs: a taskset's episodes or a legacy environment's rollouts. */
export interface EpisodeRunner {
  /** The served environment's id, reported by `health`. */
  readonly id: string;
  /**
   * Run one episode; resolve with its record (what vf writes per episode). Throws for a
   * request that cannot run (bad `task_data`); a failed rollout is data on the record.
   */
  run(request: EpisodeRequest, signal: AbortSignal): Promise<Record<string, unknown>>;
  /** Releases what the runner holds (cached envs, shared toolsets). */
  close?(): Promise<void>;
}

/** The base TaskData schema; the TaskData type is inferred from it. */
export { TaskDataSchema };

/** A taskset as the server sees it: what it may declare for building tasks from data. */
interface ServedTaskset extends Taskset {
  taskFromData?: (data: TaskData) => Task | Promise<Task>;
}
type TasksetClass = {
  taskClass?: new (data: TaskData, config?: Record<string, unknown>) => Task;
  dataSchema?: z.ZodType;
};

function withoutNulls(data: Record<string, unknown>): Record<string, unknown> {
  return Object.fromEntries(Object.entries(data).filter(([, v]) => v !== null && v !== undefined));
}

/**
 * Check `raw` against the base TaskData schema and the taskset's own, then build its Task.
 * @throws {ConfigError} naming the first bad field (`task_data.<field>: <message>`)
 */
export async function taskFromData(taskset: Taskset, raw: unknown): Promise<Task> {
  const base = TaskDataSchema.safeParse(raw);
  if (!base.success) throw new ConfigError(describeIssues(base.error, "task_data"));
  let data = withoutNulls(base.data);
  const cls = taskset.constructor as TasksetClass;
  if (cls.dataSchema) {
    const own = cls.dataSchema.safeParse(data);
    if (!own.success) {
      throw new ConfigError(
        `${describeIssues(own.error, "task_data")} (the data of a "${taskset.id}" task)`,
      );
    }
    data = { ...data, ...withoutNulls(own.data as Record<string, unknown>) };
  }
  const served = taskset as ServedTaskset;
  if (typeof served.taskFromData === "function") {
    return await served.taskFromData(data as TaskData);
  }
  const TaskClass = cls.taskClass ?? (await firstTaskClass(taskset));
  return new TaskClass(data as TaskData, taskset.config.task ?? {});
}

const firstClasses = new WeakMap<Taskset, Promise<NonNullable<TasksetClass["taskClass"]>>>();

/** The class of the first task a taskset loads (once per taskset). */
function firstTaskClass(taskset: Taskset): Promise<NonNullable<TasksetClass["taskClass"]>> {
  let found = firstClasses.get(taskset);
  if (!found) {
    found = taskset.tasks(1).then(([first]) => {
      if (!first) {
        throw new ConfigError(
          `Taskset "${taskset.id}" loads no task, so the server cannot tell its task class; ` +
            `declare it: static taskClass = MyTask`,
        );
      }
      return first.constructor as NonNullable<TasksetClass["taskClass"]>;
    });
    firstClasses.set(taskset, found);
  }
  return found;
}

/** What a taskset's env is built from for one request: the trainer's endpoint and sampling. */
export interface RoleDefaults {
  client: ChatClient;
  model: string;
  samplingArgs: SamplingArgs;
}

/** Options of {@link tasksetRunner}. */
export interface TasksetRunnerOptions {
  /**
   * Builds the Env whose episode runs, with the request's endpoint, model and sampling as
   * every role's defaults (the CLI builds it from `[env]`).
   */
  makeEnv: (defaults: RoleDefaults) => Env | Promise<Env>;
  /** The id sandboxes are labelled with; default `serve-<8 hex>`. */
  runId?: string;
  /** Run-wide judges, toolsets, shared toolsets and Compose file, as a run passes them. */
  judges?: RunEpisodeOptions["judges"];
  toolsets?: RunEpisodeOptions["toolsets"];
  sharedTools?: RunEpisodeOptions["sharedTools"];
  services?: string;
  /** Where Compose specs are parsed, once for the server's life; default one of its own. */
  composeCache?: ComposeCache;
  /** Called when the server closes: releases shared toolsets, sandbox pools. */
  onClose?: () => Promise<void>;
}

/**
 * Run episodes of a taskset's tasks on request: each `run` checks its `task_data`, builds the
 * Task and an Env with the trainer's endpoint, and replies with the {@link Episode} record
 * (every trace, as `traces.jsonl` holds it, token fields included when recorded).
 *
 * @param taskset the taskset whose task class and schema the data must fit (never iterated,
 *   except to learn the task class when it declares none)
 * @param options how the Env is built, and run-wide judges and tools
 * @returns the runner to hand to `startEnvServer` (HTTP) or `startZmqEnvServer`
 * @example
 * ```ts
 * const runner = tasksetRunner(taskset, { makeEnv: ({ client, model }) => buildMyEnv(client, model) });
 * const server = await startZmqEnvServer(runner);
 * ```
 */
export function tasksetRunner(taskset: Taskset, options: TasksetRunnerOptions): EpisodeRunner {
  const runId = options.runId ?? `serve-${crypto.randomUUID().slice(0, 8)}`;
  const composeCache = options.composeCache ?? new ComposeCache();
  return {
    id: taskset.id,
    async run(request: EpisodeRequest, signal: AbortSignal) {
      const task = await taskFromData(taskset, request.taskData);
      requireRewards(task, { judges: options.judges?.length ?? 0 });
      request.onTask?.({ key: task.key, hash: task.hash });
      const env = await options.makeEnv({
        client: request.client,
        model: request.model,
        samplingArgs: request.samplingArgs,
      });
      await env.start();
      let episode: Episode;
      try {
        episode = await runEpisode(env, task, {
          tasksetId: taskset.id,
          runId,
          signal,
          judges: options.judges,
          toolsets: options.toolsets,
          sharedTools: options.sharedTools,
          services: options.services,
          composeCache,
        });
      } finally {
        await env.stop();
      }
      for (const t of episode.traces) t.model_retries = modelRetries(t);
      // The record exactly as it is written to traces.jsonl.
      return JSON.parse(JSON.stringify(episode));
    },
    close: options.onClose,
  };
}

const LegacyTaskData = z.looseObject({
  prompt: z.union([z.string(), z.array(MessageWire)]),
  idx: z.number().int().min(0).nullish(),
  system_prompt: z.string().nullish(),
  answer: z.unknown().optional(),
  info: z.union([z.record(z.string(), z.unknown()), z.string()]).nullish(),
  task: z.string().nullish(),
});

/**
 * The dataset row `task_data` stands for in a legacy environment (the mapping in this
 * module's doc).
 * @throws {ConfigError} naming the bad field
 */
export function rowFromTaskData(
  env: { envId?: string; systemPrompt?: string | null; fewShot?: Message[] | null },
  raw: unknown,
): Row {
  const parsed = LegacyTaskData.safeParse(raw);
  if (!parsed.success) throw new ConfigError(describeIssues(parsed.error, "task_data"));
  const { prompt, idx, system_prompt, ...columns } = withoutNulls(parsed.data) as
    & z.infer<typeof LegacyTaskData>
    & Record<string, unknown>;
  const row: Row = { ...columns, example_id: idx ?? 0 };
  if (typeof prompt === "string") row.question = prompt;
  else row.prompt = prompt;
  delete row.id;
  if (parsed.data.id !== undefined && parsed.data.id !== null) row.src_id = parsed.data.id;
  try {
    return formatRows([row], {
      systemPrompt: system_prompt ?? env.systemPrompt ?? null,
      fewShot: typeof prompt === "string" ? env.fewShot ?? null : null,
      envId: env.envId,
      label: "task_data",
    })[0];
  } catch (error) {
    if (error instanceof ConfigError) throw error;
    throw new ConfigError(`task_data: ${(error as Error).message}`, { cause: error });
  }
}

/**
 * Run one rollout of a legacy dataset environment per request, on the row `task_data` maps
 * to (see the module doc). The reply's episode holds that rollout's output (the record
 * `results.jsonl` holds) as its one trace; a rollout that failed has `reward: null` and the
 * episode `ok: false`, never a reward of 0.
 *
 * @param env a loaded environment
 * @param options the id reported to clients (default `env.envId`)
 * @returns the runner to hand to `startZmqEnvServer` (an env server over either transport
 *   builds one itself for a legacy environment it is given)
 * @example
 * ```ts
 * const server = await startZmqEnvServer(datasetRunner(await loadEnvironment("gsm8k")));
 * ```
 */
export function datasetRunner(
  env: EnvironmentHandle & { systemPrompt?: string | null; fewShot?: Message[] | null },
  options: { envId?: string; runId?: string } = {},
): EpisodeRunner {
  const envId = options.envId ?? env.envId;
  const runId = options.runId ?? `serve-${crypto.randomUUID().slice(0, 8)}`;
  return {
    id: envId,
    async run(request: EpisodeRequest, signal: AbortSignal) {
      const row = rowFromTaskData(
        { envId, systemPrompt: env.systemPrompt, fewShot: env.fewShot },
        request.taskData,
      );
      const task = new Task(withoutNulls(request.taskData) as TaskData);
      request.onTask?.({ key: task.key, hash: task.hash });
      const startedAt = Date.now();
      const { outputs } = await env.runGroupOutputs([row], request.client, request.model, {
        samplingArgs: request.samplingArgs,
        signal,
      });
      signal.throwIfAborted();
      const traces = (JSON.parse(JSON.stringify(outputs)) as Array<Record<string, unknown>>)
        .map((o) => (o.error ? { ...o, reward: null } : o));
      const episode: Record<string, unknown> = {
        format_version: EPISODE_FORMAT_VERSION,
        kind: "episode",
        episode_id: crypto.randomUUID(),
        run_id: runId,
        env_id: envId,
        taskset: envId,
        task: { key: task.key, idx: Number(row.example_id), hash: task.hash },
        example_id: Number(row.example_id),
        episode_index: 0,
        ok: traces.every((t) => !t.error),
        errors: [],
        traces,
        timing: { started_at: startedAt / 1000, total_ms: Date.now() - startedAt },
      };
      return episode;
    },
  };
}
