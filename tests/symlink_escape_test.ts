/**
 * A task folder cannot hand the evaluator's other files to a sandbox through a symlink: a
 * Compose bind mount or build context whose path leaves the folder once links are resolved
 * is refused (Docker would follow the link), and so is a Harbor `tests/` or `solution/` file
 * or folder, or a build context, linked outside. Links that stay inside still work, against a
 * real Docker engine.
 * @module
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { createRuntime, type Runtime } from "../mod.ts";
import { ConfigError } from "../lib/errors.ts";
import { checkCompose } from "../lib/services/compose.ts";
import { ServiceGroup } from "../lib/services/docker.ts";
import { RolloutNetwork } from "../lib/services/network.ts";
import { folderEntries } from "../lib/services/build.ts";
import { loadHarborTask } from "../lib/harbor/taskset.ts";
import { DockerEngine } from "../runtimes/docker/engine_api.ts";

const SECRET = "EVALUATOR-SECRET-3f9c";

/** A task folder beside an outside folder holding a secret, removed on dispose. */
async function layout() {
  const base = await Deno.makeTempDir({ prefix: "vf_symlink_" });
  const task = join(base, "task");
  const outside = join(base, "outside");
  await Deno.mkdir(task);
  await Deno.mkdir(outside);
  await Deno.writeTextFile(join(outside, "secret.txt"), SECRET);
  return { task, outside, [Symbol.asyncDispose]: () => Deno.remove(base, { recursive: true }) };
}

Deno.test("Compose: a bind mount or build context that leaves the task folder through a symlink is a ConfigError naming the file and volume; one that stays inside mounts the real folder", async () => {
  await using dir = await layout();
  const file = join(dir.task, "docker-compose.yaml");
  await Deno.symlink(dir.outside, join(dir.task, "hostroot"));
  await Deno.mkdir(join(dir.task, "data"));
  await Deno.writeTextFile(join(dir.task, "data", "inside.txt"), "INSIDE\n");
  await Deno.symlink(join(dir.task, "data"), join(dir.task, "alias"));
  const service = (extra: Record<string, unknown>) => ({
    services: { side: { image: "busybox:latest", ...extra } },
  });
  for (
    const [spec, message] of [
      [
        service({ volumes: ["./hostroot:/h:ro"] }),
        /services\.side\.volumes\[0\]: "\.\/hostroot" is outside/,
      ],
      [
        service({ volumes: ["./hostroot/deeper/none:/h"] }),
        /"\.\/hostroot\/deeper\/none" is outside/,
      ],
      [
        service({ volumes: [{ type: "bind", source: "./hostroot", target: "/h" }] }),
        /is outside the task folder/,
      ],
      [
        { services: { side: { build: "./hostroot" } } },
        /services\.side\.build\.context: "\.\/hostroot" is outside/,
      ],
    ] as const
  ) {
    assert.throws(
      () => checkCompose(spec, file, dir.task),
      (e: Error) =>
        e instanceof ConfigError && e.message.startsWith(file) && message.test(e.message),
      JSON.stringify(spec),
    );
  }
  // A link within the folder is fine, and the real folder is what Docker mounts.
  const spec = checkCompose(
    service({ command: "sh -c 'cat /d/inside.txt; sleep 30'", volumes: ["./alias:/d:ro"] }),
    file,
    dir.task,
  );
  assert.equal(spec.services[0].volumes[0].source, await Deno.realPath(join(dir.task, "data")));
  const runId = `symlink-${crypto.randomUUID().slice(0, 8)}`;
  const net = await RolloutNetwork.create({ runId, task: "t" });
  try {
    const group = await ServiceGroup.start(spec, {
      runId,
      task: "t",
      network: net.name,
      healthTimeout: 60,
      signal: new AbortController().signal,
    });
    try {
      const engine = DockerEngine.shared();
      const [c] = await engine.listContainers({ labels: [`vf.run_id=${runId}`] }) as Array<
        { Id: string }
      >;
      const client = Deno.createHttpClient({
        proxy: { transport: "unix", path: "/var/run/docker.sock" },
      });
      let logs = "";
      try {
        for (let i = 0; i < 300 && !logs.includes("INSIDE"); i++) {
          await new Promise((r) => setTimeout(r, 100));
          const res = await fetch(`http://docker/containers/${c.Id}/logs?stdout=1&stderr=1`, {
            client,
          });
          logs = new TextDecoder().decode(await res.arrayBuffer());
        }
      } finally {
        client.close();
      }
      assert.match(logs, /INSIDE/);
    } finally {
      await group.stop();
    }
  } finally {
    await net.stop();
    await DockerEngine.closeShared();
  }
});

Deno.test("folderEntries(): a file or folder linked outside the root is a ConfigError naming it; links inside are followed, a link loop is walked once", async () => {
  await using dir = await layout();
  await Deno.mkdir(join(dir.task, "tests"));
  await Deno.writeTextFile(join(dir.task, "tests", "test.sh"), "#!/bin/sh\n");
  await Deno.symlink(join(dir.task, "tests", "test.sh"), join(dir.task, "tests", "again.sh"));
  await Deno.symlink(join(dir.task, "tests"), join(dir.task, "tests", "loop"));
  const names = (await folderEntries(join(dir.task, "tests"), { root: dir.task })).map((e) =>
    e.name
  );
  assert.deepEqual(names, ["again.sh", "test.sh"]);
  await Deno.symlink(join(dir.outside, "secret.txt"), join(dir.task, "tests", "key"));
  await assert.rejects(
    folderEntries(join(dir.task, "tests"), { root: dir.task }),
    (e: Error) =>
      e instanceof ConfigError && e.message.includes(join(dir.task, "tests", "key")) &&
      /leads outside .* through a symlink/.test(e.message),
  );
  // The folder itself linked outside.
  await Deno.symlink(dir.outside, join(dir.task, "solution"));
  await assert.rejects(
    folderEntries(join(dir.task, "solution"), { root: dir.task }),
    (e: Error) => e instanceof ConfigError && e.message.includes(join(dir.task, "solution")),
  );
});

Deno.test("Harbor: solution/ or tests/ holding a symlink out of the task folder never reaches the sandbox", async () => {
  await using dir = await layout();
  const folder = join(dir.task, "gold");
  const files: Record<string, string> = {
    "instruction.md": "Do it.\n",
    "task.toml": '[environment]\ndocker_image = "busybox:latest"\n',
    "tests/test.sh": "#!/bin/sh\necho 1 > /logs/verifier/reward.txt\n",
    "solution/solve.sh": "#!/bin/sh\ncat /solution/key > /app/out.txt\n",
  };
  for (const [path, text] of Object.entries(files)) {
    await Deno.mkdir(join(folder, path, ".."), { recursive: true });
    await Deno.writeTextFile(join(folder, path), text);
  }
  await Deno.symlink(join(dir.outside, "secret.txt"), join(folder, "solution", "key"));
  const runtime = createRuntime({ type: "docker", image: "busybox:latest", workdir: "/app" }, {
    runId: `symlink-${crypto.randomUUID().slice(0, 8)}`,
  }) as Runtime & AsyncDisposable;
  await runtime.start();
  try {
    const task = await loadHarborTask(folder);
    const ctx = {
      runtime,
      task,
      data: task.data,
      trace: { info: {} as Record<string, unknown>, messages: [], artifacts: new Map() },
      state: {},
    };
    await assert.rejects(
      Promise.resolve().then(() => task.validate(ctx)),
      (e: Error) => e instanceof ConfigError && e.message.includes(join(folder, "solution", "key")),
    );
    const seen = await runtime.run(["sh", "-c", "cat /solution/key /app/out.txt 2>/dev/null"]);
    assert.doesNotMatch(seen.stdout, new RegExp(SECRET));
  } finally {
    await runtime.stop();
    await DockerEngine.closeShared();
  }
});
