/* av_lazy.h -- FFmpeg's functions, opened on first use (media/av_lazy.c).
 *
 * Linking libavformat and libavcodec loads about 130 shared objects (every
 * codec, muxer and protocol library Debian's FFmpeg is built with) before
 * main: 75 ms of a 85 ms `reelctl status`, paid by every reelctl command,
 * every worker start and every test binary, though only writing or reading
 * a video calls FFmpeg. So no binary links FFmpeg: media/video.c includes
 * this header after FFmpeg's own, and each FFmpeg function it calls becomes
 * a call through a table that av_lazy_load() fills once, with dlopen on the
 * sonames of the headers it was compiled against (found the same way the
 * linker's would be: the system's loader cache and paths).
 *
 * The table's types are the headers' own (__typeof__), so the compiler
 * checks every call as before. Call av_lazy_load() (0, or -1 with the error
 * value saying which library or function is missing) before any FFmpeg
 * call; video.c's four entry points do. Add a function here when video.c
 * starts calling one: a call left out is an undefined reference at link. */
#ifndef REEL_AV_LAZY_H
#define REEL_AV_LAZY_H

#include <libavcodec/avcodec.h>
#include <libavformat/avformat.h>
#include <libavutil/dict.h>
#include <libavutil/log.h>
#include <libavutil/mem.h>
#include <libswscale/swscale.h>

/* X(library, function): every FFmpeg function Reel calls. */
#define AV_LAZY_FUNCS(X)                                                                             \
    X(avformat, avformat_alloc_output_context2)                                                      \
    X(avformat, avformat_close_input)                                                                \
    X(avformat, avformat_find_stream_info)                                                           \
    X(avformat, avformat_free_context)                                                               \
    X(avformat, avformat_new_stream)                                                                 \
    X(avformat, avformat_open_input)                                                                 \
    X(avformat, avformat_write_header)                                                               \
    X(avformat, av_find_best_stream)                                                                 \
    X(avformat, av_interleaved_write_frame)                                                          \
    X(avformat, av_read_frame)                                                                       \
    X(avformat, av_write_trailer)                                                                    \
    X(avformat, avio_alloc_context)                                                                  \
    X(avformat, avio_closep)                                                                         \
    X(avformat, avio_context_free)                                                                   \
    X(avformat, avio_flush)                                                                          \
    X(avformat, avio_open)                                                                           \
    X(avcodec, avcodec_alloc_context3)                                                               \
    X(avcodec, avcodec_find_encoder_by_name)                                                         \
    X(avcodec, avcodec_free_context)                                                                 \
    X(avcodec, avcodec_get_name)                                                                     \
    X(avcodec, avcodec_open2)                                                                        \
    X(avcodec, avcodec_parameters_from_context)                                                      \
    X(avcodec, avcodec_parameters_to_context)                                                        \
    X(avcodec, avcodec_receive_frame)                                                                \
    X(avcodec, avcodec_receive_packet)                                                               \
    X(avcodec, avcodec_send_frame)                                                                   \
    X(avcodec, avcodec_send_packet)                                                                  \
    X(avcodec, av_packet_alloc)                                                                      \
    X(avcodec, av_packet_free)                                                                       \
    X(avcodec, av_packet_rescale_ts)                                                                 \
    X(avcodec, av_packet_unref)                                                                      \
    X(avutil, av_dict_free)                                                                          \
    X(avutil, av_dict_set)                                                                           \
    X(avutil, av_frame_alloc)                                                                        \
    X(avutil, av_frame_free)                                                                         \
    X(avutil, av_frame_get_buffer)                                                                   \
    X(avutil, av_frame_make_writable)                                                                \
    X(avutil, av_frame_unref)                                                                        \
    X(avutil, av_free)                                                                               \
    X(avutil, av_freep)                                                                              \
    X(avutil, av_log_set_level)                                                                      \
    X(avutil, av_malloc)                                                                             \
    X(avutil, av_mallocz)                                                                            \
    X(avutil, av_strerror)                                                                           \
    X(swscale, sws_freeContext)                                                                      \
    X(swscale, sws_getCachedContext)                                                                 \
    X(swscale, sws_getContext)                                                                       \
    X(swscale, sws_scale)

#define AV_LAZY_FIELD(lib, fn) __typeof__(fn) *fn;
typedef struct {
    AV_LAZY_FUNCS(AV_LAZY_FIELD)
} av_lazy_t;
#undef AV_LAZY_FIELD

/* Filled by av_lazy_load(); read-only after. */
extern av_lazy_t av_lazy;

/* Opens FFmpeg's libraries and finds every function once per process
 * (later calls return the first verdict). 0, or -1 with the error value
 * set (REEL_E_UNSUPPORTED, naming the library or function). */
int av_lazy_load(void);

/* From here on each name above is a call through the table (not in
 * av_lazy.c, which fills it). */
#ifndef AV_LAZY_FILLING
#define avformat_alloc_output_context2 (*av_lazy.avformat_alloc_output_context2)
#define avformat_close_input (*av_lazy.avformat_close_input)
#define avformat_find_stream_info (*av_lazy.avformat_find_stream_info)
#define avformat_free_context (*av_lazy.avformat_free_context)
#define avformat_new_stream (*av_lazy.avformat_new_stream)
#define avformat_open_input (*av_lazy.avformat_open_input)
#define avformat_write_header (*av_lazy.avformat_write_header)
#define av_find_best_stream (*av_lazy.av_find_best_stream)
#define av_interleaved_write_frame (*av_lazy.av_interleaved_write_frame)
#define av_read_frame (*av_lazy.av_read_frame)
#define av_write_trailer (*av_lazy.av_write_trailer)
#define avio_alloc_context (*av_lazy.avio_alloc_context)
#define avio_closep (*av_lazy.avio_closep)
#define avio_context_free (*av_lazy.avio_context_free)
#define avio_flush (*av_lazy.avio_flush)
#define avio_open (*av_lazy.avio_open)
#define avcodec_alloc_context3 (*av_lazy.avcodec_alloc_context3)
#define avcodec_find_encoder_by_name (*av_lazy.avcodec_find_encoder_by_name)
#define avcodec_free_context (*av_lazy.avcodec_free_context)
#define avcodec_get_name (*av_lazy.avcodec_get_name)
#define avcodec_open2 (*av_lazy.avcodec_open2)
#define avcodec_parameters_from_context (*av_lazy.avcodec_parameters_from_context)
#define avcodec_parameters_to_context (*av_lazy.avcodec_parameters_to_context)
#define avcodec_receive_frame (*av_lazy.avcodec_receive_frame)
#define avcodec_receive_packet (*av_lazy.avcodec_receive_packet)
#define avcodec_send_frame (*av_lazy.avcodec_send_frame)
#define avcodec_send_packet (*av_lazy.avcodec_send_packet)
#define av_packet_alloc (*av_lazy.av_packet_alloc)
#define av_packet_free (*av_lazy.av_packet_free)
#define av_packet_rescale_ts (*av_lazy.av_packet_rescale_ts)
#define av_packet_unref (*av_lazy.av_packet_unref)
#define av_dict_free (*av_lazy.av_dict_free)
#define av_dict_set (*av_lazy.av_dict_set)
#define av_frame_alloc (*av_lazy.av_frame_alloc)
#define av_frame_free (*av_lazy.av_frame_free)
#define av_frame_get_buffer (*av_lazy.av_frame_get_buffer)
#define av_frame_make_writable (*av_lazy.av_frame_make_writable)
#define av_frame_unref (*av_lazy.av_frame_unref)
#define av_free (*av_lazy.av_free)
#define av_freep (*av_lazy.av_freep)
#define av_log_set_level (*av_lazy.av_log_set_level)
#define av_malloc (*av_lazy.av_malloc)
#define av_mallocz (*av_lazy.av_mallocz)
#define av_strerror (*av_lazy.av_strerror)
#define sws_freeContext (*av_lazy.sws_freeContext)
#define sws_getCachedContext (*av_lazy.sws_getCachedContext)
#define sws_getContext (*av_lazy.sws_getContext)
#define sws_scale (*av_lazy.sws_scale)
#endif

#endif
