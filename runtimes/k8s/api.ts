/**
 * Reaching a Kubernetes API server: credentials from a kubeconfig (a context's cluster, user
 * and namespace; tokens, token files, client certificates, exec credential plugins) or from
 * the pod's service account when vf itself runs in the cluster, and a small JSON client over
 * `node:https` with kept-alive connections. Exec goes over the WebSocket channel protocol
 * (`websocket.ts`). No kubectl is involved.
 * @module
 */

import { Buffer } from "node:buffer";
import { execFile } from "node:child_process";
import { readFileSync } from "node:fs";
import * as http from "node:http";
import * as https from "node:https";
import { homedir } from "node:os";
import { dirname, isAbsolute, join } from "node:path";
import process from "node:process";
import { ConfigError } from "../../lib/errors.ts";
import { SandboxApiError, SandboxUnavailableError } from "../errors.ts";
import { connectWebSocket, type TlsOptions, type WebSocketConnection } from "./websocket.ts";

/** Where the API server is and how to authenticate to it. */
export interface KubeTarget {
  /** `https://host:port` (or `http:` for a local proxy). */
  server: string;
  /** The namespace of the context (or service account); default `default`. */
  namespace: string;
  tls: TlsOptions;
  /** A bearer token, read fresh when it comes from a file or a plugin. */
  token?: () => Promise<string | undefined>;
  /** Where the settings came from, for messages: the kubeconfig path and context, or in-cluster. */
  source: string;
}

/** Where a service account's credentials are mounted in a pod. */
export const SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount";

/** Options of {@linkcode loadKubeTarget}. */
export interface KubeTargetOptions {
  /** kubeconfig file; default `$KUBECONFIG` (its first path), then `~/.kube/config`. */
  kubeconfig?: string;
  /** Context to use; default the file's `current-context`. */
  context?: string;
  /** Use the pod's service account (`KUBERNETES_SERVICE_HOST`), ignoring any kubeconfig. */
  inCluster?: boolean;
  /** The service account directory; default {@linkcode SERVICE_ACCOUNT_DIR}. */
  serviceAccountDir?: string;
  /** Environment to read `KUBECONFIG` and `KUBERNETES_SERVICE_*` from; default the process's. */
  env?: Record<string, string | undefined>;
}

function readText(path: string, what: string): string {
  try {
    return readFileSync(path, "utf8");
  } catch (error) {
    throw new ConfigError(`Cannot read ${what} "${path}": ${(error as Error).message}`);
  }
}

/**
 * The API server and credentials to use. In-cluster when asked, or when no kubeconfig exists
 * and `KUBERNETES_SERVICE_HOST` is set (vf running in a pod).
 * @throws {ConfigError} naming the file and field: a missing context, cluster or user, a
 *   credential file that cannot be read, an auth provider vf does not speak
 */
export async function loadKubeTarget(options: KubeTargetOptions = {}): Promise<KubeTarget> {
  const env = options.env ?? process.env;
  const fromEnv = env.KUBECONFIG?.split(":").find(Boolean);
  const path = options.kubeconfig ?? fromEnv ?? join(env.HOME || homedir(), ".kube", "config");
  let exists = true;
  try {
    readFileSync(path);
  } catch {
    exists = false;
  }
  const inCluster = options.inCluster ??
    (!exists && options.kubeconfig === undefined && !fromEnv && !!env.KUBERNETES_SERVICE_HOST);
  if (inCluster) return inClusterTarget(options.serviceAccountDir ?? SERVICE_ACCOUNT_DIR, env);
  if (!exists) {
    throw new ConfigError(
      `No kubeconfig at "${path}"; give one with kubeconfig = "<path>" in the runtime table ` +
        `(or KUBECONFIG), or run vf inside the cluster with a service account`,
    );
  }
  return await kubeconfigTarget(path, options.context);
}

function inClusterTarget(dir: string, env: Record<string, string | undefined>): KubeTarget {
  const host = env.KUBERNETES_SERVICE_HOST;
  const port = env.KUBERNETES_SERVICE_PORT ?? "443";
  if (!host) {
    throw new ConfigError(
      "In-cluster Kubernetes access needs KUBERNETES_SERVICE_HOST (set in every pod); " +
        "outside a cluster, give a kubeconfig",
    );
  }
  const tokenPath = join(dir, "token");
  readText(tokenPath, "the service account token");
  let namespace = "default";
  try {
    namespace = readFileSync(join(dir, "namespace"), "utf8").trim() || "default";
  } catch { /* no namespace file: default */ }
  return {
    server: `https://${host.includes(":") ? `[${host}]` : host}:${port}`,
    namespace,
    tls: { ca: readText(join(dir, "ca.crt"), "the service account CA") },
    // Bound tokens rotate: read the file for each request (it is small and cached by the OS).
    token: () => Promise.resolve(readText(tokenPath, "the service account token").trim()),
    source: `the service account in ${dir}`,
  };
}

type Named<T> = Array<{ name?: string } & T>;
interface Kubeconfig {
  "current-context"?: string;
  contexts?: Named<{ context?: { cluster?: string; user?: string; namespace?: string } }>;
  clusters?: Named<{ cluster?: Record<string, unknown> }>;
  users?: Named<{ user?: Record<string, unknown> }>;
}

async function kubeconfigTarget(
  path: string,
  contextName: string | undefined,
): Promise<KubeTarget> {
  const { parse } = await import("npm:yaml@^2.9.1");
  let doc: Kubeconfig;
  try {
    doc = (parse(readText(path, "kubeconfig")) ?? {}) as Kubeconfig;
  } catch (error) {
    throw new ConfigError(`${path}: not valid YAML: ${(error as Error).message}`);
  }
  const name = contextName ?? doc["current-context"];
  if (!name) {
    throw new ConfigError(
      `${path}: no current-context; name one with context = "<name>" in the runtime table`,
    );
  }
  const context = doc.contexts?.find((c) => c.name === name)?.context;
  if (!context) {
    const known = (doc.contexts ?? []).map((c) => `"${c.name}"`).join(", ") || "none";
    throw new ConfigError(`${path}: no context named "${name}" (contexts: ${known})`);
  }
  const cluster = doc.clusters?.find((c) => c.name === context.cluster)?.cluster;
  if (!cluster || typeof cluster.server !== "string") {
    throw new ConfigError(
      `${path}: context "${name}" names cluster "${context.cluster}", which has no server`,
    );
  }
  const user = (doc.users?.find((u) => u.name === context.user)?.user ?? {}) as Record<
    string,
    unknown
  >;
  if (context.user && !doc.users?.some((u) => u.name === context.user)) {
    throw new ConfigError(`${path}: context "${name}" names user "${context.user}", not defined`);
  }
  const base = dirname(path);
  const file = (v: unknown) => (isAbsolute(String(v)) ? String(v) : join(base, String(v)));
  const bytes = (data: unknown, fileField: unknown, what: string) =>
    typeof data === "string"
      ? Buffer.from(data, "base64").toString("utf8")
      : typeof fileField === "string"
      ? readText(file(fileField), `${what} of ${path}`)
      : undefined;
  const tls: TlsOptions = {
    ca: bytes(cluster["certificate-authority-data"], cluster["certificate-authority"], "the CA"),
    cert: bytes(
      user["client-certificate-data"],
      user["client-certificate"],
      "the client certificate",
    ),
    key: bytes(user["client-key-data"], user["client-key"], "the client key"),
    rejectUnauthorized: cluster["insecure-skip-tls-verify"] !== true,
  };
  let token: KubeTarget["token"];
  if (typeof user.token === "string") {
    const value = user.token;
    token = () => Promise.resolve(value);
  } else if (typeof user.tokenFile === "string") {
    const tokenPath = file(user.tokenFile);
    token = () => Promise.resolve(readText(tokenPath, `the tokenFile of ${path}`).trim());
  } else if (user.exec && typeof user.exec === "object") {
    token = execCredential(user.exec as Record<string, unknown>, `${path}, user "${context.user}"`);
  } else if (user["auth-provider"]) {
    throw new ConfigError(
      `${path}: user "${context.user}" uses an auth-provider, which vf does not speak; ` +
        "use a token, a client certificate or an exec credential plugin",
    );
  }
  return {
    server: cluster.server.replace(/\/+$/, ""),
    namespace: context.namespace ?? "default",
    tls,
    token,
    source: `${path}, context "${name}"`,
  };
}

/** A token from an exec credential plugin, cached until it expires. */
function execCredential(
  spec: Record<string, unknown>,
  where: string,
): () => Promise<string | undefined> {
  let cached: { token: string; until: number } | undefined;
  return async () => {
    if (cached && Date.now() < cached.until) return cached.token;
    const command = String(spec.command ?? "");
    const args = Array.isArray(spec.args) ? spec.args.map(String) : [];
    const extra = Object.fromEntries(
      (Array.isArray(spec.env) ? spec.env : []).map((e: { name: string; value: string }) => [
        e.name,
        e.value,
      ]),
    );
    const out = await new Promise<string>((resolve, reject) => {
      execFile(
        command,
        args,
        { env: { ...process.env, ...extra }, timeout: 60_000 },
        (e, o, er) =>
          e
            ? reject(
              new ConfigError(`${where}: exec plugin "${command}" failed: ${er || e.message}`),
            )
            : resolve(o),
      );
    });
    let status: { token?: string; expirationTimestamp?: string } | undefined;
    try {
      status = JSON.parse(out).status;
    } catch {
      throw new ConfigError(`${where}: exec plugin "${command}" printed no ExecCredential JSON`);
    }
    if (!status?.token) {
      throw new ConfigError(`${where}: exec plugin "${command}" gave no status.token`);
    }
    const expires = status.expirationTimestamp ? Date.parse(status.expirationTimestamp) : NaN;
    cached = {
      token: status.token,
      until: Number.isFinite(expires) ? expires - 60_000 : Date.now() + 5 * 60_000,
    };
    return status.token;
  };
}

/** A Kubernetes `Status` object, as error bodies and exec results carry it. */
export interface KubeStatus {
  status?: string;
  message?: string;
  reason?: string;
  code?: number;
  details?: { causes?: Array<{ reason?: string; message?: string }> };
}

/** An API call the server refused: the HTTP status and the server's `Status`. */
export class KubeApiError extends SandboxApiError {
  constructor(
    status: number,
    message: string,
    readonly kube: KubeStatus | undefined,
    options?: { cause?: unknown },
  ) {
    super(status, message, options);
  }
}

/** JSON calls and exec sessions against one API server. */
export class KubeClient {
  readonly target: KubeTarget;
  #agent: http.Agent;
  #secure: boolean;
  /** The exec subprotocol the server chose last (v5 supports closing stdin). */
  execProtocol = "";

  constructor(target: KubeTarget) {
    this.target = target;
    this.#secure = target.server.startsWith("https:");
    const agentOptions = { keepAlive: true, maxSockets: 64 };
    this.#agent = this.#secure
      ? new https.Agent({
        ...agentOptions,
        ca: target.tls.ca as string | undefined,
        cert: target.tls.cert as string | undefined,
        key: target.tls.key as string | undefined,
        rejectUnauthorized: target.tls.rejectUnauthorized ?? true,
      })
      : new http.Agent(agentOptions);
  }

  async #headers(): Promise<Record<string, string>> {
    const token = await this.target.token?.();
    return token ? { authorization: `Bearer ${token}` } : {};
  }

  /**
   * One JSON request. 404 resolves to `undefined` when `allow404`; other failures throw
   * {@linkcode KubeApiError} (server answers) or `SandboxUnavailableError` (no answer).
   */
  async request<T = Record<string, unknown>>(
    method: string,
    path: string,
    body?: unknown,
    options: { allow404?: boolean; signal?: AbortSignal } = {},
  ): Promise<T | undefined> {
    const url = new URL(this.target.server + path);
    const payload = body === undefined ? undefined : Buffer.from(JSON.stringify(body));
    const headers: Record<string, string> = {
      accept: "application/json",
      ...(await this.#headers()),
    };
    if (payload) {
      headers["content-type"] = method === "PATCH"
        ? "application/merge-patch+json"
        : "application/json";
      headers["content-length"] = String(payload.length);
    }
    const { status, text } = await new Promise<{ status: number; text: string }>(
      (resolve, reject) => {
        const req = (this.#secure ? https : http).request(url, {
          method,
          headers,
          agent: this.#agent,
          signal: options.signal,
        }, (res) => {
          const chunks: Buffer[] = [];
          res.on("data", (c: Buffer) => chunks.push(c));
          res.on(
            "end",
            () => resolve({ status: res.statusCode ?? 0, text: Buffer.concat(chunks).toString() }),
          );
          res.on("error", reject);
        });
        req.on("error", (error) => {
          if (options.signal?.aborted) return reject(options.signal.reason);
          reject(
            new SandboxUnavailableError(
              `Cannot reach the Kubernetes API at ${this.target.server} (${this.target.source}): ` +
                error.message,
              { cause: error },
            ),
          );
        });
        req.end(payload);
      },
    );
    if (status === 404 && options.allow404) return undefined;
    if (status >= 200 && status < 300) return text ? JSON.parse(text) as T : ({} as T);
    let kube: KubeStatus | undefined;
    try {
      kube = JSON.parse(text);
    } catch { /* not a Status */ }
    throw new KubeApiError(status, this.describeRefusal(status, method, path, kube, text), kube);
  }

  /** A refusal in words, with what to do about the common ones. */
  describeRefusal(
    status: number,
    method: string,
    path: string,
    kube: KubeStatus | undefined,
    text: string,
  ): string {
    const said = kube?.message ?? text.slice(0, 300);
    const where = `${method} ${path.split("?")[0]} on ${this.target.server}`;
    if (status === 401) {
      return `The Kubernetes API refused our credentials (401) for ${where}: ${said}. Check ` +
        `the user of ${this.target.source} (an expired token or certificate?)`;
    }
    if (status === 403) {
      return `The Kubernetes API forbids ${where} (403): ${said}. Grant the user of ` +
        `${this.target.source} a Role in that namespace allowing create/get/list/delete on ` +
        `pods, create on pods/exec and create/delete on networkpolicies, or pick a namespace ` +
        `it may use (namespace = "..." in the runtime table)`;
    }
    return `Kubernetes API ${where} failed (${status}): ${said}`;
  }

  /**
   * Opens an exec session on the channel protocol, preferring v5 (which can close stdin).
   * @throws {KubeApiError} when the server refuses the upgrade
   */
  async exec(
    namespace: string,
    pod: string,
    container: string,
    command: string[],
    options: {
      stdin: boolean;
      onMessage: (data: Uint8Array) => void;
      signal?: AbortSignal;
    },
  ): Promise<WebSocketConnection> {
    const query = new URLSearchParams();
    for (const word of command) query.append("command", word);
    query.set("container", container);
    query.set("stdin", String(options.stdin));
    query.set("stdout", "true");
    query.set("stderr", "true");
    query.set("tty", "false");
    const path = `/api/v1/namespaces/${namespace}/pods/${pod}/exec?${query}`;
    const url = new URL(this.target.server + path);
    url.protocol = this.#secure ? "wss:" : "ws:";
    try {
      const ws = await connectWebSocket(url, {
        headers: await this.#headers(),
        protocols: ["v5.channel.k8s.io", "v4.channel.k8s.io"],
        tls: this.target.tls,
        signal: options.signal,
        onMessage: options.onMessage,
      });
      this.execProtocol = ws.protocol;
      return ws;
    } catch (error) {
      const e = error as Error & { status?: number; body?: string };
      if (typeof e.status === "number" && e.status > 0) {
        let kube: KubeStatus | undefined;
        try {
          kube = JSON.parse(e.body ?? "");
        } catch { /* not a Status */ }
        throw new KubeApiError(
          e.status,
          this.describeRefusal(e.status, "exec", path, kube, e.body ?? ""),
          kube,
        );
      }
      if (options.signal?.aborted) throw options.signal.reason;
      throw new SandboxUnavailableError(
        `Cannot open an exec session in pod "${pod}" at ${this.target.server}: ${e.message}`,
        { cause: error },
      );
    }
  }

  /** Closes kept-alive connections. */
  close(): void {
    this.#agent.destroy();
  }
}
