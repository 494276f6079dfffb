/**
 * The readers of run files that print to a terminal (`vf compare`, `vf export`, `vf replay`,
 * the end-of-run summaries, the corrupt-line warnings, the CLI's error line) show what the
 * files hold as text: run files are written by environment code, and an escape sequence in a
 * task key, a reward name, a stop condition or an error message would otherwise clear the
 * screen, retitle the window, hide a line or fake one. `vf export` also writes files named
 * after a trace's fields: none of them may lead outside the folder it was given.
 * @module
 */
import assert from "node:assert/strict";
import { existsSync } from "node:fs";
import { join } from "node:path";
import { renderSummary } from "../lib/eval/progress.ts";
import type { RunMetadata } from "../lib/eval/results.ts";
import type { RolloutOutput } from "../lib/state.ts";
import { renderTaskSummary, summarizeTraces } from "../lib/tasks/summary.ts";
import type { TaskTrace } from "../lib/tasks/trace.ts";
import { ModelCache } from "../lib/model/cache.ts";
import { MOD_URL, runCli, tempDir, transcript } from "./_cli.ts";
import { startModelServer } from "./model_server.ts";
import { traceLine as trace } from "./_trace_fixture.ts";

// deno-lint-ignore no-explicit-any
type Json = any;

/** Escapes a hostile file would use: clear screen, home, OSC title and hyperlink, C1 CSI, bidi. */
const EVIL = "\x1b[2J\x1b[H\x1b]0;owned\x07\x1b]8;;file:///etc/passwd\x1b\\link\x1b]8;;\x1b\\" +
  "\x9b31m\r\u202e";

/** No escape, bell, carriage return, C1 control or bidi override is left in `text`. */
function assertInert(text: string, where: string) {
  // deno-lint-ignore no-control-regex
  const bad = /[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]/.exec(text);
  assert.equal(bad, null, `${where}: control character ${JSON.stringify(bad?.[0])} in ${text}`);
}

Deno.test("vf compare, vf export and the CLI's error line print run files' escape sequences as inert text, and vf export writes no file outside its folder", async () => {
  await using tmp = await tempDir("vf_term_");
  const a = join(tmp.path, "a");
  const b = join(tmp.path, "b");
  await Deno.mkdir(a);
  await Deno.mkdir(b);
  const key = `task${EVIL}1`;
  await Deno.writeTextFile(
    join(a, "traces.jsonl"),
    [trace(key, 1), trace("plain", 1)].map((t) => JSON.stringify(t)).join("\n") +
      // A torn line whose JSON error quotes an escape.
      `\n{"task": "\x1b]0;torn\x07\x1b[2J`,
  );
  await Deno.writeTextFile(
    join(b, "traces.jsonl"),
    [trace(key, 0), trace("plain", 1)].map((t) => JSON.stringify(t)).join("\n") + "\n",
  );
  const opts = { cwd: tmp.path, registry: false } as const;

  const cmp = await runCli(["compare", a, b], opts);
  assert.equal(cmp.code, 0, transcript(cmp));
  assertInert(cmp.stdout, "vf compare stdout");
  assertInert(cmp.stderr, "vf compare stderr");
  // The drop is listed, by the key's visible text, on a line of its own.
  assert.match(cmp.stdout, /^ {2}task.*link.*1 {2}1\.000 -> 0\.000 {2}\(-1\.0000\)$/m, cmp.stdout);
  assert.match(cmp.stderr, /a\/traces\.jsonl:3: skipping a corrupt line \(malformed JSON/);

  // vf export: a trace id that is a path (a rollout_index that is one is not a trace: it is
  // skipped by file and line), and escapes in what its warnings quote.
  // The output folder (argv) carries escapes too: vf export names it when it is done.
  const out = join(tmp.path, "deep", "atif\x1b]0;owned\x07\x1b[2J");
  const escape = join(tmp.path, "escaped");
  await Deno.writeTextFile(
    join(a, "traces.jsonl"),
    JSON.stringify(trace("k", 1, { trace_id: "/../../../escaped" })) + "\n" +
      JSON.stringify(trace("j", 1, { rollout_index: "/../../../escaped" })) + "\n" +
      JSON.stringify(trace("bad", 1, { trace_id: `id${EVIL}`, messages: 5 })) + "\n" +
      JSON.stringify(trace("worse", 1, { trace_id: `id${EVIL}`, usage: undefined })) + "\n",
  );
  const exp = await runCli(["export", "--format", "atif", a, "-o", out], opts);
  assert.equal(exp.code, 0, transcript(exp));
  assertInert(exp.stdout, "vf export stdout");
  assertInert(exp.stderr, "vf export stderr");
  assert.match(exp.stdout, /wrote 1 ATIF trajectory/);
  assert.match(exp.stderr, /skipping trace "id.*link.*" of task "worse": not a trace vf can write/);
  assert.match(exp.stderr, /traces\.jsonl:2: skipping a corrupt line \("rollout_index" is not/);
  assert.equal(existsSync(escape), false);
  assert.equal(existsSync(escape + ".json"), false);
  const written = [...Deno.readDirSync(out)].map((e) => e.name);
  assert.equal(written.length, 1, written.join(" "));
  assert.doesNotMatch(written[0], /\//);
  assert.ok(written[0].startsWith("k-"), written[0]);
  for (const e of Deno.readDirSync(tmp.path)) {
    assert.ok(["a", "b", "deep"].includes(e.name), `vf export wrote ${e.name} outside its folder`);
  }

  // The CLI's error line: a config.json key that carries escapes, named in the error.
  await Deno.writeTextFile(join(b, "record.jsonl"), "");
  await Deno.writeTextFile(join(b, "config.json"), JSON.stringify({ model: "m", [EVIL]: 1 }));
  const replay = await runCli(["replay", b], opts);
  assert.equal(replay.code, 1, transcript(replay));
  assert.match(replay.stderr, /^error: .*config\.json/m);
  assertInert(replay.stderr, "vf replay stderr");
});

Deno.test("the end-of-run summaries of vf eval and vf run print names, stop conditions and error messages from the environment as inert text", () => {
  const outputs = [
    { example_id: 0, reward: 1, metrics: { [`m${EVIL}`]: 1 }, stop_condition: `stop${EVIL}` },
    {
      example_id: 1,
      reward: 0,
      metrics: { [`m${EVIL}`]: 0 },
      stop_condition: "has_error",
      error: { error: `Tool${EVIL}Error`, message: `out\n${EVIL}reward 1.0000` },
    },
  ] as unknown as RolloutOutput[];
  const metadata = {
    env_id: `env${EVIL}`,
    model: "m",
    num_examples: 2,
    rollouts_per_example: 1,
    num_rollouts: 2,
    time_ms: 10,
    avg_reward: 0.5,
    avg_metrics: { [`m${EVIL}`]: 0.5 },
    avg_error: 0.5,
    pass_at_k: {},
    pass_all_k: {},
    usage: null,
    num_unscored: 0,
    num_model_retries: 0,
  } as unknown as RunMetadata;
  const evalText = renderSummary(metadata, outputs);
  assertInert(evalText, "renderSummary");
  assert.match(evalText, /stop conditions: stop.*link.* 1/);
  // An error message's newline is shown, not obeyed: no line of its own that fakes a reward.
  assert.doesNotMatch(evalText, /^reward 1\.0000/m);
  assert.match(evalText, /1 × Tool.*Error: out\\x0a.*reward 1\.0000/);

  const traces = [
    trace("a", 1, { rewards: { [`r${EVIL}`]: 1 }, metrics: { [`x${EVIL}`]: 2 }, role: "agent" }),
    trace("b", 0, { rewards: { [`r${EVIL}`]: 0 }, metrics: { [`x${EVIL}`]: 1 } }),
  ] as unknown as TaskTrace[];
  const summary = summarizeTraces(traces, {
    run_id: "r",
    taskset: `ts${EVIL}`,
    model: "m",
    env_id: "single-agent",
    num_tasks: 2,
    rollouts_per_task: 1,
  });
  const taskText = renderTaskSummary(summary);
  assertInert(taskText, "renderTaskSummary");
  assert.match(taskText, /^ {2}reward "r.*link.*": 0\.5000$/m);
  assert.match(taskText, /^ {2}metric x.*link.*: 1\.5000$/m);
});

Deno.test("a warning that quotes a Harbor task folder's name prints it as inert text", async () => {
  await using dir = await tempDir("vf_escapes_harbor_");
  const name = "x\x1b]0;owned\x07\x1b[2Jy";
  await Deno.mkdir(join(dir.path, "ds", name), { recursive: true });
  await Deno.writeTextFile(
    join(dir.path, "ds", name, "task.toml"),
    '[verifier]\ntimeout_sec = "abc"\n',
  );
  await Deno.writeTextFile(join(dir.path, "ds", name, "instruction.md"), "do it\n");
  const res = await runCli(["validate", "./ds"], { cwd: dir.path });
  assert.notEqual(res.code, 0, transcript(res));
  // The broken task's warning names it, with the escapes gone.
  assert.ok(res.stderr.includes('Harbor task "xy": '), transcript(res));
  assertInert(res.stderr, "vf validate's stderr");
});

/** A taskset whose id, task key and reward's error carry {@link EVIL}. */
const HOSTILE_TASKSET = `
import { reward, Task, Taskset } from "${MOD_URL}";
const EVIL = ${JSON.stringify(EVIL)};
class T extends Task {
  static override HARNESS = "null";
  broken = reward(() => { throw new Error("boom" + EVIL + "reward 1.000"); });
}
class S extends Taskset {
  get id() { return "ts" + EVIL; }
  *load() { yield new T({ id: "task" + EVIL, prompt: "hi" }, this.config.task); }
}
export function loadTaskset(config) { return new S(config); }
`;

Deno.test("vf eval of a taskset prints its progress lines, run folder and summary as inert text when the taskset's names and errors carry escapes", async () => {
  await using tmp = await tempDir("vf_escapes_run_");
  await using server = await startModelServer({ responder: () => ({ content: "hello" }) });
  await Deno.writeTextFile(join(tmp.path, "hostile.ts"), HOSTILE_TASKSET);
  await Deno.writeTextFile(
    join(tmp.path, "run.toml"),
    `model = "m"\n[client]\nbase_url = "${server.url}"\n[env.taskset]\nid = "./hostile.ts"\n` +
      `[env.agent.runtime]\ntype = "subprocess"\n`,
  );
  const out = `out${EVIL}`;
  const res = await runCli(["eval", "@", "run.toml", "-o", out], {
    cwd: tmp.path,
    registry: false,
  });
  assertInert(res.stdout, "vf eval stdout");
  assertInert(res.stderr, "vf eval stderr");
  // The progress line names the task and the error by their visible text, on one line.
  assert.match(
    res.stderr,
    /^ts.*link.* 1\/1 .*task task.*link.* reward error \(scoring: .*boom.*link/m,
  );
  assert.match(res.stderr, /^Saving traces to .*out.*link/m, transcript(res));
  // The run is written where it was asked, the escapes and all.
  assert.ok(existsSync(join(tmp.path, out, "evals")), transcript(res));
});

Deno.test("vf cache stats, vf ctl and an unknown command print a path, a model name and argv with escapes as inert text", async () => {
  await using tmp = await tempDir("vf_escapes_cli_");
  const db = join(tmp.path, `cache${EVIL}.sqlite`);
  const cache = await ModelCache.open(db);
  assert.ok(cache);
  cache.put("k", `model${EVIL}`, {} as Parameters<ModelCache["put"]>[2]);
  cache.close();
  const opts = { cwd: tmp.path, registry: false } as const;
  const stats = await runCli(["cache", "stats", "--path", db], opts);
  assert.equal(stats.code, 0, transcript(stats));
  assertInert(stats.stdout, "vf cache stats stdout");
  assert.match(stats.stdout, /cache.*link.*\.sqlite: 1 cached response,/);
  assert.match(stats.stdout, /^ {2}model.*link.*: 1$/m);
  const missing = await runCli(["cache", "stats", "--path", `${db}.gone`], opts);
  assertInert(missing.stdout, "vf cache stats stdout (no cache)");
  assert.match(missing.stdout, /^no model cache at .*link/m);

  const ctl = await runCli(["ctl", "status"], {
    ...opts,
    env: { VF_CTL_DIR: join(tmp.path, `ctl${EVIL}`) },
  });
  assert.equal(ctl.code, 1, transcript(ctl));
  assertInert(ctl.stderr, "vf ctl stderr");
  assert.match(ctl.stderr, /^error: no run has a control socket in ".*ctl.*link.*"$/m);

  const unknown = await runCli([`run${EVIL}`], opts);
  assert.equal(unknown.code, 2, transcript(unknown));
  assertInert(unknown.stderr, "vf's stderr for an unknown command");
  assert.match(unknown.stderr, /^error: unknown command "run.*link.*"; run vf --help$/m);
});
