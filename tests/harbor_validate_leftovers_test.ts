/**
 * `vf validate`'s gold check of a Harbor task with a separate verifier, on real Docker: the
 * check's sandbox stays up while the gold answer is graded in a fresh one, so what `solve.sh`
 * left running (a daemon that could rewrite the artifact) is stopped before the artifacts are collected.
 * @module
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { cleanupContainers } from "../mod.ts";
import { loadHarborTask } from "../lib/harbor/load.ts";
import { acquireSandbox } from "../lib/tasks/sandbox.ts";
import type { TaskHookContext } from "../lib/tasks/task.ts";

async function write(root: string, files: Record<string, string>): Promise<void> {
  for (const [path, text] of Object.entries(files)) {
    const full = join(root, path);
    await Deno.mkdir(join(full, ".."), { recursive: true });
    await Deno.writeTextFile(full, text);
  }
}

Deno.test("Harbor separate verifier, vf validate: a daemon solve.sh left in the check's sandbox is stopped before the gold answer's artifacts are collected and graded", async () => {
  const dir = await Deno.makeTempDir({ prefix: "vf_harbor_val_left_" });
  const runId = `harbor-val-left-${crypto.randomUUID().slice(0, 8)}`;
  try {
    await write(dir, {
      "sep/instruction.md": "Write 42 to /app/answer.txt.\n",
      "sep/task.toml": `schema_version = "1.3"
artifacts = ["/app/answer.txt"]
[verifier]
timeout_sec = 60.0
environment_mode = "separate"
`,
      "sep/environment/Dockerfile": "FROM busybox:latest\nRUN mkdir -p /app\nWORKDIR /app\n",
      "sep/tests/test.sh":
        '#!/bin/sh\nif [ "$(cat /app/answer.txt)" = 42 ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt\n',
      // The gold answer, and a daemon left running (its heartbeat shows it alive).
      "sep/solution/solve.sh": "#!/bin/sh\necho 42 > /app/answer.txt\n" +
        "(while :; do echo beat >> /app/heartbeat; sleep 0.2; done) >/dev/null 2>&1 &\n",
    });
    const task = await loadHarborTask(join(dir, "sep"));
    const runtime = await acquireSandbox(
      { type: "docker", image: task.data.image!, workdir: "/app", labels: {} },
      { runId, task: task.key },
    );
    try {
      const ctx: TaskHookContext = {
        runtime,
        task,
        data: task.data,
        trace: { info: {}, messages: [], artifacts: new Map() },
        state: task.initialState(),
        runId,
      };
      await task.setup(ctx);
      const v = await task.validate(ctx);
      assert.ok(v && typeof v === "object", JSON.stringify(v));
      assert.equal(v.reward, 1);
      // Graded: the daemon is gone from the check's sandbox (its heartbeat stopped).
      const lines = async () =>
        (await runtime.run(["sh", "-c", "wc -l < /app/heartbeat"])).stdout.trim();
      const before = await lines();
      await new Promise((r) => setTimeout(r, 3000));
      assert.equal(await lines(), before, "the daemon solve.sh left is still writing");
      const ps = await runtime.run(["ps"]);
      assert.doesNotMatch(ps.stdout, /sleep 0\.2/, ps.stdout);
    } finally {
      await runtime.stop();
    }
  } finally {
    await cleanupContainers({ runId });
    await Deno.remove(dir, { recursive: true });
  }
});
