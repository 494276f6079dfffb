/**
 * Claims on dedicated ssh hosts. A dedicated host is one sandbox: two sandboxes of this
 * process on it at once would share its files and processes. A sandbox takes its host's claim
 * before it touches the host and gives it back only once it has stopped (its commands killed,
 * its workdir removed). One that starts meanwhile waits its turn, first come first served,
 * instead of failing: a rollout's grader asks for the host while its agent is still handing it
 * back, and the agent's release does not depend on the grader.
 *
 * A wait that could never end (the holder stays up until the waiter is done) is the caller's
 * to refuse before it asks; {@linkcode dedicatedHostHolder} tells it who holds a host.
 * @module
 */

interface Waiter {
  id: string;
  grant: () => void;
}

interface Host {
  holder: string;
  waiting: Waiter[];
}

/** Each claimed host (`user@host:port`): its holder's sandbox id and who waits for it. */
const hosts = new Map<string, Host>();

/** A held claim on a dedicated host. */
export interface HostClaim {
  /** `user@host:port`. */
  readonly key: string;
  /** Hands the host to the next waiter, if any. Idempotent. */
  release(): void;
}

/** Options of {@linkcode claimHost}. */
export interface ClaimOptions {
  /** Aborting gives up the wait (the host is not claimed) and rejects with the reason. */
  signal?: AbortSignal;
  /** Told when the claim starts waiting for another sandbox's release (true) and gets it (false). */
  onQueue?: (waiting: boolean) => void;
}

/**
 * Claims `key` for sandbox `id`, waiting while another sandbox holds it.
 * @throws the signal's reason when it aborts first
 */
export async function claimHost(
  key: string,
  id: string,
  options: ClaimOptions = {},
): Promise<HostClaim> {
  const { signal, onQueue } = options;
  signal?.throwIfAborted();
  const host = hosts.get(key);
  if (!host) {
    hosts.set(key, { holder: id, waiting: [] });
    return claimOf(key);
  }
  onQueue?.(true);
  await new Promise<void>((resolve, reject) => {
    const onAbort = () => {
      const i = host.waiting.indexOf(waiter);
      if (i >= 0) host.waiting.splice(i, 1);
      reject(signal!.reason);
    };
    const waiter: Waiter = {
      id,
      grant: () => {
        signal?.removeEventListener("abort", onAbort);
        resolve();
      },
    };
    host.waiting.push(waiter);
    signal?.addEventListener("abort", onAbort, { once: true });
  });
  onQueue?.(false);
  return claimOf(key);
}

function claimOf(key: string): HostClaim {
  let held = true;
  return {
    key,
    release() {
      if (!held) return;
      held = false;
      const host = hosts.get(key)!;
      const next = host.waiting.shift();
      if (!next) {
        hosts.delete(key);
        return;
      }
      host.holder = next.id;
      next.grant();
    },
  };
}

/** The id of the sandbox of this process holding dedicated host `key` now, if any. */
export function dedicatedHostHolder(key: string): string | undefined {
  return hosts.get(key)?.holder;
}
