/**
 * `best-of-n-judge`: n solver attempts, each judged by an agentic judge in a fresh sandbox
 * holding that attempt's artifacts. Every attempt gets its verdict (`judge` reward,
 * `judge/<name>` metrics); the best is marked (`best` = 1) and `pass_at_n` says whether any
 * reached the threshold. A judge that fails fails the episode: an unjudged attempt is never
 * scored.
 * @module
 */
import { z } from "npm:zod@^4.6.0";
import type { Task } from "../../tasks/task.ts";
import type { Agents, Episode } from "../env.ts";
import { JUDGE_OPTIONS, JudgeEnvBase, requireJudged } from "./agentic_judge.ts";
import { all, markBest } from "./best_of_n.ts";

/** n judged attempts per episode, the best marked. */
export class BestOfNJudgeEnv extends JudgeEnvBase {
  static override options: Record<string, z.ZodType> = {
    ...JUDGE_OPTIONS,
    n: z.number().int().min(1).default(4),
    threshold: z.number().default(1),
  };

  async run(task: Task, agents: Agents): Promise<void> {
    await all((this.options.n as number | undefined) ?? 4, async () => {
      const solver = await agents.solver.run(task, { keepArtifacts: true });
      if (!solver.trace.ok) return; // a failed attempt is data, as in best-of-n
      requireJudged(await agents.judge.run(this.judgeTask(task, solver, false)));
    });
  }

  override finalize(_task: Task, episode: Episode): void {
    this.applyVerdicts(episode);
    const attempts = episode.traces.filter((t) => t.role === "solver");
    markBest(attempts, (this.options.threshold as number | undefined) ?? 1);
    const best = attempts.find((t) => t.metrics.best === 1);
    if (best) best.info.best_of_n = true;
  }
}
