/* brk_upload_files.c -- what the upload module looks up: the weights dir's
 * names (a version's files, the spares), the slot an upload of a version
 * holds, and whether a version is stored complete or coming (brk_upload.h).
 * Reads only: nothing here writes a file or changes a slot. */
#include "broker/brk_upload.h"
#include "broker/brk_upload_int.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "base/error.h"

void brk_upl_path(const brk_t *b, const char *prefix, const char *comp, uint64_t v, const char *suffix, char *buf,
                  size_t len) {
    snprintf(buf, len, "%s/%s%s-v%" PRIu64 "%s", b->opt.weights_dir, prefix, comp, v, suffix);
}

void brk_upl_spare_path(const char *dir, unsigned n, char *buf, size_t len) {
    snprintf(buf, len, "%s/.spare-%u", dir, n);
}

void brk_upl_lower(const char *in, char out[65]) {
    for (int i = 0; i < 64; i++) out[i] = (char)(in[i] >= 'A' && in[i] <= 'F' ? in[i] - 'A' + 'a' : in[i]);
    out[64] = '\0';
}

slot_t *brk_upl_slot(brk_t *b, const char *comp, uint64_t v) {
    for (int i = 0; i < BRK_UPLOADS_MAX; i++)
        if (b->uploads->s[i].open && b->uploads->s[i].version == v && !strcmp(b->uploads->s[i].component, comp))
            return &b->uploads->s[i];
    return NULL;
}

bool brk_upload_stored(brk_t *b, const char *comp, uint64_t v, const char *sha256) {
    if (!b->opt.weights_dir) {
        reel_fail(REEL_E_UNSUPPORTED, "this broker keeps no uploaded weights (start it with --weights-dir)");
        return false;
    }
    char path[1024], got[80] = "";
    brk_upl_path(b, "", comp, v, ".sha256", path, sizeof path);
    FILE *f = fopen(path, "re");
    if (f) {
        if (!fgets(got, sizeof got, f)) got[0] = '\0';
        fclose(f);
    }
    got[strcspn(got, "\r\n")] = '\0';
    if (strlen(got) != 64) {
        reel_fail(REEL_E_NOT_FOUND, "%s v%" PRIu64 " was not uploaded to this broker (UPLOAD it first)", comp, v);
        return false;
    }
    if (strcasecmp(got, sha256) != 0) {
        reel_fail(REEL_E_INVALID, "%s v%" PRIu64 " was uploaded with other weights (sha256 %.16s...)", comp, v, got);
        return false;
    }
    /* A digest without its file: a --weights-keep removal under way, or
     * cut short (it removes the data first): no longer stored. */
    brk_upl_path(b, "", comp, v, ".safetensors", path, sizeof path);
    if (access(path, F_OK) != 0) {
        reel_fail(REEL_E_NOT_FOUND, "%s v%" PRIu64 " was not uploaded to this broker (UPLOAD it first)", comp, v);
        return false;
    }
    return true;
}

bool brk_upload_held(brk_t *b, const char *comp, uint64_t v, const char *sha256) {
    if (brk_upload_stored(b, comp, v, sha256)) return true;
    char sha[65];
    brk_upl_lower(sha256, sha);
    slot_t *s = b->uploads ? brk_upl_slot(b, comp, v) : NULL;
    if (s && strcmp(s->sha256, sha) != 0) {
        reel_fail(REEL_E_INVALID, "%s v%" PRIu64 " is being uploaded with other weights (sha256 %.16s...)", comp, v,
                  s->sha256);
        return false;
    }
    return s != NULL; /* none coming: brk_upload_stored's reason stays */
}
