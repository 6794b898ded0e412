/* gen_prompts.c -- the file of `reelctl gen --prompts FILE` (ctl.h,
 * ctl_prompt_lines): one request per line, read and judged whole before
 * anything is sent, so a bad line costs the cluster nothing and its
 * message names the line. A line is a prompt as it stands, or, when its
 * first non-blank byte is '{', a JSON object with the request's own
 * prompt, seed and negative_prompt. */
#include "ctl.h"
#include "base/error.h"
#include "schema/msg.h"
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* One prompt as a GEN carries it (msg_text_ok, MSG_MAX_PROMPT_BYTES), the
 * rule of --prompt and --negative-prompt (ctl_prompts_check), said with
 * the line. 0 or -1. */
static int text_check(const char *path, int line, const char *what, const char *s, size_t len) {
    if (strlen(s) != len)
        return reel_fail(REEL_E_INVALID, "%s line %d: the %s holds a NUL byte", path, line, what);
    if (!len)
        return reel_fail(REEL_E_INVALID, "%s line %d: the %s is empty (a GEN reads an empty prompt as none; "
                         "for Wan2.1's empty-prompt context see reelctl gen --help)", path, line, what);
    if (len > MSG_MAX_PROMPT_BYTES)
        return reel_fail(REEL_E_INVALID, "%s line %d: the %s is %zu bytes: at most %d (umT5 reads 512 tokens, about "
                         "2 KiB)", path, line, what, len, MSG_MAX_PROMPT_BYTES);
    if (!msg_text_ok(s))
        return reel_fail(REEL_E_INVALID, "%s line %d: the %s is not UTF-8 text or holds a control character (tab "
                         "is allowed)", path, line, what);
    return 0;
}

/* A JSON line into l: {"prompt": TEXT, "seed": N, "negative_prompt":
 * TEXT}, only prompt required. 0 or -1. */
static int json_line(const char *path, int line, const char *text, size_t len, ctl_prompt_line_t *l) {
    json_error_t je;
    json_t *o = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    int rc = -1;
    if (!o) {
        reel_fail(REEL_E_INVALID, "%s line %d: starts with '{' but is not JSON: %s (column %d)", path, line, je.text,
                  je.column);
        return -1;
    }
    const char *key;
    json_t *v;
    if (!json_is_object(o)) {
        reel_fail(REEL_E_INVALID, "%s line %d: a JSON line is an object {\"prompt\": ..., \"seed\": ..., "
                  "\"negative_prompt\": ...}", path, line);
        goto done;
    }
    json_object_foreach(o, key, v) {
        if (!strcmp(key, "prompt") || !strcmp(key, "negative_prompt")) {
            if (!json_is_string(v)) {
                reel_fail(REEL_E_INVALID, "%s line %d: \"%s\" must be a string", path, line, key);
                goto done;
            }
            const char *s = json_string_value(v);
            if (text_check(path, line, key[0] == 'p' ? "prompt" : "negative_prompt", s, json_string_length(v)))
                goto done;
            char **dst = key[0] == 'p' ? &l->prompt : &l->negative;
            if (!(*dst = strdup(s))) {
                reel_fail(REEL_E_NOMEM, "out of memory");
                goto done;
            }
        } else if (!strcmp(key, "seed")) {
            if (!json_is_integer(v) || json_integer_value(v) < 0) {
                reel_fail(REEL_E_INVALID, "%s line %d: \"seed\" must be an integer 0..%lld", path, line,
                          (long long)INT64_MAX);
                goto done;
            }
            l->seed = (uint64_t)json_integer_value(v);
            l->has_seed = true;
        } else {
            reel_fail(REEL_E_INVALID, "%s line %d: unknown key \"%.64s\" (a line takes prompt, seed and "
                      "negative_prompt; the other options are the command line's, for every line)", path, line, key);
            goto done;
        }
    }
    if (!l->prompt) {
        reel_fail(REEL_E_INVALID, "%s line %d: a JSON line needs \"prompt\"", path, line);
        goto done;
    }
    rc = 0;
done:
    json_decref(o);
    return rc;
}

void ctl_prompt_lines_free(ctl_prompt_line_t *lines, size_t n) {
    for (size_t i = 0; lines && i < n; i++) {
        free(lines[i].prompt);
        free(lines[i].negative);
    }
    free(lines);
}

int ctl_prompt_lines(const char *path, ctl_prompt_line_t **out, size_t *n_out) {
    *out = NULL;
    *n_out = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return reel_fail(errno == ENOENT ? REEL_E_NOT_FOUND : REEL_E_INVALID, "--prompts %s: %s", path,
                             strerror(errno));
    ctl_prompt_line_t *lines = NULL;
    size_t n = 0, cap = 0, got = 0;
    char *buf = NULL;
    size_t bcap = 0;
    ssize_t len;
    int line = 0, rc = -1;
    while ((len = getline(&buf, &bcap, f)) >= 0) {
        got += (size_t)len;
        line++;
        if (got > CTL_PROMPTS_MAX_BYTES) {
            reel_fail(REEL_E_LIMIT, "--prompts %s: larger than %d MiB (line %d)", path, CTL_PROMPTS_MAX_BYTES >> 20,
                      line);
            goto done;
        }
        char *text = buf;
        if (line == 1 && len >= 3 && !memcmp(buf, "\xef\xbb\xbf", 3)) {
            /* a UTF-8 BOM (Windows editors write one): no part of the first
             * prompt, and a JSON first line is still one */
            text += 3;
            len -= 3;
        }
        if (line == 1 && len >= 2 && (!memcmp(buf, "\xff\xfe", 2) || !memcmp(buf, "\xfe\xff", 2))) {
            reel_fail(REEL_E_INVALID, "--prompts %s: UTF-16 text (its byte order mark says so): save it as UTF-8",
                      path);
            goto done;
        }
        if (len > 0 && text[len - 1] == '\n') text[--len] = '\0';
        if (len > 0 && text[len - 1] == '\r') text[--len] = '\0'; /* a CRLF file */
        if (memchr(text, '\r', (size_t)len)) { /* the wire takes it; a file of CR line ends would be one request */
            reel_fail(REEL_E_INVALID, "%s line %d: a CR inside the line (one request a line, ended by LF or CRLF)",
                      path, line);
            goto done;
        }
        size_t lead = strspn(text, " \t");
        if ((size_t)len == lead) continue; /* blank: no request */
        if (n == CTL_PROMPTS_MAX) {
            reel_fail(REEL_E_LIMIT, "--prompts %s: more than %d requests (line %d)", path, CTL_PROMPTS_MAX, line);
            goto done;
        }
        if (n == cap) {
            size_t c2 = cap ? 2 * cap : 64;
            ctl_prompt_line_t *l2 = realloc(lines, c2 * sizeof *l2);
            if (!l2) {
                reel_fail(REEL_E_NOMEM, "out of memory reading %s", path);
                goto done;
            }
            lines = l2;
            cap = c2;
        }
        ctl_prompt_line_t *l = &lines[n++];
        memset(l, 0, sizeof *l);
        l->line = line;
        if (text[lead] == '{') {
            if (json_line(path, line, text + lead, (size_t)len - lead, l) != 0) goto done;
        } else {
            if (text_check(path, line, "prompt", text, (size_t)len) != 0) goto done;
            if (!(l->prompt = strdup(text))) {
                reel_fail(REEL_E_NOMEM, "out of memory reading %s", path);
                goto done;
            }
        }
    }
    if (ferror(f)) {
        reel_fail(REEL_E_IO, "--prompts %s: %s", path, strerror(errno));
        goto done;
    }
    if (!n) {
        reel_fail(REEL_E_INVALID, "--prompts %s: no request in it (one prompt per line; blank lines are skipped)",
                  path);
        goto done;
    }
    rc = 0;
done:
    free(buf);
    fclose(f);
    if (rc != 0) {
        ctl_prompt_lines_free(lines, n);
        return -1;
    }
    *out = lines;
    *n_out = n;
    return 0;
}
