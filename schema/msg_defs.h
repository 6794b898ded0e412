/* msg_defs.h -- how the tables of schema/msg_defs.c describe a message
 * (internal to schema/). Each body struct has a table: one row per field
 * with its key, kind, where it lives in the struct, whether it is
 * required, its range or default. msg.c decodes, encodes and checks every
 * message by walking these rows, so a key, a type, a default or a limit is
 * written once. */
#ifndef REEL_SCHEMA_MSG_DEFS_H
#define REEL_SCHEMA_MSG_DEFS_H

#include <stddef.h>
#include <stdint.h>
#include "schema/msg.h"

typedef enum {
    FK_U64,      /* uint64_t: a non-negative integer in [lo, hi] */
    FK_I64,      /* int64_t: any integer */
    FK_F64,      /* double: any finite number (integer or float) */
    FK_BOOL,     /* bool: true or false, nothing else */
    FK_NAME,     /* char[size]: 1..size-1 of the name alphabet */
    FK_TEXT,     /* char[size]: a string of at most size-1 bytes, no NUL */
    FK_SHA256,   /* char[65]: 64 hex digits */
    FK_HASH,     /* uint64_t <-> 1..16 hex digits */
    FK_STR,      /* const char *: any string, copied to the arena */
    FK_SHAPE4,   /* int64_t[4] <-> [4 non-negative integers] */
    FK_COUNTS,   /* {int n; msg_count_t e[cap]} <-> {name: non-negative integer} */
    FK_TEXTS,    /* msg_texts_t <-> {name: text} */
    FK_HASHES,   /* uint64_t[cap] + int count at off2 <-> [hash...] */
    FK_U64S,     /* uint64_t[cap] + int count at off2 <-> [non-negative integer...] */
    FK_NAMES,    /* char (*)[MSG_NAME_MAX] + size_t count at off2 <-> [name...] (arena) */
    FK_STRUCT,   /* a struct described by sub <-> a map */
    FK_STRUCTS,  /* sub's struct * + size_t count at off2 <-> [map...] (arena) */
} msg_kind_t;

enum {
    F_REQ = 1,   /* decoding fails when it is absent */
    F_OMIT = 2,  /* encoding leaves it out when it holds its default / nothing */
    F_NONEMPTY = 4, /* FK_U64S: an array given must have an entry (absent is not the same as []) */
};

typedef struct msg_table msg_table_t;

typedef struct {
    const char *key;
    uint8_t klen;             /* strlen(key) */
    uint8_t kind;             /* msg_kind_t */
    uint8_t flags;
    uint32_t off, size;       /* the member */
    uint32_t off2;            /* FK_HASHES, FK_U64S, FK_NAMES, FK_STRUCTS: the count member */
    uint64_t lo, hi;          /* FK_U64 range */
    double def;               /* FK_U64, FK_I64, FK_F64, FK_BOOL default */
    const char *sdef;         /* FK_NAME, FK_TEXT default */
    const msg_table_t *sub;   /* FK_STRUCT, FK_STRUCTS */
} msg_field_t;

struct msg_table {
    const msg_field_t *f;
    int n;
    size_t size;              /* of the struct */
};

/* Which tensors a type carries: named slots (const wire_tensor_t *
 * members), any names (msg_sync_t's list), or none. */
typedef struct {
    const char *name;
    uint32_t off;
} msg_slot_t;

typedef struct {
    const char *type;                 /* "GEN" */
    const msg_table_t *body;          /* NULL: no fields */
    const msg_slot_t *slots;          /* NULL-terminated; NULL: none (unless any) */
    const char *slot_list;            /* "context, uncond and latent", for messages */
    bool any_tensors;                 /* msg_sync_t: n_tensors/tensors */
    void (*after)(void *body, const wire_msg_t *m); /* defaults that depend on other fields */
} msg_desc_t;

extern const msg_desc_t msg_descs[MSG_UNKNOWN];

#endif
