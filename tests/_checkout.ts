/**
 * A copy of this checkout as a fresh clone would have it: every file git tracks or would track
 * (uncommitted edits included), and nothing it ignores (no `node_modules`, `outputs`, `dist`).
 * For tests of what a new user hits on a first run.
 * @module
 */
import { fileURLToPath } from "node:url";
import { dirname, join } from "node:path";
import { copyFile, mkdir } from "node:fs/promises";
import { type TempDir, tempDir } from "./_cli.ts";

/** This checkout's root. */
export const ROOT = fileURLToPath(new URL("..", import.meta.url));

/** Copies the checkout into a new temporary folder, removed when disposed. */
export async function freshCopy(prefix: string): Promise<TempDir> {
  const listed = await new Deno.Command("git", {
    args: ["ls-files", "-z", "--cached", "--others", "--exclude-standard"],
    cwd: ROOT,
    stdout: "piped",
    stderr: "piped",
  }).output();
  if (!listed.success) {
    throw new Error(`git ls-files failed in "${ROOT}": ${new TextDecoder().decode(listed.stderr)}`);
  }
  const files = new TextDecoder().decode(listed.stdout).split("\0").filter((f) => f !== "");
  const tmp = await tempDir(prefix);
  const made = new Set<string>();
  for (const file of files) {
    const target = join(tmp.path, file);
    const dir = dirname(target);
    if (!made.has(dir)) {
      await mkdir(dir, { recursive: true });
      made.add(dir);
    }
    // A file deleted in the working tree but still in the index is not in a fresh clone.
    await copyFile(join(ROOT, file), target).catch((e) => {
      if ((e as { code?: string }).code !== "ENOENT") throw e;
    });
  }
  return tmp;
}
