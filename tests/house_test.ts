/**
 * The shape of the tree (DESIGN.md, "House"): no import circles among the project's own
 * non-test modules, a public API (`mod.ts`'s exported names and their kinds) that only
 * changes on purpose, together with `tests/public_api.txt`, no runtime-type branch in `lib/`,
 * and no `lib/` module over 700 lines.
 *
 * Both read what Deno itself resolves: `deno info --json` for the module graph (static,
 * dynamic and type-only imports), `deno doc --json` for the exports. Nothing is listed by
 * hand but the public API.
 * @module
 */

import assert from "node:assert/strict";
import { mkdtemp, readdir, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join, relative } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";

const ROOT = fileURLToPath(new URL("..", import.meta.url));
const CONFIG = join(ROOT, "deno.json");
const API_LIST = join(ROOT, "tests", "public_api.txt");

/** The project's non-test modules: what a circle among them would tie together. */
async function projectModules(): Promise<string[]> {
  const out = [join(ROOT, "mod.ts"), join(ROOT, "cli.ts")];
  async function walk(dir: string): Promise<void> {
    for (const entry of await readdir(dir, { withFileTypes: true })) {
      const path = join(dir, entry.name);
      if (entry.isDirectory()) {
        if (entry.name !== "node_modules" && !entry.name.startsWith(".")) await walk(path);
      } else if (entry.name.endsWith(".ts") && !entry.name.endsWith("_test.ts")) {
        out.push(path);
      }
    }
  }
  for (const dir of ["lib", "runtimes", "environments", "scripts", "bench"]) {
    await walk(join(ROOT, dir));
  }
  return out;
}

async function deno(args: string[]): Promise<string> {
  const { code, stdout, stderr } = await new Deno.Command(Deno.execPath(), {
    args,
    stdout: "piped",
    stderr: "piped",
  }).output();
  const text = new TextDecoder().decode(stdout);
  if (code !== 0) {
    throw new Error(`deno ${args.join(" ")} failed: ${new TextDecoder().decode(stderr)}`);
  }
  return text;
}

interface InfoModule {
  specifier: string;
  dependencies?: Array<{ code?: { specifier?: string }; type?: { specifier?: string } }>;
}

/**
 * The import graph of `files` (file URL → the file URLs it imports, statically, dynamically
 * or for types only), restricted to files under `within` that `keep` accepts.
 */
async function importGraph(
  files: string[],
  within: string,
  keep: (path: string) => boolean,
  config?: string,
): Promise<Map<string, Set<string>>> {
  const dir = await mkdtemp(join(tmpdir(), "vf-house-"));
  try {
    const root = join(dir, "root.ts");
    await writeFile(root, files.map((f) => `import "${pathToFileURL(f).href}";\n`).join(""));
    const info = JSON.parse(
      await deno(["info", "--json", ...(config ? ["--config", config] : []), root]),
    ) as { modules: InfoModule[] };
    const base = pathToFileURL(within).href;
    const ours = (s: string | undefined): s is string =>
      s !== undefined && s.startsWith(base) && keep(fileURLToPath(s));
    const graph = new Map<string, Set<string>>();
    for (const m of info.modules) {
      if (!ours(m.specifier)) continue;
      const targets = new Set<string>();
      for (const d of m.dependencies ?? []) {
        for (const s of [d.code?.specifier, d.type?.specifier]) if (ours(s)) targets.add(s);
      }
      graph.set(m.specifier, targets);
    }
    return graph;
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}

/** The strongly connected components with more than one module, or a module importing itself. */
function circles(graph: Map<string, Set<string>>): string[][] {
  let next = 0;
  const index = new Map<string, number>();
  const low = new Map<string, number>();
  const stack: string[] = [];
  const onStack = new Set<string>();
  const found: string[][] = [];
  function visit(v: string): void {
    index.set(v, next);
    low.set(v, next++);
    stack.push(v);
    onStack.add(v);
    for (const w of graph.get(v) ?? []) {
      if (!index.has(w)) {
        visit(w);
        low.set(v, Math.min(low.get(v)!, low.get(w)!));
      } else if (onStack.has(w)) {
        low.set(v, Math.min(low.get(v)!, index.get(w)!));
      }
    }
    if (low.get(v) === index.get(v)) {
      const component: string[] = [];
      let w: string;
      do {
        w = stack.pop()!;
        onStack.delete(w);
        component.push(w);
      } while (w !== v);
      if (component.length > 1 || graph.get(v)?.has(v)) found.push(component.sort());
    }
  }
  for (const v of graph.keys()) if (!index.has(v)) visit(v);
  return found;
}

function describe(found: string[][], root: string): string {
  return found.map((c, i) =>
    `circle ${i + 1}: ${c.map((s) => relative(root, fileURLToPath(s))).join(" -> ")}`
  ).join("\n");
}

Deno.test("the circle check finds a circle of imports, dynamic and type-only ones included", async () => {
  const dir = await mkdtemp(join(tmpdir(), "vf-circle-"));
  try {
    await writeFile(join(dir, "a.ts"), `import { b } from "./b.ts";\nexport const a = () => b;\n`);
    await writeFile(
      join(dir, "b.ts"),
      `import type { C } from "./c.ts";\nexport const b: C = 1;\n`,
    );
    await writeFile(
      join(dir, "c.ts"),
      `export type C = number;\nexport const load = () => import("./a.ts");\n`,
    );
    await writeFile(join(dir, "d.ts"), `import "./b.ts";\n`);
    const files = ["a.ts", "b.ts", "c.ts", "d.ts"].map((f) => join(dir, f));
    const found = circles(await importGraph(files, dir, () => true));
    assert.equal(found.length, 1, describe(found, dir));
    assert.deepEqual(
      found[0].map((s) => relative(dir, fileURLToPath(s))),
      ["a.ts", "b.ts", "c.ts"],
    );
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
});

Deno.test("no import circles among vf's non-test modules", async () => {
  const files = await projectModules();
  const isProjectCode = (path: string) =>
    !path.endsWith("_test.ts") && !relative(ROOT, path).startsWith("tests/") &&
    !path.includes("/node_modules/");
  const graph = await importGraph(files, ROOT, isProjectCode, CONFIG);
  // The graph must really hold the tree: every listed module, and the arrows between them.
  for (const f of files) assert.ok(graph.has(pathToFileURL(f).href), `${f} is not in the graph`);
  const arrows = [...graph.values()].reduce((n, s) => n + s.size, 0);
  assert.ok(arrows > files.length, `only ${arrows} imports among ${files.length} modules`);
  const found = circles(graph);
  assert.equal(found.length, 0, `import circles:\n${describe(found, ROOT)}`);
});

/** `mod.ts`'s exports as "name kind" lines, sorted. */
async function publicApi(): Promise<string[]> {
  const doc = JSON.parse(await deno(["doc", "--json", "--config", CONFIG, join(ROOT, "mod.ts")]));
  const module = doc.nodes[pathToFileURL(join(ROOT, "mod.ts")).href] as {
    symbols: Array<{ name: string; declarations: Array<{ kind: string }> }>;
  };
  return module.symbols.map((s) => `${s.name} ${s.declarations[0]?.kind ?? "unknown"}`).sort();
}

Deno.test("mod.ts exports exactly the names and kinds listed in tests/public_api.txt", async () => {
  const have = await publicApi();
  const want = (await readFile(API_LIST, "utf8")).split("\n").map((l) => l.trim())
    .filter((l) => l && !l.startsWith("#"));
  const missing = want.filter((l) => !have.includes(l));
  const added = have.filter((l) => !want.includes(l));
  assert.ok(
    missing.length === 0 && added.length === 0,
    `the public API changed (an intended change updates tests/public_api.txt in the same commit)\n` +
      `  no longer exported: ${missing.join(", ") || "-"}\n  newly exported: ${
        added.join(", ") || "-"
      }`,
  );
});

Deno.test("the benchmarks and the chaos run type-check (nothing else compiles them)", async () => {
  const root = new URL("..", import.meta.url).pathname;
  const files = ["bench", "chaos"].flatMap((dir) =>
    [...Deno.readDirSync(`${root}${dir}`)]
      .filter((e) => e.isFile && e.name.endsWith(".ts"))
      .map((e) => `${dir}/${e.name}`)
  );
  assert.ok(files.includes("bench/scale.ts"), files.join(" "));
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["check", "--quiet", ...files],
    cwd: root,
    stdout: "piped",
    stderr: "piped",
  }).output();
  assert.equal(out.code, 0, new TextDecoder().decode(out.stderr));
});

const RUNTIME_TYPE = `["'](?:docker|subprocess|ssh|prime|kubernetes)["']`;
/** A decision on a runtime's type: a comparison with a type name, a `case`, `spec.type ===`. */
const TYPE_BRANCH = new RegExp(
  [
    `\\btype\\b(?:\\s*\\?\\?\\s*["'][a-z]+["']\\s*\\))?\\s*[!=]==?\\s*${RUNTIME_TYPE}`,
    `${RUNTIME_TYPE}\\s*[!=]==?\\s*[\\w.]*\\btype\\b`,
    `\\bcase\\s+${RUNTIME_TYPE}\\s*:`,
    `\\bspec\\.type\\s*[!=]==?`,
  ].join("|"),
);

/**
 * Lines of `source` that branch on a runtime's type; comments are skipped, and a message that
 * prints the type (`${spec.type} runtime`) is not a branch.
 */
function typeBranches(source: string): string[] {
  return source.split("\n").filter((line) => {
    const code = line.replace(/\/\/.*$/, "");
    return !/^\s*\*/.test(code) && TYPE_BRANCH.test(code);
  });
}

/** Where lib/ keeps a type comparison that is not a decision about a runtime it holds. */
const TYPE_BRANCH_ALLOWED: Record<string, string> = {
  // Ledger records by type: Docker's sweep by labels has already reported those it kept.
  "lib/cli/cleanup.ts": `k.type !== "docker"`,
};

Deno.test("the runtime-type check finds branches on a type and lets messages print one", () => {
  const flagged = [
    `if (spec.type === "subprocess") {`,
    `if (spec.type !== other.type) return;`,
    `const ssh = r.type === "ssh" && r.dedicated;`,
    `if ((policy.runtime.type ?? "docker") === "subprocess") {`,
    `if (type !== "docker" && type !== "kubernetes") {`,
    `    case "prime":`,
    `if ("docker" === spec.type) {`,
  ];
  for (const line of flagged) assert.deepEqual(typeBranches(line), [line], line);
  const allowed = [
    "throw new ConfigError(`the ${spec.type} runtime cannot run them`);",
    `// spec.type === "docker" used to be asked here`,
    ` * where \`spec.type === "ssh"\` was written twice`,
    `if (part.type === "text") {`,
    `return { type: "docker", image };`,
  ];
  for (const line of allowed) assert.deepEqual(typeBranches(line), [], line);
});

Deno.test("lib/ asks a runtime's traits and never branches on its type", async () => {
  const found: string[] = [];
  async function walk(dir: string): Promise<void> {
    for (const entry of await readdir(dir, { withFileTypes: true })) {
      const path = join(dir, entry.name);
      if (entry.isDirectory()) await walk(path);
      else if (entry.name.endsWith(".ts") && !entry.name.endsWith("_test.ts")) {
        const file = relative(ROOT, path);
        // The sandbox host's source, embedded as a string.
        if (entry.name.startsWith("_") && entry.name.endsWith("_source.ts")) continue;
        for (const line of typeBranches(await readFile(path, "utf8"))) {
          if (TYPE_BRANCH_ALLOWED[file] && line.includes(TYPE_BRANCH_ALLOWED[file])) continue;
          found.push(`${file}: ${line.trim()}`);
        }
      }
    }
  }
  await walk(join(ROOT, "lib"));
  assert.deepEqual(
    found,
    [],
    `lib/ branches on a runtime's type; ask traitsOf(spec):\n${found.join("\n")}`,
  );
});

/** A module this long is usually two concepts (DESIGN.md, "House"). */
const MAX_MODULE_LINES = 700;

/**
 * Modules over the limit that are still to be split, each with why it waits. The list only
 * shrinks: a module not on it may not grow past the limit, and one on it that fits again must
 * leave it.
 */
const TOO_LONG_PENDING: Record<string, string> = {};

Deno.test(`no lib/ module is over ${MAX_MODULE_LINES} lines`, async () => {
  const long: string[] = [];
  const fits: string[] = [];
  async function walk(dir: string): Promise<void> {
    for (const entry of await readdir(dir, { withFileTypes: true })) {
      const path = join(dir, entry.name);
      if (entry.isDirectory()) await walk(path);
      else if (entry.name.endsWith(".ts") && !entry.name.endsWith("_test.ts")) {
        const file = relative(ROOT, path);
        const lines = (await readFile(path, "utf8")).split("\n").length - 1;
        if (lines > MAX_MODULE_LINES && !(file in TOO_LONG_PENDING)) {
          long.push(`${file}: ${lines} lines`);
        }
        if (lines <= MAX_MODULE_LINES && file in TOO_LONG_PENDING) fits.push(file);
      }
    }
  }
  await walk(join(ROOT, "lib"));
  assert.deepEqual(long, [], `split these modules (one concept per file):\n${long.join("\n")}`);
  assert.deepEqual(fits, [], `these fit now; take them off TOO_LONG_PENDING:\n${fits.join("\n")}`);
  for (const file of Object.keys(TOO_LONG_PENDING)) {
    assert.ok(await readFile(join(ROOT, file), "utf8").catch(() => null), `${file} is gone`);
  }
});

/** The rollout's own module holds open/step/close only; its phases live beside it. */
const ROLLOUT_MOD_LINES = 400;

Deno.test(`lib/tasks/rollout/mod.ts (TaskRollout: open, step, close) stays within ${ROLLOUT_MOD_LINES} lines`, async () => {
  const text = await readFile(join(ROOT, "lib/tasks/rollout/mod.ts"), "utf8");
  const lines = text.split("\n").length - 1;
  assert.ok(
    lines <= ROLLOUT_MOD_LINES,
    `lib/tasks/rollout/mod.ts is ${lines} lines; move what is not open/step/close to its phase's module`,
  );
});

Deno.test("mod.ts imports with no permission beyond reading the checkout, as a sandboxed environment imports it", async () => {
  // A URL environment runs under Deno's permission sandbox (no sys, env, run or net) and imports
  // vf's mod.ts: a module that asks the system for something when it is loaded (a uid, an
  // environment variable) makes every such environment fail to load.
  const probe = `await import(${JSON.stringify(new URL("../mod.ts", import.meta.url).href)});\n` +
    `console.log("loaded");\n`;
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["run", "--no-prompt", "--no-check", `--allow-read=${ROOT}`, "-"],
    cwd: ROOT,
    stdin: "piped",
    stdout: "piped",
    stderr: "piped",
    env: { NO_COLOR: "1" },
  }).spawn();
  const writer = out.stdin.getWriter();
  await writer.write(new TextEncoder().encode(probe));
  await writer.close();
  const { code, stdout, stderr } = await out.output();
  const text = new TextDecoder().decode(stdout) + new TextDecoder().decode(stderr);
  assert.equal(code, 0, text);
  assert.match(text, /loaded/);
});

/** The non-test modules under `dir` (relative to the checkout), with their source. */
async function sources(dir: string): Promise<Array<{ file: string; source: string }>> {
  const out: Array<{ file: string; source: string }> = [];
  async function walk(at: string): Promise<void> {
    for (const entry of await readdir(at, { withFileTypes: true })) {
      const path = join(at, entry.name);
      if (entry.isDirectory()) await walk(path);
      else if (entry.name.endsWith(".ts") && !entry.name.endsWith("_test.ts")) {
        out.push({ file: relative(ROOT, path), source: await readFile(path, "utf8") });
      }
    }
  }
  await walk(join(ROOT, dir));
  return out.sort((a, b) => a.file.localeCompare(b.file));
}

/**
 * Lines of a kill script's wait for the killed to be gone (a read of each pid's status until
 * it is a zombie or absent): `runtimes/_sweep.ts`'s `awaitGone` is the one copy.
 */
function waitLoops(source: string): string[] {
  return source.split("\n").filter((line) => /\bcase \$\w+ in Z\|X\) break\b/.test(line));
}

/**
 * Lines where a backend keeps its own start or stop protocol (a stop-once promise, a state
 * field, its own untracking) instead of `runtimes/lifecycle.ts`'s Lifecycle.
 */
function ownLifecycle(source: string): string[] {
  return source.split("\n").filter((line) => {
    const code = line.replace(/\/\/.*$/, "");
    return !/^\s*\*/.test(code) &&
      /#stopping\b|#starting\b|\buntrackRuntime\(|new StartOnce\b|\bstate\s*=\s*"stopped"/.test(
        code,
      );
  });
}

/** Lines of `source` with a type assertion (`x as T`), comments skipped. */
function typeAssertions(source: string): string[] {
  return source.split("\n").filter((line) => {
    const code = line.replace(/\/\/.*$/, "").replace(/(["'`])(?:\\.|(?!\1).)*\1/g, '""');
    return !/^\s*(\*|import\b|export\s*(type\s*)?\{)/.test(code) &&
      /[\w)\]}]\s+as\s+(?!const\b)[\w{[(]/.test(code);
  });
}

Deno.test("the lifecycle checks find a wait loop, a backend's own stop protocol and a cast", () => {
  assert.equal(waitLoops(`    case $st in Z|X) break ;; esac`).length, 1);
  assert.equal(waitLoops(`case "$all" in *" $n "*) continue ;; esac`).length, 0);
  assert.equal(waitLoops(`  case $st in Z|X) ;; *) left=$((left + 1)) ;; esac`).length, 0);
  for (
    const line of [
      `  #stopping: Promise<void> | undefined;`,
      `    })().finally(() => untrackRuntime(this));`,
      `  #life = new StartOnce();`,
      `    this.#life.state = "stopped";`,
    ]
  ) assert.deepEqual(ownLifecycle(line), [line], line);
  assert.deepEqual(ownLifecycle(`  #life = new Lifecycle(this, "docker");`), []);
  assert.deepEqual(ownLifecycle(` * untrackRuntime() once stopped`), []);
  for (
    const line of [
      `  bash: (config) => new BashHarness({ edit: config.edit as boolean | undefined }),`,
      `  program: (config) => new ProgramHarness(config as ProgramHarnessOptions),`,
      `const x = (y as unknown) as Z;`,
    ]
  ) assert.deepEqual(typeAssertions(line), [line], line);
  for (
    const line of [
      `const ids = ["a", "b"] as const;`,
      `// known as the bash harness`,
      "throw new ConfigError(`run as root`);",
      `import { type Harness as H } from "./harness.ts";`,
    ]
  ) assert.deepEqual(typeAssertions(line), [], line);
});

/** The backends that share `runtimes/lifecycle.ts`'s start and stop protocol. */
const LIFECYCLE_BACKENDS = ["runtimes/docker", "runtimes/k8s", "runtimes/ssh", "runtimes/prime"];

Deno.test("the backends share one lifecycle: one kill-wait loop, no start/stop protocol of their own", async () => {
  const loops: string[] = [];
  for (const { file, source } of await sources("runtimes")) {
    for (const line of waitLoops(source)) loops.push(`${file}: ${line.trim()}`);
  }
  assert.deepEqual(
    loops,
    ["runtimes/_sweep.ts: case $st in Z|X) break ;; esac"],
    `a kill script waits for its processes its own way; use awaitGone (runtimes/_sweep.ts):\n` +
      loops.join("\n"),
  );
  const own: string[] = [];
  for (const dir of LIFECYCLE_BACKENDS) {
    for (const { file, source } of await sources(dir)) {
      for (const line of ownLifecycle(source)) own.push(`${file}: ${line.trim()}`);
    }
  }
  assert.deepEqual(
    own,
    [],
    `a backend keeps its own start/stop protocol; use Lifecycle (runtimes/lifecycle.ts):\n` +
      own.join("\n"),
  );
});

Deno.test("the harness registry is typed, not cast", async () => {
  const source = await readFile(join(ROOT, "lib/tasks/harness_registry.ts"), "utf8");
  assert.match(source, /export const HARNESSES\b/);
  assert.deepEqual(typeAssertions(source), [], "lib/tasks/harness_registry.ts casts");
});

Deno.test("TaskData is inferred from its schema, not kept by hand beside it", async () => {
  const data = await readFile(join(ROOT, "lib/tasks/task_data.ts"), "utf8");
  // Its type is the schema's own (a zod object of the shape), as the public API needs it.
  assert.match(
    data,
    /export const TaskDataSchema: z\.ZodObject<TaskDataShape, z\.core\.\$loose> = z\.looseObject<\s*TaskDataShape\s*>\(/,
  );
  assert.match(data, /z\.output<typeof TaskDataSchema>/);
  assert.match(data, /export interface TaskData extends InferredTaskData \{\}/);
  for (const { file, source } of await sources("lib")) {
    if (file === "lib/tasks/task_data.ts") continue;
    assert.doesNotMatch(source, /\binterface TaskData\b|\bconst TaskDataSchema\b/, file);
  }
});
