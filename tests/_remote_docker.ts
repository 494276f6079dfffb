/**
 * Real remote endpoints for the local Docker engine, for tests: a TLS-terminating proxy on
 * loopback that requires client certificates (openssl-made CA, server and client certs) and
 * forwards bytes to /var/run/docker.sock, and a real OpenSSH sshd on loopback with a fresh
 * host key and user key.
 * @module
 */
import net from "node:net";
import tls from "node:tls";
import { join } from "node:path";

const DOCKER_SOCKET = "/var/run/docker.sock";

async function sh(cmd: string, args: string[], cwd?: string): Promise<void> {
  const out = await new Deno.Command(cmd, { args, cwd, stdout: "piped", stderr: "piped" }).output();
  if (!out.success) {
    throw new Error(
      `${cmd} ${args.join(" ")} failed (${out.code}): ${new TextDecoder().decode(out.stderr)}`,
    );
  }
}

/**
 * Writes `ca.pem`, `server-cert.pem`, `server-key.pem` and a client `cert.pem`/`key.pem`
 * signed by that CA into `dir` (the layout of `DOCKER_CERT_PATH`).
 */
export async function makeCertificates(dir: string, options: { cn?: string } = {}): Promise<void> {
  const days = ["-days", "2"];
  await sh("openssl", [
    "req",
    "-x509",
    "-newkey",
    "rsa:2048",
    "-nodes",
    "-keyout",
    "ca-key.pem",
    "-out",
    "ca.pem",
    "-subj",
    `/CN=${options.cn ?? "vf test CA"}`,
    ...days,
  ], dir);
  await Deno.writeTextFile(
    join(dir, "server.ext"),
    "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n",
  );
  await Deno.writeTextFile(join(dir, "client.ext"), "extendedKeyUsage=clientAuth\n");
  for (
    const [name, cn, ext] of [["server", "localhost", "server.ext"], ["client", "vf", "client.ext"]]
  ) {
    await sh("openssl", [
      "req",
      "-newkey",
      "rsa:2048",
      "-nodes",
      "-keyout",
      `${name}-key.pem`,
      "-out",
      `${name}.csr`,
      "-subj",
      `/CN=${cn}`,
    ], dir);
    await sh("openssl", [
      "x509",
      "-req",
      "-in",
      `${name}.csr`,
      "-CA",
      "ca.pem",
      "-CAkey",
      "ca-key.pem",
      "-CAcreateserial",
      "-out",
      `${name}-cert.pem`,
      "-extfile",
      ext,
      ...days,
    ], dir);
  }
  await Deno.copyFile(join(dir, "client-cert.pem"), join(dir, "cert.pem"));
  await Deno.copyFile(join(dir, "client-key.pem"), join(dir, "key.pem"));
}

/** A listening proxy; `connections` counts accepted (authenticated) TLS connections. */
export interface TlsProxy extends AsyncDisposable {
  port: number;
  connections: number;
  rejected: number;
  close(): Promise<void>;
}

/**
 * A TLS server on 127.0.0.1 that requires a client certificate signed by `dir/ca.pem` and
 * pipes each connection to the Docker socket: the real engine answers through TLS.
 */
export async function startTlsProxy(dir: string): Promise<TlsProxy> {
  const read = (name: string) => Deno.readTextFile(join(dir, name));
  const sockets = new Set<net.Socket>();
  const proxy = { port: 0, connections: 0, rejected: 0 } as TlsProxy;
  const server = tls.createServer({
    key: await read("server-key.pem"),
    cert: await read("server-cert.pem"),
    ca: await read("ca.pem"),
    requestCert: true,
    rejectUnauthorized: true,
  }, (client) => {
    proxy.connections++;
    const upstream = net.connect(DOCKER_SOCKET);
    sockets.add(client);
    sockets.add(upstream);
    client.pipe(upstream);
    upstream.pipe(client);
    const end = () => {
      client.destroy();
      upstream.destroy();
      sockets.delete(client);
      sockets.delete(upstream);
    };
    client.on("error", end);
    upstream.on("error", end);
    client.on("close", end);
    upstream.on("close", end);
  });
  server.on("tlsClientError", () => proxy.rejected++);
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  proxy.port = (server.address() as net.AddressInfo).port;
  proxy.close = async () => {
    for (const s of sockets) s.destroy();
    await new Promise<void>((resolve) => server.close(() => resolve()));
  };
  proxy[Symbol.asyncDispose] = proxy.close;
  return proxy;
}

/** A running sshd. */
export interface Sshd extends AsyncDisposable {
  port: number;
  /** The user's private key (authorized for root). */
  keyFile: string;
  /** A known_hosts file listing the server's host key as `[127.0.0.1]:port`. */
  knownHosts: string;
  /** The server's public host key line (`type base64`). */
  hostKey: string;
  /** sshd's log so far. */
  log(): Promise<string>;
  close(): Promise<void>;
}

async function freePort(): Promise<number> {
  const server = net.createServer();
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const port = (server.address() as net.AddressInfo).port;
  await new Promise<void>((resolve) => server.close(() => resolve()));
  return port;
}

/**
 * Starts `/usr/sbin/sshd -D` as root on 127.0.0.1 with a fresh host key and a fresh user key
 * authorized for root. `streamLocal: false` sets `AllowStreamLocalForwarding no`.
 */
export async function startSshd(
  dir: string,
  options: { streamLocal?: boolean } = {},
): Promise<Sshd> {
  await Deno.mkdir("/run/sshd", { recursive: true, mode: 0o755 });
  await sh("ssh-keygen", ["-q", "-t", "ed25519", "-N", "", "-f", join(dir, "host_key")]);
  await sh("ssh-keygen", ["-q", "-t", "ed25519", "-N", "", "-f", join(dir, "user_key")]);
  await Deno.copyFile(join(dir, "user_key.pub"), join(dir, "authorized_keys"));
  const hostKey = (await Deno.readTextFile(join(dir, "host_key.pub"))).trim().split(/\s+/)
    .slice(0, 2).join(" ");
  let port = 0;
  let child: Deno.ChildProcess | undefined;
  const logFile = join(dir, "sshd.log");
  for (let attempt = 0; attempt < 5 && !child; attempt++) {
    port = await freePort();
    await Deno.writeTextFile(
      join(dir, "sshd_config"),
      [
        `Port ${port}`,
        "ListenAddress 127.0.0.1",
        `HostKey ${join(dir, "host_key")}`,
        `AuthorizedKeysFile ${join(dir, "authorized_keys")}`,
        `PidFile ${join(dir, "sshd.pid")}`,
        "PermitRootLogin prohibit-password",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "UsePAM no",
        "StrictModes no",
        `AllowStreamLocalForwarding ${options.streamLocal === false ? "no" : "yes"}`,
        "LogLevel VERBOSE",
        "",
      ].join("\n"),
    );
    const proc = new Deno.Command("/usr/sbin/sshd", {
      args: ["-D", "-E", logFile, "-f", join(dir, "sshd_config")],
      stdin: "null",
      stdout: "null",
      stderr: "null",
    }).spawn();
    // Ready once the port accepts connections.
    for (let i = 0; i < 100; i++) {
      const ok = await new Promise<boolean>((resolve) => {
        const s = net.connect(port, "127.0.0.1");
        s.once("connect", () => {
          s.destroy();
          resolve(true);
        });
        s.once("error", () => resolve(false));
      });
      if (ok) {
        child = proc;
        break;
      }
      const status = await Promise.race([
        proc.status,
        new Promise<undefined>((r) => setTimeout(() => r(undefined), 50)),
      ]);
      if (status) break; // exited: port taken, try another
    }
    if (!child) {
      try {
        proc.kill("SIGKILL");
      } catch { /* exited */ }
      await proc.status;
    }
  }
  if (!child) {
    throw new Error(`sshd did not start: ${await Deno.readTextFile(logFile).catch(() => "")}`);
  }
  const knownHosts = join(dir, "known_hosts");
  await Deno.writeTextFile(knownHosts, `[127.0.0.1]:${port} ${hostKey}\n`);
  const running = child;
  const sshd: Sshd = {
    port,
    keyFile: join(dir, "user_key"),
    knownHosts,
    hostKey,
    log: () => Deno.readTextFile(logFile).catch(() => ""),
    close: async () => {
      try {
        running.kill("SIGTERM");
      } catch { /* gone */ }
      await running.status;
    },
    [Symbol.asyncDispose]: () => sshd.close(),
  };
  return sshd;
}
