/* ferrymq.store._speedups, the pull scan: pull_scan serves the records named by consume queue units straight
 * from a mapped commit log segment (pure-Python twin: store/reader.py StoreReader._scan).
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
 * Each record it serves passes the fast check on the fields of the record layout (_speedups.h): MAGICCODE,
 * TOTALSIZE = the unit's size, PHYSICALOFFSET = the unit's offset, IPv4 hosts (SYSFLAG), BODYLENGTH and
 * BODYCRC.
 */
#include "_speedups.h"

/* ---- pull scan (StoreReader._scan) ------------------------------------------------------- */
#define CQ_BLANK_SIZE 0x7FFFFFFF /* size of a consume queue unit that fills a hole */

FERRY_DOC(pull_scan_doc,
"pull_scan(units, i, mm, file_from, wrote_pos, data_start, first_queue_offset, max_msg_nums,\n"
"          count_mem, bytes_mem, count_disk, bytes_disk, max_phy, memory, total_bytes, buffers,\n"
"          queue_offsets) -> (i, total_bytes, last_phy)\n\n"
"StoreReader._scan's loop for the units it can take without the Python path: starting at byte i of the\n"
"packed consume queue units, skip BLANK units and serve every record that lies wholly in the segment mm\n"
"(file_from = its first physical offset, wrote_pos = its written bytes) at or after data_start and passes\n"
"the fast check (magic, TOTALSIZE = the unit's size, PHYSICALOFFSET, IPv4 hosts, BODYLENGTH, BODYCRC):\n"
"its bytes are appended to buffers and its queue offset (first_queue_offset + unit index) to\n"
"queue_offsets. Stops before the first unit that is outside the segment, would overfill the answer\n"
"(max_msg_nums, and the in-memory or on-disk count / byte caps chosen by max_phy - phy > memory) or\n"
"fails the check; the caller takes that unit. last_phy = the physical offset of the last non-BLANK\n"
"unit taken, -1 if none.");

FERRY_INTERNAL PyObject *pull_scan(PyObject *self, PyObject *args)
{
    Py_buffer u, m;
    Py_ssize_t i;
    long long file_from, wrote_pos, data_start, first_qoff, max_phy, memory, total_bytes;
    long long max_msg_nums, count_mem, bytes_mem, count_disk, bytes_disk;
    PyObject *buffers, *qoffs;
    if (!PyArg_ParseTuple(args, "y*ny*LLLLLLLLLLLLO!O!", &u, &i, &m, &file_from, &wrote_pos, &data_start,
                          &first_qoff, &max_msg_nums, &count_mem, &bytes_mem, &count_disk, &bytes_disk,
                          &max_phy, &memory, &total_bytes, &PyList_Type, &buffers, &PyList_Type, &qoffs))
        return NULL;
    const uint8_t *units = (const uint8_t *)u.buf;
    const uint8_t *seg = (const uint8_t *)m.buf;
    if (wrote_pos > (long long)m.len)
        wrote_pos = (long long)m.len;
    long long seg_end = file_from + wrote_pos;
    long long last_phy = -1;
    if (i < 0 || i % CQ_UNIT_SIZE) {
        PyBuffer_Release(&u);
        PyBuffer_Release(&m);
        PyErr_SetString(PyExc_ValueError, "pull_scan: i must be a unit boundary >= 0");
        return NULL;
    }
    while (i + CQ_UNIT_SIZE <= u.len) {
        const uint8_t *unit = units + i;
        long long phy = rd_i64(unit);
        int32_t size = rd_i32(unit + 8);
        if (size == CQ_BLANK_SIZE) {
            i += CQ_UNIT_SIZE;
            continue;
        }
        if (size < RECORD_MIN_SIZE || phy < file_from || phy < data_start || phy + size > seg_end)
            break;
        Py_ssize_t count = PyList_GET_SIZE(buffers);
        if (total_bytes != 0 && count != 0) {
            if (count >= max_msg_nums)
                break;
            int in_disk = max_phy - phy > memory;
            long long cap_bytes = in_disk ? bytes_disk : bytes_mem;
            long long cap_count = in_disk ? count_disk : count_mem;
            if (total_bytes + size > cap_bytes || count > cap_count - 1)
                break;
        }
        const uint8_t *r = seg + (phy - file_from);
        int32_t body_len = rd_i32(r + OFFSET_BODY_LENGTH);
        if (rd_i32(r + OFFSET_MAGIC) != MESSAGE_MAGIC_CODE || rd_i32(r + OFFSET_TOTAL_SIZE) != size
            || rd_i64(r + OFFSET_PHY_OFFSET) != phy || (rd_i32(r + OFFSET_SYS_FLAG) & SYSFLAG_HOST_V6_MASK)
            || body_len < 0 || body_len > size - RECORD_MIN_SIZE
            || (ferry_crc32(0, r + HEAD_V4_SIZE, (size_t)body_len) & BODY_CRC_MASK)
                   != (uint32_t)rd_i32(r + OFFSET_BODY_CRC))
            break;
        PyObject *record = PyBytes_FromStringAndSize((const char *)r, size);
        if (record == NULL)
            break;
        int failed = PyList_Append(buffers, record);
        Py_DECREF(record);
        if (failed)
            break;
        PyObject *qoff = PyLong_FromLongLong(first_qoff + i / CQ_UNIT_SIZE);
        if (qoff == NULL)
            break;
        failed = PyList_Append(qoffs, qoff);
        Py_DECREF(qoff);
        if (failed)
            break;
        total_bytes += size;
        last_phy = phy;
        i += CQ_UNIT_SIZE;
    }
    PyBuffer_Release(&u);
    PyBuffer_Release(&m);
    if (PyErr_Occurred())
        return NULL;
    return Py_BuildValue("(nLL)", i, total_bytes, last_phy);
}
