/* cmd_text.c -- `reelctl tokenize` and `reelctl video probe`: a prompt's
 * token ids and a written video's stream, checked from the command line.
 *
 * `reelctl tokenize --tokenizer PATH --prompt TEXT [--max-len N]` prints
 * the ids media/tokenizer.h gives (Wan's cleaning, the end-of-sequence id,
 * truncation to N, default 512: Wan2.1's text_len) on one line, comma
 * separated: what tests/crosscheck/test_tokenizer.py compares with Python,
 * and what a user checks a prompt with (docs/MODEL.md).
 * `reelctl tokenize --clean --prompt TEXT` prints the cleaned prompt itself
 * (Wan's ftfy, html.unescape and whitespace steps; no tokenizer needed).
 *
 * `reelctl video probe FILE [--json]` prints the frames decoded, the size,
 * the frame rate and the codec (media/video.h, video_probe). */
#include "ctl.h"
#include "base/error.h"
#include "base/parse.h"
#include "media/tokenizer.h"
#include "media/video.h"
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TOKENIZE_DEFAULT_LEN 512 /* Wan2.1's text_len */
#define TOKENIZE_MAX_LEN (1 << 20)

int cmd_tokenize(int argc, char **argv) {
    static const struct option opts[] = {
        { "tokenizer", required_argument, 0, 't' },
        { "prompt", required_argument, 0, 'p' },
        { "max-len", required_argument, 0, 'm' },
        { "clean", no_argument, 0, 'c' },
        { 0, 0, 0, 0 },
    };
    const char *path = NULL, *prompt = NULL;
    bool clean = false;
    int max_len = TOKENIZE_DEFAULT_LEN, o;
    opterr = 0;
    optind = 1;
    while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (o) {
        case 't': path = optarg; break;
        case 'p': prompt = optarg; break;
        case 'c': clean = true; break;
        case 'm':
            if (reel_parse_int(optarg, 1, TOKENIZE_MAX_LEN, "--max-len", &max_len)) return -1;
            break;
        default: return ctl_fail_usage("tokenize", "tokenize: unknown or incomplete option '%s'", argv[optind - 1]);
        }
    }
    if (optind < argc) return reel_fail(REEL_E_INVALID, "tokenize: unexpected argument '%s'", argv[optind]);
    if (clean && prompt && !path) {
        size_t cap = strlen(prompt) * 4 + 16; /* no reference or fix grows text 4-fold */
        char *out = malloc(cap);
        if (!out) return reel_fail(REEL_E_NOMEM, "out of memory");
        int rc = tok_clean(prompt, out, cap);
        if (rc == 0) printf("%s\n", out);
        free(out);
        return rc == 0 ? 0 : ctl_fail_as(REEL_E_INVALID, NULL);
    }
    if (!path || !prompt || clean)
        return reel_fail(REEL_E_INVALID, "usage: reelctl tokenize --tokenizer PATH --prompt TEXT [--max-len N]\n"
                                         "       reelctl tokenize --clean --prompt TEXT");
    tok_t *t = tok_open(path);
    if (!t) return ctl_fail_as(REEL_E_INVALID, NULL);
    int32_t *ids = malloc((size_t)max_len * sizeof *ids);
    if (!ids) {
        tok_close(&t);
        return reel_fail(REEL_E_NOMEM, "out of memory");
    }
    int n = tok_encode(t, prompt, max_len, ids, max_len);
    tok_close(&t);
    if (n < 0) {
        free(ids);
        return ctl_fail_as(REEL_E_INVALID, NULL);
    }
    for (int i = 0; i < n; i++) printf(i ? ",%d" : "%d", (int)ids[i]);
    printf("\n");
    free(ids);
    return 0;
}

int cmd_video(int argc, char **argv) {
    if (argc < 2 || strcmp(argv[1], "probe"))
        return reel_fail(REEL_E_INVALID, "usage: reelctl video probe FILE [--json]");
    const char *file = NULL;
    bool json = false;
    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "--json")) json = true;
        else if (argv[i][0] == '-' && argv[i][1])
            return ctl_fail_usage("video probe", "video probe: unknown option '%s'", argv[i]);
        else if (file) return reel_fail(REEL_E_INVALID, "video probe: one FILE, got '%s' too", argv[i]);
        else file = argv[i];
    }
    if (!file) return reel_fail(REEL_E_INVALID, "usage: reelctl video probe FILE [--json]");
    video_info_t v;
    if (video_probe(file, &v)) return ctl_fail_as(REEL_E_INVALID, NULL);
    if (json)
        printf("{\"frames\":%lld,\"height\":%lld,\"width\":%lld,\"fps\":%.6g,\"codec\":\"%s\"}\n",
               (long long)v.frames, (long long)v.height, (long long)v.width, v.fps, v.codec);
    else
        printf("frames %lld\nsize %lldx%lld (HxW)\nfps %.6g\ncodec %s\n", (long long)v.frames, (long long)v.height,
               (long long)v.width, v.fps, v.codec);
    return 0;
}
