/**
 * Parsers turn a model's completion into an answer and score how well the
 * completion follows an expected format.
 * @module
 */

import type {
  AssistantMessage,
  Content,
  Messages,
  SystemMessage,
  ToolMessage,
  UserMessage,
} from "../types.ts";

/**
 * A format reward function, shaped like any vf reward function: it receives one
 * context object and reads `completion` from it. Its `name` is `"format_reward"`.
 */
export type FormatRewardFunc = (ctx: { completion: Messages | string }) => number;

/** What {@linkcode XMLParser.parse} returns: one key per allowed tag, `null` when absent. */
export type ParsedFields = Record<string, string | null>;

/** Options of {@linkcode Parser}. */
export interface ParserOptions {
  /** Applied to the text by `parse()`. Default: the identity. */
  extractFn?: (text: string) => string;
}

/** Options of {@linkcode XMLParser}. */
export interface XMLParserOptions {
  /** The tag whose value `parseAnswer()` returns. Default `"answer"`. */
  answerField?: string;
}

/** Options of {@linkcode XMLParser.parse}. */
export interface XMLParseOptions {
  /** Trim each value. Default `true` (the pattern already trims, so this rarely matters). */
  strip?: boolean;
  /** Take the last occurrence of each tag instead of the first. Default `false`. */
  last?: boolean;
}

const THINK_OPEN = "<think>";
const THINK_CLOSE = "</think>";

/**
 * The plain text of message content: a string as is; for a list of parts, the
 * text of each text part joined with a space and trimmed; anything else `""`.
 *
 * @example
 * ```ts
 * messageText([{ type: "text", text: "a" }, { type: "text", text: "b" }]); // "a b"
 * ```
 */
export function messageText(content: Content | null | undefined): string {
  if (typeof content === "string") return content;
  if (!Array.isArray(content)) return "";
  const texts: string[] = [];
  for (const part of content) {
    if (part?.type === "text" && typeof part.text === "string") texts.push(part.text);
  }
  return texts.join(" ").trim();
}

/**
 * The base parser: `parse()` applies `extractFn`, `parseAnswer()` parses the last
 * assistant message, and the format reward is always 1.
 *
 * `Parsed` is what `parse()` returns (`string` here; a subclass that parses into
 * something else overrides `parse()`). A slot that accepts any parser, including
 * {@linkcode XMLParser}, should be typed `Parser<unknown>`.
 *
 * @example
 * ```ts
 * const parser = new Parser({ extractFn: (t) => t.toUpperCase() });
 * parser.parseAnswer([{ role: "assistant", content: "yes" }]); // "YES"
 * ```
 */
export class Parser<Parsed = string> {
  #extractFn: (text: string) => string;

  /** Creates a parser; `extractFn` defaults to the identity. */
  constructor(options: ParserOptions = {}) {
    this.#extractFn = options.extractFn ?? identity;
  }

  /** The function `parse()` applies to text. */
  get extractFn(): (text: string) => string {
    return this.#extractFn;
  }

  /** Returns `extractFn(text)`. */
  parse(text: string): Parsed {
    return this.#extractFn(text) as Parsed;
  }

  /**
   * The answer in a completion: a string is parsed directly; a message list has
   * the text of its last assistant message parsed. `null` when there is no
   * assistant message (or `parse()` returned null); a non-string parse result
   * is converted with `String()`.
   */
  parseAnswer(completion: Messages | string): string | null {
    if (typeof completion === "string") return asAnswer(this.parse(completion));
    const last = this.getAssistantMessages === Parser.prototype.getAssistantMessages
      ? lastAssistant(completion)
      : this.getAssistantMessages(completion).at(-1);
    if (last === undefined) return null;
    return asAnswer(this.parse(messageText(last.content)));
  }

  /** The assistant messages of a list, in order. */
  getAssistantMessages(messages: Messages): AssistantMessage[] {
    return messages.filter((m): m is AssistantMessage => m.role === "assistant");
  }

  /** The user messages of a list, in order. */
  getUserMessages(messages: Messages): UserMessage[] {
    return messages.filter((m): m is UserMessage => m.role === "user");
  }

  /** The system messages of a list, in order. */
  getSystemMessages(messages: Messages): SystemMessage[] {
    return messages.filter((m): m is SystemMessage => m.role === "system");
  }

  /** The tool messages of a list, in order. */
  getToolMessages(messages: Messages): ToolMessage[] {
    return messages.filter((m): m is ToolMessage => m.role === "tool");
  }

  /** A reward function named `format_reward` that always returns 1. */
  getFormatRewardFunc(): FormatRewardFunc {
    return namedFormatReward(() => 1.0);
  }
}

/**
 * A parser for models that always emit `<think>...</think>` before answering and
 * whose server does not strip those tags. `parse()` keeps only the text after the
 * last `</think>`; without one it yields `extractFn("")`, so an unfinished thought
 * never passes as an answer.
 *
 * The constructor warns (once per parser) because the wrong model makes every
 * answer empty; use {@linkcode MaybeThinkParser} when tags may be absent.
 *
 * @example
 * ```ts
 * new ThinkParser().parse("<think>hmm</think> 42"); // "42"
 * ```
 */
export class ThinkParser extends Parser<string> {
  /** Creates the parser and warns about the models it suits. */
  constructor(options: ParserOptions = {}) {
    super(options);
    console.warn(
      "ThinkParser expects every completion to contain <think>...</think> tags that the " +
        "server leaves in place; with models whose chat template strips them (such as Qwen3 " +
        "or DeepSeek-R1) every parsed answer is empty. Use MaybeThinkParser for those",
    );
  }

  /** The trimmed text after the last `</think>` (or `""` without one), then `extractFn`. */
  override parse(text: string): string {
    const after = text.includes(THINK_CLOSE) ? afterLastThinkClose(text) : "";
    return this.extractFn(after.trim());
  }

  /**
   * A reward function named `format_reward`: the share of assistant messages that
   * start with `<think>`, hold exactly one `<think>` and one `</think>`, and have
   * something (even whitespace) after it; 0 without assistant messages. A string
   * completion is scored as one assistant message.
   */
  override getFormatRewardFunc(): FormatRewardFunc {
    return namedFormatReward(({ completion }) =>
      averageOverAssistantTexts(this, completion, followsThinkFormat)
    );
  }
}

/**
 * A parser that tolerates optional reasoning: `parse()` keeps the text after the
 * last `</think>` when there is one, else the whole text, trims it and applies
 * `extractFn`. Its format reward is always 1.
 *
 * @example
 * ```ts
 * new MaybeThinkParser().parse("plain answer"); // "plain answer"
 * ```
 */
export class MaybeThinkParser extends Parser<string> {
  /** The trimmed text after the last `</think>` (or all of it), then `extractFn`. */
  override parse(text: string): string {
    return this.extractFn(afterLastThinkClose(text).trim());
  }
}

/**
 * The last assistant message, what `getAssistantMessages(messages).at(-1)` is, found without
 * filtering a new array (reward functions call `parseAnswer` once per rollout).
 */
function lastAssistant(messages: Messages): AssistantMessage | undefined {
  for (let i = messages.length - 1; i >= 0; i--) {
    if (messages[i]?.role === "assistant") return messages[i] as AssistantMessage;
  }
  return undefined;
}

/** Whether this process has printed XMLParser's warning about a "think" field. */
let warnedThinkField = false;

/** One field of an XMLParser: its canonical tag and every tag accepted for it. */
interface XmlField {
  canonical: string;
  alternatives: string[];
}

/**
 * A parser for completions made of XML-like blocks such as
 * `<reasoning>...</reasoning><answer>...</answer>`.
 *
 * Each entry of `fields` is a tag name or a list of alternative tag names whose
 * first element is the canonical one (used by `format()` and `getFields()`).
 * Unlike the other parsers, XMLParser never applies an extract function.
 *
 * @example
 * ```ts
 * const parser = new XMLParser(["reasoning", ["code", "answer"]], { answerField: "code" });
 * parser.parse("<reasoning>r</reasoning><code>x = 1</code>");
 * // { reasoning: "r", code: "x = 1", answer: null }
 * ```
 */
export class XMLParser extends Parser<ParsedFields> {
  #fields: XmlField[] = [];
  #patterns = new Map<string, RegExp>();
  #answerField: string;

  /**
   * Creates the parser.
   *
   * @throws {TypeError} When an entry is neither a string nor a list of strings.
   * @throws {RangeError} When a list of alternatives is empty, a tag name is empty,
   *   or two fields share a canonical name.
   */
  constructor(fields: ReadonlyArray<string | readonly string[]>, options: XMLParserOptions = {}) {
    super();
    this.#answerField = options.answerField ?? "answer";
    if (!Array.isArray(fields)) {
      throw new TypeError(`XMLParser fields must be an array, got ${describe(fields)}`);
    }
    const seen = new Set<string>();
    for (const [index, spec] of fields.entries()) {
      const field = toField(spec, index);
      if (seen.has(field.canonical)) {
        throw new RangeError(`Duplicate XMLParser field "${field.canonical}"`);
      }
      seen.add(field.canonical);
      this.#fields.push(field);
      for (const tag of field.alternatives) {
        if (!this.#patterns.has(tag)) this.#patterns.set(tag, tagPattern(tag));
      }
    }
    // Once per process: an environment may build a parser per sub-environment or per load,
    // and the advice does not change.
    if (seen.has("think") && !warnedThinkField) {
      warnedThinkField = true;
      console.warn(
        'XMLParser has a "think" field: it only suits models that always emit ' +
          "<think>...</think> tags that the server leaves in place; with models whose chat " +
          "template strips them (such as Qwen3 or DeepSeek-R1) that field is never found. " +
          'Name the field "reasoning" to keep it without this warning',
      );
    }
  }

  /** The tag whose value `parseAnswer()` returns. */
  get answerField(): string {
    return this.#answerField;
  }

  /**
   * Finds each allowed tag (every alternative of every field) in `text` and
   * returns its trimmed content, or `null` when the tag is absent. The first
   * occurrence wins unless `last` is set.
   */
  override parse(text: string, options: XMLParseOptions = {}): ParsedFields {
    const strip = options.strip ?? true;
    const last = options.last ?? false;
    const entries: Array<[string, string | null]> = [];
    for (const field of this.#fields) {
      for (const tag of field.alternatives) {
        const pattern = this.#patterns.get(tag)!;
        pattern.lastIndex = 0;
        let match = pattern.exec(text);
        if (last && match !== null) {
          for (let next = pattern.exec(text); next !== null; next = pattern.exec(text)) {
            match = next;
          }
        }
        const value = match === null ? null : strip ? match[1].trim() : match[1];
        entries.push([tag, value]);
      }
    }
    // fromEntries defines own properties, so a tag such as "__proto__" stays a plain key.
    return Object.fromEntries(entries);
  }

  /**
   * The `answerField` value of a completion: for a string, its last occurrence;
   * for messages, the first found walking assistant messages from last to first
   * (each searched for its first occurrence). `null` when there is none.
   */
  override parseAnswer(completion: Messages | string): string | null {
    if (typeof completion === "string") {
      return this.parse(completion, { last: true })[this.#answerField] ?? null;
    }
    const assistants = this.getAssistantMessages(completion);
    for (let i = assistants.length - 1; i >= 0; i--) {
      const value = this.parse(messageText(assistants[i].content))[this.#answerField];
      if (value !== null && value !== undefined) return value;
    }
    return null;
  }

  /**
   * A description of the expected format: per field, its opening tag, `...` and
   * its closing tag on separate lines; alternatives render as `<[ a | b ]>`.
   */
  getFormatStr(): string {
    return this.#fields.map(({ alternatives }) => {
      const tag = alternatives.length > 1 ? `[ ${alternatives.join(" | ")} ]` : alternatives[0];
      return `<${tag}>\n...\n</${tag}>`;
    }).join("\n");
  }

  /**
   * Serialises values as `<canonical>\nvalue\n</canonical>` blocks joined by
   * newlines. A value may be given under any alternative name; the canonical
   * name wins when several are given.
   *
   * @throws {RangeError} When a field has no value under any of its names.
   */
  format(values: Record<string, string>): string {
    return this.#fields.map(({ canonical, alternatives }) => {
      const name = [canonical, ...alternatives].find((n) =>
        Object.hasOwn(values, n) && values[n] !== undefined && values[n] !== null
      );
      if (name === undefined) {
        const allowed = alternatives.map((a) => `"${a}"`).join(", ");
        throw new RangeError(`Missing value for field "${canonical}" (allowed names: ${allowed})`);
      }
      return `<${canonical}>\n${values[name]}\n</${canonical}>`;
    }).join("\n");
  }

  /** The canonical field names, in order. */
  getFields(): string[] {
    return this.#fields.map((f) => f.canonical);
  }

  /**
   * A reward function named `format_reward` that scores each assistant message and
   * averages the scores (0 without assistant messages; a string completion counts
   * as one message). A message earns:
   * - 0.4 × the share of fields present, when at least one tag parsed (a field is
   *   present when an alternative parsed or one of its tags appears at all);
   * - 0.2 for spacing (always earned, see below);
   * - 0.2 when it starts with an opening tag of the first field;
   * - 0.2 when it ends with a closing tag of the last field.
   */
  override getFormatRewardFunc(): FormatRewardFunc {
    return namedFormatReward(({ completion }) =>
      averageOverAssistantTexts(this, completion, (text) => this.#formatScore(text))
    );
  }

  #formatScore(text: string): number {
    const parsed = this.parse(text);
    let anyParsed = false;
    let presentFields = 0;
    for (const { alternatives } of this.#fields) {
      let present = false;
      for (const tag of alternatives) {
        if (parsed[tag] !== null) {
          anyParsed = true;
          present = true;
        } else if (text.includes(`<${tag}>`) || text.includes(`</${tag}>`)) {
          present = true;
        }
      }
      if (present) presentFields++;
    }
    const trimmed = text.trim();
    const first = this.#fields.at(0);
    const last = this.#fields.at(-1);
    const startsRight = first?.alternatives.some((t) => trimmed.startsWith(`<${t}>`)) ?? false;
    const endsRight = last?.alternatives.some((t) => trimmed.endsWith(`</${t}>`)) ?? false;

    // Same order of additions as verifiers, so a message's score matches it bit for bit.
    let score = 0;
    if (anyParsed) score += 0.4 * (presentFields / this.#fields.length);
    // verifiers checks "spacing" by parsing again without trimming; the pattern
    // already trims, so that parse succeeds exactly when this one did and the
    // bonus is always earned (a message with no XML at all scores 0.2).
    score += 0.2;
    if (startsRight) score += 0.2;
    if (endsRight) score += 0.2;
    return score;
  }
}

function identity(text: string): string {
  return text;
}

function asAnswer(value: unknown): string | null {
  if (typeof value === "string") return value;
  return value === null || value === undefined ? null : String(value);
}

function afterLastThinkClose(text: string): string {
  const at = text.lastIndexOf(THINK_CLOSE);
  return at === -1 ? text : text.slice(at + THINK_CLOSE.length);
}

function countOf(text: string, needle: string): number {
  return text.split(needle).length - 1;
}

function followsThinkFormat(text: string): number {
  const ok = text.trim().startsWith(THINK_OPEN) &&
    countOf(text, THINK_OPEN) === 1 &&
    countOf(text, THINK_CLOSE) === 1 &&
    afterLastThinkClose(text).length > 0;
  return ok ? 1.0 : 0.0;
}

function averageOverAssistantTexts(
  parser: Parser<unknown>,
  completion: Messages | string,
  score: (text: string) => number,
): number {
  const texts = typeof completion === "string"
    ? [completion]
    : parser.getAssistantMessages(completion).map((m) => messageText(m.content));
  if (texts.length === 0) return 0.0;
  let sum = 0;
  for (const text of texts) sum += score(text);
  return sum / texts.length;
}

function namedFormatReward(fn: FormatRewardFunc): FormatRewardFunc {
  // Rubrics name metrics after fn.name, and verifiers calls this metric format_reward.
  Object.defineProperty(fn, "name", { value: "format_reward" });
  return fn;
}

function toField(spec: unknown, index: number): XmlField {
  if (typeof spec === "string") return { canonical: checkTag(spec, index), alternatives: [spec] };
  if (!Array.isArray(spec)) {
    throw new TypeError(
      `XMLParser field ${index} must be a string or a list of strings, got ${describe(spec)}`,
    );
  }
  if (spec.length === 0) {
    throw new RangeError(`XMLParser field ${index} is an empty list of alternatives`);
  }
  const alternatives = spec.map((alt: unknown) => {
    if (typeof alt !== "string") {
      throw new TypeError(
        `XMLParser field ${index} has a non-string alternative ${describe(alt)}; ` +
          "every alternative must be a tag name",
      );
    }
    return checkTag(alt, index);
  });
  return { canonical: alternatives[0], alternatives };
}

function checkTag(tag: string, index: number): string {
  if (tag === "") throw new RangeError(`XMLParser field ${index} has an empty tag name`);
  return tag;
}

function tagPattern(tag: string): RegExp {
  const t = tag.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");
  return new RegExp(`<${t}>\\s*(.*?)\\s*</${t}>`, "gs");
}

function describe(value: unknown): string {
  if (value === null) return "null";
  if (Array.isArray(value)) return "an array";
  if (typeof value === "string") return `"${value}"`;
  if (typeof value === "number" || typeof value === "boolean") return `${typeof value} ${value}`;
  return typeof value;
}
