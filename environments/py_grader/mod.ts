/**
 * py-grader: write a Python function in /app/solution.py. A private test runner is staged
 * only into the grading sandbox (isolated scoring), so the agent cannot read the tests, and
 * the expected answers stay in the evaluator, so a solution cannot fake a pass by exiting 0
 * (`vf validate py-grader --probe` checks it).
 * @module
 */
import {
  gradeSubmission,
  reward,
  Task,
  type TaskHookContext,
  type TaskScores,
  Taskset,
  type TasksetConfig,
} from "../../mod.ts";
import { gradeOutput, PRIVATE_TESTS } from "./private_tests.ts";

const PROBLEMS: Array<{ name: string; signature: string; spec: string; gold: string }> = [
  {
    name: "add",
    signature: "add(a, b)",
    spec: "return the sum of two integers",
    gold: "def add(a, b):\n    return a + b\n",
  },
  {
    name: "reverse_words",
    signature: "reverse_words(s)",
    spec: "return the words of s in reverse order, joined by single spaces",
    gold: "def reverse_words(s):\n    return ' '.join(reversed(s.split()))\n",
  },
  {
    name: "is_prime",
    signature: "is_prime(n)",
    spec: "return True when the integer n is prime, else False",
    gold:
      "def is_prime(n):\n    if n < 2:\n        return False\n    i = 2\n    while i * i <= n:\n        if n % i == 0:\n            return False\n        i += 1\n    return True\n",
  },
  {
    name: "fizzbuzz",
    signature: "fizzbuzz(n)",
    spec:
      'return "Fizz" for multiples of 3, "Buzz" for multiples of 5, "FizzBuzz" for both, else str(n)',
    gold:
      "def fizzbuzz(n):\n    if n % 15 == 0:\n        return 'FizzBuzz'\n    if n % 3 == 0:\n        return 'Fizz'\n    if n % 5 == 0:\n        return 'Buzz'\n    return str(n)\n",
  },
];

/** One function-writing task graded by the private tests. */
export class PyGraderTask extends Task {
  static override NEEDS_CONTAINER = true;

  override async setup({ runtime }: TaskHookContext): Promise<void> {
    await runtime.write(
      "/app/solution.py",
      `def ${this.data.signature}:\n    raise NotImplementedError\n`,
    );
  }

  override async stageVerifier({ runtime }: TaskHookContext): Promise<void> {
    await runtime.write("/tests/check.py", PRIVATE_TESTS);
  }

  // The sandbox only reports what the function returns; the comparison happens here, with
  // answers that never enter a sandbox (see private_tests.ts), so exiting 0 early earns 0.
  tests_pass = reward(async ({ runtime, trace }) => {
    const name = String(this.data.function);
    const r = await runtime.run(["python3", "/tests/check.py", name], { timeoutMs: 30_000 });
    const { reward, summary } = gradeOutput(name, r.stdout);
    trace.info.grader_output = `${summary}\n${r.stderr}`.slice(-500);
    return reward;
  });

  // The gold check goes through the whole isolated flow: the artifact moves to a fresh
  // grading sandbox, where the private tests are staged and run.
  override async validate(ctx: TaskHookContext): Promise<TaskScores> {
    await ctx.runtime.write("/app/solution.py", String(this.data.gold));
    return await gradeSubmission(ctx);
  }
}

/** The py-grader taskset. */
export class PyGraderTaskset extends Taskset<PyGraderTask> {
  get id(): string {
    return "py-grader";
  }

  *load(): Iterable<PyGraderTask> {
    for (const p of PROBLEMS) {
      yield new PyGraderTask({
        id: `py-grader-${p.name}`,
        prompt: `In /app/solution.py, implement ${p.signature}: ${p.spec}. Keep the function name.`,
        image: "python:3.11-slim",
        workdir: "/app",
        scoring: { mode: "isolated" },
        artifacts: [{ source: "/app/solution.py" }],
        function: p.name,
        signature: p.signature,
        gold: p.gold,
      }, this.config.task ?? {});
    }
  }
}

/** Entry point used by `vf run py-grader`. */
export function loadTaskset(config: TasksetConfig = {}): PyGraderTaskset {
  return new PyGraderTaskset(config);
}
