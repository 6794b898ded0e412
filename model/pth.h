/* pth.h -- PyTorch checkpoints as released (`torch.save` of a state dict),
 * read without running anything.
 *
 * A `.pth` file is a zip archive: `<root>/data.pkl` (a pickle of the state
 * dict), `<root>/data/<key>` (one storage per key, little-endian) and a few
 * small records (`version`, `byteorder`, `.data/serialization_id`). The
 * reader understands only what a saved dict of tensors needs: the zip
 * container (stored entries, as torch writes them; local and central
 * headers must agree, no entry may overlap another or reach past the
 * file), the pickle opcodes torch.save emits for it (protocol 2: PROTO,
 * EMPTY_DICT, MARK, BINUNICODE, BININT*, TUPLE*, BINPERSID, REDUCE,
 * SETITEMS, BINGET/BINPUT, NEWFALSE/TRUE, EMPTY_TUPLE, GLOBAL, STOP, ...)
 * and these globals only: collections.OrderedDict,
 * torch._utils._rebuild_tensor_v2, torch._utils._rebuild_parameter and the
 * storage types torch.{Float,BFloat16,Half}Storage. Any other global is
 * refused by name, before anything is built; so are dtypes other than F32,
 * BF16 and F16, a storage too small for the shape, stride and offset it is
 * viewed with, and a declared size beyond the file. Strided views are
 * copied out contiguous.
 *
 * The result is an ordinary st_file_t (model/safetensors.h): every loader
 * reads `.pth` and `.safetensors` copies of the same weights alike. */
#ifndef REEL_MODEL_PTH_H
#define REEL_MODEL_PTH_H

#include <stdbool.h>
#include <stddef.h>
#include "model/safetensors.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Largest pickle accepted (a state dict of thousands of tensors is a few
 * hundred KiB). */
#define PTH_MAX_PICKLE_BYTES ((size_t)64 << 20)

/* Reads the checkpoint at path. NULL with a message naming the file and,
 * where one is involved, the key, global or zip entry. */
st_file_t *pth_load(const char *path);
/* The same over len bytes in memory (copied as needed; the caller keeps
 * buf); messages name origin. What the fuzzer drives. */
st_file_t *pth_parse(const void *buf, size_t len, const char *origin);
/* True when the first bytes look like a zip archive ("PK\3\4"). */
bool pth_sniff(const void *head, size_t n);
/* A weights file of either kind, told apart by its first bytes: a `.pth`
 * zip checkpoint through pth_load, anything else through st_open. */
st_file_t *weights_open_any(const char *path);

#ifdef __cplusplus
}
#endif
#endif
