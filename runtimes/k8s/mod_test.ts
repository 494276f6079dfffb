/**
 * Tests of the kubernetes runtime beside its code: label values, what a pod and its
 * NetworkPolicy ask for, the lifecycle (not started, stopped, stopped while starting, a pod
 * deleted from under it), the ledger's records, and cleanup by age.
 *
 * No Kubernetes API server can run on these machines (none is packaged for Debian or npm), so
 * the API server here is the loopback stand-in of `tests/_k8s_standin.ts`: a test double for
 * the API server only. Every Pod and NetworkPolicy body it receives is checked against the
 * published Kubernetes schema, each pod is a real container on the local Docker engine, and
 * exec is the real WebSocket channel protocol. The shared runtime cases are in
 * `tests/runtime_conformance_test.ts`, auth and `vf run` on kubernetes in `tests/k8s_test.ts`.
 * @module
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { Ledger } from "../ledger.ts";
import { SandboxStateError, SandboxUnavailableError, SandboxUnsupportedError } from "../errors.ts";
import { type KubeStandin, startKubeStandin } from "../../tests/_k8s_standin.ts";
import {
  cleanupPods,
  closeKubeClients,
  CONTAINER,
  KubeClient,
  KubernetesRuntime,
  type KubernetesRuntimeSpec,
  labelValue,
  loadKubeTarget,
} from "./mod.ts";

const TOKEN = "k8s-mod-test";

/** A plain-HTTP stand-in API server with a kubeconfig for it (namespace `sandbox-ns`). */
async function standin(): Promise<
  {
    api: KubeStandin;
    dir: string;
    kubeconfig: string;
    spec: (extra?: Partial<KubernetesRuntimeSpec>) => KubernetesRuntimeSpec;
  } & AsyncDisposable
> {
  const dir = await Deno.makeTempDir({ prefix: "vf_k8s_mod_" });
  const api = await startKubeStandin({ token: TOKEN });
  const kubeconfig = join(dir, "kubeconfig.yaml");
  api.kubeconfig(kubeconfig, { namespace: "sandbox-ns" });
  return {
    api,
    dir,
    kubeconfig,
    spec: (extra = {}) => ({ type: "kubernetes", image: "busybox:latest", kubeconfig, ...extra }),
    async [Symbol.asyncDispose]() {
      await closeKubeClients();
      await api.close();
      await Deno.remove(dir, { recursive: true });
    },
  };
}

function posted(api: KubeStandin, resource: "pods" | "networkpolicies") {
  return api.requests.filter((r) => r.method === "POST" && r.path.endsWith(`/${resource}`));
}

Deno.test("labelValue(): at most 63 characters of [A-Za-z0-9._-], alphanumeric at both ends", () => {
  assert.equal(labelValue("task 7/part b"), "task-7-part-b");
  assert.equal(labelValue("--x--"), "x");
  assert.equal(labelValue("émoji ✓ ok"), "moji-ok");
  assert.equal(labelValue("a".repeat(70)), "a".repeat(63));
  assert.equal(labelValue(`${"b".repeat(62)}.c`), "b".repeat(62), "the cut end is trimmed too");
  assert.equal(labelValue("..."), "");
});

Deno.test("KubernetesRuntime: the constructor refuses a spec without an image or with a bad env name; before start every call is a SandboxStateError and stop() is a no-op", async () => {
  assert.throws(
    () => new KubernetesRuntime({ type: "kubernetes", image: "" }, { ledger: null }),
    /^TypeError: A kubernetes runtime needs an image$/,
  );
  assert.throws(
    () =>
      new KubernetesRuntime({ type: "kubernetes", image: "busybox", env: { "BAD-NAME": "1" } }, {
        ledger: null,
      }),
    /Invalid environment variable name "BAD-NAME"/,
  );
  const rt = new KubernetesRuntime({ type: "kubernetes", image: "busybox" }, { ledger: null });
  assert.equal(rt.id, "");
  assert.equal(rt.namespace, "");
  await assert.rejects(
    rt.run(["true"]),
    (e) =>
      e instanceof SandboxStateError &&
      e.message === "The kubernetes runtime is not started; call start() first",
  );
  await assert.rejects(rt.read("/etc/hostname"), SandboxStateError);
  await rt.stop();
  await rt.stop();
  await assert.rejects(rt.run(["true"]), /is stopped/);
});

Deno.test("KubernetesRuntime: the pod sleeps in container 'sandbox', never restarts, is deleted with no grace period; the spec's namespace, workdir, pull policy and service account reach it", async () => {
  await using c = await standin();
  let name = "";
  {
    await using rt = new KubernetesRuntime(
      c.spec({
        namespace: "other-ns",
        workdir: "/srv/work",
        imagePullPolicy: "Never",
        serviceAccountName: "runner",
      }),
      { ledger: null },
    );
    await rt.start();
    name = rt.id;
    assert.match(name, /^vf-[0-9a-f]{12}$/);
    assert.equal(rt.namespace, "other-ns", "the spec's namespace beats the context's");
    assert.equal(rt.workdir, "/srv/work");
    assert.equal((await rt.run(["pwd"])).stdout, "/srv/work\n", "the workdir exists at start");
    assert.equal(rt.capabilities.users, false, "busybox as root has no runuser nor sudo");
    await assert.rejects(rt.run(["id"], { user: "nobody" }), SandboxUnsupportedError);
  }
  const [pod] = posted(c.api, "pods");
  assert.equal(pod.validated, "ok");
  assert.match(pod.path, /^\/api\/v1\/namespaces\/other-ns\/pods$/);
  const body = pod.body as {
    spec: Record<string, unknown> & { containers: Array<Record<string, unknown>> };
  };
  assert.equal(body.spec.restartPolicy, "Never");
  assert.equal(body.spec.terminationGracePeriodSeconds, 0);
  assert.equal(body.spec.automountServiceAccountToken, false);
  assert.equal(body.spec.enableServiceLinks, false);
  assert.equal(body.spec.serviceAccountName, "runner");
  const [container] = body.spec.containers;
  assert.equal(container.name, CONTAINER);
  assert.deepEqual(container.command, ["sleep", "infinity"]);
  assert.equal(container.workingDir, "/srv/work");
  assert.equal(container.imagePullPolicy, "Never");
  assert.equal(container.resources, undefined, "no cpu or memory asked: no resources");
  assert.ok(
    c.api.requests.some((r) =>
      r.method === "DELETE" &&
      r.path === `/api/v1/namespaces/other-ns/pods/${name}?gracePeriodSeconds=0`
    ),
  );
  assert.deepEqual(c.api.pods(), []);
});

Deno.test("KubernetesRuntime: an image with runuser (root) can run commands as another user", async () => {
  await using c = await standin();
  await using rt = new KubernetesRuntime(c.spec({ image: "python:3.11-slim" }), { ledger: null });
  await rt.start();
  assert.equal(rt.capabilities.users, true);
  const r = await rt.run(["id", "-un"], { user: "nobody" });
  assert.deepEqual([r.exit_code, r.stdout], [0, "nobody\n"]);
});

Deno.test("KubernetesRuntime: the ledger records the pod as requested (with how to reach it again), created, then stopped", async () => {
  await using c = await standin();
  const ledger = new Ledger(join(c.dir, "ledger.jsonl"));
  let name = "";
  {
    await using rt = new KubernetesRuntime(c.spec(), { runId: "ledger-run", task: "t", ledger });
    await rt.start();
    name = rt.id;
    assert.deepEqual((await ledger.live({ runId: "ledger-run" })).map((s) => s.id), [name]);
  }
  const entries = await ledger.entries();
  assert.deepEqual(entries.map((e) => e.event), ["requested", "created", "stopped"]);
  const key = `${c.api.url}/sandbox-ns/${name}`;
  assert.ok(entries.every((e) => e.type === "kubernetes" && e.key === key && e.id === name));
  assert.deepEqual(entries[0].host, {
    server: c.api.url,
    namespace: "sandbox-ns",
    kubeconfig: c.kubeconfig,
    policy: true,
  });
  assert.equal(entries[0].labels?.["vf.run_id"], "ledger-run");
  assert.equal(entries[0].labels?.["vf.pod"], name);
  assert.deepEqual(await ledger.live({ runId: "ledger-run" }), []);
});

Deno.test("KubernetesRuntime: a pod deleted from under the runtime makes the next command a SandboxUnavailableError; stop() still succeeds", async () => {
  await using c = await standin();
  const rt = new KubernetesRuntime(c.spec({ network: true }), { ledger: null });
  await rt.start();
  const client = new KubeClient(await loadKubeTarget({ kubeconfig: c.kubeconfig }));
  try {
    await client.request("DELETE", `/api/v1/namespaces/sandbox-ns/pods/${rt.id}`);
  } finally {
    client.close();
  }
  const error = await rt.run(["echo", "hi"]).catch((e) => e);
  assert.ok(error instanceof SandboxUnavailableError, `${error}`);
  assert.equal(
    error.message,
    `pod "sandbox-ns/${rt.id}" is not running; it was deleted, evicted or ran out of memory`,
  );
  await rt.stop();
  assert.deepEqual(c.api.pods(), []);
});

Deno.test("KubernetesRuntime: stop() while start() waits for the pod ends the start with a SandboxStateError and leaves neither pod nor policy", async () => {
  await using c = await standin();
  const rt = new KubernetesRuntime(c.spec(), { ledger: null });
  const starting = rt.start();
  // Stop as soon as the pod has been asked for.
  for (let i = 0; i < 200 && posted(c.api, "pods").length === 0; i++) {
    await new Promise((r) => setTimeout(r, 10));
  }
  const stopped = rt.stop();
  const error = await starting.then(() => null, (e) => e);
  assert.ok(error instanceof SandboxStateError, `${error}`);
  await stopped;
  assert.deepEqual(c.api.pods(), []);
  const client = new KubeClient(await loadKubeTarget({ kubeconfig: c.kubeconfig }));
  try {
    const policies = await client.request<{ items: unknown[] }>(
      "GET",
      "/apis/networking.k8s.io/v1/namespaces/sandbox-ns/networkpolicies",
    );
    assert.deepEqual(policies?.items, []);
  } finally {
    client.close();
  }
});

Deno.test("cleanupPods(): olderThanMs keeps pods younger than that; without it every managed pod of the namespace goes, with its policy", async () => {
  await using c = await standin();
  const rt = new KubernetesRuntime(c.spec(), { runId: "age-run", ledger: null });
  await rt.start();
  try {
    assert.deepEqual(
      await cleanupPods({ kubeconfig: c.kubeconfig, olderThanMs: 3600_000 }),
      [],
      "a pod started a moment ago is younger than an hour",
    );
    assert.deepEqual(c.api.pods(), [`sandbox-ns/${rt.id}`]);
    assert.deepEqual(await cleanupPods({ kubeconfig: c.kubeconfig, namespace: "elsewhere" }), []);
    assert.deepEqual(await cleanupPods({ kubeconfig: c.kubeconfig }), [rt.id]);
    assert.deepEqual(c.api.pods(), []);
    assert.ok(
      c.api.requests.some((r) =>
        r.method === "DELETE" && r.path.endsWith(`/networkpolicies/${rt.id}`)
      ),
      "the pod's NetworkPolicy went with it",
    );
  } finally {
    await rt.stop();
  }
});
