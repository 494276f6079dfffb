/**
 * A Harbor task with a separate verifier, run through the real CLI on real Docker with a
 * scripted model, watched through the Engine API's event stream: the agent's container is
 * removed before the verifier's is created, so nothing the agent left running (here a
 * daemon) overlaps grading.
 * @module
 */
import assert from "node:assert/strict";
import { basename, join } from "node:path";
import { cleanupContainers } from "../mod.ts";
import { startModelServer, type WireMessage } from "./model_server.ts";
import { cliCommand, collect, transcript } from "./_cli.ts";
import { type EngineEvent, EngineEvents } from "./_engine_events.ts";

async function write(root: string, files: Record<string, string>): Promise<void> {
  for (const [path, text] of Object.entries(files)) {
    const full = join(root, path);
    await Deno.mkdir(join(full, ".."), { recursive: true });
    await Deno.writeTextFile(full, text);
  }
}

const TASK = {
  "sep/instruction.md": "Write 42 to /app/answer.txt.\n",
  "sep/task.toml": `schema_version = "1.3"
artifacts = ["/app/answer.txt"]
[agent]
timeout_sec = 120.0
[verifier]
timeout_sec = 60.0
environment_mode = "separate"
`,
  "sep/environment/Dockerfile": "FROM busybox:latest\nRUN mkdir -p /app\nWORKDIR /app\n",
  "sep/tests/test.sh":
    '#!/bin/sh\nif [ "$(cat /app/answer.txt)" = 42 ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt\n',
  "sep/solution/solve.sh": "#!/bin/sh\necho 42 > /app/answer.txt\n",
};

/** Poll `events` (bounded) until `ready` holds of the run's events. */
async function waitFor(
  events: EngineEvents,
  runId: string,
  ready: (es: EngineEvent[]) => boolean,
): Promise<EngineEvent[]> {
  const deadline = Date.now() + 60_000;
  while (!ready(events.of(runId))) {
    if (Date.now() > deadline) {
      throw new Error(`events of run ${runId}: ${JSON.stringify(events.of(runId))}`);
    }
    await new Promise((r) => setTimeout(r, 100));
  }
  return events.of(runId);
}

Deno.test("Harbor separate verifier: the agent's container is removed before the verifier's is created, though the agent left a daemon running", async () => {
  const dir = await Deno.makeTempDir({ prefix: "vf_harbor_sep_gone_" });
  let runId = "";
  try {
    await write(dir, TASK);
    await using events = new EngineEvents();
    await events.ready();
    await using model = await startModelServer({
      responder: ({ body }) => {
        const turn = body.messages.filter((m: WireMessage) => m.role === "assistant").length;
        const command =
          "echo 42 > /app/answer.txt; (while true; do sleep 1; done) >/dev/null 2>&1 &";
        return turn === 0
          ? { content: null, tool_calls: [{ name: "bash", arguments: { command } }] }
          : { content: "Done." };
      },
    });
    const res = await collect(
      cliCommand(["run", "./sep", "-m", "m", "-b", model.url, "-o", "out"], {
        cwd: dir,
        env: {},
        registry: false,
        docker: true,
      }),
    );
    const runDir = /^Saving traces to (.+)$/m.exec(res.stderr)?.[1] ?? "";
    runId = basename(runDir);
    assert.equal(res.code, 0, transcript(res));
    const [t] = (await Deno.readTextFile(join(runDir, "traces.jsonl"))).trim().split("\n")
      .map((l) => JSON.parse(l));
    assert.equal(t.error, null, JSON.stringify(t.error));
    assert.equal(t.reward, 1);
    assert.equal(t.scoring.mode, "isolated");

    const role = (e: EngineEvent, r: string, action: string) =>
      e.labels["vf.role"] === r && e.action === action;
    const es = await waitFor(
      events,
      runId,
      (es) =>
        es.some((e) => role(e, "agent", "destroy")) && es.some((e) => role(e, "grader", "create")),
    );
    const agentGone = es.find((e) => role(e, "agent", "destroy"))!;
    const graderMade = es.find((e) => role(e, "grader", "create"))!;
    assert.ok(
      agentGone.timeNano < graderMade.timeNano,
      `the grader was created ${
        (agentGone.timeNano - graderMade.timeNano) / 1e6
      } ms before the agent's container was removed`,
    );
    // The order in the stream says the same (the engine emits in order).
    assert.ok(es.indexOf(agentGone) < es.indexOf(graderMade), JSON.stringify(es));
  } finally {
    if (runId) await cleanupContainers({ runId });
    await Deno.remove(dir, { recursive: true });
  }
});
