/**
 * Hooks plugged in from the task config, end to end through `vf eval @ run.toml`: a reward
 * added from a file, a task reward re-weighted, a stop condition that ends the rollout before
 * the model is called again; and the errors a bad entry gets.
 * @module
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { startModelServer } from "./model_server.ts";
import { cliCommand, type CliResult, collect, MOD_URL, transcript } from "./_cli.ts";

const TASKSET = `
import { reward, Task, Taskset } from "${MOD_URL}";
class ChatTask extends Task {
  static override HARNESS = "null";
  replied = reward(({ trace }) => (trace.messages.some((m) => m.role === "assistant") ? 1 : 0));
  // Scripted follow-ups keep the conversation going until a stop ends it.
  override userMessage({ turn }) {
    return turn < 5 ? "go on" : null;
  }
}
class Chats extends Taskset {
  get id() { return "chats"; }
  *load() { yield new ChatTask({ id: "c", prompt: "count" }, this.config.task); }
}
export function loadTaskset(config) { return new Chats(config); }
`;

const HOOKS = `
export function bonus({ trace }) {
  return trace.messages.filter((m) => m.role === "assistant").length;
}
// Stop before the third model call.
export function tooLong({ turn }) {
  return turn >= 2;
}
`;

async function run(dir: string, toml: string): Promise<CliResult> {
  await Deno.writeTextFile(join(dir, "run.toml"), toml);
  return await collect(
    cliCommand(["eval", "@", "run.toml", "-o", "out"], { cwd: dir, env: {}, registry: false }),
  );
}

Deno.test("[env.taskset.task] rewards, metrics and stops plug hooks in by name: added from a file, re-weighted, and a stop that ends the rollout cleanly", async () => {
  const dir = await Deno.makeTempDir({ prefix: "vf_hooks_" });
  try {
    let n = 0;
    await using server = await startModelServer({ responder: () => ({ content: `reply ${++n}` }) });
    await Deno.writeTextFile(join(dir, "chats.ts"), TASKSET);
    await Deno.writeTextFile(join(dir, "hooks.ts"), HOOKS);
    const head = `model = "m"
[client]
base_url = "${server.url}"
[env.taskset]
id = "./chats.ts"
[env.agent.runtime]
type = "subprocess"
`;
    const res = await run(
      dir,
      head + `[env.taskset.task.rewards.bonus]
fn = "hooks.ts:bonus"
weight = 0.5
[env.taskset.task.rewards.replied]
weight = 3
[env.taskset.task.metrics.replies]
fn = "hooks.ts:bonus"
[env.taskset.task.stops.too_long]
fn = "hooks.ts:tooLong"
`,
    );
    assert.equal(res.code, 0, transcript(res));
    const dirLine = /^Saving traces to (.+)$/m.exec(res.stderr)![1];
    const [trace] = (await Deno.readTextFile(join(dirLine, "traces.jsonl"))).trim().split("\n")
      .map((l) => JSON.parse(l));
    assert.equal(trace.ok, true, JSON.stringify(trace.error));
    assert.equal(trace.stop_condition, "too_long");
    assert.equal(server.requests.length, 2);
    assert.deepEqual(trace.rewards, { bonus: 2, replied: 1 });
    assert.deepEqual(trace.reward_weights, { bonus: 0.5, replied: 3 });
    assert.equal(trace.reward, 2 * 0.5 + 1 * 3);
    assert.deepEqual(trace.metrics, { replies: 2 });

    const cases: Array<[string, RegExp]> = [
      [
        `[env.taskset.task.rewards.nope]\nweight = 2\n`,
        /env\.taskset\.task\.rewards\.nope: the task has no reward named "nope"; give fn to add one/,
      ],
      [
        `[env.taskset.task.rewards.bonus]\nfn = "hooks.ts:missing"\n`,
        /env\.taskset\.task\.rewards\.bonus\.fn: "hooks\.ts" exports no function "missing"/,
      ],
      [
        `[env.taskset.task.rewards.bonus]\nfn = "hooks.ts"\n`,
        /env\.taskset\.task\.rewards\.bonus\.fn: "hooks\.ts" is not "path\/to\/file\.ts:function"/,
      ],
      [
        `[env.taskset.task.metrics.replies]\nfn = "hooks.ts:bonus"\nweight = 2\n`,
        /env\.taskset\.task\.metrics\.replies\.weight: only rewards have weights/,
      ],
    ];
    // A taskset that does not hand its tasks the task config would drop plugged hooks.
    await Deno.writeTextFile(
      join(dir, "deaf.ts"),
      TASKSET.replace("this.config.task)", ")").replace('"chats"', '"deaf"'),
    );
    const deaf = await run(
      dir,
      head.replace("./chats.ts", "./deaf.ts") +
        `[env.taskset.task.rewards.bonus]\nfn = "hooks.ts:bonus"\n`,
    );
    assert.equal(deaf.code, 1, transcript(deaf));
    assert.match(
      deaf.stderr,
      /env\.taskset\.task\.rewards: task "c" of taskset "deaf" did not receive the task config/,
    );
    for (const [plug, pattern] of cases) {
      const bad = await run(dir, head + plug);
      assert.equal(bad.code, 1, `${plug}\n${transcript(bad)}`);
      assert.match(bad.stderr, pattern, plug);
    }
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});
