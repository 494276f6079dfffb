/**
 * tests/setup.sh builds the python:3.11-slim test image with debootstrap from the Debian mirror
 * the machine's apt sources already name. These tests feed `debian_mirror` sample apt folders
 * (one-line `.list` files and deb822 `.sources` files) and check which mirror it picks, without
 * running the rest of the script.
 * @module
 */
import assert from "node:assert/strict";
import { fileURLToPath } from "node:url";
import { dirname, join } from "node:path";

const SETUP = fileURLToPath(new URL("./setup.sh", import.meta.url));
const FALLBACK = "http://deb.debian.org/debian";

/** Writes `files` (paths relative to an apt folder) and returns what `debian_mirror` prints. */
async function mirrorFor(files: Record<string, string>): Promise<string> {
  const apt = await Deno.makeTempDir({ prefix: "vf_apt_" });
  try {
    for (const [path, text] of Object.entries(files)) {
      await Deno.mkdir(dirname(join(apt, path)), { recursive: true });
      await Deno.writeTextFile(join(apt, path), text);
    }
    await Deno.mkdir(join(apt, "sources.list.d"), { recursive: true });
    const out = await new Deno.Command("bash", {
      args: ["-c", 'source "$1" && debian_mirror "$2"', "_", SETUP, apt],
      stdin: "null",
      stdout: "piped",
      stderr: "piped",
    }).output();
    const stderr = new TextDecoder().decode(out.stderr);
    assert.equal(out.code, 0, stderr);
    // Sourcing the script must not run it: no "setup: ..." lines, no packages, no dockerd.
    assert.doesNotMatch(stderr + new TextDecoder().decode(out.stdout), /^setup:/m);
    return new TextDecoder().decode(out.stdout);
  } finally {
    await Deno.remove(apt, { recursive: true });
  }
}

Deno.test("setup.sh: the mirror of a deb822 .sources file, not its security archive", async () => {
  const sources = [
    "Types: deb",
    "URIs: http://security.example.net/debian-security",
    "Suites: bookworm-security",
    "Components: main",
    "",
    "Types: deb deb-src",
    "# a comment inside the stanza",
    "URIs: http://mirror.example.net/debian/",
    "Suites: bookworm bookworm-updates",
    "Components: main contrib",
    "Signed-By:",
    " -----BEGIN PGP PUBLIC KEY BLOCK-----",
    " .",
    " mQINBGPL",
    " -----END PGP PUBLIC KEY BLOCK-----",
    "",
  ].join("\n");
  assert.equal(
    await mirrorFor({ "sources.list.d/local-mirror.sources": sources }),
    "http://mirror.example.net/debian/",
  );
});

Deno.test("setup.sh: a one-line sources.list entry with options in brackets", async () => {
  const list = [
    "# deb http://commented.example.net/debian bookworm main",
    "deb-src http://src-only.example.net/debian bookworm main",
    "deb [arch=amd64 signed-by=/usr/share/keyrings/debian.gpg] http://10.1.2.3:3142/debian bookworm main",
    "deb http://10.1.2.3:3142/debian-security bookworm-security main",
  ].join("\n");
  assert.equal(await mirrorFor({ "sources.list": list }), "http://10.1.2.3:3142/debian");
});

Deno.test("setup.sh: .list files in sources.list.d count, third-party archives do not", async () => {
  assert.equal(
    await mirrorFor({
      "sources.list.d/a-docker.list":
        "deb https://download.docker.com/linux/debian bookworm stable",
      "sources.list.d/b-cloud.list": "deb https://packages.cloud.google.com/apt cloud-sdk main",
      "sources.list.d/c-nodesource.sources":
        "Types: deb\nURIs: https://deb.nodesource.com/node_20.x\nSuites: nodistro\nComponents: main\n",
      "sources.list.d/z-debian.list": "deb https://ftp.example.org/pub/debian bookworm main",
    }),
    "https://ftp.example.org/pub/debian",
  );
});

Deno.test("setup.sh: disabled stanzas and files are skipped", async () => {
  assert.equal(
    await mirrorFor({
      "sources.list.d/off.sources":
        "Types: deb\nURIs: http://off.example.net/debian\nSuites: bookworm\nComponents: main\nEnabled: no\n",
      "sources.list.d/old.list.disabled": "deb http://disabled.example.net/debian bookworm main",
      "sources.list.d/debian.sources":
        "Types: deb\nURIs: http://on.example.net/debian\nSuites: bookworm\nComponents: main\n",
    }),
    "http://on.example.net/debian",
  );
});

Deno.test("setup.sh: a Debian mirror named for another release still serves bookworm", async () => {
  assert.equal(
    await mirrorFor({
      "sources.list.d/debian.sources":
        "Types: deb\nURIs: http://trixie.example.net/debian\nSuites: trixie trixie-updates\nComponents: main\n",
    }),
    "http://trixie.example.net/debian",
  );
});

Deno.test("setup.sh: deb.debian.org when no apt source names a Debian mirror", async () => {
  assert.equal(await mirrorFor({}), FALLBACK);
  assert.equal(
    await mirrorFor({
      "sources.list": "deb http://archive.ubuntu.com/ubuntu jammy main universe\n",
    }),
    FALLBACK,
  );
});
