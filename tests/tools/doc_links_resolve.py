#!/usr/bin/env python3
"""Every relative link of the project's pages (README.md, docs/, bench/RESULTS.md) names a file of
the checkout and, with #anchor, a heading of that page (as GitHub makes anchors of headings).
Links that leave the checkout (../shared/DESIGN.md, which sits beside it in its workspace) and
web addresses are not checked.
    doc_links_resolve.py SOURCE_DIR"""
import os
import re
import sys

root = os.path.abspath(sys.argv[1])
pages = [os.path.join(root, "README.md"), os.path.join(root, "bench", "RESULTS.md")]
pages += sorted(os.path.join(root, "docs", name) for name in os.listdir(os.path.join(root, "docs")) if name.endswith(".md"))


def anchors(page):
    found = set()
    for line in open(page, encoding="utf-8"):
        heading = re.match(r"#+ (.*)", line)
        if heading:
            text = re.sub(r"[^\w\- ]", "", heading.group(1).strip().lower())
            found.add(text.replace(" ", "-"))
    return found


broken = []
for page in pages:
    text = open(page, encoding="utf-8").read()
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        resolved = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
        if not resolved.startswith(root + os.sep):
            continue
        name = os.path.relpath(page, root)
        if not os.path.exists(resolved):
            broken.append(f"{name}: ({target}): no such file")
        elif anchor and resolved.endswith(".md") and anchor not in anchors(resolved):
            broken.append(f"{name}: ({target}): no heading with that anchor")
for line in broken:
    print("BROKEN", line)
print(f"{len(pages)} pages checked, {len(broken)} broken link(s)")
sys.exit(1 if broken else 0)
