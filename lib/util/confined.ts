/**
 * Reading files inside a folder that someone else can write while we read (a run's outputs
 * folder that environment code writes into, a Harbor job folder handed around), without
 * being led out of it. Checking a path and then opening it by name leaves a window in which
 * the file (or a folder on its way) can be swapped for a symlink to `~/.ssh/id_rsa`; so the
 * file is opened first, without following a symlink in its last part and without waiting on
 * a FIFO, and the opened descriptor is then checked: it must be a regular file, the kernel's
 * own path of it (`/proc/self/fd`, where there is one) must lie under the root, and its
 * device and inode must be those of the file its name now leads to under the root. Whatever
 * is read is read through that descriptor only.
 * @module
 */
import { Buffer } from "node:buffer";
import {
  closeSync,
  constants,
  fstatSync,
  openSync,
  readlinkSync,
  readSync,
  realpathSync,
  statSync,
} from "node:fs";
import { sep } from "node:path";

/** Why a file inside a folder was not read. */
export type ConfinedReason = "missing" | "outside" | "not-file" | "changed" | "too-large";

/** A file that {@link openConfined} or {@link readConfined} refused, and why. */
export class ConfinedFileError extends Error {
  constructor(readonly reason: ConfinedReason, message: string) {
    super(message);
    this.name = "ConfinedFileError";
  }
}

/**
 * For tests only: called with the checked real path just before it is opened, so a test can
 * swap the file in the window an attacker would use.
 */
export const _confinedHooks: { beforeOpen?: (real: string) => void } = {};

/** `path`'s real path when it lies under the real root `top` (or is it), else null. */
export function insideRoot(top: string, path: string): string | null {
  let real: string;
  try {
    real = realpathSync(path);
  } catch {
    return null;
  }
  return real === top || real.startsWith(top.endsWith(sep) ? top : top + sep) ? real : null;
}

const FLAGS = constants.O_RDONLY | (constants.O_NOFOLLOW ?? 0) | (constants.O_NONBLOCK ?? 0);

/**
 * A descriptor open for reading on `path`, a regular file under the real root `top`; the
 * caller closes it. A symlink inside the root to a file inside it is followed.
 * @throws {ConfinedFileError} when it is missing, not a regular file, leads outside `top`, or
 * was swapped while it was being opened
 */
export function openConfined(top: string, path: string): number {
  const real = insideRoot(top, path);
  if (real === null) {
    let exists = true;
    try {
      statSync(path);
    } catch {
      exists = false;
    }
    throw exists
      ? new ConfinedFileError("outside", `"${path}" leads outside "${top}"`)
      : new ConfinedFileError("missing", `"${path}" does not exist`);
  }
  _confinedHooks.beforeOpen?.(real);
  let fd: number;
  try {
    fd = openSync(real, FLAGS);
  } catch (error) {
    const code = (error as { code?: string }).code;
    throw code === "ENOENT"
      ? new ConfinedFileError("missing", `"${path}" does not exist`)
      : new ConfinedFileError("changed", `"${path}" could not be opened (${code ?? error})`);
  }
  try {
    const opened = fstatSync(fd);
    if (!opened.isFile()) {
      throw new ConfinedFileError("not-file", `"${path}" is not a regular file`);
    }
    let kernel: string | null = null;
    try {
      kernel = readlinkSync(`/proc/self/fd/${fd}`);
    } catch { /* no /proc here: the inode check below stands alone */ }
    const now = insideRoot(top, path);
    const named = now === null ? null : statSync(now);
    const inside = kernel === null || kernel.startsWith(top.endsWith(sep) ? top : top + sep);
    if (!inside || named === null || named.dev !== opened.dev || named.ino !== opened.ino) {
      throw new ConfinedFileError(
        "changed",
        `"${path}" changed while it was opened (the file opened is not the one under "${top}")`,
      );
    }
    return fd;
  } catch (error) {
    closeSync(fd);
    if (error instanceof ConfinedFileError) throw error;
    throw new ConfinedFileError("changed", `"${path}" changed while it was opened`);
  }
}

/**
 * The bytes of `path`, a regular file under the real root `top`, when there are at most
 * `maxBytes` of them (read through one {@link openConfined} descriptor).
 * @throws {ConfinedFileError} as {@link openConfined}, and `too-large` past `maxBytes`
 */
export function readConfined(top: string, path: string, maxBytes: number): Buffer {
  const fd = openConfined(top, path);
  try {
    const tooLarge = () =>
      new ConfinedFileError("too-large", `"${path}" is over the limit of ${maxBytes} bytes`);
    if (fstatSync(fd).size > maxBytes) throw tooLarge();
    // The file may grow while it is read: never more than the limit and one byte.
    const buf = Buffer.alloc(Math.min(maxBytes + 1, Math.max(fstatSync(fd).size + 1, 1 << 16)));
    let held = 0;
    let chunk = buf;
    for (;;) {
      if (held === chunk.length) {
        if (held > maxBytes) throw tooLarge();
        const bigger = Buffer.alloc(Math.min(maxBytes + 1, held * 2));
        chunk.copy(bigger, 0, 0, held);
        chunk = bigger;
      }
      const n = readSync(fd, chunk, held, chunk.length - held, held);
      if (n <= 0) break;
      held += n;
    }
    if (held > maxBytes) throw tooLarge();
    return chunk.subarray(0, held);
  } finally {
    closeSync(fd);
  }
}
