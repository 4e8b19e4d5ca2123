#!/usr/bin/env python3
"""Checks that the repository stands alone: no tracked file mentions files of the
workplace outside it (../shared, its seeds, its design and spec pages), and every relative link in a Markdown file points at a file inside
the repository that exists. Prints each offence; exit 1 if there is any."""
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LINK = re.compile(r"\]\(([^)\s]+)\)")


def tracked():
    out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    return [p for p in out.splitlines() if os.path.isfile(os.path.join(ROOT, p))]


def main():
    bad = []
    me = os.path.relpath(__file__, ROOT)
    for path in tracked():
        full = os.path.join(ROOT, path)
        try:
            text = open(full, encoding="utf-8").read()
        except (UnicodeDecodeError, OSError):
            continue
        if path != me:
            for n, line in enumerate(text.splitlines(), 1):
                for outside in ("../shared", "shared/seeds", "SPEC-keyspace", "DESIGN.md"):
                    if outside in line:
                        bad.append(f"{path}:{n}: mentions {outside}, outside the repository")
        if not path.endswith(".md"):
            continue
        for m in LINK.finditer(text):
            target = m.group(1).split("#")[0]
            if not target or re.match(r"^[a-z]+:", target):
                continue  # an anchor, or a URL (http:, mailto:, ...)
            resolved = os.path.normpath(os.path.join(os.path.dirname(full), target))
            n = text[: m.start()].count("\n") + 1
            if not resolved.startswith(ROOT + os.sep):
                bad.append(f"{path}:{n}: link {target} points outside the repository")
            elif not os.path.exists(resolved):
                bad.append(f"{path}:{n}: link {target} points at nothing")
    for b in bad:
        print(b)
    print(f"check-links: {len(bad)} problem(s)" if bad else "check-links: every link stays inside the repository")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
