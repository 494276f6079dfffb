/**
 * Costs and the budget through `vf eval` against a loopback model that reports usage: prices
 * from `[models."<id>"]`, the spend in metadata and the summary, `--max-cost` stopping new
 * rollouts at the budget (what runs finishes), and `--resume` completing the run with the
 * spend carried over.
 * @module
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { loadExampleDataset } from "../lib/data/examples.ts";
import { lastUserText, startModelServer } from "./model_server.ts";
import { cliCommand, collect, MOD_URL, tempDir, transcript } from "./_cli.ts";

const ANSWERS = new Map(
  (loadExampleDataset("gsm8k-sample", { split: "test" }).toList() as Array<
    { question: string; answer: string }
  >).map((r) => [r.question, r.answer]),
);

Deno.test("cost: prices give the spend in metadata and the summary; --max-cost stops starting rollouts at the budget and --resume finishes the run", async () => {
  await using tmp = await tempDir("vf_cost_");
  await using model = await startModelServer({
    responder: (request) => ({
      content: `\\boxed{${ANSWERS.get(lastUserText(request)) ?? "0"}}`,
      usage: { prompt_tokens: 10, completion_tokens: 0 },
    }),
  });
  // $1 per input token: every call costs $10.
  await Deno.writeTextFile(
    join(tmp.path, "cost.toml"),
    `env_id = "gsm8k"\nmodel = "m"\nnum_examples = 6\nrollouts_per_example = 1\nmax_concurrent = 1\n` +
      `[client]\nbase_url = "${model.url}"\n` +
      `[models."m"]\ninput_per_mtok = 1000000\noutput_per_mtok = 0\n`,
  );
  const run = (args: string[]) =>
    collect(cliCommand(["eval", "@", "cost.toml", "-o", "out", ...args], {
      cwd: tmp.path,
      env: {},
      registry: false,
    }));

  const capped = await run(["--max-cost", "25"]);
  assert.equal(capped.code, 1, transcript(capped));
  const runDir = /^Saving results to (.+)$/m.exec(capped.stderr)![1];
  assert.match(capped.stderr, /Stopped at the cost budget \(\$25\): 2 rollouts done/);
  assert.match(capped.stdout, /cost: \$20\.0000 over 2 model calls \(budget \$25\)/);
  assert.equal(model.requests.length, 2);
  let meta = JSON.parse(await Deno.readTextFile(join(runDir, "metadata.json")));
  assert.equal(meta.cost.usd, 20);
  assert.equal(meta.cost.input_tokens, 20);
  assert.equal(meta.cost.stopped_at_budget, true);

  const resumed = await run(["--resume", runDir, "--max-cost", "100"]);
  assert.equal(resumed.code, 0, transcript(resumed));
  assert.equal(model.requests.length, 6); // only the four missing rollouts ran
  const rows = (await Deno.readTextFile(join(runDir, "results.jsonl"))).trim().split("\n");
  assert.equal(rows.length, 6);
  meta = JSON.parse(await Deno.readTextFile(join(runDir, "metadata.json")));
  assert.equal(meta.cost.usd, 60); // the first part's spend carried over
  assert.equal(meta.cost.calls, 6);
  assert.equal(meta.cost.stopped_at_budget, false);
  assert.equal(meta.avg_reward, 1);

  // A budget without prices cannot be kept.
  await Deno.writeTextFile(
    join(tmp.path, "noprice.toml"),
    `env_id = "gsm8k"\nmodel = "m"\nnum_examples = 1\n[client]\nbase_url = "${model.url}"\n`,
  );
  const bad = await collect(cliCommand(["eval", "@", "noprice.toml", "--max-cost", "1"], {
    cwd: tmp.path,
    env: {},
    registry: false,
  }));
  assert.notEqual(bad.code, 0);
  assert.match(bad.stderr, /--max-cost needs prices/);
});

/** `results.jsonl` rows of a run (a torn or blank line would fail the parse: none is expected). */
async function savedRows(runDir: string, file = "results.jsonl"): Promise<unknown[]> {
  return (await Deno.readTextFile(join(runDir, file))).trim().split("\n").filter(Boolean)
    .map((l) => JSON.parse(l));
}

async function costOf(runDir: string): Promise<{ usd: number; calls: number; stopped: unknown }> {
  const meta = JSON.parse(await Deno.readTextFile(join(runDir, "metadata.json")));
  return { usd: meta.cost?.usd, calls: meta.cost?.calls, stopped: meta.cost?.stopped_at_budget };
}

Deno.test("cost: --resume carries the spend and the rollouts it paid for into the budget: the same budget starts nothing, one above the run's cost completes it, after a stop at the budget and after SIGINT", async () => {
  await using tmp = await tempDir("vf_cost_resume_");
  // Session one of the SIGINT case hangs from its fourth call on, so that one is in flight.
  let hangFrom = Infinity;
  await using model = await startModelServer({
    responder: (request, { index }) =>
      index >= hangFrom ? { hang: true } : {
        content: `\\boxed{${ANSWERS.get(lastUserText(request)) ?? "0"}}`,
        usage: { prompt_tokens: 10, completion_tokens: 0 },
      },
  });
  // $10 a rollout, ten rollouts: the whole run costs $100.
  await Deno.writeTextFile(
    join(tmp.path, "cost.toml"),
    `env_id = "gsm8k"\nmodel = "m"\nnum_examples = 10\nrollouts_per_example = 1\nmax_concurrent = 1\n` +
      `[client]\nbase_url = "${model.url}"\n` +
      `[models."m"]\ninput_per_mtok = 1000000\noutput_per_mtok = 0\n`,
  );
  const run = (args: string[]) =>
    collect(cliCommand(["eval", "@", "cost.toml", "-o", "out", ...args], {
      cwd: tmp.path,
      env: {},
      registry: false,
    }));

  // Stopped at the budget, then resumed at the same budget: nothing more is spent.
  const capped = await run(["--max-cost", "25"]);
  assert.equal(capped.code, 1, transcript(capped));
  const runDir = /^Saving results to (.+)$/m.exec(capped.stderr)![1];
  assert.equal(model.requests.length, 2);
  const again = await run(["--resume", runDir, "--max-cost", "25"]);
  assert.equal(again.code, 1, transcript(again));
  assert.equal(model.requests.length, 2, "the resume at the same budget called the model");
  assert.match(
    again.stderr,
    /Stopped at the cost budget \(\$25\): \$20\.00 of it was spent before this resume, on 2 rollouts; the next would cost about \$10\.00, so none was started/,
  );
  assert.deepEqual(await costOf(runDir), { usd: 20, calls: 2, stopped: true });
  assert.equal((await savedRows(runDir)).length, 2);

  // A budget above the whole run's cost ($102 > $100) completes it.
  const done = await run(["--resume", runDir, "--max-cost", "102"]);
  assert.equal(done.code, 0, transcript(done));
  assert.equal(model.requests.length, 10);
  assert.equal((await savedRows(runDir)).length, 10);
  assert.deepEqual(await costOf(runDir), { usd: 100, calls: 10, stopped: false });

  // SIGINT with a call in flight: the spend of what finished is kept for the resume.
  hangFrom = model.requests.length + 3;
  const child = cliCommand(["eval", "@", "cost.toml", "-o", "out2"], {
    cwd: tmp.path,
    env: {},
    registry: false,
  }).spawn();
  const stderrP = new Response(child.stderr).text();
  const stdoutP = new Response(child.stdout).text();
  const deadline = Date.now() + 60_000;
  while (model.requests.length <= hangFrom && Date.now() < deadline) {
    await new Promise((r) => setTimeout(r, 50));
  }
  child.kill("SIGINT");
  const first = { code: (await child.status).code, stdout: await stdoutP, stderr: await stderrP };
  assert.equal(first.code, 130, transcript(first));
  const second = /^Saving results to (.+)$/m.exec(first.stderr)![1];
  hangFrom = Infinity;
  assert.equal((await savedRows(second)).length, 3);
  assert.deepEqual(await costOf(second), { usd: 30, calls: 3, stopped: undefined });
  const before = model.requests.length;
  const same = await run(["--resume", second, "--max-cost", "35"]);
  assert.equal(same.code, 1, transcript(same));
  assert.equal(model.requests.length, before, "the resume past the budget called the model");
  const rest = await run(["--resume", second, "--max-cost", "102"]);
  assert.equal(rest.code, 0, transcript(rest));
  assert.equal(model.requests.length, before + 7);
  assert.equal((await savedRows(second)).length, 10);
  assert.deepEqual(await costOf(second), { usd: 100, calls: 10, stopped: false });
});

const TASKS = `
import { reward, Task, Taskset } from "${MOD_URL}";
class Ask extends Task {
  static override HARNESS = "null";
  answered = reward(({ trace }) => (trace.messages.at(-1)?.content === "ok" ? 1 : 0));
}
class Asks extends Taskset {
  get id() { return "asks"; }
  *load() { for (let i = 0; i < 10; i++) yield new Ask({ id: "t" + i, prompt: "Task " + i }); }
}
export function loadTaskset(config) { return new Asks(config); }
`;

Deno.test("cost: a taskset run resumed carries the spend and the episodes it paid for: the same budget starts nothing, one above the run's cost completes it", async () => {
  await using tmp = await tempDir("vf_cost_tasks_");
  await using model = await startModelServer({
    responder: () => ({ content: "ok", usage: { prompt_tokens: 10, completion_tokens: 0 } }),
  });
  await Deno.writeTextFile(join(tmp.path, "asks.ts"), TASKS);
  await Deno.writeTextFile(
    join(tmp.path, "run.toml"),
    `model = "m"\nmax_concurrent = 1\n[client]\nbase_url = "${model.url}"\n` +
      `[models."m"]\ninput_per_mtok = 1000000\noutput_per_mtok = 0\n` +
      `[env.taskset]\nid = "./asks.ts"\n[env.agent.runtime]\ntype = "subprocess"\n`,
  );
  const run = (args: string[]) =>
    collect(cliCommand(["eval", "@", "run.toml", "-o", "out", ...args], {
      cwd: tmp.path,
      env: {},
      registry: false,
    }));
  const capped = await run(["--max-cost", "25"]);
  assert.equal(capped.code, 1, transcript(capped));
  const runDir = /^Saving traces to (.+)$/m.exec(capped.stderr)![1];
  assert.equal(model.requests.length, 2);
  assert.deepEqual(await costOf(runDir), { usd: 20, calls: 2, stopped: true });

  const again = await run(["--resume", runDir, "--max-cost", "25"]);
  assert.equal(again.code, 1, transcript(again));
  assert.equal(model.requests.length, 2, "the resume at the same budget called the model");
  assert.match(again.stderr, /\$20\.00 of it was spent before this resume, on 2 rollouts/);
  assert.deepEqual(await costOf(runDir), { usd: 20, calls: 2, stopped: true });

  const done = await run(["--resume", runDir, "--max-cost", "102"]);
  assert.equal(done.code, 0, transcript(done));
  assert.equal(model.requests.length, 10);
  assert.equal((await savedRows(runDir, "traces.jsonl")).length, 10);
  assert.deepEqual(await costOf(runDir), { usd: 100, calls: 10, stopped: false });
});
