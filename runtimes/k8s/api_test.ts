/**
 * Tests of the Kubernetes API client beside its code: how a kubeconfig (or a pod's service
 * account) becomes a target, and how requests are built and refusals worded. Requests go to a
 * real HTTP server on loopback that records what it receives; no Kubernetes API server can run
 * on these machines, and these tests need none: they check what vf sends and how it reads the
 * answers. The pod lifecycle against the API stand-in is in `mod_test.ts`.
 * @module
 */
import assert from "node:assert/strict";
import { Buffer } from "node:buffer";
import { join } from "node:path";
import { ConfigError } from "../../lib/errors.ts";
import { SandboxApiError, SandboxUnavailableError } from "../errors.ts";
import { KubeApiError, KubeClient, type KubeTarget, loadKubeTarget } from "./api.ts";

/** A temp dir removed on dispose. */
async function tempDir(): Promise<{ path: string } & AsyncDisposable> {
  const path = await Deno.makeTempDir({ prefix: "vf_k8s_api_" });
  return { path, [Symbol.asyncDispose]: () => Deno.remove(path, { recursive: true }) };
}

function kubeconfig(lines: string[]): string {
  return lines.join("\n") + "\n";
}

/** A one-cluster, one-user kubeconfig whose user table is `user` (YAML lines, indented 4). */
function oneContext(server: string, user: string[], extra: { namespace?: string } = {}): string {
  return kubeconfig([
    "apiVersion: v1",
    "kind: Config",
    "current-context: main",
    "clusters:",
    "- name: c1",
    "  cluster:",
    `    server: ${server}`,
    "contexts:",
    "- name: main",
    "  context:",
    "    cluster: c1",
    "    user: u1",
    ...(extra.namespace ? [`    namespace: ${extra.namespace}`] : []),
    "users:",
    "- name: u1",
    "  user:",
    ...user.map((l) => `    ${l}`),
  ]);
}

Deno.test("loadKubeTarget(): a kubeconfig's current context gives the server (trailing slash dropped), namespace, token and a source naming file and context", async () => {
  await using dir = await tempDir();
  const path = join(dir.path, "config");
  await Deno.writeTextFile(
    path,
    oneContext("https://10.1.2.3:6443/", ["token: abc"], { namespace: "evals" }),
  );
  const target = await loadKubeTarget({ kubeconfig: path });
  assert.equal(target.server, "https://10.1.2.3:6443");
  assert.equal(target.namespace, "evals");
  assert.equal(await target.token?.(), "abc");
  assert.equal(target.source, `${path}, context "main"`);
  assert.equal(target.tls.rejectUnauthorized, true);
  assert.equal(target.tls.ca, undefined);
});

Deno.test("loadKubeTarget(): without a namespace the context's is 'default'; KUBECONFIG's first path is used when no file is given", async () => {
  await using dir = await tempDir();
  const path = join(dir.path, "from-env");
  await Deno.writeTextFile(path, oneContext("http://127.0.0.1:1", ["token: t"]));
  const target = await loadKubeTarget({
    env: { KUBECONFIG: `${path}:${join(dir.path, "second")}`, HOME: dir.path },
  });
  assert.equal(target.namespace, "default");
  assert.equal(target.source, `${path}, context "main"`);
});

Deno.test("loadKubeTarget(): certificate data is base64-decoded, file paths are read relative to the kubeconfig, insecure-skip-tls-verify turns verification off", async () => {
  await using dir = await tempDir();
  await Deno.writeTextFile(join(dir.path, "ca.pem"), "CA PEM\n");
  await Deno.writeTextFile(join(dir.path, "client.key"), "KEY PEM\n");
  const path = join(dir.path, "config");
  await Deno.writeTextFile(
    path,
    kubeconfig([
      "current-context: main",
      "clusters:",
      "- name: c1",
      "  cluster:",
      "    server: https://k8s.example:443",
      "    certificate-authority: ca.pem",
      "    insecure-skip-tls-verify: true",
      "contexts:",
      "- name: main",
      "  context: { cluster: c1, user: u1 }",
      "users:",
      "- name: u1",
      "  user:",
      `    client-certificate-data: ${Buffer.from("CERT PEM\n").toString("base64")}`,
      "    client-key: client.key",
    ]),
  );
  const target = await loadKubeTarget({ kubeconfig: path });
  assert.equal(target.tls.ca, "CA PEM\n");
  assert.equal(target.tls.cert, "CERT PEM\n");
  assert.equal(target.tls.key, "KEY PEM\n");
  assert.equal(target.tls.rejectUnauthorized, false);
  assert.equal(target.token, undefined, "a client certificate user sends no bearer token");
});

Deno.test("loadKubeTarget(): a tokenFile is read again on every call, so a rotated token is picked up", async () => {
  await using dir = await tempDir();
  await Deno.writeTextFile(join(dir.path, "token"), "first\n");
  const path = join(dir.path, "config");
  await Deno.writeTextFile(path, oneContext("http://127.0.0.1:1", ["tokenFile: token"]));
  const target = await loadKubeTarget({ kubeconfig: path });
  assert.equal(await target.token?.(), "first");
  await Deno.writeTextFile(join(dir.path, "token"), "second\n");
  assert.equal(await target.token?.(), "second");
});

Deno.test("loadKubeTarget(): an exec credential plugin's token is cached until a minute before it expires; its failures name the kubeconfig and user", async () => {
  await using dir = await tempDir();
  const calls = join(dir.path, "calls");
  const plugin = join(dir.path, "plugin.sh");
  // Prints an ExecCredential whose expiry comes from $EXPIRES, counting its runs.
  await Deno.writeTextFile(
    plugin,
    `#!/bin/sh\necho x >> "${calls}"\nprintf '{"kind":"ExecCredential","status":{"token":"tok-%s","expirationTimestamp":"%s"}}' "$1" "$EXPIRES"\n`,
  );
  await Deno.chmod(plugin, 0o755);
  const runs = async () => (await Deno.readTextFile(calls).catch(() => "")).split("\n").length - 1;
  const config = (expires: string) =>
    oneContext("http://127.0.0.1:1", [
      "exec:",
      "  apiVersion: client.authentication.k8s.io/v1",
      `  command: ${plugin}`,
      "  args: [a1]",
      "  env:",
      "  - name: EXPIRES",
      `    value: "${expires}"`,
    ]);
  const path = join(dir.path, "config");

  await Deno.writeTextFile(path, config(new Date(Date.now() + 3600_000).toISOString()));
  const lasting = await loadKubeTarget({ kubeconfig: path });
  assert.equal(await lasting.token?.(), "tok-a1", "the plugin gets its args and env");
  assert.equal(await lasting.token?.(), "tok-a1");
  assert.equal(await runs(), 1, "a token valid for an hour is reused");

  await Deno.writeTextFile(path, config(new Date(Date.now() + 30_000).toISOString()));
  const expiring = await loadKubeTarget({ kubeconfig: path });
  await expiring.token?.();
  await expiring.token?.();
  assert.equal(await runs(), 3, "a token expiring within a minute is fetched again");

  await Deno.writeTextFile(plugin, "#!/bin/sh\necho nope\n");
  const garbled = await loadKubeTarget({ kubeconfig: path });
  await assert.rejects(
    () => garbled.token!(),
    (e: Error) => {
      assert.ok(e instanceof ConfigError);
      assert.equal(
        e.message,
        `${path}, user "u1": exec plugin "${plugin}" printed no ExecCredential JSON`,
      );
      return true;
    },
  );
  await Deno.writeTextFile(plugin, "#!/bin/sh\necho '{\"status\":{}}'\n");
  await assert.rejects(
    () => garbled.token!(),
    new RegExp(`exec plugin ".*plugin\\.sh" gave no status\\.token$`),
  );
  await Deno.writeTextFile(plugin, "#!/bin/sh\necho denied >&2\nexit 3\n");
  await assert.rejects(() => garbled.token!(), /exec plugin ".*plugin\.sh" failed: denied/);
});

Deno.test("loadKubeTarget(): bad kubeconfigs are ConfigErrors naming the file and what is missing", async () => {
  await using dir = await tempDir();
  const path = join(dir.path, "config");
  const cases: Array<[string, string | RegExp]> = [
    ["clusters: [", new RegExp(`^${path}: not valid YAML: `)],
    [
      "clusters: []\n",
      `${path}: no current-context; name one with context = "<name>" in the runtime table`,
    ],
    [
      kubeconfig([
        "current-context: main",
        "contexts:",
        "- name: main",
        "  context: { cluster: gone, user: u1 }",
      ]),
      `${path}: context "main" names cluster "gone", which has no server`,
    ],
    [
      kubeconfig([
        "current-context: main",
        "clusters:",
        "- name: c1",
        "  cluster: { server: 'https://x' }",
        "contexts:",
        "- name: main",
        "  context: { cluster: c1, user: ghost }",
      ]),
      `${path}: context "main" names user "ghost", not defined`,
    ],
    [
      oneContext("https://x", ["auth-provider: { name: gcp }"]),
      `${path}: user "u1" uses an auth-provider, which vf does not speak; use a token, a client certificate or an exec credential plugin`,
    ],
    [
      oneContext("https://x", ["client-key: missing.key"]),
      new RegExp(`^Cannot read the client key of ${path} ".*missing\\.key": `),
    ],
  ];
  for (const [text, expected] of cases) {
    await Deno.writeTextFile(path, text);
    const error = await loadKubeTarget({ kubeconfig: path }).then(() => null, (e) => e);
    assert.ok(error instanceof ConfigError, `${text}: got ${error}`);
    if (typeof expected === "string") assert.equal(error.message, expected);
    else assert.match(error.message, expected);
  }
  await Deno.writeTextFile(path, oneContext("https://x", ["token: t"]));
  await assert.rejects(
    loadKubeTarget({ kubeconfig: path, context: "other" }),
    (e: Error) =>
      e instanceof ConfigError &&
      e.message === `${path}: no context named "other" (contexts: "main")`,
  );
});

Deno.test("loadKubeTarget(): in-cluster brackets an IPv6 host, defaults the namespace when the file is missing, and needs KUBERNETES_SERVICE_HOST and a token", async () => {
  await using dir = await tempDir();
  const sa = join(dir.path, "sa");
  await Deno.mkdir(sa);
  await Deno.writeTextFile(join(sa, "ca.crt"), "SA CA\n");
  await Deno.writeTextFile(join(sa, "token"), " sa-token \n");
  const target = await loadKubeTarget({
    inCluster: true,
    serviceAccountDir: sa,
    env: { KUBERNETES_SERVICE_HOST: "fd00::1" },
  });
  assert.equal(target.server, "https://[fd00::1]:443");
  assert.equal(target.namespace, "default");
  assert.equal(target.tls.ca, "SA CA\n");
  assert.equal(await target.token?.(), "sa-token");

  await assert.rejects(
    loadKubeTarget({ inCluster: true, serviceAccountDir: sa, env: {} }),
    /^ConfigError: In-cluster Kubernetes access needs KUBERNETES_SERVICE_HOST/,
  );
  await Deno.remove(join(sa, "token"));
  await assert.rejects(
    loadKubeTarget({
      inCluster: true,
      serviceAccountDir: sa,
      env: { KUBERNETES_SERVICE_HOST: "10.0.0.1" },
    }),
    new RegExp(`Cannot read the service account token "${join(sa, "token")}"`),
  );
  // A kubeconfig given explicitly wins over KUBERNETES_SERVICE_HOST, even a missing one.
  await assert.rejects(
    loadKubeTarget({
      kubeconfig: join(dir.path, "absent"),
      env: { KUBERNETES_SERVICE_HOST: "10.0.0.1" },
    }),
    /^ConfigError: No kubeconfig at ".*absent"; give one with kubeconfig = "<path>"/,
  );
});

// ---------------------------------------------------------------------------------------
// Requests, against a recording HTTP server on loopback

interface Seen {
  method: string;
  path: string;
  headers: Record<string, string>;
  body: string;
}

/** A loopback HTTP server answering with `respond`, recording every request. */
function recorder(
  respond: (req: Seen) => Response | Promise<Response>,
): { url: string; seen: Seen[] } & AsyncDisposable {
  const seen: Seen[] = [];
  const server = Deno.serve({ hostname: "127.0.0.1", port: 0, onListen() {} }, async (req) => {
    const url = new URL(req.url);
    const entry: Seen = {
      method: req.method,
      path: url.pathname + url.search,
      headers: Object.fromEntries(req.headers),
      body: await req.text(),
    };
    seen.push(entry);
    return await respond(entry);
  });
  return {
    url: `http://127.0.0.1:${server.addr.port}`,
    seen,
    [Symbol.asyncDispose]: () => server.shutdown(),
  };
}

function target(server: string, token?: string): KubeTarget {
  return {
    server,
    namespace: "default",
    tls: {},
    token: token === undefined ? undefined : () => Promise.resolve(token),
    source: 'test kubeconfig, context "t"',
  };
}

Deno.test("KubeClient.request(): sends JSON with a bearer token, merge-patch for PATCH, and parses the answer; an empty 2xx body is {}", async () => {
  await using server = recorder((req) =>
    req.method === "DELETE"
      ? new Response(null, { status: 200 })
      : Response.json({ echoed: req.method }, { status: 201 })
  );
  const client = new KubeClient(target(server.url, "s3cret"));
  try {
    const created = await client.request("POST", "/api/v1/namespaces/ns/pods", { a: 1 });
    assert.deepEqual(created, { echoed: "POST" });
    await client.request("PATCH", "/api/v1/namespaces/ns/pods/p", { b: 2 });
    assert.deepEqual(await client.request("GET", "/api/v1/namespaces/ns/pods?x=1"), {
      echoed: "GET",
    });
    assert.deepEqual(await client.request("DELETE", "/api/v1/namespaces/ns/pods/p"), {});
  } finally {
    client.close();
  }
  const [post, patch, get] = server.seen;
  assert.equal(post.path, "/api/v1/namespaces/ns/pods");
  assert.equal(post.headers.authorization, "Bearer s3cret");
  assert.equal(post.headers.accept, "application/json");
  assert.equal(post.headers["content-type"], "application/json");
  assert.equal(post.headers["content-length"], String('{"a":1}'.length));
  assert.equal(post.body, '{"a":1}');
  assert.equal(patch.headers["content-type"], "application/merge-patch+json");
  assert.equal(get.path, "/api/v1/namespaces/ns/pods?x=1");
  assert.equal(get.body, "");
  assert.equal(get.headers["content-type"], undefined, "a GET carries no body type");
});

Deno.test("KubeClient.request(): no token means no authorization header; 404 is undefined only with allow404", async () => {
  await using server = recorder(() =>
    Response.json({ kind: "Status", message: 'pods "p" not found', reason: "NotFound" }, {
      status: 404,
    })
  );
  const client = new KubeClient(target(server.url));
  try {
    assert.equal(
      await client.request("GET", "/api/v1/namespaces/ns/pods/p", undefined, { allow404: true }),
      undefined,
    );
    const error = await client.request("GET", "/api/v1/namespaces/ns/pods/p").then(
      () => null,
      (e) => e,
    );
    assert.ok(error instanceof KubeApiError && error instanceof SandboxApiError, `${error}`);
    assert.equal(error.status, 404);
    assert.equal(error.kube?.reason, "NotFound");
    assert.equal(
      error.message,
      `Kubernetes API GET /api/v1/namespaces/ns/pods/p on ${server.url} failed (404): pods "p" not found`,
    );
  } finally {
    client.close();
  }
  assert.equal(server.seen[0].headers.authorization, undefined);
});

Deno.test("KubeClient.request(): 401 and 403 say what to check and grant, naming the kubeconfig; a body that is not a Status is quoted", async () => {
  let status = 401;
  await using server = recorder(() =>
    status === 500
      ? new Response("upstream exploded", { status })
      : Response.json({ message: status === 401 ? "Unauthorized" : "pods is forbidden" }, {
        status,
      })
  );
  const client = new KubeClient(target(server.url, "t"));
  try {
    const path = "/api/v1/namespaces/team/pods?labelSelector=a%3Db";
    const refusal = async () => (await client.request("GET", path).catch((e) => e)) as KubeApiError;
    const e401 = await refusal();
    assert.equal(
      e401.message,
      `The Kubernetes API refused our credentials (401) for GET /api/v1/namespaces/team/pods on ${server.url}: Unauthorized. Check the user of test kubeconfig, context "t" (an expired token or certificate?)`,
    );
    status = 403;
    const e403 = await refusal();
    assert.match(
      e403.message,
      /^The Kubernetes API forbids GET \/api\/v1\/namespaces\/team\/pods on .* \(403\): pods is forbidden\. Grant the user of test kubeconfig, context "t" a Role in that namespace allowing create\/get\/list\/delete on pods, create on pods\/exec and create\/delete on networkpolicies/,
    );
    status = 500;
    const e500 = await refusal();
    assert.equal(e500.kube, undefined);
    assert.match(e500.message, /failed \(500\): upstream exploded$/);
  } finally {
    client.close();
  }
});

Deno.test("KubeClient.request(): an API server that cannot be reached is SandboxUnavailableError naming it; an aborted request rejects with the signal's reason", async () => {
  // A port that was just free: nothing listens there.
  const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const port = (listener.addr as Deno.NetAddr).port;
  listener.close();
  const client = new KubeClient(target(`http://127.0.0.1:${port}`));
  try {
    const error = await client.request("GET", "/api").catch((e) => e);
    assert.ok(error instanceof SandboxUnavailableError, `${error}`);
    assert.match(
      error.message,
      new RegExp(
        `^Cannot reach the Kubernetes API at http://127\\.0\\.0\\.1:${port} \\(test kubeconfig, context "t"\\): `,
      ),
    );
  } finally {
    client.close();
  }
  // A server that holds the request until the test is done (shutdown waits for it).
  let release = () => {};
  const held = new Promise<Response>((r) => (release = () => r(new Response("late"))));
  await using slow = recorder(() => held);
  const hanging = new KubeClient(target(slow.url));
  try {
    const reason = new Error("interrupted");
    const controller = new AbortController();
    const pending = hanging.request("GET", "/api", undefined, { signal: controller.signal });
    setTimeout(() => controller.abort(reason), 50);
    await assert.rejects(pending, (e) => e === reason);
  } finally {
    release();
    hanging.close();
  }
});

Deno.test("KubeClient.exec(): the command goes as repeated command= parameters on a WebSocket upgrade offering v5 then v4; a refused upgrade is a KubeApiError with the server's Status", async () => {
  await using server = recorder(() =>
    Response.json({
      kind: "Status",
      message: 'pods "p" is forbidden: cannot create pods/exec',
      reason: "Forbidden",
    }, { status: 403 })
  );
  const client = new KubeClient(target(server.url, "tok"));
  try {
    const error = await client.exec("ns", "p", "sandbox", ["sh", "-c", "echo a&b"], {
      stdin: true,
      onMessage() {},
    }).catch((e) => e);
    assert.ok(error instanceof KubeApiError, `${error}`);
    assert.equal(error.status, 403);
    assert.equal(error.kube?.reason, "Forbidden");
    assert.match(error.message, /forbids exec \/api\/v1\/namespaces\/ns\/pods\/p\/exec on/);
  } finally {
    client.close();
  }
  const [seen] = server.seen;
  const url = new URL(seen.path, server.url);
  assert.equal(url.pathname, "/api/v1/namespaces/ns/pods/p/exec");
  assert.deepEqual(url.searchParams.getAll("command"), ["sh", "-c", "echo a&b"]);
  assert.equal(url.searchParams.get("container"), "sandbox");
  assert.equal(url.searchParams.get("stdin"), "true");
  assert.equal(url.searchParams.get("stdout"), "true");
  assert.equal(url.searchParams.get("stderr"), "true");
  assert.equal(url.searchParams.get("tty"), "false");
  assert.equal(seen.headers.upgrade?.toLowerCase(), "websocket");
  assert.equal(seen.headers["sec-websocket-protocol"], "v5.channel.k8s.io, v4.channel.k8s.io");
  assert.equal(seen.headers.authorization, "Bearer tok");
});
