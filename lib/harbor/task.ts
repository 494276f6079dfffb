/**
 * One Harbor task folder as a task: its settings on the trace, its sidecars, the verifier
 * (in the agent's sandbox after the sweep, or in a separate grader) and the gold answer.
 * @module
 */
import { existsSync } from "node:fs";
import { join } from "node:path";
import { ConfigError, TaskError } from "../errors.ts";
import { gradeSubmission } from "../tasks/rollout/grading.ts";
import { Task, type TaskData, type TaskHookContext, type TaskScores } from "../tasks/task.ts";
import type { Runtime } from "../../runtimes/runtime.ts";
import { type HarborSettings, readHarborSettings } from "./settings.ts";
import { killLeftovers, runVerifier, scriptArgv, stageFolder } from "./verifier.ts";

/** One Harbor task folder. */
export class HarborTask extends Task {
  static override NEEDS_CONTAINER = true;
  readonly folder: string;
  readonly settings: HarborSettings;

  /** Why this folder cannot run (a dataset's broken folder is its own task's error). */
  readonly broken: Error | null;

  readonly #sidecars: Record<string, unknown> | null;
  /** Grading sandboxes the tests were staged in (a separate verifier runs only there). */
  readonly #graders = new WeakSet<Runtime>();

  constructor(
    data: TaskData,
    folder: string,
    settings: HarborSettings | null,
    sidecars: Record<string, unknown> | null = null,
    broken: Error | null = null,
  ) {
    super(data);
    this.folder = folder;
    this.settings = settings ?? readHarborSettings("", join(folder, "task.toml"));
    this.#sidecars = sidecars;
    this.broken = broken;
  }

  /** Whether `[verifier].environment_mode = "separate"`: grading in a fresh sandbox. */
  get separate(): boolean {
    return this.settings.verifier.mode === "separate";
  }

  /** The task's schema version and `[task]` table go on the trace; a broken folder fails here. */
  override setup(ctx: TaskHookContext): void {
    if (this.broken) throw this.broken;
    ctx.trace.info.harbor = {
      schema_version: this.settings.schemaVersion ?? null,
      task: this.settings.task,
      ...(Object.keys(this.settings.metadata).length ? { metadata: this.settings.metadata } : {}),
    };
  }

  /**
   * A separate verifier's sandbox, after the artifacts are restored: `tests/` arrives as
   * `/tests`. (In the agent's sandbox the tests are staged by `score`, after the sweep.)
   */
  override async stageVerifier(ctx: TaskHookContext): Promise<void> {
    if (!this.separate) return;
    await stageFolder(ctx.runtime, join(this.folder, "tests"), "tests");
    this.#graders.add(ctx.runtime);
  }

  /** The sidecars of `environment/docker-compose.yaml` (services other than `main`). */
  override deploymentSpec(): Record<string, unknown> | null {
    return this.#sidecars;
  }

  /**
   * The verifier. First every process the agent left in the sandbox is killed (a daemon could
   * otherwise rewrite the reward or the tests after the verifier); then `tests/` is copied in
   * as `/tests` (never before: the agent is done), `/logs/verifier` is emptied, `test.sh` runs
   * with the verifier's env under its time limit, and the reward is read from
   * `/logs/verifier/reward.txt` or `reward.json`, which only the verifier can have written. No
   * reward file, or a verifier past its limit, is an error, never a 0.
   * @throws {ConfigError} when the runtime cannot kill the agent's processes
   */
  override async score(ctx: TaskHookContext): Promise<TaskScores> {
    const { runtime, trace } = ctx;
    if (this.broken) throw this.broken;
    if (this.separate) {
      // A separate verifier runs only in a grader vf prepared (stageVerifier); anywhere else
      // (vf validate's checks) the work goes to a fresh grader first, artifacts only.
      if (!this.#graders.has(runtime)) return await gradeSubmission(ctx);
    } else {
      await killLeftovers(runtime, this.key, ctx.signal);
      await stageFolder(runtime, join(this.folder, "tests"), "tests");
    }
    return await runVerifier(runtime, trace, this.settings.verifier, ctx.signal);
  }

  /** The gold answer: `solution/` copied in as `/solution`, then `solve.sh` runs. */
  override async validate(ctx: TaskHookContext): Promise<boolean | TaskScores> {
    const { runtime, signal } = ctx;
    if (this.broken) throw this.broken;
    const dir = join(this.folder, "solution");
    if (!existsSync(join(dir, "solve.sh"))) {
      throw new ConfigError(`${this.folder}: solution/solve.sh is missing; vf validate needs it`);
    }
    await stageFolder(runtime, dir, "solution");
    // As Harbor's oracle runs it: as the agent's user, in the agent's working directory.
    const r = await runtime.run(scriptArgv("/solution/solve.sh"), {
      env: this.settings.solution.env,
      user: this.settings.agent.user,
      cwd: this.data.workdir,
      signal,
    });
    if (r.exit_code !== 0) {
      throw new TaskError(
        `solution/solve.sh exited ${r.exit_code}: ${`${r.stdout}${r.stderr}`.slice(-500)}`,
      );
    }
    if (!this.separate) return true;
    // vf run removes the agent's sandbox before a separate verifier grades; vf validate's check
    // holds its sandbox until grading is done, so what solve.sh left running is stopped first
    // and cannot change the artifacts as they are collected.
    await killLeftovers(
      runtime,
      this.key,
      signal,
      "what solve.sh left running could change the artifacts the separate verifier grades",
    );
    return await gradeSubmission(ctx);
  }
}
