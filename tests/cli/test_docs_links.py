"""The docs' links hold: every relative link in README.md and docs/ names a file that exists (and, with
an #anchor, one of its headings), and every docs/<path>.md named in the docs, the package, the tests,
tools, bench and CI exists, with the section it quotes ('docs/guide/devices.md, "After fork()"') among
that file's headings or bold lead-ins. docs/ was split into guide/ and design/ (issue 31); a page moved
again, or a section renamed, must take its references along."""
import glob
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOCS = sorted(["README.md"] + [os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "**", "*.md"),
                                                                          recursive=True)])
SOURCES = ("README.md", "docs", "hipsched", "tests", "tools", "bench", ".ci")
_LINK = re.compile(r"\]\(([^)\s]+)\)")
# docs/x.md, optionally followed by the quoted section: `docs/x.md, "Title"`, `docs/x.md "Title"`, with the
# quote possibly broken over a line (a comment's or a docstring's leading '#' and spaces in between)
_MENTION = re.compile(r"(?<![\w/.])(docs/[\w./-]+\.md)(?:,?\s*(?:#\s*)?\"([^\"\n]{1,80}(?:\n[ \t#]*[^\"\n]{1,80})?)\")?")


def _text(rel):
    with open(os.path.join(ROOT, rel), encoding="utf-8") as f:
        return f.read()


def slug(heading):
    """GitHub's anchor of a heading: lower case, punctuation but '-' and '_' dropped, spaces to '-'."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def headings(rel):
    return [m.group(1) for m in re.finditer(r"^#+ (.+)$", _text(rel), re.M)]


def broken_links(rel, text=None):
    """(file, link) for each relative link of a markdown file that does not resolve."""
    text = _text(rel) if text is None else text
    bad = []
    for link in _LINK.findall(text):
        if re.match(r"^[a-z]+:", link):
            continue
        path, _, anchor = link.partition("#")
        target = os.path.normpath(os.path.join(os.path.dirname(rel), path)) if path else rel
        full = os.path.join(ROOT, target)
        if not os.path.exists(full):
            bad.append((rel, link))
        elif anchor and target.endswith(".md") and anchor not in {slug(h) for h in headings(target)}:
            bad.append((rel, link))
    return bad


def _quotable(rel):
    """The section names a reference may quote: the headings, and the bold lead-ins of paragraphs and
    items ('**The pin.**'), as prefixes (a quote may stop short: "Two devices")."""
    text = _text(rel)
    return [h.strip("`") for h in headings(rel)] + re.findall(r"\*\*([^*]+?)\.?\*\*", text) + headings(rel)


def broken_mentions(rel, text=None):
    """(file, mention) for each docs/<path>.md named in a source that does not exist, or whose quoted
    section is not one of that file's."""
    text = _text(rel) if text is None else text
    bad = []
    for m in _MENTION.finditer(text):
        path, quote = m.group(1), m.group(2)
        if not os.path.isfile(os.path.join(ROOT, path)):
            bad.append((rel, path))
            continue
        if quote:
            quote = " ".join(re.sub(r"\n[ \t#]*", " ", quote).split())
            names = [" ".join(n.split()) for n in _quotable(path)]
            if not any(n.startswith(quote) or n.strip("`").startswith(quote.strip("`")) for n in names):
                bad.append((rel, f'{path}, "{quote}"'))
    return bad


def _sources():
    for top in SOURCES:
        full = os.path.join(ROOT, top)
        if os.path.isfile(full):
            yield top
            continue
        for d, _, files in os.walk(full):
            if "__pycache__" in d or os.sep + "results" in d:
                continue
            for f in files:
                if f == os.path.basename(__file__):   # its own cases are wrong on purpose
                    continue
                if f.endswith((".md", ".py", ".pyx", ".pxd", ".sh", ".c", ".h", ".hip", ".toml")) or f == "run":
                    yield os.path.relpath(os.path.join(d, f), ROOT)


def test_every_relative_link_in_the_docs_resolves():
    assert [b for rel in DOCS for b in broken_links(rel)] == []


def test_every_docs_path_named_in_the_tree_exists_with_its_section():
    assert [b for rel in _sources() for b in broken_mentions(rel)] == []


def test_the_docs_index_names_every_page():
    index = _text("docs/README.md")
    assert [rel for rel in DOCS if rel.startswith("docs/") and rel != "docs/README.md"
            and os.path.relpath(rel, "docs") not in index] == []


# The checker can fail: links and mentions that are wrong, fed to it as text.

def test_checker_reports_a_missing_file_and_a_missing_anchor():
    text = "[a](guide/nowhere.md) [b](guide/devices.md#no-such-section) [c](guide/devices.md#after-fork) " \
           "[d](https://example.com/x.md)"
    assert broken_links("docs/README.md", text) == [("docs/README.md", "guide/nowhere.md"),
                                                    ("docs/README.md", "guide/devices.md#no-such-section")]


def test_checker_reports_an_old_path_and_a_section_that_moved():
    text = 'see docs/gpu.md, and docs/guide/devices.md, "Kernel report"; docs/guide/devices.md, "After fork()"' \
           ' and docs/guide/devices.md,\n    # "Two devices"'
    assert broken_mentions("hipsched/x.py", text) == [("hipsched/x.py", "docs/gpu.md"),
                                                      ("hipsched/x.py", 'docs/guide/devices.md, "Kernel report"')]


def test_slug_is_githubs():
    assert slug("After fork()") == "after-fork"
    assert slug("Device arrays (`hipsched.gpu.memory.device_array`)") == "device-arrays-hipschedgpumemorydevice_array"
    assert slug("Choosing one: `HIPSCHED_GPU_RUNTIME`") == "choosing-one-hipsched_gpu_runtime"
