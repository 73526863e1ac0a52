#!/usr/bin/env python3
"""The Dockerfile's runtime stage installs only deploy/runtime-packages.txt on a Debian 12 slim
base. No Docker engine runs here, so check the same thing without one: every shared library the
built caliper-server loads (ldd) must belong to a listed package, to one of their Depends
(recursively, as apt installs them), or to the base image itself (Essential packages). A library
added to the server without its package fails here instead of at the container's start.
Exit 77 (skip) without dpkg/ldd (not a Debian system)."""
import argparse
import re
import shutil
import subprocess
import sys

SKIP = 77
# In debian:bookworm-slim already (Essential: yes, or pulled in by them).
BASE_IMAGE = {"libc6", "libgcc-s1", "libstdc++6", "zlib1g"}


def installed_packages():
    """{package: its Depends and Pre-Depends} for every package installed here (one dpkg call)."""
    out = subprocess.run(["dpkg-query", "-W", "-f",
                          "${Package}\t${db:Status-Status}\t${Depends}, ${Pre-Depends}\n"],
                         capture_output=True, text=True, check=True).stdout
    deps = {}
    for line in out.splitlines():
        pkg, status, depends = line.split("\t")
        if status == "installed":
            deps[pkg] = depends
    return deps


def depends_closure(roots, installed):
    """Installed packages apt would install for `roots` (Depends and Pre-Depends, the first
    installed choice of each alternative)."""
    seen, todo = set(), list(roots)
    while todo:
        pkg = todo.pop()
        if pkg in seen or pkg not in installed:
            continue
        seen.add(pkg)
        for clause in installed[pkg].split(","):
            names = [re.sub(r"[ (].*|:any", "", alt.strip()) for alt in clause.split("|")]
            choices = [n for n in names if n in installed]
            if choices:
                todo.append(choices[0])
    return seen


def owners(paths):
    """{path: package} via one dpkg -S call; usrmerge means a library under /lib may be
    registered as /usr/lib (or the other way), so both spellings are asked."""
    alt = {p: (p[4:] if p.startswith("/usr/") else "/usr" + p) for p in paths}
    out = subprocess.run(["dpkg", "-S"] + list(paths) + list(alt.values()), capture_output=True,
                         text=True).stdout
    owner = {}
    for line in out.splitlines():
        pkg, _, path = line.partition(": ")
        owner[path.strip()] = pkg.split(":")[0].split(",")[0].strip()
    return {p: owner.get(p) or owner.get(alt[p]) for p in paths}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--binary", required=True)
    ap.add_argument("--packages", required=True)
    a = ap.parse_args()
    if not shutil.which("dpkg-query") or not shutil.which("ldd"):
        print("SKIP: needs dpkg-query and ldd (a Debian system)")
        return SKIP
    listed = [l.strip() for l in open(a.packages) if l.strip() and not l.startswith("#")]
    failures = []
    installed = installed_packages()
    for pkg in listed:
        if pkg.endswith("-dev"):
            failures.append(f"{pkg}: a -dev package in the runtime image")
        if pkg not in installed:
            failures.append(f"{pkg}: not a package installed here (typo, or not bookworm's name?)")
    closure = depends_closure(listed, installed) | BASE_IMAGE
    ldd = subprocess.run(["ldd", a.binary], capture_output=True, text=True, check=True).stdout
    libs = []
    for line in ldd.splitlines():
        m = re.match(r"\s*(\S+) => (\S+)", line)
        if not m:
            continue
        name, path = m.groups()
        if path == "not":
            failures.append(f"{name}: not found by ldd")
            continue
        libs.append((name, path))
    # The Dockerfile copies libraries from /usr/local/cuda next to the binary.
    libs = [(n, p) for n, p in libs if not p.startswith("/usr/local/cuda")]
    owner = owners([p for _, p in libs])
    for name, path in libs:
        pkg = owner[path]
        if pkg is None:
            failures.append(f"{name} ({path}): no Debian package owns it")
        elif pkg not in closure:
            failures.append(f"{name}: from {pkg}, which deploy/runtime-packages.txt does not bring")
    for f in failures:
        print("FAIL:", f)
    print(f"runtime_packages_test: {len(libs)} libraries, {len(listed)} listed packages, "
          f"{len(closure)} with dependencies, {len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
