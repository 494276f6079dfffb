/**
 * Real sshd test hosts on this machine: each host is an OpenSSH server in its own network
 * namespace (reached through a veth pair with a private /30), with its own copy-on-write
 * root file system (an overlay of `/` with a private `/tmp` and `/run`), so a test that
 * writes `/workspace/x` on the host does not touch this machine's `/workspace`.
 *
 * Needs root, `ip` (iproute2), `unshare`/`nsenter` (util-linux), `/usr/sbin/sshd` and
 * `ssh-keygen` (openssh-server); `tests/setup.sh` installs them. Hosts are created by the
 * tests' setup and removed by {@linkcode SshdHost.close}; hosts left by a test process that
 * died are removed the next time a host is started.
 *
 * Addresses: host N gets 10.213.X.(4k+1) on this side and 10.213.X.(4k+2) inside its
 * namespace, X and k chosen at random and reserved with a lock directory, so parallel test
 * files never share a subnet.
 * @module
 */

import { existsSync, readdirSync, readFileSync, rmSync } from "node:fs";
import type { SshRuntimeSpec } from "../runtimes/runtime.ts";

/** Where host records live: one directory per host, also its subnet reservation. */
const STATE_ROOT = "/run/vf-test-hosts";
/** The host's state directory as the host itself sees it (bind-mounted). */
const INNER_STATE = "/run/vf-test-host";
const SSHD = "/usr/sbin/sshd";

/** Output of a command run on this machine or on a test host. */
export interface Output {
  code: number;
  stdout: string;
  stderr: string;
}

/** A running sshd test host. */
export interface SshdHost {
  /** The network namespace, `vf-test-<hex>`. */
  readonly name: string;
  /** The address sshd listens on (inside the namespace). */
  readonly host: string;
  readonly port: number;
  readonly user: "root";
  /** A client key whose public half is in root's authorized_keys. */
  readonly privateKeyPath: string;
  /** A known_hosts file holding this host's key. */
  readonly knownHostsPath: string;
  /** The host key as a known_hosts line (`<host> <type> <base64>`). */
  readonly knownHostsLine: string;
  /** `SHA256:...` fingerprint of the host key, as `ssh-keygen -l` prints it. */
  readonly fingerprint: string;
  /** The host's state directory on this machine (keys, sshd_config, sshd.log). */
  readonly dir: string;
  /** Runs `argv` on the host: its mount and network namespaces and its root. */
  exec(argv: string[], options?: { stdin?: string }): Promise<Output>;
  /** Whether `path` exists on the host. */
  exists(path: string): Promise<boolean>;
  /** Established TCP connections to sshd, counted inside the namespace. */
  connectionCount(): Promise<number>;
  /** sshd's log (LogLevel VERBOSE). */
  log(): string;
  /** Lets `user` (made a uid-0 alias of root when missing) log in with `publicKey`. */
  authorize(user: string, publicKey: string): Promise<void>;
  /** Adds an ordinary (non-root, no sudo) user who logs in with `publicKey`. */
  addUser(user: string, publicKey: string): Promise<void>;
  /** Pids of the per-connection sshd processes (not the listener). */
  sessionPids(): Promise<number[]>;
  /** Kills sshd and every session: the host "goes away" (connections are reset). */
  killSshd(): Promise<void>;
  /** SIGKILLs sshd and every session but keeps the host (files, processes outside sshd). */
  stopSshd(): Promise<void>;
  /** Starts sshd again after {@linkcode stopSshd}, with the same keys and address. */
  startSshd(): Promise<void>;
  /** Kills everything in the namespace and removes it, the veth pair and the state. */
  close(): Promise<void>;
  /** {@linkcode close} for `unload` handlers. */
  closeSync(): void;
}

async function sh(argv: string[], options: { stdin?: string; env?: Record<string, string> } = {}) {
  const child = new Deno.Command(argv[0], {
    args: argv.slice(1),
    stdin: options.stdin === undefined ? "null" : "piped",
    stdout: "piped",
    stderr: "piped",
    env: options.env,
  }).spawn();
  if (options.stdin !== undefined) {
    const writer = child.stdin.getWriter();
    await writer.write(new TextEncoder().encode(options.stdin));
    await writer.close();
  }
  const out = await child.output();
  const decoder = new TextDecoder();
  return { code: out.code, stdout: decoder.decode(out.stdout), stderr: decoder.decode(out.stderr) };
}

async function must(
  argv: string[],
  options: { stdin?: string; env?: Record<string, string> } = {},
) {
  const out = await sh(argv, options);
  if (out.code !== 0) {
    throw new Error(
      `Test host setup: "${argv.join(" ")}" exited ${out.code}: ${out.stderr.trim()}`,
    );
  }
  return out;
}

function shSync(argv: string[]): Output {
  try {
    const out = new Deno.Command(argv[0], { args: argv.slice(1), stdout: "piped", stderr: "piped" })
      .outputSync();
    const decoder = new TextDecoder();
    return {
      code: out.code,
      stdout: decoder.decode(out.stdout),
      stderr: decoder.decode(out.stderr),
    };
  } catch (error) {
    return { code: -1, stdout: "", stderr: String(error) };
  }
}

function hex(bytes: number): string {
  return [...crypto.getRandomValues(new Uint8Array(bytes))]
    .map((b) => b.toString(16).padStart(2, "0")).join("");
}

function preflight(): void {
  const missing = [
    "/usr/sbin/ip",
    "/usr/bin/unshare",
    "/usr/bin/nsenter",
    SSHD,
    "/usr/bin/ssh-keygen",
  ]
    .filter((p) => !existsSync(p) && !existsSync(p.replace("/usr/sbin/", "/sbin/")));
  if (missing.length) {
    throw new Error(
      `Cannot start sshd test hosts: missing ${missing.join(", ")}; run tests/setup.sh as root ` +
        `(it installs openssh-server and iproute2)`,
    );
  }
  if (Deno.uid() !== 0) {
    throw new Error("Cannot start sshd test hosts: network namespaces need root");
  }
}

interface Record_ {
  dir: string;
  name: string;
  veth: string;
}

function readRecord(dir: string): Record_ | undefined {
  try {
    const record = JSON.parse(readFileSync(`${dir}/record.json`, "utf8"));
    return { dir, name: record.name, veth: record.veth };
  } catch {
    return undefined;
  }
}

/** Removes a host: its processes, namespace, veth and state directory. */
function teardownSync(record: Record_): void {
  const pids = shSync(["ip", "netns", "pids", record.name]).stdout.split(/\s+/).filter(Boolean);
  for (const pid of pids) shSync(["kill", "-9", pid]);
  for (let i = 0; i < 50 && pids.some((p) => existsSync(`/proc/${p}`)); i++) {
    shSync(["sleep", "0.02"]);
  }
  shSync(["ip", "netns", "del", record.name]);
  shSync(["ip", "link", "del", record.veth]);
  rmSync(record.dir, { recursive: true, force: true });
}

let swept = false;

/** Removes hosts whose owning test process is gone (a run that was killed). */
function sweepStale(): void {
  if (swept) return;
  swept = true;
  if (!existsSync(STATE_ROOT)) return;
  for (const entry of readdirSync(STATE_ROOT)) {
    const dir = `${STATE_ROOT}/${entry}`;
    let owner = 0;
    try {
      owner = Number(readFileSync(`${dir}/owner`, "utf8"));
    } catch {
      // no owner file: being created right now, or broken; judge by age below
    }
    if (owner && existsSync(`/proc/${owner}`)) continue;
    if (!owner) {
      try {
        if (Date.now() - Deno.statSync(dir).mtime!.getTime() < 60_000) continue;
      } catch {
        continue;
      }
    }
    const record = readRecord(dir);
    if (record) teardownSync(record);
    else rmSync(dir, { recursive: true, force: true });
  }
}

/** Reserves a free 10.213.X.(4k)/30 subnet; returns the host's directory and addresses. */
async function reserveSubnet(): Promise<{ dir: string; outer: string; inner: string }> {
  await Deno.mkdir(STATE_ROOT, { recursive: true });
  const inUse = (await sh(["ip", "-4", "-o", "addr", "show"])).stdout;
  for (let attempt = 0; attempt < 200; attempt++) {
    const x = 1 + Math.floor(Math.random() * 250);
    const k = Math.floor(Math.random() * 64);
    const outer = `10.213.${x}.${4 * k + 1}`;
    const inner = `10.213.${x}.${4 * k + 2}`;
    if (inUse.includes(` ${outer}/`) || inUse.includes(` ${inner}/`)) continue;
    const dir = `${STATE_ROOT}/h-${x}-${k}`;
    try {
      await Deno.mkdir(dir); // atomic: the reservation
    } catch (error) {
      if (error instanceof Deno.errors.AlreadyExists) continue;
      throw error;
    }
    await Deno.writeTextFile(`${dir}/owner`, String(Deno.pid));
    return { dir, outer, inner };
  }
  throw new Error("Cannot start sshd test hosts: no free 10.213.x.x/30 subnet");
}

/**
 * Runs inside the host's fresh mount namespace (as `sh -c`, with $B the host directory):
 * builds the overlay root, then starts sshd chrooted into it. sshd daemonizes, and the
 * namespace lives as long as it does.
 */
const LAUNCH = `set -e
mount -t tmpfs -o size=1g,mode=755 vf-test-host "$B/fs"
mkdir "$B/fs/upper" "$B/fs/work" "$B/fs/root"
mount -t overlay vf-test-host -o "lowerdir=/,upperdir=$B/fs/upper,workdir=$B/fs/work" "$B/fs/root"
R="$B/fs/root"
for m in proc sys dev; do mount --rbind "/$m" "$R/$m"; done
mount -t tmpfs -o mode=1777 vf-test-tmp "$R/tmp"
mount -t tmpfs -o mode=755 vf-test-run "$R/run"
mkdir -p "$R/run/sshd" "$R${INNER_STATE}"
mount --bind "$B/state" "$R${INNER_STATE}"
# A locked root ("!" in shadow) cannot log in even with a key when UsePAM is off.
sed -i 's/^root:!/root:*/' "$R/etc/shadow" 2>/dev/null || true
# A fresh host's root has Debian's default dotfiles, not this machine's: bash sources
# ~/.bashrc for every command sshd runs, and a machine's own (pyenv init, say) can cost half
# a second per command, which the timeout tests would measure instead of the runtime.
for f in .bashrc .profile; do
  if [ -f "$R/etc/skel/$f" ]; then cp "$R/etc/skel/$f" "$R/root/$f"; else : >"$R/root/$f"; fi
done
# A keeper holds the host's namespaces and filesystem while sshd is down (stopSshd).
unshare --root="$R" sleep infinity </dev/null >/dev/null 2>&1 &
echo $! >"$B/state/keeper.pid"
exec unshare --root="$R" ${SSHD} -f ${INNER_STATE}/sshd_config -E ${INNER_STATE}/sshd.log`;

function sshdConfig(address: string): string {
  return [
    "Port 22",
    `ListenAddress ${address}`,
    `HostKey ${INNER_STATE}/ssh_host_ed25519_key`,
    `PidFile ${INNER_STATE}/sshd.pid`,
    `AuthorizedKeysFile ${INNER_STATE}/authorized_keys/%u`,
    "PermitRootLogin prohibit-password",
    "PubkeyAuthentication yes",
    "PasswordAuthentication no",
    "KbdInteractiveAuthentication no",
    "StrictModes no",
    "UsePAM no",
    "UseDNS no",
    "Subsystem sftp internal-sftp",
    "LogLevel VERBOSE",
    "MaxStartups 100:30:200",
    "",
  ].join("\n");
}

/** The ssh runtime spec that reaches `host` as root with its key and known_hosts file. */
export function sshSpecFor(host: SshdHost, extra: Partial<SshRuntimeSpec> = {}): SshRuntimeSpec {
  return {
    type: "ssh",
    host: host.host,
    port: host.port,
    user: host.user,
    privateKeyPath: host.privateKeyPath,
    knownHostsPath: host.knownHostsPath,
    ...extra,
  };
}

/** Starts one sshd test host. */
export async function startSshdHost(): Promise<SshdHost> {
  preflight();
  sweepStale();
  const { dir, outer, inner } = await reserveSubnet();
  const id = hex(4);
  const name = `vf-test-${id}`;
  const veth = `vfh${id}`;
  const peer = `vfn${id}`;
  const record: Record_ = { dir, name, veth };
  await Deno.writeTextFile(`${dir}/record.json`, JSON.stringify({ name, veth }));
  const state = `${dir}/state`;
  try {
    await Deno.mkdir(`${state}/authorized_keys`, { recursive: true });
    await Deno.mkdir(`${dir}/fs`);
    await must([
      "ssh-keygen",
      "-q",
      "-t",
      "ed25519",
      "-N",
      "",
      "-C",
      name,
      "-f",
      `${state}/ssh_host_ed25519_key`,
    ]);
    await must([
      "ssh-keygen",
      "-q",
      "-t",
      "ed25519",
      "-N",
      "",
      "-C",
      "vf-test-client",
      "-f",
      `${state}/client_ed25519`,
    ]);
    const clientPub = await Deno.readTextFile(`${state}/client_ed25519.pub`);
    await Deno.writeTextFile(`${state}/authorized_keys/root`, clientPub);
    const hostPub = (await Deno.readTextFile(`${state}/ssh_host_ed25519_key.pub`)).trim();
    const [keyType, keyData] = hostPub.split(/\s+/);
    const knownHostsLine = `${inner} ${keyType} ${keyData}`;
    await Deno.writeTextFile(`${state}/known_hosts`, knownHostsLine + "\n");
    const fingerprint =
      (await must(["ssh-keygen", "-l", "-E", "sha256", "-f", `${state}/ssh_host_ed25519_key.pub`]))
        .stdout.split(/\s+/)[1];
    await Deno.writeTextFile(`${state}/sshd_config`, sshdConfig(inner));

    await must(["ip", "netns", "add", name]);
    await must(["ip", "link", "add", veth, "type", "veth", "peer", "name", peer]);
    await must(["ip", "link", "set", peer, "netns", name]);
    await must(["ip", "addr", "add", `${outer}/30`, "dev", veth]);
    await must(["ip", "link", "set", veth, "up"]);
    await must(["ip", "netns", "exec", name, "ip", "addr", "add", `${inner}/30`, "dev", peer]);
    await must(["ip", "netns", "exec", name, "ip", "link", "set", peer, "up"]);
    await must(["ip", "netns", "exec", name, "ip", "link", "set", "lo", "up"]);

    const launched = await sh(
      [
        "ip",
        "netns",
        "exec",
        name,
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "/bin/sh",
        "-c",
        LAUNCH,
      ],
      { env: { B: dir } },
    );
    if (launched.code !== 0) {
      const log = existsSync(`${state}/sshd.log`) ? readFileSync(`${state}/sshd.log`, "utf8") : "";
      throw new Error(
        `Test host setup: sshd did not start (exit ${launched.code}): ${launched.stderr.trim()} ` +
          log.trim(),
      );
    }
    await waitForPort(inner, 22, `${state}/sshd.log`);
    await waitForFile(`${state}/sshd.pid`);
    const pid = Number(await waitForFile(`${state}/keeper.pid`));
    const listenerPid = () => Number(readFileSync(`${state}/sshd.pid`, "utf8").trim());

    const exec = (argv: string[], options: { stdin?: string } = {}) =>
      sh(["nsenter", "-t", String(pid), "-m", "-n", "-r", "-w", ...argv], options);
    const host: SshdHost = {
      name,
      host: inner,
      port: 22,
      user: "root",
      privateKeyPath: `${state}/client_ed25519`,
      knownHostsPath: `${state}/known_hosts`,
      knownHostsLine,
      fingerprint,
      dir: state,
      exec,
      async exists(path) {
        return (await exec(["test", "-e", path])).code === 0;
      },
      async connectionCount() {
        const out = await must([
          "ip",
          "netns",
          "exec",
          name,
          "ss",
          "-Htn",
          "state",
          "established",
          "( sport = :22 )",
        ]);
        return out.stdout.split("\n").filter((line) => line.trim()).length;
      },
      log() {
        try {
          return readFileSync(`${state}/sshd.log`, "utf8");
        } catch {
          return "";
        }
      },
      async authorize(user, publicKey) {
        if (!/^[a-z_][a-z0-9_-]*$/i.test(user)) throw new TypeError(`Bad user name "${user}"`);
        const script = `grep -q "^$1:" /etc/passwd || ` +
          `echo "$1:x:0:0:vf test alias of root:/root:/bin/sh" >> /etc/passwd`;
        const out = await exec(["/bin/sh", "-c", script, "sh", user]);
        if (out.code !== 0) throw new Error(`Cannot add user "${user}": ${out.stderr}`);
        await Deno.writeTextFile(`${state}/authorized_keys/${user}`, publicKey.trim() + "\n", {
          append: true,
        });
      },
      async addUser(user, publicKey) {
        if (!/^[a-z_][a-z0-9_-]*$/.test(user)) throw new TypeError(`Bad user name "${user}"`);
        // "*" instead of useradd's locked "!": sshd without PAM refuses locked accounts.
        const out = await exec(["useradd", "-m", "-s", "/bin/sh", "-p", "*", user]);
        if (out.code !== 0 && !/already exists/.test(out.stderr)) {
          throw new Error(`Cannot add user "${user}": ${out.stderr}`);
        }
        await Deno.writeTextFile(`${state}/authorized_keys/${user}`, publicKey.trim() + "\n");
      },
      async sessionPids() {
        const listener = listenerPid();
        const pids = (await sh(["ip", "netns", "pids", name])).stdout.split(/\s+/).filter(Boolean)
          .map(Number);
        const out: number[] = [];
        for (const p of pids) {
          if (p === listener) continue;
          let cmdline = "";
          try {
            cmdline = readFileSync(`/proc/${p}/cmdline`, "utf8");
          } catch {
            continue;
          }
          // Per-connection processes: "sshd: root [priv]" (privileged monitor) and children.
          if (cmdline.startsWith("sshd: ")) out.push(p);
        }
        return out;
      },
      async killSshd() {
        const pids = (await sh(["ip", "netns", "pids", name])).stdout.split(/\s+/).filter(Boolean);
        for (const p of pids) await sh(["kill", "-9", p]);
        for (let i = 0; i < 100 && pids.some((p) => existsSync(`/proc/${p}`)); i++) {
          await new Promise((r) => setTimeout(r, 20));
        }
      },
      async stopSshd() {
        const pids = (await sh(["ip", "netns", "pids", name])).stdout.split(/\s+/).filter((p) =>
          p && Number(p) !== pid
        );
        for (const p of pids) await sh(["kill", "-9", p]);
        for (let i = 0; i < 100 && pids.some((p) => existsSync(`/proc/${p}`)); i++) {
          await new Promise((r) => setTimeout(r, 20));
        }
        await Deno.remove(`${state}/sshd.pid`).catch(() => {});
      },
      async startSshd() {
        await must([
          "nsenter",
          "-t",
          String(pid),
          "-m",
          "-n",
          "-r",
          "-w",
          SSHD,
          "-f",
          `${INNER_STATE}/sshd_config`,
          "-E",
          `${INNER_STATE}/sshd.log`,
        ]);
        await waitForPort(inner, 22, `${state}/sshd.log`);
        await waitForFile(`${state}/sshd.pid`);
      },
      async close() {
        await host.killSshd();
        await sh(["ip", "netns", "del", name]);
        await sh(["ip", "link", "del", veth]);
        await Deno.remove(dir, { recursive: true }).catch(() => {});
      },
      closeSync() {
        teardownSync(record);
      },
    };
    return host;
  } catch (error) {
    teardownSync(record);
    throw error;
  }
}

/** Starts `count` sshd test hosts. */
export async function startSshdHosts(count: number): Promise<SshdHost[]> {
  const hosts: SshdHost[] = [];
  try {
    for (let i = 0; i < count; i++) hosts.push(await startSshdHost());
  } catch (error) {
    for (const host of hosts) host.closeSync();
    throw error;
  }
  return hosts;
}

async function waitForPort(host: string, port: number, logPath: string): Promise<void> {
  const deadline = Date.now() + 15_000;
  let last: unknown;
  while (Date.now() < deadline) {
    try {
      const conn = await Deno.connect({ hostname: host, port });
      conn.close();
      return;
    } catch (error) {
      last = error;
      await new Promise((r) => setTimeout(r, 50));
    }
  }
  const log = existsSync(logPath) ? readFileSync(logPath, "utf8") : "";
  throw new Error(`Test host sshd on ${host}:${port} did not answer within 15 s: ${last} ${log}`);
}

async function waitForFile(path: string): Promise<string> {
  for (let i = 0; i < 200; i++) {
    try {
      const text = (await Deno.readTextFile(path)).trim();
      if (text) return text;
    } catch {
      // not yet
    }
    await new Promise((r) => setTimeout(r, 25));
  }
  throw new Error(`Test host setup: "${path}" was not written`);
}
