/* The spans, of every kind, of an OTLP ExportTraceServiceRequest as columns, read straight from its protobuf bytes.
 *
 * The receiver's fast path (otlp_spans.py). Reading spans field by field from Python costs microseconds per
 * span; here it is a pass over the bytes, without the interpreter lock, that yields the columns in Arrow's
 * layouts. It reads the canonical encoding that the OpenTelemetry SDKs and the Collector write, and checks it
 * as strictly as the protobuf runtime does, down to attribute values nobody keeps: every length, varint, wire
 * type, nesting level and UTF-8 string. Anything outside that (a field it does not know,
 * a singular field given twice, a group, deep nesting, a span the receiver would refuse) makes it decline,
 * and the request takes the general path (otlp_proto.py), which decides what is valid and says why. So this
 * file never refuses a request; it only declines to be fast.
 *
 * Attributes are matched against keys given by the caller (otlp_spans.SLOT_KEYS): eighteen in the SLOT_* order
 * below, then those of the token timings' groups (TokenGroup) in turn; the semantics of each (which one wins, the
 * 253-character bound, what counts as empty, Envoy's node id, status texts and upstream cluster names) are those
 * of otlp_common.py, and of token_timings.py for an inference request's token timings.
 *
 * count() is the other walk here: what any export request (traces, metrics or logs) would cost to decode, counted
 * from its bytes before either path decodes it, so that the receiver's item limits hold on both.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "arrow_c_data.h"

enum { WT_VARINT = 0, WT_FIXED64 = 1, WT_LEN = 2, WT_START_GROUP = 3, WT_END_GROUP = 4, WT_FIXED32 = 5 };
enum { OK = 0, DECLINE = 1, NO_MEMORY = 2 };  /* DECLINE is 1, what || of checks yields */

#define MAX_NESTING 16      /* attribute values within values; far inside the protobuf runtime's 100 levels */
#define MAX_READ_NESTING 8  /* otlp_common.MAX_ATTRIBUTE_DEPTH: the general path refuses deeper values it reads */
#define MAX_NAME_CHARS 253  /* otlp_common.MAX_NAME_LENGTH */
#define SPAN_KIND_INTERNAL 1  /* what an unspecified kind (0) is kept as */
#define SPAN_KIND_SERVER 2    /* a request */
#define SPAN_KIND_LAST 5      /* CONSUMER: the general path refuses a kind past it */
#define STATUS_CODE_ERROR 2

/* Attribute slots, in the order of the caller's key tuple: these, then the token groups' (Keys.group_start). */
enum {
    SLOT_K8S_NODE, SLOT_HOST, SLOT_GPU, SLOT_POD, SLOT_NAMESPACE, SLOT_POD_IP, /* resource, and span overrides */
    SLOT_SERVICE,                                                   /* resource only */
    SLOT_STATUS, SLOT_STATUS_OLD, SLOT_ROUTE, SLOT_TIER, SLOT_TIER_ISTIO, /* span only */
    SLOT_ENVOY_NODE, SLOT_CANONICAL_SERVICE,
    SLOT_PEER_SERVICE, SLOT_UPSTREAM_CLUSTER, SLOT_SERVER_ADDRESS, SLOT_PEER_NAME, /* the peer, first given first */
    BASE_SLOTS
};
#define MAX_SLOTS 64  /* the bits of a slot mask */
#define SLOT(k) ((uint64_t)1 << (k))
#define RESOURCE_SLOTS (SLOT(SLOT_K8S_NODE) | SLOT(SLOT_HOST) | SLOT(SLOT_GPU) | SLOT(SLOT_POD) | \
                        SLOT(SLOT_NAMESPACE) | SLOT(SLOT_POD_IP) | SLOT(SLOT_SERVICE))

/* The token timings' groups of keys (token_timings.py: TTFT_ATTRIBUTES, ...), in the order of the caller's group
 * sizes (otlp_spans.TOKEN_GROUPS). Each is read from the first of its keys the span gives: the keys of a group
 * take consecutive slots, in the order token_timings reads them, so that a key more is a key more in Python. */
enum { TG_TTFT, TG_QUEUE, TG_TPOT, TG_DECODE, TG_PROMPT, TG_OUTPUT, TG_MODEL, N_GROUPS };
#define SLACK_MS 1.0                    /* token_timings.SLACK_MS */
#define MAX_TOKENS ((int64_t)INT32_MAX) /* token_timings.MAX_TOKENS */
#define MAX_MODEL_CHARS 253             /* token_timings.MAX_MODEL_LENGTH */

typedef struct { const uint8_t *p, *end; } Slice;
#define KEY_LENGTHS 64  /* keys of this length or more share the last entry of Keys.by_length */
/* by_length: the slots whose key has each length, so that most attributes (Envoy writes twenty per span) are
 * passed over without comparing their key to any. number_slots: those that take a double (token times and
 * counts); any other slot's double is text in the general path. */
typedef struct {
    Slice keys[MAX_SLOTS];
    uint64_t by_length[KEY_LENGTHS];
    int n;                          /* slots in all */
    int group_start[N_GROUPS + 1];  /* group g: slots group_start[g] up to group_start[g + 1] */
    uint64_t span_slots, number_slots;
} Keys;

/* V_ONE_STRING: an array of exactly one string, as semantic conventions type http.request.header.*; i: an
 * integer, or a double's bits */
enum { V_ABSENT, V_NONE, V_STRING, V_ONE_STRING, V_BOOL, V_INT, V_DOUBLE, V_BYTES, V_NESTED };
typedef struct { int kind; Slice s; int64_t i; } Value;
/* tokens: whether any token group's key was given; only then are the token slots cleared, and read (most spans
 * give none, and clearing every slot would cost them a third more than the eighteen) */
typedef struct { int tokens; Value v[MAX_SLOTS]; } Kept;

/* No slot given. */
static void kept_clear(Kept *kept)
{
    kept->tokens = 0;
    for (int k = 0; k < BASE_SLOTS; k++)
        kept->v[k].kind = V_ABSENT;
}

/* A token slot about to be kept: the first of the span's clears them all. */
static void tokens_given(Kept *kept, int n_slots)
{
    if (kept->tokens)
        return;
    kept->tokens = 1;
    for (int k = BASE_SLOTS; k < n_slots; k++)
        kept->v[k].kind = V_ABSENT;
}

/* --- wire format ------------------------------------------------------------------------------------ */

/* A varint of at most max_bytes bytes: 10 for values, 5 for tags and lengths (the runtime reads no longer ones). */
static int varint_of(Slice *s, int max_bytes, uint64_t *out)
{
    uint64_t v = 0;
    for (int k = 0; k < max_bytes; k++) {
        if (s->p >= s->end)
            return DECLINE;
        uint8_t b = *s->p++;
        if (k == 9 && b > 1)
            return DECLINE;
        v |= (uint64_t)(b & 0x7f) << (7 * k);
        if (!(b & 0x80)) {
            *out = v;
            return OK;
        }
    }
    return DECLINE;
}

static int varint(Slice *s, uint64_t *out)
{
    return varint_of(s, 10, out);
}

static int tag(Slice *s, uint32_t *field, uint32_t *wire_type)
{
    uint64_t t;
    if (varint_of(s, 5, &t) || t > UINT32_MAX || (t >> 3) == 0)
        return DECLINE;
    *field = (uint32_t)(t >> 3);
    *wire_type = (uint32_t)(t & 7);
    return OK;
}

static int length_delimited(Slice *s, uint32_t wire_type, Slice *out)
{
    uint64_t n;
    if (wire_type != WT_LEN || varint_of(s, 5, &n) || n >= INT32_MAX || n > (uint64_t)(s->end - s->p))
        return DECLINE;
    out->p = s->p;
    out->end = s->p + n;
    s->p += n;
    return OK;
}

static int fixed(Slice *s, uint32_t wire_type, uint64_t *out)
{
    int n = wire_type == WT_FIXED64 ? 8 : wire_type == WT_FIXED32 ? 4 : 0;
    if (n == 0 || s->end - s->p < n)
        return DECLINE;
    uint64_t v = 0;
    for (int k = n - 1; k >= 0; k--)
        v = (v << 8) | s->p[k];
    s->p += n;
    *out = v;
    return OK;
}

static int scalar_varint(Slice *s, uint32_t wire_type, uint64_t *out)
{
    return wire_type == WT_VARINT ? varint(s, out) : DECLINE;
}

/* An enum or int32 as canonically written: the runtime would truncate anything wider. */
static int int32_varint(Slice *s, uint32_t wire_type, int64_t *out)
{
    uint64_t v;
    if (scalar_varint(s, wire_type, &v) || v > INT32_MAX)
        return DECLINE;
    *out = (int64_t)v;
    return OK;
}

static int valid_utf8(Slice s)
{
    const uint8_t *p = s.p, *end = s.end;
    while (p < end) {
        if (end - p >= 8) {
            uint64_t chunk;
            memcpy(&chunk, p, 8);
            if (!(chunk & 0x8080808080808080ULL)) {
                p += 8;
                continue;
            }
        }
        uint8_t c = *p;
        if (c < 0x80) {
            p++;
            continue;
        }
        int n;
        uint32_t cp;
        if ((c & 0xe0) == 0xc0) {
            n = 2;
            cp = c & 0x1f;
        } else if ((c & 0xf0) == 0xe0) {
            n = 3;
            cp = c & 0x0f;
        } else if ((c & 0xf8) == 0xf0) {
            n = 4;
            cp = c & 0x07;
        } else {
            return 0;
        }
        if (end - p < n)
            return 0;
        for (int k = 1; k < n; k++) {
            if ((p[k] & 0xc0) != 0x80)
                return 0;
            cp = (cp << 6) | (p[k] & 0x3f);
        }
        if ((n == 2 && cp < 0x80) || (n == 3 && cp < 0x800) || (n == 4 && cp < 0x10000) || cp > 0x10ffff ||
            (cp >= 0xd800 && cp <= 0xdfff))
            return 0;
        p += n;
    }
    return 1;
}

static int string_field(Slice *s, uint32_t wire_type, Slice *out)
{
    return length_delimited(s, wire_type, out) || !valid_utf8(*out) ? DECLINE : OK;
}

/* Each singular field may appear once: a repeat would be merged or overridden, which the general path does. */
static int first_time(uint32_t *seen, uint32_t field)
{
    if (field >= 32 || (*seen & (1u << field)))
        return 0;
    *seen |= 1u << field;
    return 1;
}

/* --- attributes (common.proto) ---------------------------------------------------------------------- */

static int any_value(Slice m, int depth, int limit, Value *out);

/* key and value: empty when absent (an absent value reads as an empty AnyValue, as the runtime gives it). */
static int key_value(Slice m, Slice *key, Slice *value)
{
    uint32_t seen = 0, field, wt;
    key->p = key->end = value->p = value->end = m.p;
    while (m.p < m.end) {
        if (tag(&m, &field, &wt) || !first_time(&seen, field))
            return DECLINE;
        if (field == 1) {
            if (string_field(&m, wt, key))
                return DECLINE;
        } else if (field == 2) {
            if (length_delimited(&m, wt, value))
                return DECLINE;
        } else {
            return DECLINE;
        }
    }
    return OK;
}

/* out: V_ONE_STRING and its string when the array holds exactly one string, else V_NESTED. */
static int array_value(Slice m, int depth, int limit, Value *out)
{
    uint32_t field, wt;
    Slice item;
    Value first = {V_NESTED, {m.p, m.p}, 0}, other;
    int count = 0;
    while (m.p < m.end) {
        if (tag(&m, &field, &wt) || field != 1 || length_delimited(&m, wt, &item) ||
            any_value(item, depth, limit, count ? &other : &first))
            return DECLINE;
        count++;
    }
    out->kind = count == 1 && first.kind == V_STRING ? V_ONE_STRING : V_NESTED;
    out->s = first.s;
    return OK;
}

static int key_value_list(Slice m, int depth, int limit)
{
    uint32_t field, wt;
    Slice item, key, value;
    Value ignored;
    while (m.p < m.end) {
        if (tag(&m, &field, &wt) || field != 1 || length_delimited(&m, wt, &item) ||
            key_value(item, &key, &value) || any_value(value, depth, limit, &ignored))
            return DECLINE;
    }
    return OK;
}

/* depth counts as the general path's any_value does: 0 for an attribute's value, +1 per array or list. */
static int any_value(Slice m, int depth, int limit, Value *out)
{
    uint32_t field, wt;
    uint64_t v;
    if (depth > limit)
        return DECLINE;
    out->kind = V_NONE;
    for (int fields = 0; m.p < m.end; fields++) {
        if (fields == 1 || tag(&m, &field, &wt))  /* one member of the oneof, once */
            return DECLINE;
        switch (field) {
        case 1:
            if (string_field(&m, wt, &out->s))
                return DECLINE;
            out->kind = V_STRING;
            break;
        case 2:
            if (scalar_varint(&m, wt, &v))
                return DECLINE;
            out->kind = V_BOOL;
            break;
        case 3:
            if (scalar_varint(&m, wt, &v))
                return DECLINE;
            out->kind = V_INT;
            out->i = (int64_t)v;
            break;
        case 4:
            if (wt != WT_FIXED64 || fixed(&m, wt, &v))
                return DECLINE;
            out->kind = V_DOUBLE;
            out->i = (int64_t)v;
            break;
        case 5: {
            Slice sub;
            if (length_delimited(&m, wt, &sub) || array_value(sub, depth + 1, limit, out))
                return DECLINE;
            break;
        }
        case 6: {
            Slice sub;
            if (length_delimited(&m, wt, &sub) || key_value_list(sub, depth + 1, limit))
                return DECLINE;
            out->kind = V_NESTED;
            break;
        }
        case 7:
            if (length_delimited(&m, wt, &out->s))
                return DECLINE;
            out->kind = V_BYTES;
            break;
        default:
            return DECLINE;
        }
    }
    return OK;
}

static size_t length_entry(size_t n)
{
    return n < KEY_LENGTHS ? n : KEY_LENGTHS - 1;
}

static int slot_of(const Keys *keys, Slice key, uint64_t slots)
{
    size_t n = (size_t)(key.end - key.p);
    for (uint64_t candidates = keys->by_length[length_entry(n)] & slots; candidates; candidates &= candidates - 1) {
        int k = __builtin_ctzll(candidates);
        const Slice *want = &keys->keys[k];
        /* the last byte first: keys of one length mostly differ there (upstream_address, upstream_cluster) */
        if ((size_t)(want->end - want->p) == n && (n == 0 || (want->p[n - 1] == key.p[n - 1] &&
                                                              memcmp(want->p, key.p, n - 1) == 0)))
            return k;
    }
    return -1;
}

/* One attribute of a resource or span: checked whole; its value kept (last one wins) when its key has a
 * slot. Values the receiver reads, and every resource value, are bounded as the general path bounds them. */
static int attribute(Slice m, const Keys *keys, uint64_t slots, int read_all, Kept *kept)
{
    Slice key, value;
    Value v;
    if (key_value(m, &key, &value))
        return DECLINE;
    int slot = slots ? slot_of(keys, key, slots) : -1;
    if (any_value(value, 0, (slot >= 0 || read_all) ? MAX_READ_NESTING : MAX_NESTING, &v))
        return DECLINE;
    if (slot >= 0) {
        /* A structure where a name or a code belongs, or a value the general path turns into text (bytes as
         * hex, doubles that are not finite, but where a number belongs): it says what those mean. */
        if (v.kind == V_NESTED || v.kind == V_BYTES || (v.kind == V_DOUBLE && !(keys->number_slots & SLOT(slot))))
            return DECLINE;
        if (slot >= BASE_SLOTS)
            tokens_given(kept, keys->n);
        kept->v[slot] = v;
    }
    return OK;
}

static int plain_attribute(Slice *m, uint32_t wt)
{
    Slice item;
    return length_delimited(m, wt, &item) || attribute(item, NULL, 0, 0, NULL) ? DECLINE : OK;
}

/* --- output ----------------------------------------------------------------------------------------- */

typedef struct { uint8_t *data; size_t len, cap; } Buf;

static int buf_grow(Buf *b, size_t n)
{
    size_t cap = b->cap ? b->cap * 2 : 4096;
    while (cap < b->len + n)
        cap *= 2;
    uint8_t *data = realloc(b->data, cap);
    if (!data)
        return NO_MEMORY;
    b->data = data;
    b->cap = cap;
    return OK;
}

/* Inline, as a row adds to some thirty buffers: the copy of a few bytes, once the compiler knows how many. */
static inline int buf_add(Buf *b, const void *src, size_t n)
{
    if (n == 0)
        return OK;
    if (b->len + n > b->cap && buf_grow(b, n))
        return NO_MEMORY;
    memcpy(b->data + b->len, src, n);
    b->len += n;
    return OK;
}

/* n bytes of zeros: null rows of a column. */
static int buf_zeros(Buf *b, size_t n)
{
    if (n == 0)
        return OK;
    if (b->len + n > b->cap && buf_grow(b, n))
        return NO_MEMORY;
    memset(b->data + b->len, 0, n);
    b->len += n;
    return OK;
}

/* The distinct strings of a request, each stored once; index 0 is None. */
typedef struct { Slice *items; size_t count, cap; int32_t *slots; size_t n_slots; } Strings;

static uint64_t hash_of(Slice s)
{
    uint64_t h = 1469598103934665603ULL;
    for (const uint8_t *p = s.p; p < s.end; p++)
        h = (h ^ *p) * 1099511628211ULL;
    return h;
}

static int strings_grow(Strings *t)
{
    size_t n_slots = t->n_slots ? t->n_slots * 2 : 256;
    int32_t *slots = malloc(n_slots * sizeof *slots);
    Slice *items = realloc(t->items, (n_slots / 2) * sizeof *items);
    if (!slots || !items) {
        free(slots);
        if (items)
            t->items = items;
        return NO_MEMORY;
    }
    t->items = items;
    t->cap = n_slots / 2;
    for (size_t k = 0; k < n_slots; k++)
        slots[k] = -1;
    for (size_t k = 1; k < t->count; k++) {
        size_t at = hash_of(items[k]) & (n_slots - 1);
        while (slots[at] >= 0)
            at = (at + 1) & (n_slots - 1);
        slots[at] = (int32_t)k;
    }
    free(t->slots);
    t->slots = slots;
    t->n_slots = n_slots;
    return OK;
}

static int intern(Strings *t, Slice s, int32_t *index)
{
    if (t->count + 1 >= t->cap && strings_grow(t))
        return NO_MEMORY;
    size_t n = (size_t)(s.end - s.p), at = hash_of(s) & (t->n_slots - 1);
    for (; t->slots[at] >= 0; at = (at + 1) & (t->n_slots - 1)) {
        Slice *have = &t->items[t->slots[at]];
        if ((size_t)(have->end - have->p) == n && memcmp(have->p, s.p, n) == 0) {
            *index = t->slots[at];
            return OK;
        }
    }
    t->slots[at] = (int32_t)t->count;
    t->items[t->count] = s;
    *index = (int32_t)t->count++;
    return OK;
}

/* The first max_chars characters (code points, as Python slices) of a valid UTF-8 string. */
static Slice bounded_to(Slice s, int max_chars)
{
    if (s.end - s.p <= max_chars)  /* no more characters than bytes */
        return s;
    int chars = 0;
    for (const uint8_t *p = s.p; p < s.end; p++) {
        if ((*p & 0xc0) != 0x80 && chars++ == max_chars) {
            s.end = p;
            break;
        }
    }
    return s;
}

static Slice bounded(Slice s)
{
    return bounded_to(s, MAX_NAME_CHARS);
}

/* Columns of names, as Arrow string views: per row 16 bytes (the length, then the string itself when it has at
 * most 12 bytes, else its first 4 bytes, buffer 0 and its offset in the column's bytes) and a validity byte. Views
 * are what polars keeps strings as, so they need no conversion there. */
enum { COL_SERVICE, COL_NODE, COL_GPU, COL_POD, COL_NAMESPACE, COL_POD_IP, COL_ROUTE, COL_PEER, N_TEXT };
static const char *TEXT_COLUMNS[N_TEXT] = {"service", "node", "gpu_id", "pod", "namespace", "pod_ip", "route",
                                           "peer"};
typedef struct { Buf views, bytes, valid; } TextColumn;

/* A name of a row: absent (null) or a string bounded to MAX_NAME_CHARS. */
typedef struct { int present; Slice s; } Text;

/* The token timings' columns (token_timings.Tokens; analytics.frames.TOKEN_COLUMNS): the model's, then numbers
 * of 8 bytes (doubles, then int64s) and a validity byte per row. Most spans give none, so the columns hold rows
 * only up to the last span that does, and are padded with nulls when the next one does and at the end: a
 * request of plain spans costs one pass of zeros, not a write per row. */
enum { NUM_TTFT, NUM_TPOT, NUM_QUEUE, NUM_PROMPT, NUM_OUTPUT, N_NUMBERS };
static const char *NUMBER_COLUMNS[N_NUMBERS] = {"ttft_ms", "tpot_ms", "queue_ms", "prompt_tokens",
                                                "output_tokens"};
static const char *NUMBER_FORMATS[N_NUMBERS] = {"g", "g", "g", "l", "l"};
typedef struct { Buf values, valid; } NumberColumn;
typedef struct {
    TextColumn model;
    NumberColumn number[N_NUMBERS];
    Py_ssize_t rows;              /* what the columns hold so far */
    Py_ssize_t invalid, absent;   /* spans counted as token_timings_invalid, token_timings_absent */
} TokenColumns;

typedef struct {
    const Keys *keys;
    Strings tier_headers;  /* the tier header is enrich's to resolve: each distinct one once */
    Buf trace_hi, trace_lo, span_id, parent_id, parent_valid, kind, start_ns, end_ns, status_code, status_valid,
        failed, tier_header;
    TextColumn text[N_TEXT];
    TokenColumns tokens;
    Py_ssize_t rows;
    int taken;  /* by batch(): the buffers are the record batch's */
} Decoder;

/* A non-empty string attribute, bounded; else absent. */
static Text text_of(const Value *v)
{
    Text t = {v->kind == V_STRING && v->s.end > v->s.p, v->s};
    if (t.present)
        t.s = bounded(t.s);
    return t;
}

static Text first_text(const Kept *kept, int slot_a, int slot_b)
{
    Text t = text_of(&kept->v[slot_a]);
    return t.present || slot_b < 0 ? t : text_of(&kept->v[slot_b]);
}

/* What a resource says about its spans (otlp_common.SpanResource). */
typedef struct { Text text[COL_POD_IP + 1]; } Resource;

static int resource(const Decoder *d, Slice m, Resource *out)
{
    Kept kept;
    uint32_t seen = 0, field, wt;
    uint64_t v;
    static const uint8_t unknown_service[] = "unknown_service";
    kept_clear(&kept);
    while (m.p < m.end) {
        if (tag(&m, &field, &wt))
            return DECLINE;
        if (field == 1) {
            Slice item;
            if (length_delimited(&m, wt, &item) || attribute(item, d->keys, RESOURCE_SLOTS, 1, &kept))
                return DECLINE;
        } else if (field == 2 && first_time(&seen, field)) {
            if (scalar_varint(&m, wt, &v))
                return DECLINE;
        } else {
            return DECLINE;
        }
    }
    out->text[COL_SERVICE] = text_of(&kept.v[SLOT_SERVICE]);
    if (!out->text[COL_SERVICE].present)
        out->text[COL_SERVICE] = (Text){1, {unknown_service, unknown_service + sizeof unknown_service - 1}};
    out->text[COL_NODE] = first_text(&kept, SLOT_K8S_NODE, SLOT_HOST);
    out->text[COL_GPU] = first_text(&kept, SLOT_GPU, -1);
    out->text[COL_POD] = first_text(&kept, SLOT_POD, -1);
    out->text[COL_NAMESPACE] = first_text(&kept, SLOT_NAMESPACE, -1);
    out->text[COL_POD_IP] = first_text(&kept, SLOT_POD_IP, -1);
    return OK;
}

/* The 16-byte view of a string whose long form goes to the end of `bytes` (buffer 0). */
static int add_view(uint8_t view[16], Slice s, Buf *bytes)
{
    size_t n = (size_t)(s.end - s.p);
    int32_t length = (int32_t)n, buffer = 0, offset = (int32_t)bytes->len;
    memset(view, 0, 16);
    memcpy(view, &length, 4);
    if (n <= 12) {
        memcpy(view + 4, s.p, n);
        return OK;
    }
    memcpy(view + 4, s.p, 4);
    memcpy(view + 8, &buffer, 4);
    memcpy(view + 12, &offset, 4);
    return buf_add(bytes, s.p, n);
}

static inline int add_text(TextColumn *c, Text t)
{
    uint8_t valid = (uint8_t)t.present, view[16] = {0};
    if (t.present && add_view(view, t.s, &c->bytes))
        return NO_MEMORY;
    return buf_add(&c->views, view, 16) || buf_add(&c->valid, &valid, 1) ? NO_MEMORY : OK;
}

/* --- spans (trace.proto) ---------------------------------------------------------------------------- */

/* A message the receiver reads nothing of, checked whole. layout[k] is the type of field k + 1: q fixed64,
 * i fixed32, v varint, s string, b bytes, a attribute (the one repeated field). */
static int checked_message(Slice m, const char *layout)
{
    uint32_t seen = 0, field, wt;
    size_t fields = strlen(layout);
    uint64_t v;
    Slice s;
    while (m.p < m.end) {
        if (tag(&m, &field, &wt) || field > fields)
            return DECLINE;
        char type = layout[field - 1];
        if (type != 'a' && !first_time(&seen, field))
            return DECLINE;
        int rc = type == 'q' ? (wt == WT_FIXED64 ? fixed(&m, wt, &v) : DECLINE)
                 : type == 'i' ? (wt == WT_FIXED32 ? fixed(&m, wt, &v) : DECLINE)
                 : type == 'v' ? scalar_varint(&m, wt, &v)
                 : type == 's' ? string_field(&m, wt, &s)
                 : type == 'b' ? length_delimited(&m, wt, &s)
                               : plain_attribute(&m, wt);
        if (rc)
            return DECLINE;
    }
    return OK;
}

/* trace.proto's Span.Event and Span.Link, common.proto's InstrumentationScope */
#define EVENT_LAYOUT "qsav"
#define LINK_LAYOUT "bbsavi"
#define SCOPE_LAYOUT "ssav"

static int status(Slice m, int64_t *code)
{
    uint32_t seen = 0, field, wt;
    Slice s;
    *code = 0;
    while (m.p < m.end) {
        if (tag(&m, &field, &wt) || !first_time(&seen, field))
            return DECLINE;
        int rc = field == 2 ? string_field(&m, wt, &s) : field == 3 ? int32_varint(&m, wt, code) : DECLINE;
        if (rc)
            return DECLINE;
    }
    return OK;
}

typedef struct {
    Slice trace_id, span_id, parent_id, name;
    int64_t kind, status_code;
    uint64_t start, end;
    Kept kept;  /* last: not zeroed whole (kept_clear marks what is read as not given) */
} SpanFields;

static int span_fields(Decoder *d, Slice m, SpanFields *f)
{
    uint32_t seen = 0, field, wt;
    uint64_t v;
    Slice s;
    memset(f, 0, offsetof(SpanFields, kept));
    kept_clear(&f->kept);
    f->trace_id.p = f->trace_id.end = f->span_id.p = f->span_id.end = f->name.p = f->name.end = m.p;
    f->parent_id = f->name;
    while (m.p < m.end) {
        if (tag(&m, &field, &wt))
            return DECLINE;
        int rc;
        switch (field) {
        case 9:
            rc = length_delimited(&m, wt, &s) || attribute(s, d->keys, d->keys->span_slots, 0, &f->kept);
            break;
        case 11:
            rc = length_delimited(&m, wt, &s) || checked_message(s, EVENT_LAYOUT);
            break;
        case 13:
            rc = length_delimited(&m, wt, &s) || checked_message(s, LINK_LAYOUT);
            break;
        default:
            if (!first_time(&seen, field))
                return DECLINE;
            switch (field) {
            case 1: rc = length_delimited(&m, wt, &f->trace_id); break;
            case 2: rc = length_delimited(&m, wt, &f->span_id); break;
            case 3: rc = string_field(&m, wt, &s); break;
            case 4: rc = length_delimited(&m, wt, &f->parent_id); break;
            case 5: rc = string_field(&m, wt, &f->name); break;
            case 6: rc = int32_varint(&m, wt, &f->kind); break;
            case 7: rc = wt == WT_FIXED64 ? fixed(&m, wt, &f->start) : DECLINE; break;
            case 8: rc = wt == WT_FIXED64 ? fixed(&m, wt, &f->end) : DECLINE; break;
            case 10: case 12: case 14: rc = scalar_varint(&m, wt, &v); break;
            case 15: rc = length_delimited(&m, wt, &s) || status(s, &f->status_code); break;
            case 16: rc = wt == WT_FIXED32 ? fixed(&m, wt, &v) : DECLINE; break;
            default: rc = DECLINE;
            }
        }
        if (rc)
            return DECLINE;
    }
    return OK;
}

static const Value *first_present(const Kept *kept, int slot_a, int slot_b)
{
    return kept->v[slot_a].kind != V_ABSENT ? &kept->v[slot_a] : &kept->v[slot_b];
}

static uint64_t big_endian_word(const uint8_t *p)
{
    uint64_t word = 0;
    for (int k = 0; k < 8; k++)
        word = word << 8 | p[k];
    return word;
}

static int starts_with(Slice s, const uint8_t *prefix, size_t n)
{
    return (size_t)(s.end - s.p) >= n && memcmp(s.p, prefix, n) == 0;
}

static int same(Slice s, const char *text)
{
    size_t n = strlen(text);
    return (size_t)(s.end - s.p) == n && memcmp(s.p, text, n) == 0;
}

/* Pod, namespace and pod IP from an Istio proxy's node id (otlp_common.envoy_node); 0 where it is none. */
static int envoy_node(Slice id, Text *pod, Text *namespace, Text *pod_ip)
{
    Slice parts[4];
    int n = 0;
    for (const uint8_t *from = id.p;;) {
        const uint8_t *tilde = memchr(from, '~', (size_t)(id.end - from));
        if (n == 4)
            return 0;
        parts[n++] = (Slice){from, tilde ? tilde : id.end};
        if (!tilde)
            break;
        from = tilde + 1;
    }
    if (n != 4 || !(same(parts[0], "sidecar") || same(parts[0], "router")))
        return 0;
    for (int k = 1; k < 4; k++)
        if (parts[k].end == parts[k].p)
            return 0;
    Slice ns = parts[3];
    const uint8_t *dot = memchr(ns.p, '.', (size_t)(ns.end - ns.p));
    if (dot)
        ns.end = dot;
    if (ns.end == ns.p)
        return 0;
    Slice name = parts[2];
    size_t suffix = (size_t)(ns.end - ns.p) + 1, len = (size_t)(name.end - name.p);
    if (len > suffix && name.p[len - suffix] == '.' && memcmp(name.p + len - suffix + 1, ns.p, suffix - 1) == 0)
        name.end -= suffix;
    *pod = (Text){1, bounded(name)};
    *namespace = (Text){1, bounded(ns)};
    *pod_ip = (Text){1, bounded(parts[1])};
    return 1;
}

/* The service of a span naming Istio's canonical service (otlp_common.mesh_service). */
static Text mesh_service(Text service, Text canonical)
{
    static const uint8_t unknown[] = "unknown_service";
    if (!canonical.present)
        return service;
    size_t n = (size_t)(canonical.s.end - canonical.s.p);
    Slice s = service.s;
    int envoy_default = starts_with(s, unknown, sizeof unknown - 1) || same(s, "istio-proxy") ||
                        (starts_with(s, canonical.s.p, n) && (size_t)(s.end - s.p) > n && s.p[n] == '.');
    return envoy_default ? canonical : service;
}

/* An HTTP status code given as decimal digits, as Envoy writes it; -1 for other text or one past 999. */
static int64_t status_of_text(Slice s)
{
    int64_t code = 0;
    if (s.p == s.end)
        return -1;
    for (const uint8_t *p = s.p; p < s.end; p++) {
        if (*p < '0' || *p > '9')
            return -1;
        code = code * 10 + (*p - '0');
        if (code > 999)
            return -1;
    }
    return code;
}

/* The peer an Envoy upstream cluster names (otlp_common.upstream_peer): an Istio cluster's
 * (DIRECTION|PORT|SUBSET|HOST) first DNS label of its host when outbound, none when inbound; any other name whole. */
static Text upstream_peer(Slice cluster)
{
    const uint8_t *bars[3];
    int n = 0;
    for (const uint8_t *bar = cluster.p; (bar = memchr(bar, '|', (size_t)(cluster.end - bar))); bar++) {
        if (n == 3)
            return (Text){1, bounded(cluster)};  /* more than four fields: not Istio's */
        bars[n++] = bar;
    }
    Slice direction = {cluster.p, n ? bars[0] : cluster.end};
    int outbound = same(direction, "outbound");
    if (n != 3 || !(outbound || same(direction, "inbound")))
        return (Text){1, bounded(cluster)};
    Slice host = {bars[2] + 1, cluster.end};
    const uint8_t *dot = memchr(host.p, '.', (size_t)(host.end - host.p));
    if (dot)
        host.end = dot;
    return (Text){outbound && host.end > host.p, bounded(host)};
}

/* What a span says it called (otlp_common.peer_of): the first peer slot that names something. */
static Text peer_of(const Kept *kept)
{
    Text peer = text_of(&kept->v[SLOT_PEER_SERVICE]);
    const Value *cluster = &kept->v[SLOT_UPSTREAM_CLUSTER];
    if (!peer.present && cluster->kind == V_STRING && cluster->s.end > cluster->s.p)
        peer = upstream_peer(cluster->s);
    return peer.present ? peer : first_text(kept, SLOT_SERVER_ADDRESS, SLOT_PEER_NAME);
}

/* --- token timings (token_timings.py) --------------------------------------------------------------- */

/* One of a span's token timings (a time in milliseconds or a count), or null. */
typedef struct { int present; union { double ms; int64_t n; } v; } Number;
typedef struct { Text model; Number number[N_NUMBERS]; } Tokens;

/* The value of the first of a group's keys the span gives (token_timings' read()), or NULL. */
static const Value *group_value(const Keys *keys, const Kept *kept, int group)
{
    for (int k = keys->group_start[group]; k < keys->group_start[group + 1]; k++)
        if (kept->v[k].kind != V_ABSENT)
            return &kept->v[k];
    return NULL;
}

static double double_of(const Value *v)
{
    double d;
    memcpy(&d, &v->i, sizeof d);
    return d;
}

/* The powers of ten a double holds exactly. */
static const double POWERS_OF_TEN[] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,  1e8,  1e9,  1e10, 1e11,
                                       1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};
#define EXACT_MANTISSA ((uint64_t)1 << 53)

enum { DURATION, NOT_A_DURATION, INEXACT };

static const uint8_t *past_digits(const uint8_t *p, const uint8_t *end)
{
    while (p < end && *p >= '0' && *p <= '9')
        p++;
    return p;
}

/* TGI's time as Rust's Debug text of a Duration ("1.25ms"; token_timings._DEBUG_DURATION), in milliseconds as
 * Python's float(digits) * unit gives them: the digits as an integer over a power of ten, both exact, whose one
 * division rounds as float() does (Clinger's fast path). INEXACT: digits past that, left to the general path. */
static int debug_duration_ms(Slice s, double *ms)
{
    static const struct { const char *unit; double ms; } units[] = {
        {"ns", 1e-6}, {"\xc2\xb5s", 1e-3}, {"us", 1e-3}, {"ms", 1.0}, {"s", 1e3}};  /* _UNIT_MS */
    Slice whole = {s.p, past_digits(s.p, s.end)}, fraction = {whole.end, whole.end};
    if (whole.end == whole.p)
        return NOT_A_DURATION;
    if (whole.end < s.end && *whole.end == '.') {  /* a dot only with digits after it */
        fraction.p = whole.end + 1;
        fraction.end = past_digits(fraction.p, s.end);
        if (fraction.end == fraction.p)
            return NOT_A_DURATION;
    }
    size_t unit = 0, n_units = sizeof units / sizeof *units;
    while (unit < n_units && !same((Slice){fraction.end, s.end}, units[unit].unit))
        unit++;
    if (unit == n_units)
        return NOT_A_DURATION;
    while (fraction.end > fraction.p && fraction.end[-1] == '0')  /* a fraction's last zeros change nothing */
        fraction.end--;
    size_t places = (size_t)(fraction.end - fraction.p);
    if (places >= sizeof POWERS_OF_TEN / sizeof *POWERS_OF_TEN)
        return INEXACT;
    uint64_t mantissa = 0;
    for (const Slice *part = &whole; part; part = part == &whole ? &fraction : NULL) {
        for (const uint8_t *p = part->p; p < part->end; p++) {
            mantissa = mantissa * 10 + (uint64_t)(*p - '0');  /* at most 2**53 before: no overflow */
            if (mantissa > EXACT_MANTISSA)
                return INEXACT;
        }
    }
    double number = (double)mantissa / POWERS_OF_TEN[places];
    *ms = number * units[unit].ms;
    return DURATION;
}

/* A time given in seconds, in milliseconds (token_timings._ms and _within); *invalid where token_timings leaves
 * it out. DECLINE: a text that only the general path converts. */
static int time_of(const Value *v, double duration_ms, Number *out, int *invalid)
{
    double ms;
    if (!v)
        return OK;
    if (v->kind == V_INT) {
        ms = (double)v->i * 1e3;  /* Python converts the int, then multiplies */
    } else if (v->kind == V_DOUBLE) {
        ms = double_of(v) * 1e3;  /* one that is not finite is text there, which no Debug duration matches */
    } else if (v->kind == V_STRING) {
        int text = debug_duration_ms(v->s, &ms);
        if (text == INEXACT)
            return DECLINE;
        if (text == NOT_A_DURATION) {
            *invalid = 1;
            return OK;
        }
    } else {  /* none, a boolean, an array: no number of seconds */
        *invalid = 1;
        return OK;
    }
    if (!(isfinite(ms) && ms >= 0.0) || ms > duration_ms + SLACK_MS) {
        *invalid = 1;
        return OK;
    }
    out->present = 1;
    out->v.ms = ms;
    return OK;
}

/* A token count (token_timings._count): an integer, or a double that is one, from 0 to MAX_TOKENS. */
static void count_of(const Value *v, Number *out, int *invalid)
{
    int64_t n = -1;
    if (!v)
        return;
    if (v->kind == V_INT) {
        n = v->i;
    } else if (v->kind == V_DOUBLE) {
        double d = double_of(v);  /* in range first: NaN and infinities fail it, and then the cast is defined */
        if (d >= 0.0 && d <= (double)MAX_TOKENS && (double)(int64_t)d == d)
            n = (int64_t)d;
    }
    if (n < 0 || n > MAX_TOKENS) {
        *invalid = 1;
        return;
    }
    out->present = 1;
    out->v.n = n;
}

/* The model (token_timings._model): a non-empty string, bounded. */
static void model_of(const Value *v, Text *out, int *invalid)
{
    if (!v)
        return;
    if (v->kind == V_STRING && v->s.end > v->s.p)
        *out = (Text){1, bounded_to(v->s, MAX_MODEL_CHARS)};
    else
        *invalid = 1;
}

/* A span's token timings (token_timings.token_timings), and whether it counts as token_timings_invalid or
 * token_timings_absent (`request`: a SERVER span). */
static int span_tokens(const Keys *keys, const Kept *kept, double duration_ms, int request, Tokens *t,
                       int *invalid, int *absent)
{
    static const int times[][2] = {{TG_TTFT, NUM_TTFT}, {TG_QUEUE, NUM_QUEUE}, {TG_TPOT, NUM_TPOT},
                                   {TG_DECODE, N_NUMBERS}};
    Number decode = {0}, *ttft = &t->number[NUM_TTFT], *tpot = &t->number[NUM_TPOT];
    Number *prompt = &t->number[NUM_PROMPT], *output = &t->number[NUM_OUTPUT];
    memset(t, 0, sizeof *t);
    *invalid = 0;
    for (size_t k = 0; k < sizeof times / sizeof *times; k++) {
        Number *out = times[k][1] < N_NUMBERS ? &t->number[times[k][1]] : &decode;
        if (time_of(group_value(keys, kept, times[k][0]), duration_ms, out, invalid))
            return DECLINE;
    }
    count_of(group_value(keys, kept, TG_PROMPT), prompt, invalid);
    count_of(group_value(keys, kept, TG_OUTPUT), output, invalid);
    if (!tpot->present && output->present && output->v.n >= 2) {
        /* per output token after the first: the decode time, or the rest of the request (Python's max()) */
        double after_first = (double)(output->v.n - 1);
        if (decode.present) {
            *tpot = (Number){1, {.ms = decode.v.ms / after_first}};
        } else if (ttft->present) {
            double rest = duration_ms - ttft->v.ms;
            if (0.0 > rest)
                rest = 0.0;
            *tpot = (Number){1, {.ms = rest / after_first}};
        }
    }
    model_of(group_value(keys, kept, TG_MODEL), &t->model, invalid);
    *absent = !*invalid && request && !ttft->present && (t->model.present || prompt->present || output->present);
    return OK;
}

/* Null rows until `rows`. */
static int tokens_pad(TokenColumns *c, Py_ssize_t rows)
{
    size_t n = (size_t)(rows - c->rows);
    if (n == 0)
        return OK;
    int failed = buf_zeros(&c->model.views, 16 * n) || buf_zeros(&c->model.valid, n);
    for (int k = 0; k < N_NUMBERS; k++)
        failed = failed || buf_zeros(&c->number[k].values, 8 * n) || buf_zeros(&c->number[k].valid, n);
    c->rows = rows;
    return failed ? NO_MEMORY : OK;
}

/* The token timings of row `row`, after null ones for the rows since the last span that gave any. */
static int tokens_add(TokenColumns *c, Py_ssize_t row, const Tokens *t)
{
    if (tokens_pad(c, row) || add_text(&c->model, t->model))
        return NO_MEMORY;
    for (int k = 0; k < N_NUMBERS; k++) {
        uint8_t valid = (uint8_t)t->number[k].present;
        if (buf_add(&c->number[k].values, &t->number[k].v, 8) || buf_add(&c->number[k].valid, &valid, 1))
            return NO_MEMORY;
    }
    c->rows = row + 1;
    return OK;
}

/* One row (otlp_common.append_span), or DECLINE where the general path would refuse the span. */
static int span_row(Decoder *d, const SpanFields *f, const Resource *r)
{
    const Kept *kept = &f->kept;
    if (f->trace_id.end - f->trace_id.p != 16 || f->span_id.end - f->span_id.p != 8)
        return DECLINE;
    if (f->start == 0 || f->end < f->start || f->end > INT64_MAX)
        return DECLINE;
    size_t parent_bytes = (size_t)(f->parent_id.end - f->parent_id.p);
    if (f->kind > SPAN_KIND_LAST || (parent_bytes != 0 && parent_bytes != 8))
        return DECLINE;
    uint8_t kind = f->kind ? (uint8_t)f->kind : SPAN_KIND_INTERNAL;
    uint64_t parent_id = parent_bytes ? big_endian_word(f->parent_id.p) : 0;
    uint8_t has_parent = parent_id != 0;  /* all zeros: no parent, as absent */
    Text text[N_TEXT];
    memcpy(text, r->text, sizeof r->text);
    static const int overrides[][3] = {{SLOT_K8S_NODE, SLOT_HOST, COL_NODE}, {SLOT_GPU, -1, COL_GPU},
                                       {SLOT_POD, -1, COL_POD}, {SLOT_NAMESPACE, -1, COL_NAMESPACE},
                                       {SLOT_POD_IP, -1, COL_POD_IP}};
    for (int k = 0; k < 5; k++) {
        Text over = first_text(kept, overrides[k][0], overrides[k][1]);
        if (over.present)
            text[overrides[k][2]] = over;
    }
    Text proxy[3];
    if (kept->v[SLOT_ENVOY_NODE].kind == V_STRING &&
        envoy_node(kept->v[SLOT_ENVOY_NODE].s, &proxy[0], &proxy[1], &proxy[2])) {
        static const int columns[3] = {COL_POD, COL_NAMESPACE, COL_POD_IP};
        for (int k = 0; k < 3; k++)
            if (!text[columns[k]].present)
                text[columns[k]] = proxy[k];
    }
    text[COL_SERVICE] = mesh_service(text[COL_SERVICE], text_of(&kept->v[SLOT_CANONICAL_SERVICE]));
    /* A span that names no node stays null here, as in the general path: enrich places it (GPU, else unknown). */
    const Value *route = &kept->v[SLOT_ROUTE];
    text[COL_ROUTE] = (Text){1, bounded(route->kind == V_STRING ? route->s : f->name)};
    text[COL_PEER] = peer_of(kept);

    const Value *code = first_present(kept, SLOT_STATUS, SLOT_STATUS_OLD);
    int16_t http_status = 0;
    int64_t given = code->kind == V_INT ? code->i : code->kind == V_STRING ? status_of_text(code->s) : -1;
    uint8_t has_status = code->kind == V_INT || code->kind == V_STRING;
    if (has_status && given >= 0 && given <= 999)
        http_status = (int16_t)given;
    else if (code->kind != V_ABSENT && code->kind != V_NONE)  /* other text, or out of range: the general path */
        return DECLINE;

    const Value *tier = first_present(kept, SLOT_TIER, SLOT_TIER_ISTIO);
    int32_t tier_header = 0;
    if (tier->kind == V_STRING || tier->kind == V_ONE_STRING) {  /* the same tier and counters (enrich.tiers) */
        if (intern(&d->tier_headers, tier->s, &tier_header))
            return NO_MEMORY;
    } else if (tier->kind != V_ABSENT && tier->kind != V_NONE) {
        return DECLINE;
    }

    uint8_t failed = f->status_code == STATUS_CODE_ERROR || (has_status && http_status >= 500);
    int64_t start = (int64_t)f->start, end = (int64_t)f->end;
    Tokens tokens;
    int token_invalid = 0, token_absent = 0;
    if (kept->tokens) {  /* the duration as times_as_stored gives it, and append_span to token_timings */
        double duration_ms = (double)(end - start) / 1e6;
        if (span_tokens(d->keys, kept, duration_ms, f->kind == SPAN_KIND_SERVER, &tokens, &token_invalid,
                        &token_absent))
            return DECLINE;
    }
    uint64_t trace_hi = big_endian_word(f->trace_id.p), trace_lo = big_endian_word(f->trace_id.p + 8),
             span_id = big_endian_word(f->span_id.p);  /* analytics/ids.py */
    if (buf_add(&d->trace_hi, &trace_hi, 8) || buf_add(&d->trace_lo, &trace_lo, 8) ||
        buf_add(&d->span_id, &span_id, 8) || buf_add(&d->parent_id, &parent_id, 8) ||
        buf_add(&d->parent_valid, &has_parent, 1) || buf_add(&d->kind, &kind, 1) || buf_add(&d->start_ns, &start, 8) ||
        buf_add(&d->end_ns, &end, 8) || buf_add(&d->status_code, &http_status, 2) ||
        buf_add(&d->status_valid, &has_status, 1) || buf_add(&d->failed, &failed, 1) ||
        buf_add(&d->tier_header, &tier_header, 4))
        return NO_MEMORY;
    for (int k = 0; k < N_TEXT; k++)
        if (add_text(&d->text[k], text[k]))
            return NO_MEMORY;
    if (kept->tokens && tokens_add(&d->tokens, d->rows, &tokens))
        return NO_MEMORY;
    d->tokens.invalid += token_invalid;
    d->tokens.absent += token_absent;
    d->rows++;
    return OK;
}

static int scope_spans(Decoder *d, Slice m, const Resource *r)
{
    uint32_t seen = 0, field, wt;
    Slice s;
    SpanFields f;
    while (m.p < m.end) {
        if (tag(&m, &field, &wt))
            return DECLINE;
        int rc;
        if (field == 2) {
            rc = length_delimited(&m, wt, &s) || span_fields(d, s, &f);
            if (!rc)
                rc = span_row(d, &f, r);
        } else if (!first_time(&seen, field)) {
            return DECLINE;
        } else if (field == 1) {
            rc = length_delimited(&m, wt, &s) || checked_message(s, SCOPE_LAYOUT);
        } else {
            rc = field == 3 ? string_field(&m, wt, &s) : DECLINE;
        }
        if (rc)
            return rc;
    }
    return OK;
}

/* ResourceSpans: the resource first, wherever it is written, then the spans. */
static int resource_spans(Decoder *d, Slice m)
{
    uint32_t seen = 0, field, wt;
    Slice s, res = {m.p, m.p};
    for (Slice scan = m; scan.p < scan.end;) {
        if (tag(&scan, &field, &wt))
            return DECLINE;
        if (field == 2) {
            if (length_delimited(&scan, wt, &s))
                return DECLINE;
        } else if (!first_time(&seen, field) || (field == 1   ? length_delimited(&scan, wt, &res)
                                                 : field == 3 ? string_field(&scan, wt, &s)
                                                              : DECLINE)) {
            return DECLINE;
        }
    }
    Resource r;
    int rc = resource(d, res, &r);
    while (!rc && m.p < m.end) {
        rc = tag(&m, &field, &wt);
        if (!rc)
            rc = length_delimited(&m, wt, &s);
        if (!rc && field == 2)
            rc = scope_spans(d, s, &r);
    }
    return rc;
}

static int request(Decoder *d, Slice m)
{
    uint32_t field, wt;
    Slice s;
    while (m.p < m.end) {
        if (tag(&m, &field, &wt) || field != 1 || length_delimited(&m, wt, &s))
            return DECLINE;
        int rc = resource_spans(d, s);
        if (rc)
            return rc;
    }
    return OK;
}

/* --- counting (count()) ----------------------------------------------------------------------------- */

/* What decoding a request would build, counted before anything decodes it (request_items.py): its items
 * (resources, scopes, spans, span events and links, metrics, data points, exemplars, log records), its attributes
 * (key-values at every level, and each value of an array within one) and its histogram buckets (bucket counts,
 * explicit bounds, summary quantiles). The walk stops as soon as a count passes its limit, so a bomb of millions of
 * empty items costs a pass over the bytes up to the limit, not a message per item. It judges nothing: bytes that
 * are not wire format end it, and the parser then refuses the request with its own error. */
enum { ITEMS, ATTRIBUTES, BUCKETS, N_TALLIES };
#define MAX_COUNTED_LEVELS 100  /* the parser's depth limit: deeper is refused, or cut away (nesting.py) */

typedef enum {
    K_LEAF, K_REQUEST, K_RESOURCE_BLOCK, K_RESOURCE, K_SCOPE_BLOCK, K_SCOPE, K_SPAN, K_EVENT, K_LINK, K_METRIC,
    K_NUMBERS, K_HISTOGRAM, K_EXPONENTIAL, K_SUMMARY, K_NUMBER_POINT, K_HISTOGRAM_POINT, K_EXPONENTIAL_POINT,
    K_BUCKETS, K_SUMMARY_POINT, K_EXEMPLAR, K_LOG, K_KEY_VALUE, K_ANY_VALUE, K_ARRAY, K_KEY_VALUE_LIST
} Kind;
enum { UNPACKED, PACKED_VARINT, PACKED_FIXED64 };

/* item: what a scope block holds, by signal. */
typedef struct { uint64_t n[N_TALLIES], max[N_TALLIES]; Kind item; } Tally;

/* A field of a message kind: the kind it holds (K_LEAF: nothing walked), the count each occurrence adds to
 * (-1: none), and for the repeated number fields of buckets, how they are packed. */
typedef struct { Kind kind; int tally, packed; } Field;

static Field counted_field(Kind kind, Kind item, uint32_t number)
{
    Field none = {K_LEAF, -1, UNPACKED}, attribute = {K_KEY_VALUE, ATTRIBUTES, UNPACKED};
    Field buckets = {K_LEAF, BUCKETS, PACKED_VARINT}, fixed_buckets = {K_LEAF, BUCKETS, PACKED_FIXED64};
    switch (kind) {
    case K_REQUEST: return number == 1 ? (Field){K_RESOURCE_BLOCK, ITEMS, UNPACKED} : none;
    case K_RESOURCE_BLOCK:
        return number == 1 ? (Field){K_RESOURCE, -1, UNPACKED}
             : number == 2 ? (Field){K_SCOPE_BLOCK, ITEMS, UNPACKED} : none;
    case K_RESOURCE: return number == 1 ? attribute : none;
    case K_SCOPE_BLOCK:
        return number == 1 ? (Field){K_SCOPE, -1, UNPACKED} : number == 2 ? (Field){item, ITEMS, UNPACKED} : none;
    case K_SCOPE: return number == 3 ? attribute : none;
    case K_SPAN:
        return number == 9 ? attribute : number == 11 ? (Field){K_EVENT, ITEMS, UNPACKED}
             : number == 13 ? (Field){K_LINK, ITEMS, UNPACKED} : none;
    case K_EVENT: return number == 3 ? attribute : none;
    case K_LINK: return number == 4 ? attribute : none;
    case K_METRIC:
        return number == 5 || number == 7 ? (Field){K_NUMBERS, -1, UNPACKED}
             : number == 9 ? (Field){K_HISTOGRAM, -1, UNPACKED} : number == 10 ? (Field){K_EXPONENTIAL, -1, UNPACKED}
             : number == 11 ? (Field){K_SUMMARY, -1, UNPACKED} : number == 12 ? attribute : none;
    case K_NUMBERS: return number == 1 ? (Field){K_NUMBER_POINT, ITEMS, UNPACKED} : none;
    case K_HISTOGRAM: return number == 1 ? (Field){K_HISTOGRAM_POINT, ITEMS, UNPACKED} : none;
    case K_EXPONENTIAL: return number == 1 ? (Field){K_EXPONENTIAL_POINT, ITEMS, UNPACKED} : none;
    case K_SUMMARY: return number == 1 ? (Field){K_SUMMARY_POINT, ITEMS, UNPACKED} : none;
    case K_NUMBER_POINT:
        return number == 7 ? attribute : number == 5 ? (Field){K_EXEMPLAR, ITEMS, UNPACKED} : none;
    case K_HISTOGRAM_POINT:
        return number == 9 ? attribute : number == 8 ? (Field){K_EXEMPLAR, ITEMS, UNPACKED}
             : number == 6 || number == 7 ? fixed_buckets : none;
    case K_EXPONENTIAL_POINT:
        return number == 1 ? attribute : number == 8 || number == 9 ? (Field){K_BUCKETS, -1, UNPACKED}
             : number == 11 ? (Field){K_EXEMPLAR, ITEMS, UNPACKED} : none;
    case K_BUCKETS: return number == 2 ? buckets : none;
    case K_SUMMARY_POINT:
        return number == 7 ? attribute : number == 6 ? (Field){K_LEAF, BUCKETS, UNPACKED} : none;
    case K_EXEMPLAR: return number == 7 ? attribute : none;
    case K_LOG: return number == 6 ? attribute : number == 5 ? (Field){K_ANY_VALUE, -1, UNPACKED} : none;
    case K_KEY_VALUE: return number == 2 ? (Field){K_ANY_VALUE, -1, UNPACKED} : none;
    case K_ANY_VALUE:
        return number == 5 ? (Field){K_ARRAY, -1, UNPACKED} : number == 6 ? (Field){K_KEY_VALUE_LIST, -1, UNPACKED}
                                                             : none;
    case K_ARRAY: return number == 1 ? (Field){K_ANY_VALUE, ATTRIBUTES, UNPACKED} : none;
    case K_KEY_VALUE_LIST: return number == 1 ? attribute : none;
    default: return none;
    }
}

static int tally_add(Tally *t, int tally, uint64_t n)
{
    t->n[tally] += n;
    return t->n[tally] > t->max[tally];  /* DECLINE: the walk stops */
}

/* How many numbers a packed field holds: a varint ends at each byte below 0x80. */
static uint64_t packed_numbers(Slice s, int packed)
{
    if (packed == PACKED_FIXED64)
        return (uint64_t)(s.end - s.p) / 8;
    uint64_t n = 0;
    for (const uint8_t *p = s.p; p < s.end; p++)
        n += *p < 0x80;
    return n;
}

static int skipped(Slice *m, uint32_t wire_type)
{
    uint64_t v;
    Slice s;
    return wire_type == WT_VARINT ? varint(m, &v) : wire_type == WT_LEN ? length_delimited(m, wire_type, &s)
                                                                       : fixed(m, wire_type, &v);
}

/* Past a group, whose content the parser keeps as unknown bytes: a loop, as groups may nest deep. */
static int skipped_group(Slice *m)
{
    uint32_t field, wt;
    for (uint64_t open = 1; open;) {
        if (tag(m, &field, &wt))
            return DECLINE;
        if (wt == WT_START_GROUP)
            open++;
        else if (wt == WT_END_GROUP)
            open--;
        else if (skipped(m, wt))
            return DECLINE;
    }
    return OK;
}

static int counted(Tally *t, Slice m, Kind kind, int level)
{
    uint32_t number, wt;
    Slice s;
    while (m.p < m.end) {
        if (tag(&m, &number, &wt))
            return DECLINE;
        Field f = counted_field(kind, t->item, number);
        if (wt == WT_START_GROUP) {
            if (skipped_group(&m))
                return DECLINE;
            continue;
        }
        if (wt != WT_LEN) {  /* a number: a bucket when a packed field's number is written alone */
            if (skipped(&m, wt) || (f.packed != UNPACKED && tally_add(t, BUCKETS, 1)))
                return DECLINE;
            continue;
        }
        if (length_delimited(&m, wt, &s))
            return DECLINE;
        if (f.packed != UNPACKED) {
            if (tally_add(t, BUCKETS, packed_numbers(s, f.packed)))
                return DECLINE;
            continue;
        }
        if ((f.tally >= 0 && tally_add(t, f.tally, 1)) ||
            (f.kind != K_LEAF && level < MAX_COUNTED_LEVELS && counted(t, s, f.kind, level + 1)))
            return DECLINE;
    }
    return OK;
}

/* --- Python ----------------------------------------------------------------------------------------- */

static void decoder_free(Decoder *d)
{
    Buf *bufs[] = {&d->trace_hi, &d->trace_lo, &d->span_id, &d->parent_id, &d->parent_valid, &d->kind,
                   &d->start_ns, &d->end_ns, &d->status_code, &d->status_valid, &d->failed, &d->tier_header};
    for (size_t k = 0; k < sizeof bufs / sizeof *bufs; k++)
        free(bufs[k]->data);
    for (int k = 0; k < N_TEXT; k++) {
        free(d->text[k].views.data);
        free(d->text[k].bytes.data);
        free(d->text[k].valid.data);
    }
    free(d->tokens.model.views.data);
    free(d->tokens.model.bytes.data);
    free(d->tokens.model.valid.data);
    for (int k = 0; k < N_NUMBERS; k++) {
        free(d->tokens.number[k].values.data);
        free(d->tokens.number[k].valid.data);
    }
    free(d->tier_headers.items);
    free(d->tier_headers.slots);
}

static int put(PyObject *dict, const char *key, PyObject *value)
{
    if (!value)
        return -1;
    int rc = PyDict_SetItemString(dict, key, value);
    Py_DECREF(value);
    return rc;
}

static PyObject *strings_of(const Strings *t)
{
    PyObject *list = PyList_New((Py_ssize_t)t->count);
    if (!list)
        return NULL;
    Py_INCREF(Py_None);
    PyList_SET_ITEM(list, 0, Py_None);
    for (size_t k = 1; k < t->count; k++) {
        Slice s = t->items[k];
        PyObject *text = PyUnicode_DecodeUTF8((const char *)s.p, s.end - s.p, "strict");
        if (!text) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, (Py_ssize_t)k, text);
    }
    return list;
}

/* How many rows carry each distinct tier header. */
static PyObject *tier_counts_of(const Decoder *d)
{
    Py_ssize_t *counts = calloc(d->tier_headers.count, sizeof *counts);
    if (!counts)
        return PyErr_NoMemory();
    const int32_t *index = (const int32_t *)d->tier_header.data;
    for (Py_ssize_t k = 0; k < d->rows; k++)
        counts[index[k]]++;
    PyObject *list = PyList_New((Py_ssize_t)d->tier_headers.count);
    for (size_t k = 0; list && k < d->tier_headers.count; k++) {
        PyObject *n = PyLong_FromSsize_t(counts[k]);
        if (!n)
            Py_CLEAR(list);
        else
            PyList_SET_ITEM(list, (Py_ssize_t)k, n);
    }
    free(counts);
    return list;
}

#define COLUMNS_CAPSULE "sloscope.otlp_spans.columns"

static void columns_capsule_free(PyObject *capsule)
{
    Decoder *d = PyCapsule_GetPointer(capsule, COLUMNS_CAPSULE);
    if (d) {
        decoder_free(d);
        free(d);
    }
}

/* The decoded request, whose buffers it takes; its columns, in a capsule, wait for the tiers (`batch`). */
static PyObject *result(Decoder *decoded)
{
    Decoder *d = malloc(sizeof *d);
    if (!d) {
        decoder_free(decoded);
        return PyErr_NoMemory();
    }
    *d = *decoded;
    PyObject *columns = PyCapsule_New(d, COLUMNS_CAPSULE, columns_capsule_free);
    if (!columns) {
        decoder_free(d);
        free(d);
        return NULL;
    }
    PyObject *out = PyDict_New();
    if (!out || put(out, "rows", PyLong_FromSsize_t(d->rows)) ||
        put(out, "tier_headers", strings_of(&d->tier_headers)) || put(out, "tier_counts", tier_counts_of(d)) ||
        put(out, "token_timings", Py_BuildValue("(nn)", d->tokens.invalid, d->tokens.absent))) {
        Py_XDECREF(out);
        out = NULL;
    } else if (PyDict_SetItemString(out, "columns", columns)) {
        Py_CLEAR(out);
    }
    Py_DECREF(columns);
    return out;
}

/* The tier column: each row's tier, by its header's index, as a view. */
static int tier_views(Decoder *d, const Slice *tiers, Buf *views, Buf *bytes)
{
    size_t n = d->tier_headers.count;
    uint8_t (*view_of)[16] = calloc(n, 16);
    if (!view_of)
        return NO_MEMORY;
    int rc = OK;
    for (size_t k = 0; k < n && !rc; k++)
        rc = add_view(view_of[k], tiers[k], bytes);
    const int32_t *index = (const int32_t *)d->tier_header.data;
    for (Py_ssize_t r = 0; r < d->rows && !rc; r++)
        rc = buf_add(views, view_of[index[r]], 16);
    free(view_of);
    return rc;
}

/* start_ns becomes start_time (microseconds), end_ns duration_ms, in place: what the requests table keeps. */
static void times_as_stored(Decoder *d)
{
    int64_t *start = (int64_t *)d->start_ns.data, *end = (int64_t *)d->end_ns.data;
    for (Py_ssize_t r = 0; r < d->rows; r++) {
        double duration_ms = (double)(end[r] - start[r]) / 1e6;
        start[r] /= 1000;  /* start > 0: the quotient is the floor */
        memcpy(&end[r], &duration_ms, 8);
    }
}

/* The buffer, now the batch's; 0, or -1 when the batch could not take it (then freed). */
static int hand_over(Batch *b, Buf *buf)
{
    void *data = buf->data;
    buf->data = NULL;
    return data ? batch_own(b, data) : 0;
}

/* The token columns of a request none of whose spans gave token timings: nulls, the six over one buffer of zeros,
 * which is at once a null row's validity bits, its number and its string view (of no bytes). */
static int batch_no_tokens(Batch *b)
{
    uint8_t *zeros = calloc((size_t)b->rows + 1, 16);
    if (!zeros || batch_own(b, zeros))
        return -1;
    int k = b->n_columns;
    struct ArrowArray *c = batch_column(b, "vu", "model", b->rows, 4);  /* as batch_views lays it out */
    b->data_sizes[k] = 0;
    c->buffers[0] = c->buffers[1] = zeros;
    c->buffers[2] = batch_buffer(NULL);
    c->buffers[3] = &b->data_sizes[k];
    for (k = 0; k < N_NUMBERS; k++) {
        c = batch_column(b, NUMBER_FORMATS[k], NUMBER_COLUMNS[k], b->rows, 2);
        c->buffers[0] = c->buffers[1] = zeros;
    }
    return 0;
}

/* The token columns (TOKEN_COLUMNS), padded with nulls after the last span that gave token timings. */
static int batch_tokens(Batch *b, TokenColumns *tokens, Py_ssize_t rows)
{
    if (tokens->rows == 0)
        return batch_no_tokens(b);
    if (tokens_pad(tokens, rows))
        return -1;
    int rc = batch_views(b, "model", tokens->model.views.data, tokens->model.bytes.data,
                         (int64_t)tokens->model.bytes.len, tokens->model.valid.data);
    for (int k = 0; k < N_NUMBERS; k++)
        rc |= batch_fixed(b, NUMBER_FORMATS[k], NUMBER_COLUMNS[k], tokens->number[k].values.data,
                          tokens->number[k].valid.data);
    rc |= hand_over(b, &tokens->model.views) | hand_over(b, &tokens->model.bytes) | hand_over(b, &tokens->model.valid);
    for (int k = 0; k < N_NUMBERS; k++)
        rc |= hand_over(b, &tokens->number[k].values) | hand_over(b, &tokens->number[k].valid);
    return rc;
}

/* The spans' columns, in the order of analytics.frames.SPAN_COLUMNS: the requests table's, with parent_id and kind
 * after span_id, then peer, then the token timings (TOKEN_COLUMNS). */
static int fill_batch(Batch *b, Decoder *d, const Slice *tiers)
{
    static const int text_order[] = {COL_SERVICE, COL_NODE, COL_POD, COL_NAMESPACE, COL_POD_IP, COL_GPU};
    Buf views = {0}, bytes = {0};
    if (tier_views(d, tiers, &views, &bytes)) {
        free(views.data);
        free(bytes.data);
        return -1;
    }
    times_as_stored(d);
    /* One statement per column: the columns' order is the order of the calls, and C leaves the order in which
     * the operands of one `|` are evaluated to the compiler. */
    int rc = batch_own(b, views.data);
    rc |= batch_own(b, bytes.data);
    rc |= batch_fixed(b, "L", "trace_hi", d->trace_hi.data, NULL);
    rc |= batch_fixed(b, "L", "trace_lo", d->trace_lo.data, NULL);
    rc |= batch_fixed(b, "L", "span_id", d->span_id.data, NULL);
    rc |= batch_fixed(b, "L", "parent_id", d->parent_id.data, d->parent_valid.data);
    rc |= batch_fixed(b, "C", "kind", d->kind.data, NULL);
    rc |= batch_fixed(b, "tsu:", "start_time", d->start_ns.data, NULL);
    rc |= batch_fixed(b, "g", "duration_ms", d->end_ns.data, NULL);
    for (size_t k = 0; k < sizeof text_order / sizeof *text_order; k++) {
        TextColumn *c = &d->text[text_order[k]];
        rc |= batch_views(b, TEXT_COLUMNS[text_order[k]], c->views.data, c->bytes.data, (int64_t)c->bytes.len,
                          c->valid.data);
    }
    TextColumn *route = &d->text[COL_ROUTE], *peer = &d->text[COL_PEER];
    rc |= batch_views(b, "tier", views.data, bytes.data, (int64_t)bytes.len, NULL);
    rc |= batch_views(b, "route", route->views.data, route->bytes.data, (int64_t)route->bytes.len, route->valid.data);
    rc |= batch_fixed(b, "s", "status_code", d->status_code.data, d->status_valid.data);
    rc |= batch_booleans(b, "failed", d->failed.data);
    rc |= batch_views(b, "peer", peer->views.data, peer->bytes.data, (int64_t)peer->bytes.len, peer->valid.data);
    rc |= batch_tokens(b, &d->tokens, d->rows);
    Buf *bufs[] = {&d->trace_hi, &d->trace_lo, &d->span_id, &d->parent_id, &d->parent_valid, &d->kind,
                   &d->start_ns, &d->end_ns, &d->status_code, &d->status_valid, &d->failed};
    for (size_t k = 0; k < sizeof bufs / sizeof *bufs; k++)
        rc |= hand_over(b, bufs[k]);
    for (int k = 0; k < N_TEXT; k++) {
        rc |= hand_over(b, &d->text[k].views);
        rc |= hand_over(b, &d->text[k].bytes);
        rc |= hand_over(b, &d->text[k].valid);
    }
    return rc;
}

PyDoc_STRVAR(batch_doc,
"batch(columns, tiers) -> (schema capsule, array capsule)\n\n"
"The decoded spans as one record batch (analytics.frames.SPAN_COLUMNS), through the Arrow C data interface.\n"
"columns: what decode() gave under 'columns' (taken: once only); tiers: the tier of each distinct header, in\n"
"the order of decode()'s 'tier_headers'.");

static PyObject *batch(PyObject *module, PyObject *args)
{
    PyObject *capsule, *tier_list;
    (void)module;
    if (!PyArg_ParseTuple(args, "O!O!:batch", &PyCapsule_Type, &capsule, &PyList_Type, &tier_list))
        return NULL;
    Decoder *d = PyCapsule_GetPointer(capsule, COLUMNS_CAPSULE);
    if (!d)
        return NULL;
    if (d->taken)
        return PyErr_Format(PyExc_ValueError, "batch: these columns were taken already");
    if ((size_t)PyList_GET_SIZE(tier_list) != d->tier_headers.count)
        return PyErr_Format(PyExc_ValueError, "batch: %zu tiers expected", d->tier_headers.count);
    Slice *tiers = malloc(d->tier_headers.count * sizeof *tiers);
    Batch *b = calloc(1, sizeof *b);
    if (!tiers || !b) {
        free(tiers);
        free(b);
        return PyErr_NoMemory();
    }
    for (size_t k = 0; k < d->tier_headers.count; k++) {
        Py_ssize_t n;
        const char *text = PyUnicode_AsUTF8AndSize(PyList_GET_ITEM(tier_list, (Py_ssize_t)k), &n);
        if (!text || n > MAX_NAME_CHARS * 4) {
            if (text)
                PyErr_Format(PyExc_ValueError, "batch: a tier of %zd bytes", n);
            free(tiers);
            free(b);
            return NULL;
        }
        tiers[k] = (Slice){(const uint8_t *)text, (const uint8_t *)text + n};
    }
    d->taken = 1;
    b->rows = d->rows;
    int rc = fill_batch(b, d, tiers);
    free(tiers);
    if (rc) {
        struct ArrowArray unowned = {.private_data = b};
        batch_release(&unowned);
        return PyErr_NoMemory();
    }
    return batch_capsules(b);
}

PyDoc_STRVAR(decode_doc,
"decode(body, keys, groups) -> dict | None\n\n"
"The spans of a protobuf ExportTraceServiceRequest, or None when the request needs the general path: rows,\n"
"tier_headers (each distinct one; index 0: none), tier_counts (rows per header), token_timings (how many spans\n"
"count as token_timings_invalid and token_timings_absent) and columns (for batch()).\n"
"keys: the attribute keys, as bytes, in slot order: eighteen, then the token groups' (see otlp_spans.py);\n"
"groups: how many keys each token group has, in the order TTFT, queue, TPOT, decode, prompt tokens, output\n"
"tokens, model.");

/* The caller's keys (the keys' bytes are the tuple's: it outlives the decoding); -1 with an exception set. */
static int keys_of(PyObject *key_tuple, PyObject *group_tuple, Keys *keys)
{
    memset(keys, 0, sizeof *keys);
    if (PyTuple_GET_SIZE(group_tuple) != N_GROUPS) {
        PyErr_Format(PyExc_ValueError, "decode: %d token groups expected", N_GROUPS);
        return -1;
    }
    keys->n = BASE_SLOTS;
    for (int g = 0; g < N_GROUPS; g++) {
        long size = PyLong_AsLong(PyTuple_GET_ITEM(group_tuple, g));
        if (size < 0 || size > MAX_SLOTS) {
            if (!PyErr_Occurred())
                PyErr_Format(PyExc_ValueError, "decode: a token group of %ld keys", size);
            return -1;
        }
        keys->group_start[g] = keys->n;
        keys->n += (int)size;
        if (g <= TG_OUTPUT)  /* times and counts: numbers */
            for (int k = keys->group_start[g]; k < keys->n && k < MAX_SLOTS; k++)
                keys->number_slots |= SLOT(k);
    }
    keys->group_start[N_GROUPS] = keys->n;
    if (keys->n > MAX_SLOTS || PyTuple_GET_SIZE(key_tuple) != keys->n) {
        PyErr_Format(PyExc_ValueError, "decode: %d keys expected (at most %d)", keys->n, MAX_SLOTS);
        return -1;
    }
    for (int k = 0; k < keys->n; k++) {
        PyObject *key = PyTuple_GET_ITEM(key_tuple, k);
        if (!PyBytes_Check(key)) {
            PyErr_Format(PyExc_TypeError, "decode: keys must be bytes");
            return -1;
        }
        keys->keys[k].p = (const uint8_t *)PyBytes_AS_STRING(key);
        keys->keys[k].end = keys->keys[k].p + PyBytes_GET_SIZE(key);
        keys->by_length[length_entry((size_t)PyBytes_GET_SIZE(key))] |= SLOT(k);
    }
    keys->span_slots = (keys->n == MAX_SLOTS ? ~(uint64_t)0 : SLOT(keys->n) - 1) & ~SLOT(SLOT_SERVICE);
    return 0;
}

static PyObject *decode(PyObject *module, PyObject *args)
{
    PyObject *body, *key_tuple, *group_tuple;  /* body: bytes, so that nothing can change it while unlocked */
    (void)module;
    if (!PyArg_ParseTuple(args, "SO!O!:decode", &body, &PyTuple_Type, &key_tuple, &PyTuple_Type, &group_tuple))
        return NULL;
    Keys keys;
    if (keys_of(key_tuple, group_tuple, &keys))
        return NULL;
    Decoder d;
    memset(&d, 0, sizeof d);
    d.keys = &keys;
    d.tier_headers.count = 1;  /* index 0: None */
    const uint8_t *start = (const uint8_t *)PyBytes_AS_STRING(body);
    Slice whole = {start, start + PyBytes_GET_SIZE(body)};
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = strings_grow(&d.tier_headers);
    if (!rc)
        rc = request(&d, whole);
    Py_END_ALLOW_THREADS
    if (rc == OK)
        return result(&d);  /* which owns d's buffers from here */
    decoder_free(&d);
    return rc == NO_MEMORY ? PyErr_NoMemory() : Py_NewRef(Py_None);
}

PyDoc_STRVAR(count_doc,
"count(body, signal, limits) -> (items, attributes, buckets, read_through)\n\n"
"What decoding the protobuf export request would build, counted from its bytes (see request_items.py). signal:\n"
"0 traces, 1 metrics, 2 logs; limits: (items, attributes, buckets): the walk stops once a count passes its\n"
"limit, or where the bytes stop being wire format as this walk reads it; read_through: it reached the end.");

static PyObject *count(PyObject *module, PyObject *args)
{
    PyObject *body;
    int signal;
    unsigned long long limits[N_TALLIES];
    static const Kind items[] = {K_SPAN, K_METRIC, K_LOG};
    (void)module;
    if (!PyArg_ParseTuple(args, "Si(KKK):count", &body, &signal, &limits[ITEMS], &limits[ATTRIBUTES],
                          &limits[BUCKETS]))
        return NULL;
    if (signal < 0 || signal > 2)
        return PyErr_Format(PyExc_ValueError, "count: signal %d is none of 0, 1, 2", signal);
    Tally t = {.item = items[signal]};
    for (int k = 0; k < N_TALLIES; k++)
        t.max[k] = limits[k];
    const uint8_t *start = (const uint8_t *)PyBytes_AS_STRING(body);
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = counted(&t, (Slice){start, start + PyBytes_GET_SIZE(body)}, K_REQUEST, 0);
    Py_END_ALLOW_THREADS
    return Py_BuildValue("(KKKO)", t.n[ITEMS], t.n[ATTRIBUTES], t.n[BUCKETS], rc == OK ? Py_True : Py_False);
}

static PyMethodDef methods[] = {
    {"decode", decode, METH_VARARGS, decode_doc},
    {"batch", batch, METH_VARARGS, batch_doc},
    {"count", count, METH_VARARGS, count_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_otlp_spans", "Fast path of the OTLP trace decoder (otlp_spans.c).", -1, methods,
    NULL, NULL, NULL, NULL,
};

/* The token timings' bounds as built here, for otlp_spans.py to hold against token_timings.py's. */
PyMODINIT_FUNC PyInit__otlp_spans(void)
{
    PyObject *m = PyModule_Create(&module), *slack = PyFloat_FromDouble(SLACK_MS);
    if (m && (!slack || PyModule_AddObjectRef(m, "SLACK_MS", slack) ||
              PyModule_AddIntConstant(m, "MAX_TOKENS", (long)MAX_TOKENS) ||
              PyModule_AddIntConstant(m, "MAX_MODEL_LENGTH", MAX_MODEL_CHARS) ||
              PyModule_AddIntConstant(m, "MAX_SLOTS", MAX_SLOTS)))
        Py_CLEAR(m);
    Py_XDECREF(slack);
    return m;
}
