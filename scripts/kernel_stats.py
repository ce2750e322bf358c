#!/usr/bin/env python3
"""kernel_stats.py INDEX STATS COUNTS LABEL COOP MESA: one chip's table for
scripts/kernel-stats.sh. INDEX is `wgllm kernels --spirv`'s index.tsv (file, env, shape,
products, kernel); STATS the radv-stats `stats` lines; COUNTS per file the matrix and dot
instructions its disassembly holds; COOP 1 where the chip has cooperative matrices."""
import datetime, os, sys

index_path, stats_path, counts_path, label, coop, mesa = sys.argv[1:7]
rows = []
for line in open(index_path):
    f = line.rstrip("\n").split("\t")
    if len(f) >= 5:
        rows.append({"file": f[0], "shape": f[2], "products": f[3], "name": f[4]})
stats = {}
for line in open(stats_path):
    f = line.rstrip("\n").split("\t")
    name = os.path.basename(f[0].split(":")[0])
    if len(f) >= 3:
        d = dict(x.split("=", 1) for x in f[2:] if "=" in x)
        d["wave"] = f[1].split()[-1]
        stats[name] = d
    else:
        stats[name] = {"error": line.strip()}
counts = {}
for line in open(counts_path):
    f = line.rstrip("\n").split("\t")
    if len(f) == 3:
        counts[f[0]] = (int(f[1] or 0), int(f[2] or 0))

def num(d, k):
    try:
        return int(float(d.get(k, 0)))
    except ValueError:
        return 0

print(f"# AMD compiler (ACO) statistics per kernel variant: {label}, {mesa}, {datetime.date.today()}")
print("# spill: spilled SGPRs/VGPRs; scratch: bytes per lane; mma/dot: matrix/dot instructions in the disassembly")
print("# shape: gpu = selected on GPU-shaped adapters, cpu = on CPU-shaped ones only")
cols = ["kernel", "shape", "wave", "vgpr", "sgpr", "spill", "scratch", "lds", "waves", "instr", "latency", "invthru", "mma", "dot"]
print("%-44s %5s %4s %4s %4s %7s %7s %6s %5s %6s %8s %7s %4s %4s" % tuple(cols))
compiled = spills = failed = gpu_spills = left_out = scratch_gpu = 0
mat_ok = mat_all = dot_ok = dot_all = 0
trouble = []
for r in rows:
    if r["file"] == "-":
        failed += 1
        trouble.append(f"{r['name']}: not written")
        continue
    if r["products"] == "matrix" and coop != "1":
        left_out += 1
        continue
    d = stats.get(r["file"])
    if d is None or "error" in d:
        failed += 1
        trouble.append(f"{r['name']}: {d['error'] if d else 'no result from the compiler'}")
        print("%-44s %5s %s" % (r["name"][:44], r["shape"], d["error"] if d else "no result"))
        continue
    compiled += 1
    sp = (num(d, "Spilled SGPRs"), num(d, "Spilled VGPRs"))
    if sp != (0, 0):
        spills += 1
        if r["shape"] == "gpu":
            gpu_spills += 1
            trouble.append(f"{r['name']}: spills {sp[0]}/{sp[1]}")
    if r["shape"] == "gpu" and num(d, "Scratch size") > 0:
        scratch_gpu += 1
    mma, dot = counts.get(r["file"], (0, 0))
    if r["products"] == "matrix":
        mat_all += 1
        mat_ok += mma > 0
        if mma == 0:
            trouble.append(f"{r['name']}: no matrix instructions")
    if r["products"] == "intdot":
        dot_all += 1
        dot_ok += dot > 0
        if dot == 0:
            trouble.append(f"{r['name']}: no dot instructions")
    show = lambda v: str(v) if r["products"] != "plain" else "-"
    print("%-44s %5s %4s %4d %4d %7s %7d %6d %5d %6d %8d %7d %4s %4s" % (
        r["name"][:44], r["shape"], d["wave"], num(d, "VGPRs"), num(d, "SGPRs"),
        "%d/%d" % sp, num(d, "Scratch size"), num(d, "LDS size"), num(d, "Subgroups per SIMD"),
        num(d, "Instructions"), num(d, "Latency"), num(d, "Inverse Throughput"), show(mma), show(dot)))
print(f"{compiled} kernels compiled for {label}, {spills} with spills, {failed} failed; "
      f"matrix kernels with matrix instructions: {mat_ok}/{mat_all}; "
      f"integer-dot kernels with dot instructions: {dot_ok}/{dot_all}")
print(f"GPU-shaped kernels with spills: {gpu_spills}, with scratch: {scratch_gpu}"
      + (f"; {left_out} cooperative-matrix kernels left out ({label} has no cooperative matrices in this Mesa)" if left_out else ""))
for t in trouble[:50]:
    print(f"trouble: {t}")
print("verdict: ok" if not trouble else f"verdict: {len(trouble)} kernels in trouble")
