/**
 * Tests of the run's Compose cache beside it: a file parsed once however many rollouts ask
 * (by the path it resolves to), a document by identity, a bad file rejecting each caller alike.
 * @module
 */
import assert from "node:assert/strict";
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join, relative } from "node:path";
import { ConfigError } from "../errors.ts";
import { ComposeCache } from "./cache.ts";

const COMPOSE = `services:\n  db:\n    image: busybox:latest\n    command: ["sleep", "60"]\n`;

Deno.test("ComposeCache: a Compose file is parsed once per cache, named by any path to it; a later change is not seen by that cache", async () => {
  const dir = await mkdtemp(join(tmpdir(), "vf-compose-cache-"));
  try {
    const path = join(dir, "compose.yaml");
    await writeFile(path, COMPOSE);
    const cache = new ComposeCache();
    const first = cache.load(path);
    assert.equal(cache.load(relative(Deno.cwd(), path)), first);
    const loaded = await first;
    assert.deepEqual(loaded.services.map((s) => s.name), ["db"]);
    assert.equal(loaded.dir, dir);
    await writeFile(path, COMPOSE.replace("db", "cache"));
    assert.equal(await cache.load(path), loaded);
    const fresh = await new ComposeCache().load(path);
    assert.deepEqual(fresh.services.map((s) => s.name), ["cache"]);
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
});

Deno.test("ComposeCache: a document is parsed once by identity; a bad file rejects every caller with its ConfigError", async () => {
  const cache = new ComposeCache();
  const doc = { services: { app: { image: "busybox:latest" } } };
  const one = cache.load(doc);
  assert.equal(cache.load(doc), one);
  assert.notEqual(cache.load({ ...doc }), one);
  assert.deepEqual((await one).services.map((s) => s.name), ["app"]);
  const missing = "/nonexistent/vf-compose.yaml";
  for (let i = 0; i < 2; i++) {
    await assert.rejects(
      cache.load(missing),
      (e) => e instanceof ConfigError && /cannot be read/.test(e.message),
    );
  }
});
