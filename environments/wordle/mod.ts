/**
 * wordle: a multi-turn word game implemented in TypeScript. The model guesses a secret
 * five-letter word in `<guess>` tags and gets G (right place), Y (elsewhere), X (absent)
 * feedback after each guess; six guesses at most.
 * @module
 */
import {
  type Messages,
  MultiTurnEnv,
  type MultiTurnEnvOptions,
  Rubric,
  type State,
  XMLParser,
} from "../../mod.ts";

/** Defaults `vf eval wordle` uses when -n / -r are not given. */
export const evalDefaults = { num_examples: 10, rollouts_per_example: 2 };

/** Secret words (all five letters, lower case). */
export const WORDS = [
  "apple",
  "brave",
  "crane",
  "drift",
  "eagle",
  "flame",
  "grape",
  "house",
  "input",
  "jolly",
  "knife",
  "lemon",
  "mango",
  "noble",
  "ocean",
  "piano",
  "queen",
  "river",
  "stone",
  "tiger",
  "urban",
  "vivid",
  "whale",
  "youth",
  "zebra",
  "amber",
  "blaze",
  "cider",
  "dwarf",
  "ember",
  "frost",
  "gloom",
  "haste",
  "ivory",
  "joker",
  "karma",
  "lunar",
  "maple",
  "nerve",
  "orbit",
];

const RULES = `Let's play Wordle. Guess the secret five-letter English word in at most six tries.
After each guess you get feedback, one letter per position:
G = right letter, right place; Y = in the word, elsewhere; X = not in the word.
Think briefly, then answer with your guess in tags, e.g. <guess>crane</guess>.`;

/** Feedback for one guess, handling repeated letters like the original game. */
export function scoreGuess(guess: string, secret: string): string {
  const out = Array<string>(5).fill("X");
  const left = new Map<string, number>();
  for (let i = 0; i < 5; i++) {
    if (guess[i] === secret[i]) out[i] = "G";
    else left.set(secret[i], (left.get(secret[i]) ?? 0) + 1);
  }
  for (let i = 0; i < 5; i++) {
    if (out[i] === "G") continue;
    const n = left.get(guess[i]) ?? 0;
    if (n > 0) {
      out[i] = "Y";
      left.set(guess[i], n - 1);
    }
  }
  return out.join("");
}

/** The Wordle game as a MultiTurnEnv. */
export class WordleEnv extends MultiTurnEnv {
  guessParser = new XMLParser(["guess"], { answerField: "guess" });

  constructor(options: MultiTurnEnvOptions) {
    super({ maxTurns: 6, ...options });
  }

  envResponse(messages: Messages, state: State): Messages {
    const guess = (this.guessParser.parseAnswer(messages.slice(-1)) ?? "").trim().toLowerCase();
    const guesses = (state.guesses as string[] | undefined) ?? [];
    state.guesses = guesses;
    if (!/^[a-z]{5}$/.test(guess)) {
      return [{
        role: "user",
        content: "Invalid guess: give exactly five letters in <guess></guess> tags.",
      }];
    }
    guesses.push(guess);
    const feedback = scoreGuess(guess, state.answer);
    state.last_feedback = feedback;
    if (feedback === "GGGGG") {
      const done: Messages = [{
        role: "user",
        content: `${feedback}\nSolved in ${guesses.length}!`,
      }];
      state.final_env_response = done;
      return done;
    }
    return [{
      role: "user",
      content: `${guess} → ${feedback} (${6 - state.trajectory.length} left)`,
    }];
  }
}

function guessesOf(state: State, parser: XMLParser): string[] {
  // Guesses are re-read from the completion so the last one (never answered) counts too.
  return state.completion
    .filter((m) => m.role === "assistant")
    .map((m) => (parser.parseAnswer([m]) ?? "").trim().toLowerCase());
}

/** Build the environment. Args: `num_examples` (default all 40). */
export function loadEnvironment(args: Record<string, unknown> = {}): WordleEnv {
  const n = Number(args.num_examples ?? WORDS.length);
  const rows = WORDS.slice(0, n).map((w) => ({ question: RULES, answer: w }));
  const parser = new XMLParser(["guess"], { answerField: "guess" });
  const rubric = new Rubric({
    parser,
    funcs: [
      function solved({ state }) {
        return guessesOf(state, parser).includes(state.answer) ? 1 : 0;
      },
      function partial_credit({ state }) {
        const last = guessesOf(state, parser).at(-1) ?? "";
        if (!/^[a-z]{5}$/.test(last)) return 0;
        const fb = scoreGuess(last, state.answer);
        return Math.min(
          1,
          [...fb].reduce((a, c) => a + (c === "G" ? 0.2 : c === "Y" ? 0.1 : 0), 0),
        );
      },
      function efficiency({ state }) {
        const g = guessesOf(state, parser);
        const at = g.indexOf(state.answer);
        return at < 0 ? 0 : (6 - at) / 6;
      },
    ],
    weights: [1, 0.2, 0.2],
  });
  rubric.addMetric(parser.getFormatRewardFunc(), 0, "format_reward");
  return new WordleEnv({
    evalDataset: rows,
    systemPrompt: null,
    parser,
    rubric,
    envId: "wordle",
    envArgs: args,
  });
}
