/**
 * docs/cli.md shows the `--help` text of vf and of each command: the first ```text block at the
 * top of the file and under each `## vf <command>` heading. `deno run -A scripts/cli_reference.ts`
 * rewrites those blocks from the current CLI; tests/docs_test.ts fails while any differs.
 * @module
 */
import { fileURLToPath } from "node:url";
import { join } from "node:path";

/** The checkout's root. */
const ROOT = fileURLToPath(new URL("..", import.meta.url));

/** One help block of docs/cli.md. */
export interface HelpBlock {
  /** The command whose help it shows; `null` for vf's own (`vf --help`). */
  command: string | null;
  /** The 1-based line of the block's opening fence. */
  line: number;
  /** The block's text, without the fences, ending in a newline. */
  shown: string;
  /** Offsets of the block's text in the file: `text.slice(start, end) === shown`. */
  start: number;
  end: number;
}

/** The help blocks of docs/cli.md's text, in file order. */
export function helpBlocks(text: string): HelpBlock[] {
  const blocks: HelpBlock[] = [];
  const sections = [...text.matchAll(/^## vf ([a-z]+)$/gm)];
  const ranges: [string | null, number, number][] = [
    [null, 0, sections[0]?.index ?? text.length],
    ...sections.map((s, i): [string, number, number] => [
      s[1],
      s.index,
      sections[i + 1]?.index ?? text.length,
    ]),
  ];
  for (const [command, from, to] of ranges) {
    const fence = /^```text\n([\s\S]*?)^```$/m.exec(text.slice(from, to));
    if (!fence) continue;
    const start = from + fence.index + "```text\n".length;
    blocks.push({
      command,
      line: text.slice(0, from + fence.index).split("\n").length,
      shown: fence[1],
      start,
      end: start + fence[1].length,
    });
  }
  return blocks;
}

/** How many `vf --help` processes run at once (each is a Deno loading the whole CLI). */
const AT_ONCE = 4;
let running = 0;
const waiting: (() => void)[] = [];

/** What `vf [command] --help` prints now, run from this checkout's cli.ts. */
export async function currentHelp(command: string | null): Promise<string> {
  while (running >= AT_ONCE) await new Promise<void>((wake) => waiting.push(wake));
  running++;
  try {
    return await helpOutput(command);
  } finally {
    running--;
    waiting.shift()?.();
  }
}

async function helpOutput(command: string | null): Promise<string> {
  const args = ["run", "-A", join(ROOT, "cli.ts"), ...(command ? [command] : []), "--help"];
  const out = await new Deno.Command(Deno.execPath(), {
    args,
    cwd: ROOT,
    env: { NO_COLOR: "1" },
    stdin: "null",
    stdout: "piped",
    stderr: "piped",
  }).output();
  const decoder = new TextDecoder();
  if (!out.success) {
    throw new Error(`vf ${command ?? ""} --help failed: ${decoder.decode(out.stderr)}`);
  }
  return decoder.decode(out.stdout).trimEnd() + "\n";
}

/** docs/cli.md with every help block replaced by the current help. */
export async function updatedReference(text: string): Promise<string> {
  const blocks = helpBlocks(text);
  const helps = await Promise.all(blocks.map((b) => currentHelp(b.command)));
  let out = text;
  for (let i = blocks.length - 1; i >= 0; i--) {
    out = out.slice(0, blocks[i].start) + helps[i] + out.slice(blocks[i].end);
  }
  return out;
}

if (import.meta.main) {
  const path = join(ROOT, "docs/cli.md");
  const before = await Deno.readTextFile(path);
  const after = await updatedReference(before);
  if (after === before) {
    console.log(`${path}: every help block is current`);
  } else {
    await Deno.writeTextFile(path, after);
    console.log(`${path}: help blocks rewritten from the current CLI`);
  }
}
