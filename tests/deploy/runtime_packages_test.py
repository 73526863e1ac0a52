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


def dpkg_query(fmt, pkgs):
    out = subprocess.run(["dpkg-query", "-W", "-f", fmt] + list(pkgs), capture_output=True,
                         text=True)
    return out.stdout


def depends_closure(roots):
    """Installed packages apt would install for `roots` (Depends and Pre-Depends, first choice of
    each alternative that is installed here)."""
    seen, todo = set(), list(roots)
    while todo:
        pkg = todo.pop()
        if pkg in seen:
            continue
        seen.add(pkg)
        deps = dpkg_query("${Depends}, ${Pre-Depends}", [pkg])
        for clause in deps.split(","):
            names = [re.sub(r"[ (].*|:any", "", alt.strip()) for alt in clause.split("|")]
            names = [n for n in names if n]
            installed = [n for n in names if dpkg_query("${Status}", [n]).endswith("installed")]
            if installed:
                todo.append(installed[0])
    return seen


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
    for pkg in listed:
        if pkg.endswith("-dev"):
            failures.append(f"{pkg}: a -dev package in the runtime image")
        if not dpkg_query("${Status}", [pkg]).endswith("installed"):
            failures.append(f"{pkg}: not a package installed here (typo, or not bookworm's name?)")
    closure = depends_closure(listed) | BASE_IMAGE
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
    for name, path in libs:
        if path.startswith("/usr/local/cuda"):
            continue  # the Dockerfile copies these next to the binary
        owner = subprocess.run(["dpkg", "-S", path], capture_output=True, text=True)
        if owner.returncode != 0:
            # usrmerge: /lib/x86_64-linux-gnu is registered under /usr/lib or the other way
            alt = path[4:] if path.startswith("/usr/") else "/usr" + path
            owner = subprocess.run(["dpkg", "-S", alt], capture_output=True, text=True)
        if owner.returncode != 0:
            failures.append(f"{name} ({path}): no Debian package owns it")
            continue
        pkg = owner.stdout.split(":")[0].strip()
        if pkg not in closure:
            failures.append(f"{name}: from {pkg}, which deploy/runtime-packages.txt does not bring")
    for f in failures:
        print("FAIL:", f)
    print(f"runtime_packages_test: {len(libs)} libraries, {len(listed)} listed packages, "
          f"{len(closure)} with dependencies, {len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
