#!/usr/bin/env python3
"""Sums the GoogleTest results Bazel left in bazel-testlogs/**/test.xml and prints one
closing line: 'N passed, N failed, N skipped'. Used by .ci/run after `bazel test //...`."""
import glob
import sys
import xml.etree.ElementTree as ET

passed = failed = skipped = 0
for path in glob.glob("bazel-testlogs/**/test.xml", recursive=True):
    try:
        root = ET.parse(path).getroot()
    except ET.ParseError:
        failed += 1  # a crashed test binary leaves a broken or missing report
        continue
    for case in root.iter("testcase"):
        if case.find("failure") is not None or case.find("error") is not None:
            failed += 1
        elif case.get("result") == "skipped" or case.find("skipped") is not None:
            skipped += 1
        else:
            passed += 1
print(f"{passed} passed, {failed} failed, {skipped} skipped")
sys.exit(1 if failed else 0)
