/**
 * Warnings printed once per process, however many rollouts meet them.
 * @module
 */
const warned = new Set<string>();
/** Print `message` as a warning unless it was printed already. */
export function warnOnce(message: string): void {
  if (warned.has(message)) return;
  warned.add(message);
  console.warn(message);
}
