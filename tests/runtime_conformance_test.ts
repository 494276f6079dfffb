/**
 * One conformance suite run against every runtime: Docker (busybox and python:3.11-slim, on
 * the real engine that tests/setup.sh starts), subprocess, ssh (a real sshd test host in
 * its own network namespace, tests/_sshd_hosts.ts), and kubernetes against the loopback
 * stand-in API server of tests/_k8s_standin.ts (pods backed by real containers; one stand-in
 * speaks exec v5, one only v4). Behaviour a runtime may lack is asked for through
 * `capabilities`, never through `type`.
 */

import assert from "node:assert/strict";
import { existsSync } from "node:fs";
import { fileURLToPath } from "node:url";
import {
  cleanupContainers,
  CommandTimeoutError,
  createRuntime,
  DockerEngine,
  DockerRuntime,
  liveRuntimes,
  type Runtime,
  type RuntimeSpec,
  SandboxError,
  SandboxFileNotFoundError,
  SandboxFileTooLargeError,
  SandboxImageError,
  SandboxStateError,
  SandboxUnavailableError,
  SandboxUnsupportedError,
  sshConnectionsClosed,
  traitsOf,
} from "../runtimes/mod.ts";
import { ConfigError, InfraError } from "../lib/errors.ts";
import { readTar } from "../runtimes/_tar.ts";
import { ownerLabels } from "../runtimes/owner.ts";
import { startSshdHost } from "./_sshd_hosts.ts";
import { startKubeStandin } from "./_k8s_standin.ts";
import { makeCertificates } from "./_remote_docker.ts";
import { closeKubeClients } from "../runtimes/k8s/mod.ts";

// The ssh target's host: a real sshd in a network namespace, removed by the last test.
const sshHost = await startSshdHost();
globalThis.addEventListener("unload", () => sshHost.closeSync());

// The kubernetes targets' API servers: stand-ins over TLS with a token, closed by the last test.
const kubeDir = Deno.makeTempDirSync({ prefix: "vf_k8s_conformance_" });
await makeCertificates(kubeDir);
const kubeTls = {
  cert: Deno.readTextFileSync(`${kubeDir}/server-cert.pem`),
  key: Deno.readTextFileSync(`${kubeDir}/server-key.pem`),
};
const kubeV5 = await startKubeStandin({ token: "conformance-token", tls: kubeTls });
const kubeV4 = await startKubeStandin({
  token: "conformance-token",
  tls: kubeTls,
  protocols: ["v4.channel.k8s.io"],
});
kubeV5.kubeconfig(`${kubeDir}/v5.yaml`, { ca: `${kubeDir}/ca.pem`, namespace: "evals" });
kubeV4.kubeconfig(`${kubeDir}/v4.yaml`, { ca: `${kubeDir}/ca.pem` });

const RUN_ID = `conformance-${crypto.randomUUID().slice(0, 8)}`;
const SPEC_ENV = { VF_SPEC_VAR: "from the spec" };

const SSH_SPEC: RuntimeSpec = {
  type: "ssh",
  host: sshHost.host,
  port: sshHost.port,
  user: sshHost.user,
  privateKeyPath: sshHost.privateKeyPath,
  knownHostsPath: sshHost.knownHostsPath,
  workdir: "/workspace",
  env: SPEC_ENV,
};

// The podman targets: podman's Engine API sockets, as root and rootless (tests/setup.sh starts
// both services and imports the same two images into them). The docker runtime reaches them
// through DOCKER_HOST or, as here, an engine client of its own.
const PODMAN_SOCK = Deno.env.get("VF_PODMAN_SOCK") ?? "/run/podman/podman.sock";
const rootlessUid = new TextDecoder().decode(
  new Deno.Command("id", { args: ["-u", Deno.env.get("VF_PODMAN_USER") ?? "vf-rootless"] })
    .outputSync().stdout,
).trim();
const PODMAN_ROOTLESS_SOCK = `/run/user/${rootlessUid}/podman/podman.sock`;
const podman = new DockerEngine(`unix://${PODMAN_SOCK}`);
const podmanRootless = new DockerEngine(`unix://${PODMAN_ROOTLESS_SOCK}`);

const TARGETS: Array<{ name: string; spec: RuntimeSpec; engine?: DockerEngine }> = [
  {
    name: "docker busybox",
    spec: { type: "docker", image: "busybox", workdir: "/workspace", env: SPEC_ENV },
  },
  {
    name: "docker busybox, plain execs (no command channel)",
    spec: {
      type: "docker",
      image: "busybox",
      workdir: "/workspace",
      env: SPEC_ENV,
      execChannel: false,
    },
  },
  {
    name: "docker python:3.11-slim",
    spec: { type: "docker", image: "python:3.11-slim", workdir: "/workspace", env: SPEC_ENV },
  },
  {
    name: "podman busybox (root)",
    spec: { type: "docker", image: "busybox", workdir: "/workspace", env: SPEC_ENV },
    engine: podman,
  },
  {
    name: "podman python:3.11-slim (root)",
    spec: { type: "docker", image: "python:3.11-slim", workdir: "/workspace", env: SPEC_ENV },
    engine: podman,
  },
  {
    name: "podman busybox (rootless)",
    spec: { type: "docker", image: "busybox", workdir: "/workspace", env: SPEC_ENV },
    engine: podmanRootless,
  },
  { name: "subprocess", spec: { type: "subprocess", workdir: "/workspace", env: SPEC_ENV } },
  { name: "ssh (sshd in a network namespace)", spec: SSH_SPEC },
  { name: "ssh, plain execs (no command channel)", spec: { ...SSH_SPEC, execChannel: false } },
  {
    name: "kubernetes (stand-in API server, exec v5, busybox)",
    spec: {
      type: "kubernetes",
      image: "busybox",
      kubeconfig: `${kubeDir}/v5.yaml`,
      workdir: "/workspace",
      env: SPEC_ENV,
    },
  },
  {
    name: "kubernetes (stand-in API server, exec v4 only, python:3.11-slim)",
    spec: {
      type: "kubernetes",
      image: "python:3.11-slim",
      kubeconfig: `${kubeDir}/v4.yaml`,
      workdir: "/workspace",
      env: SPEC_ENV,
    },
  },
];

const text = (bytes: Uint8Array) => new TextDecoder().decode(bytes);

/** A target's runtime: on the target's own engine when it names one. */
function runtimeOf(
  target: { spec: RuntimeSpec; engine?: DockerEngine },
  options: { runId?: string; task?: string } = {},
): Runtime {
  if (target.engine && target.spec.type === "docker") {
    return new DockerRuntime(target.spec, { ...options, engine: target.engine });
  }
  return createRuntime(target.spec, options);
}

/** Command lines of the processes matching `pattern`, as seen from inside the runtime. */
async function processesMatching(rt: Runtime, pattern: string): Promise<string[]> {
  const script = "for d in /proc/[0-9]*; do tr '\\0' ' ' < $d/cmdline 2>/dev/null; echo; done";
  const { stdout } = await rt.run(["sh", "-c", script]);
  return stdout.split("\n").filter((line) => line.includes(pattern) && !line.includes("/proc/"));
}

/**
 * Runs a test body, then closes keep-alive connections so the test leaves no open resources
 * behind (runtimes the body holds with `await using` are disposed before that).
 */
function closingEngines(fn: (t: Deno.TestContext) => Promise<void>) {
  return async (t: Deno.TestContext) => {
    try {
      await fn(t);
    } finally {
      await DockerEngine.closeShared();
      await podman.close();
      await podmanRootless.close();
      await sshConnectionsClosed();
      await closeKubeClients();
    }
  };
}

/**
 * Asserts a stopped runtime left nothing behind: no container, no temp dir, or (ssh, whose
 * workdir here is the spec's and so kept) no SSH connection to the host.
 */
async function assertRemoved(
  target: { spec: RuntimeSpec; engine?: DockerEngine },
  id: string,
): Promise<void> {
  if (target.spec.type === "docker") {
    assert.equal(await (target.engine ?? DockerEngine.shared()).inspectContainer(id), undefined);
  } else if (target.spec.type === "kubernetes") {
    const standin = target.spec.kubeconfig!.endsWith("v5.yaml") ? kubeV5 : kubeV4;
    assert.ok(!standin.pods().some((p) => p.endsWith(`/${id}`)), `pod ${id} was deleted`);
    const left = await DockerEngine.shared().listContainers({
      all: true,
      labels: [`vf.k8s-pod`],
    });
    assert.ok(!left.some((c) => String(c.Names).includes(id)), `the container of ${id} is gone`);
  } else if (target.spec.type === "ssh") {
    await sshConnectionsClosed();
    let open = await sshHost.connectionCount();
    for (let i = 0; i < 50 && open > 0; i++) {
      await new Promise((resolve) => setTimeout(resolve, 40));
      open = await sshHost.connectionCount();
    }
    assert.equal(open, 0, "the runtime's SSH connection was closed");
  } else {
    assert.equal(existsSync(id), false);
  }
}

for (const target of TARGETS) {
  Deno.test(
    `${target.name}: conforms to the Runtime contract`,
    closingEngines(async (t) => {
      await using rt = runtimeOf(target, { runId: RUN_ID, task: "conformance" });
      assert.equal(rt.id, "");
      await rt.start();
      assert.notEqual(rt.id, "");
      assert.ok(liveRuntimes().some((live) => live === rt), "a started runtime is registered");

      await t.step("traitsOf(spec) agrees with the started runtime's capabilities", () => {
        const traits = traitsOf(target.spec);
        const caps = rt.capabilities;
        assert.equal(traits.isolation, caps.isolation);
        assert.equal(traits.networkControl, caps.network_control);
        assert.equal(traits.killProcesses, caps.kill_processes === true);
        if (traits.killProcesses) assert.equal(typeof rt.killProcesses, "function");
        assert.equal(traits.snapshots, typeof rt.snapshot === "function");
        if (traits.users !== "if-privileged") assert.equal(caps.users, traits.users === "always");
      });

      await t.step("run() reports non-zero exits as results", async () => {
        assert.equal((await rt.run(["true"])).exit_code, 0);
        assert.equal((await rt.run(["sh", "-c", "exit 3"])).exit_code, 3);
        const missing = await rt.run(["vf-no-such-command"]);
        assert.equal(missing.exit_code, 127);
        assert.equal(missing.stdout, "");
        assert.match(missing.stderr, /vf-no-such-command/);
        const guarded = await rt.run(["vf-no-such-command"], { timeoutMs: 10_000 });
        assert.equal(guarded.exit_code, 127);
      });

      await t.step("run() keeps stderr separate from stdout", async () => {
        const result = await rt.run(["sh", "-c", "echo out; echo err >&2; echo out2; exit 4"], {
          timeoutMs: 10_000,
        });
        assert.deepEqual(
          [result.exit_code, result.stdout, result.stderr],
          [4, "out\nout2\n", "err\n"],
        );
        assert.ok(result.duration_ms >= 0);
      });

      await t.step("UTF-8 round-trips through write, read, run and stdin", async () => {
        const sample = "héllo wörld ✓ 日本語 🎉\n";
        await rt.write("utf8.txt", sample);
        assert.equal(text(await rt.read("utf8.txt")), sample);
        assert.equal((await rt.run(["cat", "utf8.txt"])).stdout, sample);
        assert.equal((await rt.run(["cat"], { stdin: sample })).stdout, sample);
        const bytes = new Uint8Array([0, 1, 2, 255, 254, 10, 13]);
        await rt.write("binary.bin", bytes);
        assert.deepEqual(await rt.read("binary.bin"), bytes);
        // A plain Uint8Array whatever the transport handed over (never a Buffer).
        const small = await rt.read("utf8.txt");
        assert.equal(Object.getPrototypeOf(small), Uint8Array.prototype);
      });

      await t.step("run() collects large output (6 MB)", async () => {
        const size = 6_000_000;
        const result = await rt.run([
          "sh",
          "-c",
          `head -c ${size} /dev/zero | tr '\\0' a; head -c 100000 /dev/zero | tr '\\0' b >&2`,
        ]);
        assert.equal(result.exit_code, 0);
        assert.equal(result.stdout.length, size);
        assert.ok(/^a+$/.test(result.stdout));
        assert.equal(result.stderr.length, 100_000);
      });

      await t.step("concurrent commands in one sandbox each get their own output", async () => {
        const results = await Promise.all(
          Array.from(
            { length: 12 },
            (_, i) =>
              rt.run([
                "sh",
                "-c",
                `sleep 0.$((${i} % 3)); echo out${i}; echo err${i} >&2; exit ${i}`,
              ], {
                stdin: i % 2 ? `in${i}` : undefined,
              }),
          ),
        );
        results.forEach((r, i) => {
          assert.deepEqual([r.exit_code, r.stdout, r.stderr], [i, `out${i}\n`, `err${i}\n`]);
        });
      });

      await t.step("run() collects 50 MB of output", async () => {
        const size = 50_000_000;
        const result = await rt.run(["sh", "-c", `head -c ${size} /dev/zero | tr '\\0' z`]);
        assert.equal(result.exit_code, 0);
        assert.equal(result.stdout.length, size);
        assert.equal(result.stdout.slice(-3), "zzz");
      });

      await t.step("a command that leaves a daemon behind returns when it ends", async () => {
        const marker = 3000 + Math.floor(Math.random() * 6000);
        const result = await rt.run(
          ["sh", "-c", `sleep ${marker} </dev/null >/dev/null 2>&1 & echo started`],
          { timeoutMs: 20_000 },
        );
        assert.deepEqual([result.exit_code, result.stdout], [0, "started\n"]);
        assert.equal((await processesMatching(rt, `sleep ${marker}`)).length, 1);
        const stop =
          `for d in /proc/[0-9]*; do case "$(tr '\\0' ' ' <$d/cmdline 2>/dev/null)" in ` +
          `"sleep ${marker} "*) kill -9 "\${d#/proc/}" ;; esac; done; true`;
        await rt.run(["sh", "-c", stop]);
        assert.deepEqual(await processesMatching(rt, `sleep ${marker}`), []);
      });

      await t.step("run() passes the spec's and the call's env", async () => {
        const result = await rt.run(["sh", "-c", 'echo "$VF_SPEC_VAR|$VF_CALL_VAR"'], {
          env: { VF_CALL_VAR: "from the call = ok" },
        });
        assert.equal(result.stdout, "from the spec|from the call = ok\n");
        const override = await rt.run(["sh", "-c", 'echo "$VF_SPEC_VAR"'], {
          env: { VF_SPEC_VAR: "overridden" },
        });
        assert.equal(override.stdout, "overridden\n");
      });

      await t.step("run() starts in the workdir and honours cwd", async () => {
        await rt.write("/workspace/sub/dir/f.txt", "in sub/dir\n");
        assert.equal((await rt.run(["cat", "sub/dir/f.txt"])).stdout, "in sub/dir\n");
        assert.equal((await rt.run(["cat", "f.txt"], { cwd: "sub/dir" })).stdout, "in sub/dir\n");
        assert.equal(
          (await rt.run(["cat", "f.txt"], { cwd: "/workspace/sub/dir" })).stdout,
          "in sub/dir\n",
        );
        await assert.rejects(
          rt.run(["true"], { cwd: "/no/such/dir" }),
          SandboxFileNotFoundError,
        );
      });

      await t.step("run() as another user when the runtime supports users", async () => {
        if (rt.capabilities.users) {
          const result = await rt.run(["id", "-u"], { user: "nobody" });
          assert.deepEqual([result.exit_code, result.stdout], [0, "65534\n"]);
          assert.equal((await rt.run(["id", "-u"])).stdout, "0\n");
        } else {
          await assert.rejects(rt.run(["id", "-u"], { user: "nobody" }), SandboxUnsupportedError);
        }
      });

      await t.step("a timeout kills the whole process tree", async () => {
        const marker = 3000 + Math.floor(Math.random() * 6000);
        const started = performance.now();
        const error = await rt
          .run(["sh", "-c", `sleep ${marker} & sleep ${marker + 1}; echo never`], {
            timeoutMs: 800,
          })
          .then(() => undefined, (e) => e);
        const elapsed = performance.now() - started;
        assert.ok(error instanceof CommandTimeoutError, `expected a timeout, got ${error}`);
        assert.match(error.message, /did not finish within 800 ms/);
        assert.ok(error.cause instanceof Error || error.cause instanceof DOMException);
        assert.ok(elapsed < 4_000, `timeout took ${Math.round(elapsed)} ms`);
        assert.deepEqual(await processesMatching(rt, `sleep ${marker}`), []);
        assert.deepEqual(await processesMatching(rt, `sleep ${marker + 1}`), []);
      });

      await t.step(
        "aborting the signal kills the command and rejects with the reason",
        async () => {
          const marker = 3000 + Math.floor(Math.random() * 6000);
          const controller = new AbortController();
          setTimeout(() => controller.abort(new Error("stop now")), 300);
          await assert.rejects(
            rt.run(["sh", "-c", `sleep ${marker} & sleep ${marker}`], {
              signal: controller.signal,
            }),
            /stop now/,
          );
          assert.deepEqual(await processesMatching(rt, `sleep ${marker}`), []);
        },
      );

      await t.step("read() of a missing file is SandboxFileNotFoundError", async () => {
        const error = await rt.read("no/such/file.txt").then(() => undefined, (e) => e);
        assert.ok(error instanceof SandboxFileNotFoundError, `got ${error}`);
        assert.ok(error instanceof SandboxError);
        assert.equal(error.path, "no/such/file.txt");
        await assert.rejects(rt.read("/workspace/sub"), /is a directory/);
      });

      await t.step("read() refuses files larger than maxBytes", async () => {
        await rt.write("big.txt", "x".repeat(2000));
        const error = await rt.read("big.txt", { maxBytes: 1000 }).then(() => undefined, (e) => e);
        assert.ok(error instanceof SandboxFileTooLargeError, `got ${error}`);
        assert.equal(error.size, 2000);
        assert.match(error.message, /2000 bytes, more than maxBytes 1000/);
        assert.equal((await rt.read("big.txt", { maxBytes: 2000 })).length, 2000);
      });

      await t.step("write() creates parent directories and sets the mode", async () => {
        await rt.write("/workspace/deep/a/b/tool.sh", "#!/bin/sh\necho tool $1\n", { mode: 0o755 });
        const result = await rt.run(["./deep/a/b/tool.sh", "ran"]);
        assert.deepEqual([result.exit_code, result.stdout], [0, "tool ran\n"]);
        await rt.write("deep/a/b/tool.sh", "#!/bin/sh\necho replaced\n", { mode: 0o755 });
        assert.equal((await rt.run(["./deep/a/b/tool.sh"])).stdout, "replaced\n");
        const long = `${"d".repeat(60)}/${"e".repeat(60)}/${"f".repeat(80)}.txt`;
        await rt.write(long, "long path");
        assert.equal(text(await rt.read(long)), "long path");
      });

      await t.step("archiveOut() → archiveIn() restores a tree in a second runtime", async () => {
        await rt.write("out/a.txt", "A\n");
        await rt.write("out/nested/b.txt", "B ✓\n");
        await rt.write("out/run.sh", "#!/bin/sh\necho run\n", { mode: 0o755 });
        const tar = await rt.archiveOut("out");
        const names = [...readTar(tar)].map((entry) => entry.name.replace(/^\.\//, ""));
        assert.ok(names.includes("out/nested/b.txt"), `entries: ${names}`);
        await assert.rejects(rt.archiveOut("no-such-dir"), SandboxFileNotFoundError);

        await using second = runtimeOf(target, { runId: RUN_ID });
        await second.start();
        await second.archiveIn("/restored/here", tar);
        assert.equal(text(await second.read("/restored/here/out/a.txt")), "A\n");
        assert.equal(text(await second.read("/restored/here/out/nested/b.txt")), "B ✓\n");
        const ran = await second.run(["./out/run.sh"], { cwd: "/restored/here" });
        assert.equal(ran.stdout, "run\n");
        const file = await rt.archiveOut("out/a.txt");
        await second.archiveIn("single", file);
        assert.equal(text(await second.read("single/a.txt")), "A\n");
        // Modes and symlinks travel; what was at the target is replaced.
        await rt.write("links/tool", "#!/bin/sh\n", { mode: 0o751 });
        const linked = await rt.run(["ln", "-sf", "tool", "links/alias"]);
        assert.equal(linked.exit_code, 0, linked.stderr);
        await second.write("/restored/links/tool", "old\n");
        await second.archiveIn("/restored", await rt.archiveOut("links"));
        const listed = await second.run(["sh", "-c", "stat -c '%a %N' tool alias"], {
          cwd: "/restored/links",
        });
        assert.equal(listed.stdout.replace(/[‘’`']/g, ""), "751 tool\n777 alias -> tool\n");
        assert.equal(text(await second.read("/restored/links/tool")), "#!/bin/sh\n");
      });

      await t.step(
        "archiveOut() leaves excluded entries out at any depth and refuses an archive past maxBytes",
        async () => {
          await rt.write("art/keep.txt", "keep\n");
          await rt.write("art/node_modules/x.js", "x".repeat(4000));
          await rt.write("art/sub/node_modules/y.js", "y".repeat(4000));
          await rt.write("art/sub/debug.log", "log\n");
          await rt.write("art/sub/kept.txt", "kept\n");
          const tar = await rt.archiveOut("art", { exclude: ["node_modules", "*.log"] });
          const names = [...readTar(tar)].map((e) =>
            e.name.replace(/^\.\//, "").replace(/\/$/, "")
          );
          assert.ok(
            names.includes("art/keep.txt") && names.includes("art/sub/kept.txt"),
            `${names}`,
          );
          assert.deepEqual(names.filter((n) => /node_modules|\.log$/.test(n)), [], `${names}`);
          const error = await rt.archiveOut("art", { maxBytes: 4096 }).then(
            () => undefined,
            (e) => e,
          );
          assert.ok(error instanceof SandboxFileTooLargeError, `got ${error}`);
          assert.equal(error.maxBytes, 4096);
          // The same tree fits once the big entries are excluded.
          const small = await rt.archiveOut("art", { maxBytes: 8192, exclude: ["node_modules"] });
          assert.ok(small.length <= 8192 + 1024, `${small.length} bytes`);
        },
      );

      await t.step("the network is off by default when the runtime controls it", async () => {
        if (!rt.capabilities.network_control) return;
        const { stdout } = await rt.run(["cat", "/proc/net/dev"]);
        const interfaces = stdout.split("\n").slice(2).map((l) => l.split(":")[0].trim())
          .filter(Boolean);
        assert.deepEqual(interfaces, ["lo"]);
      });

      await t.step("stop() is idempotent and later calls fail clearly", async () => {
        const id = rt.id;
        await rt.stop();
        await rt.stop();
        assert.ok(!liveRuntimes().includes(rt));
        await assert.rejects(rt.run(["true"]), SandboxStateError);
        await assert.rejects(rt.read("utf8.txt"), SandboxStateError);
        await assert.rejects(rt.start(), SandboxStateError);
        await assertRemoved(target, id);
      });
    }),
  );

  Deno.test(
    `${target.name}: await using and stop() during start() remove the sandbox`,
    closingEngines(async () => {
      let id = "";
      {
        await using rt = runtimeOf(target, { runId: RUN_ID });
        await rt.start();
        id = rt.id;
        assert.equal((await rt.run(["true"])).exit_code, 0);
      }
      await assertRemoved(target, id);
      const never = runtimeOf(target);
      await never.stop();
      await never.stop();

      // stop() while start() is still running: start rejects and nothing is left behind.
      const racing = runtimeOf(target, { runId: RUN_ID });
      const starting = racing.start();
      await racing.stop();
      await assert.rejects(starting, SandboxStateError);
      assert.ok(!liveRuntimes().includes(racing));
      if (racing.id) await assertRemoved(target, racing.id);
    }),
  );
}

Deno.test(
  "docker: a container has labels, limits and the network it asked for",
  closingEngines(async () => {
    await using rt = new DockerRuntime({
      type: "docker",
      image: "busybox",
      cpu: 0.5,
      memory: "256m",
      network: true,
      labels: { team: "vf" },
    }, { runId: RUN_ID, task: "task-7" });
    await rt.start();
    const info = (await DockerEngine.shared().inspectContainer(rt.id))!;
    const config = info.Config as { Labels: Record<string, string> };
    const host = info.HostConfig as Record<string, unknown>;
    assert.deepEqual(config.Labels, {
      "vf.managed": "1",
      "vf.run_id": RUN_ID,
      "vf.task": "task-7",
      team: "vf",
      // The creating process, so vf cleanup elsewhere can tell whether its run still goes.
      ...ownerLabels(),
    });
    assert.deepEqual([host.NanoCpus, host.Memory, host.NetworkMode, host.Init], [
      500_000_000,
      256 * 1024 * 1024,
      "bridge",
      true,
    ]);
    const { stdout } = await rt.run(["cat", "/proc/net/dev"]);
    assert.match(stdout, /eth0:/);
    assert.equal(rt.workdir, "/");
  }),
);

Deno.test(
  "podman (root): a container has labels, limits, an init and the bridge network it asked for",
  closingEngines(async () => {
    await using rt = new DockerRuntime({
      type: "docker",
      image: "busybox",
      cpu: 0.5,
      memory: "256m",
      network: true,
      labels: { team: "vf" },
    }, { runId: RUN_ID, task: "task-7", engine: podman });
    await rt.start();
    const info = (await podman.inspectContainer(rt.id))!;
    const labels = (info.Config as { Labels: Record<string, string> }).Labels;
    assert.equal(labels["vf.run_id"], RUN_ID);
    assert.equal(labels.team, "vf");
    const host = info.HostConfig as Record<string, unknown>;
    assert.deepEqual([host.NanoCpus, host.Memory], [500_000_000, 256 * 1024 * 1024]);
    assert.match((await rt.run(["cat", "/proc/net/dev"])).stdout, /eth0:/);
    // catatonit (podman's --init) is the container's first process, reaping what commands leave.
    assert.match((await rt.run(["cat", "/proc/1/cmdline"])).stdout, /^\/run\/podman-init\0/);
  }),
);

Deno.test(
  "podman (rootless): cpu and memory limits it would drop are refused, and nothing is left",
  closingEngines(async () => {
    const runId = `${RUN_ID}-limits`;
    const rt = new DockerRuntime(
      { type: "docker", image: "busybox", cpu: 0.5, memory: "256m" },
      { runId, engine: podmanRootless },
    );
    await assert.rejects(rt.start(), (error: Error) => {
      assert.ok(error instanceof SandboxUnsupportedError, String(error));
      assert.match(
        error.message,
        /dropped the cpu\/memory limits .*rootless podman needs cgroup v2/,
      );
      return true;
    });
    await rt.stop();
    const left = await podmanRootless.listContainers({ all: true, labels: [`vf.run_id=${runId}`] });
    assert.deepEqual(left, []);
  }),
);

Deno.test(
  "podman: plain execs report a missing working directory and command as docker does",
  closingEngines(async () => {
    for (const engine of [podman, podmanRootless]) {
      await using rt = new DockerRuntime(
        { type: "docker", image: "busybox", execChannel: false },
        { runId: RUN_ID, engine },
      );
      await rt.start();
      await assert.rejects(rt.run(["true"], { cwd: "/no/such/dir" }), SandboxFileNotFoundError);
      const missing = await rt.run(["vf-no-such-command"]);
      assert.deepEqual([missing.exit_code, missing.stdout], [127, ""]);
      assert.equal(missing.stderr, "vf-no-such-command: command not found\n");
    }
  }),
);

Deno.test(
  "docker: read() follows symlinks and write() as a non-root user",
  closingEngines(async () => {
    await using rt = createRuntime({ type: "docker", image: "busybox", user: "nobody" });
    await rt.start();
    await rt.write("/tmp/data/target.txt", "through the link");
    assert.equal((await rt.run(["ln", "-s", "data/target.txt", "/tmp/link"])).exit_code, 0);
    assert.equal(text(await rt.read("/tmp/link")), "through the link");
    // Files written for a runtime with a default user belong to that user.
    assert.equal((await rt.run(["stat", "-c", "%u", "/tmp/data/target.txt"])).stdout, "65534\n");
    assert.equal((await rt.run(["sh", "-c", "echo more >> /tmp/data/target.txt"])).exit_code, 0);
  }),
);

Deno.test(
  "docker: archives keep owners and modes alike through the command channel and the archive endpoint",
  closingEngines(async () => {
    await using source = createRuntime({ type: "docker", image: "busybox" });
    await using channel = createRuntime({ type: "docker", image: "busybox" });
    await using endpoint = createRuntime({ type: "docker", image: "busybox", execChannel: false });
    await Promise.all([source.start(), channel.start(), endpoint.start()]);
    const made = await source.run([
      "sh",
      "-c",
      "mkdir -p /art && echo x > /art/f && chown 1234:2345 /art/f && chmod 640 /art/f",
    ]);
    assert.equal(made.exit_code, 0, made.stderr);
    const tar = await source.archiveOut("/art");
    const owners = async (rt: Runtime) => {
      assert.equal((rt as DockerRuntime).channelOpen, rt === channel);
      await rt.archiveIn("/restored", tar);
      return (await rt.run(["stat", "-c", "%u:%g %a", "/restored/art/f"])).stdout.trim();
    };
    await (channel as DockerRuntime).channelReady();
    assert.equal(await owners(channel), "1234:2345 640");
    assert.equal(await owners(endpoint), "1234:2345 640");
  }),
);

Deno.test(
  "docker: archives move between docker and subprocess runtimes",
  closingEngines(async () => {
    await using docker = createRuntime({ type: "docker", image: "python:3.11-slim" });
    await using sub = createRuntime({ type: "subprocess" });
    await Promise.all([docker.start(), sub.start()]);
    await docker.write("/app/output/answer.txt", "6\n");
    await sub.archiveIn("/app", await docker.archiveOut("/app/output"));
    assert.equal(text(await sub.read("/app/output/answer.txt")), "6\n");
    await sub.write("/tests/check.py", "print(6 * 7)\n");
    await docker.archiveIn("/", await sub.archiveOut("/tests"));
    assert.equal((await docker.run(["python", "/tests/check.py"])).stdout, "42\n");
  }),
);

Deno.test(
  "docker: cleanupContainers() removes leftover labelled containers",
  closingEngines(async () => {
    const runId = `${RUN_ID}-leftover`;
    const engine = DockerEngine.shared();
    const leftover = new DockerRuntime({ type: "docker", image: "busybox" }, { runId });
    const other = new DockerRuntime({ type: "docker", image: "busybox" }, { runId: `${runId}-x` });
    await Promise.all([leftover.start(), other.start()]);
    assert.deepEqual(await cleanupContainers({ runId, olderThanMs: 3_600_000 }), []);
    assert.deepEqual(await cleanupContainers({ runId }), [leftover.id]);
    assert.equal(await engine.inspectContainer(leftover.id), undefined);
    assert.ok(await engine.inspectContainer(other.id), "another run's container is kept");
    await leftover.stop(); // already gone: still fine
    await other.stop();
  }),
);

Deno.test(
  "docker: concurrent runtimes and commands share one connection pool",
  closingEngines(async () => {
    const runtimes = Array.from(
      { length: 4 },
      () => createRuntime({ type: "docker", image: "busybox" }, { runId: RUN_ID }),
    );
    try {
      await Promise.all(runtimes.map((rt) => rt.start()));
      const results = await Promise.all(
        runtimes.flatMap((rt, i) =>
          Array.from({ length: 5 }, async (_, j) => {
            await rt.write(`/data/${j}.txt`, `${i}-${j}`);
            const { stdout } = await rt.run(["cat", `/data/${j}.txt`], { timeoutMs: 20_000 });
            return stdout === `${i}-${j}`;
          })
        ),
      );
      assert.deepEqual(results, Array(20).fill(true));
    } finally {
      await Promise.all(runtimes.map((rt) => rt.stop()));
    }
  }),
);

Deno.test(
  "docker: a container removed behind the runtime's back is SandboxUnavailableError",
  closingEngines(async () => {
    await using rt = createRuntime({ type: "docker", image: "busybox" }, { runId: RUN_ID });
    await rt.start();
    await DockerEngine.shared().removeContainer(rt.id, { force: true });
    await assert.rejects(rt.run(["true"]), SandboxUnavailableError);
    await assert.rejects(rt.read("/etc/passwd"), SandboxUnavailableError);
    await assert.rejects(rt.write("/tmp/x", "x"), SandboxUnavailableError);
  }),
);

Deno.test(
  "docker: a missing image that cannot be pulled fails clearly",
  closingEngines(async () => {
    const rt = createRuntime({ type: "docker", image: "vf-no-such-image:0.0" });
    const error = await rt.start().then(() => undefined, (e) => e);
    assert.ok(error instanceof SandboxImageError, `got ${error}`);
    assert.match(
      error.message,
      /^Image "vf-no-such-image:0\.0" is not present and cannot be pulled: .+; build or load it locally$/,
    );
    assert.equal(liveRuntimes().includes(rt), false);
  }),
);

Deno.test(
  "docker: an unreachable engine is SandboxUnavailableError naming the socket",
  closingEngines(async () => {
    const engine = new DockerEngine("unix:///tmp/vf-no-such-docker.sock");
    const rt = new DockerRuntime({ type: "docker", image: "busybox" }, { engine });
    const error = await rt.start().then(() => undefined, (e) => e);
    assert.ok(error instanceof SandboxUnavailableError, `got ${error}`);
    assert.equal(
      error.message,
      'Cannot reach the Docker engine at "/tmp/vf-no-such-docker.sock"; start dockerd or set ' +
        "DOCKER_HOST",
    );
    assert.ok(error.cause);
    await engine.close();
  }),
);

Deno.test(
  "subprocess: commands get a scrubbed environment with HOME in the workspace",
  closingEngines(async () => {
    const secret = "VF_TEST_API_KEY";
    Deno.env.set(secret, "do-not-leak");
    Deno.env.set("VF_TEST_PLAIN", "not inherited either");
    try {
      await using rt = createRuntime({ type: "subprocess" });
      await rt.start();
      const { stdout } = await rt.run(["env"], { env: { EXPLICIT_TOKEN: "given on purpose" } });
      const names = stdout.trim().split("\n").map((line) => line.split("=")[0]).sort();
      assert.deepEqual(
        names.filter((n) => !["LANG", "TERM", "TZ", "PWD", "SHLVL", "_"].includes(n)),
        ["EXPLICIT_TOKEN", "HOME", "PATH"],
      );
      assert.match(stdout, new RegExp(`^HOME=${rt.id}$`, "m"));
      assert.equal(rt.capabilities.isolation, false);
    } finally {
      Deno.env.delete(secret);
      Deno.env.delete("VF_TEST_PLAIN");
    }
  }),
);

Deno.test(
  "traitsOf(spec) agrees with the capabilities of a dedicated ssh host and of a container running its own command",
  closingEngines(async () => {
    const specs: RuntimeSpec[] = [
      { ...SSH_SPEC, dedicated: true },
      { type: "docker", image: "busybox", command: ["sleep", "3600"] },
    ];
    for (const spec of specs) {
      await using rt = createRuntime(spec, { runId: RUN_ID, task: "conformance" });
      await rt.start();
      const traits = traitsOf(spec);
      assert.equal(traits.isolation, rt.capabilities.isolation, spec.type);
      assert.equal(traits.networkControl, rt.capabilities.network_control, spec.type);
      assert.equal(traits.killProcesses, rt.capabilities.kill_processes === true, spec.type);
    }
    assert.deepEqual(specs.map((s) => traitsOf(s).isolation), [true, true]);
  }),
);

Deno.test("createRuntime() names the known types for an unknown one", () => {
  assert.throws(
    () => createRuntime({ type: "firecracker" } as unknown as RuntimeSpec),
    (error: unknown) =>
      error instanceof ConfigError &&
      error.message ===
        'Unknown runtime type "firecracker"; known types: "docker", "subprocess", "ssh", "prime", "kubernetes"',
  );
});

for (const [how, code] of [["SIGTERM", 143], ["SIGINT", 130], ["exit", 0]] as const) {
  const title = how === "exit"
    ? "a program that ends without stopping its runtimes still removes them"
    : `${how} stops live runtimes and exits ${code}`;
  Deno.test(
    title,
    closingEngines(async () => {
      const child = new Deno.Command(Deno.execPath(), {
        args: [
          "run",
          "-A",
          fileURLToPath(new URL("./_runtime_signal_child.ts", import.meta.url)),
          how === "exit" ? "exit" : "wait",
        ],
        stdout: "piped",
        stderr: "piped",
      }).spawn();
      const reader = child.stdout.pipeThrough(new TextDecoderStream()).getReader();
      let out = "";
      while (!out.includes("\n")) {
        const { value, done } = await reader.read();
        if (done) break;
        out += value;
      }
      const ready = JSON.parse(out.split("\n")[0]) as { container: string; dir: string };
      if (how !== "exit") {
        assert.ok(existsSync(ready.dir));
        assert.ok(await DockerEngine.shared().inspectContainer(ready.container));
        child.kill(how);
      }
      const status = await child.status;
      reader.releaseLock();
      await child.stdout.cancel().catch(() => {});
      const stderr = await new Response(child.stderr).text();
      assert.equal(status.code, code, stderr);
      assert.equal(existsSync(ready.dir), false);
      assert.equal(await DockerEngine.shared().inspectContainer(ready.container), undefined);
    }),
  );
}

Deno.test(
  "leaves no containers of this run behind",
  closingEngines(async () => {
    assert.deepEqual(await cleanupContainers({ runId: RUN_ID }), []);
  }),
);

Deno.test("kubernetes: the stand-ins checked every body against the schema and are closed", async () => {
  for (const standin of [kubeV5, kubeV4]) {
    const posts = standin.requests.filter((r) => r.method === "POST");
    assert.ok(posts.length >= 4, `${posts.length} creations`);
    assert.deepEqual(posts.filter((r) => r.validated !== "ok"), []);
    assert.ok(standin.requests.some((r) => r.path.includes("/exec?")));
    assert.deepEqual(standin.pods(), []);
    await standin.close();
  }
  assert.ok(kubeV5.requests.some((r) => r.path.startsWith("/api/v1/namespaces/evals/pods")));
  Deno.removeSync(kubeDir, { recursive: true });
});

Deno.test("ssh: the sshd test host is removed", async () => {
  await sshConnectionsClosed();
  await sshHost.close();
  assert.equal(existsSync(sshHost.dir), false);
});

Deno.test(
  "docker: a command channel whose supervisor is killed mid-command fails that command as an infrastructure error; later commands use plain execs",
  closingEngines(async () => {
    await using rt = new DockerRuntime({ type: "docker", image: "busybox" }, { runId: RUN_ID });
    await rt.start();
    assert.equal(await rt.channelReady(), true);
    assert.equal((await rt.run(["echo", "on the channel"])).stdout, "on the channel\n");
    const running = rt.run(["sleep", "30"], { timeoutMs: 60_000 }).then(() => null, (e) => e);
    // Kill every supervisor from outside, with an exec of our own (the pattern is bracketed
    // so this script's own command line does not match it).
    const engine = DockerEngine.shared();
    const kill = `for d in /proc/[0-9]*; do case "$(tr '\\0' ' ' <$d/cmdline 2>/dev/null)" in ` +
      `*vf-std[i]n*) kill -9 "\${d#/proc/}" ;; esac; done`;
    for (let i = 0; i < 50; i++) {
      const found = await rt.run(["sh", "-c", "ps 2>/dev/null | grep -c 'sleep 3[0]' || true"]);
      if (Number(found.stdout.trim()) > 0) break;
      await new Promise((r) => setTimeout(r, 50));
    }
    const execId = await engine.createExec(rt.id, {
      Cmd: ["sh", "-c", kill],
      AttachStdout: true,
      AttachStderr: true,
    });
    const stream = await engine.startExec(execId, { onStdout() {}, onStderr() {} });
    await stream.done;
    const error = await running;
    assert.ok(error instanceof SandboxUnavailableError, `got ${error}`);
    assert.ok(error instanceof InfraError, "an infrastructure error, never a result");
    assert.match(error.message, /command channel of container .* broke/);
    assert.equal(rt.channelOpen, false);
    const after = await rt.run(["echo", "after"]);
    assert.deepEqual([after.exit_code, after.stdout], [0, "after\n"]);
    await rt.write("/tmp/f.txt", "through the archive API");
    assert.equal(text(await rt.read("/tmp/f.txt")), "through the archive API");
  }),
);
