/* video.c -- frames to an H.264 MP4 and back through FFmpeg's libraries
 * (media/video.h). One muxing path serves the file and the memory writer
 * (an AVIOContext over a file, or over a seekable growable buffer), so the
 * two give the same bytes. Without media support (-DREEL_NO_MEDIA) only
 * video_frames_from_f32 works; the rest fail with one line. */
#include "media/video.h"

#include "base/error.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void video_frames_from_f32(const float *video, int64_t frames, int64_t height, int64_t width, uint8_t *rgb) {
    const int64_t plane = frames * height * width;
    for (int64_t p = 0; p < plane; p++) {
        for (int c = 0; c < 3; c++) {
            float x = video[c * plane + p];
            /* tensor.clamp(-1, 1); make_grid's normalize: clamp again, then
             * sub_(-1).div_(2); (t * 255).type(torch.uint8) truncates. F32
             * throughout, one rounding per operation as torch does; a NaN
             * (no defined uint8 in torch) becomes 0. */
            x = x != x ? -1.0f : x < -1.0f ? -1.0f : x > 1.0f ? 1.0f : x;
            float y = (x + 1.0f) / 2.0f;
            float z = y * 255.0f;
            rgb[p * 3 + c] = (uint8_t)z;
        }
    }
}

#ifdef REEL_NO_MEDIA

#define NO_MEDIA "built without media support (REEL_NO_MEDIA): no video"

int video_write_mp4(const char *path, const uint8_t *rgb, int64_t frames, int64_t height, int64_t width,
                    int fps) {
    (void)path, (void)rgb, (void)frames, (void)height, (void)width, (void)fps;
    return reel_fail(REEL_E_UNSUPPORTED, NO_MEDIA);
}
int video_encode_mp4(const uint8_t *rgb, int64_t frames, int64_t height, int64_t width, int fps, uint8_t **out,
                     size_t *len) {
    (void)rgb, (void)frames, (void)height, (void)width, (void)fps;
    *out = NULL;
    *len = 0;
    return reel_fail(REEL_E_UNSUPPORTED, NO_MEDIA);
}
int video_probe(const char *path, video_info_t *out) {
    (void)path;
    memset(out, 0, sizeof *out);
    return reel_fail(REEL_E_UNSUPPORTED, NO_MEDIA);
}
int video_decode_rgb(const char *path, uint8_t **rgb, video_info_t *info) {
    (void)path;
    *rgb = NULL;
    memset(info, 0, sizeof *info);
    return reel_fail(REEL_E_UNSUPPORTED, NO_MEDIA);
}

#else

#include <libavcodec/avcodec.h>
#include <libavformat/avformat.h>
#include <libavutil/dict.h>
#include <libavutil/imgutils.h>
#include <libavutil/opt.h>
#include <libswscale/swscale.h>

/* last: from here FFmpeg's functions are calls through the table that
 * av_lazy_load() fills (no binary links FFmpeg; av_lazy.h says why) */
#include "media/av_lazy.h"

/* The demuxers video_probe and video_decode_rgb may use. */
#define VIDEO_CONTAINERS "mov,mp4,m4a,3gp,3g2,mj2,matroska,webm,avi"

/* FFmpeg's error code as text, for an error's detail. */
static const char *av_text(int e, char buf[AV_ERROR_MAX_STRING_SIZE]) {
    av_strerror(e, buf, AV_ERROR_MAX_STRING_SIZE);
    return buf;
}

static int fail_av(int e, reel_code_t code, const char *what) {
    char b[AV_ERROR_MAX_STRING_SIZE];
    return reel_fail_detail(e == AVERROR(ENOMEM) ? REEL_E_NOMEM : code, av_text(e, b), "%s", what);
}

static int check_shape(int64_t frames, int64_t height, int64_t width, int fps) {
    if (frames < 1 || frames > VIDEO_MAX_FRAMES)
        return reel_fail(REEL_E_INVALID, "video: %lld frames; 1 to %d", (long long)frames, VIDEO_MAX_FRAMES);
    if (height < 2 || width < 2 || height > VIDEO_MAX_SIDE || width > VIDEO_MAX_SIDE)
        return reel_fail(REEL_E_INVALID, "video: %lldx%lld (HxW); each side 2 to %d", (long long)height,
                         (long long)width, VIDEO_MAX_SIDE);
    if (height % 2 || width % 2)
        return reel_fail(REEL_E_INVALID,
                         "video: %lldx%lld (HxW) has an odd side; H.264 in 4:2:0 (yuv420p) needs even H and W",
                         (long long)height, (long long)width);
    if (fps < 1 || fps > VIDEO_MAX_FPS) return reel_fail(REEL_E_INVALID, "video: fps %d; 1 to %d", fps, VIDEO_MAX_FPS);
    return 0;
}

/* ---- a seekable memory sink for libavformat -------------------------------------- */

typedef struct {
    uint8_t *p;
    size_t len, cap, pos;
} membuf_t;

/* FFmpeg 7 made the written buffer const */
#if LIBAVFORMAT_VERSION_MAJOR >= 61
#define AVIO_WBUF const uint8_t
#else
#define AVIO_WBUF uint8_t
#endif

static int mem_write(void *opaque, AVIO_WBUF *buf, int n) {
    membuf_t *m = opaque;
    size_t end = m->pos + (size_t)n;
    if (end > m->cap) {
        size_t cap = m->cap ? m->cap : 1 << 16;
        while (cap < end) cap *= 2;
        uint8_t *q = realloc(m->p, cap);
        if (!q) return AVERROR(ENOMEM);
        m->p = q;
        m->cap = cap;
    }
    if (m->pos > m->len) memset(m->p + m->len, 0, m->pos - m->len); /* a seek past the end leaves zeros */
    memcpy(m->p + m->pos, buf, (size_t)n);
    m->pos = end;
    if (end > m->len) m->len = end;
    return n;
}

static int64_t mem_seek(void *opaque, int64_t off, int whence) {
    membuf_t *m = opaque;
    int64_t base;
    switch (whence & ~AVSEEK_FORCE) {
    case SEEK_SET: base = 0; break;
    case SEEK_CUR: base = (int64_t)m->pos; break;
    case SEEK_END: base = (int64_t)m->len; break;
    case AVSEEK_SIZE: return (int64_t)m->len;
    default: return AVERROR(EINVAL);
    }
    if (base + off < 0) return AVERROR(EINVAL);
    m->pos = (size_t)(base + off);
    return (int64_t)m->pos;
}

/* ---- the encoder ------------------------------------------------------------------ */

/* Sends frame (NULL: flush) to enc and writes what comes out. 0 or -1. */
static int encode_send(AVCodecContext *enc, AVFrame *frame, AVPacket *pkt, AVFormatContext *oc, AVStream *st) {
    int e = avcodec_send_frame(enc, frame);
    if (e < 0) return fail_av(e, REEL_E_INTERNAL, "video: libx264 refused a frame");
    for (;;) {
        e = avcodec_receive_packet(enc, pkt);
        if (e == AVERROR(EAGAIN) || e == AVERROR_EOF) return 0;
        if (e < 0) return fail_av(e, REEL_E_INTERNAL, "video: libx264 failed to encode");
        av_packet_rescale_ts(pkt, enc->time_base, st->time_base);
        pkt->stream_index = st->index;
        e = av_interleaved_write_frame(oc, pkt);
        if (e < 0) return fail_av(e, REEL_E_IO, "video: writing the MP4 failed");
    }
}

/* Encodes the frames into an MP4 through pb (the caller's, already open;
 * not closed here). 0, or -1 with the error value set. */
static int mux_mp4(AVIOContext *pb, const uint8_t *rgb, int64_t frames, int64_t height, int64_t width, int fps) {
    AVFormatContext *oc = NULL;
    AVCodecContext *enc = NULL;
    AVFrame *frame = NULL;
    AVPacket *pkt = NULL;
    struct SwsContext *sws = NULL;
    AVDictionary *opts = NULL;
    uint8_t *padded = NULL;
    int rc = -1, e;
    bool header = false;

    const AVCodec *codec = avcodec_find_encoder_by_name("libx264");
    if (!codec) return reel_fail(REEL_E_UNSUPPORTED, "video: this FFmpeg has no libx264 encoder");
    if ((e = avformat_alloc_output_context2(&oc, NULL, "mp4", NULL)) < 0 || !oc) {
        fail_av(e, REEL_E_INTERNAL, "video: FFmpeg has no MP4 muxer");
        goto out;
    }
    oc->pb = pb;
    oc->flags |= AVFMT_FLAG_BITEXACT | AVFMT_FLAG_CUSTOM_IO; /* no version strings: same bytes */
    AVStream *st = avformat_new_stream(oc, NULL);
    enc = avcodec_alloc_context3(codec);
    frame = av_frame_alloc();
    pkt = av_packet_alloc();
    if (!st || !enc || !frame || !pkt) {
        reel_fail(REEL_E_NOMEM, "video: out of memory");
        goto out;
    }
    enc->width = (int)width;
    enc->height = (int)height;
    enc->pix_fmt = AV_PIX_FMT_YUV420P;
    enc->time_base = (AVRational){ 1, fps };
    enc->framerate = (AVRational){ fps, 1 };
    enc->gop_size = 12 * fps; /* one key frame for a Wan clip's 81 frames at 16 fps */
    /* one thread: no thread timing in the output. The bytes are still not
     * a pure function of the frames: Debian's libx264 (0.164, its SIMD
     * code; x264-params asm=0 makes it exact, at several times the cost)
     * gave a few bytes more or less for the same frames on some encodes
     * within one process, whatever the buffers Reel hands it (zeroed,
     * padded). The decoded frames agree to the codec's loss. */
    enc->thread_count = 1;
    enc->flags |= AV_CODEC_FLAG_BITEXACT;
    enc->color_range = AVCOL_RANGE_MPEG;
    enc->colorspace = AVCOL_SPC_SMPTE170M;
    enc->color_primaries = AVCOL_PRI_SMPTE170M;
    enc->color_trc = AVCOL_TRC_SMPTE170M;
    if (oc->oformat->flags & AVFMT_GLOBALHEADER) enc->flags |= AV_CODEC_FLAG_GLOBAL_HEADER;
    av_dict_set(&opts, "preset", "medium", 0);
    av_dict_set(&opts, "crf", "18", 0);
    if ((e = avcodec_open2(enc, codec, &opts)) < 0) {
        fail_av(e, REEL_E_INTERNAL, "video: libx264 would not open");
        goto out;
    }
    if ((e = avcodec_parameters_from_context(st->codecpar, enc)) < 0) {
        fail_av(e, REEL_E_INTERNAL, "video: stream parameters");
        goto out;
    }
    st->time_base = enc->time_base;
    st->avg_frame_rate = enc->framerate;
    if ((e = avformat_write_header(oc, NULL)) < 0) {
        fail_av(e, REEL_E_IO, "video: writing the MP4 header failed");
        goto out;
    }
    header = true;
    frame->format = enc->pix_fmt;
    frame->width = enc->width;
    frame->height = enc->height;
    if ((e = av_frame_get_buffer(frame, 0)) < 0) {
        fail_av(e, REEL_E_NOMEM, "video: frame buffer");
        goto out;
    }
    /* exact arithmetic on every CPU: swscale's SIMD paths may round
     * differently unless asked to be bit-exact */
    sws = sws_getContext((int)width, (int)height, AV_PIX_FMT_RGB24, (int)width, (int)height, AV_PIX_FMT_YUV420P,
                         SWS_BILINEAR | SWS_ACCURATE_RND | SWS_BITEXACT, NULL, NULL, NULL);
    if (!sws) {
        reel_fail(REEL_E_INTERNAL, "video: swscale cannot convert RGB24 to YUV420P at %lldx%lld", (long long)height,
                  (long long)width);
        goto out;
    }
    /* x264 copies whole rows of the frame's planes, alignment padding too:
     * defined bytes there keep the output a function of the frames alone */
    for (int i = 0; i < AV_NUM_DATA_POINTERS && frame->buf[i]; i++)
        memset(frame->buf[i]->data, 0, frame->buf[i]->size);
    /* swscale's SIMD reads up to 16 bytes past a frame's last pixel: each
     * frame is copied into a padded buffer so it never reads the caller's
     * memory beyond the array (whose bytes would also change the output) */
    const size_t fbytes = (size_t)(height * width * 3);
    if (!(padded = av_mallocz(fbytes + 64))) {
        reel_fail(REEL_E_NOMEM, "video: out of memory");
        goto out;
    }
    for (int64_t f = 0; f < frames; f++) {
        if ((e = av_frame_make_writable(frame)) < 0) {
            fail_av(e, REEL_E_NOMEM, "video: frame buffer");
            goto out;
        }
        memcpy(padded, rgb + (size_t)f * fbytes, fbytes);
        const uint8_t *src[1] = { padded };
        const int stride[1] = { (int)width * 3 };
        sws_scale(sws, src, stride, 0, (int)height, frame->data, frame->linesize);
        frame->pts = f;
        if (encode_send(enc, frame, pkt, oc, st)) goto out;
    }
    if (encode_send(enc, NULL, pkt, oc, st)) goto out;
    if ((e = av_write_trailer(oc)) < 0) {
        fail_av(e, REEL_E_IO, "video: writing the MP4 trailer failed");
        goto out;
    }
    header = false;
    rc = 0;
out:
    if (header) av_write_trailer(oc); /* frees the muxer's state after a failure */
    av_dict_free(&opts);
    av_free(padded);
    sws_freeContext(sws);
    av_packet_free(&pkt);
    av_frame_free(&frame);
    avcodec_free_context(&enc);
    if (oc) {
        oc->pb = NULL; /* the caller's */
        avformat_free_context(oc);
    }
    return rc;
}

int video_write_mp4(const char *path, const uint8_t *rgb, int64_t frames, int64_t height, int64_t width,
                    int fps) {
    if (check_shape(frames, height, width, fps) || av_lazy_load()) return -1;
    AVIOContext *pb = NULL;
    int e = avio_open(&pb, path, AVIO_FLAG_WRITE);
    if (e < 0) {
        char b[AV_ERROR_MAX_STRING_SIZE];
        return reel_fail_detail(REEL_E_IO, av_text(e, b), "video: cannot create %s", path);
    }
    int rc = mux_mp4(pb, rgb, frames, height, width, fps);
    e = avio_closep(&pb);
    if (rc == 0 && e < 0) {
        char b[AV_ERROR_MAX_STRING_SIZE];
        rc = reel_fail_detail(REEL_E_IO, av_text(e, b), "video: writing %s failed", path);
    }
    if (rc) {
        reel_fail_prefix("%s: ", path);
        remove(path); /* no half-written video left behind */
    }
    return rc;
}

int video_encode_mp4(const uint8_t *rgb, int64_t frames, int64_t height, int64_t width, int fps, uint8_t **out,
                     size_t *len) {
    *out = NULL;
    *len = 0;
    if (check_shape(frames, height, width, fps) || av_lazy_load()) return -1;
    membuf_t m = { 0 };
    const int iosize = 1 << 16;
    uint8_t *iobuf = av_malloc(iosize);
    AVIOContext *pb = iobuf ? avio_alloc_context(iobuf, iosize, 1, &m, NULL, mem_write, mem_seek) : NULL;
    if (!pb) {
        av_free(iobuf);
        return reel_fail(REEL_E_NOMEM, "video: out of memory");
    }
    pb->seekable = AVIO_SEEKABLE_NORMAL; /* the muxer goes back to write the mdat size, as in a file */
    int rc = mux_mp4(pb, rgb, frames, height, width, fps);
    avio_flush(pb);
    if (rc == 0 && pb->error < 0) rc = fail_av(pb->error, REEL_E_NOMEM, "video: writing the MP4 to memory failed");
    av_freep(&pb->buffer);
    avio_context_free(&pb);
    if (rc) {
        free(m.p);
        return -1;
    }
    *out = m.p;
    *len = m.len;
    return 0;
}

/* ---- reading back ------------------------------------------------------------------ */

/* Opens path, decodes every frame of its first video stream into info
 * and, when rgb is not NULL, into a malloc'd [F,H,W,3] RGB24 array. */
static int read_video(const char *path, video_info_t *info, uint8_t **rgb) {
    AVFormatContext *ic = NULL;
    AVCodecContext *dec = NULL;
    AVFrame *frame = NULL;
    AVPacket *pkt = NULL;
    struct SwsContext *sws = NULL;
    uint8_t *pix = NULL;
    size_t pix_cap = 0;
    int rc = -1, e;
    memset(info, 0, sizeof *info);
    if (rgb) *rgb = NULL;
    if (av_lazy_load()) return reel_fail_prefix("%s: ", path);

    /* Video containers only, from the local file only: FFmpeg would also
     * take a text file for its 'tty' art demuxer (and "decode" frames of
     * it), and a playlist (HLS, concat) would open whatever it names. */
    AVDictionary *opts = NULL;
    av_dict_set(&opts, "format_whitelist", VIDEO_CONTAINERS, 0);
    av_dict_set(&opts, "protocol_whitelist", "file", 0);
    e = avformat_open_input(&ic, path, NULL, &opts);
    av_dict_free(&opts);
    if (e < 0) {
        char b[AV_ERROR_MAX_STRING_SIZE];
        return reel_fail_detail(e == AVERROR(ENOENT) ? REEL_E_NOT_FOUND : REEL_E_INVALID, av_text(e, b),
                                "video %s: cannot open it as a video (MP4/MOV, Matroska/WebM or AVI)", path);
    }
    if ((e = avformat_find_stream_info(ic, NULL)) < 0) {
        fail_av(e, REEL_E_INVALID, "cannot read its streams");
        goto out;
    }
    const AVCodec *codec = NULL;
    int si = av_find_best_stream(ic, AVMEDIA_TYPE_VIDEO, -1, -1, &codec, 0);
    if (si < 0 || !codec) {
        reel_fail(REEL_E_INVALID, si < 0 ? "no video stream" : "no decoder for its video stream");
        goto out;
    }
    AVStream *st = ic->streams[si];
    snprintf(info->codec, sizeof info->codec, "%s", avcodec_get_name(st->codecpar->codec_id));
    AVRational r = st->avg_frame_rate.num ? st->avg_frame_rate : st->r_frame_rate;
    info->fps = r.den ? av_q2d(r) : 0;
    dec = avcodec_alloc_context3(codec);
    frame = av_frame_alloc();
    pkt = av_packet_alloc();
    if (!dec || !frame || !pkt) {
        reel_fail(REEL_E_NOMEM, "out of memory");
        goto out;
    }
    if ((e = avcodec_parameters_to_context(dec, st->codecpar)) < 0) {
        fail_av(e, REEL_E_INVALID, "bad stream parameters");
        goto out;
    }
    dec->thread_count = 1;
    if ((e = avcodec_open2(dec, codec, NULL)) < 0) {
        fail_av(e, REEL_E_INVALID, "the decoder would not open");
        goto out;
    }
    info->width = dec->width;
    info->height = dec->height;
    bool flushing = false;
    for (;;) {
        if (!flushing) {
            e = av_read_frame(ic, pkt);
            if (e == AVERROR_EOF) {
                flushing = true;
                e = avcodec_send_packet(dec, NULL);
            } else if (e < 0) {
                fail_av(e, REEL_E_INVALID, "reading a packet failed");
                goto out;
            } else {
                e = pkt->stream_index == si ? avcodec_send_packet(dec, pkt) : 0;
                av_packet_unref(pkt);
            }
            if (e < 0 && e != AVERROR(EAGAIN)) {
                fail_av(e, REEL_E_INVALID, "decoding failed");
                goto out;
            }
        }
        for (;;) {
            e = avcodec_receive_frame(dec, frame);
            if (e == AVERROR(EAGAIN)) break;
            if (e == AVERROR_EOF) goto done;
            if (e < 0) {
                fail_av(e, REEL_E_INVALID, "decoding failed");
                goto out;
            }
            if (rgb) {
                if (frame->width != info->width || frame->height != info->height) {
                    reel_fail(REEL_E_UNSUPPORTED, "frame %lld changes size to %dx%d", (long long)info->frames,
                              frame->height, frame->width);
                    goto out;
                }
                size_t fb = (size_t)info->width * (size_t)info->height * 3, need = fb * (size_t)(info->frames + 1);
                if (need > pix_cap) {
                    size_t cap = pix_cap ? pix_cap * 2 : fb * 16;
                    while (cap < need) cap *= 2;
                    uint8_t *q = realloc(pix, cap);
                    if (!q) {
                        reel_fail(REEL_E_NOMEM, "out of memory");
                        goto out;
                    }
                    pix = q;
                    pix_cap = cap;
                }
                sws = sws_getCachedContext(sws, frame->width, frame->height, frame->format, frame->width,
                                           frame->height, AV_PIX_FMT_RGB24,
                                           SWS_BILINEAR | SWS_ACCURATE_RND | SWS_BITEXACT, NULL, NULL, NULL);
                if (!sws) {
                    reel_fail(REEL_E_UNSUPPORTED, "cannot convert its pixel format to RGB24");
                    goto out;
                }
                uint8_t *dst[1] = { pix + fb * (size_t)info->frames };
                const int stride[1] = { (int)info->width * 3 };
                sws_scale(sws, (const uint8_t *const *)frame->data, frame->linesize, 0, frame->height, dst, stride);
            }
            info->frames++;
            av_frame_unref(frame);
        }
    }
done:
    if (info->frames == 0) {
        reel_fail(REEL_E_INVALID, "no frame decodes");
        goto out;
    }
    rc = 0;
    if (rgb) {
        *rgb = pix;
        pix = NULL;
    }
out:
    if (rc) reel_fail_prefix("video %s: ", path);
    free(pix);
    sws_freeContext(sws);
    av_packet_free(&pkt);
    av_frame_free(&frame);
    avcodec_free_context(&dec);
    avformat_close_input(&ic);
    return rc;
}

int video_probe(const char *path, video_info_t *out) { return read_video(path, out, NULL); }

int video_decode_rgb(const char *path, uint8_t **rgb, video_info_t *info) { return read_video(path, info, rgb); }

#endif
