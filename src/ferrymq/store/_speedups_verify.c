/* ferrymq.store._speedups, verification of replicated bytes: verify_records walks the records a slave
 * received and checks each (pure-Python twin: store/commit_log.py check_record).
 *
 * | record field                   | offset         | size | checked                                   |
 * |--------------------------------|----------------|------|-------------------------------------------|
 * | TOTALSIZE                      | 0              | 4    | >= RECORD_MIN_SIZE, the record ends in buf |
 * | MAGICCODE                      | 4              | 4    | message magic; BLANK magic = segment end   |
 * | BODYCRC                        | 8              | 4    | crc32(BODY) & 0x7FFFFFFF                   |
 * | PHYSICALOFFSET                 | 28             | 8    | = base_phy + position                      |
 * | SYSFLAG                        | 36             | 4    | IPv6 hosts: left to the caller             |
 * | BODYLENGTH + BODY              | 84             | 4+n  | n >= 0, inside the record                  |
 * | TOPICLENGTH + TOPIC            | 88 + n         | 1+t  | t <= 127                                   |
 * | PROPERTIESLENGTH + PROPERTIES  | 89 + n + t     | 2+p  | p >= 0, ends exactly at TOTALSIZE          |
 *
 * BLANK filler at a segment's end: TOTALSIZE (>= 8), then BLANK_MAGIC_CODE.
 */
#include "_speedups.h"

/* ---- replicated bytes check (slave) ------------------------------------------------------- */
#define BLANK_MAGIC_CODE ((int32_t)0xCBD43194u)
#define END_FILE_MIN_BLANK_LENGTH 8
#define VERIFY_END 0   /* reached end, or an incomplete record starts at pos: wait for more bytes */
#define VERIFY_BAD 1   /* the record at pos fails magic / size / physical offset / BODYCRC */
#define VERIFY_BLANK 2 /* an end-of-segment filler starts at pos */
#define VERIFY_OTHER 3 /* a record this loop does not check (IPv6 hosts): the caller checks it */

FERRY_DOC(verify_records_doc,
"verify_records(buf, start, end, base_phy) -> (pos, status)\n\n"
"Walk the records in buf[start:end] (base_phy = the physical offset of buf[0]) checking magic, size,\n"
"PHYSICALOFFSET and BODYCRC, and stop at the first one that is incomplete or not OK. status: 0 end or\n"
"incomplete, 1 bad record at pos, 2 BLANK filler at pos, 3 a record with IPv6 hosts at pos (not checked).");

FERRY_INTERNAL PyObject *verify_records(PyObject *self, PyObject *args)
{
    Py_buffer b;
    Py_ssize_t start, end;
    long long base_phy;
    if (!PyArg_ParseTuple(args, "y*nnL", &b, &start, &end, &base_phy))
        return NULL;
    if (end > b.len)
        end = b.len;
    if (start < 0)
        start = 0;
    const uint8_t *p = (const uint8_t *)b.buf;
    Py_ssize_t pos = start;
    int status = VERIFY_END;
    Py_BEGIN_ALLOW_THREADS
    while (pos + 8 <= end) {
        const uint8_t *r = p + pos;
        int32_t total = rd_i32(r + OFFSET_TOTAL_SIZE);
        int32_t magic = rd_i32(r + OFFSET_MAGIC);
        if (magic == BLANK_MAGIC_CODE) {
            status = total >= END_FILE_MIN_BLANK_LENGTH ? VERIFY_BLANK : VERIFY_BAD;
            break;
        }
        if (magic != MESSAGE_MAGIC_CODE || total < RECORD_MIN_SIZE) {
            status = VERIFY_BAD;
            break;
        }
        if (pos + (Py_ssize_t)total > end)
            break; /* incomplete */
        if (rd_i64(r + OFFSET_PHY_OFFSET) != base_phy + (long long)pos) {
            status = VERIFY_BAD;
            break;
        }
        if (rd_i32(r + OFFSET_SYS_FLAG) & SYSFLAG_HOST_V6_MASK) {
            status = VERIFY_OTHER;
            break;
        }
        int32_t body_len = rd_i32(r + OFFSET_BODY_LENGTH);
        if (body_len < 0 || (int64_t)HEAD_V4_SIZE + body_len + 3 > (int64_t)total) {
            status = VERIFY_BAD;
            break;
        }
        /* TOPICLENGTH + TOPIC + PROPERTIESLENGTH + PROPERTIES end exactly at the record's end */
        int64_t t = (int64_t)HEAD_V4_SIZE + body_len;
        int topic_len = r[t];
        if (topic_len > TOPIC_LENGTH_MAX || t + 1 + topic_len + 2 > (int64_t)total) {
            status = VERIFY_BAD;
            break;
        }
        int16_t props_len = (int16_t)(((uint16_t)r[t + 1 + topic_len] << 8) | r[t + 2 + topic_len]);
        if (props_len < 0 || t + 1 + topic_len + 2 + props_len != (int64_t)total) {
            status = VERIFY_BAD;
            break;
        }
        uint32_t crc = ferry_crc32(0, r + HEAD_V4_SIZE, (size_t)body_len) & BODY_CRC_MASK;
        if ((uint32_t)rd_i32(r + OFFSET_BODY_CRC) != crc) {
            status = VERIFY_BAD;
            break;
        }
        pos += total;
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&b);
    return Py_BuildValue("(ni)", pos, status);
}
