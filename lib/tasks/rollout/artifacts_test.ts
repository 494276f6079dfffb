/** Artifacts out of one real Docker sandbox (busybox) and into another. */
import assert from "node:assert/strict";
import type { Runtime } from "../../../runtimes/runtime.ts";
import { TaskError } from "../../errors.ts";
import { readText, Task, type TaskData } from "../task.ts";
import { acquireSandbox } from "../sandbox.ts";
import { absolute, collectArtifacts, restoreArtifacts } from "./artifacts.ts";

function busybox(): Promise<Runtime> {
  return acquireSandbox({ type: "docker", image: "busybox:latest", workdir: "/app" }, {
    runId: "artifacts-test",
    task: "artifacts",
  });
}

const task = (data: Partial<TaskData>) =>
  new Task({ id: "t", prompt: "p", image: "busybox:latest", workdir: "/app", ...data });

Deno.test("absolute(): a relative artifact path is under the workdir, else under /", () => {
  assert.equal(absolute("out/a.txt", "/app"), "/app/out/a.txt");
  assert.equal(absolute("/data/b", "/app"), "/data/b");
  assert.equal(absolute("c", undefined), "/c");
});

Deno.test("collectArtifacts() and restoreArtifacts(): declared paths go out without excluded files and replace what the other sandbox had", async () => {
  await using agent = await busybox();
  await using grader = await busybox();
  await agent.write("/app/out/keep.txt", "kept\n");
  await agent.write("/app/out/cache/big.bin", "x".repeat(1000));
  await agent.write("/app/answer.txt", "42\n");
  const t = task({
    artifacts: [
      { source: "out", exclude: ["cache"] },
      { source: "answer.txt" },
      { source: "missing.txt", required: false },
    ],
  });
  const artifacts = await collectArtifacts(agent, t);
  assert.deepEqual([...artifacts.keys()], [
    "/app/out",
    "/app/answer.txt",
    "/app/missing.txt",
    "/logs/artifacts",
  ]);
  assert.equal(artifacts.get("/app/missing.txt"), null);
  await grader.write("/app/out/stale.txt", "from before\n");
  await grader.write("/app/answer.txt", "old\n");
  await restoreArtifacts(grader, artifacts);
  assert.equal(await readText(grader, "/app/out/keep.txt"), "kept\n");
  assert.equal(await readText(grader, "/app/answer.txt"), "42\n");
  const gone = await grader.run(["sh", "-c", "ls /app/out"]);
  assert.equal(gone.stdout.trim(), "keep.txt", "stale files and excluded ones are not there");
});

Deno.test("collectArtifacts(): a missing required artifact and a total over artifact_max_bytes are the task's errors", async () => {
  await using agent = await busybox();
  await assert.rejects(
    collectArtifacts(agent, task({ artifacts: [{ source: "nope.txt" }] })),
    (e) =>
      e instanceof TaskError &&
      e.message === 'Required artifact "nope.txt" is missing in the agent sandbox',
  );
  await agent.write("/app/big.txt", "y".repeat(20_000));
  await assert.rejects(
    collectArtifacts(agent, task({ artifacts: [{ source: "big.txt" }], artifact_max_bytes: 1024 })),
    (e) => e instanceof TaskError && /exceed artifact_max_bytes \(1024 bytes\)/.test(e.message),
  );
});
