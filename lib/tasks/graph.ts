/**
 * The message graph moved to `lib/graph.ts` (legacy environments build it too); this path
 * keeps the tasks layer's imports working.
 * @module
 */
export * from "../graph.ts";
