/**
 * `vf view` reads only the folder it was given and no more of a file than it can show. A run
 * folder handed around may hold symlinks out of it (a folder, a `results.jsonl`, a
 * `metadata.json` pointing at `~/.ssh` or another run), a link back up, a line of hundreds of
 * megabytes, or a huge `metadata.json`; the API must not list, index or return any of it, and
 * the rollout page (in headless Chromium) shows the start of an oversized line, not the line.
 * @module
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import puppeteer from "npm:puppeteer-core@^25.0.0";
import { serveHttp } from "../lib/model/http_server.ts";
import { MAX_LINE_BYTES } from "../lib/view/run_index.ts";
import { MAX_METADATA_BYTES, viewApp } from "../lib/view/server.ts";
import { _confinedHooks } from "../lib/util/confined.ts";
import { tempDir } from "./_cli.ts";

// deno-lint-ignore no-explicit-any
type Json = any;
// deno-lint-ignore no-explicit-any
type Dom = any;

const row = (example: number, reward: number, extra: Json = {}) =>
  JSON.stringify({
    example_id: example,
    prompt: [{ role: "user", content: `q${example}` }],
    completion: [{ role: "assistant", content: "a" }],
    reward,
    error: null,
    ...extra,
  }) + "\n";

async function api(app: ReturnType<typeof viewApp>, path: string): Promise<Response> {
  return await app.fetch(
    new Request(`http://127.0.0.1/${path}`, { headers: { host: "127.0.0.1" } }),
  );
}

Deno.test("vf view lists and reads nothing a symlink leads to outside its folder, and a link back up neither loops nor lists a run twice", async () => {
  await using tmp = await tempDir("vf_view_links_");
  const root = join(tmp.path, "outputs");
  const outside = join(tmp.path, "elsewhere");
  // Outside the root: a whole run, a results file, a metadata file; each holds a secret.
  await Deno.mkdir(join(outside, "run"), { recursive: true });
  await Deno.writeTextFile(join(outside, "run", "results.jsonl"), row(0, 1, { s: "secret-run" }));
  await Deno.writeTextFile(join(outside, "run", "metadata.json"), '{"env_id": "secret-run-env"}');
  await Deno.writeTextFile(join(outside, "id_rsa.jsonl"), row(0, 1, { s: "secret-file" }));
  await Deno.writeTextFile(join(outside, "metadata.json"), '{"env_id": "secret-meta"}');

  await Deno.mkdir(join(root, "linked-results"), { recursive: true });
  await Deno.symlink(join(outside, "id_rsa.jsonl"), join(root, "linked-results", "results.jsonl"));
  await Deno.mkdir(join(root, "linked-traces"), { recursive: true });
  await Deno.symlink(join(outside, "id_rsa.jsonl"), join(root, "linked-traces", "traces.jsonl"));
  await Deno.mkdir(join(root, "own", "deeper"), { recursive: true });
  await Deno.writeTextFile(join(root, "own", "results.jsonl"), row(0, 1) + row(1, 0));
  await Deno.symlink(join(outside, "metadata.json"), join(root, "own", "metadata.json"));
  await Deno.mkdir(join(root, "real"), { recursive: true });
  await Deno.writeTextFile(join(root, "real", "results.jsonl"), row(0, 0.5));
  await Deno.writeTextFile(join(root, "real", "metadata.json"), '{"env_id": "real-env"}');
  await Deno.symlink(outside, join(root, "away")); // a folder out of the root
  await Deno.symlink(join(outside, "run"), join(root, "away-run"));
  await Deno.symlink(root, join(root, "loop")); // back up to the root itself
  await Deno.symlink(join(root, "real"), join(root, "zz-alias")); // inside: one listing
  await Deno.symlink("/", join(root, "own", "deeper", "slash"));

  const app = viewApp(root, { indexDir: join(tmp.path, "index") });
  const res = await api(app, "api/runs");
  const text = await res.text();
  assert.equal(res.status, 200, text);
  const ids = JSON.parse(text).runs.map((r: Json) => r.id).sort();
  assert.deepEqual(ids, ["own", "real"], text);
  assert.doesNotMatch(text, /secret/);
  const own = await (await api(app, "api/run?id=own")).json();
  assert.equal(own.env, null, "metadata.json linked from outside the root was read");
  assert.deepEqual(own.metadata, {});
  assert.equal(own.rollouts, 2);
  const real = await (await api(app, "api/run?id=real")).json();
  assert.equal(real.env, "real-env");

  // Nothing outside answers by id, by path, or by a pasted folder.
  for (
    const id of [
      "linked-results",
      "linked-traces",
      "away/run",
      "away-run",
      "loop/real",
      join(outside, "run"),
      "../elsewhere/run",
      `${root}/away/run`,
    ]
  ) {
    for (const path of ["api/run", "api/rollouts", "api/rollout"]) {
      const r = await api(app, `${path}?id=${encodeURIComponent(id)}&line=0`);
      const body = await r.text();
      assert.equal(r.status, 404, `${path} ${id}: ${body}`);
      assert.doesNotMatch(body, /secret/);
    }
  }
  const compared = await api(app, `api/compare?a=real&b=${encodeURIComponent("away-run")}`);
  assert.equal(compared.status, 404, await compared.text());
});

Deno.test("vf view reads through the file it opened: a run file or run folder swapped for a link out of the root between the check and the open is refused, not read", async () => {
  await using tmp = await tempDir("vf_view_swap_");
  const root = join(tmp.path, "outputs");
  const outside = join(tmp.path, "elsewhere");
  await Deno.mkdir(join(outside, "run"), { recursive: true });
  // The secrets are longer than the run's own file, so an index that followed the link on
  // would read their lines at the offsets it knows.
  const secret = row(0, 1, { example_id: "secret-0" }) + row(1, 1, { example_id: "secret-1" });
  await Deno.writeTextFile(join(outside, "id_rsa.jsonl"), secret.repeat(4));
  await Deno.writeTextFile(join(outside, "metadata.json"), '{"env_id": "secret-meta"}');
  await Deno.writeTextFile(join(outside, "run", "results.jsonl"), secret.repeat(4));
  await Deno.writeTextFile(join(outside, "run", "metadata.json"), '{"env_id": "secret-meta"}');
  // Every stretch of this one holds the word: a line read from it at any offset shows it.
  await Deno.writeTextFile(join(outside, "key.txt"), ("secret".repeat(50) + "\n").repeat(20));
  for (const name of ["file", "meta", "folder", "line"]) {
    await Deno.mkdir(join(root, name), { recursive: true });
    await Deno.writeTextFile(join(root, name, "results.jsonl"), row(0, 0.5) + row(1, 0.25));
    // With a date, the runs list is sorted without opening the results file for its time.
    await Deno.writeTextFile(
      join(root, name, "metadata.json"),
      JSON.stringify({ env_id: `own-${name}`, date: "2026-01-01T00:00:00Z" }),
    );
  }
  const real = await Deno.realPath(root);
  // Armed with a file and a swap, the hook swaps once, right before the file is opened for
  // the `at`-th time (default the first) in the request that follows; every later check in
  // that request then sees the link and refuses it.
  let armed: { file: string; swap: () => void; at?: number } | null = null;
  _confinedHooks.beforeOpen = (path) => {
    if (armed === null || path !== join(real, armed.file)) return;
    if (armed.at !== undefined && --armed.at > 0) return;
    const { swap } = armed;
    armed = null;
    swap();
  };
  const linkOut = (inside: string, target: string) => () => {
    Deno.renameSync(join(root, inside), join(root, `${inside}.was`));
    Deno.symlinkSync(target, join(root, inside));
  };
  try {
    const app = viewApp(root, { indexDir: join(tmp.path, "index") });
    const first = await (await api(app, "api/runs")).text();
    assert.deepEqual(JSON.parse(first).runs.map((r: Json) => r.rollouts), [2, 2, 2, 2], first);

    // The metadata file becomes a link out as the run's page reads it for its summary (the
    // runs list read it first, for its date).
    armed = {
      file: "meta/metadata.json",
      swap: linkOut("meta/metadata.json", join(outside, "metadata.json")),
      at: 2,
    };
    const meta = await api(app, "api/run?id=meta");
    const metaText = await meta.text();
    assert.equal(armed, null, "the hook never ran: metadata.json was not opened");
    assert.doesNotMatch(metaText, /secret/);
    assert.equal(JSON.parse(metaText).env, null, metaText);

    // The results file becomes a link out as the index reads what was appended to it.
    armed = {
      file: "file/results.jsonl",
      swap: linkOut("file/results.jsonl", join(outside, "id_rsa.jsonl")),
    };
    const rows = await api(app, "api/rollouts?id=file");
    const rowsText = await rows.text();
    assert.equal(armed, null, "the hook never ran: file/results.jsonl was not opened");
    assert.doesNotMatch(rowsText, /secret/);
    assert.deepEqual(JSON.parse(rowsText).rows.map((r: Json) => r.line), [0, 1], rowsText);

    // A folder on the way (the run's own) becomes a link out: the last part of the path is
    // no link, so only the check of the opened descriptor can tell.
    armed = { file: "folder/results.jsonl", swap: linkOut("folder", join(outside, "run")) };
    const folder = await api(app, "api/rollouts?id=folder");
    const folderText = await folder.text();
    assert.equal(armed, null, "the hook never ran: folder/results.jsonl was not opened");
    assert.doesNotMatch(folderText, /secret/);
    assert.deepEqual(JSON.parse(folderText).rows.map((r: Json) => r.line), [0, 1], folderText);

    // The results file becomes a link out after the index is brought up to date, as the
    // rollout asked for is read from it at the offset the index holds.
    armed = {
      file: "line/results.jsonl",
      swap: linkOut("line/results.jsonl", join(outside, "key.txt")),
      at: 2,
    };
    const line = await api(app, "api/rollout?id=line&line=1");
    const lineText = await line.text();
    assert.equal(armed, null, "the hook never ran: line/results.jsonl was not read");
    assert.doesNotMatch(lineText, /secret/);
    assert.equal(line.status, 404, lineText);

    // Whatever each page asks for now, nothing outside comes back.
    for (const id of ["meta", "file", "folder", "line"]) {
      for (const path of ["api/runs", `api/run?id=${id}`, `api/rollouts?id=${id}`]) {
        assert.doesNotMatch(await (await api(app, path)).text(), /secret/, path);
      }
      for (let n = 0; n < 8; n++) {
        const r = await api(app, `api/rollout?id=${id}&line=${n}`);
        assert.doesNotMatch(await r.text(), /secret/, `${id} line ${n}`);
      }
    }
  } finally {
    _confinedHooks.beforeOpen = undefined;
  }
});

Deno.test("vf view indexes a line over its limit as OversizeLine without holding it, returns only its start, and passes over a huge metadata.json", async () => {
  await using tmp = await tempDir("vf_view_huge_");
  const root = join(tmp.path, "outputs");
  const dir = join(root, "big");
  await Deno.mkdir(dir, { recursive: true });
  // A valid JSON line just over the limit (it would parse), then ordinary rows.
  const pad = "x".repeat(MAX_LINE_BYTES + 1024);
  const file = join(dir, "results.jsonl");
  const out = await Deno.open(file, { create: true, write: true, truncate: true });
  const enc = new TextEncoder();
  const head = `{"example_id": 0, "reward": 1, "error": null, "pad": "`;
  await out.write(enc.encode(head));
  await out.write(enc.encode(pad));
  await out.write(enc.encode(`"}\n` + row(1, 0.25) + row(2, 0.75)));
  out.close();
  await Deno.writeTextFile(
    join(dir, "metadata.json"),
    JSON.stringify({ env_id: "huge-meta", filler: "y".repeat(MAX_METADATA_BYTES) }),
  );
  // A second run whose metadata's env and model are huge strings: the runs list cuts them.
  await Deno.mkdir(join(root, "long"), { recursive: true });
  await Deno.writeTextFile(join(root, "long", "results.jsonl"), row(0, 1));
  await Deno.writeTextFile(
    join(root, "long", "metadata.json"),
    JSON.stringify({ env_id: "e".repeat(100_000), model: { m: "m".repeat(100_000) } }),
  );

  let port = 0;
  const app = viewApp(root, { indexDir: join(tmp.path, "index"), port: () => port || undefined });
  const runs = await (await api(app, "api/runs")).json();
  const big = runs.runs.find((r: Json) => r.id === "big");
  assert.equal(big.env, null, "a metadata.json over the limit was read");
  assert.equal(big.rollouts, 3);
  const long = runs.runs.find((r: Json) => r.id === "long");
  assert.ok(long.env.length <= 301 && long.env.endsWith("…"), `env of ${long.env.length}`);
  assert.ok(long.model.length <= 301 && long.model.endsWith("…"), `model of ${long.model.length}`);

  const rows = await (await api(app, "api/rollouts?id=big")).json();
  assert.deepEqual(
    rows.rows.map((r: Json) => [r.line, r.error, r.reward, r.corrupt]),
    [[0, "OversizeLine", null, true], [1, null, 0.25, false], [2, null, 0.75, false]],
  );
  const res = await api(app, "api/rollout?id=big&line=0");
  const body = await res.text();
  assert.equal(res.status, 200, body.slice(0, 200));
  assert.ok(body.length < 20_000, `the oversized line came back whole (${body.length} chars)`);
  const line0 = JSON.parse(body);
  assert.equal(line0.oversize, head.length + pad.length + 2);
  assert.equal(line0.limit, "64 MiB");
  assert.ok(line0.text.startsWith('{"example_id": 0'), line0.text.slice(0, 40));
  const line2 = await (await api(app, "api/rollout?id=big&line=2")).json();
  assert.equal(line2.record.reward, 0.75);

  // The page says so, in the browser.
  const server = await serveHttp((r) => app.fetch(r), { port: 0 });
  port = server.port;
  const browser = await puppeteer.launch({
    executablePath: "/usr/bin/chromium",
    args: ["--no-sandbox", "--headless=new", "--disable-gpu", "--disable-dev-shm-usage"],
  });
  try {
    const page = await browser.newPage();
    page.setDefaultTimeout(120_000); // generous: the suite runs at load ~10
    await page.goto(`http://127.0.0.1:${port}/#/rollout/big/0`);
    await page.waitForSelector('[data-testid="corrupt"]');
    const shown = await page.$eval('[data-testid="corrupt"]', (el) => (el as Dom).textContent);
    assert.match(shown, /too long to show \(\d+ bytes, over the viewer's limit of 64 MiB\)/);
    assert.ok(shown.length < 6000, `${shown.length} characters shown`);
  } finally {
    await browser.close();
    await server.close();
  }
});
