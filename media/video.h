/* video.h -- frames to a video file and back, through FFmpeg's libraries.
 *
 * Frames are uint8 RGB [F,H,W,3], row-major, what a decoded Wan video
 * becomes (video_frames_from_f32). The writer encodes H.264 (libx264,
 * yuv420p, so H and W must be even) in an MP4 at `fps` frames per second
 * (Wan2.1 writes 16), deterministic for the same frames (one encoder
 * thread). The probe reads a file's stream back with libavformat: what a
 * test or an operator checks a written video with.
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

/* A decoded video [3,F,H,W] F32 in [-1,1] to frames [F,H,W,3] uint8 as
 * Wan2.1's cache_video writes them: clamp to [-1,1], (x+1)/2, ·255,
 * truncated to uint8. Can't fail. */
void video_frames_from_f32(const float *video, int64_t frames, int64_t height, int64_t width,
                           uint8_t *rgb);

/* Writes frames as an MP4 file at path. */
int video_write_mp4(const char *path, const uint8_t *rgb, int64_t frames, int64_t height,
                    int64_t width, int fps);
/* The same MP4 into a malloc'd buffer (*out, *len; the caller frees):
 * what a GEN with output "video" carries back. */
int video_encode_mp4(const uint8_t *rgb, int64_t frames, int64_t height, int64_t width, int fps,
                     uint8_t **out, size_t *len);

typedef struct {
    int64_t frames;     /* decoded frames counted, not the header's guess */
    int64_t width, height;
    double fps;
    char codec[32];     /* "h264" */
} video_info_t;
/* Opens a video file, decodes every frame of its first video stream and
 * fills *out. */
int video_probe(const char *path, video_info_t *out);

#ifdef __cplusplus
}
#endif
#endif
