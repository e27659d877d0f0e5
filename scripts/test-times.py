"""Print the time split of a `make test` run: each part's seconds, then the slowest tests of pytest's JUnit files.

usage: python3 scripts/test-times.py TIMES [JUNIT_XML...]   TIMES: lines of `PART SECONDS`, in the order they ran.
A test's time is pytest's whole duration of it: set-up (the fixtures it is the first to need), call, tear-down.
"""

import sys
from pathlib import Path
from xml.etree import ElementTree

SLOWEST = 10


def parts(times_file: Path) -> list[tuple[str, int]]:
    return [(name, int(seconds)) for name, seconds in (line.split() for line in times_file.read_text().splitlines())]


def slowest_tests(junit_files: list[Path], count: int = SLOWEST) -> list[tuple[float, str]]:
    found = []
    for junit in junit_files:
        for case in ElementTree.parse(junit).iter("testcase"):
            found.append((float(case.get("time") or 0), f"{case.get('classname')}::{case.get('name')}"))
    return sorted(found, reverse=True)[:count]


def main():
    times_file, *junit_files = (Path(arg) for arg in sys.argv[1:])
    split = parts(times_file)
    total = sum(seconds for _name, seconds in split)
    print(f"\nmake test: {total} s ({total / 60:.1f} min)")
    for name, seconds in split:
        print(f"  {name:<12} {seconds:>6} s")
    tests = slowest_tests([junit for junit in junit_files if junit.exists()])
    if tests:
        print(f"the {len(tests)} slowest tests (set-up included):")
        for seconds, test in tests:
            print(f"  {seconds:>7.1f} s  {test}")


if __name__ == "__main__":
    main()
