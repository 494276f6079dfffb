/**
 * The chaos suite's taskset: file-sum without a container, so it runs in per-rollout
 * workdirs on a shared ssh host (and anywhere else). Every path is relative to the sandbox's
 * workdir. A model that runs {@link SOLVE_RELATIVE} solves every task, so any reward below 1
 * in a chaos run has an infrastructure cause.
 * @module
 */
import { readText, reward, Task, type TaskHookContext, Taskset } from "../mod.ts";

/** The shell command that solves a task. */
export const SOLVE_RELATIVE = "awk '{ s += $1 } END { print s }' input.txt > answer.txt";

/** One task: sum the numbers in `input.txt` into `answer.txt`. */
export class RelativeSumTask extends Task {
  get numbers(): number[] {
    return this.data.numbers as number[];
  }

  override async setup({ runtime }: TaskHookContext): Promise<void> {
    await runtime.write("input.txt", this.numbers.join("\n") + "\n");
    await runtime.write("answer.txt", "");
  }

  correct = reward(async ({ runtime }) => {
    const answer = await readText(runtime, "answer.txt", 1024);
    return answer.trim() === String(this.numbers.reduce((a, b) => a + b, 0)) ? 1 : 0;
  });
}

/** `num_tasks` (default 6) tasks. */
export class RelativeSumTaskset extends Taskset<RelativeSumTask> {
  get id(): string {
    return "chaos-sum";
  }

  *load(): Iterable<RelativeSumTask> {
    for (let i = 0; i < 6; i++) {
      yield new RelativeSumTask({
        id: `chaos-sum-${i}`,
        prompt: "Sum the integers in input.txt. Write only the sum to answer.txt.",
        numbers: [i, i * 10, 7],
      }, this.config.task ?? {});
    }
  }
}

/** Entry point for `vf run chaos/sum_taskset.ts`. */
export function loadTaskset(config = {}): RelativeSumTaskset {
  return new RelativeSumTaskset(config);
}
