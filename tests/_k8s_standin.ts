/**
 * A loopback stand-in for a Kubernetes API server, written for the tests: no Kubernetes API
 * server can run on these machines (none is packaged for Debian or npm). It is a test double
 * for the API server only; everything behind it is real:
 *
 * - every Pod and NetworkPolicy body is checked against the published Kubernetes OpenAPI
 *   schema through the `kubernetes-models` package (a failure is a 422 `Invalid`, as the real
 *   server answers), and the request is logged for the tests to inspect;
 * - each pod is backed by a real container on the local Docker engine (the image must be
 *   local: a missing one shows `ErrImagePull`, then `ImagePullBackOff`, as a kubelet reports);
 * - a NetworkPolicy that denies a pod all egress is enforced by giving its container no
 *   network (a real cluster leaves the interface and has its CNI drop the traffic);
 * - exec speaks the WebSocket channel protocol (v5, or v4 only when so configured), relayed
 *   to a Docker exec, ending with the `Status` on channel 3 as the kubelet sends it;
 * - bearer-token auth (401 otherwise) and forbidden namespaces (403, with the server's
 *   wording) can be configured.
 */

import { DockerEngine } from "../runtimes/docker/mod.ts";

/** What the stand-in accepts and how it behaves. */
export interface StandinOptions {
  /** The bearer token it requires. */
  token: string;
  /** TLS certificate and key (PEM); plain HTTP without. */
  tls?: { cert: string; key: string };
  /** Exec subprotocols it speaks, in preference order; default v5 then v4. */
  protocols?: string[];
  /** Namespaces whose writes are refused with 403. */
  forbiddenNamespaces?: string[];
}

interface PodRecord {
  object: Record<string, unknown>;
  container?: string;
  status: Record<string, unknown>;
}

/** A running stand-in. */
export interface KubeStandin extends AsyncDisposable {
  /** `https://127.0.0.1:<port>` (or http). */
  url: string;
  /** Every request: method, path (with query), and the schema check's verdict when a body was checked. */
  requests: Array<
    { method: string; path: string; validated?: string; body?: Record<string, unknown> }
  >;
  /** Pods alive now, by `namespace/name`. */
  pods(): string[];
  /** Docker container ids backing live pods. */
  containers(): string[];
  /** Writes a kubeconfig for this server into `path`. */
  kubeconfig(path: string, options?: { ca?: string; namespace?: string; context?: string }): void;
  close(): Promise<void>;
}

const STANDIN_LABEL = "vf.k8s-standin";

function status(code: number, reason: string, message: string): Response {
  return Response.json({
    kind: "Status",
    apiVersion: "v1",
    metadata: {},
    status: "Failure",
    message,
    reason,
    code,
  }, { status: code });
}

function matches(labels: Record<string, string> | undefined, selector: string | null): boolean {
  if (!selector) return true;
  return selector.split(",").every((term) => {
    const [k, v] = term.split("=");
    return labels?.[k] === v;
  });
}

function memoryBytes(q: unknown): number | undefined {
  if (q === undefined) return undefined;
  const m = /^(\d+)(Ki|Mi|Gi)?$/.exec(String(q));
  if (!m) return undefined;
  const unit = { Ki: 1024, Mi: 1024 ** 2, Gi: 1024 ** 3 }[m[2] as "Ki"] ?? 1;
  return Number(m[1]) * unit;
}

/** Starts a stand-in API server on a free loopback port. */
export async function startKubeStandin(options: StandinOptions): Promise<KubeStandin> {
  const { Pod } = await import("npm:kubernetes-models@5.1.0/v1/Pod");
  const { NetworkPolicy } = await import(
    "npm:kubernetes-models@5.1.0/networking.k8s.io/v1/NetworkPolicy"
  );
  const engine = new DockerEngine();
  const instance = crypto.randomUUID().slice(0, 8);
  const pods = new Map<string, PodRecord>();
  const policies = new Map<string, Record<string, unknown>>();
  const requests: KubeStandin["requests"] = [];
  const protocols = options.protocols ?? ["v5.channel.k8s.io", "v4.channel.k8s.io"];
  const pending = new Set<Promise<unknown>>();
  const track = <T>(p: Promise<T>) => {
    pending.add(p);
    p.finally(() => pending.delete(p)).catch(() => {});
    return p;
  };

  const denied = (ns: string, podLabels: Record<string, string>) =>
    [...policies.entries()].some(([key, np]) => {
      if (!key.startsWith(`${ns}/`)) return false;
      const spec = np.spec as {
        podSelector?: { matchLabels?: Record<string, string> };
        policyTypes?: string[];
        egress?: unknown[];
      };
      const sel = spec.podSelector?.matchLabels ?? {};
      const selects = Object.entries(sel).every(([k, v]) => podLabels[k] === v);
      return selects && (spec.policyTypes ?? []).includes("Egress") && !(spec.egress ?? []).length;
    });

  async function runPod(key: string, record: PodRecord): Promise<void> {
    const meta = record.object.metadata as { name: string; labels?: Record<string, string> };
    const spec = record.object.spec as {
      containers: Array<{
        name: string;
        image: string;
        command?: string[];
        args?: string[];
        workingDir?: string;
        env?: Array<{ name: string; value: string }>;
        resources?: { limits?: { cpu?: string; memory?: string } };
      }>;
    };
    const c = spec.containers[0];
    const waiting = (reason: string, message: string) => {
      record.status = {
        phase: "Pending",
        containerStatuses: [{
          name: c.name,
          ready: false,
          state: { waiting: { reason, message } },
        }],
      };
    };
    if (!(await engine.inspectImage(c.image))) {
      waiting("ErrImagePull", `failed to pull and unpack image "${c.image}": not found`);
      await new Promise((r) => setTimeout(r, 300));
      if (pods.get(key) === record) {
        waiting("ImagePullBackOff", `Back-off pulling image "${c.image}"`);
      }
      return;
    }
    const ns = key.split("/")[0];
    const cpu = c.resources?.limits?.cpu;
    const id = await engine.createContainer({
      Image: c.image,
      ...(c.command && { Entrypoint: c.command, Cmd: c.args ?? [] }),
      WorkingDir: c.workingDir,
      Env: (c.env ?? []).map((e) => `${e.name}=${e.value}`),
      Labels: { [STANDIN_LABEL]: instance, "vf.k8s-pod": key },
      HostConfig: {
        NetworkMode: denied(ns, meta.labels ?? {}) ? "none" : "bridge",
        Init: true,
        ...(cpu && { NanoCpus: Math.round(Number(cpu) * 1e9) }),
        ...(memoryBytes(c.resources?.limits?.memory) && {
          Memory: memoryBytes(c.resources?.limits?.memory),
        }),
      },
    }, { name: `vf-k8s-${instance}-${meta.name}` });
    record.container = id;
    if (pods.get(key) !== record) {
      await engine.removeContainer(id, { force: true });
      return;
    }
    await engine.startContainer(id);
    if (pods.get(key) !== record) return;
    record.status = {
      phase: "Running",
      conditions: [{ type: "Ready", status: "True" }],
      containerStatuses: [{
        name: c.name,
        ready: true,
        state: { running: { startedAt: new Date().toISOString() } },
      }],
    };
  }

  function podView(record: PodRecord): Record<string, unknown> {
    return { ...record.object, status: record.status };
  }

  function exec(req: Request, key: string, url: URL): Response {
    const record = pods.get(key);
    if (!record) return status(404, "NotFound", `pods "${key.split("/")[1]}" not found`);
    if (!record.container || record.status.phase !== "Running") {
      return status(400, "BadRequest", `pod ${key} is not running`);
    }
    if (req.headers.get("upgrade")?.toLowerCase() !== "websocket") {
      return status(400, "BadRequest", "exec needs a WebSocket upgrade");
    }
    const offered = (req.headers.get("sec-websocket-protocol") ?? "").split(",").map((s) =>
      s.trim()
    );
    const protocol = protocols.find((p) => offered.includes(p));
    if (!protocol) return status(400, "BadRequest", "no supported exec subprotocol offered");
    const command = url.searchParams.getAll("command");
    const withStdin = url.searchParams.get("stdin") === "true";
    const { socket, response } = Deno.upgradeWebSocket(req, { protocol });
    socket.binaryType = "arraybuffer";
    const send = (channel: number, data: Uint8Array) => {
      if (socket.readyState !== WebSocket.OPEN) return;
      const out = new Uint8Array(data.length + 1);
      out[0] = channel;
      out.set(data, 1);
      socket.send(out);
    };
    const early: Uint8Array[] = [];
    let stream: { write(d: Uint8Array): void; end(): void; destroy(): void } | undefined;
    let stdinEnded = false;
    socket.onmessage = (event) => {
      const data = new Uint8Array(event.data as ArrayBuffer);
      if (protocol.startsWith("v5") && data[0] === 255 && data[1] === 0) {
        stdinEnded = true;
        stream?.end();
        return;
      }
      if (data[0] !== 0) return;
      if (stream) stream.write(data.subarray(1));
      else early.push(data.slice(1));
    };
    socket.onopen = () =>
      track(
        (async () => {
          send(1, new Uint8Array(0));
          send(2, new Uint8Array(0));
          const execId = await engine.createExec(record.container!, {
            Cmd: command,
            AttachStdin: withStdin,
            AttachStdout: true,
            AttachStderr: true,
            Tty: false,
          });
          const s = await engine.startExec(execId, {
            onStdout: (chunk) => send(1, chunk),
            onStderr: (chunk) => send(2, chunk),
          }, withStdin ? { stdin: "open" } : {});
          stream = s;
          for (const chunk of early) s.write(chunk);
          if (stdinEnded) s.end();
          socket.onclose = () => s.destroy();
          await s.done;
          const info = await engine.inspectExec(execId);
          let code = info.ExitCode;
          for (let i = 0; i < 50 && (info.Running || code === null); i++) {
            await new Promise((r) => setTimeout(r, 10));
            const again = await engine.inspectExec(execId);
            code = again.ExitCode;
            if (!again.Running && code !== null) break;
          }
          const result = code === 0 ? { metadata: {}, status: "Success" } : {
            metadata: {},
            status: "Failure",
            message: `command terminated with non-zero exit code: exit status ${code}`,
            reason: "NonZeroExitCode",
            details: { causes: [{ reason: "ExitCode", message: String(code) }] },
          };
          send(3, new TextEncoder().encode(JSON.stringify(result)));
          socket.close(1000);
        })().catch(() => {
          if (socket.readyState === WebSocket.OPEN) socket.close(1011);
        }),
      );
    return response;
  }

  async function handle(req: Request): Promise<Response> {
    const url = new URL(req.url);
    const entry: KubeStandin["requests"][number] = {
      method: req.method,
      path: url.pathname + url.search,
    };
    requests.push(entry);
    if (req.headers.get("authorization") !== `Bearer ${options.token}`) {
      return status(401, "Unauthorized", "Unauthorized");
    }
    const podPath = /^\/api\/v1\/namespaces\/([^/]+)\/pods(?:\/([^/]+))?(\/exec)?$/.exec(
      url.pathname,
    );
    const npPath =
      /^\/apis\/networking\.k8s\.io\/v1\/namespaces\/([^/]+)\/networkpolicies(?:\/([^/]+))?$/
        .exec(url.pathname);
    const m = podPath ?? npPath;
    if (!m) return status(404, "NotFound", `the server could not find ${url.pathname}`);
    const [, ns, name] = m;
    const resource = podPath ? "pods" : "networkpolicies";
    const group = podPath ? "" : "networking.k8s.io";
    if (req.method !== "GET" && options.forbiddenNamespaces?.includes(ns)) {
      return status(
        403,
        "Forbidden",
        `${resource} is forbidden: User "system:serviceaccount:vf:runner" cannot ` +
          `${req.method === "POST" ? "create" : "delete"} resource "${resource}" in API group ` +
          `"${group}" in the namespace "${ns}"`,
      );
    }
    if (podPath?.[3]) {
      if (options.forbiddenNamespaces?.includes(ns)) {
        return status(403, "Forbidden", `pods "${name}" is forbidden: cannot create pods/exec`);
      }
      return exec(req, `${ns}/${name}`, url);
    }
    const store = podPath ? pods : policies;
    const key = `${ns}/${name}`;
    if (req.method === "POST" && !name) {
      const body = await req.json();
      entry.body = structuredClone(body);
      try {
        if (podPath) new Pod(body).validate();
        else new NetworkPolicy(body).validate();
        entry.validated = "ok";
      } catch (error) {
        entry.validated = (error as Error).message;
        return status(422, "Invalid", `${resource} is invalid: ${(error as Error).message}`);
      }
      const newKey = `${ns}/${body.metadata.name}`;
      if (store.has(newKey)) {
        return status(409, "AlreadyExists", `${resource} "${body.metadata.name}" already exists`);
      }
      body.metadata = {
        ...body.metadata,
        namespace: ns,
        uid: crypto.randomUUID(),
        creationTimestamp: new Date().toISOString().replace(/\.\d+Z$/, "Z"),
      };
      if (podPath) {
        const record: PodRecord = { object: body, status: { phase: "Pending" } };
        pods.set(newKey, record);
        track(
          runPod(newKey, record).catch((error) => {
            record.status = {
              phase: "Failed",
              containerStatuses: [{
                name: "sandbox",
                state: { terminated: { reason: "Error", message: String(error) } },
              }],
            };
          }),
        );
        return Response.json(podView(record), { status: 201 });
      }
      policies.set(newKey, body);
      return Response.json(body, { status: 201 });
    }
    if (req.method === "GET" && !name) {
      const selector = url.searchParams.get("labelSelector");
      const items = [...store.entries()]
        .filter(([k]) => k.startsWith(`${ns}/`))
        .map(([, v]) => (podPath ? podView(v as PodRecord) : v as Record<string, unknown>))
        .filter((o) =>
          matches((o.metadata as { labels?: Record<string, string> }).labels, selector)
        );
      return Response.json({ kind: podPath ? "PodList" : "NetworkPolicyList", items });
    }
    const found = store.get(key);
    if (!found) return status(404, "NotFound", `${resource} "${name}" not found`);
    if (req.method === "GET") {
      return Response.json(podPath ? podView(found as PodRecord) : found);
    }
    if (req.method === "DELETE") {
      store.delete(key);
      if (podPath) {
        const record = found as PodRecord;
        if (record.container) await engine.removeContainer(record.container, { force: true });
        return Response.json(podView(record));
      }
      return Response.json(found);
    }
    return status(405, "MethodNotAllowed", `${req.method} is not supported here`);
  }

  const server = Deno.serve({
    hostname: "127.0.0.1",
    port: 0,
    onListen() {},
    ...(options.tls && { cert: options.tls.cert, key: options.tls.key }),
  }, handle);
  const url = `${options.tls ? "https" : "http"}://127.0.0.1:${server.addr.port}`;
  const close = async () => {
    await server.shutdown();
    await Promise.allSettled([...pending]);
    for (const record of pods.values()) {
      if (record.container) await engine.removeContainer(record.container, { force: true });
    }
    const left = await engine.listContainers({
      all: true,
      labels: [`${STANDIN_LABEL}=${instance}`],
    });
    for (const c of left) await engine.removeContainer(String(c.Id), { force: true });
    pods.clear();
    await engine.close();
  };
  return {
    url,
    requests,
    pods: () => [...pods.keys()],
    containers: () => [...pods.values()].map((p) => p.container).filter((c): c is string => !!c),
    kubeconfig(path, o = {}) {
      const context = o.context ?? "standin";
      const lines = [
        "apiVersion: v1",
        "kind: Config",
        `current-context: ${context}`,
        "clusters:",
        "- name: standin",
        "  cluster:",
        `    server: ${url}`,
        ...(o.ca ? [`    certificate-authority: ${o.ca}`] : []),
        "contexts:",
        `- name: ${context}`,
        "  context:",
        "    cluster: standin",
        "    user: runner",
        ...(o.namespace ? [`    namespace: ${o.namespace}`] : []),
        "users:",
        "- name: runner",
        "  user:",
        `    token: ${options.token}`,
      ];
      Deno.writeTextFileSync(path, lines.join("\n") + "\n");
    },
    close,
    [Symbol.asyncDispose]: close,
  };
}
