/* ferrymq.store._speedups: declarations shared by its translation units.
 *
 * The extension is one module built from several C files, one per concern (setup.py lists them):
 *
 * | file                 | what                                                                      |
 * |----------------------|---------------------------------------------------------------------------|
 * | _speedups.c          | the module: method table, constants, init                                 |
 * | _speedups_crc.c      | CRC-32 (BODYCRC): carry-less multiplication folding, zlib fallback, crc32 |
 * | _speedups_scan.c     | record scans of reput: scan_dispatch (consume queue units, index entries) |
 * |                      | and index_put_many (index file)                                           |
 * | _speedups_batch.c    | batch encode: put_batch (SEND_BATCH body -> records), put_one (one SEND)  |
 * | _speedups_verify.c   | verification of replicated bytes: verify_records                          |
 * | _speedups_pull.c     | the pull scan: pull_scan (StoreReader._scan)                              |
 *
 * Loaded only through ferrymq/store/speedups.py (NATIVE); the pure-Python code in dispatch.py,
 * consume_queue.py, index.py, commit_log.py and reader.py is the reference and the fallback. Everything here
 * is written for ferrymq from the field tables below and at the top of each file; nothing is taken from
 * another implementation.
 *
 * Layouts read and written (all on-disk integers big-endian):
 *
 * Commit log record, IPv4 hosts (read by scan_dispatch, written whole by put_batch / put_one; see
 * common/message_codec.py):
 *
 * | offset | size  | field                                            | used here              |
 * |--------|-------|--------------------------------------------------|------------------------|
 * | 0      | 4     | TOTALSIZE                                        | record walk            |
 * | 4      | 4     | MAGICCODE 0xDAA320A7                             | acceptance             |
 * | 8      | 4     | BODYCRC                                          | pull scan (not reput)  |
 * | 12     | 4     | QUEUEID                                          | consume queue key      |
 * | 16     | 4     | FLAG                                             | no                     |
 * | 20     | 8     | QUEUEOFFSET                                      | consume queue position |
 * | 28     | 8     | PHYSICALOFFSET                                   | pull scan (reput: the  |
 * |        |       |                                                  |  walked position)      |
 * | 36     | 4     | SYSFLAG (0x10/0x20 IPv6 hosts, 0xC transaction)  | acceptance / hand-off  |
 * | 40     | 8     | BORNTIMESTAMP                                    | no                     |
 * | 48     | 8     | BORNHOST (IPv4 + port)                           | no                     |
 * | 56     | 8     | STORETIMESTAMP                                   | index, last timestamp  |
 * | 64     | 8     | STOREHOST                                        | no                     |
 * | 72     | 4     | RECONSUMETIMES                                   | no                     |
 * | 76     | 8     | PREPARED TRANSACTION OFFSET                      | no                     |
 * | 84     | 4 + n | BODYLENGTH + BODY                                | lengths only           |
 * |        | 1 + t | TOPICLENGTH (<= 127) + TOPIC                     | consume queue key      |
 * |        | 2 + p | PROPERTIESLENGTH (int16 >= 0) + PROPERTIES       | TAGS, KEYS, UNIQ_KEY   |
 *
 * PROPERTIES: name \x01 value, items separated by \x02; a name counts where it starts the blob or
 * follows \x02; the last occurrence wins. KEYS holds space-separated keys.
 */
#ifndef FERRYMQ_STORE_SPEEDUPS_H
#define FERRYMQ_STORE_SPEEDUPS_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <string.h>

/* symbols shared between the translation units of this extension: not exported from the shared object */
#if defined(__GNUC__) || defined(__clang__)
#define FERRY_INTERNAL __attribute__((visibility("hidden")))
#else
#define FERRY_INTERNAL
#endif
/* a method's docstring, defined in the unit of the method, referenced by the module's method table */
#define FERRY_DOC(name, text) FERRY_INTERNAL const char name[] = text

/* ---- commit log record ------------------------------------------------------------------- */
#define MESSAGE_MAGIC_CODE ((int32_t)0xDAA320A7u)
#define RECORD_MIN_SIZE 91
#define HEAD_V4_SIZE 88 /* fields up to and including BODYLENGTH */
#define OFFSET_TOTAL_SIZE 0
#define OFFSET_MAGIC 4
#define OFFSET_QUEUE_ID 12
#define OFFSET_QUEUE_OFFSET 20
#define OFFSET_SYS_FLAG 36
#define OFFSET_STORE_TIMESTAMP 56
#define OFFSET_BODY_LENGTH 84
#define TOPIC_LENGTH_MAX 127
#define TOPIC_LENGTH_SIZE 1
#define PROPERTIES_LENGTH_SIZE 2
#define SYSFLAG_HOST_V6_MASK 0x30
#define SYSFLAG_TRANSACTION_MASK 0xC
#define SYSFLAG_TRANSACTION_PREPARED 0x4
#define SYSFLAG_TRANSACTION_ROLLBACK 0xC
#define ASCII_MAX 0x7F
#define SCHEDULE_TOPIC "SCHEDULE_TOPIC_XXXX"

/* ---- properties -------------------------------------------------------------------------- */
#define PROPERTY_SEPARATOR 0x02
#define KEY_SEPARATOR ' '
#define TOPIC_KEY_SEPARATOR '#'
static const char TAGS_NEEDLE[] = "TAGS\x01";
static const char KEYS_NEEDLE[] = "KEYS\x01";
static const char UNIQ_NEEDLE[] = "UNIQ_KEY\x01";
#define NEEDLE_LEN(needle) ((Py_ssize_t)(sizeof(needle) - 1))

/* ---- consume queue / index --------------------------------------------------------------- */
#define CQ_UNIT_SIZE 20
#define INDEX_HEADER_SIZE 40
#define INDEX_SLOT_SIZE 4
#define INDEX_ENTRY_SIZE 20
#define INT32_MAX_VALUE 0x7FFFFFFFLL
#define MS_PER_SECOND 1000

/* ---- scan limits ------------------------------------------------------------------------- */
/* most records one scan_dispatch call looks at (the caller asks for fewer) */
#define SCAN_RECORDS_MAX (1 << 20)
/* most (topic, queue id) pairs in one scan window; the scan stops before a record that would add more */
#define SCAN_GROUPS_MAX 1024
/* fewest open-addressing slots for the groups (a power of two; grown to twice the group capacity) */
#define SCAN_GROUP_SLOTS_MIN 16
/* queue offsets at or above this (or negative) are left to the Python path */
#define QUEUE_OFFSET_LIMIT (1LL << 48)
/* initial capacity of the index entry array (grows by doubling) */
#define SCAN_INDEX_INITIAL 256
#define SCAN_INDEX_ENTRY_SIZE 24

/* why a scan stopped (returned to Python) */
#define SCAN_STOP_LIMIT 0   /* max_records records dispatched */
#define SCAN_STOP_END 1     /* reached `end` exactly */
#define SCAN_STOP_RECORD 2  /* the record at the returned position is for the Python path */
#define SCAN_STOP_GROUPS 3  /* SCAN_GROUPS_MAX queues in this window: call again */

#define OFFSET_BODY_CRC 8
#define OFFSET_FLAG 16
#define OFFSET_PHY_OFFSET 28
#define OFFSET_BORN_TIMESTAMP 40
#define OFFSET_BORN_HOST 48
#define OFFSET_STORE_HOST 64
#define OFFSET_RECONSUME_TIMES 72
#define OFFSET_PREPARED_OFFSET 76
#define HOST_V4_SIZE 8
#define BODY_CRC_MASK 0x7FFFFFFFu
#define NAME_VALUE_SEPARATOR 0x01

/* ---- big-endian helpers ------------------------------------------------------------------- */

static inline uint32_t rd_u32(const uint8_t *p)
{
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | (uint32_t)p[3];
}

static inline int32_t rd_i32(const uint8_t *p) { return (int32_t)rd_u32(p); }

static inline int16_t rd_i16(const uint8_t *p) { return (int16_t)(((uint16_t)p[0] << 8) | p[1]); }

static inline int64_t rd_i64(const uint8_t *p)
{
    return (int64_t)(((uint64_t)rd_u32(p) << 32) | (uint64_t)rd_u32(p + 4));
}

static inline void wr_u32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

static inline void wr_i64(uint8_t *p, int64_t v)
{
    wr_u32(p, (uint32_t)((uint64_t)v >> 32));
    wr_u32(p + 4, (uint32_t)(uint64_t)v);
}

/* ---- hashing ------------------------------------------------------------------------------ */

/* Java String.hashCode continued over ASCII bytes (each byte is one UTF-16 code unit) */
static inline uint32_t java_hash_continue(uint32_t h, const uint8_t *s, Py_ssize_t n)
{
    for (Py_ssize_t i = 0; i < n; i++)
        h = h * 31u + s[i];
    return h;
}

/* abs() of the signed int32 hash, Integer.MIN_VALUE -> 0 (IndexService key hash) */
static inline uint32_t key_hash_abs(uint32_t h)
{
    if (h & 0x80000000u) {
        h = 0u - h;
        if (h > (uint32_t)INT32_MAX_VALUE)
            h = 0;
    }
    return h;
}

/* every byte ASCII */
static inline int all_ascii(const uint8_t *s, Py_ssize_t n)
{
    uint8_t acc = 0;
    for (Py_ssize_t i = 0; i < n; i++)
        acc |= s[i];
    return acc <= ASCII_MAX;
}

/* ---- entry points and shared functions, by file ------------------------------------------------- */

/* _speedups_crc.c */
FERRY_INTERNAL void ferry_crc32_init(void);
FERRY_INTERNAL uint32_t ferry_crc32(uint32_t crc, const unsigned char *buf, size_t len);
FERRY_INTERNAL PyObject *crc32_py(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
FERRY_INTERNAL PyObject *crc32_constants(PyObject *self, PyObject *unused);
FERRY_INTERNAL PyObject *crc32_force_fallback(PyObject *self, PyObject *arg);
extern FERRY_INTERNAL const char crc32_doc[], crc32_constants_doc[], crc32_force_fallback_doc[];

/* _speedups_scan.c */
FERRY_INTERNAL PyObject *scan_dispatch(PyObject *self, PyObject *args);
FERRY_INTERNAL PyObject *index_put_many(PyObject *self, PyObject *args);
extern FERRY_INTERNAL const char scan_dispatch_doc[], index_put_many_doc[];

/* _speedups_batch.c */
FERRY_INTERNAL PyObject *put_batch(PyObject *self, PyObject *args);
FERRY_INTERNAL PyObject *put_one(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
extern FERRY_INTERNAL const char put_batch_doc[], put_one_doc[];

/* _speedups_verify.c */
FERRY_INTERNAL PyObject *verify_records(PyObject *self, PyObject *args);
extern FERRY_INTERNAL const char verify_records_doc[];

/* _speedups_pull.c */
FERRY_INTERNAL PyObject *pull_scan(PyObject *self, PyObject *args);
extern FERRY_INTERNAL const char pull_scan_doc[];

#endif /* FERRYMQ_STORE_SPEEDUPS_H */
