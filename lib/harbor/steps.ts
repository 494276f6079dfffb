/**
 * A multi-step Harbor task (`[[steps]]`): each step's folder loaded and checked, the agent
 * started afresh on each step's instruction in turn in one sandbox, each step's verifier run
 * after its session, and the step rewards rolled up.
 * @module
 */
import { existsSync } from "node:fs";
import { readFile } from "node:fs/promises";
import { join, posix } from "node:path";
import { ConfigError, TaskError } from "../errors.ts";
import { folderEntries } from "../services/build.ts";
import { packTar } from "../../runtimes/_tar.ts";
import type { TaskData, TaskHookContext, TaskScores, UserTurnContext } from "../tasks/task.ts";
import type { Runtime } from "../../runtimes/runtime.ts";
import type { HarborNetwork, HarborSettings, HarborStep } from "./settings.ts";
import { HarborTask } from "./task.ts";
import { harborScores, killLeftovers, runVerifier, scriptArgv, stageFolder } from "./verifier.ts";

/** One `[[steps]]` entry as loaded: its instruction and its folder. */
export interface HarborLoadedStep extends HarborStep {
  instruction: string;
  /** `steps/<name>/`. */
  dir: string;
}

/** A step's verifier result, as it goes on the trace (`info.harbor.steps`). */
interface StepResult {
  name: string;
  reward: number;
  rewards: Record<string, number>;
  /** The step's agent outlasted its limit and was stopped; the step was verified as it was. */
  agent_timeout?: { seconds: number; message: string };
  /**
   * The step's session in the trace's `messages`: `[from, to)`, each step starting where the
   * last ended (what `vf export` splits a multi-step trace by).
   */
  messages: [number, number];
}

/** Where a multi-step rollout is: kept in the rollout's state, never persisted. */
interface StepsState {
  runtime: Runtime | null;
  /** Steps whose instruction the agent was given. */
  presented: number;
  /** Step index -> how its agent's session outlasted the step's limit. */
  timedOut: Record<number, { seconds: number; message: string }>;
  results: StepResult[];
  /** A step's reward fell below its `min_reward`: no later step runs. */
  stopped: boolean;
}

/**
 * A multi-step Harbor task (`[[steps]]`): the agent gets step 1's instruction; after each of
 * its sessions the step's verifier runs in the same sandbox (the task's `tests/` with the
 * step's over it, the step's verifier env, user and limit), and the next step's instruction
 * starts a fresh session (a new conversation, the files kept), until the steps run out or one
 * misses its `min_reward` (a key below its threshold, or missing). The
 * trial's reward rolls the step rewards up as `multi_step_reward_strategy` says: `mean` (per
 * key, a key a step lacks counting 0) or `final` (the last verified step's).
 */
export class HarborStepsTask extends HarborTask {
  readonly steps: HarborLoadedStep[];

  constructor(
    data: TaskData,
    folder: string,
    settings: HarborSettings,
    sidecars: Record<string, unknown> | null,
    steps: HarborLoadedStep[],
  ) {
    super(data, folder, settings, sidecars);
    this.steps = steps;
  }

  #state(ctx: { state: Record<string, unknown> }): StepsState {
    return (ctx.state.harborSteps ??= {
      runtime: null,
      presented: 1,
      timedOut: {},
      results: [],
      stopped: false,
    } as StepsState) as StepsState;
  }

  /**
   * Each step is a fresh session of the agent, as Harbor runs steps by default: a new
   * conversation (or a new run of the agent CLI or program) in the same sandbox, given only
   * the step's instruction.
   */
  override get freshSessions(): boolean {
    return true;
  }

  /**
   * Step `i`'s agent limit, as Harbor has it: the step's `[steps.agent] timeout_sec`, else the
   * task's `[agent]` one, times the agent timeout multiplier. A step whose agent outlasts it is
   * stopped and still verified, and the trial goes on.
   */
  override sessionTimeout(session: number): number | undefined {
    return this.steps[session]?.agent.timeout;
  }

  /** A step's agent outlasted its limit: the step's result says so once it is verified. */
  override sessionTimedOut(
    ctx: { session: number; seconds: number; message: string; state: Record<string, unknown> },
  ): void {
    this.#state(ctx).timedOut[ctx.session] = { seconds: ctx.seconds, message: ctx.message };
  }

  /** The sandbox the steps' verifiers run in: the agent's, kept for the turns between steps. */
  override async setup(ctx: TaskHookContext): Promise<void> {
    super.setup(ctx);
    this.#state(ctx).runtime = ctx.runtime;
    await this.#prepareStep(0, ctx.runtime, ctx.signal);
  }

  /**
   * Before step `i`'s agent, as Harbor does: `steps/<name>/workdir/` copied into the agent's
   * working directory, then its `setup.sh` run there as the step's agent user.
   * @throws {TaskError} when `setup.sh` fails
   */
  async #prepareStep(i: number, runtime: Runtime, signal?: AbortSignal): Promise<void> {
    const step = this.steps[i];
    const dir = join(step.dir, "workdir");
    if (!existsSync(dir)) return;
    const pwd = await runtime.run(["pwd"], { cwd: this.data.workdir, user: step.agent.user });
    const workdir = pwd.exit_code === 0 && pwd.stdout.trim() ? pwd.stdout.trim() : "/";
    const prefix = workdir.replace(/^\/+|\/+$/g, "");
    const entries = await folderEntries(dir, { prefix: prefix || undefined, root: this.folder });
    await runtime.archiveIn("/", packTar(entries));
    if (!existsSync(join(dir, "setup.sh"))) return;
    const r = await runtime.run(scriptArgv(posix.join(workdir, "setup.sh")), {
      cwd: workdir,
      user: step.agent.user,
      signal,
    });
    if (r.exit_code !== 0) {
      throw new TaskError(
        `steps/${step.name}/workdir/setup.sh exited ${r.exit_code}: ${
          `${r.stdout}${r.stderr}`.slice(-500)
        }`,
      );
    }
  }

  /** Verify step `i` in the agent's sandbox, then take the tests away again. */
  async #verifyStep(
    i: number,
    runtime: Runtime,
    trace: TaskHookContext["trace"],
    state: StepsState,
    signal?: AbortSignal,
  ): Promise<void> {
    const step = this.steps[i];
    await killLeftovers(runtime, this.key, signal);
    const shared = join(this.folder, "tests");
    if (existsSync(shared)) await stageFolder(runtime, shared, "tests");
    else await stageFolder(runtime, join(step.dir, "tests"), "tests");
    // The step's own tests over the task's: a same-named file is the step's.
    if (existsSync(shared) && existsSync(join(step.dir, "tests"))) {
      const entries = await folderEntries(join(step.dir, "tests"), { prefix: "tests" });
      await runtime.archiveIn("/", packTar(entries));
    }
    const scores = await runVerifier(
      runtime,
      trace,
      step.verifier,
      signal,
      `steps[${i}].verifier.timeout_sec (step "${step.name}"; else [verifier]'s)`,
    );
    // The next step's agent must not see this step's tests.
    await runtime.run(["rm", "-rf", "/tests", "/logs/verifier"]);
    const timedOut = state.timedOut[i];
    const from = state.results.at(-1)?.messages[1] ?? 0;
    state.results.push({
      name: step.name,
      reward: scores.reward,
      rewards: scores.rewards,
      ...(timedOut ? { agent_timeout: timedOut } : {}),
      messages: [from, Math.max(from, trace.messages.length)],
    });
    if (belowMinReward(scores.rewards, step.minReward)) state.stopped = true;
    (trace.info.harbor as Record<string, unknown>).steps = state.results;
  }

  /** After each turn: verify the step the agent just did, then hand it the next one. */
  override async userMessage(ctx: UserTurnContext): Promise<string | null> {
    const state = this.#state(ctx);
    if (!state.runtime) throw new TaskError(`Harbor task "${this.key}": no sandbox for its steps`);
    const i = state.results.length;
    if (i >= state.presented) return null;
    const view = { info: ctx.info, messages: ctx.messages, artifacts: new Map() };
    await this.#verifyStep(i, state.runtime, view, state);
    if (state.stopped || state.presented >= this.steps.length) return null;
    try {
      await this.#prepareStep(state.presented, state.runtime);
    } catch (error) {
      // As in Harbor: the step whose setup failed and the rest do not run; the reward is
      // the steps' that did, and the failure is on the trace.
      state.stopped = true;
      (ctx.info.harbor as Record<string, unknown>).stopped = {
        step: this.steps[state.presented].name,
        error: (error as Error).message,
      };
      return null;
    }
    return this.steps[state.presented++].instruction;
  }

  /** Verify what is left of the steps the agent was given, then roll the rewards up. */
  override async score(ctx: TaskHookContext): Promise<TaskScores> {
    const state = this.#state(ctx);
    while (!state.stopped && state.results.length < state.presented) {
      await this.#verifyStep(state.results.length, ctx.runtime, ctx.trace, state, ctx.signal);
    }
    return rollUp(state.results, this.settings.rewardStrategy);
  }

  /** The gold answer, step by step: each step's `solve.sh`, then its verifier. */
  override async validate(ctx: TaskHookContext): Promise<boolean | TaskScores> {
    const { runtime, signal } = ctx;
    const state = this.#state(ctx);
    if (!this.steps.some((s) => existsSync(join(s.dir, "solution", "solve.sh")))) {
      throw new ConfigError(
        `${this.folder}: no steps/<name>/solution/solve.sh; vf validate needs the gold answers`,
      );
    }
    for (const [i, step] of this.steps.entries()) {
      if (state.stopped) break;
      state.presented = i + 1;
      // Step 0's workdir came with setup().
      if (i > 0) await this.#prepareStep(i, runtime, signal);
      const solution = join(step.dir, "solution");
      if (existsSync(join(solution, "solve.sh"))) {
        await stageFolder(runtime, solution, "solution");
        const r = await runtime.run(scriptArgv("/solution/solve.sh"), {
          env: this.settings.solution.env,
          user: step.agent.user,
          cwd: this.data.workdir,
          signal,
        });
        await runtime.run(["rm", "-rf", "/solution"]);
        if (r.exit_code !== 0) {
          throw new TaskError(
            `steps/${step.name}/solution/solve.sh exited ${r.exit_code}: ${
              `${r.stdout}${r.stderr}`.slice(-500)
            }`,
          );
        }
      }
      await this.#verifyStep(i, runtime, ctx.trace, state, signal);
    }
    return rollUp(state.results, this.settings.rewardStrategy);
  }
}

/**
 * Whether a step's rewards miss its `min_reward`: a key below its threshold, or missing from
 * the rewards (Harbor counts it as -inf).
 */
export function belowMinReward(
  rewards: Record<string, number>,
  min: Record<string, number> | undefined,
): boolean {
  return Object.entries(min ?? {}).some(([k, t]) => (rewards[k] ?? -Infinity) < t);
}

/**
 * Harbor's roll-up of step rewards: `mean` takes each key's mean over the verified steps (a key
 * a step lacks counts 0), `final` the last verified step's rewards as they are. The trial's
 * reward is its `reward` key, else the sum ({@link harborScores}).
 */
export function rollUp(results: StepResult[], strategy: "mean" | "final"): TaskScores {
  if (!results.length) throw new TaskError("No step of the task was verified");
  let rewards: Record<string, number>;
  if (strategy === "final") rewards = { ...results.at(-1)!.rewards };
  else {
    const keys = [...new Set(results.flatMap((r) => Object.keys(r.rewards)))];
    rewards = Object.fromEntries(
      keys.map((k) => [k, results.reduce((a, r) => a + (r.rewards[k] ?? 0), 0) / results.length]),
    );
  }
  return { ...harborScores(rewards), metrics: { steps_verified: results.length } };
}

/**
 * The `[[steps]]` of a task folder: each with `steps/<name>/instruction.md` and a `test.sh` (its
 * own `tests/`, or the task's). What vf cannot keep per step is an error naming the key: a
 * separate verifier, an agent user or network other than the task's, per-step artifacts.
 * @throws {ConfigError}
 */
export async function loadSteps(
  folder: string,
  tomlPath: string,
  settings: HarborSettings,
): Promise<HarborLoadedStep[]> {
  const out: HarborLoadedStep[] = [];
  for (const [i, step] of settings.steps.entries()) {
    const dir = join(folder, "steps", step.name);
    const at = `${tomlPath}: steps[${i}]`;
    const path = join(dir, "instruction.md");
    if (!existsSync(path)) {
      throw new ConfigError(`${path}: missing; step "${step.name}" needs its instruction`);
    }
    if (
      !existsSync(join(dir, "tests", "test.sh")) && !existsSync(join(folder, "tests", "test.sh"))
    ) {
      throw new ConfigError(
        `${join(dir, "tests", "test.sh")}: missing, and the task has no tests/test.sh; step ` +
          `"${step.name}" needs a verifier`,
      );
    }
    if (step.verifier.mode === "separate") {
      throw new ConfigError(
        `${at}.verifier.environment_mode: vf runs a multi-step task's verifiers in the agent's ` +
          `sandbox between its turns; a separate verifier per step is not supported`,
      );
    }
    if (step.agent.user !== settings.agent.user) {
      throw new ConfigError(
        `${at}.agent.user: vf runs every step as the task's agent user ` +
          `(${JSON.stringify(settings.agent.user ?? "the image's")}); set it in [agent]`,
      );
    }
    const net = (n?: HarborNetwork) => JSON.stringify(n ?? null);
    if (net(step.agent.network) !== net(settings.agent.network)) {
      throw new ConfigError(
        `${at}.agent.network_mode: vf keeps one agent network over all steps; set it in [agent]`,
      );
    }
    if (net(step.verifier.network) !== net(settings.verifier.network)) {
      throw new ConfigError(
        `${at}.verifier.network_mode: a step's verifier runs in the agent's sandbox, under ` +
          `its network; set it in [verifier]`,
      );
    }
    if (step.artifacts.length) {
      throw new ConfigError(
        `${at}.artifacts: vf collects artifacts once, after the last step; list them in the ` +
          `task's artifacts`,
      );
    }
    out.push({ ...step, instruction: await readFile(path, "utf8"), dir });
  }
  return out;
}
