#!/usr/bin/env python3
"""Run rdma-core's pyverbs tests as its run_tests.py does; record every verdict as JSON.

    pyverbs_run.py RESULT.json --dev vrdma0 --port 1 --gid N [-v] MODULE...

The verbose text output still goes to stderr for people. The host reads the
JSON instead: pyverbs objects collected after their context has closed print
ignored exceptions and warnings in the middle of verdict lines, which makes
the text unreliable to parse."""

import json
import os
import sys
import unittest
from importlib.machinery import SourceFileLoader

SUITE = "/opt/pyverbs-tests"


class Recording(unittest.TextTestResult):
    """A text result that also keeps (test id, verdict, detail) in order."""

    verdicts = []

    def _keep(self, test, verdict, detail=""):
        Recording.verdicts.append([test.id(), verdict, detail])

    def addSuccess(self, test):
        super().addSuccess(test)
        self._keep(test, "ok")

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self._keep(test, "fail", self._exc_info_to_string(err, test))

    def addError(self, test, err):
        super().addError(test, err)
        self._keep(test, "error", self._exc_info_to_string(err, test))

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        self._keep(test, "skip", reason)

    def addExpectedFailure(self, test, err):
        super().addExpectedFailure(test, err)
        self._keep(test, "ok", "expected failure")

    def addUnexpectedSuccess(self, test):
        super().addUnexpectedSuccess(test)
        self._keep(test, "fail", "unexpected success")


class Runner(unittest.TextTestRunner):
    resultclass = Recording


def main():
    out_path = sys.argv.pop(1)
    sys.path.insert(0, SUITE)
    from args_parser import parser  # rdma-core's, from SUITE

    tests = SourceFileLoader("tests", os.path.join(SUITE, "__init__.py")).load_module()
    parser.parse_args()
    prog = unittest.main(module=tests, testRunner=Runner, exit=False)
    with open(out_path, "w") as f:
        json.dump({"ran": prog.result.testsRun, "verdicts": Recording.verdicts}, f)
    sys.exit(0 if prog.result.wasSuccessful() else 1)


if __name__ == "__main__":
    main()
