/**
 * `agentic-judge` and `shared-agentic-judge`: a solver works on the task, then a judge agent
 * (its own model, never trainable) inspects the work in a sandbox and writes verdicts per
 * criterion. The isolated variant gives the judge a fresh sandbox holding only the solver's
 * declared artifacts; the shared variant puts the judge in the solver's own sandbox. The
 * solver's trace gets `judge/<name>` metrics and a `judge` reward.
 * @module
 */
import { z } from "npm:zod@^4.6.0";
import { ConfigError, EnvError, JudgeVerdictError } from "../../errors.ts";
import type { Task } from "../../tasks/task.ts";
import { traitsOfConfig } from "../../../runtimes/config.ts";
import { type AgentRun, harnessFor } from "../agent.ts";
import { type Agents, Env, type EnvInit, type Episode } from "../env.ts";
import { type Criterion, DEFAULT_CRITERIA, loadCriteria } from "../../scoring/judges/criteria.ts";
import { applyVerdict, JudgeTask } from "./judge_task.ts";

/** `[env.task]` and `[env.score]` of the judge envs. */
export const JUDGE_OPTIONS: Record<string, z.ZodType> = {
  /** The judge's task: grading policy (`{prompt}` = the solver's prompt), hint, rubric file. */
  task: z.strictObject({
    prompt: z.string().optional(),
    hint: z.string().optional(),
    rubric: z.string().optional(),
  }).optional(),
  /** Weights: the task's own rewards (default 0: judge only) and the judge's (default 1). */
  score: z.strictObject({
    task_weight: z.number().min(0).optional(),
    judge_weight: z.number().min(0).optional(),
  }).optional(),
};

/** What the judge envs share: the checks on their roles, the criteria, the judge's task. */
export abstract class JudgeEnvBase extends Env {
  static override roles = { solver: {}, judge: {} };
  readonly criteria: Criterion[];

  constructor(init: EnvInit) {
    super(init);
    const { solver, judge } = this.roles;
    // The judge works in a copy of the solver's sandbox: its files must copy out.
    if (!traitsOfConfig(solver.policy.runtime).artifacts) {
      throw new ConfigError(
        `env.solver.runtime.type: "${this.id}" needs a container runtime for the solver (the ` +
          `judge works in a copy of its sandbox); "subprocess" is not one`,
      );
    }
    const harness = harnessFor(judge, { defaultHarness: JudgeTask.HARNESS });
    if (!harness.executesCode) {
      throw new ConfigError(
        `env.judge.harness.id: the judge of "${this.id}" inspects the workspace, so its harness ` +
          `must execute code; "${harness.id}" cannot (use bash)`,
      );
    }
    // The judge works where the solver worked: same runtime policy.
    this.roles.judge = { ...judge, policy: { ...judge.policy, runtime: solver.policy.runtime } };
    const rubric = (this.options.task as { rubric?: string } | undefined)?.rubric;
    this.criteria = rubric
      ? loadCriteria(rubric, this.baseDir, "env.task.rubric")
      : DEFAULT_CRITERIA;
  }

  override setup(agents: Agents): void {
    agents.judge.trainable = false;
  }

  /** The judge's task for one solver run. */
  judgeTask(task: Task, solver: AgentRun, shared: boolean): JudgeTask {
    const t = (this.options.task ?? {}) as { prompt?: string; hint?: string };
    return new JudgeTask(task, solver, {
      criteria: this.criteria,
      shared,
      policy: t.prompt,
      hint: t.hint,
    });
  }

  /** Apply every judge trace's verdict to the solver trace it judged. */
  applyVerdicts(episode: Episode): void {
    const weights = (this.options.score ?? {}) as { task_weight?: number; judge_weight?: number };
    for (const judge of episode.traces.filter((t) => t.role === "judge")) {
      const solver = episode.traces.find((t) => t.trace_id === judge.info.solver_trace_id);
      if (!solver) throw new EnvError(`A judge trace names no solver trace of this episode`);
      applyVerdict(solver, judge, weights);
    }
  }
}

/**
 * Throw the judge's failure as the episode's: an unjudged solver is never scored, and the
 * run's summary blames the judge (phase `judge`), not the Env's own code.
 * @throws {JudgeVerdictError} when the judge's run failed
 */
export function requireJudged(judge: { trace: { ok: boolean; error: unknown } }): void {
  if (judge.trace.ok) return;
  const e = judge.trace.error as { error?: string; message?: string; phase?: string } | null;
  throw new JudgeVerdictError(`The judge failed (${e?.phase}): ${e?.error}: ${e?.message}`);
}

/** The judge gets a fresh sandbox with only the solver's declared artifacts. */
export class AgenticJudgeEnv extends JudgeEnvBase {
  static override options = JUDGE_OPTIONS;

  async run(task: Task, agents: Agents): Promise<void> {
    const solver = await agents.solver.run(task, { keepArtifacts: true });
    if (!solver.trace.ok) {
      throw new EnvError(
        `The solver failed, so the judge did not run: ${solver.trace.error?.error}: ${solver.trace.error?.message}`,
      );
    }
    requireJudged(await agents.judge.run(this.judgeTask(task, solver, false)));
  }

  override finalize(_task: Task, episode: Episode): void {
    this.applyVerdicts(episode);
  }
}

/** The judge works in the solver's own sandbox, after the solver. */
export class SharedAgenticJudgeEnv extends JudgeEnvBase {
  static override options = JUDGE_OPTIONS;

  async run(task: Task, agents: Agents): Promise<void> {
    await using box = await agents.solver.provision(task);
    const solver = await agents.solver.run(task, { box });
    if (!solver.trace.ok) {
      throw new EnvError(
        `The solver failed, so the judge did not run: ${solver.trace.error?.error}: ${solver.trace.error?.message}`,
      );
    }
    requireJudged(await agents.judge.run(this.judgeTask(task, solver, true), { box }));
  }

  override finalize(_task: Task, episode: Episode): void {
    this.applyVerdicts(episode);
  }
}
