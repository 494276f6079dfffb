/**
 * A taskset for tests/zmq_serve_test.ts: the agent must reply with the task's `expected`
 * text (no code runs, so the subprocess runtime serves it). Its data schema makes
 * `expected` a required string; `marker` names a file that setup fills with the sandbox's
 * host directory, so a test can see the sandbox go.
 * @module
 */
import { writeFile } from "node:fs/promises";
// deno-lint-ignore no-import-prefix
import { z } from "npm:zod@^4.6.0";
import { reward, Task, type TaskHookContext, Taskset, type TasksetConfig } from "../mod.ts";

/** Reply with `expected`. */
export class EchoTask extends Task {
  static override HARNESS = "null";

  override async setup({ runtime }: TaskHookContext): Promise<void> {
    const marker = this.data.marker as string | undefined;
    if (!marker) return;
    const { stdout } = await runtime.run(["pwd"]);
    await writeFile(marker, stdout.trim());
  }

  correct = reward(({ trace }) => {
    const last = trace.messages.at(-1);
    const text = typeof last?.content === "string" ? last.content.trim() : "";
    return text === this.data.expected ? 1 : 0;
  });
}

/** One built-in task; a server builds the rest from the data trainers send. */
export class EchoTaskset extends Taskset<EchoTask> {
  static taskClass = EchoTask;
  static dataSchema = z.looseObject({ expected: z.string(), marker: z.string().optional() });

  get id(): string {
    return "zmq-echo";
  }

  *load(): Iterable<EchoTask> {
    yield new EchoTask({ prompt: "Say hi", expected: "hi" }, this.config.task ?? {});
  }
}

export function loadTaskset(config: TasksetConfig = {}): EchoTaskset {
  return new EchoTaskset(config);
}
