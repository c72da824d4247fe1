#!/usr/bin/env python3
"""Copy the kernel modules a guest needs, with everything they depend on (modules.dep).

  copy-modules.py [--skip-unmatched] SRC DST LIST...

SRC is a kernel's /lib/modules/<kver>, DST the guest's, each LIST a file of shell globs under
kernel/ (guest/modules.list; compression suffixes are added automatically). A glob that
matches nothing is an error unless --skip-unmatched: the list names the default guest
kernel's modules, and other kernels moved some of them (7.3 has no arch/x86/crypto/crc32*,
its CRC32 code is built in).
"""
import fnmatch
import os
import shutil
import sys

SUFFIXES = (".ko.xz", ".ko.zst", ".ko.gz", ".ko")


def stem(m):
    for suf in SUFFIXES:
        if m.endswith(suf):
            return m[:-len(suf)]
    return m


def main(argv):
    skip = argv[:1] == ["--skip-unmatched"]
    if skip:
        argv = argv[1:]
    src, dst, lists = argv[0], argv[1], argv[2:]
    pats = [line.strip() for listfile in lists for line in open(listfile)
            if line.strip() and not line.startswith("#")]
    deps = {}
    for line in open(os.path.join(src, "modules.dep")):
        mod, _, rest = line.partition(":")
        deps[mod] = rest.split()
    want = set()
    for p in pats:
        hits = [m for m in deps if fnmatch.fnmatch(stem(m), "kernel/" + p)]
        if not hits:
            if not skip:
                sys.exit("no module matches " + p)
            print("no module matches %s (skipped)" % p, file=sys.stderr)
        want.update(hits)
    todo = list(want)
    while todo:
        for d in deps[todo.pop()]:
            if d not in want:
                want.add(d)
                todo.append(d)
    for m in sorted(want):
        os.makedirs(os.path.dirname(os.path.join(dst, m)), exist_ok=True)
        shutil.copy2(os.path.join(src, m), os.path.join(dst, m))
    for f in ("modules.order", "modules.builtin", "modules.builtin.modinfo"):
        if os.path.exists(os.path.join(src, f)):
            shutil.copy2(os.path.join(src, f), os.path.join(dst, f))
    print(len(want), "modules")


if __name__ == "__main__":
    main(sys.argv[1:])
