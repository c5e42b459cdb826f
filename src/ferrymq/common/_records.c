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

static PyMethodDef records_methods[] = {
    {"scan_pull_body", scan_pull_body, METH_VARARGS, scan_pull_body_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef records_module = {
    PyModuleDef_HEAD_INIT, "ferrymq.common._records",
    "One C pass over PULL bodies for the Spark source (see ferrymq/common/records.py).", -1, records_methods,
};

PyMODINIT_FUNC PyInit__records(void) { return PyModule_Create(&records_module); }
