/**
 * The model gateway and egress policy end to end through `vf run` on Docker:
 * - vf's shipped agent programs (Python on the python image, sh on busybox) run inside the
 *   sandbox and reach the loopback model only through the gateway; direct connections have no
 *   route, and the real API key never enters the sandbox;
 * - a network policy lets setup fetch what it needs, lets the agent and the grader (in the
 *   agent's sandbox, or in a fresh isolated one) reach only the allowed host (through the
 *   proxy; a direct connection has no route), and records the refused connections on the
 *   trace with their phase;
 * - nothing of the run (sandbox, relay, network) is left on the engine.
 * @module
 */
import assert from "node:assert/strict";
import net from "node:net";
import { basename, join } from "node:path";
import { cleanupContainers } from "../mod.ts";
import { startModelServer, type WireMessage } from "./model_server.ts";
import { cliCommand, type CliResult, collect, MOD_URL, transcript } from "./_cli.ts";
import { Gateway } from "../lib/gateway/gateway.ts";
import { parseNetworkPolicy } from "../lib/gateway/policy.ts";

// deno-lint-ignore no-explicit-any
type Json = any;

const REAL_KEY = "sk-real-key-never-in-sandbox-5b7e";

async function write(root: string, files: Record<string, string>): Promise<void> {
  for (const [path, text] of Object.entries(files)) {
    const full = join(root, path);
    await Deno.mkdir(join(full, ".."), { recursive: true });
    await Deno.writeTextFile(full, text);
  }
}

async function engineJson(path: string): Promise<Json> {
  const client = Deno.createHttpClient({
    proxy: { transport: "unix", path: "/var/run/docker.sock" },
  });
  try {
    return await (await fetch(`http://docker${path}`, { client })).json();
  } finally {
    client.close();
  }
}

async function engineCall(method: string, path: string, body?: unknown): Promise<Json> {
  const client = Deno.createHttpClient({
    proxy: { transport: "unix", path: "/var/run/docker.sock" },
  });
  try {
    const res = await fetch(`http://docker${path}`, {
      method,
      client,
      ...(body !== undefined && {
        body: JSON.stringify(body),
        headers: { "content-type": "application/json" },
      }),
    });
    const text = await res.text();
    if (res.status >= 300 && res.status !== 404) throw new Error(`${method} ${path}: ${text}`);
    return text ? JSON.parse(text) : null;
  } finally {
    client.close();
  }
}

/** The IPv4 address of host interface `name`, or of the first non-loopback one. */
function interfaceIp(name?: string, family: "IPv4" | "IPv6" = "IPv4"): string | undefined {
  return Deno.networkInterfaces().find((i) =>
    i.family === family && (name ? i.name === name : !/^(lo|docker0|br-)/.test(i.name)) &&
    !/^(127\.|::1$|fe80:)/.test(i.address)
  )?.address;
}

/**
 * An HTTP server answering `text` on `port` at an address outside every Docker network and
 * every host interface: a host other than the evaluator's that the evaluator can reach, as
 * the internet would be (there is none here). It is a busybox container on the default
 * bridge holding a random 198.18.0.0/15 (benchmarking) address, routed to it from the host;
 * the container's own bridge address would be another rollout's container to the proxy.
 */
async function containerServer(text: string, port = 8000) {
  const name = `vf-test-http-${crypto.randomUUID().slice(0, 8)}`;
  const [x, y] = crypto.getRandomValues(new Uint8Array(2));
  const ip = `198.${18 + (x & 1)}.${y}.${1 + (x >> 1)}`;
  const created = await engineCall("POST", `/containers/create?name=${name}`, {
    Image: "busybox:latest",
    Cmd: [
      "sh",
      "-c",
      `ip addr add ${ip}/32 dev lo && mkdir -p /www && echo ${text} > /www/index.html && ` +
      `exec httpd -f -p ${port} -h /www`,
    ],
    Labels: { "vf.test": "gateway" },
    HostConfig: { NetworkMode: "bridge", CapAdd: ["NET_ADMIN"] },
  });
  const ipRoute = (...args: string[]) =>
    new Deno.Command("ip", { args: ["route", ...args, `${ip}/32`], stderr: "null" }).output();
  const remove = async () => {
    await ipRoute("del");
    await engineCall("DELETE", `/containers/${created.Id}?force=1`);
  };
  try {
    await engineCall("POST", `/containers/${created.Id}/start`);
    const bridgeIp: string = (await engineCall("GET", `/containers/${created.Id}/json`))
      .NetworkSettings.IPAddress;
    const routed = await new Deno.Command("ip", {
      args: ["route", "add", `${ip}/32`, "via", bridgeIp],
    }).output();
    if (!routed.success) throw new Error(new TextDecoder().decode(routed.stderr));
    for (let i = 0;; i++) {
      try {
        const res = await fetch(`http://${ip}:${port}/`);
        if ((await res.text()).trim() === text) break;
      } catch (error) {
        if (i > 300) throw error;
      }
      await new Promise((r) => setTimeout(r, 100));
    }
    return { ip, bridgeIp, port, [Symbol.asyncDispose]: remove };
  } catch (error) {
    await remove();
    throw error;
  }
}

async function leftovers(runId: string): Promise<{ containers: number; networks: number }> {
  const filters = encodeURIComponent(JSON.stringify({ label: [`vf.run_id=${runId}`] }));
  const containers = await engineJson(`/containers/json?all=1&filters=${filters}`);
  const networks = await engineJson(`/networks?filters=${filters}`);
  return { containers: containers.length, networks: networks.length };
}

async function run(
  dir: string,
  args: string[],
  env: Record<string, string> = {},
): Promise<CliResult & { runId: string; runDir: string }> {
  const res = await collect(cliCommand(args, { cwd: dir, env, registry: false, docker: true }));
  const runDir = /^Saving traces to (.+)$/m.exec(res.stderr)?.[1] ?? "";
  return { ...res, runId: runDir ? basename(runDir) : "", runDir };
}

async function traces(runDir: string): Promise<Json[]> {
  return (await Deno.readTextFile(join(runDir, "traces.jsonl"))).trim().split("\n")
    .map((l) => JSON.parse(l));
}

/** A plain-text HTTP server; `hostname` 0.0.0.0 makes it reachable on every host address. */
async function serveText(text: string, hostname = "127.0.0.1") {
  const ready = Promise.withResolvers<void>();
  const server = Deno.serve(
    { hostname, port: 0, onListen: () => ready.resolve() },
    () => new Response(text),
  );
  await ready.promise;
  return server;
}

function toolOutputs(trace: Json): string {
  return trace.messages.filter((m: Json) => m.role === "tool").map((m: Json) => m.content).join(
    "\n",
  );
}

Deno.test("program harness: vf's agent programs run inside Docker and reach the model only through the gateway; the real key never enters the sandbox", async () => {
  const dir = await Deno.makeTempDir({ prefix: "vf_gateway_" });
  const runIds: string[] = [];
  await using host = await serveText("host service", "0.0.0.0");
  try {
    await write(join(dir, "bench"), {
      "add/instruction.md": "In /app/add.py, define add(a, b) returning a + b.\n",
      "add/task.toml": "[verifier]\ntimeout_sec = 60.0\n",
      "add/environment/Dockerfile": "FROM python:3.11-slim\nWORKDIR /app\n",
      "add/tests/test.sh":
        '#!/bin/sh\ncd /app && python3 -c "from add import add; assert add(2, 3) == 5" && echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt\n',
    });
    await write(join(dir, "shell"), {
      "hello/instruction.md": "Write the word hello to /app/out.txt.\n",
      "hello/task.toml": "[verifier]\ntimeout_sec = 30.0\n",
      "hello/environment/Dockerfile": "FROM busybox:latest\nWORKDIR /app\n",
      "hello/tests/test.sh":
        '#!/bin/sh\n[ "$(cat /app/out.txt)" = hello ] && echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt\n',
    });
    const probe = `import socket
for addr in [("172.17.0.1", ${host.addr.port}), ("1.1.1.1", 443)]:
    try:
        socket.create_connection(addr, 3); print("REACHED", addr)
    except OSError as e:
        print("NO ROUTE", addr[0])
`;
    // The key split in two, so the command itself (in the sh agent's files) does not hold it.
    const GREP_KEY = `env; k=${REAL_KEY.slice(0, 8)}; grep -rls "\${k}${
      REAL_KEY.slice(8)
    }" /app /tmp /root /etc; echo grep=$?`;
    const seen: string[] = [];
    await using model = await startModelServer({
      apiKey: REAL_KEY,
      responder: ({ body }) => {
        seen.push(body.model);
        const turn = body.messages.filter((m: WireMessage) => m.role === "assistant").length;
        const prompt = JSON.stringify(body.messages);
        const python = prompt.includes("add.py");
        const commands = python
          ? [
            GREP_KEY,
            `python3 -c '${probe}'`,
            "printf 'def add(a, b):\\n    return a + b\\n' > /app/add.py",
          ]
          : [
            GREP_KEY,
            `wget -q -O- http://172.17.0.1:${host.addr.port}/ || echo NO ROUTE`,
            "echo hello > /app/out.txt",
          ];
        return turn < commands.length
          ? {
            content: null,
            tool_calls: [{ name: "bash", arguments: { command: commands[turn] } }],
          }
          : { content: "Done." };
      },
    });
    const env = { VF_TEST_REAL_KEY: REAL_KEY };
    const common = ["-m", "agent-model", "-b", model.url, "-k", "VF_TEST_REAL_KEY", "-o", "out"];
    const py = await run(
      dir,
      ["run", "./bench", ...common, "--env.agent.harness.id", "program"],
      env,
    );
    runIds.push(py.runId);
    assert.equal(py.code, 0, transcript(py));
    // No harness.agent: vf looks at the image and picks sh on busybox (no python3).
    const sh = await run(
      dir,
      ["run", "./shell", ...common, "--env.agent.harness.id", "program"],
      env,
    );
    runIds.push(sh.runId);
    assert.equal(sh.code, 0, transcript(sh));

    for (const [res, turns, picked] of [[py, 4, "python"], [sh, 4, "sh"]] as const) {
      const [t] = await traces(res.runDir);
      assert.match(t.tool_calls.at(-1).output, new RegExp(`vf picked the ${picked} agent`));
      assert.equal(t.reward, 1, JSON.stringify(t.error));
      assert.equal(t.harness, "program");
      assert.equal(t.stop_condition, "agent_completed");
      // Every call went through the gateway onto the trace, with the run's model.
      assert.equal(t.model_calls.length, turns);
      const out = toolOutputs(t);
      assert.match(out, /OPENAI_BASE_URL=http:\/\/vf-gateway:8080\/v1/);
      assert.doesNotMatch(out, new RegExp(REAL_KEY));
      assert.match(out, /grep=1/); // no file holds the key
      assert.match(out, /NO ROUTE/);
      assert.doesNotMatch(out, /REACHED|host service/);
      assert.equal(t.tool_calls.at(-1).name, "program");
      assert.equal(t.tool_calls.at(-1).exit_code, 0);
      assert.deepEqual(await leftovers(res.runId), { containers: 0, networks: 0 });
    }
    assert.ok(seen.length >= 8 && seen.every((m) => m === "agent-model"));
  } finally {
    for (const id of runIds.filter(Boolean)) await cleanupContainers({ runId: id });
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("network policy: setup fetches freely, the agent and the grader reach only the allowed host, and refusals are on the trace with their phase", async () => {
  const dir = await Deno.makeTempDir({ prefix: "vf_egress_" });
  const runIds: string[] = [];
  await using allowed = await serveText("A");
  // The other host is another machine (a container): the evaluator's own addresses are
  // reachable only when a rule names them, setup's open policy included.
  await using other = await containerServer("B");
  const otherIp = other.ip;
  await using open = await serveText("OPEN", "0.0.0.0");
  const a = allowed.addr.port;
  const b = other.port;
  try {
    await Deno.writeTextFile(
      join(dir, "net.ts"),
      `
import { metric, reward, Task, Taskset } from "${MOD_URL}";
const fetch = (runtime, port, host = "127.0.0.1") =>
  runtime.run(["sh", "-c", "wget -q -O- http://" + host + ":" + port + "/ || echo REFUSED"]);
class NetTask extends Task {
  static override NEEDS_CONTAINER = true;
  // Setup runs before the policy applies: a package-install stand-in from the other host.
  override async setup({ runtime }) {
    const r = await fetch(runtime, ${b}, "${otherIp}");
    await runtime.write("/tmp/setup.txt", r.stdout);
  }
  graded = reward(async ({ runtime }) => ((await fetch(runtime, ${a})).stdout.trim() === "A" ? 1 : 0));
  grader_refused = metric(async ({ runtime }) =>
    ((await fetch(runtime, ${b}, "${otherIp}")).stdout.includes("REFUSED") ? 1 : 0));
}
class Nets extends Taskset {
  get id() { return "nets"; }
  *load() {
    yield new NetTask({
      id: "net",
      prompt: "Fetch things.",
      image: "busybox:latest",
      network: { allow: ["127.0.0.1:${a}"] },
    });
  }
}
export function loadTaskset(config) { return new Nets(config); }
`,
    );
    await using model = await startModelServer({
      responder: ({ body }) => {
        const turn = body.messages.filter((m: WireMessage) => m.role === "assistant").length;
        const command = [
          "cat /tmp/setup.txt; echo",
          `wget -q -O- http://127.0.0.1:${a}/; echo`,
          `wget -q -O- http://${otherIp}:${b}/ || echo REFUSED`,
          `wget -Y off -q -O- http://172.17.0.1:${open.addr.port}/ || echo NO ROUTE`,
        ][turn];
        return command
          ? { content: null, tool_calls: [{ name: "bash", arguments: { command } }] }
          : { content: "Done." };
      },
    });
    const res = await run(dir, ["run", "./net.ts", "-m", "m", "-b", model.url, "-o", "out"]);
    runIds.push(res.runId);
    assert.equal(res.code, 0, transcript(res));
    const [t] = await traces(res.runDir);
    assert.equal(t.error, null);
    const outputs = t.tool_calls.map((c: Json) => c.output);
    assert.match(outputs[0], /stdout:\nB/); // setup reached the other host
    assert.match(outputs[1], /stdout:\nA/); // the agent reaches the allowed one
    assert.match(outputs[2], /REFUSED/); // and not the other
    assert.match(outputs[3], /NO ROUTE/); // nor anything directly
    assert.doesNotMatch(outputs[3], /OPEN/);
    assert.equal(t.reward, 1); // the grader reaches the allowed host
    assert.equal(t.metrics.grader_refused, 1); // and not the other
    assert.deepEqual(t.network.policy, { allow: [`127.0.0.1:${a}`], block: [] });
    assert.deepEqual(
      t.network.denied.map((d: Json) => [d.phase, d.host, d.port]),
      [["agent", otherIp, b], ["grade", otherIp, b]],
    );
    assert.deepEqual(await leftovers(res.runId), { containers: 0, networks: 0 });

    // Isolated grading: a fresh grading sandbox on a network of its own, under the same policy.
    const iso = await run(dir, [
      "run",
      "./net.ts",
      "-m",
      "m",
      "-b",
      model.url,
      "-o",
      "out",
      "--env.agent.scoring.mode",
      "isolated",
    ]);
    runIds.push(iso.runId);
    assert.equal(iso.code, 0, transcript(iso));
    const [u] = await traces(iso.runDir);
    assert.equal(u.error, null);
    assert.equal(u.scoring.mode, "isolated");
    assert.equal(u.reward, 1);
    assert.equal(u.metrics.grader_refused, 1);
    assert.deepEqual(
      u.network.denied.map((d: Json) => [d.phase, d.port]),
      [["agent", b], ["grade", b]],
    );
    assert.deepEqual(await leftovers(iso.runId), { containers: 0, networks: 0 });

    // An allow entry that is not a host names its key; a policy on a runtime that cannot
    // enforce it is refused.
    const bad = await run(dir, [
      "run",
      "./net.ts",
      "-m",
      "m",
      "-b",
      model.url,
      "-o",
      "out",
      "--env.agent.runtime.network.allow",
      '["10.0.0.0/8"]',
    ]);
    runIds.push(bad.runId);
    assert.notEqual(bad.code, 0);
    assert.match(
      bad.stdout + bad.stderr,
      /env\.agent\.runtime\.network\.allow: "10\.0\.0\.0\/8" is not a host/,
    );
  } finally {
    for (const id of runIds.filter(Boolean)) await cleanupContainers({ runId: id });
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("network = true: the sandbox reaches the internet through the egress proxy only; the evaluator's host and other containers are refused and recorded, directly unreachable", async () => {
  const dir = await Deno.makeTempDir({ prefix: "vf_open_net_" });
  const runIds: string[] = [];
  await using internet = await containerServer("INTERNET");
  await using evaluator = await serveText("EVALUATOR-SECRET", "0.0.0.0");
  const e = evaluator.addr.port;
  const bridge = interfaceIp("docker0")!;
  const direct = (host: string, port: number) =>
    `printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 3 ${host} ${port} || echo NO_ROUTE`;
  try {
    await Deno.writeTextFile(
      join(dir, "open.ts"),
      `
import { reward, Task, Taskset } from "${MOD_URL}";
class OpenTask extends Task {
  static override NEEDS_CONTAINER = true;
  // The grader cannot reach the evaluator's host either.
  sealed = reward(async ({ runtime }) => {
    const r = await runtime.run(["sh", "-c", ${JSON.stringify(direct(bridge, e))}]);
    return r.stdout.includes("EVALUATOR-SECRET") ? 0 : 1;
  });
}
class Open extends Taskset {
  get id() { return "open"; }
  *load() {
    yield new OpenTask({ id: "open", prompt: "Probe.", image: "busybox:latest", network: true });
  }
}
export function loadTaskset(config) { return new Open(config); }
`,
    );
    await using model = await startModelServer({
      responder: ({ body }) => {
        const turn = body.messages.filter((m: WireMessage) => m.role === "assistant").length;
        const command = [
          `wget -q -O- http://${internet.ip}:${internet.port}/ || echo NO_INTERNET`,
          `wget -q -O- http://${bridge}:${e}/ || echo REFUSED`,
          `wget -q -O- http://${internet.bridgeIp}:${internet.port}/ || echo REFUSED`,
          direct(bridge, e),
          direct(internet.bridgeIp, internet.port),
        ][turn];
        return command
          ? { content: null, tool_calls: [{ name: "bash", arguments: { command } }] }
          : { content: "Done." };
      },
    });
    const res = await run(dir, ["run", "./open.ts", "-m", "m", "-b", model.url, "-o", "out"]);
    runIds.push(res.runId);
    assert.equal(res.code, 0, transcript(res));
    const [t] = await traces(res.runDir);
    assert.equal(t.error, null);
    const outputs = t.tool_calls.map((c: Json) => c.output);
    assert.match(outputs[0], /stdout:\nINTERNET/); // HTTP through the proxy works
    assert.match(outputs[1], /REFUSED/); // the evaluator's host, through the proxy
    assert.match(outputs[2], /REFUSED/); // another container, through the proxy
    assert.match(outputs[3], /NO_ROUTE/); // the evaluator's host, directly
    assert.match(outputs[4], /NO_ROUTE/); // another container, directly
    for (const out of outputs) assert.doesNotMatch(out, /EVALUATOR-SECRET/);
    assert.equal(t.reward, 1);
    assert.deepEqual(t.network.policy, { allow: ["*"], block: [] });
    assert.deepEqual(
      t.network.denied.map((d: Json) => [d.phase, d.host, d.port]),
      [["agent", bridge, e], ["agent", internet.bridgeIp, internet.port]],
    );
    assert.deepEqual(await leftovers(res.runId), { containers: 0, networks: 0 });
  } finally {
    for (const id of runIds.filter(Boolean)) await cleanupContainers({ runId: id });
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("program harness: a given command gets env and forwarded variables; a token budget stops the program cleanly; one past its timeout is killed with its process tree and still scored", async () => {
  const dir = await Deno.makeTempDir({ prefix: "vf_program_" });
  const runIds: string[] = [];
  try {
    await write(join(dir, "bench"), {
      "hello/instruction.md": "Write the word hello to /app/out.txt.\n",
      "hello/task.toml": "[verifier]\ntimeout_sec = 30.0\n",
      "hello/environment/Dockerfile": "FROM busybox:latest\nWORKDIR /app\n",
      "hello/tests/test.sh":
        '#!/bin/sh\n[ "$(cat /app/out.txt)" = hello ] && echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt\n',
    });
    await using model = await startModelServer({ responder: () => ({ content: "unused" }) });
    const base = ["run", "./bench", "-m", "m", "-b", model.url, "-o", "out"];
    const ok = await run(dir, [
      ...base,
      "--env.agent.harness.id",
      "program",
      "--env.agent.harness.command",
      'echo "$GREETING" > /app/out.txt; echo "forwarded=$VF_TEST_FORWARDED"',
      "--env.agent.harness.env",
      '{"GREETING": "hello"}',
      "--env.agent.harness.forward_env",
      '["VF_TEST_FORWARDED"]',
    ], { VF_TEST_FORWARDED: "from-evaluator" });
    runIds.push(ok.runId);
    assert.equal(ok.code, 0, transcript(ok));
    const [t] = await traces(ok.runDir);
    assert.equal(t.reward, 1);
    assert.equal(t.stop_condition, "agent_completed");
    assert.match(t.tool_calls[0].output, /forwarded=from-evaluator/);
    assert.equal(t.model_calls.length, 0);

    // A token budget: the call after it is spent is refused, the program stops, and the
    // rollout ends cleanly with the limit as its stop condition, still scored.
    await using chatty = await startModelServer({
      responder: () => ({
        content: null,
        tool_calls: [{ name: "bash", arguments: { command: "echo hello > /app/out.txt" } }],
      }),
    });
    const capped = await run(dir, [
      "run",
      "./bench",
      "-m",
      "m",
      "-b",
      chatty.url,
      "-o",
      "out",
      "--env.agent.harness.id",
      "program",
      "--env.agent.harness.agent",
      "sh",
      "--env.agent.max_total_tokens",
      "1",
    ]);
    runIds.push(capped.runId);
    assert.equal(capped.code, 0, transcript(capped));
    const [c] = await traces(capped.runDir);
    assert.equal(c.error, null);
    assert.equal(c.stop_condition, "max_total_tokens");
    assert.equal(c.model_calls.length, 1);
    assert.equal(c.reward, 1); // the one command it got ran

    // Past its timeout: killed (the marker never appears), the rollout still scored.
    const slow = await run(dir, [
      ...base,
      "--env.agent.harness.id",
      "program",
      "--env.agent.harness.command",
      "sh -c 'sleep 300; echo hello > /app/out.txt' & wait",
      "--env.agent.harness.timeout",
      "2",
    ]);
    runIds.push(slow.runId);
    assert.equal(slow.code, 0, transcript(slow));
    const [u] = await traces(slow.runDir);
    assert.equal(u.error, null);
    assert.equal(u.stop_condition, "program_timeout");
    assert.equal(u.reward, 0); // scored: the work was not done
    assert.match(u.tool_calls[0].error, /process tree was killed/);
  } finally {
    for (const id of runIds.filter(Boolean)) await cleanupContainers({ runId: id });
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("egress proxy: with allow = * every address of the evaluator's host is refused in every spelling and recorded; a host the task names is reached", async () => {
  const dir = await Deno.makeTempDir({ prefix: "vf_egress_host_" });
  const runIds: string[] = [];
  // What the evaluator binds on every interface (a local vLLM, the env server): on "::" so
  // IPv6 spellings reach it too.
  await using evaluator = await serveText("EVALUATOR-SECRET", "::");
  const p = evaluator.addr.port;
  // A host the task names: it answers, and redirects to the evaluator's service on request.
  const namedReady = Promise.withResolvers<void>();
  let bridge = "";
  await using named = Deno.serve(
    { hostname: "0.0.0.0", port: 0, onListen: () => namedReady.resolve() },
    (req) =>
      new URL(req.url).pathname === "/redirect"
        ? new Response(null, { status: 302, headers: { location: `http://${bridge}:${p}/` } })
        : new Response("NAMED-HOST"),
  );
  await namedReady.promise;
  const q = named.addr.port;
  // A bridge network besides the default one: its gateway is another address of this host.
  const netName = `vf-test-egress-${crypto.randomUUID().slice(0, 8)}`;
  const created = await engineCall("POST", "/networks/create", {
    Name: netName,
    Driver: "bridge",
    CheckDuplicate: true,
  });
  try {
    const other = await engineCall("GET", `/networks/${created.Id}`);
    const otherGateway: string = other.IPAM.Config[0].Gateway;
    bridge = interfaceIp("docker0")!;
    const hostIp = interfaceIp()!;
    const hostIp6 = interfaceIp(undefined, "IPv6");
    const octets = bridge.split(".").map(Number);
    const decimal = String(octets.reduce((n, o) => n * 256 + o, 0));
    const hex = `0x${octets.map((o) => o.toString(16).padStart(2, "0")).join("")}`;
    const octal = octets.map((o) => `0${o.toString(8)}`).join(".");
    const refused = [
      `GET http://${bridge}:${p}/`,
      `GET http://${decimal}:${p}/`,
      `GET http://${hex}:${p}/`,
      `GET http://${octal}:${p}/`,
      `GET http://[::ffff:${bridge}]:${p}/`,
      `GET http://${bridge}.:${p}/`,
      `GET http://0.0.0.0:${p}/`,
      `GET http://${hostIp}:${p}/`,
      `GET http://${otherGateway}:${p}/`,
      ...(hostIp6 ? [`GET http://[${hostIp6}]:${p}/`] : []),
      `CONNECT ${bridge}:${p}`,
      `CONNECT ${decimal}:${p}`,
      // The rollout network's own gateway (the sandbox's address with .1 at the end).
      `GET http://OWN_GATEWAY:${p}/`,
    ];
    const allowed = [`GET http://${bridge}:${q}/`, `CONNECT ${bridge}:${q}`];
    // Raw requests to the proxy, so every spelling reaches it as written.
    const probe = `p=\${HTTP_PROXY#http://}; auth=$(printf %s "\${p%@*}" | base64)
gw=$(hostname -i | awk '{print $1}' | sed 's/\\.[0-9]*$/.1/')
ask() {
  { printf '%s HTTP/1.1\\r\\nHost: x\\r\\nProxy-Authorization: Basic %s\\r\\n\\r\\n' "$1" "$auth"
    case "$1" in CONNECT*) printf 'GET / HTTP/1.1\\r\\nHost: x\\r\\nConnection: close\\r\\n\\r\\n';; esac
  } | timeout 30 nc vf-gateway 8080
}
for t in ${[...refused, ...allowed].map((t) => `"${t}"`).join(" ")}; do
  t=$(echo "$t" | sed "s/OWN_GATEWAY/$gw/")
  r=$(ask "$t")
  echo "$t => $(echo "$r" | head -n1 | tr -d '\\r') $(echo "$r" | grep -o 'EVALUATOR-SECRET\\|NAMED-HOST' | head -n1)"
done
wget -q -O- http://${bridge}:${q}/redirect || echo REDIRECT-REFUSED`;
    await Deno.writeTextFile(
      join(dir, "host.ts"),
      `
import { reward, Task, Taskset } from "${MOD_URL}";
class HostTask extends Task {
  static override NEEDS_CONTAINER = true;
  done = reward(() => 1);
}
class Hosts extends Taskset {
  get id() { return "hosts"; }
  *load() {
    yield new HostTask({
      id: "host",
      prompt: "Reach the evaluator.",
      image: "busybox:latest",
      network: { allow: ["*", "${bridge}:${q}"] },
    });
  }
}
export function loadTaskset(config) { return new Hosts(config); }
`,
    );
    await using model = await startModelServer({
      responder: ({ body }) =>
        body.messages.some((m: WireMessage) => m.role === "assistant")
          ? { content: "Done." }
          : { content: null, tool_calls: [{ name: "bash", arguments: { command: probe } }] },
    });
    const res = await run(dir, ["run", "./host.ts", "-m", "m", "-b", model.url, "-o", "out"]);
    runIds.push(res.runId);
    assert.equal(res.code, 0, transcript(res));
    const [t] = await traces(res.runDir);
    assert.equal(t.error, null, JSON.stringify(t.error));
    const out: string = t.tool_calls[0].output;
    assert.doesNotMatch(out, /EVALUATOR-SECRET/, out);
    const lines = out.split("\n").filter((l) => l.includes(" => "));
    assert.equal(lines.length, refused.length + allowed.length, out);
    for (const line of lines.slice(0, refused.length)) {
      assert.match(line, /=> HTTP\/1\.1 403 Forbidden $/, out);
    }
    assert.match(lines[refused.length], /=> HTTP\/1\.1 200 OK NAMED-HOST$/, out);
    assert.match(
      lines[refused.length + 1],
      /=> HTTP\/1\.1 200 Connection Established NAMED-HOST$/,
      out,
    );
    assert.match(out, /REDIRECT-REFUSED/); // the named host's redirect to the evaluator
    // Every refusal is on the trace, in the agent's phase, under the address it meant.
    const denied = t.network.denied.map((d: Json) => `${d.phase} ${d.host}:${d.port}`);
    assert.equal(denied.length, refused.length + 1, JSON.stringify(denied));
    assert.ok(denied.every((d: string) => d.startsWith("agent ") && d.endsWith(`:${p}`)));
    for (const host of [bridge, "0.0.0.0", hostIp, otherGateway]) {
      assert.ok(denied.includes(`agent ${host}:${p}`), `${host} in ${JSON.stringify(denied)}`);
    }
    assert.equal(denied.filter((d: string) => d === `agent ${bridge}:${p}`).length, 9);
    assert.deepEqual(await leftovers(res.runId), { containers: 0, networks: 0 });
  } finally {
    await engineCall("DELETE", `/networks/${created.Id}`);
    for (const id of runIds.filter(Boolean)) await cleanupContainers({ runId: id });
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("egress proxy: a name is judged by the address it resolves to, and that address is the one connected to (a rebinding answer never gets a second lookup)", async () => {
  // The evaluator's service and another machine's, on the same port.
  await using evaluator = await serveText("EVALUATOR-SECRET", "0.0.0.0");
  const p = evaluator.addr.port;
  await using elsewhere = await containerServer("ELSEWHERE", p);
  const bridge = interfaceIp("docker0")!;
  // A rebinding DNS: another machine on the first query, the evaluator's bridge after that.
  const asked: string[] = [];
  const resolve = (name: string) => {
    asked.push(name);
    if (name === "rebind.test") {
      return Promise.resolve(asked.length === 1 ? elsewhere.ip : bridge);
    }
    if (name === "evaluator.test") return Promise.resolve(`::ffff:${bridge}`);
    return Promise.reject(new Error(`NXDOMAIN ${name}`));
  };
  const gateway = new Gateway({ resolve });
  try {
    const port = await gateway.listen("127.0.0.1");
    const session = gateway.open("m");
    session.setPhase("agent", parseNetworkPolicy({ allow: ["*"] }, "t"));
    const cred = btoa(`vf:${session.proxySecret}`);
    const ask = (line: string, after = "") =>
      new Promise<string>((resolve, reject) => {
        const socket = net.connect({ host: "127.0.0.1", port });
        let out = "";
        socket.on("data", (d) => (out += d.toString("latin1")));
        socket.on("close", () => resolve(out));
        socket.on("error", reject);
        socket.write(
          `${line} HTTP/1.1\r\nHost: x\r\nProxy-Authorization: Basic ${cred}\r\n\r\n${after}`,
        );
      });
    const first = await ask(`GET http://rebind.test:${p}/`);
    assert.match(first, /^HTTP\/1\.1 200[\s\S]*ELSEWHERE/);
    assert.deepEqual(asked, ["rebind.test"]); // looked up once, connected to what was checked
    const second = await ask(`CONNECT rebind.test:${p}`, "GET / HTTP/1.1\r\nHost: x\r\n\r\n");
    assert.match(second, /^HTTP\/1\.1 403[\s\S]*evaluator's own host \(172\./);
    const mapped = await ask(`GET http://evaluator.test:${p}/`);
    assert.match(mapped, /^HTTP\/1\.1 403[\s\S]*evaluator's own host/);
    // A name that means the host is refused before any lookup.
    const alias = await ask(`GET http://host.docker.internal:${p}/`);
    assert.match(alias, /^HTTP\/1\.1 403[\s\S]*names the evaluator's own host/);
    assert.deepEqual(asked, ["rebind.test", "rebind.test", "evaluator.test"]);
    for (const out of [first, second, mapped, alias]) assert.doesNotMatch(out, /EVALUATOR-SECRET/);
    assert.deepEqual(session.denials.map((d) => `${d.phase} ${d.host}:${d.port}`), [
      `agent rebind.test:${p}`,
      `agent evaluator.test:${p}`,
      `agent host.docker.internal:${p}`,
    ]);
    session.close();
  } finally {
    await gateway.close();
  }
});

Deno.test("program harness: vf's agent that cannot run in the sandbox (no wget, no python3, a missing Python module, no gateway) is an infrastructure error naming why, never a reward of 0", async () => {
  const dir = await Deno.makeTempDir({ prefix: "vf_agent_infra_" });
  const runIds: string[] = [];
  const grader =
    '#!/bin/sh\n[ "$(cat /app/out.txt)" = hello ] && echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt\n';
  try {
    await write(join(dir, "nowget"), {
      "hello/instruction.md": "Write the word hello to /app/out.txt.\n",
      "hello/task.toml": "[verifier]\ntimeout_sec = 30.0\n",
      // A Debian slim image has sh, mktemp and head, but no wget (busybox's sh would run its
      // wget applet even with the link removed).
      "hello/environment/Dockerfile":
        "FROM python:3.11-slim\nRUN ! command -v wget\nWORKDIR /app\n",
      "hello/tests/test.sh": grader,
    });
    await write(join(dir, "nojson"), {
      "hello/instruction.md": "Write the word hello to /app/out.txt.\n",
      "hello/task.toml": "[verifier]\ntimeout_sec = 30.0\n",
      "hello/environment/Dockerfile":
        "FROM python:3.11-slim\nRUN rm -rf /usr/lib/python3*/json\nWORKDIR /app\n",
      "hello/tests/test.sh": grader,
    });
    await write(join(dir, "busy"), {
      "hello/instruction.md": "Write the word hello to /app/out.txt.\n",
      "hello/task.toml": "[verifier]\ntimeout_sec = 30.0\n",
      "hello/environment/Dockerfile": "FROM busybox:latest\nWORKDIR /app\n",
      "hello/tests/test.sh": grader,
    });
    await write(join(dir, "plain"), {
      "hello/instruction.md": "Write the word hello to /app/out.txt.\n",
      "hello/task.toml": "[verifier]\ntimeout_sec = 30.0\n",
      "hello/environment/Dockerfile": "FROM python:3.11-slim\nWORKDIR /app\n",
      "hello/tests/test.sh": grader,
    });
    await using model = await startModelServer({
      responder: () => ({
        content: null,
        tool_calls: [{ name: "bash", arguments: { command: "echo hello > /app/out.txt" } }],
      }),
    });
    const base = ["-m", "m", "-b", model.url, "-o", "out", "--env.agent.harness.id", "program"];
    // Nothing listens on port 9 of the sandbox's loopback: the gateway cannot be reached.
    const away =
      '{"VF_GATEWAY_URL": "http://127.0.0.1:9", "OPENAI_BASE_URL": "http://127.0.0.1:9/v1"}';
    const cases: Array<[string, string[], RegExp]> = [
      ["./nowget", ["--env.agent.harness.agent", "sh"], /needs "wget"/],
      ["./nojson", [], /Python module "json"/],
      [
        "./busy",
        ["--env.agent.harness.agent", "sh", "--env.agent.harness.env", away],
        /cannot reach the model gateway/,
      ],
      ["./plain", ["--env.agent.harness.env", away], /cannot reach the model gateway/],
      // The python agent on an image without python3.
      [
        "./busy",
        ["--env.agent.harness.agent", "python"],
        /could not start \(exit 127\)[\s\S]*needs "python3"/,
      ],
    ];
    for (const [bench, flags, why] of cases) {
      const res = await run(dir, ["run", bench, ...base, ...flags]);
      runIds.push(res.runId);
      const [t] = await traces(res.runDir);
      const label = `${bench} ${flags.join(" ")}: ${JSON.stringify(t.error)} reward ${t.reward}`;
      assert.ok(t.error, label);
      assert.equal(t.error.error, "InfraError", label);
      assert.equal(t.error.infra, true, label);
      assert.match(t.error.message, why, label);
      assert.notEqual(t.reward, 0, label);
      assert.equal(t.model_calls.length, 0, label);
      const meta = JSON.parse(await Deno.readTextFile(join(res.runDir, "metadata.json")));
      const summary = meta.summary ?? meta;
      assert.equal(summary.num_infra_errors, 1, label);
      assert.equal(summary.avg_reward, null, label); // not averaged in as a 0
      assert.deepEqual(await leftovers(res.runId), { containers: 0, networks: 0 });
    }
    // Once the model has run a command, a gateway the agent cannot reach may be the agent's own
    // doing (here it points vf-gateway at its own loopback): that rollout is scored, not an
    // infrastructure error that would have it re-run.
    await using saboteur = await startModelServer({
      responder: () => ({
        content: null,
        tool_calls: [{
          name: "bash",
          arguments: {
            command:
              "echo '127.0.0.1 vf-gateway' > /tmp/h; cat /etc/hosts >> /tmp/h; cat /tmp/h > /etc/hosts",
          },
        }],
      }),
    });
    const cut = await run(dir, [
      "run",
      "./plain",
      ...base.slice(0, 2),
      "-b",
      saboteur.url,
      ...base.slice(4),
    ]);
    runIds.push(cut.runId);
    const [own] = await traces(cut.runDir);
    const label = `${JSON.stringify(own.error)} reward ${own.reward} stop ${own.stop_condition}`;
    assert.equal(own.model_calls.length, 1, label);
    assert.equal(own.error, null, label);
    assert.equal(own.stop_condition, "program_failed", label);
    assert.equal(own.reward, 0, label);
  } finally {
    for (const id of runIds.filter(Boolean)) await cleanupContainers({ runId: id });
    await Deno.remove(dir, { recursive: true });
  }
});
