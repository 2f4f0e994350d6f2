"""The op's machine code in two builds, function by function: a change meant to leave the kernels' cost alone
(a predicate moved into a function of its own, a layout read from another file) shows here as the same
instructions. Addresses and jump targets are masked out; a function that differs is listed with the instructions
whose counts changed (mnemonic: old -> new), so register allocation alone reads as moves and nops.

    PYTHONPATH=. python benchmarks/machine_code_diff.py OLD/_C.so hookstats/_C.so --match 'avx2::|avx512::'
    PYTHONPATH=. python benchmarks/machine_code_diff.py OLD/_C.so hookstats/_C.so --save results/FILE.json
"""
import argparse
import collections
import os
import re
import subprocess

import results_file


def functions(binary):
    """{demangled name: [instruction with addresses masked]} of an object or shared library (objdump -d)."""
    text = subprocess.run(["objdump", "-d", "--no-show-raw-insn", "-C", binary], capture_output=True, text=True,
                          check=True).stdout
    found, name = collections.defaultdict(list), None
    for line in text.splitlines():
        head = re.match(r"^[0-9a-f]+ <(.*)>:$", line)
        if head:
            name = head.group(1)
            continue
        ins = re.match(r"^\s+[0-9a-f]+:\s+(.*)$", line)
        if ins and name:
            s = re.sub(r"<[^>]*>", "<>", ins.group(1))
            s = re.sub(r"\b[0-9a-f]{4,}\b", "ADDR", s)
            s = re.sub(r"0x[0-9a-f]+\(%rip\)", "RIP", s)
            found[name].append(re.sub(r"#.*", "", s).strip())
    return found


def compare(old, new, match):
    """{function: {"instructions": "old -> new", "changed": {mnemonic: "old -> new"}}} for each that differs."""
    a, b = functions(old), functions(new)
    out, same = {}, 0
    for name in sorted(set(a) | set(b)):
        if not re.search(match, name):
            continue
        if a.get(name) == b.get(name):
            same += 1
            continue
        ca = collections.Counter(i.split()[0] for i in a.get(name, []) if i)
        cb = collections.Counter(i.split()[0] for i in b.get(name, []) if i)
        out[name] = {"instructions": f"{sum(ca.values())} -> {sum(cb.values())}",
                     "changed": {k: f"{ca[k]} -> {cb[k]}" for k in sorted(set(ca) | set(cb)) if ca[k] != cb[k]}}
    return out, same


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--match", default=".", help="a regex on the demangled function names")
    ap.add_argument("--save", help="a file under benchmarks/ to write the result to")
    args = ap.parse_args()
    differ, same = compare(args.old, args.new, args.match)
    for name, d in differ.items():
        print(f"{d['instructions']:>13}  {name[:110]}\n{'':15}{d['changed'] or 'the same instructions, reordered'}")
    print(f"{same} functions identical, {len(differ)} differ (of those matching {args.match!r})")
    if args.save:
        rows = {"identical": {"functions": same}, **{name[:200]: d for name, d in differ.items()}}
        results_file.write(os.path.join(os.path.dirname(os.path.abspath(__file__)), args.save), rows,
                           f"{results_file.cpu_name()}, objdump of {os.path.basename(args.old)} and "
                           f"{os.path.basename(args.new)}, built with hookstats/_build.py's flags")


if __name__ == "__main__":
    main()
