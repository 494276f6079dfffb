/**
 * The README's five-minute tour as written: its environment module, saved as `my_env.ts` beside
 * vf's `mod.ts` (a scratch checkout), evaluated with the tour's own `vf eval` line against a model
 * on loopback that answers in the format the environment asks for; then the tour's `vf replay`
 * and `vf compare` on what it wrote.
 * @module
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { runCli, tempDir, transcript } from "./_cli.ts";
import { ROOT } from "./_checkout.ts";
import { type ChatRequest, textReply, withModelServer } from "./model_server.ts";

/** The tour's lines of a README block: the first ```lang block containing `marker`. */
async function readmeBlock(lang: string, marker: string): Promise<string> {
  const readme = await Deno.readTextFile(join(ROOT, "README.md"));
  const blocks = [...readme.matchAll(new RegExp("^```" + lang + "\\n([\\s\\S]*?)^```$", "gm"))];
  const block = blocks.map((m) => m[1]).find((b) => b.includes(marker));
  assert.ok(block, `README.md has no \`\`\`${lang} block with "${marker}"`);
  return block;
}

/** A model that answers the README environment's two questions right, in its XML format. */
function tourModel(req: ChatRequest) {
  const last = req.body.messages.at(-1);
  const question = typeof last?.content === "string" ? last.content : "";
  const answer = question.includes("2+2") ? "4" : question.includes("3*5") ? "15" : "?";
  return textReply(`<reasoning>\nArithmetic.\n</reasoning>\n<answer>\n${answer}\n</answer>`);
}

Deno.test("the README's environment evaluates as the tour says: right answers in its format score 1.2", async () => {
  const source = await readmeBlock("ts", "export function loadEnvironment");
  const line = (await readmeBlock("sh", "vf eval ./my_env.ts")).split("\n")
    .find((l) => l.startsWith("vf eval ./my_env.ts"));
  assert.ok(line, "the tour's vf eval line");
  // A scratch checkout: the module beside mod.ts, as the tour says, everything else linked.
  await using tmp = await tempDir("vf_readme_tour_");
  for await (const entry of Deno.readDir(ROOT)) {
    if ([".git", "outputs"].includes(entry.name)) continue;
    await Deno.symlink(join(ROOT, entry.name), join(tmp.path, entry.name));
  }
  await Deno.writeTextFile(join(tmp.path, "my_env.ts"), source);

  await withModelServer(tourModel, async (server) => {
    // The tour's line with this model server's URL for its placeholder one.
    const args = line.replace(/^vf /, "").replace("http://127.0.0.1:8000/v1", server.url)
      .split(/\s+/);
    assert.ok(args.includes(server.url), line);
    const evaluated = await runCli(args, { cwd: tmp.path, registry: false });
    const out = transcript(evaluated);
    assert.equal(evaluated.code, 0, out);
    // Two examples (the module's dataset), four rollouts each, every one right and well formatted.
    assert.match(evaluated.stdout, /examples 2 {2}rollouts\/example 4 {2}rollouts 8/, out);
    assert.match(evaluated.stdout, /^reward +1\.2000 +0\.0000$/m, out);
    assert.match(evaluated.stdout, /errors: 0 of 8 /, out);
    const runDir = /results: (\S+)\/results\.jsonl/.exec(evaluated.stdout)?.[1] ?? "";
    assert.ok(runDir.startsWith(join(tmp.path, "outputs/evals/my-env--my-model/")), out);
    const meta = JSON.parse(await Deno.readTextFile(join(runDir, "metadata.json")));
    assert.ok(Math.abs(meta.avg_reward - 1.2) < 1e-9, JSON.stringify(meta));
    const rows = (await Deno.readTextFile(join(runDir, "results.jsonl"))).trim().split("\n");
    assert.equal(rows.length, 8);
    // "re-run one offline with vf replay <run-dir>" and "compare two runs with vf compare A B".
    const replayed = await runCli(["replay", runDir], { cwd: tmp.path, registry: false });
    assert.equal(replayed.code, 0, transcript(replayed));
    assert.match(
      replayed.stdout + replayed.stderr,
      /8 of 8 rewards as before/,
      transcript(replayed),
    );
    const compared = await runCli(["compare", runDir, runDir], { cwd: tmp.path, registry: false });
    assert.equal(compared.code, 0, transcript(compared));
    assert.match(compared.stdout, /paired examples 2/, transcript(compared));
  });
});
