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
import os
import random
import re
import subprocess
import sys
import tempfile

TIMEOUT_S = 60
# the `regex` module's \s on str (Unicode White_Space): what Wan's re.sub collapses
WAN_SPACE = re.compile("[\t\n\x0b\x0c\r \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]+")
WORDS = ("the a cat dog runs quickly over lazy fox river mountain sunset city night camera slowly pans "
         "across green field with flowers under blue sky 一只 猫 在 草地 上 奔跑 夕阳 城市 夜晚 "
         "le chat noir court vite café naïve résumé").split()


def wan_clean(text):
    text = html.unescape(html.unescape(text)).strip()
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
        ("max_len 1", "the cat runs", 1),
        ("max_len 2", "the cat runs", 2),
        ("max_len 5 CJK", "一只猫在草地上奔跑", 5),
    ]
    long_words = " ".join(rng.choice(WORDS) for _ in range(2000))
    out.append(("very long, truncated to 512", long_words, 512))
    out.append(("very long, truncated to 77", long_words, 77))
    out.append(("very long, not truncated (max 100000)", long_words, 100000))
    pool = WORDS + ["&amp;", "&lt;", "&#x263A;", "\u3000", "\t", "  ", "🐈", "ｘ", "&nbsp;", "\xa0", "é", "\u2028"]
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
