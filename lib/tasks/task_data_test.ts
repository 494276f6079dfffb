/**
 * TaskDataSchema accepts what `task_data` may carry on the wire (nulls for absent fields,
 * extra fields passed through) and refuses wrong types by field; the TaskData type is its
 * output, so a field the schema types is typed alike on a task's data.
 */
import assert from "node:assert/strict";
import { TaskDataSchema as Served } from "../serve/episode_runner.ts";
import { type TaskData, TaskDataSchema } from "./task_data.ts";

Deno.test("TaskDataSchema: nulls, nested tables and extra fields are accepted as the wire sends them", () => {
  assert.equal(Served, TaskDataSchema);
  const wire = {
    prompt: [{ role: "user", content: "Write 42" }, { role: "user" }],
    id: null,
    idx: 0,
    name: "t",
    description: null,
    system_prompt: null,
    image: "busybox:latest",
    workdir: null,
    scoring: { mode: "isolated", anything: [1] },
    artifacts: [{ source: "/out", required: null, exclude: null, more: 1 }],
    artifact_max_bytes: null,
    agent_user: null,
    env: { A: "1" },
    timeout: { setup: null, agent: 5, other: "kept" },
    resources: { cpu: null, memory: "1g" },
    network: { allow: ["pypi.org:443"] },
    answer: { any: "shape" },
  };
  const parsed = TaskDataSchema.parse(wire);
  assert.deepEqual(parsed, wire);
  assert.equal(TaskDataSchema.safeParse({ prompt: "p", network: true }).success, true);
  assert.equal(TaskDataSchema.safeParse({ prompt: "p", resources: { memory: 512 } }).success, true);
});

Deno.test("TaskDataSchema: wrong types are refused at their field", () => {
  const refused: Array<[Record<string, unknown>, string]> = [
    [{}, "prompt"],
    [{ prompt: 3 }, "prompt"],
    [{ prompt: [{ content: "no role" }] }, "prompt"],
    [{ prompt: "p", id: 1 }, "id"],
    [{ prompt: "p", idx: -1 }, "idx"],
    [{ prompt: "p", idx: 1.5 }, "idx"],
    [{ prompt: "p", name: 3 }, "name"],
    [{ prompt: "p", artifact_max_bytes: 0 }, "artifact_max_bytes"],
    [{ prompt: "p", artifacts: [{ required: true }] }, "artifacts.0.source"],
    [{ prompt: "p", env: { A: 1 } }, "env.A"],
    [{ prompt: "p", timeout: { agent: 0 } }, "timeout.agent"],
    [{ prompt: "p", resources: { cpu: -1 } }, "resources.cpu"],
    [{ prompt: "p", network: "yes" }, "network"],
    [{ prompt: "p", scoring: [] }, "scoring"],
  ];
  for (const [data, field] of refused) {
    const result = TaskDataSchema.safeParse(data);
    assert.equal(result.success, false, JSON.stringify(data));
    assert.equal(result.error!.issues[0].path.join("."), field, JSON.stringify(data));
  }
});

Deno.test("TaskData is the schema's output: its typed fields are typed on a task's data", () => {
  const data: TaskData = { prompt: "p", name: "n", idx: 2, resources: { memory: "1g" } };
  // Typed by the schema (a hand-kept type had left `name` and `description` unknown).
  const name: string | undefined = data.name;
  const description: string | undefined = data.description;
  const idx: number | undefined = data.idx;
  // @ts-expect-error the schema makes `image` a string
  const wrong: TaskData = { prompt: "p", image: 3 };
  // Fields the schema does not name stay open.
  const extra: unknown = { ...data, answer: 42 }.answer;
  assert.deepEqual([name, description, idx, extra, wrong.prompt], ["n", undefined, 2, 42, "p"]);
});
