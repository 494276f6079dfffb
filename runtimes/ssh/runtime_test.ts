/**
 * The ssh runtime against real sshd test hosts (tests/_sshd_hosts.ts): host-key checks,
 * authentication errors, connection reuse, remote timeouts, the per-runtime workdir and a
 * host that goes away. The shared Runtime contract is in runtime_conformance_test.ts.
 */

import assert from "node:assert/strict";
import { copyFile, mkdir, mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import {
  CommandTimeoutError,
  createRuntime,
  liveRuntimes,
  SandboxUnavailableError,
  SandboxUnsupportedError,
  SshConnectError,
  sshConnections,
  sshConnectionsClosed,
  SshRuntime,
  type SshRuntimeSpec,
} from "../mod.ts";
import { loadSsh2 } from "./connection.ts";
import { tarSideExcludes } from "./runtime.ts";
import { packTar, readTar } from "../_tar.ts";
import { sshSpecFor, startSshdHosts } from "../../tests/_sshd_hosts.ts";

const [host, doomed] = await startSshdHosts(2);
globalThis.addEventListener("unload", () => {
  host.closeSync();
  doomed.closeSync();
});

const tmp = await mkdtemp(join(tmpdir(), "vf-ssh-test-"));

function specFor(h = host, extra: Partial<SshRuntimeSpec> = {}): SshRuntimeSpec {
  return sshSpecFor(h, extra);
}

/** A test body that leaves no SSH socket open behind it. */
function settled(fn: () => Promise<void>) {
  return async () => {
    try {
      await fn();
    } finally {
      await sshConnectionsClosed();
    }
  };
}

async function startError(spec: SshRuntimeSpec): Promise<unknown> {
  const rt = createRuntime(spec);
  const error = await rt.start().then(() => undefined, (e) => e);
  assert.ok(!liveRuntimes().includes(rt), "a runtime that failed to start is not registered");
  return error;
}

async function newKeyFile(name: string): Promise<{ path: string; publicKey: string }> {
  const { utils } = await loadSsh2();
  const pair = utils.generateKeyPairSync("ed25519");
  const path = join(tmp, name);
  await writeFile(path, pair.private, { mode: 0o600 });
  return { path, publicKey: pair.public };
}

const accepted = (log: string) => (log.match(/Accepted publickey for /g) ?? []).length;

Deno.test(
  "ssh: an unknown host key is refused without trustOnFirstUse, naming host and fingerprint",
  settled(async () => {
    const knownHosts = join(tmp, "empty_known_hosts");
    await writeFile(knownHosts, "# nothing yet\n");
    const error = await startError(specFor(host, { knownHostsPath: knownHosts }));
    assert.ok(error instanceof SshConnectError, `got ${error}`);
    assert.ok(error instanceof SandboxUnavailableError);
    assert.equal(error.reason, "host-key");
    assert.ok(error.message.includes(`"${host.host}"`), error.message);
    assert.ok(error.message.includes(host.fingerprint), error.message);
    assert.match(error.message, /is not in known_hosts .*set trustOnFirstUse: true/);
    assert.equal(await readFile(knownHosts, "utf8"), "# nothing yet\n", "nothing was recorded");
  }),
);

Deno.test(
  "ssh: trustOnFirstUse records an unknown host's key, and later connections check it",
  settled(async () => {
    const knownHosts = join(tmp, "tofu_known_hosts");
    {
      await using rt = createRuntime(
        specFor(host, { knownHostsPath: knownHosts, trustOnFirstUse: true }),
      );
      await rt.start();
      assert.equal((await rt.run(["true"])).exit_code, 0);
    }
    assert.equal(await readFile(knownHosts, "utf8"), host.knownHostsLine + "\n");
    await sshConnectionsClosed();
    await using strict = createRuntime(specFor(host, { knownHostsPath: knownHosts }));
    await strict.start();
    assert.equal((await strict.run(["echo", "ok"])).stdout, "ok\n");
  }),
);

Deno.test(
  "ssh: a changed host key is refused even with trustOnFirstUse",
  settled(async () => {
    const other = await newKeyFile("other_host_key");
    const [type, data] = other.publicKey.trim().split(/\s+/);
    const knownHosts = join(tmp, "changed_known_hosts");
    await writeFile(knownHosts, `${host.host} ${type} ${data}\n`);
    const error = await startError(
      specFor(host, { knownHostsPath: knownHosts, trustOnFirstUse: true }),
    );
    assert.ok(error instanceof SshConnectError, `got ${error}`);
    assert.equal(error.reason, "host-key");
    assert.match(error.message, /does not match known_hosts .* line 1/);
    assert.ok(error.message.includes(host.fingerprint));
    assert.match(error.message, /ssh-keygen -R/);
  }),
);

Deno.test(
  "ssh: a key the host does not accept is an authentication error",
  settled(async () => {
    const stranger = await newKeyFile("stranger_key");
    const error = await startError(specFor(host, { privateKeyPath: stranger.path }));
    assert.ok(error instanceof SshConnectError, `got ${error}`);
    assert.equal(error.reason, "auth");
    assert.match(
      error.message,
      /^Cannot connect to SSH host "root@10\.213\.[\d.]+:22": authentication as "root" failed/,
    );
    const missing = await startError(specFor(host, { privateKeyPath: join(tmp, "no-such-key") }));
    assert.ok(missing instanceof SshConnectError);
    assert.match(missing.message, /cannot read privateKeyPath ".*no-such-key"/);
  }),
);

Deno.test(
  "ssh: agent: true authenticates through the ssh-agent at SSH_AUTH_SOCK",
  settled(async () => {
    const sock = join(tmp, "agent.sock");
    const agent = await new Deno.Command("ssh-agent", { args: ["-a", sock, "-s"] }).output();
    const pid = Number(/SSH_AGENT_PID=(\d+)/.exec(new TextDecoder().decode(agent.stdout))?.[1]);
    assert.ok(pid > 0, "ssh-agent started");
    const previous = Deno.env.get("SSH_AUTH_SOCK");
    try {
      const added = await new Deno.Command("ssh-add", {
        args: [host.privateKeyPath],
        env: { SSH_AUTH_SOCK: sock },
        stderr: "null",
      }).output();
      assert.equal(added.code, 0);
      Deno.env.set("SSH_AUTH_SOCK", sock);
      const { privateKeyPath: _, ...noKey } = specFor();
      {
        await using rt = createRuntime({ ...noKey, agent: true });
        await rt.start();
        assert.equal((await rt.run(["echo", "via agent"])).stdout, "via agent\n");
      }
      // With no runtime holding the connection, the next start connects (and needs the agent).
      await sshConnectionsClosed();
      Deno.env.delete("SSH_AUTH_SOCK");
      const error = await startError({ ...noKey, agent: true });
      assert.ok(error instanceof SshConnectError && error.reason === "identity", `got ${error}`);
      assert.match(error.message, /agent is true but SSH_AUTH_SOCK is not set/);
    } finally {
      if (previous === undefined) Deno.env.delete("SSH_AUTH_SOCK");
      else Deno.env.set("SSH_AUTH_SOCK", previous);
      Deno.kill(pid, "SIGTERM");
    }
  }),
);

Deno.test(
  "ssh: nothing listening on the port is SandboxUnavailableError",
  settled(async () => {
    const error = await startError(specFor(host, { port: 2222 }));
    assert.ok(error instanceof SshConnectError, `got ${error}`);
    assert.equal(error.reason, "network");
    assert.match(error.message, /cannot connect \(ECONNREFUSED\); check that the host is up/);
  }),
);

Deno.test(
  "ssh: runtimes on one host share one TCP connection across operations",
  settled(async () => {
    const before = accepted(host.log());
    await using a = new SshRuntime(specFor());
    await using b = new SshRuntime(specFor());
    await Promise.all([a.start(), b.start()]);
    const ops = Array.from({ length: 20 }, async (_, i) => {
      const rt = i % 2 ? a : b;
      if (i % 3 === 0) {
        await rt.write(`f${i}.txt`, `${i}`);
        return new TextDecoder().decode(await rt.read(`f${i}.txt`)) === `${i}`;
      }
      return (await rt.run(["echo", String(i)], { timeoutMs: 30_000 })).stdout === `${i}\n`;
    });
    assert.deepEqual(await Promise.all(ops), Array(20).fill(true));
    assert.equal(await host.connectionCount(), 1);
    assert.equal(a.connection, b.connection);
    assert.equal(a.connection!.connects, 1);
    assert.equal(accepted(host.log()) - before, 1, "one login in sshd's log");
    assert.equal(sshConnections().length, 1);
  }),
);

Deno.test(
  "ssh: more commands than the server's MaxSessions queue, and timeouts still kill them",
  settled(async () => {
    await using rt = new SshRuntime(specFor());
    await rt.start();
    // OpenSSH allows 10 channels per connection by default: 16 at once must queue.
    const quick = await Promise.all(
      Array.from({ length: 16 }, (_, i) => rt.run(["sh", "-c", `sleep 0.2; echo ${i}`])),
    );
    assert.deepEqual(quick.map((r) => r.stdout), Array.from({ length: 16 }, (_, i) => `${i}\n`));

    // Every command channel busy with a command that times out: the kills use a channel of
    // their own, so they are not stuck behind the commands they kill.
    const marker = 4000 + Math.floor(Math.random() * 5000);
    const results = await Promise.allSettled(
      Array.from(
        { length: 8 },
        () => rt.run(["sh", "-c", `sleep ${marker} & sleep ${marker}`], { timeoutMs: 1_000 }),
      ),
    );
    assert.ok(
      results.every((r) => r.status === "rejected" && r.reason instanceof CommandTimeoutError),
    );
    // The test hosts share this machine's process table: look for survivors here.
    const survivors: string[] = [];
    for (const entry of Deno.readDirSync("/proc")) {
      if (!/^\d+$/.test(entry.name)) continue;
      try {
        const cmdline = Deno.readTextFileSync(`/proc/${entry.name}/cmdline`).replaceAll("\0", " ");
        if (cmdline.startsWith(`sleep ${marker}`)) survivors.push(`${entry.name}: ${cmdline}`);
      } catch {
        // exited meanwhile
      }
    }
    assert.deepEqual(survivors, [], "no sleep survived on the host");
  }),
);

Deno.test(
  "ssh: a dedicated host holds one sandbox at a time; a second one waits until the first has stopped and removed its workdir",
  settled(async () => {
    const first = new SshRuntime(specFor(host, { dedicated: true }));
    const second = new SshRuntime(specFor(host, { dedicated: true }));
    try {
      await first.start();
      const told: boolean[] = [];
      let started = false;
      const starting = second.start({ onQueue: (waiting) => told.push(waiting) })
        .then(() => (started = true));
      // A shared (not dedicated) runtime on the same host does not wait.
      await using shared = new SshRuntime(specFor(host));
      await shared.start();
      assert.equal((await shared.run(["true"])).exit_code, 0);
      assert.equal(started, false, "the second sandbox waits while the first holds the host");
      assert.deepEqual(told, [true]);
      assert.ok(await host.exists(first.workdir));
      const firstDir = first.workdir;
      await first.stop();
      await starting;
      assert.deepEqual(told, [true, false]);
      assert.equal(await host.exists(firstDir), false, "the first was gone before the second");
      assert.equal((await second.run(["true"])).exit_code, 0);
    } finally {
      await first.stop();
      await second.stop();
    }
  }),
);

Deno.test(
  "ssh: a start waiting for a dedicated host gives up on abort or stop() and leaves no claim",
  settled(async () => {
    const holder = new SshRuntime(specFor(host, { dedicated: true }));
    const aborted = new SshRuntime(specFor(host, { dedicated: true }));
    const stopped = new SshRuntime(specFor(host, { dedicated: true }));
    try {
      await holder.start();
      const controller = new AbortController();
      const waiting = aborted.start({ signal: controller.signal }).then(() => null, (e) => e);
      const cut = stopped.start().then(() => null, (e) => e);
      controller.abort(new Error("given up"));
      assert.equal((await waiting)?.message, "given up");
      await stopped.stop();
      assert.match(String(await cut), /stopped while it was starting/);
      assert.ok(!liveRuntimes().includes(aborted) && !liveRuntimes().includes(stopped));
      await holder.stop();
      // Neither left a claim behind: the next sandbox has the host at once.
      await using next = new SshRuntime(specFor(host, { dedicated: true }));
      const told: boolean[] = [];
      await next.start({ onQueue: (w) => told.push(w) });
      assert.deepEqual(told, [], "no wait");
    } finally {
      await holder.stop();
      await aborted.stop();
      await stopped.stop();
    }
  }),
);

Deno.test(
  "ssh: the default workdir is a fresh /tmp/vf-<id> that stop() removes; a given one is kept",
  settled(async () => {
    const rt = new SshRuntime(specFor(host, { dedicated: true }));
    assert.equal(rt.capabilities.isolation, true);
    await rt.start();
    assert.equal(rt.workdir, `/tmp/${rt.id}`);
    assert.match(rt.id, /^vf-[0-9a-f]{12}$/);
    assert.equal((await rt.run(["pwd"])).stdout, `${rt.workdir}\n`);
    await rt.write("inside.txt", "x");
    assert.ok(await host.exists(`${rt.workdir}/inside.txt`));
    const other = new SshRuntime(specFor());
    await other.start();
    assert.notEqual(other.workdir, rt.workdir);
    assert.equal(other.capabilities.isolation, false, "a shared host is not isolated");
    await rt.stop();
    assert.equal(await host.exists(rt.workdir), false);
    assert.ok(await host.exists(other.workdir), "another runtime's workdir is untouched");
    await other.stop();
    assert.equal(await host.exists(other.workdir), false);

    const given = new SshRuntime(specFor(host, { workdir: "/srv/vf-kept/work" }));
    await given.start();
    assert.equal((await given.run(["pwd"])).stdout, "/srv/vf-kept/work\n");
    await given.stop();
    assert.ok(await host.exists("/srv/vf-kept/work"), "a workdir from the spec is kept");
  }),
);

Deno.test(
  "ssh: a login without root or sudo cannot switch users",
  settled(async () => {
    const key = await newKeyFile("plain_user_key");
    await host.addUser("vfplain", key.publicKey);
    await using rt = createRuntime(
      specFor(host, { user: "vfplain", privateKeyPath: key.path }),
    );
    await rt.start();
    assert.equal(rt.capabilities.users, false);
    assert.notEqual((await rt.run(["id", "-u"])).stdout, "0\n");
    await assert.rejects(rt.run(["id"], { user: "root" }), SandboxUnsupportedError);
  }),
);

Deno.test(
  "ssh: archiveOut hands simple exclusions to the host's tar, which never opens the excluded files",
  settled(async () => {
    const key = await newKeyFile("exclude_user_key");
    await host.addUser("vfexcl", key.publicKey);
    await using rt = new SshRuntime(specFor(host, { user: "vfexcl", privateKeyPath: key.path }));
    await rt.start();
    await rt.write("out/keep.txt", "kept\n");
    await rt.write("out/debug.log", "noise\n");
    // A file the login user cannot read, inside an excluded directory: tar fails on it
    // unless it is excluded on the host, before anything is read.
    const made = await host.exec([
      "sh",
      "-c",
      'mkdir -p "$1/out/deep/node_modules" && echo secret >"$1/out/deep/node_modules/x" && ' +
      'chmod 600 "$1/out/deep/node_modules/x"',
      "sh",
      rt.workdir,
    ]);
    assert.equal(made.code, 0, made.stderr);
    await assert.rejects(rt.archiveOut("out"), /Permission denied/);
    const tar = await rt.archiveOut("out", { exclude: ["node_modules", "*.log"] });
    const names = [...readTar(tar)].map((e) => e.name).filter((n) => !n.endsWith("/")).sort();
    assert.deepEqual(names, ["out/keep.txt"]);
  }),
);

Deno.test("tarSideExcludes() passes on only the patterns tar matches as vf does", () => {
  assert.deepEqual(
    tarSideExcludes(["node_modules", "*.pyc", "a/b", "**/x", "f?o", "[ab]", "out", "*t"], "out"),
    ["node_modules", "*.pyc"],
  );
});

Deno.test(
  "ssh: a dropped connection is made again on the next operation",
  settled(async () => {
    await using rt = new SshRuntime(specFor());
    await rt.start();
    assert.equal((await rt.run(["true"])).exit_code, 0);
    for (const pid of await host.sessionPids()) Deno.kill(pid, "SIGKILL");
    // The client learns of the reset when it reads; give it a moment.
    for (let i = 0; i < 50 && rt.connection!.connected; i++) {
      await new Promise((resolve) => setTimeout(resolve, 20));
    }
    assert.equal((await rt.run(["echo", "again"])).stdout, "again\n");
    assert.equal(new TextDecoder().decode(await rt.read("/etc/hostname")).length > 0, true);
    assert.equal(rt.connection!.connects, 2);
  }),
);

Deno.test(
  "ssh: a host that goes away is SandboxUnavailableError, and stop() still returns",
  settled(async () => {
    const rt = new SshRuntime(specFor(doomed));
    await rt.start();
    await rt.write("a.txt", "a");
    await doomed.killSshd();
    for (let i = 0; i < 50 && rt.connection!.connected; i++) {
      await new Promise((resolve) => setTimeout(resolve, 20));
    }
    const run = await rt.run(["true"]).then(() => undefined, (e) => e);
    assert.ok(run instanceof SandboxUnavailableError, `got ${run}`);
    assert.match(run.message, /ECONNREFUSED/);
    await assert.rejects(rt.read("a.txt"), SandboxUnavailableError);
    await assert.rejects(rt.write("b.txt", "b"), SandboxUnavailableError);
    const started = performance.now();
    await rt.stop();
    assert.ok(performance.now() - started < 5_000);
    assert.ok(!liveRuntimes().includes(rt));
  }),
);

Deno.test(
  "ssh: a per-rollout workdir left by a crashed evaluator is in the ledger and vf cleanup's ledger sweep removes it",
  settled(async () => {
    const { Ledger, cleanupLedger, defaultLedger, setDefaultLedger, liveEntries } = await import(
      "../ledger.ts"
    );
    const before = defaultLedger();
    const ledger = new Ledger(join(tmp, "ledger.jsonl"));
    setDefaultLedger(ledger);
    try {
      const runId = `ssh-ledger-${crypto.randomUUID().slice(0, 8)}`;
      const rt = new SshRuntime(specFor(host), { runId });
      await rt.start();
      const dir = rt.workdir;
      assert.ok(await host.exists(dir), "the workdir exists while the runtime lives");
      // Simulate a crash: the runtime is never stopped; only the ledger knows about it.
      const live = await liveEntries({ runId });
      assert.deepEqual(live.map((l) => [l.type, l.key]), [[
        "ssh",
        `${host.host}:${host.port}:${dir}`,
      ]]);
      const report = await cleanupLedger({ runId }, { ledger });
      assert.deepEqual(report.failed, []);
      assert.deepEqual(report.removed, [`ssh:${host.host}:${host.port}:${dir}`]);
      assert.equal(await host.exists(dir), false, "cleanup removed the workdir");
      assert.deepEqual(await liveEntries({ runId }), []);
      await rt.stop(); // still idempotent against a removed workdir
    } finally {
      setDefaultLedger(before);
    }
  }),
);

Deno.test(
  "ssh: a workdir whose creation was cut off with the connection stays live in the ledger, and vf cleanup removes it",
  settled(async () => {
    const { Ledger, cleanupLedger, defaultLedger, setDefaultLedger, liveEntries } = await import(
      "../ledger.ts"
    );
    const [flaky] = await startSshdHosts(1);
    const before = defaultLedger();
    const ledger = new Ledger(join(tmp, "ledger-cut.jsonl"));
    setDefaultLedger(ledger);
    try {
      // `id` on this host answers after 30 s: start() has made the workdir and waits there
      // when sshd goes down, so its reply never comes.
      await flaky.exec([
        "sh",
        "-c",
        "printf '#!/bin/sh\\nsleep 30\\nexec /usr/bin/id \"$@\"\\n' >/usr/local/bin/id && " +
        "chmod 755 /usr/local/bin/id",
      ]);
      const runId = `ssh-cut-${crypto.randomUUID().slice(0, 8)}`;
      const rt = new SshRuntime(specFor(flaky), { runId });
      const starting = rt.start().then(() => undefined, (e) => e);
      let dir = "";
      for (let i = 0; !dir || !(await flaky.exists(dir)); i++) {
        assert.ok(i < 400, "start() never made its workdir");
        await new Promise((r) => setTimeout(r, 25));
        if (rt.id) dir = `/tmp/${rt.id}`;
      }
      await flaky.stopSshd();
      assert.ok(await starting instanceof Error, "start() failed with the connection");
      await rt.stop(); // the host is down: the workdir cannot be removed now
      await flaky.exec(["rm", "-f", "/usr/local/bin/id"]);
      await flaky.startSshd();
      assert.ok(await flaky.exists(dir), "the workdir is still on the host");
      assert.deepEqual((await liveEntries({ runId })).map((l) => l.key), [
        `${flaky.host}:${flaky.port}:${dir}`,
      ]);
      const report = await cleanupLedger({ runId }, { ledger });
      assert.deepEqual(report.failed, []);
      assert.equal(await flaky.exists(dir), false, "cleanup removed the workdir");
    } finally {
      setDefaultLedger(before);
      await flaky.close();
    }
  }),
);

Deno.test(
  "ssh: a host alias from an ssh config file supplies HostName, User, Port, IdentityFile and UserKnownHostsFile",
  settled(async () => {
    const config = join(tmp, "ssh_config");
    await writeFile(
      config,
      [
        "Host vf-lab-*",
        `  HostName ${host.host}`,
        `  Port ${host.port}`,
        `  User ${host.user}`,
        `  IdentityFile ${host.privateKeyPath}`,
        `  UserKnownHostsFile ${host.knownHostsPath}`,
        "Host *",
        "  Port 2222", // later blocks never override what an earlier one set
        "",
      ].join("\n"),
    );
    {
      await using rt = createRuntime({ type: "ssh", host: "vf-lab-7", sshConfigPath: config });
      await rt.start();
      assert.equal((await rt.run(["echo", "via alias"])).stdout, "via alias\n");
      assert.equal((rt as SshRuntime).address, `${host.user}@${host.host}:${host.port}`);
    }
    // Fields in the spec win over the file: the port from the spec (nothing listens on it).
    const error = await startError({
      type: "ssh",
      host: "vf-lab-7",
      port: 2222,
      sshConfigPath: config,
    });
    assert.ok(error instanceof SshConnectError && error.reason === "network", `got ${error}`);
    // Without the file the alias means nothing.
    const unresolved = await startError({
      type: "ssh",
      host: "vf-lab-7",
      sshConfigPath: null,
      privateKeyPath: host.privateKeyPath,
      connectTimeoutMs: 3_000,
    });
    assert.ok(unresolved instanceof SshConnectError, `got ${unresolved}`);
  }),
);

Deno.test(
  "ssh: ~/ in privateKeyPath, knownHostsPath and sshConfigPath means the home directory",
  settled(async () => {
    const home = join(tmp, "home");
    await mkdir(join(home, "keys"), { recursive: true });
    await copyFile(host.privateKeyPath, join(home, "keys", "id"));
    await copyFile(host.knownHostsPath, join(home, "keys", "known_hosts"));
    await writeFile(join(home, "keys", "config"), `Host tilde-box\n  HostName ${host.host}\n`);
    const previous = Deno.env.get("HOME");
    Deno.env.set("HOME", home);
    try {
      await using rt = createRuntime({
        type: "ssh",
        host: "tilde-box",
        port: host.port,
        user: host.user,
        privateKeyPath: "~/keys/id",
        knownHostsPath: "~/keys/known_hosts",
        sshConfigPath: "~/keys/config",
      });
      await rt.start();
      assert.equal((await rt.run(["echo", "home"])).stdout, "home\n");
    } finally {
      if (previous === undefined) Deno.env.delete("HOME");
      else Deno.env.set("HOME", previous);
    }
  }),
);

Deno.test(
  "ssh: a host the ssh config reaches through ProxyJump is refused with the file and the directive",
  settled(async () => {
    const config = join(tmp, "ssh_config_jump");
    await writeFile(config, `Host behind\n  HostName ${host.host}\n  ProxyJump bastion\n`);
    const error = await startError({ type: "ssh", host: "behind", sshConfigPath: config });
    assert.ok(error instanceof SandboxUnsupportedError, `got ${error}`);
    assert.match(
      (error as Error).message,
      new RegExp(`SSH host "behind" is reached through "ProxyJump bastion" in "${config}"`),
    );
    assert.throws(
      () => createRuntime({ type: "ssh", host: "x", sshConfigPath: join(tmp, "missing") }),
      /Cannot read sshConfigPath ".*missing"/,
    );
  }),
);

Deno.test(
  "ssh: a command's stdin passes through a file only its user can read, emptied after the command and removed with the channel",
  settled(async () => {
    const rt = new SshRuntime(specFor());
    await rt.start();
    try {
      const secret = `secret-${crypto.randomUUID()}`;
      const echoed = await rt.run(["cat"], { stdin: secret });
      assert.equal(echoed.stdout, secret);
      const files = await host.exec([
        "sh",
        "-c",
        'for f in /tmp/.vf-stdin.*; do [ -e "$f" ] && stat -c \'%a %s\' "$f"; done; true',
      ]);
      const listed = files.stdout.trim().split("\n").filter(Boolean);
      assert.ok(listed.length > 0, "the channel keeps one stdin file per supervisor");
      for (const line of listed) assert.equal(line, "600 0", files.stdout);
    } finally {
      await rt.stop();
    }
    // The connection closed with its last sandbox: each supervisor, its stdin at an end,
    // removes its file as it exits (a moment after the close; the runner bounds the wait).
    await sshConnectionsClosed();
    const count = async () =>
      (await host.exec(["sh", "-c", "ls /tmp/.vf-stdin.* 2>/dev/null | wc -l"])).stdout.trim();
    while (await count() !== "0") await new Promise((r) => setTimeout(r, 50));
  }),
);

Deno.test(
  "ssh: an archive extracted through the command channel, as in a session of its own, belongs to the login user",
  settled(async () => {
    const tar = packTar([
      { name: "art", type: "directory", uid: 1234, gid: 2345 },
      {
        name: "art/f",
        type: "file",
        data: new TextEncoder().encode("x\n"),
        mode: 0o640,
        uid: 1234,
        gid: 2345,
      },
    ]);
    for (const execChannel of [true, false]) {
      const rt = new SshRuntime(specFor(host, { execChannel }));
      await rt.start();
      try {
        await rt.archiveIn("restored/here", tar);
        const stat = await rt.run(["stat", "-c", "%u:%g %a", "restored/here/art/f"]);
        // Root logs in on the test host: without -o its tar would restore 1234:2345.
        assert.equal(stat.stdout.trim(), "0:0 640", `execChannel ${execChannel}`);
        assert.equal(new TextDecoder().decode(await rt.read("restored/here/art/f")), "x\n");
      } finally {
        await rt.stop();
      }
    }
  }),
);

Deno.test("ssh: the test hosts are removed", async () => {
  await sshConnectionsClosed();
  await host.close();
  await doomed.close();
  await rm(tmp, { recursive: true, force: true });
  const namespaces = new TextDecoder().decode(
    (await new Deno.Command("ip", { args: ["netns", "list"], stdout: "piped" }).output()).stdout,
  );
  assert.ok(!namespaces.includes(host.name) && !namespaces.includes(doomed.name));
});
