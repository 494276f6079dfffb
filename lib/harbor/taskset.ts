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
import { basename, resolve } from "node:path";
import { ConfigError } from "../errors.ts";
import { Taskset } from "../tasks/task.ts";
import { HARBOR_DEFAULTS, type HarborSettings, readHarborSettings } from "./settings.ts";
import { harborFolders } from "./folders.ts";
import { harborMultipliers, loadHarborTask } from "./load.ts";
import { HarborTask } from "./task.ts";

export { HARBOR_DEFAULTS, type HarborSettings, readHarborSettings };
export { harborFolders, type HarborSelection, isHarborFolder } from "./folders.ts";
export { type HarborMultipliers, harborMultipliers, loadHarborTask } from "./load.ts";
export { HarborTask } from "./task.ts";
export { type HarborLoadedStep, HarborStepsTask, rollUp } from "./steps.ts";

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
