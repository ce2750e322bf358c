#!/usr/bin/env python3
"""Compares two reports of llama.cpp's server suite (scripts/server-tests.sh --junit):
llama-server's and wgllm's. Prints, per test file, how many tests each passes and both
pass, and lists the tests where they differ.
  scripts/server-tests-table.py LLAMA_SERVER.xml WGLLM.xml
  scripts/server-tests-table.py --save LLAMA_SERVER.xml OUT.txt
A report is a JUnit file or a saved outcome list (`pass|fail|skip NODE-ID` lines, what
--save writes): tests/data/server-suite-llama-server.txt is llama-server 11434's, so the
table needs no llama.cpp build.
"""
import collections, sys
import xml.etree.ElementTree as ET

def outcomes(path):
    out = {}
    if path.endswith(".txt"):
        for line in open(path):
            if line.strip() and not line.startswith("#"):
                kind, name = line.rstrip("\n").split(" ", 1)
                out[name] = kind
        return out
    for case in ET.parse(path).getroot().iter("testcase"):
        name = f"{case.get('classname')}::{case.get('name')}"
        kinds = {c.tag for c in case}
        out[name] = "skip" if "skipped" in kinds else "fail" if kinds & {"failure", "error"} else "pass"
    return out

if sys.argv[1] == "--save":
    with open(sys.argv[3], "w") as f:
        f.write(f"# outcomes of {sys.argv[2]} (scripts/server-tests-table.py --save)\n")
        for name, kind in sorted(outcomes(sys.argv[2]).items()):
            f.write(f"{kind} {name}\n")
    sys.exit(0)
ref, ours = outcomes(sys.argv[1]), outcomes(sys.argv[2])
files = collections.OrderedDict()
for name in sorted(set(ref) | set(ours)):
    f = name.split("::")[0].replace("unit.", "")
    r = files.setdefault(f, [0, 0, 0, 0])
    r[0] += 1
    r[1] += ref.get(name) == "pass"
    r[2] += ours.get(name) == "pass"
    r[3] += ref.get(name) == "pass" and ours.get(name) == "pass"
print("| file | tests | llama-server passes | wgllm passes | both pass |")
print("|---|---:|---:|---:|---:|")
tot = [0, 0, 0, 0]
for f, r in files.items():
    print(f"| {f} | {r[0]} | {r[1]} | {r[2]} | {r[3]} |")
    tot = [a + b for a, b in zip(tot, r)]
print(f"| all | {tot[0]} | {tot[1]} | {tot[2]} | {tot[3]} |")
gap = [n for n in sorted(ref) if ref[n] == "pass" and ours.get(n) != "pass"]
print(f"\n{len(gap)} tests llama-server passes and wgllm does not:")
for n in gap:
    print(" ", n)
extra = [n for n in sorted(ours) if ours[n] == "pass" and ref.get(n) != "pass"]
print(f"\n{len(extra)} tests wgllm passes and llama-server does not:")
for n in extra:
    print(" ", n)
