import assert from "node:assert/strict";
import { Buffer } from "node:buffer";
import { createHmac } from "node:crypto";
import { mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import {
  checkHostKey,
  fingerprint,
  hostKeyAlgorithms,
  hostKeyVerifier,
  keyTypeOf,
  knownHostsName,
} from "./known_hosts.ts";

/** A wire-format key blob: string type, then some key bytes. */
function blob(type: string, body: string): Uint8Array {
  const t = Buffer.from(type);
  const len = Buffer.alloc(4);
  len.writeUInt32BE(t.length);
  return new Uint8Array(Buffer.concat([len, t, Buffer.from(body)]));
}

const ED = blob("ssh-ed25519", "key-one");
const ED2 = blob("ssh-ed25519", "key-two");
const RSA = blob("ssh-rsa", "rsa-key");
const b64 = (key: Uint8Array) => Buffer.from(key).toString("base64");

function hashed(name: string): string {
  const salt = Buffer.from("0123456789abcdef0123");
  const mac = createHmac("sha1", salt).update(name).digest("base64");
  return `|1|${salt.toString("base64")}|${mac}`;
}

Deno.test("knownHostsName() brackets hosts on ports other than 22", () => {
  assert.equal(knownHostsName("h.example", 22), "h.example");
  assert.equal(knownHostsName("10.0.0.1", 2222), "[10.0.0.1]:2222");
});

Deno.test("keyTypeOf() and fingerprint() read a key blob", () => {
  assert.equal(keyTypeOf(ED), "ssh-ed25519");
  assert.match(fingerprint(ED), /^SHA256:[A-Za-z0-9+/]{43}$/);
});

Deno.test("checkHostKey() matches plain, patterned and hashed names", () => {
  const text = [
    "# comment",
    `other.example ssh-ed25519 ${b64(ED2)}`,
    `h.example,10.0.0.1 ssh-ed25519 ${b64(ED)}`,
    `*.corp,!bad.corp ssh-ed25519 ${b64(ED)}`,
    `${hashed("[hashed.example]:2222")} ssh-ed25519 ${b64(ED)}`,
  ].join("\n");
  assert.deepEqual(checkHostKey(text, "10.0.0.1", 22, ED), {
    status: "known",
    line: 3,
    knownTypes: ["ssh-ed25519"],
  });
  assert.equal(checkHostKey(text, "a.corp", 22, ED).status, "known");
  assert.equal(checkHostKey(text, "bad.corp", 22, ED).status, "unknown");
  assert.equal(checkHostKey(text, "hashed.example", 2222, ED).status, "known");
  assert.equal(checkHostKey(text, "hashed.example", 22, ED).status, "unknown");
  assert.equal(checkHostKey(text, "10.0.0.1", 2222, ED).status, "unknown", "port matters");
});

Deno.test("checkHostKey() reports changed and revoked keys", () => {
  const text = `h.example ssh-ed25519 ${b64(ED)}\n@revoked * ssh-ed25519 ${b64(ED2)}\n`;
  assert.deepEqual(checkHostKey(text, "h.example", 22, blob("ssh-ed25519", "x")), {
    status: "mismatch",
    line: 1,
    knownTypes: ["ssh-ed25519"],
  });
  assert.equal(checkHostKey(text, "h.example", 22, ED2).status, "revoked");
  // Only another type is known: also refused (OpenSSH asks for the known type first).
  assert.equal(checkHostKey(text, "h.example", 22, RSA).status, "mismatch");
  assert.deepEqual(hostKeyAlgorithms(["ssh-rsa", "ssh-ed25519"]), [
    "rsa-sha2-512",
    "rsa-sha2-256",
    "ssh-rsa",
    "ssh-ed25519",
  ]);
});

Deno.test("hostKeyVerifier() refuses unknown hosts, or records them with accept-new", async () => {
  const dir = await mkdtemp(join(tmpdir(), "vf-known-hosts-"));
  try {
    const file = join(dir, "sub", "known_hosts");
    const verify = (checking: "yes" | "accept-new" | "no", key = ED) => {
      const v = hostKeyVerifier("h.example", 2222, {
        knownHostsFile: file,
        checking,
        acceptNewHint: "set trustOnFirstUse: true",
      });
      return new Promise<[boolean, string | undefined]>((resolve) =>
        v.verify(key, (ok) => resolve([ok, v.rejection()]))
      );
    };
    const [ok, why] = await verify("yes");
    assert.equal(ok, false);
    assert.ok(why!.includes(`"[h.example]:2222"`) && why!.includes(fingerprint(ED)), why);
    assert.match(why!, /or set trustOnFirstUse: true$/);
    assert.deepEqual(await verify("no"), [true, undefined]);
    assert.deepEqual(await verify("accept-new"), [true, undefined]);
    assert.equal(await readFile(file, "utf8"), `[h.example]:2222 ssh-ed25519 ${b64(ED)}\n`);
    assert.deepEqual(await verify("yes"), [true, undefined]);
    const [changed, reason] = await verify("accept-new", ED2);
    assert.equal(changed, false);
    assert.match(reason!, /does not match known_hosts .* line 1/);
    await writeFile(file, "garbage without fields\n", { flag: "a" });
    assert.deepEqual(await verify("yes"), [true, undefined]);
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
});
