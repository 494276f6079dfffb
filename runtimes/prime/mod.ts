/**
 * Prime Intellect sandboxes: the API client and the runtime that drives a sandbox over SSH.
 * @module
 */

export {
  cleanupPrime,
  listPrimeSandboxes,
  PRIME_API_BASE,
  PrimeApi,
  type PrimeApiOptions,
  type PrimeCleanupFilter,
  type PrimeSandbox,
} from "./api.ts";
export { PrimeRuntime, type PrimeRuntimeOptions } from "./runtime.ts";
