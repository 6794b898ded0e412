#!/usr/bin/python3
"""Cross-check `reelctl tokenize` (media/tokenizer.h) against Python's
sentencepiece (Debian's python3-sentencepiece) with Wan2.1's cleaning done in
Python: html.unescape twice, strip, the `regex` module's \\s runs to one space
(spelled out as a character class: Debian's python3 has no `regex`), strip;
then the ids, the end-of-sequence id appended, truncated to max_len with the
eos kept last (Hugging Face's T5 tokenizer with truncation=True).

Usage:
  /usr/bin/python3 tests/crosscheck/test_tokenizer.py --reelctl build/reelctl --workdir DIR
test_crosscheck.py (what `make test` runs) runs it after its own cases.

The model: trained here with spm_train on a small corpus this script writes
(unigram, vocab 360, pad 0, eos 1, unk 2 as umT5, byte fallback). Each prompt
prints one line; the last line is `tokenizer: P passed, F failed`.
"""

import argparse
import html
import html.entities
import itertools
import os
import random
import re
import subprocess
import sys
import tempfile
import unicodedata

TIMEOUT_S = 60
# the `regex` module's \s on str (Unicode White_Space): what Wan's re.sub collapses
WAN_SPACE = re.compile("[\t\n\x0b\x0c\r \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]+")
WORDS = ("the a cat dog runs quickly over lazy fox river mountain sunset city night camera slowly pans "
         "across green field with flowers under blue sky 一只 猫 在 草地 上 奔跑 夕阳 城市 夜晚 "
         "le chat noir court vite café naïve résumé").split()


# ftfy 6's fix_text with its default configuration, written here from ftfy's
# published code (ftfy/__init__.py fix_text and fix_and_explain, fixes.py,
# chardata.py), less the two steps Reel leaves out (media/tokenizer.h):
# fix_encoding (a heuristic; it changes only text that looks like mojibake)
# and NFC (which sentencepiece's NFKC normaliser covers).
FTFY_ENTITY_RE = re.compile(r"&#?[0-9A-Za-z]{1,24};")
FTFY_ANSI_RE = re.compile("\033\\[((?:\\d|;)*)([a-zA-Z])")
FTFY_SINGLE_QUOTE_RE = re.compile("[\u02bc\u2018-\u201b]")
FTFY_DOUBLE_QUOTE_RE = re.compile("[\u201c-\u201f]")
FTFY_C1_RE = re.compile("[\x80-\x9f]")
FTFY_LIGATURES = {ord("Ĳ"): "IJ", ord("ĳ"): "ij", ord("ŉ"): "ʼn", ord("Ǳ"): "DZ", ord("ǲ"): "Dz", ord("ǳ"): "dz",
                  ord("Ǆ"): "DŽ", ord("ǅ"): "Dž", ord("ǆ"): "dž", ord("Ǉ"): "LJ", ord("ǈ"): "Lj", ord("ǉ"): "lj",
                  ord("Ǌ"): "NJ", ord("ǋ"): "Nj", ord("ǌ"): "nj", ord("ﬀ"): "ff", ord("ﬁ"): "fi", ord("ﬂ"): "fl",
                  ord("ﬃ"): "ffi", ord("ﬄ"): "ffl", ord("ﬅ"): "ſt", ord("ﬆ"): "st"}
FTFY_WIDTH = {0x3000: " "}
FTFY_WIDTH.update({i: unicodedata.normalize("NFKC", chr(i)) for i in range(0xFF01, 0xFFF0)
                   if unicodedata.normalize("NFKC", chr(i)) != chr(i)})
FTFY_CONTROL = {i: None for i in itertools.chain(range(0x00, 0x09), [0x0B], range(0x0E, 0x20), [0x7F],
                                                 range(0x206A, 0x2070), [0xFEFF], range(0xFFF9, 0xFFFD))}


def ftfy_entities():
    ents = {}
    for name, ch in html.entities.html5.items():
        if name.endswith(";"):
            ents["&" + name] = ch
            if name == name.lower():
                upper = "&" + name.upper()
                if html.unescape(upper) == upper:
                    ents[upper] = ch.upper()
    return ents


FTFY_ENTITIES = ftfy_entities()


def ftfy_unescape(text):
    def fixup(m):
        t = m.group(0)
        if t in FTFY_ENTITIES:
            return FTFY_ENTITIES[t]
        if t.startswith("&#"):
            u = html.unescape(t)
            return t if ";" in u else u
        return t
    return FTFY_ENTITY_RE.sub(fixup, text)


def sloppy_1252(ch):
    try:
        return ch.encode("latin-1").decode("windows-1252")
    except UnicodeDecodeError:  # the five bytes cp1252 leaves undefined stand for themselves
        return ch


def ftfy_segment(text, unescape):
    while True:
        orig = text
        if unescape:
            text = ftfy_unescape(text)
        text = FTFY_C1_RE.sub(lambda m: sloppy_1252(m.group(0)), text)
        text = text.translate(FTFY_LIGATURES)
        text = text.translate(FTFY_WIDTH)
        text = FTFY_SINGLE_QUOTE_RE.sub("'", FTFY_DOUBLE_QUOTE_RE.sub('"', text))
        text = (text.replace("\r\n", "\n").replace("\r", "\n").replace("\u2028", "\n")
                .replace("\u2029", "\n").replace("\u0085", "\n"))
        text = FTFY_ANSI_RE.sub("", text)
        text = text.translate(FTFY_CONTROL)
        if text == orig:
            return text


def ftfy_fix_text(text):
    out, pos, unescape = [], 0, True
    while pos < len(text):
        brk = text.find("\n", pos) + 1 or len(text)
        seg = text[pos:brk]
        if "<" in seg:
            unescape = False
        out.append(ftfy_segment(seg, unescape))
        pos = brk
    return "".join(out)


def wan_clean(text):
    text = html.unescape(html.unescape(ftfy_fix_text(text))).strip()
    return WAN_SPACE.sub(" ", text).strip()


def reference_ids(sp, text, max_len):
    ids = sp.encode(wan_clean(text))
    return ids[:max_len - 1] + [sp.eos_id()]


def train_model(workdir):
    rng = random.Random(20250601)
    corpus = os.path.join(workdir, "corpus.txt")
    with open(corpus, "w", encoding="utf-8") as f:
        for _ in range(3000):
            f.write(" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 15))) + "\n")
    prefix = os.path.join(workdir, "tiny_umt5")
    subprocess.run(["spm_train", "--input=" + corpus, "--model_prefix=" + prefix, "--vocab_size=360",
                    "--model_type=unigram", "--pad_id=0", "--eos_id=1", "--unk_id=2", "--bos_id=-1",
                    "--byte_fallback=true", "--character_coverage=1.0"],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=TIMEOUT_S)
    return prefix + ".model"


def prompts():
    rng = random.Random(7)
    out = [
        ("empty", "", 512),
        ("spaces only", " \t\n\u3000\xa0 ", 512),
        ("plain", "the cat runs over the green field", 512),
        ("odd whitespace", "  the\tcat\n\nruns\u2003over\u3000the\xa0field\u2028at\u2029night\x85 ", 512),
        ("information separators", "\x1cthe\x1dcat \x1e dog\x1f", 512),
        ("zero-width space kept", "the\u200bcat", 512),
        ("entities", "fish &amp; chips &lt;b&gt; &quot;q&quot; &#39;s&#39; &#x41;&#66;&#x1F408;", 512),
        ("double escaped", "&amp;lt;city&amp;gt; &amp;amp;amp;", 512),
        ("legacy names and prefixes", "&amp &copy2024 &notit; &foo; & &#; &#xZ;", 512),
        ("odd numeric references", "&#0; &#128; &#150; &#1; &#xD800; &#99999999999; &#13;x", 512),
        ("nbsp entities collapse", "&nbsp;the&nbsp;&nbsp;cat&nbsp;", 512),
        ("CJK", "一只猫在草地上奔跑，夕阳下的城市夜晚。", 512),
        ("emoji and ZWJ", "a cat 🐈‍⬛ and a dog 🐕 under 🌅 👩🏽‍🚀", 512),
        ("accents and NFKC", "café naïve résumé ｆｕｌｌｗｉｄｔｈ ﬁ ² Ⅻ", 512),
        ("unknown scripts", "Привет мир, γειά σου, مرحبا, שלום, नमस्ते", 512),
        ("control characters", "the\x07cat\x00"[:-1] + "\x7fdog", 512),
        ("ftfy: curly quotes", "the cat\u2019s \u201cfavourite\u201d \u2018toy\u2019 \u201a\u201b\u201e\u201f \u02bcn", 512),
        ("ftfy: C1 controls as Windows-1252", "\x93quoted\x94 \x85 \x80 \x81 \x8d \x96 \x99", 512),
        ("ftfy: ligatures and digraphs", "\ufb01ne \ufb02ow \ufb03 \ufb05 \u0132 \u0149 \u01c4 \u01c6 \u01f2", 512),
        ("ftfy: width", "\uff21\uff22\uff23\u3000\uff41\uff42 \uff01\uff06\uff1b \uff76\uff9e \uffe3 \uffa0x", 512),
        ("ftfy: fullwidth forms build an entity", "\uff06amp\uff1b \uff06lt\uff1b", 512),
        ("ftfy: terminal escapes", "\x1b[36;44mblue\x1b[0m \x1b[1;31;m \x1b[\u0663m \x1b[9 \x1b]x", 512),
        ("ftfy: control characters", "a\x0bb\x0cc\x0ed\x1fe\u206af\ufeffg\ufffch\ufffdi\u200dj", 512),
        ("ftfy: html when no '<'", "caf&EACUTE; &NTILDE; &nTILDE; STRA&SZLIG;E &rsquo;q&rsquo; &amp;amp;amp;", 512),
        ("ftfy: numeric references", "&#59; &#x3b; &#x41; &#X42; &#x41g; &#1;x &#12a; &#0; &#x110000; &#150;", 512),
        ("ftfy: long names are not references", "&abcdefghijklmnopqrstuvwxy; &abcdefghijklmnopqrstuvwx;", 512),
        ("ftfy: '<' stops unescaping from its line on",
         "&amp;rsquo; one\n&lt;b&gt; <b>&amp;amp;</b>\nthree &amp;amp;", 512),
        ("ftfy: line breaks", "one\r\ntwo\rthree\u2028four\u2029five\x85six", 512),
        ("max_len 1", "the cat runs", 1),
        ("max_len 2", "the cat runs", 2),
        ("max_len 5 CJK", "一只猫在草地上奔跑", 5),
    ]
    long_words = " ".join(rng.choice(WORDS) for _ in range(2000))
    out.append(("very long, truncated to 512", long_words, 512))
    out.append(("very long, truncated to 77", long_words, 77))
    out.append(("very long, not truncated (max 100000)", long_words, 100000))
    pool = WORDS + ["&amp;", "&lt;", "&#x263A;", "\u3000", "\t", "  ", "🐈", "ｘ", "&nbsp;", "\xa0", "é", "\u2028",
                    "\u2019", "\u201c", "\x92", "\x85", "\ufb01", "\uff06", "\uff1b", "\x1b[1m", "\x0b", "\ufeff",
                    "&rsquo;", "&AMP;", "&EACUTE;", "\n", "<", "&#x2019;", "\r"]
    for i in range(40):
        n = rng.randint(0, 40)
        out.append(("random %d" % i, "".join(rng.choice(pool) + rng.choice(["", " "]) for _ in range(n)),
                    rng.choice([512, 512, 16, 3])))
    return out


def crosscheck_tokenizer(reelctl, workdir):
    """(passed, failed): every prompt's ids from reelctl against Python's."""
    os.makedirs(workdir, exist_ok=True)
    try:
        import sentencepiece
    except ImportError:
        print("tokenizer: FAIL python3-sentencepiece is missing (deploy/install-deps.sh installs it)")
        return 0, 1
    model = train_model(workdir)
    sp = sentencepiece.SentencePieceProcessor(model_file=model)
    passed = failed = 0
    for name, text, max_len in prompts():
        want = reference_ids(sp, text, max_len)
        r = subprocess.run([reelctl, "tokenize", "--tokenizer", model, "--prompt", text, "--max-len", str(max_len)],
                           capture_output=True, text=True, timeout=TIMEOUT_S)
        got = [int(x) for x in r.stdout.strip().split(",")] if r.returncode == 0 and r.stdout.strip() else None
        ok = got == want
        passed += ok
        failed += not ok
        print("%s tokenizer %-40s %d ids%s" % ("ok  " if ok else "FAIL", name, len(want),
                                               "" if ok else "  reel %s (rc %d %s) python %s" %
                                               (got, r.returncode, r.stderr.strip(), want)))
        # the cleaned text itself, byte for byte (ids can hide what the model's NFKC folds)
        r = subprocess.run([reelctl, "tokenize", "--clean", "--prompt", text], capture_output=True, timeout=TIMEOUT_S)
        want_text = wan_clean(text).encode("utf-8") + b"\n"
        ok = r.returncode == 0 and r.stdout == want_text
        passed += ok
        failed += not ok
        if not ok:
            print("FAIL clean     %-40s reel %r (rc %d) python %r" % (name, r.stdout, r.returncode, want_text))
    # the release-folder form and the errors
    rel = os.path.join(workdir, "release")
    os.makedirs(rel, exist_ok=True)
    with open(model, "rb") as f, open(os.path.join(rel, "spiece.model"), "wb") as g:
        g.write(f.read())
    for name, path, want_rc in (("release folder opens", rel, 0), ("missing file: exit 2", model + ".no", 2),
                                ("not a model: exit 2", os.path.join(workdir, "corpus.txt"), 2),
                                ("folder without spiece.model: exit 2", workdir, 2)):
        r = subprocess.run([reelctl, "tokenize", "--tokenizer", path, "--prompt", "the cat"],
                           capture_output=True, text=True, timeout=TIMEOUT_S)
        ok = r.returncode == want_rc and (want_rc != 0 or r.stdout.strip().endswith(",1"))
        passed += ok
        failed += not ok
        print("%s tokenizer %s%s" % ("ok  " if ok else "FAIL", name, "" if ok else " rc %d %s" % (r.returncode, r.stderr)))
    return passed, failed


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reelctl", required=True)
    ap.add_argument("--workdir", help="where the model is trained (default: a temp folder, removed)")
    a = ap.parse_args()
    if a.workdir:
        p, f = crosscheck_tokenizer(a.reelctl, a.workdir)
    else:
        with tempfile.TemporaryDirectory(prefix="reel-tok-") as d:
            p, f = crosscheck_tokenizer(a.reelctl, d)
    print("tokenizer: %d passed, %d failed" % (p, f))
    return 0 if f == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
