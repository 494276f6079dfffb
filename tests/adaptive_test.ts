/**
 * `[limits] adaptive = true` through `vf eval` against a loopback model that answers 503 when
 * more than three requests are in flight: the controller backs off, the run completes, and
 * what the controller did is in the metadata and the summary.
 * @module
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { loadExampleDataset } from "../lib/data/examples.ts";
import { lastUserText, startModelServer } from "./model_server.ts";
import { cliCommand, collect, tempDir, transcript } from "./_cli.ts";

const ANSWERS = new Map(
  (loadExampleDataset("gsm8k-sample", { split: "test" }).toList() as Array<
    { question: string; answer: string }
  >).map((r) => [r.question, r.answer]),
);

Deno.test("adaptive concurrency: a model that turns away load above 3 makes the controller back off, and the run completes with its record in metadata", async () => {
  await using tmp = await tempDir("vf_adaptive_");
  let inFlight = 0;
  let turnedAway = 0;
  await using model = await startModelServer({
    responder: async (request) => {
      inFlight++;
      try {
        await new Promise((r) => setTimeout(r, 100));
        if (inFlight > 3) {
          turnedAway++;
          return { status: 503 };
        }
        return { content: `\\boxed{${ANSWERS.get(lastUserText(request)) ?? "0"}}` };
      } finally {
        inFlight--;
      }
    },
  });
  const res = await collect(cliCommand([
    "eval",
    "gsm8k",
    "-m",
    "m",
    "-b",
    model.url,
    "-n",
    "40",
    "-r",
    "1",
    "-c",
    "16",
    "--limits.adaptive",
    "true",
    "--client.max_retries",
    "0",
    "-o",
    "out",
  ], { cwd: tmp.path, env: {}, registry: false }));
  assert.equal(res.code, 0, transcript(res));
  const dir = /^Saving results to (.+)$/m.exec(res.stderr)![1];
  const meta = JSON.parse(await Deno.readTextFile(join(dir, "metadata.json")));
  assert.equal(meta.num_rollouts, 40);
  assert.equal(meta.adaptive.max, 16);
  assert.ok(meta.adaptive.increases >= 1, JSON.stringify(meta.adaptive));
  if (turnedAway > 0) assert.ok(meta.adaptive.backoffs >= 1, JSON.stringify(meta.adaptive));
  assert.ok(turnedAway > 0, "the controller never went past the model's capacity of 3");
  assert.match(res.stdout, /adaptive concurrency: ended at \d+ of 16/);
  // The progress lines show the limit as it moves.
  assert.match(res.stderr, /gsm8k \d+\/40 .* concurrency \d+\/16\n/);
});
