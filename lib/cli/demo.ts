/**
 * `vf demo`: a built-in environment against vf's scripted local demo model.
 * @module
 */

import process from "node:process";
import { loadExampleDataset } from "../data/examples.ts";
import { demoResponder, startModelServer } from "../model/local_server.ts";
import { parseArgs } from "./args.ts";
import { cmdEval } from "./eval.ts";

export async function cmdDemo(argv: string[]): Promise<number> {
  const flags = parseArgs(argv);
  if (flags.help || flags.h) {
    process.stdout.write(
      `vf demo [env] [-n N] [-r R]\n\nStarts vf's scripted demo model on 127.0.0.1 (a deterministic stand-in that\n` +
        `answers from the bundled answer key about 75% of the time, not a language model) and\n` +
        `evaluates a built-in environment (default gsm8k) against it end to end.\n`,
    );
    return 0;
  }
  const envId = String(flags._[0] ?? "gsm8k");
  const answers = new Map<string, string>();
  for (const row of loadExampleDataset("gsm8k-sample", { split: "test" })) {
    answers.set(String(row.question), String(row.answer));
  }
  await using server = await startModelServer({ responder: demoResponder({ answers }) });
  process.stderr.write(`Demo model (scripted, not an LLM) listening at ${server.url}\n`);
  const rest = argv.filter((a, i) => !(i === 0 && a === flags._[0]));
  return await cmdEval([envId, "-m", "vf-demo", "-b", server.url, "-k", "VF_DEMO_KEY", ...rest]);
}
