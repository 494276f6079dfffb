/**
 * The kubernetes runtime beyond the conformance suite: auth (kubeconfig token, in-cluster
 * service account), what pods ask for, bad input (a missing context, a forbidden namespace,
 * an image that cannot be pulled), cleanup by label selector and from the ledger, and
 * `vf run` with isolated grading in a fresh pod.
 *
 * No Kubernetes API server can run on these machines, so the API server is the loopback
 * stand-in of tests/_k8s_standin.ts (a test double for the API server only: request bodies
 * are checked against the published schema, pods are real Docker containers, exec is the
 * real channel protocol). What only a real cluster shows is in the README's manual check.
 */

import assert from "node:assert/strict";
import { join } from "node:path";
import { ConfigError } from "../lib/errors.ts";
import { cleanupLedger, Ledger } from "../runtimes/ledger.ts";
import {
  cleanupPods,
  closeKubeClients,
  KubeApiError,
  KubeClient,
  KubernetesRuntime,
  loadKubeTarget,
} from "../runtimes/k8s/mod.ts";
import { SandboxImageError } from "../runtimes/errors.ts";
import { WarmPool } from "../runtimes/pool.ts";
import type { KubernetesRuntimeSpec } from "../runtimes/runtime.ts";
import { type KubeStandin, startKubeStandin } from "./_k8s_standin.ts";
import { makeCertificates } from "./_remote_docker.ts";
import { cliCommand, collect, tempDir, transcript } from "./_cli.ts";
import { bashModel, startModelServer } from "./model_server.ts";

const TOKEN = "k8s-test-token";

/** A TLS stand-in with a kubeconfig for it in a temp dir. */
async function cluster(
  options: { forbiddenNamespaces?: string[]; namespace?: string } = {},
): Promise<{
  standin: KubeStandin;
  dir: string;
  kubeconfig: string;
  spec: (extra?: Partial<KubernetesRuntimeSpec>) => KubernetesRuntimeSpec;
  [Symbol.asyncDispose](): Promise<void>;
}> {
  const dir = await Deno.makeTempDir({ prefix: "vf_k8s_" });
  await makeCertificates(dir);
  const standin = await startKubeStandin({
    token: TOKEN,
    tls: {
      cert: await Deno.readTextFile(join(dir, "server-cert.pem")),
      key: await Deno.readTextFile(join(dir, "server-key.pem")),
    },
    forbiddenNamespaces: options.forbiddenNamespaces,
  });
  const kubeconfig = join(dir, "kubeconfig.yaml");
  standin.kubeconfig(kubeconfig, { ca: join(dir, "ca.pem"), namespace: options.namespace });
  return {
    standin,
    dir,
    kubeconfig,
    spec: (extra = {}) => ({ type: "kubernetes", image: "busybox", kubeconfig, ...extra }),
    async [Symbol.asyncDispose]() {
      await closeKubeClients();
      await standin.close();
      await Deno.remove(dir, { recursive: true });
    },
  };
}

Deno.test("kubernetes: the pod asks for what the spec says, with run labels; network on leaves it a network and no policy", async () => {
  await using c = await cluster({ namespace: "evals" });
  {
    await using rt = new KubernetesRuntime(
      c.spec({
        cpu: 0.5,
        memory: "256m",
        nodeSelector: { pool: "sandboxes" },
        tolerations: [{ key: "sandbox", operator: "Exists", effect: "NoSchedule" }],
        runtimeClassName: "gvisor",
        labels: { team: "evals/team a" },
        network: true,
        env: { GREETING: "hi" },
      }),
      { runId: "run-123", task: "task 7", ledger: null },
    );
    await rt.start();
    assert.equal(rt.namespace, "evals");
    const dev = await rt.run(["cat", "/proc/net/dev"]);
    assert.match(dev.stdout, /eth0/, "network = true keeps the pod's interface");
    assert.equal((await rt.run(["sh", "-c", "echo $GREETING"])).stdout, "hi\n");
  }
  const podPost = c.standin.requests.find((r) => r.method === "POST" && r.path.endsWith("/pods"));
  assert.ok(podPost?.body, "the pod was created");
  assert.equal(podPost.validated, "ok");
  const pod = podPost.body as {
    metadata: { labels: Record<string, string>; annotations: Record<string, string> };
    spec: Record<string, unknown> & { containers: Array<Record<string, unknown>> };
  };
  assert.equal(pod.metadata.labels["vf.managed"], "1");
  assert.equal(pod.metadata.labels["vf.run_id"], "run-123");
  assert.equal(pod.metadata.labels["vf.task"], "task-7");
  assert.equal(pod.metadata.labels.team, "evals-team-a");
  assert.equal(pod.metadata.annotations["vf.owner.pid"], String(Deno.pid));
  assert.deepEqual(pod.spec.nodeSelector, { pool: "sandboxes" });
  assert.deepEqual(pod.spec.tolerations, [{
    key: "sandbox",
    operator: "Exists",
    effect: "NoSchedule",
  }]);
  assert.equal(pod.spec.runtimeClassName, "gvisor");
  assert.equal(pod.spec.automountServiceAccountToken, false);
  assert.deepEqual(pod.spec.containers[0].resources, {
    requests: { cpu: "0.5", memory: String(256 * 1024 ** 2) },
    limits: { cpu: "0.5", memory: String(256 * 1024 ** 2) },
  });
  assert.ok(
    !c.standin.requests.some((r) => r.path.includes("networkpolicies") && r.method === "POST"),
    "network = true creates no NetworkPolicy",
  );
  assert.deepEqual(c.standin.pods(), []);
});

Deno.test("kubernetes: network off is a NetworkPolicy denying the pod all traffic, created before it and deleted after", async () => {
  await using c = await cluster();
  let name = "";
  {
    await using rt = new KubernetesRuntime(c.spec(), { ledger: null });
    await rt.start();
    name = rt.id;
    const dev = await rt.run(["cat", "/proc/net/dev"]);
    assert.doesNotMatch(dev.stdout, /eth0/);
  }
  const writes = c.standin.requests.filter((r) => r.method !== "GET").map((r) =>
    `${r.method} ${r.path.split("?")[0].replace(/^.*\/namespaces\/default\//, "")}`
  );
  assert.deepEqual(writes, [
    "POST networkpolicies",
    "POST pods",
    `DELETE pods/${name}`,
    `DELETE networkpolicies/${name}`,
  ]);
  const policy = c.standin.requests[0].body as { spec: Record<string, unknown> };
  assert.deepEqual(policy.spec, {
    podSelector: { matchLabels: { "vf.pod": name } },
    policyTypes: ["Ingress", "Egress"],
    ingress: [],
    egress: [],
  });
});

Deno.test("kubernetes: a wrong token is refused (401) naming the kubeconfig; a missing context names the file and the contexts it has", async () => {
  await using c = await cluster();
  const bad = join(c.dir, "bad-token.yaml");
  await Deno.writeTextFile(
    bad,
    (await Deno.readTextFile(c.kubeconfig)).replace(`token: ${TOKEN}`, "token: wrong"),
  );
  const rt = new KubernetesRuntime(c.spec({ kubeconfig: bad }), { ledger: null });
  const error = await rt.start().then(() => undefined, (e) => e);
  assert.ok(error instanceof KubeApiError, `got ${error}`);
  assert.equal(error.status, 401);
  assert.match(error.message, /refused our credentials \(401\)/);
  assert.ok(error.message.includes(bad), error.message);
  assert.deepEqual(c.standin.pods(), []);

  const missing = new KubernetesRuntime(c.spec({ context: "prod" }), { ledger: null });
  const e2 = await missing.start().then(() => undefined, (e) => e);
  assert.ok(e2 instanceof ConfigError, `got ${e2}`);
  assert.equal(
    e2.message,
    `${c.kubeconfig}: no context named "prod" (contexts: "standin")`,
  );
  await assert.rejects(
    loadKubeTarget({ kubeconfig: join(c.dir, "nope.yaml") }),
    /No kubeconfig at ".*nope\.yaml"/,
  );
});

Deno.test("kubernetes: a forbidden namespace (403) says which permissions to grant; nothing is left", async () => {
  await using c = await cluster({ forbiddenNamespaces: ["locked"] });
  const rt = new KubernetesRuntime(c.spec({ namespace: "locked" }), { ledger: null });
  const error = await rt.start().then(() => undefined, (e) => e);
  assert.ok(error instanceof KubeApiError, `got ${error}`);
  assert.equal(error.status, 403);
  assert.match(error.message, /forbids POST \/apis\/networking\.k8s\.io\/v1\/namespaces\/locked/);
  assert.match(error.message, /cannot create resource "networkpolicies"/);
  assert.match(error.message, /Grant the user of .* a Role in that namespace allowing/);
  assert.match(error.message, /namespace = "\.\.\." in the runtime table/);
  assert.deepEqual(c.standin.pods(), []);
});

Deno.test("kubernetes: an image that cannot be pulled fails the start as SandboxImageError and deletes the pod", async () => {
  await using c = await cluster();
  const rt = new KubernetesRuntime(c.spec({ image: "vf-no-such-image:1" }), { ledger: null });
  const error = await rt.start().then(() => undefined, (e) => e);
  assert.ok(error instanceof SandboxImageError, `got ${error}`);
  assert.match(
    error.message,
    /cannot pull image "vf-no-such-image:1" \((ErrImagePull|ImagePullBackOff)/,
  );
  assert.deepEqual(c.standin.pods(), [], "the failed pod was deleted");
});

Deno.test("kubernetes: in-cluster auth reads the service account's token (fresh on each call), CA and namespace", async () => {
  await using c = await cluster();
  const sa = join(c.dir, "serviceaccount");
  await Deno.mkdir(sa);
  await Deno.copyFile(join(c.dir, "ca.pem"), join(sa, "ca.crt"));
  await Deno.writeTextFile(join(sa, "token"), "rotated-away\n");
  await Deno.writeTextFile(join(sa, "namespace"), "tenant-a\n");
  const port = new URL(c.standin.url).port;
  const target = await loadKubeTarget({
    inCluster: true,
    serviceAccountDir: sa,
    env: { KUBERNETES_SERVICE_HOST: "127.0.0.1", KUBERNETES_SERVICE_PORT: port },
  });
  assert.equal(target.server, `https://127.0.0.1:${port}`);
  assert.equal(target.namespace, "tenant-a");
  const client = new KubeClient(target);
  try {
    await assert.rejects(client.request("GET", "/api/v1/namespaces/tenant-a/pods"), /401/);
    await Deno.writeTextFile(join(sa, "token"), `${TOKEN}\n`); // the kubelet rotated it
    const list = await client.request<{ items: unknown[] }>(
      "GET",
      "/api/v1/namespaces/tenant-a/pods",
    );
    assert.deepEqual(list?.items, []);
  } finally {
    client.close();
  }
  // Without a kubeconfig, KUBERNETES_SERVICE_HOST alone selects in-cluster auth.
  const auto = await loadKubeTarget({
    serviceAccountDir: sa,
    env: { HOME: c.dir, KUBERNETES_SERVICE_HOST: "10.0.0.1", KUBERNETES_SERVICE_PORT: "443" },
  });
  assert.equal(auto.server, "https://10.0.0.1:443");
  assert.equal(auto.source, `the service account in ${sa}`);
});

Deno.test("kubernetes: cleanup by label selector removes a run's leftover pods and policies, and the ledger's cleaner removes recorded ones", async () => {
  await using c = await cluster();
  const ledgerPath = join(c.dir, "ledger.jsonl");
  const ledger = new Ledger(ledgerPath);
  // Three pods whose runtimes are never stopped (as after a crash); one of another run.
  const mine = [
    new KubernetesRuntime(c.spec(), { runId: "crashed-run", ledger }),
    new KubernetesRuntime(c.spec({ network: true }), { runId: "crashed-run", ledger }),
  ];
  const other = new KubernetesRuntime(c.spec(), { runId: "other-run", ledger: null });
  await Promise.all([...mine, other].map((rt) => rt.start()));
  assert.equal(c.standin.pods().length, 3);

  // Owner checks: this process still runs, so without --force its pods are kept.
  const kept: string[] = [];
  assert.deepEqual(
    await cleanupPods({
      kubeconfig: c.kubeconfig,
      runId: "crashed-run",
      owners: {},
      onKept: (name) => kept.push(name),
    }),
    [],
  );
  assert.deepEqual(kept.sort(), mine.map((rt) => rt.id).sort());

  const removed = await cleanupPods({ kubeconfig: c.kubeconfig, runId: "crashed-run" });
  assert.deepEqual(removed.sort(), mine.map((rt) => rt.id).sort());
  assert.deepEqual(c.standin.pods(), [`default/${other.id}`]);
  const policies = await (async () => {
    const client = new KubeClient(await loadKubeTarget({ kubeconfig: c.kubeconfig }));
    try {
      return await client.request<{ items: Array<{ metadata: { name: string } }> }>(
        "GET",
        "/apis/networking.k8s.io/v1/namespaces/default/networkpolicies",
      );
    } finally {
      client.close();
    }
  })();
  assert.deepEqual(policies?.items.map((p) => p.metadata.name), [other.id]);

  // The ledger still lists the crashed run's pods as live; its cleaner deletes them (gone
  // already: deleting is idempotent) and marks them stopped.
  const report = await cleanupLedger({ runId: "crashed-run" }, { ledger });
  assert.equal(report.removed.length, 2, JSON.stringify(report));
  assert.deepEqual(await ledger.live({ runId: "crashed-run" }), []);

  // vf cleanup --kubernetes does the same from the command line.
  const res = await collect(cliCommand([
    "cleanup",
    "--kubernetes",
    "--kubeconfig",
    c.kubeconfig,
    "--run",
    "other-run",
    "--force",
  ], { cwd: c.dir, env: { VF_LEDGER: "off" }, registry: false, docker: true }));
  assert.equal(res.code, 0, transcript(res));
  assert.match(res.stdout, new RegExp(`removed 1 pod\\n  ${other.id}\\n`));
  assert.deepEqual(c.standin.pods(), []);
  for (const rt of [...mine, other]) await rt.stop();
});

Deno.test("kubernetes: a warm pool keeps a started pod ready, hands it out, starts a replacement, and close() deletes the spare", async () => {
  await using c = await cluster();
  const pool = new WarmPool({ size: 1, runId: "pooled-run" });
  const first = await pool.acquire(c.spec(), { task: "t1" });
  assert.equal((await first.run(["echo", "ok"])).stdout, "ok\n");
  // The replacement is started in the background: wait until the pool holds it ready.
  for (let i = 0; i < 200 && pool.stats.ready < 1; i++) {
    await new Promise((r) => setTimeout(r, 50));
  }
  assert.equal(pool.stats.ready, 1, JSON.stringify(pool.stats));
  const second = await pool.acquire(c.spec(), { task: "t2" });
  assert.deepEqual([pool.stats.hits, pool.stats.misses], [2, 0], JSON.stringify(pool.stats));
  assert.equal((await second.run(["echo", "warm"])).stdout, "warm\n");
  const posted = c.standin.requests.filter((r) => r.method === "POST" && r.path.endsWith("/pods"))
    .map((r) => (r.body as { metadata: { labels: Record<string, string> } }).metadata.labels);
  assert.ok(posted.some((l) => l["vf.pool"] === "1" && l["vf.run_id"] === "pooled-run"));
  await first.stop();
  await second.stop();
  await pool.close();
  assert.deepEqual(c.standin.pods(), []);
});

Deno.test("vf run file-sum on kubernetes: the agent works in a pod, grading runs in a fresh pod, every pod is deleted", async () => {
  await using c = await cluster({ namespace: "evals" });
  await using out = await tempDir("vf_k8s_run_");
  await using server = await startModelServer({
    responder: bashModel(
      "cat /app/input.txt",
      "awk '{ s += $1 } END { print s }' /app/input.txt > /app/output/answer.txt",
    ),
  });
  const res = await collect(cliCommand([
    "run",
    "file-sum",
    "-m",
    "vf-test",
    "-b",
    server.url,
    "-n",
    "2",
    "-r",
    "1",
    "-o",
    out.path,
    "--env.agent.runtime.type",
    "kubernetes",
    "--env.agent.runtime.kubeconfig",
    c.kubeconfig,
  ], { cwd: out.path, env: { VF_LEDGER: "off" }, registry: false, docker: true }));
  assert.equal(res.code, 0, transcript(res));
  assert.match(res.stdout, /reward 1\.0000 {2}errors 0 of 2/, transcript(res));
  const dir = /^Saving traces to (.+)$/m.exec(res.stderr)?.[1];
  assert.ok(dir, transcript(res));
  const traces = (await Deno.readTextFile(join(dir, "traces.jsonl"))).trim().split("\n").map((
    l,
  ) => JSON.parse(l));
  assert.equal(traces.length, 2);
  for (const t of traces) {
    assert.equal(t.reward, 1, JSON.stringify(t.error));
    assert.deepEqual(t.runtime, { type: "kubernetes", image: "python:3.11-slim" });
    assert.deepEqual(t.scoring, { mode: "isolated", attempts: 1 });
  }
  // Two pods per task: the agent's and a fresh grader's, each labelled with its role.
  const pods = c.standin.requests.filter((r) => r.method === "POST" && r.path.endsWith("/pods"));
  const roles = pods.map((p) =>
    (p.body as { metadata: { labels: Record<string, string> } }).metadata.labels["vf.role"]
  ).sort();
  assert.deepEqual(roles, ["agent", "agent", "grader", "grader"]);
  assert.ok(pods.every((p) => p.path.startsWith("/api/v1/namespaces/evals/")));
  assert.deepEqual(c.standin.pods(), []);

  // An image the cluster cannot pull: an infrastructure error on each trace, never reward 0.
  const pull = await collect(cliCommand([
    "run",
    "file-sum",
    "-m",
    "vf-test",
    "-b",
    server.url,
    "-n",
    "1",
    "-o",
    out.path,
    "--env.agent.runtime.type",
    "kubernetes",
    "--env.agent.runtime.kubeconfig",
    c.kubeconfig,
    "--env.agent.runtime.image",
    "vf-no-such-image:1",
  ], { cwd: out.path, env: { VF_LEDGER: "off" }, registry: false, docker: true }));
  assert.equal(pull.code, 1, transcript(pull));
  const pullDir = /^Saving traces to (.+)$/m.exec(pull.stderr)?.[1];
  assert.ok(pullDir, transcript(pull));
  const [failed] = (await Deno.readTextFile(join(pullDir, "traces.jsonl"))).trim().split("\n")
    .map((l) => JSON.parse(l));
  assert.equal(failed.reward, null, JSON.stringify(failed));
  assert.equal(failed.error.error, "SandboxImageError", JSON.stringify(failed.error));
  assert.equal(failed.error.infra, true);
  assert.match(failed.error.message, /cannot pull image "vf-no-such-image:1"/);
  assert.deepEqual(c.standin.pods(), []);
});
