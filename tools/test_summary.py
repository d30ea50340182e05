#!/usr/bin/env python3
"""Sums the GoogleTest results Bazel left in bazel-testlogs/**/test.xml, and the JUnit XML
reports named on the command line (pytest --junitxml, tests/fuzz/run_fuzzers.sh --junit),
and prints one closing line: 'N passed, N failed, N skipped'. Used by .ci/run after
`bazel test //...`, pytest and the fuzz smoke run.

A report named on the command line that is missing or unreadable counts as one failure
(its runner crashed or never ran)."""
import glob
import sys
import xml.etree.ElementTree as ET


def count(path, totals):
    try:
        root = ET.parse(path).getroot()
    except (ET.ParseError, OSError):
        totals["failed"] += 1  # a crashed test binary leaves a broken or missing report
        return
    for case in root.iter("testcase"):
        if case.find("failure") is not None or case.find("error") is not None:
            totals["failed"] += 1
        elif case.get("result") == "skipped" or case.find("skipped") is not None:
            totals["skipped"] += 1
        else:
            totals["passed"] += 1


def main(argv):
    totals = {"passed": 0, "failed": 0, "skipped": 0}
    for path in glob.glob("bazel-testlogs/**/test.xml", recursive=True):
        count(path, totals)
    for path in argv[1:]:
        count(path, totals)
    print(f"{totals['passed']} passed, {totals['failed']} failed, {totals['skipped']} skipped")
    return 1 if totals["failed"] else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
