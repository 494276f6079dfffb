/**
 * The persistent command channel of a sandbox: long-lived POSIX shells (supervisors) in it,
 * each started once over a stream that stays attached (a Docker exec, an SSH channel), so a
 * command costs one line written to a supervisor's stdin and one fork and exec in the
 * sandbox, instead of a new exec (Docker: create, start, inspect; SSH: a session, a login
 * shell and a wrapper) per command.
 *
 * Each supervisor runs one request at a time; a channel keeps a small pool of them (one
 * opened at once, more while all are busy, up to a limit), so commands still run
 * concurrently. A request is one line, its words shell-quoted (newlines spelled `"$nl"`),
 * and starts with a fresh random marker:
 * - `r <marker> <cwd> <stdin-bytes|-> <env-count> <NAME=value>... <argv...>`, followed by the
 *   stdin bytes: the supervisor copies them to a file with `head -c` (one request at a time,
 *   so nothing after them is in the pipe for a reading-ahead `head` to swallow), then runs
 *   the command in the background with its stdout and stderr on the supervisor's own (the
 *   stream keeps them apart, binary-safe), and waits for it;
 * - `g <marker> <path> <limit|"">`: a file's bytes (`head -c`, or `cat`);
 * - `w <marker> <path> <mode> <fresh-mode> <bytes>` and the bytes: a file written;
 * - `a <marker> <dir> <name> <limit|"">`: a tar of `<name>` in `<dir>` (`tar -c`, cut after the
 *   limit by `head -c`); status 4 when it does not exist and 5 without `tar`, both found
 *   without starting a process;
 * - `x <marker> <dir> <bytes> <"own"|"">` and the bytes: a tar extracted into `<dir>`, made
 *   first when missing (`tar -C <dir> -x`, no shell in front of it; with `own`, `-o`: files
 *   belong to the supervisor's user, not the archive's); status 3 when `<dir>` cannot be made
 *   and 5 without `tar`.
 * When it is done the supervisor prints `<marker> <status>\n` on stdout and `<marker>\n` on
 * stderr; what came before the markers is the command's output. A command that leaves a
 * daemon behind still ends when its own process does (a plain exec waits for every holder
 * of its output); the daemon's later output lands in whatever the supervisor runs next.
 * @module
 */

import { randomHex, toBytes, untilInterrupted, within } from "./_util.ts";
import { SandboxUnavailableError } from "./errors.ts";

/** The stream a supervisor runs on: its stdin, and whether it keeps the program alive. */
export interface SupervisorStream {
  /** Resolves when the stream closes (the supervisor ended, or the stream was cut). */
  readonly done: Promise<void>;
  write(data: Uint8Array): void;
  /** Closes the supervisor's stdin. */
  end(): void;
  /** Cuts the stream. */
  destroy(): void;
  /** Whether the stream keeps the program alive; a transport that cannot tell leaves these out. */
  ref?(): void;
  unref?(): void;
}

/**
 * Starts `/bin/sh -c <script> sh <args...>` attached in the sandbox with the handlers on its
 * stdout and stderr; null when it cannot be started.
 */
export type SupervisorLauncher = (
  script: string,
  args: string[],
  io: { onStdout(chunk: Uint8Array): void; onStderr(chunk: Uint8Array): void },
) => Promise<SupervisorStream | null>;

/** Options of {@link ExecChannel.open}. */
export interface ExecChannelOptions {
  /** Supervisors at most; more concurrent requests wait for one. Default 8. */
  max?: number;
  /** Start each command in a session of its own (`setsid`), for supervisors shared by sandboxes. */
  isolate?: boolean;
}

/** Options of {@link ExecChannel.request}. */
export interface ChannelRequestOptions {
  /** Bytes sent after the request line (stdin, a file's content). */
  data?: Uint8Array;
  /** Told the supervisor's pid as the request goes out (a kill runs below it). */
  onStart?: (supervisorPid: number) => void;
  /** Once aborted, a request still waiting for a supervisor is never sent. */
  cancel?: AbortSignal;
  /**
   * The supervisor goes back to the pool only once this settles: a caller that kills below
   * the supervisor holds it until the kill is done, so the kill never reaches the next request.
   */
  hold?: Promise<unknown>;
}

/** What `a` says on stderr when `tar` failed under a cap (`head` has the status then). */
export const TAR_FAILED = "vf-tar-failed";

/**
 * The supervisor's script (POSIX sh). `$1` = 1 starts each command in a session of its own
 * (`setsid`, where the host has it), so a `kill 0` in one command reaches its own process group
 * and never the supervisor, which other sandboxes share on an SSH connection. Bytes that follow
 * a request (stdin, a file) are copied with `head -c`; if that fails the supervisor exits
 * rather than read the rest as requests.
 */
export const SUPERVISOR = `nl='
'
ss=
[ "$1" = 1 ] && command -v setsid >/dev/null 2>&1 && ss=setsid
printf '\\037ready %s %s %s\\n' "$$" "$(id -u)" "$(umask)" >&2
in=$(umask 077; mktemp /tmp/.vf-stdin.XXXXXX 2>/dev/null) || in=/tmp/.vf-stdin.$$
while IFS= read -r line; do
  eval "set -- $line"
  op=$1; k=$2; shift 2
  case $op in
  r)
    cwd=$1; n=$2; ne=$3; shift 3
    if [ ! -d "$cwd" ]; then
      [ "$n" = - ] || head -c "$n" >/dev/null || exit 1
      printf '%s nocwd\\n' "$k"; printf '%s\\n' "$k" >&2; continue
    fi
    i=/dev/null
    if [ "$n" != - ]; then i=$in; head -c "$n" >"$i" || exit 1; fi
    (
      cd "$cwd" || exit 1
      while [ "$ne" -gt 0 ]; do export "$1"; shift; ne=$((ne - 1)); done
      exec $ss "$@"
    ) <"$i" &
    wait $!; rc=$?
    [ "$i" = /dev/null ] || : >"$i"
    printf '%s %s\\n' "$k" "$rc"; printf '%s\\n' "$k" >&2
    ;;
  g)
    if [ ! -e "$1" ]; then printf '%s missing\\n' "$k"
    elif [ -d "$1" ]; then printf '%s dir\\n' "$k"
    else
      if [ -n "$2" ]; then head -c "$2" "$1"; else cat "$1"; fi
      printf '%s %s\\n' "$k" "$?"
    fi
    printf '%s\\n' "$k" >&2
    ;;
  a)
    if [ ! -d "$1" ] || { [ ! -e "$1/$2" ] && [ ! -h "$1/$2" ]; }; then rc=4
    elif ! command -v tar >/dev/null 2>&1; then rc=5
    elif [ -n "$3" ]; then
      { tar -C "$1" -cf - -- "$2" || echo ${TAR_FAILED} >&2; } </dev/null | head -c "$3"
      rc=$?
    else tar -C "$1" -cf - -- "$2" </dev/null; rc=$?
    fi
    printf '%s %s\\n' "$k" "$rc"; printf '%s\\n' "$k" >&2
    ;;
  x)
    head -c "$2" >"$in" || exit 1
    o=; [ "$3" = own ] && o=-o
    if ! command -v tar >/dev/null 2>&1; then rc=5
    elif [ -d "$1" ] || { mkdir -p "$1" 2>/dev/null && [ -d "$1" ]; }; then
      tar -C "$1" -x $o -f "$in" </dev/null; rc=$?
    else rc=3
    fi
    : >"$in"
    printf '%s %s\\n' "$k" "$rc"; printf '%s\\n' "$k" >&2
    ;;
  w)
    f=$1; mode=$2; fresh=$3; n=$4; ex=
    [ -e "$f" ] && ex=1
    d=\${f%/*}
    [ -z "$d" ] || [ -d "$d" ] || mkdir -p "$d" 2>/dev/null
    if { : >>"$f"; } 2>/dev/null; then
      head -c "$n" >"$f" || exit 1
      rc=0
      if [ -n "$ex" ] || [ "$mode" != "$fresh" ]; then chmod "$mode" "$f"; rc=$?; fi
    else
      head -c "$n" >/dev/null || exit 1
      rc=unwritable
    fi
    printf '%s %s\\n' "$k" "$rc"; printf '%s\\n' "$k" >&2
    ;;
  esac
done
rm -f "$in"`;

/** A word for the supervisor's `eval "set -- ..."`: single-quoted, newlines as `"$nl"`. */
function word(text: string): string {
  return `'${text.replace(/'/g, `'\\''`).replace(/\n/g, `'"$nl"'`)}'`;
}

/** What a request did: its status word (an exit code, or `nocwd`, `missing`, ...) and output. */
export interface ChannelResult {
  status: string;
  stdout: Uint8Array;
  stderr: Uint8Array;
}

/** Collects one stream of a request until its marker, keeping the bytes before it. */
class MarkedStream {
  #chunks: Uint8Array[] = [];
  #size = 0;
  #marker: Uint8Array;
  /** What followed the marker up to its newline, once seen. */
  tail: string | undefined;
  data: Uint8Array | undefined;

  constructor(marker: string, readonly withStatus: boolean) {
    this.#marker = toBytes(marker);
  }

  /** Adds bytes; true once the marker's line has arrived (then `data` and `tail` are set). */
  push(chunk: Uint8Array): boolean {
    this.#chunks.push(chunk);
    this.#size += chunk.length;
    // Only the newest bytes (a marker's length and its status before them) can hold the
    // marker's line: search a copy of that tail, never the whole output.
    const span = Math.min(this.#size, chunk.length + this.#marker.length + 64);
    const tail = this.#tail(span);
    const at = indexOf(tail, this.#marker, 0);
    if (at < 0) return false;
    const newline = tail.indexOf(10, at + this.#marker.length);
    if (newline < 0) return false;
    const start = this.#size - span + at;
    this.tail = new TextDecoder().decode(tail.subarray(at + this.#marker.length, newline)).trim();
    const joined = this.#join();
    // A plain Uint8Array even when the one chunk was a Buffer (whose slice is a Buffer too).
    this.data = new Uint8Array(joined.buffer, joined.byteOffset, start).slice();
    this.#chunks = [];
    return true;
  }

  /** The last `n` bytes, copied out of the chunks. */
  #tail(n: number): Uint8Array {
    const out = new Uint8Array(n);
    let o = n;
    for (let i = this.#chunks.length - 1; i >= 0 && o > 0; i--) {
      const c = this.#chunks[i];
      const take = Math.min(o, c.length);
      out.set(c.subarray(c.length - take), o - take);
      o -= take;
    }
    return out;
  }

  #join(): Uint8Array {
    if (this.#chunks.length > 1) {
      const out = new Uint8Array(this.#size);
      let o = 0;
      for (const c of this.#chunks) {
        out.set(c, o);
        o += c.length;
      }
      this.#chunks = [out];
    }
    return this.#chunks[0];
  }
}

function indexOf(haystack: Uint8Array, needle: Uint8Array, from: number): number {
  const first = needle[0];
  for (let i = haystack.indexOf(first, from); i >= 0; i = haystack.indexOf(first, i + 1)) {
    if (i + needle.length > haystack.length) return -1;
    let j = 1;
    while (j < needle.length && haystack[i + j] === needle[j]) j++;
    if (j === needle.length) return i;
  }
  return -1;
}

interface Request {
  out: MarkedStream;
  err: MarkedStream;
  resolve: (result: ChannelResult) => void;
  reject: (error: Error) => void;
}

/** One supervisor: one request at a time. */
class Supervisor {
  pid = 0;
  uid = -1;
  umask = 0o022;
  dead: Error | null = null;
  #stream!: SupervisorStream;
  #current: Request | null = null;

  static async open(
    launch: SupervisorLauncher,
    isolate: boolean,
    onDeath: (s: Supervisor) => void,
  ): Promise<Supervisor | null> {
    const sup = new Supervisor();
    let early = "";
    let ready!: (ok: boolean) => void;
    const readiness = new Promise<boolean>((resolve) => (ready = resolve));
    let started = false;
    const stream = await launch(SUPERVISOR, [isolate ? "1" : "0"], {
      onStdout: (chunk) => sup.#onOut(chunk),
      onStderr: (chunk) => {
        if (started) return sup.#onErr(chunk);
        early += new TextDecoder().decode(chunk);
        const at = early.indexOf("\x1fready ");
        const m = at < 0 ? null : /^ready (\d+) (\d*) (\d*)\n/.exec(early.slice(at + 1));
        if (m) {
          sup.pid = Number(m[1]);
          sup.uid = m[2] === "" ? -1 : Number(m[2]); // no `id`: not known to be root
          sup.umask = m[3] === "" ? 0o022 : parseInt(m[3], 8);
          started = true;
          ready(true);
        }
      },
    }).catch(() => null);
    if (!stream) return null;
    sup.#stream = stream;
    stream.done.then(() => {
      ready(false);
      sup.#fail(new SandboxUnavailableError("its supervisor ended"));
      onDeath(sup);
    });
    const timer = setTimeout(() => ready(false), 10_000);
    const ok = await readiness;
    clearTimeout(timer);
    if (!ok) {
      stream.destroy();
      return null;
    }
    // Idle, a supervisor must not keep the program alive (one that ends without stopping its
    // sandboxes still ends); while a request waits on it, it must.
    stream.unref?.();
    return sup;
  }

  get busy(): boolean {
    return this.#current !== null;
  }

  request(op: string, words: string[], data?: Uint8Array): Promise<ChannelResult> {
    if (this.dead) return Promise.reject(this.dead);
    const marker = `\x1fvf${randomHex(12)}`;
    this.#stream.ref?.();
    return new Promise<ChannelResult>((resolve, reject) => {
      this.#current = {
        out: new MarkedStream(marker, true),
        err: new MarkedStream(marker, false),
        resolve,
        reject,
      };
      const line = [op, word(marker), ...words.map(word)].join(" ") + "\n";
      const bytes = toBytes(line);
      if (data?.length) {
        const all = new Uint8Array(bytes.length + data.length);
        all.set(bytes);
        all.set(data, bytes.length);
        this.#stream.write(all);
      } else {
        this.#stream.write(bytes);
      }
    });
  }

  #onOut(chunk: Uint8Array): void {
    const req = this.#current;
    if (!req || req.out.data) return; // a daemon's output after its command ended
    req.out.push(chunk);
    this.#settle();
  }

  #onErr(chunk: Uint8Array): void {
    const req = this.#current;
    if (!req || req.err.data) return;
    req.err.push(chunk);
    this.#settle();
  }

  #settle(): void {
    const req = this.#current;
    if (!req?.out.data || !req.err.data) return;
    this.#current = null;
    this.#stream.unref?.();
    req.resolve({ status: req.out.tail ?? "", stdout: req.out.data, stderr: req.err.data });
  }

  #fail(error: Error): void {
    if (this.dead) return;
    this.dead = error;
    const req = this.#current;
    this.#current = null;
    this.#stream?.unref?.();
    req?.reject(error);
  }

  close(): void {
    this.#fail(new SandboxUnavailableError("the command channel was closed"));
    this.#stream?.end();
    this.#stream?.destroy();
  }
}

/** The supervisors of one sandbox (or of one SSH connection, shared by its sandboxes). */
export class ExecChannel {
  #launch: SupervisorLauncher;
  #label: string;
  #idle: Supervisor[] = [];
  #all = new Set<Supervisor>();
  #opening = 0;
  #waiters: Array<(s: Supervisor | null) => void> = [];
  #closed = false;
  /** The first supervisor's uid and umask (file requests go through it only as root). */
  uid = -1;
  umask = 0o022;
  /** How many supervisors run at most; more concurrent commands wait for one. */
  readonly max: number;
  readonly #isolate: boolean;
  /** A supervisor died: the channel stops taking requests (callers turn to plain execs). */
  #broken = false;
  /** Opening one more supervisor failed: requests wait for the ones running. */
  #full = false;

  private constructor(launch: SupervisorLauncher, label: string, options: ExecChannelOptions) {
    this.#launch = launch;
    this.#label = label;
    this.max = options.max ?? 8;
    this.#isolate = options.isolate ?? false;
  }

  #openSupervisor(): Promise<Supervisor | null> {
    return Supervisor.open(this.#launch, this.#isolate, (s) => {
      // A dead supervisor is never handed out again; the others finish what they run.
      this.#broken = true;
      this.#all.delete(s);
      this.#idle = this.#idle.filter((x) => x !== s);
      for (const w of this.#waiters.splice(0)) w(null); // they fail, or take an idle one
    });
  }

  /** Starts the first supervisor; null when the sandbox cannot run one (no `/bin/sh`). */
  static async open(
    launch: SupervisorLauncher,
    label: string,
    options: ExecChannelOptions = {},
  ): Promise<ExecChannel | null> {
    const channel = new ExecChannel(launch, label, options);
    const first = await channel.#openSupervisor();
    if (!first) return null;
    channel.uid = first.uid;
    channel.umask = first.umask;
    channel.#all.add(first);
    channel.#idle.push(first);
    return channel;
  }

  /** The pids of its live supervisors (a sweep of the sandbox's processes spares them). */
  get pids(): number[] {
    return [...this.#all].filter((s) => !s.dead).map((s) => s.pid);
  }

  /** False once a supervisor died or the channel was closed; callers then use plain execs. */
  get alive(): boolean {
    return !this.#closed && !this.#broken;
  }

  /**
   * An idle supervisor, a new one while there is room, else the next one given back. Once the
   * channel is broken no new one is opened: a request still waiting fails as infrastructure.
   */
  async #take(): Promise<Supervisor> {
    for (;;) {
      if (this.#closed) throw this.#gone();
      const idle = this.#idle.pop();
      if (idle && !idle.dead) return idle;
      if (idle) continue;
      if (this.#broken) throw this.#gone();
      if (!this.#full && this.#all.size + this.#opening < this.max) {
        this.#opening++;
        const s = await this.#openSupervisor().finally(() => this.#opening--);
        if (s && !this.#closed) {
          this.#all.add(s);
          return s;
        }
        s?.close();
        // No new one (a refused channel, say): wait for one of those already running.
        if (!s && this.#all.size === 0) throw this.#gone();
        if (!s) this.#full = true;
        continue;
      }
      const s = await new Promise<Supervisor | null>((resolve) => this.#waiters.push(resolve));
      if (s) return s;
    }
  }

  #give(s: Supervisor): void {
    if (s.dead || this.#closed) {
      this.#all.delete(s);
      if (!s.dead) s.close(); // retired: it finished its last request
      return;
    }
    const waiter = this.#waiters.shift();
    if (waiter) waiter(s);
    else this.#idle.push(s);
  }

  #gone(): Error {
    return new SandboxUnavailableError(
      `The command channel of ${this.#label} is gone (a supervisor was killed, or the ` +
        `sandbox stopped)`,
    );
  }

  /**
   * One request on an idle supervisor. `onStart` gets the supervisor's pid as the request
   * goes out: a command to kill runs below it. Once `cancel` aborts, a request still waiting
   * for a supervisor is never sent.
   */
  async request(
    op: "r" | "g" | "w" | "a" | "x",
    words: string[],
    options: ChannelRequestOptions = {},
  ): Promise<ChannelResult> {
    const s = await this.#take();
    if (options.cancel?.aborted) {
      this.#give(s);
      throw options.cancel.reason;
    }
    options.onStart?.(s.pid);
    try {
      return await s.request(op, words, options.data);
    } catch (error) {
      throw new SandboxUnavailableError(
        `The command channel of ${this.#label} broke: ${(error as Error).message}`,
        { cause: error },
      );
    } finally {
      if (options.hold) options.hold.then(() => this.#give(s), () => this.#give(s));
      else this.#give(s);
    }
  }

  /**
   * Takes no more requests: idle supervisors end now, busy ones once their request is done.
   * For a channel shared by sandboxes, whose other requests must not be cut.
   */
  retire(): void {
    this.#closed = true;
    for (const s of this.#idle) {
      this.#all.delete(s);
      s.close();
    }
    this.#idle = [];
    for (const w of this.#waiters.splice(0)) w(null);
  }

  /** Ends every supervisor (the sandbox's removal would too). */
  close(): void {
    this.#closed = true;
    for (const s of this.#all) s.close();
    this.#all.clear();
    this.#idle = [];
    for (const w of this.#waiters.splice(0)) w(null);
  }
}

/** Options of {@link runCommand}. */
export interface ChannelCommandOptions {
  stdin?: Uint8Array;
  /** From the moment a supervisor takes the command (time queued for one does not count). */
  timeoutMs?: number;
  signal?: AbortSignal;
  /** Kills the process tree below a supervisor (a plain exec, never through the channel). */
  killBelow(supervisorPid: number): Promise<void>;
  /** Told which supervisor runs the command, and when it is done with it. */
  onSupervisor?(pid: number, running: boolean): void;
}

/**
 * Runs an `r` request to completion, a timeout or an abort. An interrupted command is killed
 * below its supervisor, which is held until the kill is done (so it never reaches the next
 * request); one still waiting for a supervisor is never sent. `value` is set when it finished.
 */
export async function runCommand(
  channel: ExecChannel,
  words: string[],
  options: ChannelCommandOptions,
): Promise<{ outcome: "done"; value: ChannelResult } | { outcome: "timeout" | "abort" }> {
  const { signal, timeoutMs } = options;
  let supervisor = 0;
  const cancel = new AbortController();
  const started = Promise.withResolvers<void>();
  const hold = Promise.withResolvers<void>();
  const done = channel.request("r", words, {
    data: options.stdin,
    cancel: cancel.signal,
    hold: hold.promise,
    onStart: (pid) => {
      supervisor = pid;
      options.onSupervisor?.(pid, true);
      started.resolve();
    },
  });
  try {
    const queued = await untilInterrupted(Promise.race([started.promise, done]), { signal });
    const ran = queued.outcome === "done"
      ? await untilInterrupted(done, { timeoutMs, signal })
      : queued;
    if (ran.outcome === "done") return { outcome: "done", value: ran.value as ChannelResult };
    cancel.abort(); // still waiting for a supervisor: never sent
    if (supervisor) await options.killBelow(supervisor).catch(() => {});
    await within(done.catch(() => {}), 5_000);
    return { outcome: ran.outcome };
  } finally {
    if (supervisor) options.onSupervisor?.(supervisor, false);
    hold.resolve();
  }
}
