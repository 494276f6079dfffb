/**
 * Compose services on podman are refused with a clear error: the rollout's network is
 * internal, and podman (4.3, CNI) gives internal networks no DNS, so service names would not
 * resolve. The check runs in a process of its own that talks to podman through DOCKER_HOST, as
 * a user's run would; setting DOCKER_HOST here would send every other test module of this
 * `deno test` process to podman.
 * @module
 */
import assert from "node:assert/strict";

const PODMAN_SOCK = Deno.env.get("VF_PODMAN_SOCK") ?? "/run/podman/podman.sock";

const CHECK = `
const { ServiceGroup } = await import(${
  JSON.stringify(import.meta.resolve("../lib/services/docker.ts"))
});
const { InfraError } = await import(${JSON.stringify(import.meta.resolve("../lib/errors.ts"))});
const { DockerEngine } = await import(${
  JSON.stringify(import.meta.resolve("../runtimes/docker/engine_api.ts"))
});
const runId = Deno.args[0];
const engine = DockerEngine.shared();
let refused = null;
try {
  await ServiceGroup.start(
    { services: [{ name: "app", image: "busybox" }] },
    { runId, task: "app-task", network: "vf-net-none" },
  );
} catch (error) {
  refused = { infra: error instanceof InfraError, message: String(error.message) };
}
const left = await engine.listContainers({ all: true, labels: ["vf.run_id=" + runId] });
console.log(JSON.stringify({ refused, left: left.length, engine: engine.endpoint.display }));
await DockerEngine.closeShared();
`;

Deno.test("Compose services on podman are refused, naming podman and the task, and nothing is created", async () => {
  const runId = `podman-services-${crypto.randomUUID().slice(0, 8)}`;
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", "--no-check", "-", runId],
    env: { DOCKER_HOST: `unix://${PODMAN_SOCK}`, NO_COLOR: "1" },
    stdin: "piped",
    stdout: "piped",
    stderr: "piped",
  }).spawn();
  const writer = out.stdin.getWriter();
  await writer.write(new TextEncoder().encode(CHECK));
  await writer.close();
  const { code, stdout, stderr } = await out.output();
  const text = new TextDecoder().decode(stdout);
  assert.equal(code, 0, text + new TextDecoder().decode(stderr));
  const got = JSON.parse(text.trim().split("\n").at(-1)!);
  assert.ok(got.refused, `services started on podman: ${text}`);
  assert.ok(got.refused.infra, got.refused.message);
  assert.match(got.refused.message, /task "app-task" cannot run on podman/);
  assert.match(got.refused.message, /run tasks with services on Docker/);
  assert.match(got.engine, /podman\.sock/);
  assert.equal(got.left, 0);
});
