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
 * - `w <marker> <path> <mode> <fresh-mode> <bytes>` and the bytes: a file written.
 * When it is done the supervisor prints `<marker> <status>\n` on stdout and `<marker>\n` on
 * stderr; what came before the markers is the command's output. A command that leaves a
 * daemon behind still ends when its own process does (a plain exec waits for every holder
 * of its output); the daemon's later output lands in whatever the supervisor runs next.
 * @module
 */

import { randomHex, toBytes } from "./_util.ts";
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
 * Starts `/bin/sh -c <script>` attached in the sandbox with the handlers on its stdout and
 * stderr; null when it cannot be started.
 */
export type SupervisorLauncher = (
  script: string,
  io: { onStdout(chunk: Uint8Array): void; onStderr(chunk: Uint8Array): void },
) => Promise<SupervisorStream | null>;

/** The supervisor's script (POSIX sh). */
export const SUPERVISOR = `nl='
'
printf '\\037ready %s %s %s\\n' "$$" "$(id -u)" "$(umask)" >&2
in=$(umask 077; mktemp /tmp/.vf-stdin.XXXXXX 2>/dev/null) || in=/tmp/.vf-stdin.$$
while IFS= read -r line; do
  eval "set -- $line"
  op=$1; k=$2; shift 2
  case $op in
  r)
    cwd=$1; n=$2; ne=$3; shift 3
    if [ ! -d "$cwd" ]; then
      [ "$n" = - ] || head -c "$n" >/dev/null
      printf '%s nocwd\\n' "$k"; printf '%s\\n' "$k" >&2; continue
    fi
    i=/dev/null
    if [ "$n" != - ]; then i=$in; head -c "$n" >"$i"; fi
    (
      cd "$cwd" || exit 1
      while [ "$ne" -gt 0 ]; do export "$1"; shift; ne=$((ne - 1)); done
      exec "$@"
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
  w)
    f=$1; mode=$2; fresh=$3; n=$4; ex=
    [ -e "$f" ] && ex=1
    d=\${f%/*}
    [ -z "$d" ] || [ -d "$d" ] || mkdir -p "$d" 2>/dev/null
    if { : >>"$f"; } 2>/dev/null; then
      head -c "$n" >"$f"; rc=$?
      if [ "$rc" = 0 ] && { [ -n "$ex" ] || [ "$mode" != "$fresh" ]; }; then
        chmod "$mode" "$f"; rc=$?
      fi
    else
      head -c "$n" >/dev/null; rc=unwritable
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
    this.data = this.#join().slice(0, start);
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

  static async open(launch: SupervisorLauncher): Promise<Supervisor | null> {
    const sup = new Supervisor();
    let early = "";
    let ready!: (ok: boolean) => void;
    const readiness = new Promise<boolean>((resolve) => (ready = resolve));
    let started = false;
    const stream = await launch(SUPERVISOR, {
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

  private constructor(launch: SupervisorLauncher, label: string, max: number) {
    this.#launch = launch;
    this.#label = label;
    this.max = max;
  }

  /** Starts the first supervisor; null when the image cannot run one (no `/bin/sh`). */
  static async open(
    launch: SupervisorLauncher,
    label: string,
    max = 8,
  ): Promise<ExecChannel | null> {
    const channel = new ExecChannel(launch, label, max);
    const first = await Supervisor.open(launch);
    if (!first) return null;
    channel.uid = first.uid;
    channel.umask = first.umask;
    channel.#all.add(first);
    channel.#idle.push(first);
    return channel;
  }

  /** False once a supervisor died or the channel was closed; callers then use plain execs. */
  get alive(): boolean {
    return !this.#closed && [...this.#all].every((s) => !s.dead);
  }

  /** The supervisors' pids (a kill of a timed-out command kills below one of them). */
  async #take(): Promise<Supervisor> {
    for (;;) {
      if (this.#closed) throw this.#gone();
      const idle = this.#idle.pop();
      if (idle && !idle.dead) return idle;
      if (idle) continue;
      if (this.#all.size + this.#opening < this.max) {
        this.#opening++;
        const s = await Supervisor.open(this.#launch).finally(() => this.#opening--);
        if (s && !this.#closed) {
          this.#all.add(s);
          return s;
        }
        s?.close();
        if (!s) throw this.#gone();
        continue;
      }
      const s = await new Promise<Supervisor | null>((resolve) => this.#waiters.push(resolve));
      if (s) return s;
    }
  }

  #give(s: Supervisor): void {
    if (s.dead || this.#closed) {
      this.#all.delete(s);
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
    op: "r" | "g" | "w",
    words: string[],
    data?: Uint8Array,
    onStart?: (supervisorPid: number) => void,
    cancel?: AbortSignal,
  ): Promise<ChannelResult> {
    const s = await this.#take();
    if (cancel?.aborted) {
      this.#give(s);
      throw cancel.reason;
    }
    onStart?.(s.pid);
    try {
      return await s.request(op, words, data);
    } catch (error) {
      throw new SandboxUnavailableError(
        `The command channel of ${this.#label} broke: ${(error as Error).message}`,
        { cause: error },
      );
    } finally {
      this.#give(s);
    }
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
