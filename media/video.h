/* video.h -- frames to a video file and back, through FFmpeg's libraries.
 *
 * Frames are uint8 RGB [F,H,W,3], row-major, what a decoded Wan video
 * becomes (video_frames_from_f32). The writer encodes H.264 (libx264,
 * yuv420p, so H and W must be even) in an MP4 at `fps` frames per second
 * (Wan2.1 writes 16), one encoder thread. The bytes are NOT guaranteed
 * identical from one encode of the same frames to the next: Debian's
 * libx264 SIMD code was seen to vary a few bytes within one process
 * (media/video.c says more); what a reader decodes agrees to the codec's
 * loss. The probe reads a file's stream back with libavformat: what a
 * test or an operator checks a written video with.
 *
 * Encoder settings: libx264, preset medium, CRF 18, one thread, a key
 * frame every 12 s, BT.601 limited range (RGB to YUV through swscale,
 * bilinear chroma, accurate rounding, bit-exact), FFmpeg's bit-exact flags
 * on codec and muxer (no version strings). Wan2.1's imageio writer used
 * libx264 at its `quality=8`; the bytes differ from Wan's, the frames
 * agree to the codec's loss (tests/test_video.c: PSNR above 30 dB on a
 * moving gradient).
 *
 * Built without media support (-DREEL_NO_MEDIA) every function but
 * video_frames_from_f32 fails with "built without media support".
 *
 * Convention: 0 on success, -1 with a message in reel_err_text(). */
#ifndef REEL_MEDIA_VIDEO_H
#define REEL_MEDIA_VIDEO_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define VIDEO_FPS_WAN 16
/* Bounds the writer checks (REEL_E_INVALID past them). */
#define VIDEO_MAX_FRAMES 100000
#define VIDEO_MAX_SIDE 8192
#define VIDEO_MAX_FPS 240

/* A decoded video [3,F,H,W] F32 in [-1,1] to frames [F,H,W,3] uint8 as
 * Wan2.1's cache_video writes them: clamp to [-1,1], (x+1)/2, ·255,
 * truncated to uint8 (F32 arithmetic, one rounding per step as torch
 * does: 0 -> 127, 1 -> 255, -1 -> 0; a NaN -> 0). Can't fail. */
void video_frames_from_f32(const float *video, int64_t frames, int64_t height, int64_t width,
                           uint8_t *rgb);

/* Writes frames as an MP4 file at path (created or truncated; removed
 * again on failure). 0, or -1: REEL_E_INVALID for frames < 1, an odd or
 * too large side, fps outside 1..VIDEO_MAX_FPS; REEL_E_IO; REEL_E_NOMEM;
 * REEL_E_UNSUPPORTED without libx264. */
int video_write_mp4(const char *path, const uint8_t *rgb, int64_t frames, int64_t height,
                    int64_t width, int fps);
/* The same MP4 into a malloc'd buffer (*out, *len; the caller frees;
 * NULL and 0 on failure): what a GEN with output "video" carries back.
 * Muxed through a custom AVIOContext over a seekable growable memory
 * buffer (no temp file), the same muxing code as video_write_mp4: it
 * probes identically and decodes to the same frames. Failures as
 * video_write_mp4's. */
int video_encode_mp4(const uint8_t *rgb, int64_t frames, int64_t height, int64_t width, int fps,
                     uint8_t **out, size_t *len);

typedef struct {
    int64_t frames;     /* decoded frames counted, not the header's guess */
    int64_t width, height;
    double fps;
    char codec[32];     /* "h264" */
} video_info_t;
/* Opens a video file, decodes every frame of its first video stream and
 * fills *out (fps: the stream's average frame rate). 0, or -1 with the
 * error naming path: REEL_E_NOT_FOUND, REEL_E_INVALID (not a video, no
 * video stream, nothing decodes), REEL_E_NOMEM. */
int video_probe(const char *path, video_info_t *out);
/* video_probe, and the decoded frames as RGB24 [F,H,W,3] in a malloc'd
 * *rgb (the caller frees; NULL on failure), converted by swscale (BT.601
 * limited range, as written). REEL_E_UNSUPPORTED too, for a stream whose
 * frames change size. */
int video_decode_rgb(const char *path, uint8_t **rgb, video_info_t *info);

#ifdef __cplusplus
}
#endif
#endif
