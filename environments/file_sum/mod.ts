/**
 * file-sum: the seed's FileSum taskset. The agent sums the integers in /app/input.txt and
 * writes the sum to /app/output/answer.txt; grading happens in a fresh, isolated sandbox
 * that receives only /app/output.
 * @module
 */
import {
  ConfigError,
  readText,
  reward,
  Task,
  type TaskData,
  type TaskHookContext,
  Taskset,
  type TasksetConfig,
} from "../../mod.ts";

/** One FileSum task; `numbers` stays on the evaluator. */
export class FileSumTask extends Task {
  static override NEEDS_CONTAINER = true;

  get numbers(): number[] {
    return this.data.numbers as number[];
  }

  override async setup({ runtime }: TaskHookContext): Promise<void> {
    await runtime.write("/app/input.txt", this.numbers.join("\n") + "\n");
    // An untouched workspace must score 0, not fail on a missing file.
    await runtime.write("/app/output/answer.txt", "");
  }

  correct = reward(async ({ runtime }) => {
    const answer = await readText(runtime, "/app/output/answer.txt", 1024);
    return answer.trim() === String(this.numbers.reduce((a, b) => a + b, 0)) ? 1 : 0;
  });

  override async validate(ctx: TaskHookContext): Promise<boolean> {
    const sum = this.numbers.reduce((a, b) => a + b, 0);
    await ctx.runtime.write("/app/output/answer.txt", `${sum}\n`);
    return (await this.correct(ctx)) === 1;
  }
}

const INPUTS = [[1, 2, 3], [10, 20, 30, 40], [7, -2, 5], [100, 250], [3, 3, 3, 3, 3]];

/** The FileSum taskset: `num_tasks` (default 5) tasks with different inputs. */
export class FileSumTaskset extends Taskset<FileSumTask> {
  get id(): string {
    return "file-sum";
  }

  /** What every FileSum task runs in and how it is graded, unless its data says otherwise. */
  #defaults(): Record<string, unknown> {
    return {
      image: (this.config.image as string | undefined) ?? "python:3.11-slim",
      workdir: "/app",
      scoring: { mode: "isolated" },
      artifacts: [{ source: "/app/output" }],
    };
  }

  *load(): Iterable<FileSumTask> {
    for (const [i, numbers] of INPUTS.entries()) {
      yield new FileSumTask({
        id: `file-sum-${i}`,
        prompt: "Sum the integers in /app/input.txt. Write only the sum to /app/output/answer.txt.",
        ...this.#defaults(),
        numbers,
      }, this.config.task ?? {});
    }
  }

  /**
   * A task from a trainer's data (`vf serve file-sum`): `{ prompt, numbers }` is enough, the
   * image, workdir, isolated scoring and artifacts are the built-in tasks' unless given.
   * @throws {ConfigError} when `numbers` is not a list of integers
   */
  taskFromData(data: TaskData): FileSumTask {
    const numbers = data.numbers;
    if (!Array.isArray(numbers) || !numbers.every((n) => Number.isInteger(n))) {
      throw new ConfigError(
        `task_data.numbers: must be a list of integers, got ${JSON.stringify(numbers)}`,
      );
    }
    return new FileSumTask({ ...this.#defaults(), ...data }, this.config.task ?? {});
  }
}

/** Entry point used by `vf run file-sum` / `[env.taskset] id = "file-sum"`. */
export function loadTaskset(config: TasksetConfig = {}): FileSumTaskset {
  return new FileSumTaskset(config);
}
