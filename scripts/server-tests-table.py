#!/usr/bin/env python3
"""Compares two JUnit reports of llama.cpp's server suite (scripts/server-tests.sh --junit):
llama-server's and wgllm's. Prints, per test file, how many tests each passes, and lists
the tests llama-server passes that wgllm does not.
  scripts/server-tests-table.py LLAMA_SERVER.xml WGLLM.xml
"""
import collections, sys
import xml.etree.ElementTree as ET

def outcomes(path):
    out = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        name = f"{case.get('classname')}::{case.get('name')}"
        kinds = {c.tag for c in case}
        out[name] = "skip" if "skipped" in kinds else "fail" if kinds & {"failure", "error"} else "pass"
    return out

ref, ours = outcomes(sys.argv[1]), outcomes(sys.argv[2])
files = collections.OrderedDict()
for name in sorted(set(ref) | set(ours)):
    f = name.split("::")[0].replace("unit.", "")
    r = files.setdefault(f, [0, 0, 0])
    r[0] += 1
    r[1] += ref.get(name) == "pass"
    r[2] += ours.get(name) == "pass"
print("| file | tests | llama-server passes | wgllm passes |")
print("|---|---:|---:|---:|")
tot = [0, 0, 0]
for f, r in files.items():
    print(f"| {f} | {r[0]} | {r[1]} | {r[2]} |")
    tot = [a + b for a, b in zip(tot, r)]
print(f"| all | {tot[0]} | {tot[1]} | {tot[2]} |")
gap = [n for n in sorted(ref) if ref[n] == "pass" and ours.get(n) != "pass"]
print(f"\n{len(gap)} tests llama-server passes and wgllm does not:")
for n in gap:
    print(" ", n)
extra = [n for n in sorted(ours) if ours[n] == "pass" and ref.get(n) != "pass"]
print(f"\n{len(extra)} tests wgllm passes and llama-server does not:")
for n in extra:
    print(" ", n)
