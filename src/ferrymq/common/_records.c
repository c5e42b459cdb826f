/* ferrymq.common._records: one C pass over a PULL body (concatenated commit log records) that yields, for
 * every record, the fixed fields and the boundaries of its variable parts as packed native arrays, so the
 * Spark source (spark/arrow.py, BatchBuilder) builds Arrow columns without Python work per record.
 *
 * Loaded only through ferrymq/common/records.py (NATIVE), whose pure-Python scan is the reference and the
 * fallback. Written for ferrymq from the field table below (the record layout of common/message_codec.py).
 *
 * Commit log record, IPv4 hosts (all integers big-endian):
 *
 * | offset | size  | field                    | output                                  |
 * |--------|-------|--------------------------|-----------------------------------------|
 * | 0      | 4     | TOTALSIZE                | record walk                             |
 * | 4      | 4     | MAGICCODE 0xDAA320A7     | checked                                 |
 * | 12     | 4     | QUEUEID                  | queue_ids (int32)                       |
 * | 20     | 8     | QUEUEOFFSET              | queue_offsets (int64), keep flag        |
 * | 28     | 8     | PHYSICALOFFSET           | phy_offsets (int64)                     |
 * | 36     | 4     | SYSFLAG                  | IPv6 hosts (0x10/0x20) or compressed (0x1): stop, return None |
 * | 40     | 8     | BORNTIMESTAMP            | born_ms (int64)                         |
 * | 56     | 8     | STORETIMESTAMP           | store_ms (int64)                        |
 * | 64     | 8     | STOREHOST (IPv4 + port)  | store_hosts (8 bytes per record)        |
 * | 84     | 4 + n | BODYLENGTH + BODY        | segment boundaries                      |
 * |        | 1 + t | TOPICLENGTH + TOPIC      | segment boundaries                      |
 * |        | 2 + p | PROPERTIESLENGTH + PROPS | segment boundaries                      |
 *
 * Segment boundaries: six int64 per record (head, body, topic length, topic, properties length, properties
 * start), each plus ``base``; the caller appends the end of the data.
 *
 * Properties are ``name 0x01 value`` items joined by 0x02. ``repeated`` (the tenth item of the result) is 1 when
 * some record names a property twice (items without a name or without 0x01 do not count, as the decoders
 * drop them): a map column would keep both, so the caller decodes that body row by row.
 *
 * build_columns input: the PULL bodies as a sequence of buffers (their concatenation is what ``segs`` points
 * into; a record never spans two buffers), so the bodies are not joined first. The fill loop runs without
 * the GIL (the buffers are pinned by their Py_buffer views; only memcpy / memchr inside).
 *
 * build_columns output (Arrow's layouts, little-endian as Arrow; n = records, m = named property items):
 *
 * | item        | buffers                                        | per record                                |
 * |-------------|------------------------------------------------|-------------------------------------------|
 * | value       | int32 offsets (n + 1), data, validity or None  | BODY                                      |
 * | topic       | same                                           | TOPIC                                     |
 * | key         | same (validity bit 0 = null)                   | KEYS value, null when absent              |
 * | tags        | same                                           | TAGS value, null when absent              |
 * | msg_id      | same                                           | UNIQ_KEY, else hex(STOREHOST, PHYSICALOFFSET) |
 * | map_offsets | int32 (n + 1)                                  | first item of the record in map_keys      |
 * | map_keys    | int32 offsets (m + 1), data, None              | item names                                |
 * | map_values  | int32 offsets (m + 1), data, None              | item values                               |
 * | born_us     | int64 (n)                                      | BORNTIMESTAMP * 1000                      |
 * | store_us    | int64 (n)                                      | STORETIMESTAMP * 1000                     |
 * | ascii       | bool                                           | every topic and properties byte < 0x80: the string columns are valid UTF-8 |
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define HEAD_SIZE 88
#define MAGIC ((int32_t)0xDAA320A7)
#define SLOW_FLAGS (0x1 | 0x10 | 0x20)
#define SEGMENTS 6

static inline int32_t be32(const uint8_t *p) {
    return (int32_t)(((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | (uint32_t)p[3]);
}

static inline int64_t be64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v = (v << 8) | p[i];
    return (int64_t)v;
}

static inline uint16_t be16(const uint8_t *p) { return (uint16_t)(((uint16_t)p[0] << 8) | p[1]); }

/* 1 when two named items of the properties text p[0:n] have the same name. */
static int has_repeated_name(const uint8_t *p, Py_ssize_t n) {
    Py_ssize_t item = 0;
    while (item < n) {
        const uint8_t *end = memchr(p + item, 0x02, (size_t)(n - item));
        Py_ssize_t item_end = end ? (Py_ssize_t)(end - p) : n;
        const uint8_t *sep = memchr(p + item, 0x01, (size_t)(item_end - item));
        if (sep && sep > p + item) {
            Py_ssize_t name_len = (Py_ssize_t)(sep - (p + item));
            /* compare with every later named item */
            Py_ssize_t other = item_end + 1;
            while (other < n) {
                const uint8_t *oend = memchr(p + other, 0x02, (size_t)(n - other));
                Py_ssize_t other_end = oend ? (Py_ssize_t)(oend - p) : n;
                const uint8_t *osep = memchr(p + other, 0x01, (size_t)(other_end - other));
                if (osep && (Py_ssize_t)(osep - (p + other)) == name_len && memcmp(p + item, p + other, (size_t)name_len) == 0)
                    return 1;
                other = other_end + 1;
            }
        }
        item = item_end + 1;
    }
    return 0;
}

PyDoc_STRVAR(scan_pull_body_doc,
"scan_pull_body(raw, base, start, end) -> tuple | None\n\n"
"Walk the records of a PULL body. Returns None when a record has IPv6 hosts or a compressed body (the\n"
"caller decodes row by row), else (count, segs, queue_ids, queue_offsets, phy_offsets, born_ms, store_ms,\n"
"store_hosts, keep, repeated): packed native int64 / int32 arrays as bytes, one byte per record, 1 when\n"
"start <= queueOffset < end, and 1 when some record names a property twice. ValueError names a malformed\n"
"record.");

static PyObject *scan_pull_body(PyObject *self, PyObject *args) {
    Py_buffer view;
    long long base, start, end;
    if (!PyArg_ParseTuple(args, "y*LLL", &view, &base, &start, &end)) return NULL;
    const uint8_t *raw = (const uint8_t *)view.buf;
    Py_ssize_t size = view.len;
    PyObject *result = NULL;

    /* first pass: count records and check them */
    Py_ssize_t count = 0, pos = 0;
    int repeated = 0;
    while (pos < size) {
        if (pos + HEAD_SIZE > size) {
            PyErr_Format(PyExc_ValueError, "truncated record header at %zd of a %zd-byte pull body", pos, size);
            goto done;
        }
        int32_t total = be32(raw + pos);
        if (be32(raw + pos + 4) != MAGIC || total < HEAD_SIZE || pos + total > size) {
            PyErr_Format(PyExc_ValueError, "bad record at %zd of a pull body (magic %#x, size %d)", pos,
                         (unsigned)be32(raw + pos + 4), total);
            goto done;
        }
        if (be32(raw + pos + 36) & SLOW_FLAGS) {
            result = Py_None;
            Py_INCREF(result);
            goto done;
        }
        int32_t body_len = be32(raw + pos + 84);
        Py_ssize_t record_end = pos + total;
        Py_ssize_t body_end = pos + HEAD_SIZE + (Py_ssize_t)body_len;
        if (body_len < 0 || body_end >= record_end) {
            PyErr_Format(PyExc_ValueError, "record at %zd: TOTALSIZE %d does not match its fields", pos, total);
            goto done;
        }
        Py_ssize_t props_start = body_end + 1 + raw[body_end] + 2;
        if (props_start > record_end ||
            props_start + (Py_ssize_t)be16(raw + props_start - 2) > record_end) {
            PyErr_Format(PyExc_ValueError, "record at %zd: TOTALSIZE %d does not match its fields", pos, total);
            goto done;
        }
        if (!repeated) repeated = has_repeated_name(raw + props_start, (Py_ssize_t)be16(raw + props_start - 2));
        count++;
        pos = record_end;
    }

    PyObject *segs = PyBytes_FromStringAndSize(NULL, count * SEGMENTS * (Py_ssize_t)sizeof(int64_t));
    PyObject *qids = PyBytes_FromStringAndSize(NULL, count * (Py_ssize_t)sizeof(int32_t));
    PyObject *qoffs = PyBytes_FromStringAndSize(NULL, count * (Py_ssize_t)sizeof(int64_t));
    PyObject *phys = PyBytes_FromStringAndSize(NULL, count * (Py_ssize_t)sizeof(int64_t));
    PyObject *borns = PyBytes_FromStringAndSize(NULL, count * (Py_ssize_t)sizeof(int64_t));
    PyObject *stores = PyBytes_FromStringAndSize(NULL, count * (Py_ssize_t)sizeof(int64_t));
    PyObject *hosts = PyBytes_FromStringAndSize(NULL, count * 8);
    PyObject *keep = PyBytes_FromStringAndSize(NULL, count);
    if (!segs || !qids || !qoffs || !phys || !borns || !stores || !hosts || !keep) {
        Py_XDECREF(segs); Py_XDECREF(qids); Py_XDECREF(qoffs); Py_XDECREF(phys);
        Py_XDECREF(borns); Py_XDECREF(stores); Py_XDECREF(hosts); Py_XDECREF(keep);
        goto done;
    }
    int64_t *sg = (int64_t *)PyBytes_AS_STRING(segs);
    int32_t *qi = (int32_t *)PyBytes_AS_STRING(qids);
    int64_t *qo = (int64_t *)PyBytes_AS_STRING(qoffs);
    int64_t *ph = (int64_t *)PyBytes_AS_STRING(phys);
    int64_t *bo = (int64_t *)PyBytes_AS_STRING(borns);
    int64_t *st = (int64_t *)PyBytes_AS_STRING(stores);
    uint8_t *ho = (uint8_t *)PyBytes_AS_STRING(hosts);
    uint8_t *kp = (uint8_t *)PyBytes_AS_STRING(keep);

    pos = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        const uint8_t *r = raw + pos;
        int32_t total = be32(r);
        Py_ssize_t body_end = pos + HEAD_SIZE + (Py_ssize_t)be32(r + 84);
        Py_ssize_t topic_end = body_end + 1 + raw[body_end];
        int64_t b = (int64_t)base;
        sg[i * SEGMENTS + 0] = b + pos;
        sg[i * SEGMENTS + 1] = b + pos + HEAD_SIZE;
        sg[i * SEGMENTS + 2] = b + body_end;
        sg[i * SEGMENTS + 3] = b + body_end + 1;
        sg[i * SEGMENTS + 4] = b + topic_end;
        sg[i * SEGMENTS + 5] = b + topic_end + 2;
        qi[i] = be32(r + 12);
        qo[i] = be64(r + 20);
        ph[i] = be64(r + 28);
        bo[i] = be64(r + 40);
        st[i] = be64(r + 56);
        memcpy(ho + i * 8, r + 64, 8);
        kp[i] = (qo[i] >= start && qo[i] < end) ? 1 : 0;
        pos += total;
    }
    result = Py_BuildValue("(nNNNNNNNNi)", count, segs, qids, qoffs, phys, borns, stores, hosts, keep, repeated);

done:
    PyBuffer_Release(&view);
    return result;
}

/* ---- Arrow column buffers (build_columns) -------------------------------------------------------------- */

/* A growing output buffer: a bytes object of a known upper bound, shrunk at the end. */
typedef struct {
    PyObject *obj;
    char *p;
    Py_ssize_t len;
} OutBuf;

static int out_init(OutBuf *b, Py_ssize_t cap) {
    b->obj = PyBytes_FromStringAndSize(NULL, cap > 0 ? cap : 1);
    b->p = b->obj ? PyBytes_AS_STRING(b->obj) : NULL;
    b->len = 0;
    return b->obj ? 0 : -1;
}

static PyObject *out_finish(OutBuf *b) {
    if (_PyBytes_Resize(&b->obj, b->len) < 0) return NULL;
    PyObject *o = b->obj;
    b->obj = NULL;
    return o;
}

/* A string column: int32 offsets, data, validity bits (1 = present). */
typedef struct {
    OutBuf offsets, data, valid;
    Py_ssize_t nulls;
    int overflow; /* a value would have taken the data past int32 offsets: the caller raises */
} StrCol;

static int col_init(StrCol *c, Py_ssize_t rows, Py_ssize_t data_cap) {
    c->nulls = 0;
    c->overflow = 0;
    if (out_init(&c->offsets, (rows + 1) * 4) < 0 || out_init(&c->data, data_cap) < 0 ||
        out_init(&c->valid, (rows + 7) / 8) < 0)
        return -1;
    memset(c->valid.p, 0, (size_t)((rows + 7) / 8));
    c->valid.len = (rows + 7) / 8;
    ((int32_t *)c->offsets.p)[0] = 0;
    c->offsets.len = 4;
    return 0;
}

static void col_free(StrCol *c) {
    Py_XDECREF(c->offsets.obj);
    Py_XDECREF(c->data.obj);
    Py_XDECREF(c->valid.obj);
}

/* Append one value (NULL p = a null); the data buffer was sized for the worst case. No Python API (runs
 * without the GIL): a value past int32 offsets is not copied and sets ``overflow``, which the caller raises. */
static void col_add(StrCol *c, Py_ssize_t row, const uint8_t *p, Py_ssize_t n) {
    if (p != NULL && (c->overflow || c->data.len + n > INT32_MAX)) {
        c->overflow = 1;
    } else if (p != NULL) {
        memcpy(c->data.p + c->data.len, p, (size_t)n);
        c->data.len += n;
        c->valid.p[row >> 3] |= (char)(1 << (row & 7));
    } else {
        c->nulls++;
    }
    ((int32_t *)c->offsets.p)[row + 1] = (int32_t)c->data.len;
    c->offsets.len += 4;
}

/* (offsets, data, validity or None when nothing is null) */
static PyObject *col_finish(StrCol *c) {
    PyObject *off = out_finish(&c->offsets);
    PyObject *data = off ? out_finish(&c->data) : NULL;
    PyObject *valid;
    if (data == NULL) {
        Py_XDECREF(off);
        return NULL;
    }
    if (c->nulls) {
        valid = out_finish(&c->valid);
    } else {
        Py_CLEAR(c->valid.obj);
        valid = Py_None;
        Py_INCREF(valid);
    }
    if (valid == NULL) {
        Py_DECREF(off);
        Py_DECREF(data);
        return NULL;
    }
    return Py_BuildValue("(NNN)", off, data, valid);
}

static const char HEX[] = "0123456789ABCDEF";

/* 1 when every byte of p[0:n] is below 0x80 (eight bytes at a time). */
static int all_ascii(const uint8_t *p, Py_ssize_t n) {
    uint64_t acc = 0, w;
    Py_ssize_t i = 0;
    for (; i + 8 <= n; i += 8) {
        memcpy(&w, p + i, 8);
        acc |= w;
    }
    for (; i < n; i++) acc |= p[i];
    return (acc & 0x8080808080808080ULL) == 0;
}

/* The PULL bodies of one batch: a pinned view of each, and where each starts in their concatenation. */
typedef struct {
    Py_ssize_t count;
    Py_buffer *views;
    Py_ssize_t *starts; /* count + 1: starts[count] = total length */
} Bodies;

static void bodies_release(Bodies *b) {
    for (Py_ssize_t i = 0; i < b->count; i++) PyBuffer_Release(&b->views[i]);
    PyMem_Free(b->views);
    PyMem_Free(b->starts);
    b->count = 0;
    b->views = NULL;
    b->starts = NULL;
}

static int bodies_open(Bodies *b, PyObject *seq_obj) {
    PyObject *seq = PySequence_Fast(seq_obj, "build_columns: bodies must be a sequence of buffers");
    if (seq == NULL) return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    b->count = 0;
    b->views = PyMem_Calloc((size_t)(n ? n : 1), sizeof(Py_buffer));
    b->starts = PyMem_Calloc((size_t)n + 1, sizeof(Py_ssize_t));
    if (b->views == NULL || b->starts == NULL) {
        Py_DECREF(seq);
        bodies_release(b);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(seq, i), &b->views[i], PyBUF_SIMPLE) < 0) {
            Py_DECREF(seq);
            bodies_release(b);
            return -1;
        }
        b->count = i + 1;
        b->starts[i + 1] = b->starts[i] + b->views[i].len;
    }
    Py_DECREF(seq);
    return 0;
}

PyDoc_STRVAR(build_columns_doc,
"build_columns(bodies, segs, store_hosts, phy_offsets, born_ms, store_ms) -> tuple\n\n"
"The Arrow buffers of the Spark source's columns for n records whose parts scan_pull_body located: bodies is\n"
"the PULL bodies (a sequence of buffers; a record never spans two), segs the 6 n int64 segment starts\n"
"(native order) in their concatenation plus its end.\n"
"Returns (value, topic, key, tags, msg_id, map_offsets, map_keys, map_values, born_us, store_us, ascii):\n"
"every string or binary column as (int32 offsets, data, validity bits or None), map_offsets int32, born_us /\n"
"store_us int64 microseconds, ascii True when every topic and properties byte is below 0x80 (the string\n"
"columns are then valid UTF-8). key / tags = the KEYS / TAGS property (null when absent); msg_id = UNIQ_KEY,\n"
"else (absent or empty) the offset msgId: hex of STOREHOST and PHYSICALOFFSET. The map holds every named\n"
"item (name 0x01 value); items without a name or without 0x01 are dropped. Assumes no record names a\n"
"property twice (scan_pull_body's flag) and checks no UTF-8 beyond the ascii flag (the caller validates).");

static PyObject *build_columns(PyObject *self, PyObject *args) {
    PyObject *bodies_obj;
    Py_buffer segs, hosts, phys, borns, stores;
    if (!PyArg_ParseTuple(args, "Oy*y*y*y*y*", &bodies_obj, &segs, &hosts, &phys, &borns, &stores)) return NULL;
    PyObject *result = NULL;
    Bodies bodies = {0};
    StrCol value = {0}, topic = {0}, key = {0}, tags = {0}, msgid = {0}, mkeys = {0}, mvals = {0};
    OutBuf moff = {0}, born_us = {0}, store_us = {0};
    Py_ssize_t n = segs.len >= 8 ? (segs.len / 8 - 1) / SEGMENTS : 0;
    const int64_t *sg = (const int64_t *)segs.buf;
    if (bodies_open(&bodies, bodies_obj) < 0) goto done;
    const Py_ssize_t total = bodies.starts[bodies.count];
    if (segs.len != (n * SEGMENTS + 1) * 8 || hosts.len < n * 8 || phys.len < n * 8 || borns.len < n * 8 ||
        stores.len < n * 8) {
        PyErr_SetString(PyExc_ValueError, "build_columns: array lengths do not match");
        goto done;
    }
    for (Py_ssize_t i = 0; i <= n * SEGMENTS; i++) {
        if (sg[i] < 0 || sg[i] > total || (i && sg[i] < sg[i - 1])) {
            PyErr_SetString(PyExc_ValueError, "build_columns: segment offsets out of order or out of data");
            goto done;
        }
    }
    /* every record inside one body: its head and its end (the next record's head) in the same buffer */
    for (Py_ssize_t i = 0, at = 0; i < n; i++) {
        const int64_t *s = sg + i * SEGMENTS;
        while (at < bodies.count && s[0] >= bodies.starts[at + 1]) at++;
        if (at == bodies.count || s[SEGMENTS] > bodies.starts[at + 1]) {
            PyErr_SetString(PyExc_ValueError, "build_columns: a record spans two bodies");
            goto done;
        }
    }
    Py_ssize_t body_total = 0, topic_total = 0, props_total = 0, items_max = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        const int64_t *s = sg + i * SEGMENTS;
        body_total += s[2] - s[1];
        topic_total += s[4] - s[3];
        props_total += s[6] - s[5];
        items_max += (s[6] - s[5]) / 2 + 1; /* an item takes at least 2 bytes with its separator */
    }
    if (col_init(&value, n, body_total) < 0 || col_init(&topic, n, topic_total) < 0 ||
        col_init(&key, n, props_total) < 0 || col_init(&tags, n, props_total) < 0 ||
        col_init(&msgid, n, props_total + n * 32) < 0 || col_init(&mkeys, items_max, props_total) < 0 ||
        col_init(&mvals, items_max, props_total) < 0 || out_init(&moff, (n + 1) * 4) < 0 ||
        out_init(&born_us, n * 8) < 0 || out_init(&store_us, n * 8) < 0)
        goto done;
    int32_t *mo = (int32_t *)moff.p;
    mo[0] = 0;
    Py_ssize_t items = 0;
    int ascii = 1;
    const uint8_t *hp = (const uint8_t *)hosts.buf;
    const int64_t *pp = (const int64_t *)phys.buf, *bp = (const int64_t *)borns.buf, *sp = (const int64_t *)stores.buf;
    Py_BEGIN_ALLOW_THREADS
    Py_ssize_t at = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        const int64_t *s = sg + i * SEGMENTS;
        while (s[0] >= bodies.starts[at + 1]) at++; /* checked above: the record lies in body ``at`` */
        const uint8_t *d = (const uint8_t *)bodies.views[at].buf - bodies.starts[at];
        col_add(&value, i, d + s[1], s[2] - s[1]);
        col_add(&topic, i, d + s[3], s[4] - s[3]);
        const uint8_t *kp = NULL, *tp = NULL, *up = NULL;
        Py_ssize_t kn = 0, tn = 0, un = 0;
        const uint8_t *p = d + s[5];
        Py_ssize_t len = s[6] - s[5], pos = 0;
        if (ascii) ascii = all_ascii(d + s[3], s[4] - s[3]) && all_ascii(p, len);
        while (pos < len) {
            const uint8_t *stop = memchr(p + pos, 0x02, (size_t)(len - pos));
            Py_ssize_t item_end = stop ? (Py_ssize_t)(stop - p) : len;
            const uint8_t *sep = memchr(p + pos, 0x01, (size_t)(item_end - pos));
            if (sep && sep > p + pos) {
                const uint8_t *name = p + pos, *val = sep + 1;
                Py_ssize_t name_len = sep - name, val_len = (p + item_end) - val;
                col_add(&mkeys, items, name, name_len);
                col_add(&mvals, items, val, val_len);
                items++;
                if (name_len == 4 && memcmp(name, "KEYS", 4) == 0) { kp = val; kn = val_len; }
                else if (name_len == 4 && memcmp(name, "TAGS", 4) == 0) { tp = val; tn = val_len; }
                else if (name_len == 8 && memcmp(name, "UNIQ_KEY", 8) == 0) { up = val; un = val_len; }
            }
            pos = item_end + 1;
        }
        mo[i + 1] = (int32_t)items;
        col_add(&key, i, kp, kn);
        col_add(&tags, i, tp, tn);
        if (up != NULL && un > 0) {
            col_add(&msgid, i, up, un);
        } else {
            uint8_t raw[16], hex[32];
            memcpy(raw, hp + i * 8, 8);
            uint64_t phy = (uint64_t)pp[i];
            for (int b = 0; b < 8; b++) raw[8 + b] = (uint8_t)(phy >> (56 - 8 * b));
            for (int b = 0; b < 16; b++) { hex[2 * b] = HEX[raw[b] >> 4]; hex[2 * b + 1] = HEX[raw[b] & 15]; }
            col_add(&msgid, i, hex, 32);
        }
        ((int64_t *)born_us.p)[i] = bp[i] * 1000;
        ((int64_t *)store_us.p)[i] = sp[i] * 1000;
    }
    Py_END_ALLOW_THREADS
    if (value.overflow || topic.overflow || key.overflow || tags.overflow || msgid.overflow || mkeys.overflow ||
        mvals.overflow) {
        PyErr_SetString(PyExc_OverflowError, "build_columns: a column exceeds 2 GiB");
        goto done;
    }
    moff.len = (n + 1) * 4;
    born_us.len = store_us.len = n * 8;
    mkeys.valid.len = mvals.valid.len = (items + 7) / 8;
    mkeys.nulls = mvals.nulls = 0; /* names and values are never null */
    PyObject *parts[10];
    parts[0] = col_finish(&value);
    parts[1] = col_finish(&topic);
    parts[2] = col_finish(&key);
    parts[3] = col_finish(&tags);
    parts[4] = col_finish(&msgid);
    parts[5] = out_finish(&moff);
    parts[6] = col_finish(&mkeys);
    parts[7] = col_finish(&mvals);
    parts[8] = out_finish(&born_us);
    parts[9] = out_finish(&store_us);
    int ok = 1;
    for (int j = 0; j < 10; j++) ok = ok && parts[j] != NULL;
    if (ok) {
        result = Py_BuildValue("(NNNNNNNNNNO)", parts[0], parts[1], parts[2], parts[3], parts[4], parts[5],
                               parts[6], parts[7], parts[8], parts[9], ascii ? Py_True : Py_False);
    } else {
        for (int j = 0; j < 10; j++) Py_XDECREF(parts[j]);
    }

done:
    col_free(&value); col_free(&topic); col_free(&key); col_free(&tags); col_free(&msgid);
    col_free(&mkeys); col_free(&mvals);
    Py_XDECREF(moff.obj); Py_XDECREF(born_us.obj); Py_XDECREF(store_us.obj);
    bodies_release(&bodies);
    PyBuffer_Release(&segs); PyBuffer_Release(&hosts);
    PyBuffer_Release(&phys); PyBuffer_Release(&borns); PyBuffer_Release(&stores);
    return result;
}

static PyMethodDef records_methods[] = {
    {"scan_pull_body", scan_pull_body, METH_VARARGS, scan_pull_body_doc},
    {"build_columns", build_columns, METH_VARARGS, build_columns_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef records_module = {
    PyModuleDef_HEAD_INIT, "ferrymq.common._records",
    "One C pass over PULL bodies for the Spark source (see ferrymq/common/records.py).", -1, records_methods,
};

PyMODINIT_FUNC PyInit__records(void) { return PyModule_Create(&records_module); }
