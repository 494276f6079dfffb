/**
 * Compose services on podman are refused with a clear error: the rollout's network is
 * internal, and podman (4.3, CNI) gives internal networks no DNS, so service names would not
 * resolve. The whole process talks to podman through DOCKER_HOST, as a user's run would.
 * @module
 */
import assert from "node:assert/strict";

const PODMAN_SOCK = Deno.env.get("VF_PODMAN_SOCK") ?? "/run/podman/podman.sock";
Deno.env.set("DOCKER_HOST", `unix://${PODMAN_SOCK}`);
const { ServiceGroup } = await import("../lib/services/docker.ts");
const { InfraError } = await import("../lib/errors.ts");
const { DockerEngine } = await import("../runtimes/docker/engine_api.ts");

Deno.test("Compose services on podman are refused, naming podman and the task, and nothing is created", async () => {
  const runId = `podman-services-${crypto.randomUUID().slice(0, 8)}`;
  const engine = DockerEngine.shared();
  try {
    await assert.rejects(
      ServiceGroup.start(
        { services: [{ name: "app", image: "busybox" } as never] },
        { runId, task: "app-task", network: "vf-net-none" },
      ),
      (error: Error) => {
        assert.ok(error instanceof InfraError, String(error));
        assert.match(error.message, /task "app-task" cannot run on podman/);
        assert.match(error.message, /run tasks with services on Docker/);
        return true;
      },
    );
    assert.deepEqual(
      await engine.listContainers({ all: true, labels: [`vf.run_id=${runId}`] }),
      [],
    );
  } finally {
    await DockerEngine.closeShared();
  }
});
