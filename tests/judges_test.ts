/**
 * LLM judges configured in TOML (`[[env.judges]]`): the reference judge compares the final
 * answer with the task's `answer`, the rubric judge grades against a rubric text. Both call
 * the run's model endpoint (a real loopback server here) after the task's own rewards.
 */
import assert from "node:assert/strict";
import { mkdtemp, readdir, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { startModelServer } from "./model_server.ts";
import { childEnv } from "./_child_env.ts";

const ROOT = new URL("..", import.meta.url).pathname;

const TASKSET = `
import { reward, Task, Taskset } from "${new URL("../mod.ts", import.meta.url).href}";
class QaTask extends Task {
  // The task's own reward: the final message is non-empty.
  answered = reward(({ trace }) => {
    const last = trace.messages.filter((m) => m.role === "assistant").at(-1);
    return typeof last?.content === "string" && last.content.length > 0 ? 1 : 0;
  });
}
class QaTaskset extends Taskset {
  get id() { return "qa"; }
  *load() {
    yield new QaTask({ id: "q-42", prompt: "What is 6*7?", answer: "42" });
    yield new QaTask({ id: "q-9", prompt: "What is 3*3?", answer: "9" });
  }
}
export function loadTaskset(config) { return new QaTaskset(config); }
`;

Deno.test("[[env.judges]] reference and rubric judges from TOML add judge rewards after the task's own", async () => {
  const dir = await mkdtemp(join(tmpdir(), "vf-judges-"));
  try {
    await using model = await startModelServer({
      responder: (req) => {
        const text = String(req.body.messages.at(-1)?.content ?? "");
        if (text.includes("Reference answer:")) {
          // reference judge: agree only when the graded answer equals the reference
          const ref = /Reference answer:\n(.*)/.exec(text)?.[1];
          const got = /Answer to grade:\n(.*)/.exec(text)?.[1];
          return { content: ref === got ? "yes" : "no" };
        }
        if (text.includes("Rubric:")) {
          return { content: text.includes("show the number") ? "yes" : "no" };
        }
        // the agent (null harness): right for 6*7, wrong for 3*3
        return { content: text.includes("6*7") ? "42" : "10" };
      },
    });
    await writeFile(join(dir, "qa.ts"), TASKSET);
    await writeFile(
      join(dir, "run.toml"),
      `model = "m"
[client]
base_url = "${model.url}"
api_key_var = "VF_JUDGE_TEST_KEY"
[env.taskset]
id = "./qa.ts"
[env.agent.harness]
id = "null"
[env.agent.runtime]
type = "subprocess"
[[env.judges]]
id = "reference"
[[env.judges]]
id = "rubric"
name = "shows_number"
rubric = "The reply must show the number."
weight = 0.5
`,
    );
    const out = await new Deno.Command(Deno.execPath(), {
      args: [
        "run",
        "-A",
        join(ROOT, "cli.ts"),
        "eval",
        "@",
        "run.toml",
        "-o",
        join(dir, "out"),
        "-q",
      ],
      cwd: dir,
      env: childEnv({ VF_JUDGE_TEST_KEY: "k" }),
      clearEnv: true,
      stdout: "piped",
      stderr: "piped",
    }).output();
    const stderr = new TextDecoder().decode(out.stderr);
    assert.equal(out.code, 0, stderr);
    const base = join(dir, "out/evals");
    const [envModel] = await readdir(base);
    const [runId] = await readdir(join(base, envModel));
    const traces = (await readFile(join(base, envModel, runId, "traces.jsonl"), "utf8"))
      .trim().split("\n").map((l) => JSON.parse(l));
    const byKey = Object.fromEntries(traces.map((t) => [t.task.key, t]));
    assert.deepEqual(byKey["q-42"].rewards, { answered: 1, judge_reference: 1, shows_number: 1 });
    assert.equal(byKey["q-42"].reward, 1 + 1 + 0.5);
    assert.deepEqual(byKey["q-9"].rewards, { answered: 1, judge_reference: 0, shows_number: 1 });
    assert.equal(byKey["q-9"].reward, 1 + 0 + 0.5);
    assert.equal(byKey["q-42"].info.judge_reference_verdict, "yes");
    // two agent calls plus two judge calls per task
    assert.equal(model.requests.length, 6);
    assert.ok(model.requests.every((r) => r.headers.authorization === "Bearer k"));
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
});
