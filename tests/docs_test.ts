/**
 * The README and the guides in docs/ cannot rot unnoticed: every TypeScript block in them is
 * type-checked against the current code, every relative link points at a file (and heading) that
 * exists, the README keeps the commands CI runs, and the CLI reference has a section for every
 * command the dispatcher knows.
 * @module
 */
import assert from "node:assert/strict";
import { dirname, join, relative } from "node:path";
import { runDeno, tempDir, transcript } from "./_cli.ts";
import { ROOT } from "./_checkout.ts";

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

Deno.test("every TypeScript block in README.md and docs/ type-checks", async () => {
  const files = await markdownFiles();
  assert.ok(files.length > 5, `only ${files}`);
  const res = await runDeno(["check", "--doc-only", "--quiet", ...files], {
    cwd: ROOT,
    registry: false,
  });
  assert.equal(res.code, 0, transcript(res));
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
