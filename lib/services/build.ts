/**
 * Images built from a folder with a Dockerfile through the Engine API (`POST /build`): the
 * folder goes to the engine as a tar, the image is tagged by the content's hash, and a tag
 * already present is not built again.
 * @module
 */
import { createHash } from "node:crypto";
import { readdir, readFile, stat } from "node:fs/promises";
import { join, relative } from "node:path";
import { DockerEngine } from "../../runtimes/docker/engine_api.ts";
import { excludeMatcher, packTar, type TarEntry } from "../../runtimes/_tar.ts";

/**
 * The `.dockerignore` of a context as a predicate on `/`-separated paths relative to it:
 * patterns are anchored at the context's root, `**` spans folders, `!` re-includes, the last
 * matching line wins, `#` starts a comment. The Dockerfile and `.dockerignore` always go.
 */
export async function dockerignore(dir: string): Promise<(path: string) => boolean> {
  const text = await readFile(join(dir, ".dockerignore"), "utf8").catch(() => "");
  const rules = text.split("\n").map((l) => l.trim()).filter((l) => l && !l.startsWith("#"))
    .map((line) => {
      const negate = line.startsWith("!");
      const pattern = line.replace(/^!/, "").replace(/^\.?\//, "").replace(/\/$/, "");
      return { negate, match: excludeMatcher([`/${pattern}`]) };
    });
  return (path) => {
    if (path === "Dockerfile" || path === ".dockerignore") return false;
    let ignored = false;
    for (const r of rules) if (r.match(path)) ignored = !r.negate;
    return ignored;
  };
}

/**
 * The files under `dir` as tar entries, sorted and with a fixed mtime, so the same folder
 * gives the same archive; names are relative to `dir` (under `prefix/` when given), `.git`
 * and what `ignore` accepts are left out.
 */
export async function folderEntries(
  dir: string,
  options: { prefix?: string; ignore?: (path: string) => boolean } = {},
): Promise<TarEntry[]> {
  const out: TarEntry[] = [];
  const walk = async (path: string) => {
    for (const name of (await readdir(path)).sort()) {
      if (name === ".git") continue;
      const full = join(path, name);
      const info = await stat(full);
      const rel = relative(dir, full).split("\\").join("/");
      if (options.ignore?.(rel)) continue;
      const entryName = options.prefix ? `${options.prefix}/${rel}` : rel;
      if (info.isDirectory()) {
        out.push({ name: entryName, type: "directory", mode: info.mode & 0o777, mtime: 0 });
        await walk(full);
      } else if (info.isFile()) {
        out.push({
          name: entryName,
          type: "file",
          data: new Uint8Array(await readFile(full)),
          mode: info.mode & 0o777,
          mtime: 0,
        });
      }
    }
  };
  await walk(dir);
  return out;
}

/**
 * Build the image of a folder (its `Dockerfile`, or `dockerfile`) unless an image of the
 * same content is already there; returns its tag, `vf-build-<name>:<content hash>`.
 * @throws {SandboxImageError} when the build fails (with its last output)
 */
export async function buildImage(
  name: string,
  context: string,
  options: { dockerfile?: string; signal?: AbortSignal } = {},
): Promise<string> {
  const entries = await folderEntries(context, { ignore: await dockerignore(context) });
  const hash = createHash("sha256");
  hash.update(options.dockerfile ?? "Dockerfile");
  for (const e of entries) {
    hash.update(`${e.type}\0${e.name}\0${e.mode}\0`);
    if (e.data) hash.update(e.data);
  }
  const tag = `vf-build-${name.toLowerCase().replace(/[^a-z0-9_.-]/g, "-")}:${
    hash.digest("hex").slice(0, 16)
  }`;
  const engine = DockerEngine.shared();
  if (await engine.inspectImage(tag)) return tag;
  await engine.buildImage(packTar(entries), {
    tag,
    dockerfile: options.dockerfile,
    labels: { "vf.managed": "1" },
    signal: options.signal,
  });
  return tag;
}
