/**
 * A Harbor task's verifier in a sandbox: a folder staged in (`tests/`, `solution/`), the
 * agent's leftover processes killed before grading, a script run with bash or sh, and
 * `test.sh` run with the verifier's env, user and limit, its reward read from
 * `/logs/verifier/reward.json` or `reward.txt`.
 * @module
 */
import { join } from "node:path";
import { CommandTimeoutError, ConfigError, TaskError } from "../errors.ts";
import { folderEntries } from "../services/build.ts";
import { packTar } from "../../runtimes/_tar.ts";
import { readText, type TaskHookContext, type TaskScores } from "../tasks/task.ts";
import type { Runtime } from "../../runtimes/runtime.ts";
import type { HarborVerifier } from "./settings.ts";

/** Copy a local folder to `/<name>` in the sandbox, replacing what is there. */
export async function stageFolder(runtime: Runtime, dir: string, name: string): Promise<void> {
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
export async function killLeftovers(
  runtime: Runtime,
  task: string,
  signal?: AbortSignal,
  why = "a reward file in its sandbox could be the agent's and is not trusted",
): Promise<void> {
  if (!runtime.capabilities.kill_processes || !runtime.killProcesses) {
    throw new ConfigError(
      `Harbor task "${task}": a "${runtime.type}" runtime cannot kill the processes the agent ` +
        `left running (capabilities.kill_processes is false), so ${why}; run Harbor tasks on ` +
        `the docker runtime`,
    );
  }
  await runtime.killProcesses({ signal });
}

/** Run a script with bash when the image has it, else sh. */
export function scriptArgv(path: string): string[] {
  return [
    "sh",
    "-c",
    'if command -v bash >/dev/null 2>&1; then exec bash "$0"; else exec sh "$0"; fi',
    path,
  ];
}

/**
 * A trial's scores from its named rewards, as Harbor takes a trial's reward: the `reward` key
 * when there is one (what `reward.txt` gives, what a number `min_reward` gates; the other keys
 * are kept with weight 0, beside it, not added to it), else the sum of the keys.
 */
export function harborScores(rewards: Record<string, number>): TaskScores {
  if ("reward" in rewards) {
    const weights = Object.fromEntries(
      Object.keys(rewards).map((k) => [k, k === "reward" ? 1 : 0]),
    );
    return { reward: rewards.reward, rewards, metrics: {}, weights };
  }
  const total = Object.values(rewards).reduce((a, b) => a + b, 0);
  return { reward: total, rewards, metrics: {}, weights: {} };
}

/**
 * Run `/tests/test.sh` (staged already) with a verifier's env, user and time limit, and read the
 * rewards it wrote to `/logs/verifier/reward.json` (named), else `reward.txt` (one, named
 * `reward`), as {@link harborScores}; which file was read is on `trace.info.verifier`. No reward
 * file is an error.
 */
export async function runVerifier(
  runtime: Runtime,
  trace: TaskHookContext["trace"],
  verifier: HarborVerifier,
  signal?: AbortSignal,
  /** Where its limit is set, for the error when it outlasts it. */
  at = "[verifier].timeout_sec",
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
  }).catch((error) => {
    if (!(error instanceof CommandTimeoutError)) throw error;
    throw new CommandTimeoutError(
      `The verifier (tests/test.sh) outlasted its limit of ${verifier.timeout}s (${at}, times ` +
        `the verifier timeout multiplier): ${error.message}`,
      { cause: error },
    );
  });
  const info: Record<string, unknown> = {
    exit_code: r.exit_code,
    output: `${r.stdout}${r.stderr}`.slice(-2000),
  };
  trace.info.verifier = info;
  // As Harbor's verifier reads them: reward.json first, then reward.txt (some of Harbor's own
  // docs say the reverse; its code does not).
  const json = await readText(runtime, "/logs/verifier/reward.json").catch(() => null);
  const text = await readText(runtime, "/logs/verifier/reward.txt").catch(() => null);
  if (json !== null) {
    info.reward_file = "reward.json";
    // Both written: say which one is not the reward, so a reader never wonders.
    if (text !== null) info.unread_reward_file = "reward.txt";
    let parsed: Record<string, unknown>;
    try {
      parsed = JSON.parse(json);
    } catch {
      throw new TaskError(`/logs/verifier/reward.json is not JSON`);
    }
    if (typeof parsed !== "object" || parsed === null || Array.isArray(parsed)) {
      throw new TaskError(
        `/logs/verifier/reward.json holds ${json.trim().slice(0, 50)}, not an object of named ` +
          `rewards ({"reward": 1})`,
      );
    }
    if (!Object.keys(parsed).length) {
      throw new TaskError(`/logs/verifier/reward.json holds no rewards ({})`);
    }
    const rewards: Record<string, number> = {};
    for (const [k, v] of Object.entries(parsed)) {
      if (typeof v !== "number" || !Number.isFinite(v)) {
        throw new TaskError(`/logs/verifier/reward.json: "${k}" is not a number`);
      }
      rewards[k] = v;
    }
    return harborScores(rewards);
  }
  if (text !== null) {
    info.reward_file = "reward.txt";
    const value = Number(text.trim());
    if (!text.trim() || !Number.isFinite(value)) {
      throw new TaskError(
        `/logs/verifier/reward.txt holds "${text.trim().slice(0, 50)}", not a number`,
      );
    }
    return harborScores({ reward: value });
  }
  throw new TaskError(
    `The verifier (tests/test.sh, exit ${r.exit_code}) wrote no reward: neither ` +
      `/logs/verifier/reward.txt nor reward.json`,
  );
}
