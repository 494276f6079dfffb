/**
 * Scoring a saved trace again, offline: the task's hooks that read only the trace, and the
 * judges; nothing that needs a sandbox.
 * @module
 */
import { SandboxUnavailableError } from "../../../runtimes/errors.ts";
import type { Runtime } from "../../../runtimes/runtime.ts";
import type { Judge } from "../../scoring/judges/judge.ts";
import { Task, type TaskHookContext, type TaskScores, type TraceView } from "../task.ts";
import type { TaskTrace } from "../trace.ts";
import { judgeScores } from "./grading.ts";

/** A runtime for offline rescoring: there is no sandbox, so every use fails clearly. */
function noSandbox(task: Task): Runtime {
  const fail = () =>
    Promise.reject(
      new SandboxUnavailableError(
        `Offline rescoring of task "${task.key}" has no sandbox; mark only hooks that read the ` +
          `trace with { offline: true }`,
      ),
    );
  return {
    type: "offline",
    id: "",
    capabilities: {} as Runtime["capabilities"],
    start: fail,
    run: fail,
    read: fail,
    write: fail,
    archiveOut: fail,
    archiveIn: fail,
    stop: () => Promise.resolve(),
    [Symbol.asyncDispose]: () => Promise.resolve(),
  };
}

/**
 * Score a saved trace again without a sandbox: the task's hooks marked `offline` (they read
 * only the trace) and the judges run; the others are skipped, named in `skipped` and in a
 * warning. A task with its own `score()` is skipped whole (it may need the sandbox). When no
 * reward and no judge could run, `reward` is null: nothing was scored, so there is no 0.
 */
export async function rescoreTrace(
  task: Task,
  record: TaskTrace,
  options: { judges?: Judge[]; signal?: AbortSignal } = {},
): Promise<{
  scores: Omit<TaskScores, "reward"> & { reward: number | null };
  skipped: string[];
  info: Record<string, unknown>;
}> {
  const info = structuredClone(record.info ?? {});
  delete info.judge; // the new judges' replies only, so judge usage is not counted twice
  const view: TraceView = {
    info,
    messages: record.messages,
    artifacts: new Map(),
  };
  const ctx: TaskHookContext = {
    runtime: noSandbox(task),
    task,
    data: task.data,
    trace: view,
    state: task.initialState(),
    runId: record.run_id,
    signal: options.signal,
  };
  let scores: TaskScores;
  let skipped: string[];
  if (task.score !== Task.prototype.score) {
    scores = { reward: 0, rewards: {}, metrics: {}, weights: {} };
    skipped = ["score()"];
  } else {
    const result = await task.score(ctx, { offline: true });
    skipped = result.skipped ?? [];
    delete result.skipped;
    scores = result;
  }
  if (skipped.length) {
    console.warn(
      `Rescoring task "${task.key}" offline skipped ${
        skipped.map((s) => `"${s}"`).join(", ")
      }: they need a live sandbox (mark hooks that read only the trace with { offline: true })`,
    );
  }
  if (options.judges?.length) {
    scores = await judgeScores(
      scores,
      options.judges,
      task.data,
      view,
      options.signal ?? new AbortController().signal,
    );
  }
  const scored = Object.keys(scores.rewards).length > 0;
  return { scores: { ...scores, reward: scored ? scores.reward : null }, skipped, info: view.info };
}
