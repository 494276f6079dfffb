/**
 * The one-line install (scripts/install.sh, `deno task install`): after it, `vf` (and `deno`)
 * are on PATH and work from any folder, on a machine whose only Deno is the one npx fetched.
 * Also the no-checkout form (`curl … | VF_REPO=… bash`), with a local git repository as the URL.
 * Every run uses a temporary HOME and bin folder and this machine's Deno cache (no registry).
 * @module
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { type CliResult, collect, transcript } from "./_cli.ts";
import { childEnv } from "./_child_env.ts";
import { freshCopy } from "./_checkout.ts";
import { VERSION } from "../lib/version.ts";

/** Programs the install script and the launcher use, and nothing else (no deno, no npx). */
const TOOLS = [
  "bash",
  "sh",
  "env",
  "git",
  "cat",
  "dirname",
  "mkdir",
  "cp",
  "mv",
  "chmod",
  "id",
  "head",
  "cut",
  "sed",
  "ls",
];

/** This machine's Deno cache, kept when HOME moves, so nothing is fetched from the registry. */
async function denoDir(): Promise<string> {
  const out = await new Deno.Command(Deno.execPath(), { args: ["info", "--json"], stdout: "piped" })
    .output();
  return JSON.parse(new TextDecoder().decode(out.stdout)).denoDir;
}

/** A folder of links to TOOLS, as found on this process's PATH. */
async function toolsDir(root: string): Promise<string> {
  const dir = join(root, "tools");
  await Deno.mkdir(dir, { recursive: true });
  for (const tool of TOOLS) {
    const found = await new Deno.Command("sh", {
      args: ["-c", `command -v ${tool}`],
      stdout: "piped",
    }).output();
    const path = new TextDecoder().decode(found.stdout).trim();
    assert.ok(path !== "", `"${tool}" is not on PATH`);
    await Deno.symlink(path, join(dir, tool));
  }
  return dir;
}

interface Shell {
  cwd: string;
  path: string[];
  home: string;
  env?: Record<string, string>;
  stdin?: string;
}

async function sh(args: string[], shell: Shell): Promise<CliResult> {
  const child = new Deno.Command(args[0], {
    args: args.slice(1),
    cwd: shell.cwd,
    env: childEnv(
      { PATH: shell.path.join(":"), HOME: shell.home, DENO_DIR: await denoDir(), ...shell.env },
      { registry: false },
    ),
    clearEnv: true,
    stdin: shell.stdin === undefined ? "null" : "piped",
    stdout: "piped",
    stderr: "piped",
  }).spawn();
  if (shell.stdin !== undefined) {
    const writer = child.stdin.getWriter();
    await writer.write(new TextEncoder().encode(shell.stdin));
    await writer.close();
  }
  return collect(child);
}

Deno.test("scripts/install.sh puts vf and deno on PATH; vf runs the demo from another folder", async () => {
  await using clone = await freshCopy("vf_install_");
  const root = await Deno.makeTempDir({ prefix: "vf_install_home_" });
  try {
    const tools = await toolsDir(root);
    const home = join(root, "home");
    const bin = join(root, "bin");
    const elsewhere = join(root, "elsewhere");
    await Deno.mkdir(home);
    await Deno.mkdir(elsewhere);
    // The only Deno is one in npx's cache, as after `npx --yes deno@2.9.6 task install`.
    // A copy, not a link: Deno reports its own path with links resolved.
    const npx = join(root, "npm/_npx/1f2e/node_modules/.bin");
    await Deno.mkdir(npx, { recursive: true });
    await Deno.mkdir(join(npx, "../deno"), { recursive: true });
    await Deno.copyFile(Deno.execPath(), join(npx, "../deno/deno"));
    await Deno.symlink("../deno/deno", join(npx, "deno"));

    const install = await sh(["bash", join(clone.path, "scripts/install.sh"), "--bin-dir", bin], {
      cwd: clone.path,
      path: [tools, npx],
      home,
    });
    assert.equal(install.code, 0, transcript(install));
    assert.match(install.stderr, /installed .*\/bin\/vf/, transcript(install));
    assert.match(install.stderr, /is not on PATH; add it/, transcript(install));
    // Deno was copied out of npx's cache (which npm may clean), not linked to it.
    assert.ok((await Deno.lstat(join(bin, "deno"))).isFile, transcript(install));
    assert.match(
      await Deno.readTextFile(join(bin, "vf")),
      new RegExp(`${bin}/deno' run -A --v8-flags=--max-semi-space-size=64 `),
    );

    const shell = { cwd: elsewhere, path: [bin, tools], home };
    const version = await sh(["vf", "--version"], shell);
    assert.equal(version.code, 0, transcript(version));
    assert.equal(version.stdout.trim(), `vf ${VERSION}`, transcript(version));
    const help = await sh(["vf", "--help"], shell);
    assert.equal(help.code, 0, transcript(help));
    assert.match(help.stdout, /^ {2}vf eval <env> \[options\]/m, transcript(help));
    const deno = await sh(["deno", "--version"], shell);
    assert.match(deno.stdout, /^deno 2\.9\.6/, transcript(deno));
    const demo = await sh(["vf", "demo", "-n", "2", "-r", "1"], shell);
    assert.equal(demo.code, 0, transcript(demo));
    assert.match(demo.stdout, /errors: 0 of 2 /, transcript(demo));
    // The run landed in the folder vf was called from, not in the checkout.
    assert.ok((await Deno.stat(join(elsewhere, "outputs/evals"))).isDirectory);
  } finally {
    await Deno.remove(root, { recursive: true });
  }
});

Deno.test("scripts/install.sh piped to bash clones VF_REPO into VF_HOME and installs from it", async () => {
  await using repo = await freshCopy("vf_install_repo_");
  const git = (args: string[]) =>
    new Deno.Command("git", {
      args: ["-c", "user.name=vf", "-c", "user.email=vf@localhost", ...args],
      cwd: repo.path,
      stdout: "null",
      stderr: "piped",
    }).output();
  for (const args of [["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "vf"]]) {
    const out = await git(args);
    assert.ok(out.success, new TextDecoder().decode(out.stderr));
  }
  const root = await Deno.makeTempDir({ prefix: "vf_install_home_" });
  try {
    const tools = await toolsDir(root);
    const home = join(root, "home");
    await Deno.mkdir(home);
    // A Deno at a stable place on PATH is used where it is, not copied. The one running this
    // test may itself live in npx's cache (which install.sh copies from), so the stable one is
    // a link to its file, or a copy where the two folders are on different filesystems.
    const denoBin = join(root, "deno-bin");
    await Deno.mkdir(denoBin);
    try {
      await Deno.link(Deno.execPath(), join(denoBin, "deno"));
    } catch {
      await Deno.copyFile(Deno.execPath(), join(denoBin, "deno"));
      await Deno.chmod(join(denoBin, "deno"), 0o755);
    }
    const bin = join(home, "my bin");
    const vfHome = join(root, "share/vf");
    const script = await Deno.readTextFile(join(repo.path, "scripts/install.sh"));

    const install = await sh(["bash"], {
      cwd: home,
      path: [tools, denoBin],
      home,
      stdin: script,
      env: { VF_REPO: repo.path, VF_HOME: vfHome, VF_BIN_DIR: bin },
    });
    assert.equal(install.code, 0, transcript(install));
    assert.match(install.stderr, /cloning /, transcript(install));
    assert.ok((await Deno.stat(join(vfHome, "cli.ts"))).isFile);
    await assert.rejects(Deno.lstat(join(bin, "deno")), Deno.errors.NotFound);

    const version = await sh(["vf", "--version"], { cwd: root, path: [bin, tools], home });
    assert.equal(version.code, 0, transcript(version));
    assert.equal(version.stdout.trim(), `vf ${VERSION}`, transcript(version));

    // Without VF_REPO and outside a checkout it says what to set.
    const lost = await sh(["bash"], { cwd: home, path: [tools, denoBin], home, stdin: script });
    assert.equal(lost.code, 1, transcript(lost));
    assert.match(lost.stderr, /VF_REPO is not set/, transcript(lost));
  } finally {
    await Deno.remove(root, { recursive: true });
  }
});
