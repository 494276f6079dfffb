/**
 * The private grader, staged only into the grading sandbox by `stageVerifier`; the agent
 * never sees it. Kept as a module so a compiled binary embeds it.
 */
export const PRIVATE_TESTS = `import importlib.util, sys

spec = importlib.util.spec_from_file_location("solution", "/app/solution.py")
mod = importlib.util.module_from_spec(spec)
try:
    spec.loader.exec_module(mod)
except Exception as e:
    print("cannot import solution:", e)
    sys.exit(2)

CASES = {
    "add": [((2, 3), 5), ((-1, 1), 0), ((10**12, 1), 10**12 + 1)],
    "reverse_words": [(("hello world",), "world hello"), (("a b c",), "c b a"), (("single",), "single")],
    "is_prime": [((2,), True), ((15,), False), ((97,), True), ((1,), False), ((0,), False)],
    "fizzbuzz": [((3,), "Fizz"), ((5,), "Buzz"), ((15,), "FizzBuzz"), ((7,), "7")],
}

name = sys.argv[1]
fn = getattr(mod, name, None)
if fn is None:
    print("missing function", name)
    sys.exit(1)
failed = 0
for args, want in CASES[name]:
    try:
        got = fn(*args)
    except Exception as e:
        got = repr(e)
    if got != want:
        failed += 1
        print(f"{name}{args}: got {got!r}, want {want!r}")
print(f"{len(CASES[name]) - failed}/{len(CASES[name])} passed")
sys.exit(1 if failed else 0)
`;
