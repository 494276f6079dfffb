/**
 * Services from Compose on Docker, end to end through `vf run`: an HTTP app and the store it
 * reads from (both busybox, since no registry is reachable), started in dependency order on
 * the rollout's own network and waited on until healthy; the agent reaches the app by name,
 * the reward checks the state the app holds; nothing of the run is left on the engine after.
 * Bad Compose input and a service that never becomes healthy get clear errors, never reward 0.
 * Image builds log to a file, are reused by content, and `vf cleanup --images` removes vf's
 * dangling builds.
 * @module
 */
import assert from "node:assert/strict";
import { basename, join } from "node:path";
import { cleanupContainers } from "../mod.ts";
import { buildImage, folderEntries } from "../lib/services/build.ts";
import { DockerEngine } from "../runtimes/docker/engine_api.ts";
import { packTar } from "../runtimes/_tar.ts";
import { startModelServer } from "./model_server.ts";
import { cliCommand, type CliResult, collect, MOD_URL, transcript } from "./_cli.ts";
import { EngineEvents } from "./_engine_events.ts";

// deno-lint-ignore no-explicit-any
type Json = any;

const COMPOSE = `
services:
  store:
    image: busybox:latest
    command: ["sh", "-c", "mkdir -p /www && echo hello > /www/greeting && exec httpd -f -p 8081 -h /www"]
    healthcheck:
      test: ["CMD", "wget", "-q", "-O", "/dev/null", "http://127.0.0.1:8081/greeting"]
      interval: 200ms
      retries: 50
  app:
    image: busybox:latest
    depends_on:
      store: { condition: service_healthy }
    ports: ["8080"]
    environment:
      STORE: http://store:8081
    command:
      - sh
      - -c
      - |
        mkdir -p /www/cgi-bin
        echo ok > /www/index.html
        cat > /www/cgi-bin/put <<'EOF'
        #!/bin/sh
        g=$(wget -qO- "$STORE/greeting")
        echo "$g \${QUERY_STRING#v=}" > /www/state.txt
        printf 'Content-Type: text/plain\\r\\n\\r\\nstored\\n'
        EOF
        chmod +x /www/cgi-bin/put
        exec httpd -f -p 8080 -h /www
    healthcheck:
      test: ["CMD", "wget", "-q", "-O", "/dev/null", "http://127.0.0.1:8080/index.html"]
      interval: 200ms
      retries: 50
`;

const TASKSET = `
import { metric, reward, Task, Taskset } from "${MOD_URL}";
class AppTask extends Task {
  static override NEEDS_CONTAINER = true;
  override deploymentSpec() { return this.config.compose ?? "compose.yaml"; }
  // Graded in the agent's sandbox while the services are up: what does the app hold now?
  stored = reward(async ({ runtime }) => {
    const r = await runtime.run(["wget", "-qO-", "http://app:8080/state.txt"]);
    return r.stdout.trim() === "hello 42" ? 1 : 0;
  });
  app_up = metric(async ({ runtime }) => {
    const r = await runtime.run(["wget", "-qO-", "http://app:8080/index.html"]);
    return r.stdout.trim() === "ok" ? 1 : 0;
  });
}
class Apps extends Taskset {
  get id() { return "apps"; }
  *load() {
    yield new AppTask({ id: "app", prompt: "Store 42 in the app.", image: "busybox:latest" }, this.config.task);
  }
}
export function loadTaskset(config) { return new Apps(config); }
`;

async function engineJson(path: string): Promise<Json> {
  const client = Deno.createHttpClient({
    proxy: { transport: "unix", path: "/var/run/docker.sock" },
  });
  try {
    const res = await fetch(`http://docker${path}`, { client });
    return await res.json();
  } finally {
    client.close();
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
): Promise<CliResult & { runId: string; runDir: string }> {
  const res = await collect(
    cliCommand(args, { cwd: dir, env: {}, registry: false, docker: true }),
  );
  const runDir = /^Saving traces to (.+)$/m.exec(res.stderr)?.[1];
  return { ...res, runId: runDir ? basename(runDir) : "", runDir: runDir ?? "" };
}

Deno.test("services: a two-service Compose task on Docker; the agent reaches the app by name, the grader reads the app's state, nothing is left after", async () => {
  const dir = await Deno.makeTempDir({ prefix: "vf_services_" });
  const runIds: string[] = [];
  try {
    await using model = await startModelServer({
      responder: ({ body }) => {
        const turn = body.messages.filter((m) => m.role === "assistant").length;
        return turn === 0
          ? {
            content: null,
            tool_calls: [{
              name: "bash",
              arguments: { command: 'wget -qO- "http://app:8080/cgi-bin/put?v=42"' },
            }],
          }
          : { content: "Stored." };
      },
    });
    await Deno.writeTextFile(join(dir, "apps.ts"), TASKSET);
    await Deno.writeTextFile(join(dir, "compose.yaml"), COMPOSE);
    const res = await run(dir, ["run", "./apps.ts", "-m", "m", "-b", model.url, "-o", "out"]);
    runIds.push(res.runId);
    assert.equal(res.code, 0, transcript(res));
    const [trace] = (await Deno.readTextFile(join(res.runDir, "traces.jsonl"))).trim().split("\n")
      .map((l) => JSON.parse(l));
    assert.equal(trace.ok, true, JSON.stringify(trace.error));
    assert.match(trace.tool_calls[0].output, /stored/);
    assert.deepEqual(trace.rewards, { stored: 1 });
    assert.deepEqual(await leftovers(res.runId), { containers: 0, networks: 0 });

    // A key outside the subset is refused before anything starts, naming the key.
    // Isolated grading with the services asked for: the grader gets its own, fresh ones (the
    // app is up, and holds none of what the agent stored).
    const iso = await run(dir, [
      "run",
      "./apps.ts",
      "-m",
      "m",
      "-b",
      model.url,
      "-o",
      "out",
      "--env.agent.scoring.mode",
      "isolated",
      "--env.agent.scoring.services",
      "true",
    ]);
    runIds.push(iso.runId);
    assert.equal(iso.code, 0, transcript(iso));
    const [graded] = (await Deno.readTextFile(join(iso.runDir, "traces.jsonl"))).trim()
      .split("\n").map((l) => JSON.parse(l));
    assert.equal(graded.error, null);
    assert.equal(graded.scoring.mode, "isolated");
    assert.deepEqual(graded.rewards, { stored: 0 });
    assert.equal(graded.metrics.app_up, 1);
    assert.deepEqual(await leftovers(iso.runId), { containers: 0, networks: 0 });

    await Deno.writeTextFile(
      join(dir, "bad.yaml"),
      'services:\n  app:\n    image: busybox:latest\n    volumes: ["data:/data"]\n',
    );
    const bad = await run(dir, [
      "run",
      "./apps.ts",
      "-m",
      "m",
      "-b",
      model.url,
      "-o",
      "out",
      "--env.taskset.task.compose",
      "bad.yaml",
    ]);
    runIds.push(bad.runId);
    assert.equal(bad.code, 1, transcript(bad));
    assert.match(
      bad.stderr + JSON.stringify(bad.stdout),
      /services\.app\.volumes\[0\]: volume "data" is not declared under the top-level volumes/,
    );

    // A service that never becomes healthy: an infrastructure error, never reward 0.
    await Deno.writeTextFile(
      join(dir, "sick.yaml"),
      'services:\n  app:\n    image: busybox:latest\n    command: ["sleep", "600"]\n' +
        '    healthcheck:\n      test: ["CMD", "false"]\n      interval: 200ms\n      retries: 1\n',
    );
    const sick = await run(dir, [
      "run",
      "./apps.ts",
      "-m",
      "m",
      "-b",
      model.url,
      "-o",
      "out",
      "--env.taskset.task.compose",
      "sick.yaml",
    ]);
    runIds.push(sick.runId);
    assert.equal(sick.code, 1, transcript(sick));
    assert.match(sick.stderr, /Service "app" never became healthy/);
    assert.match(sick.stdout, /reward n\/a/);
    assert.deepEqual(await leftovers(sick.runId), { containers: 0, networks: 0 });
  } finally {
    for (const id of runIds.filter(Boolean)) await cleanupContainers({ runId: id });
    await Deno.remove(dir, { recursive: true });
  }
});

/** Start `vf run` with services, wait until the agent is mid-rollout, then send `signal`. */
async function interruptMidRollout(
  dir: string,
  modelUrl: string,
  signal: Deno.Signal,
): Promise<{ runId: string; status: Deno.CommandStatus; stderr: string }> {
  const child = cliCommand(["run", "./apps.ts", "-m", "m", "-b", modelUrl, "-o", "out"], {
    cwd: dir,
    env: {},
    registry: false,
    docker: true,
    stdout: "null",
  }).spawn();
  const reader = child.stderr.pipeThrough(new TextDecoderStream()).getReader();
  let stderr = "";
  try {
    while (!/^Saving traces to (.+)$/m.test(stderr)) {
      const { value, done } = await reader.read();
      if (done) throw new Error(`the CLI ended before announcing its run:\n${stderr}`);
      stderr += value;
    }
    const runId = basename(/^Saving traces to (.+)$/m.exec(stderr)![1]);
    const draining = (async () => {
      for (let r = await reader.read(); !r.done; r = await reader.read()) stderr += r.value;
    })();
    // The agent's sandbox and both services are up once the model has been asked.
    const deadline = Date.now() + 60_000;
    while ((await leftovers(runId)).containers < 3) {
      assert.ok(Date.now() < deadline, `no rollout with services after 60s:\n${stderr}`);
      await new Promise((r) => setTimeout(r, 200));
    }
    child.kill(signal);
    const status = await child.status;
    await draining;
    return { runId, status, stderr };
  } catch (error) {
    child.kill("SIGKILL");
    await child.status;
    throw error;
  }
}

Deno.test("services: SIGINT mid-rollout removes the services and their network; after SIGKILL, vf cleanup --run does", async () => {
  const dir = await Deno.makeTempDir({ prefix: "vf_services_int_" });
  const runIds: string[] = [];
  try {
    // The model never answers: the rollout waits, with everything up, until it is stopped.
    await using model = await startModelServer({ responder: () => ({ hang: true }) });
    await Deno.writeTextFile(join(dir, "apps.ts"), TASKSET);
    await Deno.writeTextFile(join(dir, "compose.yaml"), COMPOSE);

    const interrupted = await interruptMidRollout(dir, model.url, "SIGINT");
    runIds.push(interrupted.runId);
    assert.equal(interrupted.status.code, 130, interrupted.stderr);
    assert.deepEqual(await leftovers(interrupted.runId), { containers: 0, networks: 0 });

    const killed = await interruptMidRollout(dir, model.url, "SIGKILL");
    runIds.push(killed.runId);
    assert.equal(killed.status.signal, "SIGKILL");
    const left = await leftovers(killed.runId);
    assert.deepEqual(left, { containers: 3, networks: 1 }, "a killed evaluator stops nothing");
    const cleanup = await run(dir, ["cleanup", "--run", killed.runId]);
    assert.equal(cleanup.code, 0, transcript(cleanup));
    assert.deepEqual(await leftovers(killed.runId), { containers: 0, networks: 0 });
  } finally {
    for (const id of runIds.filter(Boolean)) await cleanupContainers({ runId: id });
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("services: build from a folder with a Dockerfile (POST /build, offline from a local base image, .dockerignore honoured), reused by content hash", async () => {
  const dir = await Deno.makeTempDir({ prefix: "vf_services_build_" });
  const runIds: string[] = [];
  try {
    await using model = await startModelServer({
      responder: ({ body }) =>
        body.messages.some((m) => m.role === "tool") ? { content: "Stored." } : {
          content: null,
          tool_calls: [{
            name: "bash",
            arguments: { command: 'wget -qO- "http://app:8080/cgi-bin/put?v=42"' },
          }],
        },
    });
    await Deno.mkdir(join(dir, "app/www/cgi-bin"), { recursive: true });
    await Deno.writeTextFile(
      join(dir, "app/Dockerfile"),
      // .dockerignore keeps secret.txt out of the context: the build checks it is not there.
      'FROM busybox:latest\nCOPY www /www\nRUN chmod +x /www/cgi-bin/put && test ! -e /www/secret.txt\nCMD ["httpd", "-f", "-p", "8080", "-h", "/www"]\n',
    );
    await Deno.writeTextFile(
      join(dir, "app/www/cgi-bin/put"),
      '#!/bin/sh\necho "hello ${QUERY_STRING#v=}" > /www/state.txt\nprintf "Content-Type: text/plain\\r\\n\\r\\nstored\\n"\n',
    );
    await Deno.writeTextFile(join(dir, "app/www/index.html"), "ok\n");
    await Deno.writeTextFile(join(dir, "app/www/secret.txt"), "do not ship\n");
    await Deno.writeTextFile(
      join(dir, "app/.dockerignore"),
      "# not for the image\nwww/secret.txt\n",
    );
    await Deno.writeTextFile(
      join(dir, "compose.yaml"),
      "services:\n  app:\n    build: ./app\n    healthcheck:\n" +
        '      test: ["CMD", "wget", "-q", "-O", "/dev/null", "http://127.0.0.1:8080/index.html"]\n' +
        "      interval: 200ms\n      retries: 50\n",
    );
    await Deno.writeTextFile(join(dir, "apps.ts"), TASKSET);
    const builtImages = async () =>
      (await engineJson(
        `/images/json?filters=${
          encodeURIComponent(JSON.stringify({ reference: ["vf-build-app"] }))
        }`,
      )).map((i: Json) => i.Id).sort();
    const after: string[][] = [];
    for (let i = 0; i < 2; i++) {
      const res = await run(dir, ["run", "./apps.ts", "-m", "m", "-b", model.url, "-o", "out"]);
      runIds.push(res.runId);
      assert.equal(res.code, 0, transcript(res));
      const [trace] = (await Deno.readTextFile(join(res.runDir, "traces.jsonl"))).trim()
        .split("\n").map((l) => JSON.parse(l));
      assert.deepEqual(trace.rewards, { stored: 1 }, JSON.stringify(trace.error));
      after.push(await builtImages());
    }
    assert.ok(after[0].length >= 1);
    assert.deepEqual(after[1], after[0], "the second run reused the image built by the first");
  } finally {
    for (const id of runIds.filter(Boolean)) await cleanupContainers({ runId: id });
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("image builds: the build log streams to a file, an unchanged folder is not rebuilt, and vf cleanup --images removes vf's dangling builds and keeps tagged ones", async () => {
  const dir = await Deno.makeTempDir({ prefix: "vf_build_log_" });
  const engine = DockerEngine.shared();
  const made: string[] = [];
  try {
    const marker = `built-${crypto.randomUUID().slice(0, 8)}`;
    const ctx = join(dir, "ctx");
    await Deno.mkdir(ctx);
    await Deno.writeTextFile(join(ctx, "Dockerfile"), `FROM busybox:latest\nRUN echo ${marker}\n`);
    const logs = join(dir, "logs");
    const tag = await buildImage("logged", ctx, { logDir: logs });
    made.push(tag);
    const logFile = join(logs, `${tag.replace(/[:/]/g, "-")}.log`);
    const log = await Deno.readTextFile(logFile);
    assert.match(log, /FROM busybox:latest/);
    assert.match(log, new RegExp(`^${marker}$`, "m")); // the RUN step's own output
    await Deno.remove(logFile);
    assert.equal(await buildImage("logged", ctx, { logDir: logs }), tag);
    await assert.rejects(Deno.stat(logFile)); // nothing was built the second time

    // Two builds under one tag: the first is left dangling, as a changed task's older build.
    const shared = `vf-test-dangling:${marker}`;
    const ids: string[] = [];
    for (const step of ["one", "two"]) {
      await Deno.writeTextFile(
        join(ctx, "Dockerfile"),
        `FROM busybox:latest\nRUN echo ${step} > /v\n`,
      );
      ids.push(
        await engine.buildImage(packTar(await folderEntries(ctx)), {
          tag: shared,
          labels: { "vf.managed": "1" },
        }),
      );
    }
    made.push(shared);
    assert.notEqual(ids[0], ids[1]);
    const res = await collect(
      // Only images: no run of this id has sandboxes, and the ledger is this test's own.
      cliCommand(["cleanup", "--images", "--run", `none-${marker}`], {
        cwd: dir,
        env: { VF_LEDGER: join(dir, "ledger.jsonl") },
        registry: false,
        docker: true,
      }),
    );
    assert.equal(res.code, 0, transcript(res));
    assert.match(res.stdout, /removed \d+ dangling build images?/);
    assert.equal(await engine.inspectImage(ids[0]), undefined);
    assert.ok(await engine.inspectImage(shared));
    assert.ok(await engine.inspectImage(tag));
  } finally {
    for (const image of made) await engine.removeImage(image).catch(() => {});
    await Deno.remove(dir, { recursive: true });
  }
});

const LAYERED = `
services:
  writer:
    image: busybox:latest
    command: ["sh", "-c", "echo from-volume > /data/v.txt && exec sleep 600"]
    volumes: ["shared:/data"]
    networks: [backend]
    healthcheck:
      test: ["CMD", "test", "-f", "/data/v.txt"]
      interval: 200ms
      retries: 50
  web:
    image: busybox:latest
    depends_on:
      writer: { condition: service_healthy }
    command: ["httpd", "-f", "-p", "8080", "-h", "/srv"]
    volumes:
      - shared:/srv/data:ro
      - type: bind
        source: ./static
        target: /srv/static
        read_only: true
    networks:
      default: {}
      backend: { aliases: [frontend] }
volumes:
  shared: {}
networks:
  backend: {}
`;

const LAYERED_TASKSET = `
import { reward, Task, Taskset } from "${MOD_URL}";
class Layered extends Task {
  static override NEEDS_CONTAINER = true;
  override deploymentSpec() { return "layered.yaml"; }
  served = reward(async ({ runtime }) => {
    const get = async (path) => (await runtime.run(["wget", "-qO-", "http://web:8080/" + path])).stdout.trim();
    return (await get("data/v.txt")) === "from-volume" && (await get("static/hello.txt")) === "from-folder" ? 1 : 0;
  });
}
class Set extends Taskset {
  get id() { return "layered"; }
  *load() { yield new Layered({ id: "layered", prompt: "Look around.", image: "busybox:latest" }); }
}
export function loadTaskset(config) { return new Set(config); }
`;

Deno.test("services: Compose volumes (named, fresh per rollout, and binds within the task folder) and networks (a service off the agent's network is out of its reach); nothing is left after", async () => {
  const dir = await Deno.makeTempDir({ prefix: "vf_services_layers_" });
  const runIds: string[] = [];
  try {
    await Deno.mkdir(join(dir, "static"));
    await Deno.writeTextFile(join(dir, "static/hello.txt"), "from-folder\n");
    await Deno.writeTextFile(join(dir, "layered.yaml"), LAYERED);
    await Deno.writeTextFile(join(dir, "layered.ts"), LAYERED_TASKSET);
    await using model = await startModelServer({
      responder: ({ body }) => {
        const turn = body.messages.filter((m) => m.role === "assistant").length;
        const command = [
          "wget -qO- http://web:8080/data/v.txt; wget -qO- http://web:8080/static/hello.txt",
          "wget -qO- http://writer:8080/ 2>&1 || echo UNREACHABLE",
        ][turn];
        return command
          ? { content: null, tool_calls: [{ name: "bash", arguments: { command } }] }
          : { content: "Done." };
      },
    });
    const res = await run(dir, ["run", "./layered.ts", "-m", "m", "-b", model.url, "-o", "out"]);
    runIds.push(res.runId);
    assert.equal(res.code, 0, transcript(res));
    const [trace] = (await Deno.readTextFile(join(res.runDir, "traces.jsonl"))).trim()
      .split("\n").map((l) => JSON.parse(l));
    assert.equal(trace.error, null);
    assert.equal(trace.reward, 1);
    assert.match(trace.tool_calls[0].output, /from-volume\nfrom-folder/);
    assert.match(trace.tool_calls[1].output, /UNREACHABLE/);
    assert.deepEqual(await leftovers(res.runId), { containers: 0, networks: 0 });
    const filters = encodeURIComponent(JSON.stringify({ label: [`vf.run_id=${res.runId}`] }));
    assert.deepEqual((await engineJson(`/volumes?filters=${filters}`)).Volumes ?? [], []);

    // A bind mount from outside the task folder is refused, naming the key.
    await Deno.writeTextFile(
      join(dir, "layered.yaml"),
      'services:\n  web:\n    image: busybox:latest\n    volumes: ["../../etc:/x"]\n',
    );
    const bad = await run(dir, ["run", "./layered.ts", "-m", "m", "-b", model.url, "-o", "out"]);
    runIds.push(bad.runId);
    assert.notEqual(bad.code, 0);
    assert.match(
      bad.stderr + bad.stdout,
      /services\.web\.volumes\[0\]: "\.\.\/\.\.\/etc" is outside the task folder/,
    );
  } finally {
    for (const id of runIds.filter(Boolean)) await cleanupContainers({ runId: id });
    await Deno.remove(dir, { recursive: true });
  }
});

/**
 * A task with a Compose service "db" that scores 1 whenever the service answers by name: it is
 * there on the sandbox's network (the grader's own, when isolated), so any probe "games" it.
 */
const DB_TASK = `
import { reward, Task, Taskset } from "${MOD_URL}";
class DbTask extends Task {
  static override NEEDS_CONTAINER = true;
  override deploymentSpec() { return "compose.yaml"; }
  db_known = reward(async ({ runtime }) => {
    const r = await runtime.run(["nslookup", "db"]);
    return r.exit_code === 0 ? 1 : 0;
  });
}
`;

const LIMITED_TASKSET = `${DB_TASK}
class Dbs extends Taskset {
  get id() { return "dbs"; }
  *load() { yield new DbTask({ id: "db", prompt: "Nothing to do.", image: "busybox:latest" }); }
}
export function loadTaskset(config) { return new Dbs(config); }
`;

Deno.test("services count against [limits] max_sandboxes: a sandbox and its services are taken together, isolated grading with services of its own does not deadlock, and a limit that can never fit them is a clear error", async () => {
  const dir = await Deno.makeTempDir({ prefix: "vf_services_limits_" });
  const runIds: string[] = [];
  await using model = await startModelServer({ responder: () => ({ content: "Done." }) });
  await Deno.writeTextFile(join(dir, "dbs.ts"), LIMITED_TASKSET);
  await Deno.writeTextFile(
    join(dir, "compose.yaml"),
    'services:\n  db:\n    image: busybox:latest\n    command: ["sleep", "600"]\n',
  );
  // Every vf container's creation and removal, as the engine reports them.
  await using events = new EngineEvents();
  await events.ready();
  try {
    const common = [
      "run",
      "./dbs.ts",
      "-m",
      "m",
      "-b",
      model.url,
      "-o",
      "out",
      "-r",
      "3",
      "-c",
      "3",
    ];
    for (const mode of ["shared", "isolated"]) {
      const res = await run(dir, [
        ...common,
        "--limits.max_sandboxes",
        "2",
        "--env.agent.scoring.mode",
        mode,
        "--env.agent.scoring.services",
        "true",
      ]);
      runIds.push(res.runId);
      assert.equal(res.code, 0, transcript(res));
      const traces = (await Deno.readTextFile(join(res.runDir, "traces.jsonl"))).trim()
        .split("\n").map((l) => JSON.parse(l));
      assert.equal(traces.length, 3);
      for (const t of traces) {
        assert.equal(t.error, null, JSON.stringify(t.error));
        assert.deepEqual(t.rewards, { db_known: 1 });
        assert.equal(t.scoring.mode, mode);
      }
      // Each sandbox needs one service beside it: with 2 slots, one pair at a time. Without
      // the services counted (or with a sandbox on its own network not counted at all, as
      // before), three rollouts at once held up to six containers.
      assert.equal(events.maxLive(res.runId), 2, `${mode}: ${events.maxLive(res.runId)} at once`);
      assert.deepEqual(await leftovers(res.runId), { containers: 0, networks: 0 });
    }
    // A sandbox and its service can never fit one slot: said before anything starts.
    const tight = await run(dir, [...common, "--limits.max_sandboxes", "1"]);
    runIds.push(tight.runId);
    assert.ok(tight.runId, transcript(tight));
    assert.notEqual(tight.code, 0, transcript(tight));
    assert.match(
      tight.stderr + (await Deno.readTextFile(join(tight.runDir, "traces.jsonl")).catch(() => "")),
      /needs 2 docker containers at once \(its sandbox, 1 service\), more than \[limits\] max_sandboxes = 1 allows/,
    );
    assert.deepEqual(events.of(tight.runId), [], "something started under a limit it cannot fit");
  } finally {
    for (const id of runIds) if (id) await cleanupContainers({ runId: id });
    await Deno.remove(dir, { recursive: true });
  }
});

const PROBED_TASKSET = `${DB_TASK}
class Dbs extends Taskset {
  get id() { return "dbs"; }
  *load() {
    const base = { prompt: "Nothing to do.", image: "busybox:latest" };
    yield new DbTask({ ...base, id: "shared" });
    yield new DbTask({ ...base, id: "graded-with-db", scoring: { mode: "isolated", services: true } });
    yield new DbTask({ ...base, id: "graded-alone", scoring: { mode: "isolated" } });
  }
}
export function loadTaskset(config) { return new Dbs(config); }
`;

Deno.test("vf validate --probe runs each probe with the task's services, and grades it where a run would: the grader has them only with scoring.services", async () => {
  const dir = await Deno.makeTempDir({ prefix: "vf_services_probe_" });
  let runId = "";
  try {
    await Deno.writeTextFile(join(dir, "dbs.ts"), PROBED_TASKSET);
    await Deno.writeTextFile(
      join(dir, "compose.yaml"),
      'services:\n  db:\n    image: busybox:latest\n    command: ["sleep", "600"]\n',
    );
    const res = await run(dir, ["validate", "./dbs.ts", "--probe", "-c", "3"]);
    // Every task scores 1 untouched (the db answers), so each one fails validation.
    assert.equal(res.code, 1, transcript(res));
    const summary = JSON.parse(res.stdout.trim().split("\n").at(-1)!);
    runId = summary.run_id;
    const probes = Object.fromEntries(
      (summary.results as Json[]).map((r) => [
        r.task,
        (r.probes as Json[]).map((p) => [p.error, p.reward]),
      ]),
    );
    const each = (reward: number) => probes.shared.map(() => [null, reward]);
    assert.ok(probes.shared.length > 0);
    assert.deepEqual(probes.shared, each(1), "probes of a shared task see its service");
    assert.deepEqual(probes["graded-with-db"], each(1), "a grader with scoring.services has one");
    assert.deepEqual(probes["graded-alone"], each(0), "a grader without it has none, as in a run");
    assert.deepEqual(await leftovers(runId), { containers: 0, networks: 0 });
  } finally {
    if (runId) await cleanupContainers({ runId });
    await Deno.remove(dir, { recursive: true });
  }
});
