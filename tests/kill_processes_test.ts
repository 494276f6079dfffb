/**
 * `Runtime.killProcesses` on real Docker containers: what an agent leaves running (a daemon
 * reparented to init, a setsid'd loop, a process of another user, a detached exec) is gone
 * afterwards, while the container's init and command and the command channel's supervisors
 * live on, so commands still go through the channel. The kubernetes runtime does the same in
 * its pod (through the API stand-in of tests/_k8s_standin.ts, pods being Docker containers).
 * @module
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { DockerRuntime } from "../runtimes/docker/mod.ts";
import { closeKubeClients, KubernetesRuntime } from "../runtimes/k8s/mod.ts";
import { SWEEP } from "../runtimes/_sweep.ts";
import { startKubeStandin } from "./_k8s_standin.ts";
import { makeCertificates } from "./_remote_docker.ts";

/** Leaves writers behind: each appends to /tmp/ticks every 50 ms. */
const DAEMONS = [
  "(while :; do echo a >> /tmp/ticks; sleep 0.05; done) </dev/null >/dev/null 2>&1 &",
  "setsid sh -c 'while :; do echo b >> /tmp/ticks; sleep 0.05; done' </dev/null >/dev/null 2>&1 &",
  "nohup sh -c 'trap \"\" TERM HUP INT; while :; do echo c >> /tmp/ticks; sleep 0.05; done' </dev/null >/dev/null 2>&1 &",
].join("\n");

async function ticks(rt: DockerRuntime | KubernetesRuntime): Promise<number> {
  const r = await rt.run(["sh", "-c", "wc -c < /tmp/ticks 2>/dev/null || echo 0"]);
  return Number(r.stdout.trim());
}

Deno.test("DockerRuntime.killProcesses(): daemons of every kind are gone; init, the container's command and the channel's supervisors stay, and commands still use the channel", async () => {
  await using rt = new DockerRuntime({ type: "docker", image: "busybox:latest" }, { ledger: null });
  await rt.start();
  assert.equal(rt.capabilities.kill_processes, true);
  // A service runs its own command, which a sweep could not tell from a leftover.
  const service = new DockerRuntime({ type: "docker", image: "busybox:latest", command: null });
  assert.equal(service.capabilities.kill_processes, false);
  assert.equal(await rt.channelReady(), true);
  await rt.run(["sh", "-c", DAEMONS]);
  // Another user's daemon, started by a plain exec of its own.
  await rt.run(["sh", "-c", "(while :; do sleep 0.05; done) </dev/null >/dev/null 2>&1 &"], {
    user: "65534",
  });
  const before = await rt.run(["ps", "-o", "pid,ppid,user,args"]);
  assert.match(before.stdout, /65534|nobody/);
  const t0 = await ticks(rt);
  await new Promise((r) => setTimeout(r, 300));
  assert.ok((await ticks(rt)) > t0, "the daemons are writing");

  await rt.killProcesses();
  const t1 = await ticks(rt);
  await new Promise((r) => setTimeout(r, 400));
  assert.equal(await ticks(rt), t1, "nothing writes after the sweep");

  // What is left: init, `sleep infinity`, the supervisors (and the ps that lists them).
  const after = await rt.run(["ps", "-o", "pid,ppid,user,args"]);
  const rows = after.stdout.trim().split("\n").slice(1).map((l) => l.trim().split(/\s+/));
  assert.ok(!after.stdout.includes("ticks"), after.stdout);
  assert.ok(!rows.some((r) => r[2] === "65534" || r[2] === "nobody"), after.stdout);
  assert.ok(!rows.some((r) => r[1] === "1" && r.slice(3).join(" ") !== "sleep infinity"));
  assert.ok(rows.some((r) => r[0] === "1"), after.stdout);
  assert.ok(rows.some((r) => r.slice(3).join(" ") === "sleep infinity"), after.stdout);
  assert.equal(rt.channelOpen, true, "the command channel survived");
  const echo = await rt.run(["echo", "still here"]);
  assert.equal(echo.stdout, "still here\n");

  // A second sweep with nothing to kill is quick and harmless.
  await rt.killProcesses();
  assert.equal((await rt.run(["true"])).exit_code, 0);
});

Deno.test("DockerRuntime.killProcesses(): without the command channel and under dash (Debian), every exec'd process goes and the container keeps running", async () => {
  await using rt = new DockerRuntime(
    { type: "docker", image: "python:3.11-slim", execChannel: false },
    { ledger: null },
  );
  await rt.start();
  await rt.run(["sh", "-c", DAEMONS]);
  await rt.killProcesses();
  const t1 = await ticks(rt);
  await new Promise((r) => setTimeout(r, 400));
  assert.equal(await ticks(rt), t1, "nothing writes after the sweep");
  // The image has no ps: each process's command line from /proc.
  const ps = await rt.run([
    "sh",
    "-c",
    'for d in /proc/[0-9]*; do [ "$d" = /proc/$$ ] || tr "\\0" " " <"$d/cmdline"; echo; done',
  ]);
  const lines = ps.stdout.split("\n").map((l) => l.trim()).filter(Boolean);
  assert.deepEqual(lines, ["/sbin/docker-init -- sleep infinity", "sleep infinity"], ps.stdout);
});

Deno.test("the sweep counts what it may not signal as a survivor: run as another user, it reports root's processes and kills none of them", async () => {
  await using rt = new DockerRuntime({ type: "docker", image: "busybox:latest" }, { ledger: null });
  await rt.start();
  await rt.run(["sh", "-c", DAEMONS]);
  const r = await rt.run(["sh", "-c", SWEEP, "vf-sweep", "sleep"], { user: "65534" });
  assert.ok(Number(r.stdout.trim()) >= 3, r.stdout + r.stderr); // the three daemons at least
  const t1 = await ticks(rt);
  await new Promise((r) => setTimeout(r, 300));
  assert.ok((await ticks(rt)) > t1, "root's daemons still run: the sweep could not kill them");
  await rt.killProcesses();
  const t2 = await ticks(rt);
  await new Promise((r) => setTimeout(r, 300));
  assert.equal(await ticks(rt), t2);
});

Deno.test("KubernetesRuntime.killProcesses(): the daemons in its pod are gone and the pod keeps running", async () => {
  const dir = await Deno.makeTempDir({ prefix: "vf_k8s_sweep_" });
  await makeCertificates(dir);
  const standin = await startKubeStandin({
    token: "sweep-token",
    tls: {
      cert: await Deno.readTextFile(join(dir, "server-cert.pem")),
      key: await Deno.readTextFile(join(dir, "server-key.pem")),
    },
  });
  const kubeconfig = join(dir, "kubeconfig.yaml");
  standin.kubeconfig(kubeconfig, { ca: join(dir, "ca.pem") });
  try {
    await using rt = new KubernetesRuntime(
      { type: "kubernetes", image: "busybox", kubeconfig },
      { ledger: null },
    );
    await rt.start();
    assert.equal(rt.capabilities.kill_processes, true);
    await rt.run(["sh", "-c", DAEMONS]);
    await rt.killProcesses();
    const t1 = await ticks(rt);
    await new Promise((r) => setTimeout(r, 400));
    assert.equal(await ticks(rt), t1, "nothing writes after the sweep");
    const ps = await rt.run(["ps", "-o", "args"]);
    assert.ok(!ps.stdout.includes("ticks"), ps.stdout);
    assert.match(ps.stdout, /sleep infinity/);
    assert.equal((await rt.run(["echo", "ok"])).stdout, "ok\n");
  } finally {
    await closeKubeClients();
    await standin.close();
    await Deno.remove(dir, { recursive: true });
  }
});
