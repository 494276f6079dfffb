/**
 * A private Docker engine for chaos runs: its own dockerd (and the containerd it manages),
 * socket, data root, exec root and network namespace, with no bridge network and no iptables
 * rules, so it can be killed and restarted without touching the machine's engine or the tests
 * using it. Images
 * are copied in from the machine's engine through the Engine API (no registry here).
 * Needs root and `dockerd` on PATH.
 * @module
 */
import { existsSync } from "node:fs";

const MAIN_SOCKET = "/var/run/docker.sock";

function unixClient(socket: string): Deno.HttpClient {
  return Deno.createHttpClient({ proxy: { transport: "unix", path: socket } });
}

async function sh(argv: string[]): Promise<{ code: number; out: string }> {
  const out = await new Deno.Command(argv[0], {
    args: argv.slice(1),
    stdout: "piped",
    stderr: "piped",
  }).output();
  const text = new TextDecoder().decode(out.stdout) + new TextDecoder().decode(out.stderr);
  return { code: out.code, out: text };
}

function alive(pid: number): boolean {
  return existsSync(`/proc/${pid}`) &&
    !/^State:\s+Z/m.test(Deno.readTextFileSync(`/proc/${pid}/status`));
}

/** A dockerd of our own, killable at will. */
export class PrivateDockerd {
  readonly dir: string;
  readonly socket: string;
  #child: Deno.ChildProcess | undefined;

  private constructor(dir: string) {
    this.dir = dir;
    this.socket = `${dir}/docker.sock`;
  }

  /** `DOCKER_HOST` for vf processes that should use this engine. */
  get dockerHost(): string {
    return `unix://${this.socket}`;
  }

  /** Starts an engine and copies `images` into it from the machine's engine. */
  static async start(images: string[]): Promise<PrivateDockerd> {
    // Short: containerd's socket lives under the exec root, and unix paths stop at 108 bytes.
    const dir = await Deno.makeTempDir({ dir: "/run", prefix: "vfcd-" });
    const engine = new PrivateDockerd(dir);
    try {
      await engine.#launch();
      for (const image of images) await engine.#copyImage(image);
    } catch (error) {
      await engine.close();
      throw error;
    }
    return engine;
  }

  async #launch(): Promise<void> {
    // Its own network namespace: a dockerd without a bridge deletes the host's docker0 at
    // start, which would cut the machine's engine off from its bridge network.
    this.#child = new Deno.Command("unshare", {
      args: [
        "--net",
        "--",
        "dockerd",
        "--host",
        this.dockerHost,
        "--data-root",
        `${this.dir}/data`,
        "--exec-root",
        `${this.dir}/exec`,
        "--pidfile",
        `${this.dir}/docker.pid`,
        "--bridge",
        "none",
        "--iptables=false",
        "--ip6tables=false",
      ],
      stdin: "null",
      stdout: "piped",
      stderr: "piped",
    }).spawn();
    // Keep its output in the log file (dockerd logs to stderr).
    this.#child.stdout.pipeTo(this.#fileSink()).catch(() => {});
    this.#child.stderr.pipeTo(this.#fileSink()).catch(() => {});
    const deadline = Date.now() + 60_000;
    while (Date.now() < deadline) {
      if (await this.#ping()) return;
      if (this.#child && !alive(this.#child.pid)) break;
      await new Promise((r) => setTimeout(r, 200));
    }
    const log = await Deno.readTextFile(`${this.dir}/dockerd.log`).catch(() => "");
    throw new Error(`private dockerd did not answer:\n${log.split("\n").slice(-15).join("\n")}`);
  }

  #fileSink(): WritableStream<Uint8Array> {
    const path = `${this.dir}/dockerd.log`;
    return new WritableStream({
      async write(chunk) {
        await Deno.writeFile(path, chunk, { append: true });
      },
    });
  }

  async #ping(): Promise<boolean> {
    const client = unixClient(this.socket);
    try {
      const res = await fetch("http://docker/_ping", { client, signal: AbortSignal.timeout(2000) });
      await res.body?.cancel();
      return res.ok;
    } catch {
      return false;
    } finally {
      client.close();
    }
  }

  async #copyImage(image: string): Promise<void> {
    const from = unixClient(MAIN_SOCKET);
    const to = unixClient(this.socket);
    try {
      const res = await fetch(`http://docker/images/${encodeURIComponent(image)}/get`, {
        client: from,
      });
      if (!res.ok) throw new Error(`main engine: cannot export ${image}: ${await res.text()}`);
      const load = await fetch("http://docker/images/load?quiet=1", {
        method: "POST",
        client: to,
        headers: { "content-type": "application/x-tar" },
        body: res.body,
      });
      const text = await load.text();
      if (!load.ok) throw new Error(`private engine: cannot load ${image}: ${text}`);
    } finally {
      from.close();
      to.close();
    }
  }

  /** The engine's API, or an error when it does not answer. */
  async get(path: string): Promise<unknown> {
    const client = unixClient(this.socket);
    try {
      const res = await fetch(`http://docker${path}`, { client });
      if (!res.ok) throw new Error(`GET ${path}: ${res.status} ${await res.text()}`);
      return await res.json();
    } finally {
      client.close();
    }
  }

  /** Every container carrying `vf.run_id=runId`, any state. */
  async runContainers(runId: string): Promise<{ Id: string; State: string }[]> {
    const filters = encodeURIComponent(
      JSON.stringify({ label: ["vf.managed=1", `vf.run_id=${runId}`] }),
    );
    return await this.get(`/containers/json?all=1&filters=${filters}`) as {
      Id: string;
      State: string;
    }[];
  }

  /** SIGKILLs dockerd, as a crash would (containerd and the containers stay). */
  async kill(): Promise<void> {
    const child = this.#child;
    if (!child) return;
    this.#child = undefined;
    try {
      child.kill("SIGKILL");
    } catch { /* already gone */ }
    await child.status;
  }

  /**
   * Starts dockerd again on the same state, as a service manager would after a crash: the
   * orphaned containerd it managed is stopped and stale pid files dropped first (a new dockerd
   * otherwise waits on the old containerd's socket). Containers left running are found by the
   * new engine and stopped, as dockerd does without live-restore.
   */
  async restart(): Promise<void> {
    await this.kill();
    const containerd = await sh(["pgrep", "-f", `${this.dir}/exec/containerd/containerd.toml`]);
    for (const pid of containerd.out.split(/\s+/).filter(Boolean)) await sh(["kill", "-9", pid]);
    for (
      let i = 0;
      i < 100 &&
      (await sh(["pgrep", "-f", `${this.dir}/exec/containerd/containerd.toml`])).code === 0;
      i++
    ) {
      await new Promise((r) => setTimeout(r, 50));
    }
    for (const stale of ["docker.pid", "exec/containerd/containerd.pid"]) {
      await Deno.remove(`${this.dir}/${stale}`).catch(() => {});
    }
    await this.#launch();
  }

  /** Stops the engine, everything it ran, and removes its state. */
  async close(): Promise<void> {
    if (this.#child && await this.#ping()) {
      const client = unixClient(this.socket);
      try {
        const all = await this.get("/containers/json?all=1") as { Id: string }[];
        for (const c of all) {
          await fetch(`http://docker/containers/${c.Id}?force=1`, { method: "DELETE", client })
            .then((r) => r.body?.cancel()).catch(() => {});
        }
      } catch {
        /* best effort */
      } finally {
        client.close();
      }
    }
    if (this.#child) {
      try {
        this.#child.kill("SIGTERM");
      } catch { /* gone */ }
      const timer = setTimeout(() => {
        try {
          this.#child?.kill("SIGKILL");
        } catch { /* gone */ }
      }, 15_000);
      await this.#child.status;
      clearTimeout(timer);
      this.#child = undefined;
    }
    // containerd (and any shim) started for this engine: found by its exec root.
    const ps = await sh(["pgrep", "-f", this.dir]);
    for (const pid of ps.out.split(/\s+/).filter(Boolean)) {
      if (Number(pid) !== Deno.pid) await sh(["kill", "-9", pid]);
    }
    const mounts = await Deno.readTextFile("/proc/self/mounts");
    const mine = mounts.split("\n").map((l) => l.split(" ")[1]).filter((m) =>
      m?.startsWith(this.dir)
    ).sort().reverse();
    for (const m of mine) await sh(["umount", "-l", m]);
    await Deno.remove(this.dir, { recursive: true }).catch(() => {});
  }
}
