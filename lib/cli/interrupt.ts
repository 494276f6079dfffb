/**
 * SIGINT/SIGTERM during a run: the first signal aborts it (finished results stay on disk),
 * a second exits at once.
 * @module
 */

import process from "node:process";
import { VfError } from "../errors.ts";

/**
 * Turn SIGINT/SIGTERM into an abort of the run (finished results stay on disk); a second
 * signal exits at once. Disposing removes the handlers.
 */
export function onInterrupt(): Disposable & { signal: AbortSignal; readonly interrupted: boolean } {
  const controller = new AbortController();
  let interrupted = false;
  const onSignal = (sig: string) => {
    if (interrupted) process.exit(130);
    interrupted = true;
    process.stderr.write(`\n${sig}: stopping; finished rollouts are saved\n`);
    controller.abort(new VfError(`Interrupted by ${sig}`));
  };
  process.on("SIGINT", onSignal);
  process.on("SIGTERM", onSignal);
  return {
    signal: controller.signal,
    get interrupted() {
      return interrupted;
    },
    [Symbol.dispose]() {
      process.off("SIGINT", onSignal);
      process.off("SIGTERM", onSignal);
    },
  };
}
