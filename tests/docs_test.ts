/**
 * The README and the guides in docs/ cannot rot unnoticed: every TypeScript block in them is
 * type-checked against the current code, every relative link points at a file (and heading) that
 * exists, the README keeps the commands CI runs, and the CLI reference has a section for every
 * command the dispatcher knows.
 * @module
 */
import assert from "node:assert/strict";
import { dirname, join, relative } from "node:path";
import { fileURLToPath } from "node:url";
import { runDeno, tempDir, transcript } from "./_cli.ts";
import { ROOT } from "./_checkout.ts";
import { currentHelp, helpBlocks } from "../scripts/cli_reference.ts";
import { readHarborSettings } from "../lib/harbor/settings.ts";
import { EvalConfig } from "../lib/config.ts";
import { validateRunConfig } from "../lib/cli/run_config.ts";
import { parse as parseToml } from "npm:smol-toml@^1.4.0";

/** README.md and every guide in docs/, as paths relative to the checkout. */
async function markdownFiles(): Promise<string[]> {
  const files = ["README.md"];
  for await (const entry of Deno.readDir(join(ROOT, "docs"))) {
    if (entry.isFile && entry.name.endsWith(".md")) files.push(`docs/${entry.name}`);
  }
  return files.sort();
}

/** GitHub's anchor for a heading: lower case, punctuation dropped, spaces to dashes. */
function slug(heading: string): string {
  return heading.trim().toLowerCase().replace(/[^\p{L}\p{N} _-]/gu, "").replace(/ /g, "-");
}

/** The anchors of a markdown file's headings (outside code blocks). */
function anchors(text: string): Set<string> {
  const found = new Set<string>();
  let fenced = false;
  for (const line of text.split("\n")) {
    if (line.startsWith("```")) fenced = !fenced;
    const heading = !fenced && /^#{1,6} (.+)$/.exec(line);
    if (heading) found.add(slug(heading[1]));
  }
  return found;
}

/** Languages whose blocks are TypeScript, as a fence's info string names them. */
const TYPESCRIPT = new Set(["ts", "typescript", "tsx", "mts", "cts"]);

/** A fenced code block of a markdown file. */
interface Block {
  /** The info string's first word, lower case ("" when none). */
  lang: string;
  /** The whole info string, as written. */
  info: string;
  /** The fence as written (``` or ~~~, with its indentation). */
  fence: string;
  /** 1-based line of the opening fence. */
  line: number;
  body: string;
}

/** Every fenced block of a markdown text (``` or ~~~ fences, at any indentation). */
function fencedBlocks(text: string): Block[] {
  const blocks: Block[] = [];
  const lines = text.split("\n");
  for (let i = 0; i < lines.length; i++) {
    const open = /^(\s*)(`{3,}|~{3,})\s*(.*)$/.exec(lines[i]);
    if (!open) continue;
    const [, indent, marks, info] = open;
    const close = new RegExp(`^\\s*${marks[0] === "`" ? "`" : "~"}{${marks.length},}\\s*$`);
    let end = i + 1;
    while (end < lines.length && !close.test(lines[end])) end++;
    blocks.push({
      lang: info.trim().split(/\s+/)[0].toLowerCase(),
      info: info.trim(),
      fence: indent + marks,
      line: i + 1,
      body: lines.slice(i + 1, end).join("\n"),
    });
    i = end;
  }
  return blocks;
}

/** The blocks `deno check --doc-only` reports as checked, as "file#line" of their opening fence. */
function checkedBlocks(output: string): Set<string> {
  const found = new Set<string>();
  for (const [, file, line] of output.matchAll(/^Check (\S+?)#(\d+)-\d+\.\w+$/gm)) {
    const path = file.startsWith("file://") ? relative(ROOT, fileURLToPath(file)) : file;
    found.add(`${path}#${line}`);
  }
  return found;
}

Deno.test("every TypeScript block in README.md and docs/ type-checks, and none is skipped", async () => {
  const files = await markdownFiles();
  assert.ok(files.length > 5, `only ${files}`);
  const res = await runDeno(["check", "--doc-only", ...files], { cwd: ROOT, registry: false });
  assert.equal(res.code, 0, transcript(res));
  // deno check reads only ``` fences whose language it knows and skips `ignore`: a block it
  // skipped would rot unnoticed, so every TypeScript block must be among those it checked.
  const checked = checkedBlocks(res.stdout + res.stderr);
  const skipped: string[] = [];
  let typescript = 0;
  for (const file of files) {
    for (const block of fencedBlocks(await Deno.readTextFile(join(ROOT, file)))) {
      if (!TYPESCRIPT.has(block.lang)) continue;
      typescript++;
      if (!checked.has(`${file}#${block.line}`)) {
        skipped.push(`${file}:${block.line}: ${block.fence}${block.info} is not type-checked`);
      }
    }
  }
  assert.deepEqual(skipped, [], "write these as ```ts (no ignore, no ~~~ fence)");
  assert.ok(typescript >= 8, `only ${typescript} TypeScript blocks found`);
  assert.equal(checked.size, typescript, transcript(res));
});

Deno.test("the docs check fails when a README block no longer matches the code, naming the block", async () => {
  // A scratch checkout: README.md and docs/ copied, everything else linked to this one.
  await using tmp = await tempDir("vf_docs_broken_");
  for await (const entry of Deno.readDir(ROOT)) {
    if (["README.md", "docs", ".git"].includes(entry.name)) continue;
    await Deno.symlink(join(ROOT, entry.name), join(tmp.path, entry.name));
  }
  await Deno.mkdir(join(tmp.path, "docs"));
  const files = await markdownFiles();
  for (const file of files) await Deno.copyFile(join(ROOT, file), join(tmp.path, file));
  const readme = await Deno.readTextFile(join(ROOT, "README.md"));
  const block = fencedBlocks(readme).find((b) =>
    b.lang === "ts" && b.body.includes("getFormatStr")
  );
  assert.ok(block, "README.md has no TypeScript block calling parser.getFormatStr()");
  // A method the parser does not have, as after a rename in lib/ that the README missed.
  await Deno.writeTextFile(
    join(tmp.path, "README.md"),
    readme.replace("parser.getFormatStr()", "parser.getFormatString()"),
  );
  const res = await runDeno(["check", "--doc-only", ...files], { cwd: tmp.path, registry: false });
  assert.notEqual(res.code, 0, transcript(res));
  assert.match(res.stderr, /TS2551|TS2339/, transcript(res));
  assert.match(res.stderr, /getFormatString/, transcript(res));
  assert.match(res.stderr, new RegExp(`README\\.md#${block.line}-`), transcript(res));
});

Deno.test("the docs check fails on a markdown TypeScript block with a type error", async () => {
  // The control: deno check --doc-only reads markdown blocks at all.
  await using tmp = await tempDir("vf_docs_");
  const file = join(tmp.path, "guide.md");
  await Deno.writeTextFile(file, '# Guide\n\n```ts\nconst n: number = "one";\n```\n');
  const res = await runDeno(["check", "--doc-only", "--quiet", file], {
    cwd: ROOT,
    registry: false,
  });
  assert.notEqual(res.code, 0, transcript(res));
  assert.match(res.stderr, /TS2322/, transcript(res));
});

Deno.test("every relative link in README.md and docs/ points at a file and heading that exist", async () => {
  const broken: string[] = [];
  for (const file of await markdownFiles()) {
    const text = await Deno.readTextFile(join(ROOT, file));
    const prose = text.replace(/```[\s\S]*?```/g, "");
    for (const [, target] of prose.matchAll(/\]\(([^)\s]+)\)/g)) {
      if (/^[a-z]+:/.test(target)) continue; // https:, mailto:
      const [path, anchor] = target.split("#");
      const resolved = path === "" ? join(ROOT, file) : join(ROOT, dirname(file), path);
      const shown = `${file}: (${target})`;
      let body: string;
      try {
        const info = await Deno.stat(resolved);
        if (info.isDirectory || anchor === undefined) continue;
        body = await Deno.readTextFile(resolved);
      } catch {
        broken.push(`${shown}: no file ${relative(ROOT, resolved)}`);
        continue;
      }
      if (!anchors(body).has(anchor)) broken.push(`${shown}: no heading "#${anchor}"`);
    }
  }
  assert.deepEqual(broken, []);
});

Deno.test("the README is a landing page that keeps the commands CI runs", async () => {
  const readme = await Deno.readTextFile(join(ROOT, "README.md"));
  const lines = readme.split("\n").length;
  assert.ok(lines <= 250, `README.md has ${lines} lines; move detail into docs/`);
  const ci = await Deno.readTextFile(join(ROOT, ".ci/run"));
  const commands = ci.split("\n").filter((l) => l.startsWith("npx "));
  assert.ok(commands.length >= 2, ci);
  for (const command of [...commands, "npx --yes deno@2.9.6 task install"]) {
    assert.ok(readme.includes(`\n${command}\n`), `README.md does not show "${command}"`);
  }
});

Deno.test("docs/cli.md has a section for every command of cli.ts", async () => {
  const cli = await Deno.readTextFile(join(ROOT, "cli.ts"));
  const reference = await Deno.readTextFile(join(ROOT, "docs/cli.md"));
  const commands = [...cli.matchAll(/case "([a-z]+)":/g)].map((m) => m[1])
    .filter((c) => !["help", "version"].includes(c));
  assert.ok(commands.includes("eval") && commands.includes("serve"), `${commands}`);
  const missing = commands.filter((c) => !reference.includes(`\n## vf ${c}\n`));
  assert.deepEqual(missing, [], "docs/cli.md lacks these commands");
});

/** `vf [command] --help` now, run once per command for all the tests here. */
const helps = new Map<string | null, Promise<string>>();
function helpOf(command: string | null): Promise<string> {
  if (!helps.has(command)) helps.set(command, currentHelp(command));
  return helps.get(command)!;
}

Deno.test("docs/cli.md shows each command's current --help text", async () => {
  const text = await Deno.readTextFile(join(ROOT, "docs/cli.md"));
  const blocks = helpBlocks(text);
  const sections = [...text.matchAll(/^## vf ([a-z]+)$/gm)].map((m) => m[1]);
  assert.deepEqual(blocks.map((b) => b.command), [null, ...sections], "a section without help");
  const current = await Promise.all(blocks.map((b) => helpOf(b.command)));
  const stale: string[] = [];
  for (const [i, block] of blocks.entries()) {
    if (current[i] !== block.shown) {
      stale.push(`docs/cli.md:${block.line}: vf ${block.command ?? ""} --help differs`);
    }
  }
  assert.deepEqual(stale, [], "run deno run -A scripts/cli_reference.ts to rewrite them");
});

/** `vf` command lines of sh blocks and inline code in README.md and docs/, with where they are. */
async function shownCommands(): Promise<{ where: string; words: string[] }[]> {
  const found: { where: string; words: string[] }[] = [];
  const add = (where: string, line: string) => {
    // From `vf` (or `deno task vf`) to the end of the command: a comment, `&&`, `|` or `;`.
    const m = /(?:^|[\s;&|(])vf (.*)$/.exec(line);
    if (!m) return;
    const command = m[1].split(/\s#|&&|\|\||[|;]/)[0];
    found.push({ where, words: command.trim().split(/\s+/).filter((w) => w !== "\\") });
  };
  for (const file of await markdownFiles()) {
    const text = await Deno.readTextFile(join(ROOT, file));
    for (const block of fencedBlocks(text)) {
      if (!["sh", "bash", "shell"].includes(block.lang)) continue;
      block.body.split("\n").forEach((line, i) => add(`${file}:${block.line + 1 + i}`, line));
    }
    const lines = text.replace(/```[\s\S]*?```/g, (b) => b.replace(/[^\n]/g, "")).split("\n");
    lines.forEach((line, i) => {
      for (const [, code] of line.matchAll(/`(vf [^`]+)`/g)) add(`${file}:${i + 1}`, code);
    });
  }
  return found;
}

Deno.test("every vf command shown in README.md and docs/ exists and takes the flags shown", async () => {
  const top = await helpOf(null);
  const wrong: string[] = [];
  let flags = 0;
  for (const { where, words } of await shownCommands()) {
    const [command, ...rest] = words;
    if (command === undefined || !/^[a-z-]+$/.test(command)) continue; // `vf --version`, `vf …`
    if (!new RegExp(`^  vf ${command}\\b`, "m").test(top)) {
      wrong.push(`${where}: vf ${command}: no such command`);
      continue;
    }
    const help = await helpOf(command);
    for (const word of rest) {
      // A flag as written, without its value; dotted config keys (--env.x, --client.timeout)
      // are checked by the config schema, not the help.
      const flag = /^(--?[A-Za-z][\w-]*)(=.*)?$/.exec(word)?.[1];
      if (!flag || word.includes(".")) continue;
      flags++;
      const listed = new RegExp(`(^|[\\s,\\[(|])${flag}(?![\\w-])`, "m");
      if (!listed.test(help)) wrong.push(`${where}: vf ${command} ${flag}: not in its --help`);
    }
  }
  assert.deepEqual(wrong, []);
  assert.ok(flags > 40, `only ${flags} flags found`);
});

Deno.test("every task.toml example in docs/harbor.md is one vf's Harbor loader reads", async () => {
  const text = await Deno.readTextFile(join(ROOT, "docs/harbor.md"));
  const examples = fencedBlocks(text).filter((b) => b.lang === "toml");
  assert.ok(examples.length >= 3, `only ${examples.length} task.toml examples`);
  const versions: string[] = [];
  for (const block of examples) {
    // Throws, naming the key, on a key vf does not know or cannot honour.
    const settings = readHarborSettings(block.body, `docs/harbor.md:${block.line}`);
    assert.deepEqual(settings.unknown, [], `docs/harbor.md:${block.line}`);
    versions.push(settings.schemaVersion ?? "");
  }
  // Harbor's first schema and its current one (separate verifiers, steps) are both shown.
  assert.ok(versions.includes("1.0") && versions.includes("1.3"), `${versions}`);
});

Deno.test("every vf config example in README.md and docs/ is one vf run accepts", async () => {
  const known = new Set(Object.keys(EvalConfig.shape));
  const refused: string[] = [];
  let checked = 0;
  for (const file of await markdownFiles()) {
    if (file === "docs/harbor.md") continue; // task.toml files, checked above
    const text = await Deno.readTextFile(join(ROOT, file));
    for (const block of fencedBlocks(text).filter((b) => b.lang === "toml")) {
      const where = `${file}:${block.line}`;
      const raw = parseToml(block.body) as Record<string, unknown>;
      // A piece of another file (a toolset entry's keys) has no key of a run's config.
      if (!Object.keys(raw).some((k) => known.has(k))) continue;
      checked++;
      // A snippet of a taskset run's config may leave out which taskset: file-sum stands in.
      const env = (raw.env ??= {}) as Record<string, unknown>;
      const taskset = (env.taskset ??= {}) as Record<string, unknown>;
      taskset.id ??= "file-sum";
      try {
        await validateRunConfig(raw, where);
      } catch (error) {
        refused.push((error as Error).message.split("\n")[0]);
      }
    }
  }
  assert.deepEqual(refused, []);
  assert.ok(checked >= 10, `only ${checked} config examples`);
});

Deno.test("every file of this tree that README.md and docs/ name in inline code exists", async () => {
  const missing: string[] = [];
  let named = 0;
  for (const file of await markdownFiles()) {
    if (file === "docs/harbor.md") continue; // its tests/, solution/ are a task folder's
    const text = await Deno.readTextFile(join(ROOT, file));
    const prose = text.replace(/```[\s\S]*?```/g, "");
    const spans = prose.matchAll(
      /`((?:lib|tests|scripts|environments|bench|runtimes|examples|chaos)\/[\w./-]+\.(?:ts|sh|md|json|py|txt|toml|yaml))(?::\d+)?`/g,
    );
    for (const [, path] of spans) {
      named++;
      try {
        await Deno.stat(join(ROOT, path));
      } catch {
        missing.push(`${file}: ${path}`);
      }
    }
  }
  assert.deepEqual(missing, []);
  assert.ok(named >= 20, `only ${named} files named`);
});
