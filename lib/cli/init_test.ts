import assert from "node:assert/strict";
import { join, resolve } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";
import { ConfigError } from "../errors.ts";
import { initPackage } from "./init.ts";
import { loadEnvironment, loadTasksetSpec } from "../legacy/load.ts";
import type { Taskset } from "../tasks/task.ts";

const VF_MOD = fileURLToPath(new URL("../../mod.ts", import.meta.url));

async function withTempDir(fn: (dir: string) => Promise<void>): Promise<void> {
  const dir = await Deno.makeTempDir({ prefix: "vf_init_" });
  try {
    await fn(dir);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
}

async function readJson(path: string) {
  return JSON.parse(await Deno.readTextFile(path));
}

Deno.test("initPackage() writes a taskset whose mod.ts imports vf by a relative path", async () => {
  await withTempDir(async (tmp) => {
    const dir = join(tmp, "greet_task");
    const result = await initPackage(dir);
    assert.equal(result.kind, "taskset");
    assert.equal(result.name, "greet_task");
    assert.deepEqual(result.files.sort(), ["README.md", "deno.json", "mod.ts", "mod_test.ts"]);
    assert.ok(result.vfSpecifier.startsWith("../"), result.vfSpecifier);
    assert.equal(resolve(dir, result.vfSpecifier), VF_MOD);

    const mod = await Deno.readTextFile(join(dir, "mod.ts"));
    assert.ok(mod.includes(`} from "${result.vfSpecifier}";`), mod);
    assert.ok(!mod.includes('from "vf"'), "mod.ts must not rely on the deno.json alias");
    assert.ok(mod.includes('"busybox"') && mod.includes("/app/output/greeting.txt"));
    assert.deepEqual((await readJson(join(dir, "deno.json"))).imports, { vf: result.vfSpecifier });
    assert.ok((await Deno.readTextFile(join(dir, "mod_test.ts"))).includes('from "vf"'));
    assert.ok(
      (await Deno.readTextFile(join(dir, "README.md"))).includes("vf validate ./greet_task"),
    );
  });
});

Deno.test("a scaffolded taskset loads the way the CLI loads it, by path", async () => {
  await withTempDir(async (tmp) => {
    const dir = join(tmp, "greet-task");
    await initPackage(dir);
    const taskset: Taskset = await loadTasksetSpec(dir, { id: dir }, {});
    assert.equal(taskset.id, "greet-task");
    const tasks = await taskset.tasks();
    assert.deepEqual(tasks.map((t) => t.key), ["greet-task-0", "greet-task-1"]);
    assert.ok(tasks[0].needsContainer);
    assert.equal(tasks[0].data.image, "busybox");
    assert.deepEqual(tasks[0].data.scoring, { mode: "isolated" });
    assert.match(tasks[0].promptText, /"hello".*\/app\/output\/greeting\.txt/);
  });
});

Deno.test("initPackage() with kind environment writes a SingleTurnEnv with three rows", async () => {
  await withTempDir(async (tmp) => {
    const dir = join(tmp, "tiny_qa");
    const result = await initPackage(dir, { kind: "environment" });
    assert.equal(result.kind, "environment");
    const { env, id } = await loadEnvironment(dir, {}, {});
    assert.equal(id, "tiny-qa");
    assert.equal(env.envId, "tiny-qa");
    const rows = (await env.getEvalDataset()).toList();
    assert.equal(rows.length, 3);
    assert.equal(rows[0].prompt.at(-1).content, "What is the capital of France?");
    assert.equal(rows[0].answer, "Paris");
    assert.ok(env.rubric.funcNames.includes("exactAnswer"), env.rubric.funcNames.join(", "));
  });
});

Deno.test("initPackage() refuses a folder that is not empty and leaves it as it was", async () => {
  await withTempDir(async (tmp) => {
    await Deno.writeTextFile(join(tmp, "keep.txt"), "mine");
    await assert.rejects(
      initPackage(tmp),
      (error: unknown) =>
        error instanceof ConfigError && /already exists and is not empty/.test(error.message),
    );
    const names = [];
    for await (const entry of Deno.readDir(tmp)) names.push(entry.name);
    assert.deepEqual(names, ["keep.txt"]);
    assert.equal(await Deno.readTextFile(join(tmp, "keep.txt")), "mine");

    await Deno.writeTextFile(join(tmp, "file_pkg"), "");
    await assert.rejects(initPackage(join(tmp, "file_pkg")), /is not a folder/);
  });
});

Deno.test("initPackage() fills an existing empty folder", async () => {
  await withTempDir(async (tmp) => {
    const dir = join(tmp, "empty");
    await Deno.mkdir(dir);
    const result = await initPackage(dir);
    assert.equal(result.files.length, 4);
  });
});

Deno.test("initPackage() imports vf from a --vf URL as given, or from mod.ts under a folder URL", async () => {
  await withTempDir(async (tmp) => {
    const url = "https://example.com/vf/mod.ts";
    const a = await initPackage(join(tmp, "a"), { vf: url });
    assert.equal(a.vfSpecifier, url);
    assert.ok((await Deno.readTextFile(join(tmp, "a", "mod.ts"))).includes(`from "${url}"`));
    assert.deepEqual((await readJson(join(tmp, "a", "deno.json"))).imports, { vf: url });

    const b = await initPackage(join(tmp, "b"), {
      vf: "https://example.com/vf/",
      kind: "environment",
    });
    assert.equal(b.vfSpecifier, "https://example.com/vf/mod.ts");

    // A local path (folder or file, or a file: URL) becomes a path relative to the package.
    const c = await initPackage(join(tmp, "c"), {
      vf: fileURLToPath(new URL("../..", import.meta.url)),
    });
    assert.equal(resolve(join(tmp, "c"), c.vfSpecifier), VF_MOD);
    const d = await initPackage(join(tmp, "d"), { vf: pathToFileURL(VF_MOD).href });
    assert.equal(resolve(join(tmp, "d"), d.vfSpecifier), VF_MOD);
    await assert.rejects(
      initPackage(join(tmp, "e"), { vf: join(tmp, "nowhere") }),
      /does not exist/,
    );
  });
});

Deno.test("initPackage() rejects a name that is no package name and an unknown kind", async () => {
  await withTempDir(async (tmp) => {
    await assert.rejects(initPackage(join(tmp, "bad name")), ConfigError);
    await assert.rejects(
      // @ts-expect-error: an unknown kind, as a JS caller could pass
      initPackage(join(tmp, "ok"), { kind: "agent" }),
      /Unknown package kind "agent"; kinds: taskset, environment/,
    );
  });
});
