/**
 * `vf eval --pass-threshold` and TOML `pass_threshold`: pass@k counts a rollout correct when
 * its summed, weighted reward reaches the threshold (upstream's rule), so a rubric whose format
 * points alone reach 0.5 needs a higher threshold for pass@k to mean "answered right".
 * @module
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { lastUserText, startModelServer } from "./model_server.ts";
import { MOD_URL, runCli, tempDir, transcript } from "./_cli.ts";

// Reward = correct (1) + formatted (1): a wrong answer in tags scores 1, a right one 2.
const ENV = `import { Rubric, SingleTurnEnv } from "${MOD_URL}";
const text = (c) => String(c.at(-1)?.content ?? "");
export function loadEnvironment() {
  return new SingleTurnEnv({
    envId: "tagged",
    evalDataset: [{ question: "q0", answer: "a0" }, { question: "q1", answer: "a1" }],
    rubric: new Rubric({
      funcs: [
        function correct({ completion, answer }) { return text(completion).includes(answer); },
        function formatted({ completion }) { return text(completion).startsWith("<answer>"); },
      ],
    }),
  });
}
`;

async function metadataOf(dir: string): Promise<Record<string, unknown>> {
  const base = join(dir, "evals", "tagged--m");
  const [run] = [...Deno.readDirSync(base)].map((e) => e.name);
  return JSON.parse(await Deno.readTextFile(join(base, run, "metadata.json")));
}

Deno.test("vf eval --pass-threshold and TOML pass_threshold set the reward pass@k counts as correct", async () => {
  await using tmp = await tempDir("vf_pass_threshold_");
  // q0 is answered right, q1 wrong, both in tags.
  await using server = await startModelServer({
    responder: (request) => ({
      content: lastUserText(request) === "q0" ? "<answer>a0</answer>" : "<answer>no</answer>",
    }),
  });
  const envPath = join(tmp.path, "tagged.ts");
  await Deno.writeTextFile(envPath, ENV);
  await Deno.writeTextFile(
    join(tmp.path, "cfg.toml"),
    `env_id = "${envPath}"\nmodel = "m"\nbase_url = "${server.url}"\nnum_examples = 2\n` +
      `rollouts_per_example = 2\noutput_dir = "toml"\npass_threshold = 1.5\n`,
  );
  const common = ["-m", "m", "-b", server.url, "-n", "2", "-r", "2", "-q"];
  const [byDefault, byFlag, byToml, help] = await Promise.all([
    runCli(["eval", envPath, ...common, "-o", "default"], { cwd: tmp.path }),
    runCli(["eval", envPath, ...common, "-o", "flag", "--pass-threshold", "1.5"], {
      cwd: tmp.path,
    }),
    runCli(["eval", "@", "cfg.toml", "-q"], { cwd: tmp.path }),
    runCli(["eval", "--help"], { cwd: tmp.path }),
  ]);
  for (const res of [byDefault, byFlag, byToml, help]) assert.equal(res.code, 0, transcript(res));

  // The default 0.5: the wrong answer's format point alone passes.
  const plain = await metadataOf(join(tmp.path, "default"));
  assert.equal(plain.pass_threshold, 0.5);
  assert.deepEqual(plain.pass_at_k, { "1": 1, "2": 1 });
  // 1.5: only the right answer (reward 2) passes, from the flag and from the TOML key alike.
  for (const dir of ["flag", "toml"]) {
    const strict = await metadataOf(join(tmp.path, dir));
    assert.equal(strict.pass_threshold, 1.5, dir);
    assert.deepEqual(strict.pass_at_k, { "1": 0.5, "2": 0.5 }, dir);
    assert.deepEqual(strict.pass_all_k, { "1": 0.5, "2": 0.5 }, dir);
  }
  assert.match(help.stdout, /--pass-threshold <x>\s+reward at or above which a rollout counts/);
});
