/**
 * The built-in environments, registered with static imports so a compiled binary
 * embeds them.
 * @module
 */
import type { Registry } from "../lib/legacy/load.ts";
import type { TasksetModule } from "../lib/tasks/task.ts";
import * as calculator from "./calculator/mod.ts";
import * as fileSum from "./file_sum/mod.ts";
import * as pyGrader from "./py_grader/mod.ts";
import * as harbor from "../lib/harbor/taskset.ts";
import * as gsm8k from "./gsm8k/mod.ts";
import * as reverseText from "./reverse_text/mod.ts";
import * as wordle from "./wordle/mod.ts";

/** Built-in environment ids → modules. */
export const BUILTINS: Registry = {
  "gsm8k": () => Promise.resolve(gsm8k),
  "reverse-text": () => Promise.resolve(reverseText),
  "calculator": () => Promise.resolve(calculator),
  "wordle": () => Promise.resolve(wordle),
};

/** Built-in tasksets (sandboxed tasks) by id. */
export const TASKSETS: Record<string, () => Promise<TasksetModule>> = {
  "file-sum": () => Promise.resolve(fileSum),
  "py-grader": () => Promise.resolve(pyGrader),
  /** Harbor task folders: `[env.taskset] id = "harbor"`, `path`, `tasks`. */
  "harbor": () => Promise.resolve(harbor as unknown as TasksetModule),
};
