/**
 * Worker entry for `verifyMath`: runs `mathEquivalentSync` off the main thread so the pool can
 * terminate a check that runs past its timeout. Posts `{ ready: true }` once loaded, then
 * answers each `{ id, gold, pred }` with `{ id, ok }`.
 * @module
 */

import { mathEquivalentSync } from "./math_equivalence.ts";

interface Request {
  id: number;
  gold: string;
  pred: string;
}

// The worker global scope, typed without the DOM or Deno worker libs so Bun reads it too.
const scope = globalThis as unknown as {
  onmessage: ((event: MessageEvent<Request>) => void) | null;
  postMessage(message: unknown): void;
};

scope.onmessage = (event) => {
  const { id, gold, pred } = event.data;
  scope.postMessage({ id, ok: mathEquivalentSync(String(gold), String(pred)) });
};
// Warm mathjs up (instance, parser, compiler) so the first check's timeout measures only itself.
mathEquivalentSync("2x", "x+x");
scope.postMessage({ ready: true });
