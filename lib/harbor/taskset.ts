/**
 * Harbor task folders as a taskset (the format Terminal-Bench and other terminal-agent
 * benchmarks ship): `instruction.md` is the prompt; `task.toml` gives timeouts, cpus, memory
 * and network, and the verifier's env; `environment/Dockerfile` is built into the agent's
 * image (or `[environment] docker_image` names one), and `environment/docker-compose.yaml`
 * adds sidecar services beside it (service `main` is the agent's); `tests/` reaches the sandbox only when
 * grading starts, after the agent is done, as `/tests`, where `test.sh` runs and writes
 * `/logs/verifier/reward.txt` (a number) or `reward.json` (named rewards); `solution/solve.sh`
 * is the gold answer `vf validate` checks. A multi-step task (`[[steps]]`, {@link HarborStepsTask})
 * gives the agent each `steps/<name>/instruction.md` in turn in one sandbox and runs each step's
 * verifier after its turn.
 *
 * `vf run <folder>` and `vf validate <folder>` take one task folder or a folder of them; TOML
 * `[env.taskset] id = "harbor"` takes `path` and `tasks` (a subset of task names).
 * @module
 */
import { existsSync, readdirSync } from "node:fs";
import { readdir, readFile } from "node:fs/promises";
import { basename, join, resolve } from "node:path";
import process from "node:process";
import { ConfigError, TaskError } from "../errors.ts";
import { gradeSubmission } from "../tasks/rollout/grading.ts";
import { buildImage, folderEntries } from "../services/build.ts";
import { packTar } from "../../runtimes/_tar.ts";
import {
  readText,
  Task,
  type TaskData,
  type TaskHookContext,
  type TaskScores,
  Taskset,
  type UserTurnContext,
} from "../tasks/task.ts";
import type { Runtime } from "../../runtimes/runtime.ts";
import {
  HARBOR_DEFAULTS,
  type HarborNetwork,
  type HarborSettings,
  type HarborStep,
  type HarborVerifier,
  readHarborSettings,
} from "./settings.ts";

export { HARBOR_DEFAULTS, type HarborSettings, readHarborSettings };

/** Whether `dir` is a Harbor task folder, or holds some. */
export function isHarborFolder(dir: string): boolean {
  if (!existsSync(dir)) return false;
  if (existsSync(join(dir, "task.toml"))) return true;
  try {
    return readdirSync(dir, { withFileTypes: true }).some((e) =>
      e.isDirectory() && existsSync(join(dir, e.name, "task.toml"))
    );
  } catch {
    return false;
  }
}

/** Copy a local folder to `/<name>` in the sandbox, replacing what is there. */
async function stageFolder(runtime: Runtime, dir: string, name: string): Promise<void> {
  const rm = await runtime.run(["rm", "-rf", `/${name}`]);
  if (rm.exit_code !== 0) throw new TaskError(`Cannot clear /${name}: ${rm.stderr.trim()}`);
  // Symlinks may not lead out of the task folder (`tests/x -> ~/.ssh/id_rsa`).
  const entries = await folderEntries(dir, { prefix: name, root: join(dir, "..") });
  await runtime.archiveIn("/", packTar([{ name, type: "directory" }, ...entries]));
}

/**
 * Kill whatever the agent left running before the verifier starts: in the agent's own sandbox a
 * leftover process could write the reward file after `test.sh`, or change the tests.
 * @throws {ConfigError} when the runtime cannot (its reward file could not be trusted)
 */
async function killLeftovers(runtime: Runtime, task: string, signal?: AbortSignal): Promise<void> {
  if (!runtime.capabilities.kill_processes || !runtime.killProcesses) {
    throw new ConfigError(
      `Harbor task "${task}": a "${runtime.type}" runtime cannot kill the processes the agent ` +
        `left running (capabilities.kill_processes is false), so a reward file in its sandbox ` +
        `could be the agent's and is not trusted; run Harbor tasks on the docker runtime`,
    );
  }
  await runtime.killProcesses({ signal });
}

/** Run a script with bash when the image has it, else sh. */
function scriptArgv(path: string): string[] {
  return [
    "sh",
    "-c",
    'if command -v bash >/dev/null 2>&1; then exec bash "$0"; else exec sh "$0"; fi',
    path,
  ];
}

/**
 * Run `/tests/test.sh` (staged already) with a verifier's env, user and time limit, and read the
 * reward it wrote to `/logs/verifier/reward.txt` or `reward.json`; no reward file is an error.
 */
async function runVerifier(
  runtime: Runtime,
  trace: TaskHookContext["trace"],
  verifier: HarborVerifier,
  signal?: AbortSignal,
): Promise<TaskScores> {
  const prep = await runtime.run([
    "sh",
    "-c",
    "rm -rf /logs/verifier && mkdir -p /logs/verifier",
  ]);
  if (prep.exit_code !== 0) throw new TaskError(`Cannot prepare /logs/verifier: ${prep.stderr}`);
  const r = await runtime.run(scriptArgv("/tests/test.sh"), {
    env: verifier.env,
    user: verifier.user,
    timeoutMs: verifier.timeout * 1000,
    signal,
  });
  trace.info.verifier = {
    exit_code: r.exit_code,
    output: `${r.stdout}${r.stderr}`.slice(-2000),
  };
  const text = await readText(runtime, "/logs/verifier/reward.txt").catch(() => null);
  if (text !== null) {
    const value = Number(text.trim());
    if (!text.trim() || !Number.isFinite(value)) {
      throw new TaskError(
        `/logs/verifier/reward.txt holds "${text.trim().slice(0, 50)}", not a number`,
      );
    }
    return { reward: value, rewards: { reward: value }, metrics: {}, weights: { reward: 1 } };
  }
  const json = await readText(runtime, "/logs/verifier/reward.json").catch(() => null);
  if (json !== null) {
    let parsed: Record<string, unknown>;
    try {
      parsed = JSON.parse(json);
    } catch {
      throw new TaskError(`/logs/verifier/reward.json is not JSON`);
    }
    const rewards: Record<string, number> = {};
    for (const [k, v] of Object.entries(parsed)) {
      if (typeof v !== "number" || !Number.isFinite(v)) {
        throw new TaskError(`/logs/verifier/reward.json: "${k}" is not a number`);
      }
      rewards[k] = v;
    }
    const total = Object.values(rewards).reduce((a, b) => a + b, 0);
    return { reward: total, rewards, metrics: {}, weights: {} };
  }
  throw new TaskError(
    `The verifier (tests/test.sh, exit ${r.exit_code}) wrote no reward: neither ` +
      `/logs/verifier/reward.txt nor reward.json`,
  );
}

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
    return this.separate ? await gradeSubmission(ctx) : true;
  }
}

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
}

/** Where a multi-step rollout is: kept in the rollout's state, never persisted. */
interface StepsState {
  runtime: Runtime | null;
  /** Steps whose instruction the agent was given. */
  presented: number;
  results: StepResult[];
  /** A step's reward fell below its `min_reward`: no later step runs. */
  stopped: boolean;
}

/**
 * A multi-step Harbor task (`[[steps]]`): the agent gets step 1's instruction; after each of
 * its turns the step's verifier runs in the same sandbox (the task's `tests/` with the step's
 * over it, the step's verifier env, user and limit), and the next step's instruction is the
 * user's next message, until the steps run out or one scores below its `min_reward`. The
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
      results: [],
      stopped: false,
    } as StepsState) as StepsState;
  }

  /** The sandbox the steps' verifiers run in: the agent's, kept for the turns between steps. */
  override setup(ctx: TaskHookContext): void {
    super.setup(ctx);
    this.#state(ctx).runtime = ctx.runtime;
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
    const scores = await runVerifier(runtime, trace, step.verifier, signal);
    // The next step's agent must not see this step's tests.
    await runtime.run(["rm", "-rf", "/tests", "/logs/verifier"]);
    state.results.push({ name: step.name, reward: scores.reward, rewards: scores.rewards });
    if (step.minReward !== undefined && scores.reward < step.minReward) state.stopped = true;
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
 * Harbor's roll-up of step rewards: `mean` takes each key's mean over the verified steps (a key
 * a step lacks counts 0), `final` the last verified step's rewards as they are. The trial's
 * reward is its `reward` key, else the sum.
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
  const reward = "reward" in rewards
    ? rewards.reward
    : Object.values(rewards).reduce((a, b) => a + b, 0);
  return {
    reward,
    rewards,
    metrics: { steps_verified: results.length },
    weights: "reward" in rewards ? { reward: 1 } : {},
  };
}

const warned = new Set<string>();

/**
 * Harbor's timeout multipliers, from `[env.taskset]` (or `--env.taskset.<key> N`):
 * `timeout_multiplier` for all, then `agent_timeout_multiplier`,
 * `verifier_timeout_multiplier`, `agent_setup_timeout_multiplier` and
 * `environment_build_timeout_multiplier` each over it. Default 1.
 */
export interface HarborMultipliers {
  agent: number;
  verifier: number;
  agentSetup: number;
  build: number;
}

/**
 * The multipliers of a taskset config.
 * @throws {ConfigError} naming the key of one that is not a positive number
 */
export function harborMultipliers(config: Record<string, unknown>): HarborMultipliers {
  const read = (key: string): number | undefined => {
    const raw = config[key];
    if (raw === undefined) return undefined;
    // From the command line a number arrives as its text.
    const v = typeof raw === "string" && /^\d+(\.\d+)?$/.test(raw) ? Number(raw) : raw;
    if (typeof v === "number" && Number.isFinite(v) && v > 0) return v;
    throw new ConfigError(`env.taskset.${key}: ${JSON.stringify(v)} is not a positive number`);
  };
  const all = read("timeout_multiplier") ?? 1;
  return {
    agent: read("agent_timeout_multiplier") ?? all,
    verifier: read("verifier_timeout_multiplier") ?? all,
    agentSetup: read("agent_setup_timeout_multiplier") ?? all,
    build: read("environment_build_timeout_multiplier") ?? all,
  };
}

const ONE: HarborMultipliers = { agent: 1, verifier: 1, agentSetup: 1, build: 1 };

function sameNetwork(a: HarborNetwork, b: HarborNetwork): boolean {
  return a.mode === b.mode && a.hosts.join("\n") === b.hosts.join("\n");
}

/** A phase's network as vf's task data has it: on, off, or an allowlist through the proxy. */
function networkOf(n: HarborNetwork): boolean | { allow: string[] } {
  return n.mode === "allowlist" ? { allow: n.hosts } : n.mode === "public";
}

/** A phase's network as an egress policy (for a phase under a proxy). */
function policyOf(n: HarborNetwork): { allow: string[]; block: string[] } {
  return n.mode === "allowlist"
    ? { allow: n.hosts, block: [] }
    : n.mode === "public"
    ? { allow: ["*"], block: [] }
    : { allow: [], block: ["*"] };
}

/**
 * Load one Harbor task folder: read it, build its image (or use `docker_image`), and for a
 * separate verifier its own image (`tests/Dockerfile`, `[verifier.environment] docker_image`,
 * else the agent's).
 * @throws {ConfigError} naming the path and key when something required is missing, or a
 * setting vf cannot honour is there
 */
export async function loadHarborTask(
  folder: string,
  options: { multipliers?: HarborMultipliers } = {},
): Promise<HarborTask> {
  const m = options.multipliers ?? ONE;
  const name = basename(folder);
  const tomlPath = join(folder, "task.toml");
  const settings = readHarborSettings(await readFile(tomlPath, "utf8"), tomlPath);
  const steps = settings.steps.length ? await loadSteps(folder, tomlPath, settings) : null;
  const instructionPath = join(folder, "instruction.md");
  if (!steps && !existsSync(instructionPath)) {
    throw new ConfigError(`${instructionPath}: missing; a Harbor task needs its instruction`);
  }
  if (!steps && !existsSync(join(folder, "tests", "test.sh"))) {
    throw new ConfigError(`${join(folder, "tests", "test.sh")}: missing; the verifier runs it`);
  }
  const verifier = settings.verifier;
  const separate = verifier.mode === "separate";
  if (separate && !settings.artifacts.length) {
    throw new ConfigError(
      `${tomlPath}: artifacts: a separate verifier sees only the declared artifacts; list the ` +
        `paths it grades (artifacts = ["/app/answer.txt"])`,
    );
  }
  // The network of each phase: setup and the agent share one in vf, the verifier may differ.
  const base = settings.environment.network;
  const agentNet = settings.agent.network ?? base;
  if (!sameNetwork(agentNet, base) && base.mode !== "public") {
    throw new ConfigError(
      `${tomlPath}: agent.network_mode: "${agentNet.mode}" over an environment baseline of ` +
        `"${base.mode}" cannot be kept: vf runs setup under the agent's network; set ` +
        `[environment].network_mode to the agent's`,
    );
  }
  const envDir = join(folder, "environment");
  const compose = await readHarborCompose(envDir);
  let image = compose?.main.image ?? settings.environment.image;
  if (!image) {
    const context = compose?.main.build ?? envDir;
    if (!existsSync(join(context, "Dockerfile"))) {
      throw new ConfigError(
        `${join(context, "Dockerfile")}: missing, and task.toml names no docker_image`,
      );
    }
    image = await buildImage(`harbor-${name}`, context, {
      root: folder,
      signal: AbortSignal.timeout(settings.environment.buildTimeout * m.build * 1000),
    });
  }
  let scoring: TaskData["scoring"] = { mode: "shared" };
  if (separate) {
    const env = verifier.environment;
    const testsDir = join(folder, "tests");
    let graderImage = env.image ?? image;
    if (existsSync(join(testsDir, "Dockerfile"))) {
      if (env.image) {
        throw new ConfigError(
          `${tomlPath}: verifier.environment.docker_image: tests/Dockerfile builds the ` +
            `verifier's image too; keep one of them`,
        );
      }
      graderImage = await buildImage(`harbor-${name}-verifier`, testsDir, {
        root: folder,
        signal: AbortSignal.timeout(env.buildTimeout * m.build * 1000),
      });
    }
    const own = verifier.network ?? env.network;
    scoring = {
      mode: "isolated",
      runtime: {
        image: graderImage,
        network: own.mode === "public",
        ...(env.cpus ? { cpu: env.cpus } : {}),
        ...(env.memoryMb ? { memory: `${env.memoryMb}m` } : {}),
      } as NonNullable<TaskData["scoring"]>["runtime"],
      // Under an agent's allowlist the grader would inherit it: it gets its own policy then.
      ...(own.mode === "allowlist" || agentNet.mode === "allowlist"
        ? { network: policyOf(own) }
        : {}),
    };
  } else {
    const own = verifier.network ?? base;
    if (!sameNetwork(own, agentNet)) {
      if (agentNet.mode !== "allowlist") {
        throw new ConfigError(
          `${tomlPath}: verifier.network_mode: "${own.mode}" differs from the agent's ` +
            `"${agentNet.mode}", and a verifier in the agent's sandbox keeps the agent's network ` +
            `unless the agent's is an allowlist; use [verifier] environment_mode = "separate"`,
        );
      }
      scoring = { mode: "shared", network: policyOf(own) };
    }
  }
  // Harbor's limits times the multipliers; the verifier's in the settings test.sh runs under.
  verifier.timeout *= m.verifier;
  for (const step of steps ?? []) step.verifier.timeout *= m.verifier;
  const instruction = steps ? steps[0].instruction : await readFile(instructionPath, "utf8");
  const memory = settings.environment.memoryMb;
  // A multi-step task's agent limit is one budget over its turns: the steps' limits summed.
  const agentTimeout = steps
    ? (steps.every((st) => st.agent.timeout)
      ? steps.reduce((a, st) => a + st.agent.timeout!, 0)
      : undefined)
    : settings.agent.timeout;
  const scoringTimeout = Math.max(
    verifier.timeout,
    ...(steps ?? []).map((st) => st.verifier.timeout),
  );
  const data: TaskData = {
    id: name,
    prompt: instruction,
    image,
    network: networkOf(agentNet),
    agent_user: settings.agent.user,
    ...(settings.environment.workdir ? { workdir: settings.environment.workdir } : {}),
    resources: {
      cpu: settings.environment.cpus,
      memory: memory ? `${memory}m` : undefined,
    },
    timeout: {
      agent: agentTimeout ? agentTimeout * m.agent : undefined,
      ...(settings.agent.setupTimeout ? { setup: settings.agent.setupTimeout * m.agentSetup } : {}),
      // The verifier's own limit, and a minute for the sweep (or the grader), staging and
      // the reward.
      scoring: scoringTimeout + 60,
    },
    scoring,
    // Missing is the verifier's to judge (Harbor's hands it nothing), never a failed rollout.
    ...(settings.artifacts.length
      ? { artifacts: settings.artifacts.map((source) => ({ source, required: false })) }
      : {}),
    ...(compose && Object.keys(compose.main.env).length ? { env: compose.main.env } : {}),
  };
  return steps
    ? new HarborStepsTask(data, resolve(folder), settings, compose?.sidecars ?? null, steps)
    : new HarborTask(data, resolve(folder), settings, compose?.sidecars ?? null);
}

/**
 * The `[[steps]]` of a task folder: each with `steps/<name>/instruction.md` and a `test.sh` (its
 * own `tests/`, or the task's). What vf cannot keep per step is an error naming the key: a
 * separate verifier, an agent user or network other than the task's, per-step artifacts.
 * @throws {ConfigError}
 */
async function loadSteps(
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

/** What a Harbor task's `environment/docker-compose.yaml` says. */
interface HarborCompose {
  /** Overrides of the agent's service `main`: its image or build folder, its environment. */
  main: { image?: string; build?: string; env: Record<string, string> };
  /** The other services, as a Compose document for the rollout (null: none). */
  sidecars: Record<string, unknown> | null;
}

const MAIN_KEYS = ["image", "build", "environment", "depends_on"];

/**
 * Read `environment/docker-compose.yaml` (or `.yml`) when there is one. As in Harbor, it is
 * laid over the task's base: service `main` is the agent's sandbox (its image from
 * `${MAIN_IMAGE_NAME}`, the Dockerfile, unless it names another), every other service a
 * sidecar on the rollout's network. `${VAR}` and `${VAR:-default}` are filled from the
 * environment.
 * @throws {ConfigError} naming the file and key
 */
async function readHarborCompose(envDir: string): Promise<HarborCompose | null> {
  const path = ["docker-compose.yaml", "docker-compose.yml"].map((f) => join(envDir, f))
    .find((p) => existsSync(p));
  if (!path) return null;
  const text = (await readFile(path, "utf8")).replace(
    /\$\{([A-Za-z_][A-Za-z0-9_]*)(?::?-([^}]*))?\}/g,
    (_m, name: string, fallback: string | undefined) =>
      name === "MAIN_IMAGE_NAME" ? _m : process.env[name] ?? fallback ?? "",
  );
  let doc: Record<string, unknown>;
  try {
    const { parse: parseYaml } = await import("npm:yaml@^2.9.1");
    doc = parseYaml(text) ?? {};
  } catch (error) {
    throw new ConfigError(`${path}: not valid YAML: ${(error as Error).message}`);
  }
  const services = { ...(doc.services ?? {}) as Record<string, Record<string, unknown>> };
  const raw = services.main ?? {};
  delete services.main;
  for (const key of Object.keys(raw)) {
    if (!MAIN_KEYS.includes(key)) {
      const note = `${path}: services.main.${key} is not read by vf (ignored)`;
      if (!warned.has(note)) {
        warned.add(note);
        console.warn(note);
      }
    }
  }
  const main: HarborCompose["main"] = { env: {} };
  if (typeof raw.image === "string" && raw.image !== "${MAIN_IMAGE_NAME}") main.image = raw.image;
  if (raw.build !== undefined) {
    const context = typeof raw.build === "string"
      ? raw.build
      : (raw.build as Record<string, unknown>)?.context;
    if (typeof context !== "string") {
      throw new ConfigError(`${path}: services.main.build: give the folder to build from`);
    }
    main.build = resolve(envDir, context);
  }
  if (Array.isArray(raw.environment)) {
    for (const item of raw.environment.map(String)) {
      const eq = item.indexOf("=");
      if (eq > 0) main.env[item.slice(0, eq)] = item.slice(eq + 1);
    }
  } else if (raw.environment && typeof raw.environment === "object") {
    for (const [k, v] of Object.entries(raw.environment)) main.env[k] = v === null ? "" : String(v);
  }
  // The sidecars start before the agent anyway; a dependency on main would never be met.
  for (const s of Object.values(services)) {
    const d = s?.depends_on;
    if (Array.isArray(d)) s.depends_on = d.filter((n) => n !== "main");
    else if (d && typeof d === "object") delete (d as Record<string, unknown>).main;
  }
  const sidecars = Object.keys(services).length
    ? { ...doc, services, "x-vf-dir": envDir, "x-vf-source": path }
    : null;
  return { main, sidecars };
}

/** A glob (`*`, `?`, `[...]`) as a whole-name regular expression. */
function globRegExp(glob: string): RegExp {
  let out = "";
  for (let i = 0; i < glob.length; i++) {
    const c = glob[i];
    if (c === "*") out += ".*";
    else if (c === "?") out += ".";
    else if (c === "[") {
      const end = glob.indexOf("]", i + 1);
      if (end < 0) out += "\\[";
      else {
        const body = glob.slice(i + 1, end).replace(/^!/, "^").replace(/\\/g, "\\\\");
        out += `[${body}]`;
        i = end;
      }
    } else out += c.replace(/[.+^${}()|\\\]]/g, "\\$&");
  }
  return new RegExp(`^${out}$`);
}

function globList(v: unknown, key: string): RegExp[] {
  if (v === undefined) return [];
  const list = typeof v === "string" ? [v] : v;
  if (!Array.isArray(list) || !list.every((x) => typeof x === "string" && x)) {
    throw new ConfigError(`env.taskset.${key}: give a glob or a list of globs of task names`);
  }
  return list.map(globRegExp);
}

/** Which task folders of a folder of them to take. */
export interface HarborSelection {
  /** Exactly these names (each must exist). */
  names?: string[];
  /** Globs of names to take (default all). */
  include?: string[] | string;
  /** Globs of names to leave out. */
  exclude?: string[] | string;
  /** The first n of what is left, by name; default all. */
  n?: number | string;
}

/**
 * The task folders under `path`: itself when it is one, else its subfolders that are (by
 * name), narrowed by `names`, `include` and `exclude` globs, then the first `n`.
 * @throws {ConfigError} when nothing is there, or a named task is not
 */
export async function harborFolders(
  path: string,
  selection: string[] | HarborSelection = {},
): Promise<string[]> {
  const { names, include, exclude, n } = Array.isArray(selection)
    ? { names: selection } as HarborSelection
    : selection;
  const root = resolve(path);
  let folders: string[];
  if (existsSync(join(root, "task.toml"))) folders = [root];
  else {
    folders = [];
    for (
      const entry of (await readdir(root, { withFileTypes: true })).sort((a, b) =>
        a.name < b.name ? -1 : 1
      )
    ) {
      if (entry.isDirectory() && existsSync(join(root, entry.name, "task.toml"))) {
        folders.push(join(root, entry.name));
      }
    }
  }
  if (folders.length === 0) {
    throw new ConfigError(`${path}: no Harbor task folder (with task.toml) here`);
  }
  if (names?.length) {
    const missing = names.filter((n) => !folders.some((f) => basename(f) === n));
    if (missing.length) {
      throw new ConfigError(
        `${path}: no Harbor task named ${missing.map((m) => `"${m}"`).join(", ")}`,
      );
    }
    folders = folders.filter((f) => names.includes(basename(f)));
  }
  const inc = globList(include, "include");
  const exc = globList(exclude, "exclude");
  folders = folders.filter((f) => {
    const name = basename(f);
    return (!inc.length || inc.some((g) => g.test(name))) && !exc.some((g) => g.test(name));
  });
  if (n !== undefined) {
    // From the command line a number arrives as its text.
    const count: unknown = typeof n === "string" && /^\d+$/.test(n) ? Number(n) : n;
    if (typeof count !== "number" || !Number.isInteger(count) || count < 1) {
      throw new ConfigError(`env.taskset.n_tasks: ${JSON.stringify(n)} is not a positive integer`);
    }
    folders = folders.slice(0, count);
  }
  if (folders.length === 0) {
    throw new ConfigError(`${path}: env.taskset.include/exclude leave no Harbor task`);
  }
  return folders;
}

/**
 * A folder that could not be loaded, as a task of its own: its setup (and any check) fails with
 * the reason, so one broken folder is that task's error and the rest of the dataset runs.
 */
class BrokenHarborTask extends HarborTask {
  /** Thrown where the rollout first asks for its sandbox, before anything starts. */
  override runtimeEnv(): Record<string, string> {
    throw this.broken;
  }
}

/** Harbor task folders as a taskset. */
export class HarborTaskset extends Taskset<HarborTask> {
  /** The folder's name. */
  get id(): string {
    return basename(resolve(String(this.config.path ?? ".")));
  }

  /**
   * The task folders, each loaded on its own: `tasks` (names), `include` / `exclude` (globs of
   * names), `n_tasks` (the first n), and the timeout multipliers ({@link HarborMultipliers}). A
   * folder that fails to load (a bad task.toml, a failed build) is a task whose every check
   * fails with that error, named; when they all fail, loading fails with the first.
   */
  async load(): Promise<HarborTask[]> {
    const path = this.config.path;
    if (typeof path !== "string" || !path) {
      throw new ConfigError(`env.taskset.path: the Harbor task folder (or a folder of them)`);
    }
    const folders = await harborFolders(path, {
      names: this.config.tasks as string[] | undefined,
      include: this.config.include as string[] | undefined,
      exclude: this.config.exclude as string[] | undefined,
      n: this.config.n_tasks as number | undefined,
    });
    const multipliers = harborMultipliers(this.config);
    const tasks: HarborTask[] = [];
    const errors: unknown[] = [];
    for (const folder of folders) {
      try {
        tasks.push(await loadHarborTask(folder, { multipliers }));
      } catch (error) {
        if (!(error instanceof Error) || error.name === "AbortError") throw error;
        errors.push(error);
        const broken = new ConfigError(`Harbor task "${basename(folder)}": ${error.message}`, {
          cause: error,
        });
        console.warn(broken.message);
        tasks.push(
          new BrokenHarborTask(
            { id: basename(folder), prompt: "" },
            resolve(folder),
            null,
            null,
            broken,
          ),
        );
      }
    }
    if (errors.length === folders.length) throw errors[0];
    return tasks;
  }
}

/** Entry point: `[env.taskset] id = "harbor"` with `path`, `tasks`, `include`, `exclude`. */
export function loadTaskset(config: Record<string, unknown>): HarborTaskset {
  return new HarborTaskset(config);
}
