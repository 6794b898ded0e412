/* av_lazy.c -- FFmpeg opened on first use (media/av_lazy.h says why). */
#ifndef REEL_NO_MEDIA

#define AV_LAZY_FILLING
#include "media/av_lazy.h"

#include "base/error.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>

#define AV_LAZY_SONAME(lib, MAJOR) "lib" #lib ".so." AV_STRINGIFY(MAJOR)
#define SONAME_avutil AV_LAZY_SONAME(avutil, LIBAVUTIL_VERSION_MAJOR)
#define SONAME_avcodec AV_LAZY_SONAME(avcodec, LIBAVCODEC_VERSION_MAJOR)
#define SONAME_avformat AV_LAZY_SONAME(avformat, LIBAVFORMAT_VERSION_MAJOR)
#define SONAME_swscale AV_LAZY_SONAME(swscale, LIBSWSCALE_VERSION_MAJOR)

av_lazy_t av_lazy;

static pthread_once_t once = PTHREAD_ONCE_INIT;
static char why[512]; /* empty once loaded; written only inside `once` */

/* dlopen's handles, by library; never closed (FFmpeg keeps state). */
static void *h_avutil, *h_avcodec, *h_avformat, *h_swscale;

static void *open_lib(const char *soname) {
    void *h = dlopen(soname, RTLD_NOW | RTLD_LOCAL);
    if (!h && !why[0]) snprintf(why, sizeof why, "FFmpeg could not be loaded: %s", dlerror());
    return h;
}

static void load(void) {
    /* dependencies first, so a missing one is named as itself */
    h_avutil = open_lib(SONAME_avutil);
    h_avcodec = open_lib(SONAME_avcodec);
    h_avformat = open_lib(SONAME_avformat);
    h_swscale = open_lib(SONAME_swscale);
    if (why[0]) return;
#define AV_LAZY_FIND(lib, fn)                                                                              \
    av_lazy.fn = (__typeof__(fn) *)dlsym(h_##lib, #fn);                                                    \
    if (!av_lazy.fn) {                                                                                     \
        snprintf(why, sizeof why, "FFmpeg's %s has no %s", SONAME_##lib, #fn);                             \
        return;                                                                                            \
    }
    AV_LAZY_FUNCS(AV_LAZY_FIND)
#undef AV_LAZY_FIND
    /* libx264 reports statistics at FFmpeg's info level on every encode;
     * Reel says what failed in its own error value, so FFmpeg's log
     * (shared by the whole process, whose only FFmpeg user is video.c)
     * keeps errors only. */
    av_lazy.av_log_set_level(AV_LOG_ERROR);
}

int av_lazy_load(void) {
    pthread_once(&once, load);
    if (why[0]) return reel_fail(REEL_E_UNSUPPORTED, "video: %s", why);
    return 0;
}

#else
typedef int av_lazy_unused_t; /* ISO C wants a declaration in every file */
#endif
