#!/usr/bin/env python3
"""The documented flag tables match --help: every `caliper` command and caliper-server.

The tables may stand in the README or in any page of docs/ (`--docs DIR`); each heading once.

For each command `caliper --help` lists, the README needs a table under the heading
"`caliper CMD` flags" naming exactly the flags `caliper CMD --help` prints, with the same
defaults, "required" where the flag is required, and every deprecated spelling mentioned. A row
"connection flags" stands for the "Connection flags" table. The "`caliper-server` flags" table
names exactly the flags `caliper-server --help` lists.
"""
import argparse
import glob
import os
import re
import subprocess
import sys

FLAG = re.compile(r"--[a-z0-9][a-z0-9_-]*")


def cells(row):
    """Splits a markdown table row on '|' outside backticks."""
    out, cur, code = [], "", False
    for ch in row.strip().strip("|"):
        if ch == "`":
            code = not code
        if ch == "|" and not code:
            out.append(cur.strip())
            cur = ""
        else:
            cur += ch
    out.append(cur.strip())
    return out


def readme_tables(text):
    """{heading: [row cells]} for every table right under a '#### ...' heading."""
    tables, heading, in_table = {}, None, False
    for line in text.splitlines():
        if line.startswith("#"):
            heading, in_table = line.lstrip("#").strip(), False
            continue
        if heading and line.startswith("|"):
            if not in_table:
                tables.setdefault(heading, [])
                in_table = True
                continue  # header row
            if re.match(r"^\|[-| ]+\|$", line):
                continue
            tables[heading].append(cells(line))
        elif in_table and not line.strip():
            heading, in_table = None, False
    return tables


def cli_help_flags(text):
    """{name: {"default", "required", "old"}} from `caliper CMD --help`."""
    flags, last = {}, None
    body = text.split("\nflags:\n", 1)[1]
    for line in body.splitlines():
        m = re.match(r"^  (--[a-z0-9-]+)(?: \S+)?\s{2,}(.*)$", line)
        if m:
            name, help_text = m.groups()
            if name == "--help":
                continue
            d = re.search(r"\(default: (.*?)\)", help_text)
            last = flags[name] = {"default": d.group(1) if d else "",
                                  "required": "(required)" in help_text, "old": []}
        elif "deprecated spelling:" in line and last is not None:
            last["old"] += [s.strip() for s in line.split(":", 1)[1].split(",")]
    return flags


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--readme", required=True)
    ap.add_argument("--caliper", required=True)
    ap.add_argument("--docs", help="folder whose *.md pages may hold tables too")
    ap.add_argument("--server")
    args = ap.parse_args()
    pages = [args.readme]
    if args.docs:
        pages += sorted(glob.glob(os.path.join(args.docs, "*.md")))
    tables, errors = {}, []
    for page in pages:
        for heading, rows in readme_tables(open(page, encoding="utf-8").read()).items():
            if heading.startswith("`") and heading in tables:
                errors.append(f"{page}: the table '{heading}' stands in two places")
            tables.setdefault(heading, []).extend(rows)

    def table(heading):
        for h, rows in tables.items():
            if h.replace("`", "") == heading.replace("`", ""):
                return rows
        errors.append(f"README: no table under the heading '{heading}'")
        return []

    connection = table("Connection flags")
    top = subprocess.run([args.caliper, "--help"], capture_output=True, text=True, check=True)
    commands = re.findall(r"^  ([a-z][a-z0-9-]*)\s{2,}", top.stdout.split("commands:", 1)[1],
                         re.M)
    if not commands:
        errors.append("caliper --help lists no commands")
    for command in commands:
        out = subprocess.run([args.caliper, command, "--help"], capture_output=True, text=True)
        if out.returncode != 0:
            errors.append(f"caliper {command} --help exited {out.returncode}")
            continue
        want = cli_help_flags(out.stdout)
        rows = {}
        for row in table(f"`caliper {command}` flags"):
            expanded = connection if row[0].lower().startswith("connection flags") else [row]
            for r in expanded:
                for name in FLAG.findall(r[0]):
                    rows[name] = r
        for name in sorted(set(want) - set(rows)):
            errors.append(f"caliper {command}: {name} is in --help but not in the README table")
        for name in sorted(set(rows) - set(want)):
            errors.append(f"caliper {command}: {name} is in the README table but not in --help")
        for name in sorted(set(want) & set(rows)):
            row, spec = rows[name], want[name]
            default = row[1].replace("`", "").strip() if len(row) > 1 else ""
            if spec["required"] and default != "required":
                errors.append(f"caliper {command}: {name} is required; README default says "
                              f"'{default}'")
            if spec["default"] and default != spec["default"]:
                errors.append(f"caliper {command}: {name} defaults to '{spec['default']}', "
                              f"README says '{default}'")
            if not spec["default"] and not spec["required"] and default:
                errors.append(f"caliper {command}: {name} has no default; README says "
                              f"'{default}'")
            for old in spec["old"]:
                if old not in " ".join(row):
                    errors.append(f"caliper {command}: deprecated spelling {old} of {name} "
                                  "is not in the README row")

    if args.server:
        out = subprocess.run([args.server, "--help"], capture_output=True, text=True)
        want = set(re.findall(r"^    (--[a-z0-9_]+) \(", out.stdout, re.M))
        if not want:
            errors.append(f"caliper-server --help lists no flags:\n{out.stdout}{out.stderr}")
        have = set()
        for row in table("`caliper-server` flags"):
            have.update(FLAG.findall(row[0]))
        for name in sorted(want - have):
            errors.append(f"caliper-server: {name} is in --help but not in the README table")
        for name in sorted(have - want):
            errors.append(f"caliper-server: {name} is in the README table but not in --help")

    for e in errors:
        print("FAIL:", e)
    if errors:
        return 1
    print(f"README flag tables match --help for {len(commands)} commands"
          + (" and caliper-server" if args.server else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
