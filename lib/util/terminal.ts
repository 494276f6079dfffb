/**
 * Values from run files as text a terminal only shows. Run files may be written by untrusted
 * environment code, and a summary or warning that prints one of their strings as it is hands
 * that code the terminal: an escape sequence can rewrite the lines above (a fake reward),
 * set the window title, or with some terminals write a file or a link under another name.
 * @module
 */

/**
 * CSI and OSC sequences whole, then every other C0 and C1 control character and the
 * bidirectional overrides (which reorder what is shown, as in "Trojan Source").
 */
const CONTROL =
  // deno-lint-ignore no-control-regex
  /\x1b\[[0-?]*[ -/]*[@-~]|\x9b[0-?]*[ -/]*[@-~]|\x1b[\]PX^_][^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)?|[\x9d\x90\x98\x9e\x9f][^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)?|\x1b[ -/]*[0-~]?|[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]/g;

/**
 * `value` as one line a terminal only shows: a string as it is, another value as its JSON,
 * with escape sequences removed and every other control character (newline, carriage return,
 * tab included) shown as `\xNN` or `\uNNNN`, so a field can neither move the cursor nor fake
 * a line of its own.
 */
export function terminalText(value: unknown): string {
  let text: string;
  if (typeof value === "string") text = value;
  else {
    try {
      text = JSON.stringify(value) ?? String(value);
    } catch {
      text = String(value);
    }
  }
  return text.replace(CONTROL, (m) => {
    if (m.length > 1) return "";
    const code = m.charCodeAt(0);
    if (code === 0x1b) return "";
    return code > 0xff
      ? `\\u${code.toString(16).padStart(4, "0")}`
      : `\\x${code.toString(16).padStart(2, "0")}`;
  });
}

/**
 * `text` (lines written by vf, holding values from files) with escape sequences and control
 * characters removed, keeping its newlines and tabs.
 */
export function terminalLines(text: string): string {
  return text.split("\n").map((line) => line.split("\t").map(terminalText).join("\t")).join("\n");
}

/**
 * `value` as JSON a terminal only shows, still JSON that parses to the same value: the C1
 * controls, DEL, line separators and bidirectional overrides JSON leaves raw are escaped too.
 */
export function terminalJson(value: unknown): string {
  return (JSON.stringify(value) ?? "null").replace(
    /[\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]/g,
    (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, "0")}`,
  );
}
