/**
 * Sandbox lifecycle on the local Docker engine: median and p90 milliseconds of container
 * create, start, exec `true`, archive write (a 1 KiB file) and remove, over N iterations,
 * measured at the Engine API level and through DockerRuntime. The baseline is a `/_ping`
 * round trip on the same keep-alive connection pool, measured in the same run.
 *
 *   deno run -A bench/docker_lifecycle.ts [iterations=20] [image=busybox]
 */

import { DockerEngine, DockerRuntime } from "../runtimes/mod.ts";
import { packTar } from "../runtimes/_tar.ts";

const iterations = Number(Deno.args[0] ?? 20);
const image = Deno.args[1] ?? "busybox";
const engine = DockerEngine.shared();
const samples = new Map<string, number[]>();

async function time<T>(name: string, fn: () => Promise<T>): Promise<T> {
  const started = performance.now();
  const result = await fn();
  const list = samples.get(name) ?? [];
  list.push(performance.now() - started);
  samples.set(name, list);
  return result;
}

function quantile(values: number[], q: number): number {
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))];
}

const payload = packTar([{ name: "file.txt", type: "file", data: new Uint8Array(1024) }]);

async function execTrue(id: string): Promise<void> {
  const exec = await engine.createExec(id, {
    Cmd: ["true"],
    AttachStdout: true,
    AttachStderr: true,
  });
  const stream = await engine.startExec(exec, { onStdout() {}, onStderr() {} });
  await stream.done;
  await engine.inspectExec(exec);
}

await engine.ping(); // open a connection and negotiate the API version first
for (let i = 0; i < iterations; i++) {
  await time("baseline: GET /_ping", () => engine.ping());
  // Engine API, step by step (what DockerRuntime does, minus the image check).
  const id = await time("api: create", () =>
    engine.createContainer({
      Image: image,
      Entrypoint: [""],
      Cmd: ["sleep", "infinity"],
      Labels: { "vf.managed": "1", "vf.run_id": "bench" },
      HostConfig: { NetworkMode: "none", Init: true },
    }));
  await time("api: start", () => engine.startContainer(id));
  await time("api: exec true", () => execTrue(id));
  await time("api: archive write", () => engine.putArchive(id, "/tmp", payload));
  await time("api: remove (force)", () => engine.removeContainer(id, { force: true }));

  // The same through the Runtime interface.
  const rt = new DockerRuntime({ type: "docker", image }, { runId: "bench" });
  await time("runtime: start (inspect image + create + start)", () => rt.start());
  await time("runtime: run(['true'])", () => rt.run(["true"]));
  await time(
    "runtime: run(['true'], { timeoutMs })",
    () => rt.run(["true"], { timeoutMs: 10_000 }),
  );
  await time(
    "runtime: write('/tmp/x/file.txt', 1 KiB)",
    () => rt.write(`/tmp/x${i}/file.txt`, new Uint8Array(1024)),
  );
  await time("runtime: read('/tmp/x/file.txt')", () => rt.read(`/tmp/x${i}/file.txt`));
  await time("runtime: stop", () => rt.stop());
}

const version = await engine.version();
const baseline = quantile(samples.get("baseline: GET /_ping")!, 0.5);
console.log(
  `Docker ${version.Version} (API ${version.ApiVersion}), image ${image}, ${iterations} iterations`,
);
console.log(
  "operation".padEnd(48),
  "median ms".padStart(10),
  "p90 ms".padStart(8),
  "×ping".padStart(8),
);
for (const [name, values] of samples) {
  const median = quantile(values, 0.5);
  console.log(
    name.padEnd(48),
    median.toFixed(1).padStart(10),
    quantile(values, 0.9).toFixed(1).padStart(8),
    (median / baseline).toFixed(0).padStart(8),
  );
}
await DockerEngine.closeShared();
