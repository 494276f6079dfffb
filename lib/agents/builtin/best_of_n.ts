/**
 * `best-of-n`: n attempts at each task in one episode (`--env.n`, default 4). Every attempt
 * gets the metrics `best` (1 when its reward is the episode's highest; ties share it) and
 * `pass_at_n` (1 when any attempt reached `--env.threshold`, default 1.0).
 * @module
 */
import { z } from "npm:zod@^4.6.0";
import type { Task } from "../../tasks/task.ts";
import type { TaskTrace } from "../../tasks/trace.ts";
import { type Agents, Env, type Episode } from "../env.ts";

/** Run `count` copies of `fn` and wait for all; the first failure is thrown after every one ended. */
export async function all<T>(count: number, fn: (i: number) => Promise<T>): Promise<T[]> {
  const settled = await Promise.allSettled(Array.from({ length: count }, (_, i) => fn(i)));
  const failed = settled.find((s) => s.status === "rejected");
  if (failed) throw (failed as PromiseRejectedResult).reason;
  return settled.map((s) => (s as PromiseFulfilledResult<T>).value);
}

/** Mark `best` and `pass_at_n` on attempts (null rewards never win). */
export function markBest(traces: TaskTrace[], threshold: number): void {
  const rewards = traces.map((t) => (t.error ? null : t.reward));
  const best = Math.max(...rewards.map((r) => r ?? -Infinity));
  const pass = rewards.some((r) => r !== null && r >= threshold) ? 1 : 0;
  traces.forEach((t, i) => {
    t.metrics.best = rewards[i] !== null && rewards[i] === best ? 1 : 0;
    t.metrics.pass_at_n = pass;
  });
}

/** n attempts per episode, the best marked. */
export class BestOfNEnv extends Env {
  static override roles = { agent: {} };
  static override options: Record<string, z.ZodType> = {
    n: z.number().int().min(1).default(4),
    threshold: z.number().default(1),
  };

  get n(): number {
    return (this.options.n as number | undefined) ?? 4;
  }

  async run(task: Task, agents: Agents): Promise<void> {
    await all(this.n, () => agents.agent.run(task));
  }

  override finalize(_task: Task, episode: Episode): void {
    markBest(
      episode.traces.filter((t) => t.role === "agent"),
      (this.options.threshold as number | undefined) ?? 1,
    );
  }
}
