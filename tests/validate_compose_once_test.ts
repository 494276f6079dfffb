/**
 * `vf validate` parses a Compose file once for the whole validation, however many tasks name
 * it: three tasks on one file, each checked (gold and untouched) with its services started
 * fresh on Docker, make one parse.
 * @module
 */

import assert from "node:assert/strict";
import { join } from "node:path";
import { readText, reward, Task, type TaskHookContext, Taskset } from "../mod.ts";
import { validateTaskset } from "../lib/tasks/validate.ts";
import { ComposeCache } from "../lib/services/cache.ts";
import { loadServices } from "../lib/services/compose.ts";
import { randomHex } from "../runtimes/_util.ts";
import { cleanupContainers } from "../runtimes/docker/mod.ts";

Deno.test("vf validate: three tasks on one Compose file parse it once, and each is checked with its services", async () => {
  const dir = await Deno.makeTempDir({ prefix: "vf_validate_compose_" });
  const runId = `compose-once-${randomHex(4)}`;
  try {
    const compose = join(dir, "compose.yaml");
    await Deno.writeTextFile(
      compose,
      'services:\n  db:\n    image: busybox:latest\n    command: ["sleep", "600"]\n',
    );
    class WithDb extends Task {
      override deploymentSpec() {
        return compose;
      }
      correct = reward(async ({ runtime }) =>
        (await readText(runtime, "answer.txt").catch(() => "")).trim() === "42" ? 1 : 0
      );
      override async validate({ runtime }: TaskHookContext) {
        // The gold answer is written only when the task's service answers by name.
        const seen = await runtime.run(["sh", "-c", "ping -c 1 -W 5 db >/dev/null && echo up"], {
          timeoutMs: 60_000,
        });
        if (seen.stdout.trim() === "up") await runtime.write("answer.txt", "42\n");
      }
    }
    class ThreeTasks extends Taskset {
      override get id() {
        return "compose-once";
      }
      override load() {
        return ["a", "b", "c"].map((id) =>
          new WithDb({ id, prompt: "Write 42 to answer.txt", image: "busybox:latest" })
        );
      }
    }
    const parsed: string[] = [];
    const composeCache = new ComposeCache({
      parse: (spec) => {
        parsed.push(String(spec));
        return loadServices(spec);
      },
    });
    const results = await validateTaskset(new ThreeTasks({}), {
      runtime: { type: "docker" },
      runId,
      maxConcurrent: 3,
      composeCache,
    });
    assert.deepEqual(
      results.map((r) => [r.task, r.ok, r.gold_reward, r.empty_reward, r.error]),
      [["a", true, 1, 0, null], ["b", true, 1, 0, null], ["c", true, 1, 0, null]],
    );
    assert.deepEqual(parsed, [compose]);
  } finally {
    await cleanupContainers({ runId });
    await Deno.remove(dir, { recursive: true });
  }
});
