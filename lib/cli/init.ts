/**
 * `vf init`: scaffold an environment package — a folder with `mod.ts`, a test, a
 * `deno.json` and a README — that `vf validate ./<name>` (a taskset) or `vf eval ./<name>`
 * (an environment) runs at once.
 *
 * The package's `mod.ts` imports vf by a relative path or URL computed here, not by the
 * `"vf"` alias of its `deno.json`: the CLI loads a local package with a dynamic import,
 * and that import does not apply the package's own import map.
 * @module
 */
import { existsSync } from "node:fs";
import process from "node:process";
import { mkdir, readdir, stat, writeFile } from "node:fs/promises";
import { basename, isAbsolute, join, relative, resolve } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";
import yargsParser from "npm:yargs-parser@^22.0.0";
import { ConfigError } from "../errors.ts";
import { terminalText } from "../util/terminal.ts";

/** What `vf init` scaffolds. */
export type PackageKind = "taskset" | "environment";

/** The kinds {@link initPackage} knows. */
export const PACKAGE_KINDS: readonly PackageKind[] = ["taskset", "environment"];

/** Options of {@link initPackage}. */
export interface InitPackageOptions {
  /** `taskset` (sandboxed tasks, `loadTaskset`) or `environment` (`loadEnvironment`).
   * Default `"taskset"`. */
  kind?: PackageKind;
  /** Where the package imports vf from: a URL of vf's `mod.ts` (or of the folder holding
   * it), or a local path to either. Default: this vf's own `mod.ts` — a path relative to
   * the package when vf runs from local source, the URL when vf runs from a URL. */
  vf?: string;
}

/** What {@link initPackage} did. */
export interface InitPackageResult {
  /** The package folder, absolute. */
  dir: string;
  /** The package name (the folder's name). */
  name: string;
  kind: PackageKind;
  /** The specifier the package's files import vf with. */
  vfSpecifier: string;
  /** The files written, relative to `dir`. */
  files: string[];
}

const NAME_RE = /^[A-Za-z0-9][A-Za-z0-9_-]*$/;
const URL_RE = /^[A-Za-z][A-Za-z0-9+.-]*:\/\//;

/**
 * Scaffold an environment package in `dir` (created; an existing folder must be empty).
 *
 * @param dir the package folder; its name is the package name
 * @param options the kind and where to import vf from
 * @returns the folder, the vf specifier and the files written
 * @throws {ConfigError} when `dir` exists and is not an empty folder, the name is not a valid
 *   package name, the kind is unknown, or vf's `mod.ts` cannot be found
 */
export async function initPackage(
  dir: string,
  options: InitPackageOptions = {},
): Promise<InitPackageResult> {
  const kind = options.kind ?? "taskset";
  if (!PACKAGE_KINDS.includes(kind)) {
    throw new ConfigError(`Unknown package kind "${kind}"; kinds: ${PACKAGE_KINDS.join(", ")}`);
  }
  const target = resolve(dir);
  const name = basename(target);
  if (!NAME_RE.test(name)) {
    throw new ConfigError(
      `Package name "${name}" must start with a letter or digit and contain only letters, digits, "-" and "_"`,
    );
  }
  await ensureEmptyFolder(dir, target);
  const vfSpecifier = vfSpecifierFor(target, options.vf);
  const files = kind === "taskset"
    ? tasksetFiles(name, vfSpecifier)
    : environmentFiles(name, vfSpecifier);
  await mkdir(target, { recursive: true });
  for (const [file, text] of Object.entries(files)) {
    await writeFile(join(target, file), text, { flag: "wx" });
  }
  return { dir: target, name, kind, vfSpecifier, files: Object.keys(files) };
}

async function ensureEmptyFolder(dir: string, target: string): Promise<void> {
  let info;
  try {
    info = await stat(target);
  } catch {
    return;
  }
  if (!info.isDirectory()) {
    throw new ConfigError(`"${dir}" already exists and is not a folder; choose another name`);
  }
  if ((await readdir(target)).length > 0) {
    throw new ConfigError(
      `Folder "${dir}" already exists and is not empty; choose another name or remove it first`,
    );
  }
}

/** The specifier the package uses for vf's `mod.ts`: a URL as given, else a relative path. */
function vfSpecifierFor(packageDir: string, vf: string | undefined): string {
  if (vf !== undefined && URL_RE.test(vf)) {
    if (vf.startsWith("file:")) return relativeSpecifier(packageDir, modPath(fileURLToPath(vf)));
    return /\.(ts|js|mjs)$/.test(vf) ? vf : `${vf.replace(/\/+$/, "")}/mod.ts`;
  }
  if (vf !== undefined) return relativeSpecifier(packageDir, modPath(resolve(vf)));
  const own = new URL("../../mod.ts", import.meta.url);
  if (own.protocol !== "file:") return own.href;
  const path = fileURLToPath(own);
  if (!existsSync(path)) {
    throw new ConfigError(
      `Cannot find vf's mod.ts next to this program ("${path}"); pass --vf <url or path of vf's mod.ts>`,
    );
  }
  return relativeSpecifier(packageDir, path);
}

function modPath(path: string): string {
  const file = existsSync(path) && !/\.(ts|js|mjs)$/.test(path) ? join(path, "mod.ts") : path;
  if (!existsSync(file)) throw new ConfigError(`--vf: "${file}" does not exist`);
  return file;
}

function relativeSpecifier(fromDir: string, file: string): string {
  const rel = relative(fromDir, file);
  // No relative path between two Windows drives: use the file URL.
  if (isAbsolute(rel)) return pathToFileURL(file).href;
  const posix = rel.replaceAll("\\", "/");
  return posix.startsWith(".") ? posix : `./${posix}`;
}

/** `hello_world` → `HelloWorld`; a leading digit gets a `P` in front. */
function pascalCase(name: string): string {
  const out = name.split(/[-_]+/).filter(Boolean).map((p) => p[0].toUpperCase() + p.slice(1))
    .join("");
  return /^[0-9]/.test(out) ? `P${out}` : out;
}

function importLine(names: string[], specifier: string): string {
  // Lay it out as `deno fmt` (line width 100) would, so a new package passes `deno fmt --check`.
  const line = `import { ${names.join(", ")} } from "${specifier}";`;
  if (line.length <= 100) return line;
  return `import {\n${names.map((n) => `  ${n},\n`).join("")}} from "${specifier}";`;
}

function packageDenoJson(vfSpecifier: string): string {
  return JSON.stringify(
    {
      imports: { vf: vfSpecifier },
      tasks: { test: "deno test -A" },
      fmt: { lineWidth: 100, proseWrap: "preserve" },
      // mod.ts imports vf by path or URL on purpose (see README.md).
      lint: { rules: { exclude: ["no-import-prefix"] } },
    },
    null,
    2,
  ) + "\n";
}

function tasksetFiles(name: string, vf: string): Record<string, string> {
  const id = name.replaceAll("_", "-");
  const cls = pascalCase(name);
  const mod = `/**
 * ${name}: a vf taskset. In a busybox container, the agent writes a greeting word into
 * /app/output/greeting.txt; grading happens in a fresh, isolated sandbox that receives only
 * /app/output.
 * @module
 */
${
    importLine(
      ["readText", "reward", "Task", "type TaskHookContext", "Taskset", "type TasksetConfig"],
      vf,
    )
  }

/** The file the agent must write. */
export const OUTPUT = "/app/output/greeting.txt";

/** One task per word; the word stays on the evaluator (only the prompt reaches the agent). */
export const WORDS = ["hello", "bonjour"];

/** One task: write \`word\` into {@link OUTPUT}. */
export class ${cls}Task extends Task {
  static override NEEDS_CONTAINER = true;

  get word(): string {
    return this.data.word as string;
  }

  override async setup({ runtime }: TaskHookContext): Promise<void> {
    // An untouched workspace must score 0, not fail on a missing file.
    await runtime.write(OUTPUT, "");
  }

  correct = reward(async ({ runtime }) => {
    const text = await readText(runtime, OUTPUT, 1024);
    return text.trim() === this.word ? 1 : 0;
  });

  /** The gold answer: \`vf validate\` expects reward 1.0 after this. */
  override async validate(ctx: TaskHookContext): Promise<boolean> {
    await ctx.runtime.write(OUTPUT, \`\${this.word}\\n\`);
    return (await this.correct(ctx)) === 1;
  }
}

/** The taskset. Config: \`image\` (default "busybox"), \`task\` (knobs for every task). */
export class ${cls}Taskset extends Taskset<${cls}Task> {
  get id(): string {
    return "${id}";
  }

  *load(): Iterable<${cls}Task> {
    for (const [i, word] of WORDS.entries()) {
      yield new ${cls}Task({
        id: \`${id}-\${i}\`,
        prompt: \`Write the word "\${word}" (and nothing else) into \${OUTPUT}.\`,
        image: (this.config.image as string | undefined) ?? "busybox",
        workdir: "/app",
        scoring: { mode: "isolated" },
        artifacts: [{ source: "/app/output" }],
        word,
      }, this.config.task ?? {});
    }
  }
}

/** Entry point used by \`vf validate ./${name}\` and \`vf run ./${name}\`. */
export function loadTaskset(config: TasksetConfig = {}): ${cls}Taskset {
  return new ${cls}Taskset(config);
}
`;
  const test = `import assert from "node:assert/strict";
import { Task } from "vf";
import { loadTaskset, OUTPUT, WORDS } from "./mod.ts";

Deno.test("loadTaskset() loads one task per word, each naming the output file", async () => {
  const tasks = await loadTaskset().tasks();
  assert.equal(tasks.length, WORDS.length);
  for (const [i, task] of tasks.entries()) {
    assert.ok(task instanceof Task);
    assert.equal(task.key, \`${id}-\${i}\`);
    assert.ok(task.needsContainer);
    assert.match(task.promptText, new RegExp(\`"\${WORDS[i]}"\`));
    assert.ok(task.promptText.includes(OUTPUT));
    assert.deepEqual(task.scoreHooks().map((h) => h.name), ["correct"]);
  }
});

Deno.test("the image can be changed from the taskset config", async () => {
  const [task] = await loadTaskset({ image: "alpine" }).tasks(1);
  assert.equal(task.data.image, "alpine");
});
`;
  const readme = `# ${name}

A vf taskset: in a \`busybox\` container the agent writes a greeting word into
\`/app/output/greeting.txt\`. Grading runs in a fresh, isolated sandbox that receives only
\`/app/output\`, so nothing else the agent did can affect the score.

- \`mod.ts\` — the tasks (\`${cls}Task\`), their setup, reward and gold answer
  (\`validate()\`), and \`loadTaskset(config)\`, the entry point vf calls.
- \`mod_test.ts\` — a test of the task list that needs no Docker.
- \`deno.json\` — maps \`"vf"\` to vf's \`mod.ts\` for your own \`deno test\`/\`deno check\`.
  \`mod.ts\` imports vf by path or URL directly (\`${vf}\`), because the \`vf\` command loads this
  folder with a dynamic import that does not read this \`deno.json\`. If you move the folder,
  update both.

## Test and validate

\`\`\`sh
cd ${name} && deno test -A          # the unit test (no Docker)
vf validate ./${name}               # gold answers score 1.0, untouched workspaces 0.0
\`\`\`

\`vf validate\` needs a Docker engine with the \`busybox\` image; from a vf checkout run
\`deno run -A <vf>/cli.ts validate ./${name}\`. Use \`--runtime.image <image>\` or
\`loadTaskset({ image })\` for another image.

## Run a model

\`\`\`sh
vf run ./${name} -m <model> -b <base url> -n 2 -r 1
\`\`\`

The agent gets a bash tool inside the container. Results go to
\`outputs/evals/${id}--<model>/<run id>/traces.jsonl\`.

## Make it yours

Change \`WORDS\`, the prompt, \`setup()\` (what the sandbox holds before the agent starts),
the reward (any field wrapped in \`reward(...)\`; \`metric(...)\` for ones that do not count)
and \`validate()\` (write the gold answer). Keep \`vf validate\` passing: it proves that the
task can be solved and that doing nothing does not score.
`;
  return {
    "mod.ts": mod,
    "mod_test.ts": test,
    "deno.json": packageDenoJson(vf),
    "README.md": readme,
  };
}

function environmentFiles(name: string, vf: string): Record<string, string> {
  const id = name.replaceAll("_", "-");
  const mod = `/**
 * ${name}: a vf environment. Three inline questions, each answered in one turn and scored
 * by exact match of the model's answer.
 * @module
 */
${importLine(["type RewardContext", "Rubric", "SingleTurnEnv"], vf)}

/** The rows: \`question\` becomes the user message; \`answer\` stays with the rubric. */
export const ROWS = [
  { question: "What is the capital of France?", answer: "Paris" },
  { question: "How many legs does a spider have? Answer with a number.", answer: "8" },
  { question: "What is the chemical symbol for gold?", answer: "Au" },
];

/** The system prompt every rollout starts with. */
export const SYSTEM_PROMPT = "Reply with the answer only: no explanation.";

/** Defaults \`vf eval\` uses when -n / -r are not given. */
export const evalDefaults = { num_examples: 3, rollouts_per_example: 2 };

/** 1 when the answer matches, ignoring case, surrounding space and a final period. */
export function exactAnswer({ completion, answer, parser }: RewardContext): number {
  const normalize = (text: string) => text.trim().replace(/\\.$/, "").toLowerCase();
  return normalize(parser.parseAnswer(completion) ?? "") === normalize(answer) ? 1 : 0;
}

/** Entry point used by \`vf eval ./${name}\`. Args: \`system_prompt\`. */
export function loadEnvironment(args: Record<string, unknown> = {}): SingleTurnEnv {
  return new SingleTurnEnv({
    evalDataset: ROWS,
    systemPrompt: typeof args.system_prompt === "string" ? args.system_prompt : SYSTEM_PROMPT,
    rubric: new Rubric({ funcs: [exactAnswer] }),
    envId: "${id}",
    envArgs: args,
  });
}
`;
  const test = `import assert from "node:assert/strict";
import { Parser, type RewardContext } from "vf";
import { exactAnswer, loadEnvironment, ROWS, SYSTEM_PROMPT } from "./mod.ts";

Deno.test("loadEnvironment() formats every row as a system + user prompt", async () => {
  const rows = (await loadEnvironment().getEvalDataset()).toList();
  assert.equal(rows.length, ROWS.length);
  for (const [i, row] of rows.entries()) {
    assert.equal(row.example_id, i);
    assert.equal(row.answer, ROWS[i].answer);
    assert.deepEqual(row.prompt, [
      { role: "system", content: SYSTEM_PROMPT },
      { role: "user", content: ROWS[i].question },
    ]);
  }
});

Deno.test("exactAnswer() scores 1 for the answer (any case, final period) and 0 otherwise", () => {
  const score = (reply: string) =>
    exactAnswer({
      completion: [{ role: "assistant", content: reply }],
      answer: "Paris",
      parser: new Parser(),
    } as RewardContext);
  assert.equal(score("paris."), 1);
  assert.equal(score(" Paris "), 1);
  assert.equal(score("London"), 0);
});
`;
  const readme = `# ${name}

A vf environment: three inline questions, each answered in one turn and
scored by exact match (ignoring case, surrounding space and a final period).

- \`mod.ts\` — the rows, the system prompt, the reward function \`exactAnswer\` and
  \`loadEnvironment(args)\`, the entry point vf calls.
- \`mod_test.ts\` — tests of the prompt formatting and the reward (no model needed).
- \`deno.json\` — maps \`"vf"\` to vf's \`mod.ts\` for your own \`deno test\`/\`deno check\`.
  \`mod.ts\` imports vf by path or URL directly (\`${vf}\`), because the \`vf\` command loads this
  folder with a dynamic import that does not read this \`deno.json\`. If you move the folder,
  update both.

## Test and evaluate

\`\`\`sh
cd ${name} && deno test -A                                # the unit tests
vf eval ./${name} -m <model> -b <base url> -n 3 -r 2
\`\`\`

From a vf checkout use \`deno run -A <vf>/cli.ts eval ./${name} ...\`. \`-b\` takes any
OpenAI-compatible base URL (a local vLLM or Ollama server works); the key is read from
\`$OPENAI_API_KEY\` unless \`-k <VAR>\` names another variable. Results go to
\`outputs/evals/${id}--<model>/<run id>/results.jsonl\`.

## Make it yours

Replace \`ROWS\` with your data (or return a dataset from \`loadHubDataset\`/\`loadDataset\`), and
add reward functions to the \`Rubric\` (\`funcs\` with \`weights\`; weight 0 records a metric).
`;
  return {
    "mod.ts": mod,
    "mod_test.ts": test,
    "deno.json": packageDenoJson(vf),
    "README.md": readme,
  };
}

const INIT_HELP = `vf init <name> [--kind taskset|environment] [--vf <url or path>]

Creates the folder <name>/ with mod.ts, mod_test.ts, deno.json and README.md: a working
minimal taskset (default; try: vf validate ./<name>) or, with --kind environment, a
single-turn environment (try: vf eval ./<name>). Refuses a folder that is not empty.
  --vf <url or path>   where the package imports vf's mod.ts from (default: this vf)
`;

export async function cmdInit(argv: string[]): Promise<number> {
  const flags = yargsParser(argv, {
    configuration: { "parse-numbers": false, "parse-positional-numbers": false },
    string: ["kind", "vf"],
    boolean: ["help", "h"],
  });
  if (flags.help || flags.h) {
    process.stdout.write(INIT_HELP);
    return 0;
  }
  const positional = flags._.map(String);
  if (positional.length !== 1) {
    throw new ConfigError(
      "vf init needs one package name: vf init my_taskset [--kind taskset|environment]",
    );
  }
  const kind = String(flags.kind ?? "taskset");
  if (!(PACKAGE_KINDS as readonly string[]).includes(kind)) {
    throw new ConfigError(`--kind "${kind}" is not one of: ${PACKAGE_KINDS.join(", ")}`);
  }
  const result = await initPackage(positional[0], { kind: kind as PackageKind, vf: flags.vf });
  // A bare name would be read as a built-in id, so point at the folder explicitly.
  const path = /^[./]/.test(positional[0]) ? positional[0] : `./${positional[0]}`;
  const next = kind === "taskset"
    ? `vf validate ${path}`
    : `vf eval ${path} -m <model> -b <base url>`;
  process.stdout.write(
    `Created ${kind} package "${terminalText(result.name)}" in ${terminalText(result.dir)}: ${
      terminalText(result.files.join(", "))
    }\n` +
      `vf is imported from ${terminalText(result.vfSpecifier)}\n` +
      `Next: (cd ${terminalText(path)} && deno test -A) and ${terminalText(next)}\n`,
  );
  return 0;
}
