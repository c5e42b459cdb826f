/* ferrymq.store._speedups: the per-record work of reput (dispatch), of batch puts, of plain single
 * puts and of the pull scan in C.
 *
 * Loaded only through ferrymq/store/speedups.py (NATIVE); the pure-Python code in dispatch.py,
 * consume_queue.py and index.py is the reference and the fallback. Everything here is written for
 * ferrymq from the field tables below; nothing is taken from another implementation.
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

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <string.h>
#include <zlib.h>

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

/* ---- CRC-32 (BODYCRC): carry-less multiplication folding, zlib fallback ------------------------ */
/*
 * BODYCRC is the CRC-32 of zlib / gzip / IEEE 802.3 (the low 31 bits of it), generator polynomial
 *
 *     P(x) = x^32 + x^26 + x^23 + x^22 + x^16 + x^12 + x^11 + x^10 + x^8 + x^7 + x^5 + x^4 + x^2 + x + 1
 *
 * run bit-reflected (bit 0 of each byte first), register preset to all ones and complemented at the end.
 * ferry_crc32(crc, buf, len) takes and returns the same values as zlib's crc32(crc, buf, len) (a running
 * crc; 0 to start). Every "mod P" below is the remainder of a polynomial over GF(2) divided by P.
 *
 * Model. The register r = ~crc has the coefficient of x^(31-j) at bit j. XOR r into the first 4 bytes of
 * the message (little-endian); call the n bytes so changed M(x), the message's bit i (bit i%8 of byte i/8)
 * being the coefficient of x^(8n-1-i). Then the new register is M(x) * x^32 mod P, and ~register the result.
 *
 * Say a value "has N = n" when its bit k holds the coefficient of x^(n-k). A 16-byte block loaded
 * little-endian into a 128-bit lane has N = 127; its low 64-bit half is H with N = 63 (the block is
 * H * x^64 + L) and its high half is L with N = 63. PCLMULQDQ of u (N = nu) and v (N = nv) holds the
 * product of the two polynomials with N = nu + nv (bit k of the product is the XOR of u_i v_j over
 * i + j = k).
 *
 * Folding: an accumulator X (N = 127, degree < 128) is moved s bits along the message as
 * X * x^s = H * x^(64+s) + L * x^s. With a constant holding x^e mod P with N = 63 (its terms x^d, d < 32,
 * at bits 63-d), pclmul(H, x^(s+63) mod P) has N = 126, so read with N = 127 it is
 * H * x * (x^(s+63) mod P), congruent to H * x^(64+s); likewise pclmul(L, x^(s-1) mod P) to L * x^s. The
 * sum has degree < 96; the message block s bits on is XORed in.
 *
 * Four accumulators take 64 bytes per step (s = 512); then they fold into one (s = 128), which also takes
 * the remaining whole 16-byte blocks. Its register X * x^32 mod P is found in three steps:
 *   1. S = pclmul(H, x^95 mod P) xor (L << 32), congruent to X * x^32, degree < 96 (bits 0..31 zero);
 *   2. T = pclmul(S bits 0..63, x^63 mod P) xor S bits 64..127, congruent to S, degree < 64: as a 64-bit
 *      value t, N = 63;
 *   3. Barrett reduction: mu = floor(x^64 / P) (degree 32) and P itself, stored with N = 32 (term x^d at
 *      bit 32-d): q = bits 0..31 of pclmul(bits 0..31 of t, mu) is floor(T / P) (N = 31), and
 *      t xor pclmul(q, P) (N = 63) is T mod P, so its bits 32..63 are the register.
 * The bytes after the last whole block (fewer than 16), and inputs shorter than FERRY_CRC32_FOLD_MIN, go
 * through zlib's crc32. Nothing is read outside [buf, buf + len) (unaligned 16-byte loads only).
 *
 * | constant         | value              | definition                                  | used for            |
 * |------------------|--------------------|---------------------------------------------|---------------------|
 * | FERRY_CRC32_K575 | 0x653D982200000000 | x^575 mod P, N = 63 (term x^d at bit 63-d)  | s = 512, times H    |
 * | FERRY_CRC32_K511 | 0xCAD38E8F00000000 | x^511 mod P, N = 63                         | s = 512, times L    |
 * | FERRY_CRC32_K191 | 0x65673B4600000000 | x^191 mod P, N = 63                         | s = 128, times H    |
 * | FERRY_CRC32_K127 | 0x9BA54C6F00000000 | x^127 mod P, N = 63                         | s = 128, times L    |
 * | FERRY_CRC32_K95  | 0xCCAA009E00000000 | x^95 mod P, N = 63                          | step 1 (128 -> 96)  |
 * | FERRY_CRC32_K63  | 0xB8BC676500000000 | x^63 mod P, N = 63                          | step 2 (96 -> 64)   |
 * | FERRY_CRC32_MU   | 0x1F7011641        | floor(x^64 / P), N = 32 (term x^d at 32-d)  | step 3 (Barrett)    |
 * | FERRY_CRC32_POLY | 0x1DB710641        | P, N = 32                                   | step 3 (Barrett)    |
 *
 * The values are derived from P in tests/store/test_crc32_fast.py (crc32_constants), which checks them
 * against _crc32_constants() (same order as this table).
 */
#define FERRY_CRC32_K575 0x653D982200000000ULL
#define FERRY_CRC32_K511 0xCAD38E8F00000000ULL
#define FERRY_CRC32_K191 0x65673B4600000000ULL
#define FERRY_CRC32_K127 0x9BA54C6F00000000ULL
#define FERRY_CRC32_K95 0xCCAA009E00000000ULL
#define FERRY_CRC32_K63 0xB8BC676500000000ULL
#define FERRY_CRC32_MU 0x1F7011641ULL
#define FERRY_CRC32_POLY 0x1DB710641ULL
/* shorter inputs go to zlib (the folding starts with four 16-byte blocks) */
#define FERRY_CRC32_FOLD_MIN 64
/* zlib's crc32 takes a uInt length: longer inputs go in pieces of this size */
#define FERRY_CRC32_ZLIB_CHUNK (1u << 30)

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define FERRY_CRC32_HAVE_FOLD 1
#include <smmintrin.h> /* SSE4.1 */
#include <wmmintrin.h> /* PCLMULQDQ */
#else
#define FERRY_CRC32_HAVE_FOLD 0
#endif

/* zlib's crc32 over any length */
static uint32_t ferry_crc32_zlib(uint32_t crc, const unsigned char *buf, size_t len)
{
    uLong c = crc;
    while (len > 0) {
        uInt n = len > FERRY_CRC32_ZLIB_CHUNK ? FERRY_CRC32_ZLIB_CHUNK : (uInt)len;
        c = crc32(c, buf, n);
        buf += n;
        len -= n;
    }
    return (uint32_t)c;
}

#if FERRY_CRC32_HAVE_FOLD
/* X * x^s + next for the accumulator x, k = (x^(s+63) mod P, x^(s-1) mod P) in its (low, high) halves */
__attribute__((target("pclmul,sse4.1"))) static inline __m128i ferry_crc32_fold16(__m128i x, __m128i k,
                                                                                  __m128i next)
{
    __m128i h = _mm_clmulepi64_si128(x, k, 0x00); /* low half of x times low half of k */
    __m128i l = _mm_clmulepi64_si128(x, k, 0x11); /* high half of x times high half of k */
    return _mm_xor_si128(_mm_xor_si128(h, l), next);
}

#define FERRY_CRC32_LOAD(p) _mm_loadu_si128((const __m128i *)(const void *)(p))

/* len >= FERRY_CRC32_FOLD_MIN; only called when the CPU has PCLMULQDQ and SSE4.1 */
__attribute__((target("pclmul,sse4.1"))) static uint32_t ferry_crc32_fold(uint32_t crc, const unsigned char *buf,
                                                                          size_t len)
{
    const __m128i k512 = _mm_set_epi64x((long long)FERRY_CRC32_K511, (long long)FERRY_CRC32_K575);
    const __m128i k128 = _mm_set_epi64x((long long)FERRY_CRC32_K127, (long long)FERRY_CRC32_K191);
    const __m128i k_reduce = _mm_set_epi64x((long long)FERRY_CRC32_K63, (long long)FERRY_CRC32_K95);
    const __m128i barrett = _mm_set_epi64x((long long)FERRY_CRC32_POLY, (long long)FERRY_CRC32_MU);
    /* the register (~crc) XORed into the first 4 bytes */
    __m128i x0 = _mm_xor_si128(FERRY_CRC32_LOAD(buf), _mm_cvtsi32_si128((int)~crc));
    __m128i x1 = FERRY_CRC32_LOAD(buf + 16);
    __m128i x2 = FERRY_CRC32_LOAD(buf + 32);
    __m128i x3 = FERRY_CRC32_LOAD(buf + 48);
    const unsigned char *p = buf + 64;
    size_t left = len - 64;
    for (; left >= 64; p += 64, left -= 64) {
        x0 = ferry_crc32_fold16(x0, k512, FERRY_CRC32_LOAD(p));
        x1 = ferry_crc32_fold16(x1, k512, FERRY_CRC32_LOAD(p + 16));
        x2 = ferry_crc32_fold16(x2, k512, FERRY_CRC32_LOAD(p + 32));
        x3 = ferry_crc32_fold16(x3, k512, FERRY_CRC32_LOAD(p + 48));
    }
    x1 = ferry_crc32_fold16(x0, k128, x1);
    x2 = ferry_crc32_fold16(x1, k128, x2);
    x0 = ferry_crc32_fold16(x2, k128, x3);
    for (; left >= 16; p += 16, left -= 16)
        x0 = ferry_crc32_fold16(x0, k128, FERRY_CRC32_LOAD(p));
    /* 1. S = H * (x^95 mod P) xor L << 32 */
    __m128i s = _mm_xor_si128(_mm_clmulepi64_si128(x0, k_reduce, 0x00), _mm_slli_si128(_mm_srli_si128(x0, 8), 4));
    /* 2. t = (S bits 0..63) * (x^63 mod P) xor S bits 64..127, moved to the low half */
    __m128i t = _mm_srli_si128(_mm_xor_si128(_mm_clmulepi64_si128(s, k_reduce, 0x10), s), 8);
    /* 3. q = floor(T / P) from bits 0..31 of t and mu; the register is bits 32..63 of t xor q * P */
    __m128i q = _mm_clmulepi64_si128(_mm_cvtsi32_si128(_mm_cvtsi128_si32(t)), barrett, 0x00);
    q = _mm_cvtsi32_si128(_mm_cvtsi128_si32(q));
    __m128i r = _mm_xor_si128(t, _mm_clmulepi64_si128(q, barrett, 0x10));
    uint32_t reg = (uint32_t)_mm_extract_epi32(r, 1);
    return ferry_crc32_zlib(~reg, p, left);
}
#undef FERRY_CRC32_LOAD
#endif

/* the CPU has what ferry_crc32_fold needs (set by ferry_crc32_init at module init) */
static int ferry_crc32_fold_ok = 0;
/* zlib only, whatever the CPU (_crc32_force_fallback, for tests) */
static int ferry_crc32_forced_fallback = 0;
/* ferry_crc32 uses ferry_crc32_fold: ferry_crc32_fold_ok and not ferry_crc32_forced_fallback */
static int ferry_crc32_use_fold = 0;

static void ferry_crc32_init(void)
{
#if FERRY_CRC32_HAVE_FOLD
    __builtin_cpu_init();
    ferry_crc32_fold_ok = __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
#endif
    ferry_crc32_use_fold = ferry_crc32_fold_ok && !ferry_crc32_forced_fallback;
}

/* zlib's crc32(crc, buf, len), folded with carry-less multiplication when the CPU can */
static inline uint32_t ferry_crc32(uint32_t crc, const unsigned char *buf, size_t len)
{
#if FERRY_CRC32_HAVE_FOLD
    if (len >= FERRY_CRC32_FOLD_MIN && ferry_crc32_use_fold)
        return ferry_crc32_fold(crc, buf, len);
#endif
    return ferry_crc32_zlib(crc, buf, len);
}

/* ---- end of CRC-32 ------------------------------------------------------------------------------ */

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

static int all_ascii(const uint8_t *s, Py_ssize_t n)
{
    uint8_t acc = 0;
    for (Py_ssize_t i = 0; i < n; i++)
        acc |= s[i];
    return acc <= ASCII_MAX;
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

PyDoc_STRVAR(scan_dispatch_doc,
"scan_dispatch(buf, pos, end, max_records, file_from_offset, want_index)\n"
"-> (records, end_pos, last_store_timestamp, stop, runs, index_entries)\n\n"
"Walk the commit log records in buf[pos:end] (a segment; file_from_offset is its first phy offset)\n"
"while they are OK for check_record_meta and plain for dispatch; stop before the first other one\n"
"(stop=2) so the Python path handles it (at pos when a phy offset would not be an int64). runs: [(topic, queue_id, first_queue_offset, units)],\n"
"units = packed 20-byte consume queue units at consecutive queue offsets, per queue in order.\n"
"index_entries: packed scan index entries (24 bytes each) when want_index, else b''.");

static PyObject *scan_dispatch(PyObject *self, PyObject *args)
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

PyDoc_STRVAR(index_put_many_doc,
"index_put_many(mm, entries, start, slot_num, index_num, index_count, hash_slot_count,\n"
"               begin_timestamp, begin_phy_offset)\n"
"-> (next, index_count, hash_slot_count, begin_timestamp, begin_phy_offset, end_phy_offset, end_timestamp)\n\n"
"IndexFile.put_hashed_many for packed scan index entries[start:] written into the index file\n"
"buffer mm (slots and entries; the header is the caller's). next = first entry not put (full file).\n"
"end_phy_offset/end_timestamp are those of the last entry put (meaningless when next == start).");

static PyObject *index_put_many(PyObject *self, PyObject *args)
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

/* ---- batch put (SEND_BATCH_MESSAGE) -------------------------------------------------------- */

/* (the batch body entry layout is in the table at the top of this file) */
#define BATCH_ENTRY_HEAD_SIZE 20
#define BATCH_OFFSET_FLAG 12
#define BATCH_OFFSET_BODY_LENGTH 16
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
/* more property items than this (in one entry, after the merge) are left to the Python path */
#define BATCH_PROPS_ITEMS_MAX 64
#define BATCH_ENTRIES_INITIAL 256
#define MSG_ID_HEX_LEN 32 /* offset msgId: hex of store host (8 bytes) + phy offset (8 bytes) */

static const char PROP_WAIT[] = "WAIT";
static const char PROP_DELAY[] = "DELAY";
static const char PROP_TRAN_MSG[] = "TRAN_MSG";
static const char PROP_CLUSTER[] = "CLUSTER";

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
        /* DELAY / TRAN_MSG: the Python path decides (refuses the batch or stores the value as is) */
        if (prop_find(&pl, PROP_DELAY, NEEDLE_LEN(PROP_DELAY)) >= 0 ||
            prop_find(&pl, PROP_TRAN_MSG, NEEDLE_LEN(PROP_TRAN_MSG)) >= 0)
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

PyDoc_STRVAR(put_batch_doc,
"put_batch(mm, pos, room, batch_body, topic, queue_id, queue_offset, phy_offset, merge_props, cluster,\n"
"          born_host, store_host, born_timestamp, clock_ms, sys_flag, reconsume_times,\n"
"          max_props, max_body)\n"
"-> None | (count, total, offsets, msg_ids, store_timestamp)\n\n"
"The SEND_BATCH_MESSAGE put of CommitLog.put_batch_raw: validate the batch body and write one commit\n"
"log record per entry into mm at pos (queue offsets from queue_offset, phy offsets from phy_offset,\n"
"BODYCRC = zlib crc32 & 0x7FFFFFFF, properties merged with merge_props, WAIT dropped, CLUSTER set).\n"
"None: not handled (malformed, empty, non-ASCII properties, DELAY/TRAN_MSG, too many items, a size\n"
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
static PyObject *put_batch(PyObject *self, PyObject *args)
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

PyDoc_STRVAR(put_one_doc,
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

static PyObject *put_one(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *pinned = NULL;
    PyObject *result = put_one_impl(args, nargs, &pinned);
    Py_XDECREF(pinned);
    return result;
}

/* ---- crc32 (Python) ---------------------------------------------------------------------------- */

/* inputs at least this long are checksummed with the GIL released */
#define CRC32_NOGIL_LEN (64 * 1024)

PyDoc_STRVAR(crc32_doc,
"crc32(data, value=0, /) -> int\n\n"
"zlib.crc32: the CRC-32 of the C-contiguous bytes-like data continued from value (taken modulo 2**32), an\n"
"unsigned 32-bit int. Carry-less multiplication folding when the CPU has PCLMULQDQ and SSE4.1, else zlib.");

static PyObject *crc32_py(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 1 || nargs > 2) {
        PyErr_Format(PyExc_TypeError, nargs < 1 ? "crc32 expected at least 1 argument, got %zd"
                                                : "crc32 expected at most 2 arguments, got %zd", nargs);
        return NULL;
    }
    /* the same checks, in the same order, as zlib.crc32 */
    Py_buffer data;
    if (PyObject_GetBuffer(args[0], &data, PyBUF_SIMPLE) < 0)
        return NULL;
    if (!PyBuffer_IsContiguous(&data, 'C')) {
        PyErr_Format(PyExc_TypeError, "crc32() argument 1 must be contiguous buffer, not %.50s",
                     Py_TYPE(args[0])->tp_name);
        PyBuffer_Release(&data);
        return NULL;
    }
    uint32_t crc = 0;
    if (nargs == 2) {
        unsigned long value = PyLong_AsUnsignedLongMask(args[1]);
        if (value == (unsigned long)-1 && PyErr_Occurred()) {
            PyBuffer_Release(&data);
            return NULL;
        }
        crc = (uint32_t)value;
    }
    if (data.len >= CRC32_NOGIL_LEN) {
        Py_BEGIN_ALLOW_THREADS
        crc = ferry_crc32(crc, (const unsigned char *)data.buf, (size_t)data.len);
        Py_END_ALLOW_THREADS
    } else {
        crc = ferry_crc32(crc, (const unsigned char *)data.buf, (size_t)data.len);
    }
    PyBuffer_Release(&data);
    return PyLong_FromUnsignedLong(crc);
}

/* ---- replicated bytes check (slave) ------------------------------------------------------- */
#define BLANK_MAGIC_CODE ((int32_t)0xCBD43194u)
#define END_FILE_MIN_BLANK_LENGTH 8
#define VERIFY_END 0   /* reached end, or an incomplete record starts at pos: wait for more bytes */
#define VERIFY_BAD 1   /* the record at pos fails magic / size / physical offset / BODYCRC */
#define VERIFY_BLANK 2 /* an end-of-segment filler starts at pos */
#define VERIFY_OTHER 3 /* a record this loop does not check (IPv6 hosts): the caller checks it */
#define BODY_CRC_MASK 0x7FFFFFFFu

PyDoc_STRVAR(verify_records_doc,
"verify_records(buf, start, end, base_phy) -> (pos, status)\n\n"
"Walk the records in buf[start:end] (base_phy = the physical offset of buf[0]) checking magic, size,\n"
"PHYSICALOFFSET and BODYCRC, and stop at the first one that is incomplete or not OK. status: 0 end or\n"
"incomplete, 1 bad record at pos, 2 BLANK filler at pos, 3 a record with IPv6 hosts at pos (not checked).");

static PyObject *verify_records(PyObject *self, PyObject *args)
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

/* ---- pull scan (StoreReader._scan) ------------------------------------------------------- */
#define CQ_UNIT_SIZE 20
#define CQ_BLANK_SIZE 0x7FFFFFFF /* size of a consume queue unit that fills a hole */

PyDoc_STRVAR(pull_scan_doc,
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

static PyObject *pull_scan(PyObject *self, PyObject *args)
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

PyDoc_STRVAR(crc32_constants_doc,
"_crc32_constants() -> (K575, K511, K191, K127, K95, K63, MU, POLY)\n\n"
"The CRC-32 folding constants as compiled (the table in the CRC-32 section of _speedups.c); for tests.");

static PyObject *crc32_constants(PyObject *self, PyObject *unused)
{
    return Py_BuildValue("(KKKKKKKK)", FERRY_CRC32_K575, FERRY_CRC32_K511, FERRY_CRC32_K191, FERRY_CRC32_K127,
                         FERRY_CRC32_K95, FERRY_CRC32_K63, FERRY_CRC32_MU, FERRY_CRC32_POLY);
}

PyDoc_STRVAR(crc32_force_fallback_doc,
"_crc32_force_fallback(force) -> bool\n\n"
"force true: every CRC-32 of this module (crc32, put_batch, put_one BODYCRC) goes through zlib; false: the\n"
"carry-less multiplication path again where the CPU has it. Returns whether that path is now in use. For\n"
"tests (process-wide, not thread-safe against concurrent CRCs).");

static PyObject *crc32_force_fallback(PyObject *self, PyObject *arg)
{
    int force = PyObject_IsTrue(arg);
    if (force < 0)
        return NULL;
    ferry_crc32_forced_fallback = force;
    ferry_crc32_use_fold = ferry_crc32_fold_ok && !ferry_crc32_forced_fallback;
    return PyBool_FromLong(ferry_crc32_use_fold);
}

/* ---- module -------------------------------------------------------------------------------- */

static PyMethodDef speedups_methods[] = {
    {"scan_dispatch", scan_dispatch, METH_VARARGS, scan_dispatch_doc},
    {"index_put_many", index_put_many, METH_VARARGS, index_put_many_doc},
    {"put_batch", put_batch, METH_VARARGS, put_batch_doc},
    {"put_one", (PyCFunction)(void (*)(void))put_one, METH_FASTCALL, put_one_doc},
    {"crc32", (PyCFunction)(void (*)(void))crc32_py, METH_FASTCALL, crc32_doc},
    {"verify_records", verify_records, METH_VARARGS, verify_records_doc},
    {"pull_scan", pull_scan, METH_VARARGS, pull_scan_doc},
    {"_crc32_constants", crc32_constants, METH_NOARGS, crc32_constants_doc},
    {"_crc32_force_fallback", crc32_force_fallback, METH_O, crc32_force_fallback_doc},
    {NULL, NULL, 0, NULL},
};

static int speedups_exec(PyObject *module)
{
    ferry_crc32_init();
    if (PyModule_AddIntConstant(module, "SCAN_INDEX_ENTRY_SIZE", SCAN_INDEX_ENTRY_SIZE) < 0 ||
        PyModule_AddIntConstant(module, "SCAN_RECORDS_MAX", SCAN_RECORDS_MAX) < 0 ||
        PyModule_AddIntConstant(module, "SCAN_GROUPS_MAX", SCAN_GROUPS_MAX) < 0 ||
        PyModule_AddIntConstant(module, "SCAN_STOP_LIMIT", SCAN_STOP_LIMIT) < 0 ||
        PyModule_AddIntConstant(module, "SCAN_STOP_END", SCAN_STOP_END) < 0 ||
        PyModule_AddIntConstant(module, "SCAN_STOP_RECORD", SCAN_STOP_RECORD) < 0 ||
        PyModule_AddIntConstant(module, "SCAN_STOP_GROUPS", SCAN_STOP_GROUPS) < 0)
        return -1;
    return 0;
}

static PyModuleDef_Slot speedups_slots[] = {
    {Py_mod_exec, speedups_exec},
    {0, NULL},
};

static struct PyModuleDef speedups_module = {
    PyModuleDef_HEAD_INIT,
    "ferrymq.store._speedups",
    "Native reput helpers (see ferrymq.store.speedups; the pure-Python store code is the reference).",
    0,
    speedups_methods,
    speedups_slots,
    NULL,
    NULL,
    NULL,
};

PyMODINIT_FUNC PyInit__speedups(void) { return PyModuleDef_Init(&speedups_module); }
