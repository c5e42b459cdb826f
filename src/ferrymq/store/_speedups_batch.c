/* ferrymq.store._speedups, batch encode: put_batch writes a SEND_BATCH body as commit log records, put_one
 * writes one plain SEND (header properties edited) as a record; both whole records in the IPv4 layout of
 * _speedups.h, every field written, BODYCRC included. Pure-Python twins: store/commit_log.py (put_messages,
 * put_message) with common/message_codec.py.
 *
 * Batch send body entry (read; see common/message_codec.py decode_batch_body):
 *
 * | offset | size | field                                   |
 * |--------|------|-----------------------------------------|
 * | 0      | 4    | totalSize = 20 + bodyLen + 2 + propLen  |
 * | 4      | 4    | magic (ignored)                         |
 * | 8      | 4    | bodyCRC (ignored)                       |
 * | 12     | 4    | flag                                    |
 * | 16     | 4    | bodyLen                                 |
 * | 20     | n    | body                                    |
 * | 20 + n | 2    | propLen (int16 >= 0)                    |
 * |        | p    | properties                              |
 *
 * Each entry becomes one commit log record (the IPv4 layout above, every field
 * written) with the broker's properties: the entry's own (parsed like string_to_properties: items
 * shorter than 2 or without a name are skipped, the first position and the last value of a name
 * win), updated with the batch header's (same rules), WAIT removed, CLUSTER set.
 */
#include "_speedups.h"

/* ---- batch put (SEND_BATCH_MESSAGE) -------------------------------------------------------- */

/* (the batch body entry layout is in the table at the top of this file) */
#define BATCH_ENTRY_HEAD_SIZE 20
#define BATCH_OFFSET_FLAG 12
#define BATCH_OFFSET_BODY_LENGTH 16
/* more property items than this (in one entry, after the merge) are left to the Python path */
#define BATCH_PROPS_ITEMS_MAX 64
#define BATCH_ENTRIES_INITIAL 256
#define MSG_ID_HEX_LEN 32 /* offset msgId: hex of store host (8 bytes) + phy offset (8 bytes) */

static const char PROP_WAIT[] = "WAIT";
static const char PROP_DELAY[] = "DELAY";
static const char PROP_TRAN_MSG[] = "TRAN_MSG";
static const char PROP_CLUSTER[] = "CLUSTER";
/* a delivery time (common/timer.py: TIMER_DELAY_SEC / _MS, TIMER_DELIVER_MS; ali-ons' __STARTDELIVERTIME) */
static const char PROP_TIMER_PREFIX[] = "TIMER_";
static const char PROP_START_DELIVER_TIME[] = "__STARTDELIVERTIME";

typedef struct {
    const uint8_t *name, *value;
    Py_ssize_t name_len, value_len;
} PropItem;

typedef struct {
    PropItem items[BATCH_PROPS_ITEMS_MAX];
    int n;
} PropList;

typedef struct {
    Py_ssize_t body_at; /* in the batch body */
    Py_ssize_t body_len;
    Py_ssize_t props_at; /* in the scratch buffer */
    Py_ssize_t props_len;
    int32_t flag;
} BatchEntry;

static int prop_find(const PropList *pl, const char *name, Py_ssize_t name_len)
{
    for (int i = 0; i < pl->n; i++)
        if (pl->items[i].name_len == name_len && memcmp(pl->items[i].name, name, (size_t)name_len) == 0)
            return i;
    return -1;
}

/* 1 when an item's name starts with prefix */
static int prop_prefixed(const PropList *pl, const char *prefix, Py_ssize_t prefix_len)
{
    for (int i = 0; i < pl->n; i++)
        if (pl->items[i].name_len >= prefix_len && memcmp(pl->items[i].name, prefix, (size_t)prefix_len) == 0)
            return 1;
    return 0;
}

/* dict __setitem__: replace the value in place, or append; -1 when the list is full */
static int prop_set(PropList *pl, const uint8_t *name, Py_ssize_t name_len, const uint8_t *value,
                    Py_ssize_t value_len)
{
    int i = prop_find(pl, (const char *)name, name_len);
    if (i < 0) {
        if (pl->n >= BATCH_PROPS_ITEMS_MAX)
            return -1;
        i = pl->n++;
        pl->items[i].name = name;
        pl->items[i].name_len = name_len;
    }
    pl->items[i].value = value;
    pl->items[i].value_len = value_len;
    return 0;
}

static void prop_del(PropList *pl, const char *name, Py_ssize_t name_len)
{
    int i = prop_find(pl, name, name_len);
    if (i < 0)
        return;
    memmove(&pl->items[i], &pl->items[i + 1], (size_t)(pl->n - i - 1) * sizeof(PropItem));
    pl->n--;
}

/* string_to_properties over (ASCII) bytes, into pl; -1 when too many items */
static int prop_parse(PropList *pl, const uint8_t *s, Py_ssize_t n)
{
    Py_ssize_t start = 0;
    while (start < n) { /* an empty tail item (trailing separator) is skipped anyway */
        const uint8_t *sep = memchr(s + start, PROPERTY_SEPARATOR, (size_t)(n - start));
        Py_ssize_t stop = sep ? (Py_ssize_t)(sep - s) : n;
        Py_ssize_t len = stop - start;
        if (len >= 2) {
            const uint8_t *item = s + start;
            const uint8_t *nv = memchr(item, NAME_VALUE_SEPARATOR, (size_t)len);
            if (nv != NULL && nv > item) {
                Py_ssize_t name_len = nv - item;
                if (prop_set(pl, item, name_len, nv + 1, len - name_len - 1) < 0)
                    return -1;
            }
        }
        start = stop + 1;
    }
    return 0;
}

static Py_ssize_t prop_text_len(const PropList *pl)
{
    Py_ssize_t n = pl->n > 0 ? pl->n - 1 : 0; /* separators */
    for (int i = 0; i < pl->n; i++)
        n += pl->items[i].name_len + 1 + pl->items[i].value_len;
    return n;
}

static void prop_write(const PropList *pl, uint8_t *dst)
{
    for (int i = 0; i < pl->n; i++) {
        if (i)
            *dst++ = PROPERTY_SEPARATOR;
        memcpy(dst, pl->items[i].name, (size_t)pl->items[i].name_len);
        dst += pl->items[i].name_len;
        *dst++ = NAME_VALUE_SEPARATOR;
        memcpy(dst, pl->items[i].value, (size_t)pl->items[i].value_len);
        dst += pl->items[i].value_len;
    }
}

typedef struct {
    BatchEntry *entries;
    Py_ssize_t count, cap;
    uint8_t *scratch; /* merged properties of every entry, back to back */
    Py_ssize_t scratch_len, scratch_cap;
    Py_ssize_t total;      /* bytes of all records */
    Py_ssize_t body_total; /* bytes of all bodies */
} Batch;

static void batch_free(Batch *b)
{
    PyMem_RawFree(b->entries);
    PyMem_RawFree(b->scratch);
}

/* grow to hold `need` more bytes of scratch / one more entry; -1 on out of memory */
static int batch_reserve(Batch *b, Py_ssize_t need)
{
    if (b->count == b->cap) {
        Py_ssize_t cap = b->cap ? b->cap * 2 : BATCH_ENTRIES_INITIAL;
        BatchEntry *e = PyMem_RawRealloc(b->entries, (size_t)cap * sizeof(BatchEntry));
        if (e == NULL)
            return -1;
        b->entries = e;
        b->cap = cap;
    }
    if (b->scratch_len + need > b->scratch_cap) {
        Py_ssize_t cap = b->scratch_cap ? b->scratch_cap : 4096;
        while (cap < b->scratch_len + need)
            cap *= 2;
        uint8_t *s = PyMem_RawRealloc(b->scratch, (size_t)cap);
        if (s == NULL)
            return -1;
        b->scratch = s;
        b->scratch_cap = cap;
    }
    return 0;
}

#define BATCH_OK 0
#define BATCH_PYTHON 1 /* left to the Python path (malformed, odd or refused: it answers) */
#define BATCH_NO_MEMORY 2

/* Validate the batch body and build every entry's merged properties (nothing is written to the log) */
static int batch_plan(Batch *b, const uint8_t *buf, Py_ssize_t len, const PropList *merge, const uint8_t *cluster,
                      Py_ssize_t cluster_len, Py_ssize_t fixed, Py_ssize_t max_props, Py_ssize_t max_body)
{
    Py_ssize_t pos = 0;
    if (len == 0)
        return BATCH_PYTHON; /* "empty batch" */
    while (pos < len) {
        if (len - pos < BATCH_ENTRY_HEAD_SIZE)
            return BATCH_PYTHON;
        const uint8_t *e = buf + pos;
        int32_t total = rd_i32(e);
        int32_t body_len = rd_i32(e + BATCH_OFFSET_BODY_LENGTH);
        if (body_len < 0 || len - pos - BATCH_ENTRY_HEAD_SIZE - PROPERTIES_LENGTH_SIZE < body_len)
            return BATCH_PYTHON;
        Py_ssize_t p = pos + BATCH_ENTRY_HEAD_SIZE + body_len;
        int16_t props_len = rd_i16(buf + p);
        p += PROPERTIES_LENGTH_SIZE;
        if (props_len < 0 || len - p < props_len ||
            (int64_t)total != (int64_t)BATCH_ENTRY_HEAD_SIZE + body_len + PROPERTIES_LENGTH_SIZE + props_len)
            return BATCH_PYTHON;
        const uint8_t *props = buf + p;
        if (!all_ascii(props, props_len)) /* decode("utf-8", "replace") would not round-trip */
            return BATCH_PYTHON;
        PropList pl;
        pl.n = 0;
        if (prop_parse(&pl, props, props_len) < 0)
            return BATCH_PYTHON;
        for (int i = 0; i < merge->n; i++)
            if (prop_set(&pl, merge->items[i].name, merge->items[i].name_len, merge->items[i].value,
                         merge->items[i].value_len) < 0)
                return BATCH_PYTHON;
        prop_del(&pl, PROP_WAIT, NEEDLE_LEN(PROP_WAIT));
        /* DELAY / TRAN_MSG / a delivery time: the Python path decides (refuses the batch or stores the value
         * as is) */
        if (prop_find(&pl, PROP_DELAY, NEEDLE_LEN(PROP_DELAY)) >= 0 ||
            prop_find(&pl, PROP_TRAN_MSG, NEEDLE_LEN(PROP_TRAN_MSG)) >= 0 ||
            prop_prefixed(&pl, PROP_TIMER_PREFIX, NEEDLE_LEN(PROP_TIMER_PREFIX)) ||
            prop_find(&pl, PROP_START_DELIVER_TIME, NEEDLE_LEN(PROP_START_DELIVER_TIME)) >= 0)
            return BATCH_PYTHON;
        if (prop_set(&pl, (const uint8_t *)PROP_CLUSTER, NEEDLE_LEN(PROP_CLUSTER), cluster, cluster_len) < 0)
            return BATCH_PYTHON;
        Py_ssize_t text_len = prop_text_len(&pl);
        if (text_len > max_props || body_len > max_body)
            return BATCH_PYTHON; /* PROPERTIES_SIZE_EXCEEDED / MESSAGE_ILLEGAL, answered by the Python path */
        if (fixed + body_len + text_len > INT32_MAX_VALUE)
            return BATCH_PYTHON; /* TOTALSIZE is an int32 */
        if (batch_reserve(b, text_len) < 0)
            return BATCH_NO_MEMORY;
        BatchEntry *be = &b->entries[b->count++];
        be->body_at = pos + BATCH_ENTRY_HEAD_SIZE;
        be->body_len = body_len;
        be->flag = rd_i32(e + BATCH_OFFSET_FLAG);
        be->props_at = b->scratch_len;
        be->props_len = text_len;
        prop_write(&pl, b->scratch + b->scratch_len);
        b->scratch_len += text_len;
        b->total += fixed + body_len + text_len;
        b->body_total += body_len;
        pos += total;
    }
    if (b->body_total > max_body)
        return BATCH_PYTHON;
    return BATCH_OK;
}

typedef struct {
    const uint8_t *topic;
    Py_ssize_t topic_len;
    int32_t queue_id, sys_flag, reconsume_times;
    int64_t queue_offset, phy_offset, born_timestamp, store_timestamp;
    const uint8_t *born_host, *store_host;
} BatchRecordFields;

/* every record, back to back from dst (no Python objects: runs without the GIL) */
static void batch_write(const Batch *b, const uint8_t *body, const BatchRecordFields *f, uint8_t *dst)
{
    int64_t qo = f->queue_offset, phy = f->phy_offset;
    for (Py_ssize_t i = 0; i < b->count; i++) {
        const BatchEntry *be = &b->entries[i];
        Py_ssize_t size = RECORD_MIN_SIZE + be->body_len + f->topic_len + be->props_len;
        const uint8_t *msg = body + be->body_at;
        uint32_t crc = ferry_crc32(0, msg, (size_t)be->body_len);
        wr_u32(dst + OFFSET_TOTAL_SIZE, (uint32_t)size);
        wr_u32(dst + OFFSET_MAGIC, (uint32_t)MESSAGE_MAGIC_CODE);
        wr_u32(dst + OFFSET_BODY_CRC, crc & BODY_CRC_MASK);
        wr_u32(dst + OFFSET_QUEUE_ID, (uint32_t)f->queue_id);
        wr_u32(dst + OFFSET_FLAG, (uint32_t)be->flag);
        wr_i64(dst + OFFSET_QUEUE_OFFSET, qo);
        wr_i64(dst + OFFSET_PHY_OFFSET, phy);
        wr_u32(dst + OFFSET_SYS_FLAG, (uint32_t)f->sys_flag);
        wr_i64(dst + OFFSET_BORN_TIMESTAMP, f->born_timestamp);
        memcpy(dst + OFFSET_BORN_HOST, f->born_host, HOST_V4_SIZE);
        wr_i64(dst + OFFSET_STORE_TIMESTAMP, f->store_timestamp);
        memcpy(dst + OFFSET_STORE_HOST, f->store_host, HOST_V4_SIZE);
        wr_u32(dst + OFFSET_RECONSUME_TIMES, (uint32_t)f->reconsume_times);
        wr_i64(dst + OFFSET_PREPARED_OFFSET, 0);
        wr_u32(dst + OFFSET_BODY_LENGTH, (uint32_t)be->body_len);
        uint8_t *p = dst + HEAD_V4_SIZE;
        memmove(p, msg, (size_t)be->body_len); /* the body may lie in mm itself */
        p += be->body_len;
        *p++ = (uint8_t)f->topic_len;
        memcpy(p, f->topic, (size_t)f->topic_len);
        p += f->topic_len;
        *p++ = (uint8_t)(be->props_len >> 8);
        *p++ = (uint8_t)be->props_len;
        memcpy(p, b->scratch + be->props_at, (size_t)be->props_len);
        dst += size;
        phy += size;
        qo++;
    }
}

static const char HEX_UPPER[] = "0123456789ABCDEF";

/* "ID,ID,..." of the records: uppercase hex of store host + phy offset (encode_offset_msg_id_raw) */
static PyObject *batch_msg_ids(const Batch *b, const uint8_t *store_host, int64_t phy, Py_ssize_t topic_len,
                               PyObject **offsets_out)
{
    PyObject *offsets = PyTuple_New(b->count);
    if (offsets == NULL)
        return NULL;
    PyObject *text = PyUnicode_New(b->count * (MSG_ID_HEX_LEN + 1) - 1, ASCII_MAX);
    if (text == NULL) {
        Py_DECREF(offsets);
        return NULL;
    }
    Py_UCS1 *out = PyUnicode_1BYTE_DATA(text);
    char host_hex[2 * HOST_V4_SIZE];
    for (int k = 0; k < HOST_V4_SIZE; k++) {
        host_hex[2 * k] = HEX_UPPER[store_host[k] >> 4];
        host_hex[2 * k + 1] = HEX_UPPER[store_host[k] & 0xF];
    }
    for (Py_ssize_t i = 0; i < b->count; i++) {
        PyObject *off = PyLong_FromLongLong(phy);
        if (off == NULL) {
            Py_DECREF(offsets);
            Py_DECREF(text);
            return NULL;
        }
        PyTuple_SET_ITEM(offsets, i, off);
        if (i)
            *out++ = ',';
        memcpy(out, host_hex, sizeof(host_hex));
        out += sizeof(host_hex);
        uint64_t v = (uint64_t)phy;
        for (int k = 15; k >= 0; k--) {
            out[k] = (Py_UCS1)HEX_UPPER[v & 0xF];
            v >>= 4;
        }
        out += 16;
        phy += RECORD_MIN_SIZE + b->entries[i].body_len + topic_len + b->entries[i].props_len;
    }
    *offsets_out = offsets;
    return text;
}

/* a buffer exporter without bf_releasebuffer other than bytes (ctypes arrays): its memory can be reallocated
 * (ctypes.resize) while we hold a pointer into it, by the clock or by an __index__ run while parsing */
static int unpinned_buffer(PyObject *o)
{
    PyBufferProcs *pb = Py_TYPE(o)->tp_as_buffer;
    return !PyBytes_CheckExact(o) && pb != NULL && pb->bf_getbuffer != NULL && pb->bf_releasebuffer == NULL;
}

/* replace the items of tuple (a new one, not yet seen by Python code) at positions at[] that are unpinned
 * buffers with bytes copies of what "y#" / a PyBUF_SIMPLE Py_buffer reads from them. Positions past its end
 * (PyArg_ParseTuple then raises on the count) and objects whose simple, C-contiguous buffer cannot be had
 * (the parse or the later PyObject_GetBuffer then raises as before) are left as they are.
 * -1 with an exception set when a copy cannot be made */
static int pin_bytes_at(PyObject *tuple, const Py_ssize_t *at, size_t n)
{
    for (size_t k = 0; k < n; k++) {
        if (at[k] >= PyTuple_GET_SIZE(tuple))
            continue;
        PyObject *o = PyTuple_GET_ITEM(tuple, at[k]);
        if (!unpinned_buffer(o))
            continue; /* bytes, an exporter that locks its buffer, or no buffer (TypeError below) */
        Py_buffer view;
        if (PyObject_GetBuffer(o, &view, PyBUF_SIMPLE) < 0) {
            PyErr_Clear(); /* raised again, as before, where the argument is read */
            continue;
        }
        PyObject *copy = NULL;
        if (PyBuffer_IsContiguous(&view, 'C')) {
            copy = PyBytes_FromStringAndSize((const char *)view.buf, view.len);
            if (copy == NULL) {
                PyBuffer_Release(&view);
                return -1;
            }
        }
        PyBuffer_Release(&view);
        if (copy == NULL)
            continue; /* "y#": TypeError (a contiguous buffer), as before */
        PyTuple_SET_ITEM(tuple, at[k], copy);
        Py_DECREF(o);
    }
    return 0;
}

FERRY_DOC(put_batch_doc,
"put_batch(mm, pos, room, batch_body, topic, queue_id, queue_offset, phy_offset, merge_props, cluster,\n"
"          born_host, store_host, born_timestamp, clock_ms, sys_flag, reconsume_times,\n"
"          max_props, max_body)\n"
"-> None | (count, total, offsets, msg_ids, store_timestamp)\n\n"
"The SEND_BATCH_MESSAGE put of CommitLog.put_batch_raw: validate the batch body and write one commit\n"
"log record per entry into mm at pos (queue offsets from queue_offset, phy offsets from phy_offset,\n"
"BODYCRC = zlib crc32 & 0x7FFFFFFF, properties merged with merge_props, WAIT dropped, CLUSTER set).\n"
"None: not handled (malformed, empty, non-ASCII properties, DELAY/TRAN_MSG, a TIMER_* or\n"
"__STARTDELIVERTIME property, too many items, a size\n"
"limit, a negative or int64-overflowing offset, IPv6 host flags): the Python path answers.\n"
"total > room: nothing written, offsets and msg_ids None (roll the segment and call again). Else clock_ms() was called once (STORETIMESTAMP), offsets = tuple of each\n"
"record's phy offset, msg_ids = the comma-joined offset msgIds. merge_props and cluster are ASCII\n"
"bytes; merge_props has no WAIT.");

static PyObject *put_batch_impl(PyObject *args)
{
    PyObject *mm_obj, *body_obj, *clock;
    Py_ssize_t pos, room, topic_len, merge_len, cluster_len, born_len, store_len, max_props, max_body;
    const char *topic, *merge_text, *cluster, *born_host, *store_host;
    int queue_id, sys_flag;
    long long queue_offset, phy_offset, born_ts, store_ts = 0, reconsume;
    if (!PyArg_ParseTuple(args, "OnnOy#iLLy#y#y#y#LOiLnn:put_batch", &mm_obj, &pos, &room, &body_obj, &topic,
                          &topic_len, &queue_id, &queue_offset, &phy_offset, &merge_text, &merge_len, &cluster,
                          &cluster_len, &born_host, &born_len, &store_host, &store_len, &born_ts, &clock,
                          &sys_flag, &reconsume, &max_props, &max_body))
        return NULL;
    if (topic_len <= 0 || topic_len > TOPIC_LENGTH_MAX || born_len != HOST_V4_SIZE || store_len != HOST_V4_SIZE ||
        queue_id < 0 || pos < 0 || max_props < 0 || max_props > INT16_MAX || max_body < 0) {
        PyErr_SetString(PyExc_ValueError, "put_batch: bad topic, host, queue id, position or limit");
        return NULL;
    }
    /* negative offsets, or IPv6 host flags on this IPv4 layout: the Python path answers */
    if (queue_offset < 0 || phy_offset < 0 || (sys_flag & SYSFLAG_HOST_V6_MASK) != 0 || reconsume < INT32_MIN ||
        reconsume > INT32_MAX || !all_ascii((const uint8_t *)merge_text, merge_len) ||
        !all_ascii((const uint8_t *)cluster, cluster_len))
        Py_RETURN_NONE;
    PropList merge;
    merge.n = 0;
    if (prop_parse(&merge, (const uint8_t *)merge_text, merge_len) < 0)
        Py_RETURN_NONE;
    Py_buffer body;
    if (PyObject_GetBuffer(body_obj, &body, PyBUF_SIMPLE) < 0)
        return NULL;
    Batch b;
    memset(&b, 0, sizeof(b));
    Py_ssize_t fixed = RECORD_MIN_SIZE + topic_len;
    int rc = batch_plan(&b, (const uint8_t *)body.buf, body.len, &merge, (const uint8_t *)cluster, cluster_len,
                        fixed, max_props, max_body);
    /* the last record's queue offset and the phy offset past the batch must be int64s */
    if (rc == BATCH_OK && (b.count > INT64_MAX - queue_offset || b.total > INT64_MAX - phy_offset))
        rc = BATCH_PYTHON;
    PyObject *result = NULL;
    if (rc == BATCH_NO_MEMORY) {
        PyErr_NoMemory();
    } else if (rc == BATCH_PYTHON) {
        result = Py_NewRef(Py_None);
    } else if (b.total > room) {
        result = Py_BuildValue("(nnOOO)", b.count, b.total, Py_None, Py_None, Py_None);
    } else {
        /* the store timestamp is taken once the batch is known to go in (as put_messages does) */
        PyObject *now = PyObject_CallNoArgs(clock);
        if (now != NULL) {
            store_ts = PyLong_AsLongLong(now);
            Py_DECREF(now);
        }
        Py_buffer mm;
        if (PyErr_Occurred()) {
            /* the clock failed or returned something that is not an int64 */
        } else if (PyObject_GetBuffer(mm_obj, &mm, PyBUF_WRITABLE) == 0) {
            if (pos > mm.len || mm.len - pos < b.total) {
                PyErr_SetString(PyExc_ValueError, "put_batch: the records do not fit in mm at pos");
            } else {
                BatchRecordFields f = {
                    (const uint8_t *)topic, topic_len, queue_id, sys_flag, (int32_t)reconsume,
                    queue_offset, phy_offset, born_ts, store_ts,
                    (const uint8_t *)born_host, (const uint8_t *)store_host,
                };
                Py_BEGIN_ALLOW_THREADS
                batch_write(&b, (const uint8_t *)body.buf, &f, (uint8_t *)mm.buf + pos);
                Py_END_ALLOW_THREADS
                PyObject *offsets = NULL;
                PyObject *ids = batch_msg_ids(&b, (const uint8_t *)store_host, phy_offset, topic_len, &offsets);
                if (ids != NULL) {
                    result = Py_BuildValue("(nnNNL)", b.count, b.total, offsets, ids, store_ts);
                }
            }
            PyBuffer_Release(&mm);
        }
    }
    batch_free(&b);
    PyBuffer_Release(&body);
    return result;
}

/* body, topic, merge_props, cluster, born_host, store_host: the buffer arguments put_batch reads through
 * borrowed pointers ("y#", the body's Py_buffer) across __index__ calls (parsing) and the clock */
static const Py_ssize_t PUT_BATCH_BUFFER_ARGS[] = {3, 4, 8, 9, 10, 11};

/* As put_one: when one of those is an unpinned buffer (a ctypes array the clock or an __index__ could
 * ctypes.resize, freeing what we point into), parse a copy of args where it is a bytes copy instead; that
 * tuple lives until put_batch_impl returns. bytes (and locking exporters) are parsed from args as before. */
FERRY_INTERNAL PyObject *put_batch(PyObject *self, PyObject *args)
{
    Py_ssize_t nargs = PyTuple_GET_SIZE(args);
    size_t n = sizeof(PUT_BATCH_BUFFER_ARGS) / sizeof(PUT_BATCH_BUFFER_ARGS[0]);
    size_t k = 0;
    while (k < n && (PUT_BATCH_BUFFER_ARGS[k] >= nargs ||
                     !unpinned_buffer(PyTuple_GET_ITEM(args, PUT_BATCH_BUFFER_ARGS[k]))))
        k++;
    if (k == n)
        return put_batch_impl(args);
    PyObject *pinned = PyTuple_New(nargs); /* not PyTuple_GetSlice: that returns args itself */
    if (pinned == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < nargs; i++)
        PyTuple_SET_ITEM(pinned, i, Py_NewRef(PyTuple_GET_ITEM(args, i)));
    PyObject *result = pin_bytes_at(pinned, PUT_BATCH_BUFFER_ARGS, n) < 0 ? NULL : put_batch_impl(pinned);
    Py_DECREF(pinned);
    return result;
}

/* ---- single put (SEND_MESSAGE / SEND_MESSAGE_V2) ------------------------------------------------ */

/* properties texts up to this long are built on the stack (longer: PyMem_RawMalloc) */
#define PUT_ONE_STACK_PROPS 1024
/* bodies at least this long are copied with the GIL released */
#define PUT_ONE_NOGIL_BODY (256 * 1024)
static const char WAIT_FALSE[] = "false";

/* the offset msgId of the record at phy (encode_offset_msg_id_raw: uppercase hex of host + offset) */
static PyObject *msg_id_of(const uint8_t *store_host, int64_t phy)
{
    PyObject *text = PyUnicode_New(MSG_ID_HEX_LEN, ASCII_MAX);
    if (text == NULL)
        return NULL;
    Py_UCS1 *out = PyUnicode_1BYTE_DATA(text);
    for (int k = 0; k < HOST_V4_SIZE; k++) {
        out[2 * k] = (Py_UCS1)HEX_UPPER[store_host[k] >> 4];
        out[2 * k + 1] = (Py_UCS1)HEX_UPPER[store_host[k] & 0xF];
    }
    uint64_t v = (uint64_t)phy;
    for (int k = MSG_ID_HEX_LEN - 1; k >= 2 * HOST_V4_SIZE; k--) {
        out[k] = (Py_UCS1)HEX_UPPER[v & 0xF];
        v >>= 4;
    }
    return text;
}

FERRY_DOC(put_one_doc,
"put_one(mm, pos, room, body, props, topic, queue_id, queue_offset, phy_offset, cluster, born_host,\n"
"        store_host, born_timestamp, clock_ms, flag, sys_flag, reconsume_times, max_props, max_body)\n"
"-> None | (total, wait, msg_id, store_timestamp)\n\n"
"The plain SEND_MESSAGE put of CommitLog.put_one_raw: parse props (the request's properties, ASCII bytes)\n"
"as string_to_properties does, take WAIT out (wait = its value lowercased != 'false'), set CLUSTER, and\n"
"write one commit log record into mm at pos (queue offset queue_offset, phy offset phy_offset, BODYCRC =\n"
"zlib crc32 & 0x7FFFFFFF). None: not handled (non-ASCII, DELAY / TRAN_MSG present, transaction or IPv6\n"
"sys flags, too many items, a size limit, a field out of its record range, a negative or overflowing\n"
"offset): the Python path answers. total > room: nothing written, msg_id and store_timestamp None (roll\n"
"the segment and call again). Else clock_ms() was called once (STORETIMESTAMP).");

#define PUT_ONE_NARGS 19

/* an exact int argument as long long / Py_ssize_t; 0 (no exception set) when it is not one or does not fit:
 * the caller then lets PyArg_ParseTuple convert (and raise) exactly as before */
static int fast_ll(PyObject *o, long long *out)
{
    if (!PyLong_CheckExact(o))
        return 0;
    int overflow;
    long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (overflow || (v == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return 0;
    }
    *out = v;
    return 1;
}

static int fast_ssize(PyObject *o, Py_ssize_t *out)
{
    long long v;
    if (!fast_ll(o, &v) || v < PY_SSIZE_T_MIN || v > PY_SSIZE_T_MAX)
        return 0;
    *out = (Py_ssize_t)v;
    return 1;
}

/* an exact bytes argument ("y#": bytes has no bf_releasebuffer, so this is what "y#" reads) */
static int fast_bytes(PyObject *o, const char **buf, Py_ssize_t *len)
{
    if (!PyBytes_CheckExact(o))
        return 0;
    *buf = PyBytes_AS_STRING(o);
    *len = PyBytes_GET_SIZE(o);
    return 1;
}

/* "y#" hands out a borrowed pointer into such a buffer, and the body's Py_buffer (held across the clock)
 * does not lock it. So the slow path replaces those arguments (body, props, topic, cluster, hosts) in its
 * tuple with bytes copies before parsing, and keeps that tuple (*pinned) until put_one returns: every
 * pointer read then points into an object that cannot move. */
static int put_one_pin_bytes(PyObject *tuple)
{
    static const Py_ssize_t at[] = {3, 4, 5, 9, 10, 11};
    return pin_bytes_at(tuple, at, sizeof(at) / sizeof(at[0]));
}

static PyObject *put_one_impl(PyObject *const *args, Py_ssize_t nargs, PyObject **pinned)
{
    PyObject *mm_obj, *body_obj, *clock;
    Py_ssize_t pos, room, props_len, topic_len, cluster_len, born_len, store_len, max_props, max_body;
    const char *props, *topic, *cluster, *born_host, *store_host;
    int queue_id;
    long long queue_offset, phy_offset, born_ts, store_ts = 0, flag, sys_flag, reconsume, queue_id_ll;
    /* METH_FASTCALL: the usual arguments (exact ints in range, bytes) are read straight from the vector; any
     * other argument list goes through PyArg_ParseTuple, which converts or raises as it always did */
    if (nargs == PUT_ONE_NARGS && !unpinned_buffer(args[3]) && fast_ssize(args[1], &pos) &&
        fast_ssize(args[2], &room) && fast_bytes(args[4], &props, &props_len) &&
        fast_bytes(args[5], &topic, &topic_len) && fast_ll(args[6], &queue_id_ll) && queue_id_ll >= INT_MIN &&
        queue_id_ll <= INT_MAX && fast_ll(args[7], &queue_offset) && fast_ll(args[8], &phy_offset) &&
        fast_bytes(args[9], &cluster, &cluster_len) && fast_bytes(args[10], &born_host, &born_len) &&
        fast_bytes(args[11], &store_host, &store_len) && fast_ll(args[12], &born_ts) && fast_ll(args[14], &flag) &&
        fast_ll(args[15], &sys_flag) && fast_ll(args[16], &reconsume) && fast_ssize(args[17], &max_props) &&
        fast_ssize(args[18], &max_body)) {
        mm_obj = args[0];
        body_obj = args[3];
        clock = args[13];
        queue_id = (int)queue_id_ll;
    } else {
        PyObject *tuple = PyTuple_New(nargs);
        if (tuple == NULL)
            return NULL;
        for (Py_ssize_t k = 0; k < nargs; k++)
            PyTuple_SET_ITEM(tuple, k, Py_NewRef(args[k]));
        *pinned = tuple; /* released by put_one once this returns */
        if (put_one_pin_bytes(tuple) < 0)
            return NULL;
        int ok = PyArg_ParseTuple(tuple, "OnnOy#y#iLLy#y#y#LOLLLnn:put_one", &mm_obj, &pos, &room, &body_obj,
                                  &props, &props_len, &topic, &topic_len, &queue_id, &queue_offset, &phy_offset,
                                  &cluster, &cluster_len, &born_host, &born_len, &store_host, &store_len, &born_ts,
                                  &clock, &flag, &sys_flag, &reconsume, &max_props, &max_body);
        if (!ok)
            return NULL;
    }
    if (topic_len <= 0 || topic_len > TOPIC_LENGTH_MAX || born_len != HOST_V4_SIZE || store_len != HOST_V4_SIZE ||
        queue_id < 0 || pos < 0 || max_props < 0 || max_props > INT16_MAX || max_body < 0) {
        PyErr_SetString(PyExc_ValueError, "put_one: bad topic, host, queue id, position or limit");
        return NULL;
    }
    if (queue_offset < 0 || queue_offset == INT64_MAX || phy_offset < 0 || flag < INT32_MIN ||
        flag > INT32_MAX || sys_flag < 0 || sys_flag > INT32_MAX ||
        (sys_flag & (SYSFLAG_HOST_V6_MASK | SYSFLAG_TRANSACTION_MASK)) != 0 || reconsume < INT32_MIN ||
        reconsume > INT32_MAX || !all_ascii((const uint8_t *)props, props_len) ||
        !all_ascii((const uint8_t *)cluster, cluster_len))
        Py_RETURN_NONE;
    PropList pl;
    pl.n = 0;
    if (prop_parse(&pl, (const uint8_t *)props, props_len) < 0)
        Py_RETURN_NONE;
    int wait = 1;
    int w = prop_find(&pl, PROP_WAIT, NEEDLE_LEN(PROP_WAIT));
    if (w >= 0) {
        const PropItem *it = &pl.items[w];
        if (it->value_len == NEEDLE_LEN(WAIT_FALSE)) {
            wait = 0;
            for (Py_ssize_t k = 0; k < it->value_len; k++) {
                uint8_t c = it->value[k];
                if (c >= 'A' && c <= 'Z')
                    c = (uint8_t)(c - 'A' + 'a');
                if (c != (uint8_t)WAIT_FALSE[k]) {
                    wait = 1;
                    break;
                }
            }
        }
        prop_del(&pl, PROP_WAIT, NEEDLE_LEN(PROP_WAIT));
    }
    /* DELAY / TRAN_MSG: the Python path routes (schedule topic, half topic) or keeps them */
    if (prop_find(&pl, PROP_DELAY, NEEDLE_LEN(PROP_DELAY)) >= 0 ||
        prop_find(&pl, PROP_TRAN_MSG, NEEDLE_LEN(PROP_TRAN_MSG)) >= 0)
        Py_RETURN_NONE;
    if (prop_set(&pl, (const uint8_t *)PROP_CLUSTER, NEEDLE_LEN(PROP_CLUSTER), (const uint8_t *)cluster,
                 cluster_len) < 0)
        Py_RETURN_NONE;
    Py_ssize_t text_len = prop_text_len(&pl);
    Py_buffer body;
    if (PyObject_GetBuffer(body_obj, &body, PyBUF_SIMPLE) < 0)
        return NULL;
    Py_ssize_t total = RECORD_MIN_SIZE + body.len + topic_len + text_len;
    PyObject *result = NULL;
    if (text_len > max_props || body.len > max_body || total > INT32_MAX_VALUE || total > INT64_MAX - phy_offset) {
        result = Py_NewRef(Py_None); /* PROPERTIES_SIZE_EXCEEDED / MESSAGE_ILLEGAL: the Python path answers */
    } else if (total > room) {
        result = Py_BuildValue("(nOOO)", total, wait ? Py_True : Py_False, Py_None, Py_None);
    } else {
        /* the store timestamp is taken once the record is known to go in (as put_message does) */
        PyObject *now = PyObject_CallNoArgs(clock);
        if (now != NULL) {
            if (!fast_ll(now, &store_ts)) /* not an exact int in range: convert (and raise) as before */
                store_ts = PyLong_AsLongLong(now);
            Py_DECREF(now);
        }
        Py_buffer mm;
        uint8_t stack[PUT_ONE_STACK_PROPS];
        uint8_t *scratch = text_len <= PUT_ONE_STACK_PROPS ? stack : PyMem_RawMalloc((size_t)text_len);
        if (PyErr_Occurred()) {
            /* the clock failed or returned something that is not an int64 */
        } else if (scratch == NULL) {
            PyErr_NoMemory();
        } else if (PyObject_GetBuffer(mm_obj, &mm, PyBUF_WRITABLE) == 0) {
            if (pos > mm.len || mm.len - pos < total) {
                PyErr_SetString(PyExc_ValueError, "put_one: the record does not fit in mm at pos");
            } else {
                prop_write(&pl, scratch);
                BatchEntry entry = {0, body.len, 0, text_len, (int32_t)flag};
                Batch one;
                memset(&one, 0, sizeof(one));
                one.entries = &entry;
                one.count = one.cap = 1;
                one.scratch = scratch;
                one.scratch_len = one.scratch_cap = text_len;
                one.total = total;
                one.body_total = body.len;
                BatchRecordFields f = {
                    (const uint8_t *)topic, topic_len, queue_id, (int32_t)sys_flag, (int32_t)reconsume,
                    queue_offset, phy_offset, born_ts, store_ts,
                    (const uint8_t *)born_host, (const uint8_t *)store_host,
                };
                if (body.len >= PUT_ONE_NOGIL_BODY) {
                    Py_BEGIN_ALLOW_THREADS
                    batch_write(&one, (const uint8_t *)body.buf, &f, (uint8_t *)mm.buf + pos);
                    Py_END_ALLOW_THREADS
                } else {
                    batch_write(&one, (const uint8_t *)body.buf, &f, (uint8_t *)mm.buf + pos);
                }
                PyObject *id = msg_id_of((const uint8_t *)store_host, phy_offset);
                PyObject *n_total = id != NULL ? PyLong_FromSsize_t(total) : NULL;
                PyObject *n_ts = n_total != NULL ? PyLong_FromLongLong(store_ts) : NULL;
                if (n_ts != NULL && (result = PyTuple_New(4)) != NULL) {
                    PyTuple_SET_ITEM(result, 0, n_total);
                    PyTuple_SET_ITEM(result, 1, Py_NewRef(wait ? Py_True : Py_False));
                    PyTuple_SET_ITEM(result, 2, id);
                    PyTuple_SET_ITEM(result, 3, n_ts);
                } else {
                    Py_XDECREF(id);
                    Py_XDECREF(n_total);
                    Py_XDECREF(n_ts);
                }
            }
            PyBuffer_Release(&mm);
        }
        if (scratch != NULL && scratch != stack)
            PyMem_RawFree(scratch);
    }
    PyBuffer_Release(&body);
    return result;
}

FERRY_INTERNAL PyObject *put_one(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *pinned = NULL;
    PyObject *result = put_one_impl(args, nargs, &pinned);
    Py_XDECREF(pinned);
    return result;
}
