/* artifacts.c -- finding, verifying, enabling and loading kernel bundles
 * (see artifacts.h). A bundle is refused for any doubt and the reason kept
 * with it; nothing of a refused bundle is ever mapped. The object is loaded
 * through the very descriptor its hash was recomputed from
 * (/proc/self/fd/N), so the bytes verified are the bytes loaded. */
#include "artifact_impl.h"
#include "base/error.h"
#include "base/sha256.h"
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Records why bundle a is refused: "bundle NAME: <why>". Returns -1. */
static int refuse(art_bundle_t *a, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int refuse(art_bundle_t *a, const char *fmt, ...) {
    char why[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    snprintf(a->error, sizeof a->error, "bundle %.100s: %.600s", a->bundle, why);
    a->verified = false;
    return -1;
}

static int read_manifest(art_bundle_t *a) {
    char p[PATH_MAX + 32];
    snprintf(p, sizeof p, "%s/manifest.json", a->path);
    struct stat st;
    if (lstat(p, &st) != 0) return refuse(a, "no manifest.json");
    if (!S_ISREG(st.st_mode)) return refuse(a, "manifest.json is not a regular file");
    if (st.st_size > KERN_ART_MANIFEST_MAX)
        return refuse(a, "manifest.json is %lld bytes (limit %d)", (long long)st.st_size,
                      KERN_ART_MANIFEST_MAX);
    int fd = open(p, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) return refuse(a, "cannot open manifest.json: %s", strerror(errno));
    char *buf = malloc((size_t)st.st_size + 1);
    ssize_t n = buf ? read(fd, buf, (size_t)st.st_size + 1) : -1;
    close(fd);
    if (n < 0 || n > st.st_size) {
        free(buf);
        return refuse(a, "cannot read manifest.json");
    }
    int rc = kern_art_manifest_parse(buf, (size_t)n, &a->m);
    free(buf);
    if (rc != 0) return refuse(a, "%s", reel_err_text());
    a->parsed = true;
    return 0;
}

static const kern_art_file_t *listed(const art_bundle_t *a, const char *name) {
    for (int i = 0; i < a->m.n_files; i++)
        if (!strcmp(a->m.files[i].name, name)) return &a->m.files[i];
    return NULL;
}

/* Every file of the bundle is listed with its digest, and every digest
 * matches: nothing unlisted rides along with a verified object. */
static int check_files(art_bundle_t *a) {
    DIR *d = opendir(a->path);
    if (!d) return refuse(a, "cannot list: %s", strerror(errno));
    struct dirent *de;
    int rc = 0;
    while (rc == 0 && (de = readdir(d))) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..") ||
            !strcmp(de->d_name, "manifest.json"))
            continue;
        if (!listed(a, de->d_name))
            rc = refuse(a, "file %s is not listed in the manifest's \"files\"", de->d_name);
    }
    closedir(d);
    for (int i = 0; rc == 0 && i < a->m.n_files; i++) {
        const kern_art_file_t *f = &a->m.files[i];
        char p[PATH_MAX + KERN_ART_FILE_MAX + 2], hex[65];
        struct stat st;
        snprintf(p, sizeof p, "%s/%s", a->path, f->name);
        bool obj = !strcmp(f->name, a->m.object);
        if (lstat(p, &st) != 0)
            rc = refuse(a, "%s %s is missing", obj ? "the shared object" : "file", f->name);
        else if (!S_ISREG(st.st_mode))
            rc = refuse(a, "%s is not a regular file", f->name);
        else if (reel_sha256_file(p, hex) != 0)
            rc = refuse(a, "%s", reel_err_text());
        else if (strcmp(hex, f->sha256))
            rc = refuse(a, "hash mismatch for %s: the manifest says %.12s..., the file is %.12s...",
                        f->name, f->sha256, hex);
    }
    return rc;
}

static void verify(art_bundle_t *a) {
    struct stat st;
    if (lstat(a->path, &st) != 0 || !S_ISDIR(st.st_mode)) {
        refuse(a, "not a directory (a symlink or a file)");
        return;
    }
    if (read_manifest(a) != 0) return;
    if (a->m.abi != KERN_ART_ABI) {
        refuse(a, "ABI mismatch: built for artifact ABI %u, this Reel speaks %u", a->m.abi,
               KERN_ART_ABI);
        return;
    }
    if (check_files(a) != 0) return;
    a->verified = true;
}

static int by_name(const void *x, const void *y) {
    return strcmp(((const art_bundle_t *)x)->bundle, ((const art_bundle_t *)y)->bundle);
}

/* Two bundles with one id: both refused, each naming the other. */
static void refuse_duplicates(kern_artifacts_t *set) {
    for (size_t i = 0; i < set->n; i++)
        for (size_t j = 0; j < set->n; j++) {
            art_bundle_t *a = &set->b[i], *o = &set->b[j];
            if (i == j || !a->parsed || !o->parsed || strcmp(a->m.id, o->m.id)) continue;
            if (a->verified || !a->error[0])
                refuse(a, "duplicate id %s (bundle %s has it too): neither is used", a->m.id,
                       o->bundle);
        }
}

kern_artifacts_t *kern_artifacts_scan(const char *root) {
    kern_artifacts_t *set = calloc(1, sizeof *set);
    if (!set) { reel_fail(REEL_E_NOMEM, "out of memory"); return NULL; }
    pthread_mutex_init(&set->mu, NULL);
    snprintf(set->root, sizeof set->root, "%s", root);
    DIR *d = opendir(root);
    if (!d) {
        reel_fail(REEL_E_IO, "artifacts: cannot read %s: %s", root, strerror(errno));
        goto err;
    }
    {
        /* A bundle given where its folder belongs: it would scan as an empty
         * set, and "nothing refused" would read as a pass. */
        char mp[PATH_MAX];
        struct stat ms;
        if (snprintf(mp, sizeof mp, "%s/manifest.json", root) < (int)sizeof mp && lstat(mp, &ms) == 0) {
            closedir(d);
            reel_fail(REEL_E_INVALID, "artifacts: %s is a bundle (it holds manifest.json); give the folder that "
                      "holds its bundles", root);
            goto err;
        }
    }
    if (!(set->b = calloc(KERN_ART_MAX_BUNDLES, sizeof *set->b))) {
        closedir(d);
        reel_fail(REEL_E_NOMEM, "out of memory");
        goto err;
    }
    struct dirent *de;
    while ((de = readdir(d))) {
        if (de->d_name[0] == '.') continue;
        char p[PATH_MAX];
        struct stat st;
        if (snprintf(p, sizeof p, "%s/%s", root, de->d_name) >= (int)sizeof p) continue;
        if (lstat(p, &st) != 0 || S_ISREG(st.st_mode)) continue; /* files beside bundles */
        if (set->n == KERN_ART_MAX_BUNDLES) {
            closedir(d);
            reel_fail(REEL_E_LIMIT, "artifacts: more than %d bundles under %s", KERN_ART_MAX_BUNDLES, root);
            goto err;
        }
        art_bundle_t *a = &set->b[set->n++];
        snprintf(a->bundle, sizeof a->bundle, "%s", de->d_name);
        memcpy(a->path, p, sizeof a->path);
    }
    closedir(d);
    qsort(set->b, set->n, sizeof *set->b, by_name);
    for (size_t i = 0; i < set->n; i++) verify(&set->b[i]);
    refuse_duplicates(set);
    return set;
err:
    free(set->b);
    pthread_mutex_destroy(&set->mu);
    free(set);
    return NULL;
}

void kern_artifacts_destroy(kern_artifacts_t **sp) {
    if (!sp || !*sp) return;
    kern_artifacts_t *set = *sp;
    ART_ASSERT_UNLOCKED(set);
    kern_artifacts_uninstall(set);
    art_run_free(set);
    /* Loaded objects stay mapped: a graph may still hold their code. */
    free(set->b);
    pthread_mutex_destroy(&set->mu);
    free(set);
    *sp = NULL;
}

size_t kern_artifacts_count(const kern_artifacts_t *set) { return set->n; }

kern_art_bundle_t kern_artifacts_bundle(const kern_artifacts_t *set, size_t i) {
    const art_bundle_t *a = &set->b[i];
    return (kern_art_bundle_t){ .bundle = a->bundle, .path = a->path, .parsed = a->parsed,
                                .verified = a->verified, .enabled = a->enabled,
                                .loaded = a->loaded, .error = a->error, .m = &a->m };
}

size_t kern_artifacts_refused(const kern_artifacts_t *set) {
    size_t n = 0;
    for (size_t i = 0; i < set->n; i++) n += !set->b[i].verified;
    return n;
}

/* ---- the allowlist -------------------------------------------------------- */

static art_bundle_t *find_id(kern_artifacts_t *set, const char *id) {
    for (size_t i = 0; i < set->n; i++)
        if (set->b[i].parsed && !strcmp(set->b[i].m.id, id)) return &set->b[i];
    return NULL;
}

int kern_artifacts_enable(kern_artifacts_t *set, const char *const *ids, size_t n) {
    if (set->installed) return reel_fail(REEL_E_INVALID, "artifacts: enable after install");
    for (size_t i = 0; ids && i < n; i++) {
        art_bundle_t *a = find_id(set, ids[i]);
        if (!a) {
            char have[256] = "";
            for (size_t j = 0; j < set->n; j++)
                if (set->b[j].verified && strlen(have) + strlen(set->b[j].m.id) + 3 < sizeof have) {
                    strcat(have, have[0] ? ", " : "");
                    strcat(have, set->b[j].m.id);
                }
            return reel_fail(REEL_E_NOT_FOUND, "artifacts: unknown id '%.64s' in the allowlist: no bundle under %s "
                             "provides it (verified: %s)", ids[i], set->root,
                             have[0] ? have : "none");
        }
        if (!a->verified)
            return reel_fail(REEL_E_INVALID, "artifacts: '%.64s' is in the allowlist but its bundle is refused: %s",
                             ids[i], a->error);
    }
    for (size_t i = 0; i < set->n; i++) set->b[i].enabled = set->b[i].named = false;
    if (!ids) {
        for (size_t i = 0; i < set->n; i++) set->b[i].enabled = set->b[i].verified;
        return 0;
    }
    for (size_t i = 0; i < n; i++) {
        art_bundle_t *a = find_id(set, ids[i]);
        a->enabled = a->named = true;
    }
    return 0;
}

int kern_artifacts_enable_list(kern_artifacts_t *set, const char *csv) {
    char buf[4096];
    const char *ids[KERN_ART_MAX_BUNDLES];
    size_t n = 0;
    if (snprintf(buf, sizeof buf, "%s", csv) >= (int)sizeof buf)
        return reel_fail(REEL_E_INVALID, "artifacts: allowlist longer than %zu bytes", sizeof buf - 1);
    char *save = NULL, *p = buf;
    if (!*p || *p == ',' || p[strlen(p) - 1] == ',' || strstr(p, ",,"))
        return reel_fail(REEL_E_INVALID, "artifacts: allowlist '%.64s' has an empty id", csv);
    for (char *t = strtok_r(p, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (n == KERN_ART_MAX_BUNDLES)
            return reel_fail(REEL_E_LIMIT, "artifacts: more than %d ids in the allowlist", KERN_ART_MAX_BUNDLES);
        ids[n++] = t;
    }
    return kern_artifacts_enable(set, ids, n);
}

/* ---- loading ----------------------------------------------------------------- */

/* What an artifact records when it fails (kern_art_host_t.fail): the
 * artifact's own failure, not the caller's input. */
__attribute__((format(printf, 1, 2))) static int host_fail(const char *fmt, ...) {
    char msg[REEL_ERR_MSG];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return reel_fail(REEL_E_INTERNAL, "%s", msg);
}

static int host_register(void *reg, const kern_impl_t *impl) {
    art_bundle_t *a = reg;
    const art_op_t *op = art_op(a->m.op);
    if (!impl || !impl->fn || !impl->name || !impl->name[0])
        return reel_fail(REEL_E_INVALID, "a kernel without a function or a name");
    if (impl->op != a->m.op || impl->backend != a->m.backend)
        return reel_fail(REEL_E_INVALID, "kernel %.40s is for %s on %s; the manifest declares %s on %s",
                         impl->name, kern_op_name(impl->op), kern_backend_kind_name(impl->backend),
                         kern_op_name(a->m.op), kern_backend_kind_name(a->m.backend));
    if ((unsigned)impl->dtype >= KERN_DTYPE_COUNT || !(a->m.dtypes & (1u << impl->dtype)))
        return reel_fail(REEL_E_INVALID, "kernel %.40s is for %s, which the manifest does not declare", impl->name,
                         kern_dtype_name(impl->dtype));
    if (impl->args_size != op->args_size)
        return reel_fail(REEL_E_INVALID, "kernel %.40s takes a %zu-byte argument block; %s's is %zu bytes (built "
                         "against other headers?)", impl->name, impl->args_size,
                         kern_op_name(a->m.op), op->args_size);
    for (int i = 0; i < a->n_k; i++)
        if (a->k[i].impl.dtype == impl->dtype)
            return reel_fail(REEL_E_INVALID, "a second kernel for %s", kern_dtype_name(impl->dtype));
    if (a->n_k == ART_MAX_KERNELS) return reel_fail(REEL_E_LIMIT, "more than %d kernels", ART_MAX_KERNELS);
    art_kernel_t *k = &a->k[a->n_k++];
    k->impl = *impl;
    snprintf(k->name, sizeof k->name, "%s", impl->name);
    k->impl.name = k->name;
    k->art = a;
    return 0;
}

/* Re-hashes the object through a descriptor and maps that descriptor. The
 * descriptor stays open for the life of the process, like the mapping:
 * the dynamic loader knows an object by the name it was opened under, and
 * a closed /proc/self/fd/N would be reused by the next bundle's object,
 * which the loader would then take for this one. */
static int load(art_bundle_t *a) {
    char p[PATH_MAX + KERN_ART_FILE_MAX + 2], hex[65], fdp[64];
    snprintf(p, sizeof p, "%s/%s", a->path, a->m.object);
    int fd = open(p, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) return refuse(a, "cannot open %s: %s", a->m.object, strerror(errno));
    if (reel_sha256_fd(fd, hex) != 0 || strcmp(hex, listed(a, a->m.object)->sha256)) {
        close(fd);
        return refuse(a, "%s changed since it was verified: not loaded", a->m.object);
    }
    snprintf(fdp, sizeof fdp, "/proc/self/fd/%d", fd);
    void *dl = dlopen(fdp, RTLD_NOW | RTLD_LOCAL);
    if (!dl) {
        close(fd);
        return refuse(a, "dlopen %s: %s", a->m.object, dlerror());
    }
    a->dl = dl;
    const uint32_t *abi = dlsym(dl, KERN_ART_SYM_ABI);
    kern_art_init_fn init = (kern_art_init_fn)(uintptr_t)dlsym(dl, KERN_ART_SYM_INIT);
    if (!abi || !init)
        return refuse(a, "%s does not export %s and %s", a->m.object, KERN_ART_SYM_ABI,
                      KERN_ART_SYM_INIT);
    if (*abi != a->m.abi)
        return refuse(a, "ABI mismatch: %s says it was built for artifact ABI %u, the manifest "
                      "says %u", a->m.object, *abi, a->m.abi);
    const kern_art_host_t host = { .abi = KERN_ART_ABI, .id = a->m.id, .reg = a,
                                   .register_kernel = host_register, .fail = host_fail };
    a->n_k = 0;
    if (init(&host) != 0) {
        a->n_k = 0;
        return refuse(a, "%s: init failed: %s", a->m.object, reel_err_text());
    }
    if (a->n_k == 0) return refuse(a, "%s registered no kernel", a->m.object);
    a->loaded = true;
    return 0;
}

static void index_candidates(kern_artifacts_t *set) {
    memset(set->n_cand, 0, sizeof set->n_cand);
    for (size_t i = 0; i < set->n; i++) {
        const art_bundle_t *a = &set->b[i];
        if (!a->loaded) continue;
        for (int j = 0; j < a->n_k; j++) {
            const kern_impl_t *im = &a->k[j].impl;
            int *n = &set->n_cand[im->op][im->backend][im->dtype];
            if (*n < ART_MAX_CANDS) set->cand[im->op][im->backend][im->dtype][(*n)++] = &a->k[j];
        }
    }
}

int kern_artifacts_install(kern_artifacts_t *set, kern_art_timing_t timing) {
    art_install_lock();
    int rc = 0;
    if (kern_artifacts_installed()) {
        rc = reel_fail(REEL_E_INVALID, "artifacts: another set is installed");
        goto out;
    }
    for (size_t i = 0; i < set->n; i++) {
        art_bundle_t *a = &set->b[i];
        if (!a->enabled || a->loaded) continue;
        if (load(a) != 0) {
            a->enabled = false;
            if (a->named && rc == 0)
                rc = reel_fail(REEL_E_INVALID, "artifacts: '%s' is in the allowlist but cannot be loaded: %s",
                               a->m.id, a->error);
        }
    }
    if (rc != 0) goto out;
    kern_registry_init();
    index_candidates(set);
    set->timing = timing;
    set->installed = true;
    art_run_set_installed(set);
    kern_registry_set_hook(art_dispatch_hook);
out:
    art_install_unlock();
    return rc;
}

void kern_artifacts_uninstall(kern_artifacts_t *set) {
    art_install_lock();
    if (set && kern_artifacts_installed() == set) {
        kern_registry_set_hook(NULL);
        art_run_set_installed(NULL);
    }
    if (set) set->installed = false;
    art_install_unlock();
}

void kern_artifacts_on_event(kern_artifacts_t *set, kern_art_event_fn fn, void *user) {
    art_lock(set);
    set->on_event = fn;
    set->event_user = user;
    art_unlock(set);
}
