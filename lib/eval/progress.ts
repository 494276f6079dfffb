/**
 * Progress display for long runs (a live line on a TTY, plain lines otherwise) and the
 * end-of-run summary table.
 * @module
 */
import type { Progress } from "./evaluate.ts";
import type { RunMetadata } from "./results.ts";
import type { RolloutOutput } from "../state.ts";
import { OutputTally } from "./tally.ts";
import { terminalLines, terminalText } from "../util/terminal.ts";

/** Where progress and summaries are written. */
export interface Output {
  write(text: string): void;
  isTTY: boolean;
}

function fmtDuration(ms: number): string {
  if (!Number.isFinite(ms)) return "?";
  const s = Math.round(ms / 1000);
  if (s < 60) return `${s}s`;
  const m = Math.floor(s / 60);
  return m < 60 ? `${m}m${String(s % 60).padStart(2, "0")}s` : `${Math.floor(m / 60)}h${m % 60}m`;
}

/** Renders progress events: redrawn in place on a TTY, one line per ~10% otherwise. */
export class ProgressDisplay {
  #out: Output;
  #label: string;
  #lastPlain = -1;
  #lastLen = 0;

  #suffix: (() => string) | undefined;

  /** @param suffix more to show at the end of each line (the adaptive limit, say) */
  constructor(out: Output, label: string, suffix?: () => string) {
    this.#out = out;
    this.#label = label;
    this.#suffix = suffix;
  }

  /** Render one progress event. */
  update(p: Progress): void {
    const rate = p.elapsedMs > 0 ? (p.done / p.elapsedMs) * 1000 : 0;
    const eta = rate > 0 ? ((p.total - p.done) / rate) * 1000 : Infinity;
    const frac = p.total ? p.done / p.total : 1;
    const stats = `${p.done}/${p.total} ${rate.toFixed(1)}/s ETA ${fmtDuration(eta)} reward ${
      p.avgReward.toFixed(3)
    }${p.errors ? ` errors ${p.errors}` : ""}${this.#suffix?.() ?? ""}`;
    if (this.#out.isTTY) {
      const width = 24;
      const filled = Math.round(frac * width);
      const bar = "█".repeat(filled) + "░".repeat(width - filled);
      const line = `${this.#label} ${bar} ${stats}`;
      this.#out.write(`\r${line}${" ".repeat(Math.max(0, this.#lastLen - line.length))}`);
      this.#lastLen = line.length;
    } else {
      const step = Math.floor(frac * 10);
      if (step !== this.#lastPlain) {
        this.#lastPlain = step;
        this.#out.write(`${this.#label} ${stats}\n`);
      }
    }
  }

  /** End the live line. */
  finish(): void {
    if (this.#out.isTTY && this.#lastLen) this.#out.write("\n");
    this.#lastLen = 0;
  }
}

function table(rows: string[][]): string {
  const widths = rows[0].map((_, c) => Math.max(...rows.map((r) => r[c].length)));
  return rows.map((r) => r.map((cell, c) => cell.padEnd(widths[c])).join("  ").trimEnd()).join(
    "\n",
  );
}

/** A reward as upstream's summary prints it (Python's `round(x, 3)`); `n/a` when unscored. */
function rewardText(reward: number | null): string {
  if (reward === null) return "n/a";
  const v = Math.round(reward * 1000) / 1000;
  return Number.isInteger(v) ? v.toFixed(1) : String(v);
}

/**
 * Upstream's per-rollout reward lines: `r1: [...]` holds every example's first rollout, in
 * example order, `r2` the second, and so on; the first examples only on a long run.
 */
function rolloutLines(tally: OutputTally, numExamples: number): string[] {
  const { rollouts, examples } = tally.rewardsByRollout();
  const more = numExamples > examples ? ` (first ${examples} of ${numExamples} examples)` : "";
  return rollouts.map((rewards, i) => `r${i + 1}: [${rewards.map(rewardText).join(", ")}]${more}`);
}

/**
 * The end-of-run summary: rewards and metrics (mean and std), the rewards of each rollout
 * (`r1: [...]`, as upstream prints them), pass@k, tokens, stop conditions, errors and
 * retries.
 * @param from the run's outputs, or their {@link OutputTally} when they were not kept
 */
export function renderSummary(
  metadata: RunMetadata,
  from: RolloutOutput[] | OutputTally,
): string {
  const tally = from instanceof OutputTally ? from : OutputTally.of(from);
  const lines: string[] = [];
  lines.push(
    `env ${metadata.env_id}  model ${metadata.model}  examples ${metadata.num_examples}  ` +
      `rollouts/example ${metadata.rollouts_per_example}  rollouts ${metadata.num_rollouts}  ` +
      `time ${fmtDuration(metadata.time_ms)}`,
  );
  const rewardStd = tally.rewardStd;
  const rows: string[][] = [["", "mean", "std"]];
  rows.push([
    "reward",
    metadata.avg_reward === null ? "n/a" : metadata.avg_reward.toFixed(4),
    rewardStd === null ? "n/a" : rewardStd.toFixed(4),
  ]);
  for (const [name, avg] of Object.entries(metadata.avg_metrics)) {
    rows.push([terminalText(name), avg.toFixed(4), tally.metricStd(name).toFixed(4)]);
  }
  lines.push(table(rows));
  lines.push(...rolloutLines(tally, metadata.num_examples));
  const ks = Object.keys(metadata.pass_at_k);
  if (ks.length) {
    lines.push(table([
      ["k", ...ks],
      ["pass@k", ...ks.map((k) => metadata.pass_at_k[k].toFixed(3))],
      ["pass^k", ...ks.map((k) => metadata.pass_all_k[k].toFixed(3))],
    ]));
  }
  if (metadata.usage) {
    lines.push(
      `tokens: input ${metadata.usage.total_input_tokens} (mean ${
        metadata.usage.input_tokens.toFixed(1)
      }), output ${metadata.usage.total_output_tokens} (mean ${
        metadata.usage.output_tokens.toFixed(1)
      })`,
    );
  }
  if (tally.stops.size) {
    lines.push(
      `stop conditions: ${[...tally.stops].map(([k, v]) => `${terminalText(k)} ${v}`).join(", ")}`,
    );
  }
  lines.push(
    `errors: ${tally.errors} of ${tally.count} (${(metadata.avg_error * 100).toFixed(1)}%)` +
      (metadata.num_unscored
        ? `, ${metadata.num_unscored} never scored and left out of the reward and pass@k`
        : ""),
  );
  for (const [k, v] of [...tally.errorKinds].slice(0, 5)) lines.push(`  ${v} × ${terminalText(k)}`);
  if (metadata.num_model_retries > 0) {
    lines.push(
      `model retries: ${metadata.num_model_retries} (in ${tally.retried} of ${tally.count} rollouts)`,
    );
  }
  // Names, stops and error messages come from environment code: no terminal escapes.
  return terminalLines(lines.join("\n"));
}
