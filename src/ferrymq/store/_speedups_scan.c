/* ferrymq.store._speedups, record scans of reput: scan_dispatch walks commit log records (layout in
 * _speedups.h) into consume queue units and index entries; index_put_many writes those entries into an
 * index file. Pure-Python twins: store/dispatch.py, consume_queue.py, index.py.
 *
 * Consume queue unit (written into bytes objects that ConsumeQueue copies into its file; read by
 * pull_scan, where size 0x7FFFFFFF marks a BLANK unit that fills a hole):
 *
 * | offset | size | field                                                     |
 * |--------|------|-----------------------------------------------------------|
 * | 0      | 8    | commit log physical offset                                |
 * | 8      | 4    | record size (TOTALSIZE)                                   |
 * | 12     | 8    | tagsCode = Java String.hashCode(TAGS value), 0 without    |
 *
 * Index file (read and written in place; see store/index.py):
 *
 * | region  | size          | content                                                     |
 * |---------|---------------|-------------------------------------------------------------|
 * | header  | 40            | written by IndexFile at flush/close, not here               |
 * | slots   | slotNum x 4   | int32: newest entry number in that slot (0 = empty)         |
 * | entries | indexNum x 20 | keyHash 4, phyOffset 8, timeDiff 4 (s since begin), prev 4   |
 *
 * Scan index entry (in-process only, native byte order, produced by scan_dispatch and consumed
 * by index_put_many; SCAN_INDEX_ENTRY_SIZE bytes):
 *
 * | offset | size | field                                                      |
 * |--------|------|------------------------------------------------------------|
 * | 0      | 8    | phy offset (int64)                                         |
 * | 8      | 8    | store timestamp in ms (int64)                              |
 * | 16     | 4    | key hash = abs(Java hashCode("topic#key")), MIN_VALUE -> 0 |
 * | 20     | 4    | zero padding                                               |
 */
#include "_speedups.h"

/* ---- one record --------------------------------------------------------------------------- */

typedef struct {
    Py_ssize_t total;
    int32_t queue_id;
    int32_t sys_flag;
    int64_t queue_offset;
    int64_t store_timestamp;
    const uint8_t *topic;
    Py_ssize_t topic_len;
    const uint8_t *props;
    Py_ssize_t props_len;
} Record;

/* 1 when check_record_meta's IPv4 fast path says OK for the record at pos, 0 otherwise (the Python
 * path then decides: IPv6, INCOMPLETE, BLANK, END or CORRUPT). */
static int parse_record(const uint8_t *buf, Py_ssize_t pos, Py_ssize_t end, Record *rec)
{
    if (end - pos < HEAD_V4_SIZE)
        return 0;
    const uint8_t *r = buf + pos;
    if (rd_i32(r + OFFSET_MAGIC) != MESSAGE_MAGIC_CODE)
        return 0;
    int32_t sys_flag = rd_i32(r + OFFSET_SYS_FLAG);
    if (sys_flag & SYSFLAG_HOST_V6_MASK)
        return 0;
    int32_t total = rd_i32(r + OFFSET_TOTAL_SIZE);
    if (total < RECORD_MIN_SIZE || total > end - pos)
        return 0;
    int64_t record_end = (int64_t)pos + total;
    int32_t body_len = rd_i32(r + OFFSET_BODY_LENGTH);
    if (body_len < 0)
        return 0;
    int64_t p = (int64_t)pos + HEAD_V4_SIZE + body_len;
    if (p + TOPIC_LENGTH_SIZE + PROPERTIES_LENGTH_SIZE > record_end)
        return 0;
    Py_ssize_t topic_len = buf[p];
    if (topic_len > TOPIC_LENGTH_MAX || p + TOPIC_LENGTH_SIZE + topic_len + PROPERTIES_LENGTH_SIZE > record_end)
        return 0;
    int64_t props_at = p + TOPIC_LENGTH_SIZE + topic_len + PROPERTIES_LENGTH_SIZE;
    int16_t props_len = rd_i16(buf + props_at - PROPERTIES_LENGTH_SIZE);
    if (props_len < 0 || props_at + props_len != record_end)
        return 0;
    rec->total = total;
    rec->queue_id = rd_i32(r + OFFSET_QUEUE_ID);
    rec->sys_flag = sys_flag;
    rec->queue_offset = rd_i64(r + OFFSET_QUEUE_OFFSET);
    rec->store_timestamp = rd_i64(r + OFFSET_STORE_TIMESTAMP);
    rec->topic = buf + p + TOPIC_LENGTH_SIZE;
    rec->topic_len = topic_len;
    rec->props = buf + props_at;
    rec->props_len = props_len;
    return 1;
}

/* queue_table.topic_dir_name_ok for an ASCII topic */
static int topic_dir_name_ok(const uint8_t *t, Py_ssize_t n)
{
    if (n == 0)
        return 0;
    if (memchr(t, '/', (size_t)n) != NULL || memchr(t, '\0', (size_t)n) != NULL)
        return 0;
    if ((n == 1 && t[0] == '.') || (n == 2 && t[0] == '.' && t[1] == '.'))
        return 0;
    return 1;
}

/* 1 when the fast path dispatches this record exactly as Dispatcher.dispatch would; 0 leaves it to
 * Python (transactions, SCHEDULE_TOPIC_XXXX, non-ASCII text, names the consume queue refuses, ...) */
static int record_handled(const Record *rec)
{
    int32_t tran = rec->sys_flag & SYSFLAG_TRANSACTION_MASK;
    if (tran == SYSFLAG_TRANSACTION_PREPARED || tran == SYSFLAG_TRANSACTION_ROLLBACK)
        return 0;
    if (rec->queue_offset < 0 || rec->queue_offset >= QUEUE_OFFSET_LIMIT)
        return 0;
    if (!all_ascii(rec->topic, rec->topic_len) || !all_ascii(rec->props, rec->props_len))
        return 0;
    if (!topic_dir_name_ok(rec->topic, rec->topic_len))
        return 0;
    if (rec->topic_len == NEEDLE_LEN(SCHEDULE_TOPIC) &&
        memcmp(rec->topic, SCHEDULE_TOPIC, (size_t)rec->topic_len) == 0)
        return 0;
    return 1;
}

/* The dispatch-relevant properties: value pointer (NULL = absent) and length, last occurrence wins */
typedef struct {
    const uint8_t *tags, *keys, *uniq;
    Py_ssize_t tags_len, keys_len, uniq_len;
} Props;

static inline int starts_with(const uint8_t *s, Py_ssize_t n, const char *needle, Py_ssize_t needle_len)
{
    return n >= needle_len && memcmp(s, needle, (size_t)needle_len) == 0;
}

static void find_props(const uint8_t *p, Py_ssize_t n, Props *out)
{
    memset(out, 0, sizeof(*out));
    Py_ssize_t start = 0;
    while (start < n) {
        const uint8_t *sep = memchr(p + start, PROPERTY_SEPARATOR, (size_t)(n - start));
        Py_ssize_t stop = sep ? (Py_ssize_t)(sep - p) : n;
        const uint8_t *item = p + start;
        Py_ssize_t len = stop - start;
        if (starts_with(item, len, TAGS_NEEDLE, NEEDLE_LEN(TAGS_NEEDLE))) {
            out->tags = item + NEEDLE_LEN(TAGS_NEEDLE);
            out->tags_len = len - NEEDLE_LEN(TAGS_NEEDLE);
        } else if (starts_with(item, len, KEYS_NEEDLE, NEEDLE_LEN(KEYS_NEEDLE))) {
            out->keys = item + NEEDLE_LEN(KEYS_NEEDLE);
            out->keys_len = len - NEEDLE_LEN(KEYS_NEEDLE);
        } else if (starts_with(item, len, UNIQ_NEEDLE, NEEDLE_LEN(UNIQ_NEEDLE))) {
            out->uniq = item + NEEDLE_LEN(UNIQ_NEEDLE);
            out->uniq_len = len - NEEDLE_LEN(UNIQ_NEEDLE);
        }
        start = stop + 1;
    }
}

/* ---- scan state ---------------------------------------------------------------------------- */

typedef struct {
    const uint8_t *topic;
    Py_ssize_t topic_len;
    int32_t queue_id;
    uint32_t prefix_hash; /* Java hash of "topic#" */
    int64_t next_queue_offset;
    Py_ssize_t run; /* index of this queue's open run, -1 before the first */
    PyObject *topic_str;
} Group;

typedef struct {
    Py_ssize_t group;
    int64_t first_queue_offset;
    Py_ssize_t units;
    Py_ssize_t filled;
    PyObject *packed;
} Run;

typedef struct {
    Py_ssize_t run;
    int32_t size;
    int64_t phy_offset;
    int64_t tags_code;
} Unit;

typedef struct {
    int64_t phy_offset;
    int64_t store_timestamp;
    uint32_t key_hash;
    uint32_t pad;
} IndexEntry;

typedef struct {
    Group *groups;
    Py_ssize_t group_count;
    Py_ssize_t group_capacity; /* <= SCAN_GROUPS_MAX */
    int32_t *slots;            /* slot_mask + 1 group indexes, -1 empty */
    Py_ssize_t slot_mask;      /* a power of two minus one, >= 2 * group_capacity - 1 */
    Run *runs;
    Py_ssize_t run_count;
    Unit *units;
    Py_ssize_t unit_count;
    IndexEntry *index;
    Py_ssize_t index_count;
    Py_ssize_t index_capacity;
    int out_of_memory;
} Scan;

static void scan_free(Scan *s)
{
    for (Py_ssize_t i = 0; i < s->group_count; i++)
        Py_XDECREF(s->groups[i].topic_str);
    for (Py_ssize_t i = 0; i < s->run_count; i++)
        Py_XDECREF(s->runs[i].packed);
    PyMem_RawFree(s->groups);
    PyMem_RawFree(s->slots);
    PyMem_RawFree(s->runs);
    PyMem_RawFree(s->units);
    PyMem_RawFree(s->index);
}

/* Arrays for at most max_records records (no more than fit in the bytes to scan: a lone record costs a
 * few small allocations, not a full window's) */
static int scan_alloc(Scan *s, Py_ssize_t max_records, Py_ssize_t scan_bytes)
{
    memset(s, 0, sizeof(*s));
    Py_ssize_t n = scan_bytes / RECORD_MIN_SIZE + 1;
    if (n > max_records)
        n = max_records;
    if (n < 1)
        n = 1;
    s->group_capacity = n < SCAN_GROUPS_MAX ? n : SCAN_GROUPS_MAX;
    s->slot_mask = SCAN_GROUP_SLOTS_MIN - 1;
    while (s->slot_mask + 1 < 2 * s->group_capacity)
        s->slot_mask = 2 * s->slot_mask + 1;
    s->groups = PyMem_RawMalloc((size_t)s->group_capacity * sizeof(Group));
    s->slots = PyMem_RawMalloc((size_t)(s->slot_mask + 1) * sizeof(int32_t));
    s->runs = PyMem_RawMalloc((size_t)n * sizeof(Run));
    s->units = PyMem_RawMalloc((size_t)n * sizeof(Unit));
    s->index_capacity = SCAN_INDEX_INITIAL;
    s->index = PyMem_RawMalloc((size_t)s->index_capacity * sizeof(IndexEntry));
    if (!s->groups || !s->slots || !s->runs || !s->units || !s->index)
        return -1;
    memset(s->slots, 0xFF, (size_t)(s->slot_mask + 1) * sizeof(int32_t));
    return 0;
}

static inline uint32_t group_slot_hash(const uint8_t *topic, Py_ssize_t n, int32_t queue_id)
{
    uint32_t h = 2166136261u; /* FNV-1a */
    for (Py_ssize_t i = 0; i < n; i++)
        h = (h ^ topic[i]) * 16777619u;
    return (h ^ (uint32_t)queue_id) * 2654435761u;
}

/* the group of (topic, queue_id), created if new; -1 when SCAN_GROUPS_MAX are in use */
static Py_ssize_t scan_group(Scan *s, const Record *rec)
{
    uint32_t slot = group_slot_hash(rec->topic, rec->topic_len, rec->queue_id) & (uint32_t)s->slot_mask;
    for (;;) {
        int32_t g = s->slots[slot];
        if (g < 0)
            break;
        Group *grp = &s->groups[g];
        if (grp->queue_id == rec->queue_id && grp->topic_len == rec->topic_len &&
            memcmp(grp->topic, rec->topic, (size_t)rec->topic_len) == 0)
            return g;
        slot = (slot + 1) & (uint32_t)s->slot_mask;
    }
    if (s->group_count >= s->group_capacity)
        return -1;
    Py_ssize_t g = s->group_count++;
    Group *grp = &s->groups[g];
    grp->topic = rec->topic;
    grp->topic_len = rec->topic_len;
    grp->queue_id = rec->queue_id;
    grp->prefix_hash = java_hash_continue(0, rec->topic, rec->topic_len) * 31u + TOPIC_KEY_SEPARATOR;
    grp->next_queue_offset = -1;
    grp->run = -1;
    grp->topic_str = NULL;
    s->slots[slot] = (int32_t)g;
    return g;
}

static int scan_add_index(Scan *s, uint32_t prefix_hash, const uint8_t *key, Py_ssize_t key_len,
                          int64_t phy_offset, int64_t store_timestamp)
{
    if (s->index_count >= s->index_capacity) {
        Py_ssize_t capacity = s->index_capacity * 2;
        IndexEntry *grown = PyMem_RawRealloc(s->index, (size_t)capacity * sizeof(IndexEntry));
        if (grown == NULL) {
            s->out_of_memory = 1;
            return -1;
        }
        s->index = grown;
        s->index_capacity = capacity;
    }
    IndexEntry *e = &s->index[s->index_count++];
    e->phy_offset = phy_offset;
    e->store_timestamp = store_timestamp;
    e->key_hash = key_hash_abs(java_hash_continue(prefix_hash, key, key_len));
    e->pad = 0;
    return 0;
}

/* UNIQ_KEY, then every non-empty space-separated KEYS element (IndexService order) */
static int scan_index_keys(Scan *s, const Group *grp, const Props *pr, int64_t phy_offset, int64_t ts)
{
    if (pr->uniq && pr->uniq_len > 0 &&
        scan_add_index(s, grp->prefix_hash, pr->uniq, pr->uniq_len, phy_offset, ts) < 0)
        return -1;
    if (!pr->keys)
        return 0;
    Py_ssize_t start = 0;
    while (start <= pr->keys_len) {
        const uint8_t *sep = memchr(pr->keys + start, KEY_SEPARATOR, (size_t)(pr->keys_len - start));
        Py_ssize_t stop = sep ? (Py_ssize_t)(sep - pr->keys) : pr->keys_len;
        if (stop > start &&
            scan_add_index(s, grp->prefix_hash, pr->keys + start, stop - start, phy_offset, ts) < 0)
            return -1;
        start = stop + 1;
    }
    return 0;
}

/* Consume queue unit of a record in group g: appended to the group's open run, or a new run when
 * its queue offset does not continue that run */
static void scan_add_unit(Scan *s, Py_ssize_t g, const Record *rec, int64_t phy_offset, int64_t tags_code)
{
    Group *grp = &s->groups[g];
    if (grp->run < 0 || rec->queue_offset != grp->next_queue_offset) {
        Run *run = &s->runs[s->run_count];
        run->group = g;
        run->first_queue_offset = rec->queue_offset;
        run->units = 0;
        run->filled = 0;
        run->packed = NULL;
        grp->run = s->run_count++;
    }
    s->runs[grp->run].units++;
    grp->next_queue_offset = rec->queue_offset + 1;
    Unit *u = &s->units[s->unit_count++];
    u->run = grp->run;
    u->size = (int32_t)rec->total;
    u->phy_offset = phy_offset;
    u->tags_code = tags_code;
}

typedef struct {
    Py_ssize_t records;
    Py_ssize_t end_pos;
    int64_t last_store_timestamp;
    int stop;
} ScanResult;

static void scan_records(Scan *s, const uint8_t *buf, Py_ssize_t pos, Py_ssize_t end, Py_ssize_t max_records,
                         int64_t file_from_offset, int want_index, ScanResult *res)
{
    Record rec;
    Props pr;
    res->records = 0;
    res->last_store_timestamp = 0;
    res->stop = SCAN_STOP_LIMIT;
    while (res->records < max_records) {
        if (pos == end) {
            res->stop = SCAN_STOP_END;
            break;
        }
        if (!parse_record(buf, pos, end, &rec) || !record_handled(&rec)) {
            res->stop = SCAN_STOP_RECORD;
            break;
        }
        Py_ssize_t g = scan_group(s, &rec);
        if (g < 0) {
            res->stop = SCAN_STOP_GROUPS;
            break;
        }
        int64_t phy_offset = file_from_offset + pos;
        find_props(rec.props, rec.props_len, &pr);
        int64_t tags_code = 0;
        if (pr.tags && pr.tags_len > 0)
            tags_code = (int32_t)java_hash_continue(0, pr.tags, pr.tags_len);
        Py_ssize_t index_mark = s->index_count;
        if (want_index && rec.props_len > 0 &&
            scan_index_keys(s, &s->groups[g], &pr, phy_offset, rec.store_timestamp) < 0) {
            s->index_count = index_mark; /* out of memory: this record is not dispatched */
            break;
        }
        scan_add_unit(s, g, &rec, phy_offset, tags_code);
        res->last_store_timestamp = rec.store_timestamp;
        res->records++;
        pos += rec.total;
    }
    res->end_pos = pos;
}

/* ---- Python objects ------------------------------------------------------------------------ */

static PyObject *scan_build_runs(Scan *s)
{
    for (Py_ssize_t r = 0; r < s->run_count; r++) {
        Run *run = &s->runs[r];
        run->packed = PyBytes_FromStringAndSize(NULL, run->units * CQ_UNIT_SIZE);
        if (run->packed == NULL)
            return NULL;
        run->filled = 0;
    }
    for (Py_ssize_t i = 0; i < s->unit_count; i++) {
        const Unit *u = &s->units[i];
        Run *run = &s->runs[u->run];
        uint8_t *dst = (uint8_t *)PyBytes_AS_STRING(run->packed) + run->filled;
        wr_i64(dst, u->phy_offset);
        wr_u32(dst + 8, (uint32_t)u->size);
        wr_i64(dst + 12, u->tags_code);
        run->filled += CQ_UNIT_SIZE;
    }
    PyObject *runs = PyList_New(s->run_count);
    if (runs == NULL)
        return NULL;
    for (Py_ssize_t r = 0; r < s->run_count; r++) {
        Run *run = &s->runs[r];
        Group *grp = &s->groups[run->group];
        if (grp->topic_str == NULL) {
            grp->topic_str = PyUnicode_DecodeASCII((const char *)grp->topic, grp->topic_len, NULL);
            if (grp->topic_str == NULL) {
                Py_DECREF(runs);
                return NULL;
            }
        }
        /* (topic, queue_id, first_queue_offset, units); built directly (Py_BuildValue parses its format per run) */
        PyObject *queue_id = PyLong_FromLong(grp->queue_id);
        PyObject *first = queue_id != NULL ? PyLong_FromLongLong((long long)run->first_queue_offset) : NULL;
        PyObject *item = first != NULL ? PyTuple_New(4) : NULL;
        if (item == NULL) {
            Py_XDECREF(queue_id);
            Py_XDECREF(first);
            Py_DECREF(runs);
            return NULL;
        }
        PyTuple_SET_ITEM(item, 0, Py_NewRef(grp->topic_str));
        PyTuple_SET_ITEM(item, 1, queue_id);
        PyTuple_SET_ITEM(item, 2, first);
        PyTuple_SET_ITEM(item, 3, Py_NewRef(run->packed));
        PyList_SET_ITEM(runs, r, item);
    }
    return runs;
}

FERRY_DOC(scan_dispatch_doc,
"scan_dispatch(buf, pos, end, max_records, file_from_offset, want_index)\n"
"-> (records, end_pos, last_store_timestamp, stop, runs, index_entries)\n\n"
"Walk the commit log records in buf[pos:end] (a segment; file_from_offset is its first phy offset)\n"
"while they are OK for check_record_meta and plain for dispatch; stop before the first other one\n"
"(stop=2) so the Python path handles it (at pos when a phy offset would not be an int64). runs: [(topic, queue_id, first_queue_offset, units)],\n"
"units = packed 20-byte consume queue units at consecutive queue offsets, per queue in order.\n"
"index_entries: packed scan index entries (24 bytes each) when want_index, else b''.");

FERRY_INTERNAL PyObject *scan_dispatch(PyObject *self, PyObject *args)
{
    PyObject *buf_obj;
    Py_ssize_t pos, end, max_records;
    long long file_from_offset;
    int want_index;
    if (!PyArg_ParseTuple(args, "OnnnLp:scan_dispatch", &buf_obj, &pos, &end, &max_records, &file_from_offset,
                          &want_index))
        return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(buf_obj, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    if (pos < 0 || end < 0 || end > view.len || max_records < 0) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "scan_dispatch: need 0 <= pos, 0 <= end <= len(buf), max_records >= 0");
        return NULL;
    }
    if (max_records > SCAN_RECORDS_MAX)
        max_records = SCAN_RECORDS_MAX;
    Scan s;
    if (scan_alloc(&s, max_records, end > pos ? end - pos : 0) < 0) {
        scan_free(&s);
        PyBuffer_Release(&view);
        return PyErr_NoMemory();
    }
    ScanResult res;
    /* pos > end: nothing readable, the Python path reports INCOMPLETE. A file_from_offset for which a
     * phy offset in buf[pos:end] would not be an int64 (a corrupt segment name): the Python path decides. */
    if (pos > end || file_from_offset < 0 || file_from_offset > INT64_MAX - (long long)end) {
        res.records = 0;
        res.end_pos = pos;
        res.last_store_timestamp = 0;
        res.stop = SCAN_STOP_RECORD;
    } else {
        Py_BEGIN_ALLOW_THREADS
        scan_records(&s, (const uint8_t *)view.buf, pos, end, max_records, file_from_offset, want_index, &res);
        Py_END_ALLOW_THREADS
    }
    PyObject *result = NULL;
    if (s.out_of_memory && res.records == 0) {
        PyErr_NoMemory();
    } else {
        PyObject *runs = scan_build_runs(&s);
        PyObject *index = runs ? PyBytes_FromStringAndSize((const char *)s.index,
                                                           s.index_count * (Py_ssize_t)sizeof(IndexEntry))
                               : NULL;
        if (runs && index)
            result = Py_BuildValue("(nnLiOO)", res.records, res.end_pos, (long long)res.last_store_timestamp,
                                   res.stop, runs, index);
        Py_XDECREF(runs);
        Py_XDECREF(index);
    }
    scan_free(&s);
    PyBuffer_Release(&view);
    return result;
}

/* ---- index file ---------------------------------------------------------------------------- */

/* (store_timestamp - begin_timestamp) // 1000 clamped to [0, INT32_MAX] without int64 overflow */
static inline int32_t index_time_diff_s(int64_t store_timestamp, int64_t begin_timestamp)
{
    if (store_timestamp < begin_timestamp)
        return 0;
    uint64_t diff = ((uint64_t)store_timestamp - (uint64_t)begin_timestamp) / MS_PER_SECOND;
    return diff > (uint64_t)INT32_MAX_VALUE ? (int32_t)INT32_MAX_VALUE : (int32_t)diff;
}

FERRY_DOC(index_put_many_doc,
"index_put_many(mm, entries, start, slot_num, index_num, index_count, hash_slot_count,\n"
"               begin_timestamp, begin_phy_offset)\n"
"-> (next, index_count, hash_slot_count, begin_timestamp, begin_phy_offset, end_phy_offset, end_timestamp)\n\n"
"IndexFile.put_hashed_many for packed scan index entries[start:] written into the index file\n"
"buffer mm (slots and entries; the header is the caller's). next = first entry not put (full file).\n"
"end_phy_offset/end_timestamp are those of the last entry put (meaningless when next == start).");

FERRY_INTERNAL PyObject *index_put_many(PyObject *self, PyObject *args)
{
    PyObject *mm_obj, *entries_obj;
    Py_ssize_t start;
    long long slot_num, index_num, count, slots_used, begin_ts, begin_phy;
    if (!PyArg_ParseTuple(args, "OOnLLLLLL:index_put_many", &mm_obj, &entries_obj, &start, &slot_num, &index_num,
                          &count, &slots_used, &begin_ts, &begin_phy))
        return NULL;
    /* hash_slot_count is an int32 of the header: out of that range it could overflow below */
    if (slot_num <= 0 || slot_num > INT32_MAX_VALUE || index_num < 0 || index_num > INT32_MAX_VALUE || count < 0 ||
        slots_used < INT32_MIN || slots_used > INT32_MAX_VALUE) {
        PyErr_SetString(PyExc_ValueError, "index_put_many: bad slot_num, index_num, index_count or hash_slot_count");
        return NULL;
    }
    Py_buffer mm, entries;
    if (PyObject_GetBuffer(mm_obj, &mm, PyBUF_WRITABLE) < 0)
        return NULL;
    if (PyObject_GetBuffer(entries_obj, &entries, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&mm);
        return NULL;
    }
    Py_ssize_t n = entries.len / SCAN_INDEX_ENTRY_SIZE;
    long long need = INDEX_HEADER_SIZE + slot_num * INDEX_SLOT_SIZE + index_num * INDEX_ENTRY_SIZE;
    if (mm.len < need || entries.len % SCAN_INDEX_ENTRY_SIZE != 0 || start < 0 || start > n) {
        PyBuffer_Release(&entries);
        PyBuffer_Release(&mm);
        PyErr_SetString(PyExc_ValueError, "index_put_many: buffer smaller than the file geometry, or bad entries");
        return NULL;
    }
    uint8_t *base = (uint8_t *)mm.buf;
    uint8_t *entries_base = base + INDEX_HEADER_SIZE + slot_num * INDEX_SLOT_SIZE;
    const uint8_t *src = (const uint8_t *)entries.buf;
    /* every key hash that would be put is checked first: on the error nothing is written (the caller's
     * index_count / hash_slot_count stay those of the file) */
    Py_ssize_t last = n; /* the loop below stops before entries[last] */
    if (count >= index_num)
        last = start;
    else if (index_num - count < n - start)
        last = start + (Py_ssize_t)(index_num - count);
    for (Py_ssize_t k = start; k < last; k++) {
        IndexEntry e;
        memcpy(&e, src + k * SCAN_INDEX_ENTRY_SIZE, sizeof(e));
        if (e.key_hash > (uint32_t)INT32_MAX_VALUE) {
            PyBuffer_Release(&entries);
            PyBuffer_Release(&mm);
            PyErr_SetString(PyExc_ValueError, "index_put_many: key hash above INT32_MAX");
            return NULL;
        }
    }
    Py_ssize_t i = start;
    int64_t end_phy = -1, end_ts = -1;
    while (i < n && count < index_num) {
        IndexEntry e;
        memcpy(&e, src + i * SCAN_INDEX_ENTRY_SIZE, sizeof(e));
        uint8_t *slot = base + INDEX_HEADER_SIZE + (long long)(e.key_hash % (uint64_t)slot_num) * INDEX_SLOT_SIZE;
        int32_t prev = rd_i32(slot);
        if (prev <= 0 || prev >= count)
            prev = 0;
        if (count <= 1) {
            begin_ts = e.store_timestamp;
            begin_phy = e.phy_offset;
        }
        uint8_t *dst = entries_base + count * INDEX_ENTRY_SIZE;
        wr_u32(dst, e.key_hash);
        wr_i64(dst + 4, e.phy_offset);
        wr_u32(dst + 12, (uint32_t)index_time_diff_s(e.store_timestamp, begin_ts));
        wr_u32(dst + 16, (uint32_t)prev);
        wr_u32(slot, (uint32_t)count);
        if (prev == 0)
            slots_used++;
        count++;
        end_phy = e.phy_offset;
        end_ts = e.store_timestamp;
        i++;
    }
    PyBuffer_Release(&entries);
    PyBuffer_Release(&mm);
    return Py_BuildValue("(nLLLLLL)", i, count, slots_used, begin_ts, begin_phy, (long long)end_phy,
                         (long long)end_ts);
}
