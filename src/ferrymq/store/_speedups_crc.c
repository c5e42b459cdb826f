/* ferrymq.store._speedups, CRC-32: BODYCRC of commit log records (and _speedups.crc32, zlib.crc32's twin).
 *
 * | record field | offset | size | value                                                         |
 * |--------------|--------|------|---------------------------------------------------------------|
 * | BODYCRC      | 8      | 4    | crc32(BODY) & 0x7FFFFFFF (the record layout: _speedups.h)      |
 *
 * The derivation and the folding constants are in the table of the section below. Pure-Python twin:
 * zlib.crc32 (store/commit_log.py, message_codec.py).
 */
#include "_speedups.h"

#include <zlib.h>

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

FERRY_INTERNAL void ferry_crc32_init(void)
{
#if FERRY_CRC32_HAVE_FOLD
    __builtin_cpu_init();
    ferry_crc32_fold_ok = __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
#endif
    ferry_crc32_use_fold = ferry_crc32_fold_ok && !ferry_crc32_forced_fallback;
}

/* zlib's crc32(crc, buf, len), folded with carry-less multiplication when the CPU can */
FERRY_INTERNAL uint32_t ferry_crc32(uint32_t crc, const unsigned char *buf, size_t len)
{
#if FERRY_CRC32_HAVE_FOLD
    if (len >= FERRY_CRC32_FOLD_MIN && ferry_crc32_use_fold)
        return ferry_crc32_fold(crc, buf, len);
#endif
    return ferry_crc32_zlib(crc, buf, len);
}

/* ---- end of CRC-32 ------------------------------------------------------------------------------ */

/* ---- crc32 (Python) ---------------------------------------------------------------------------- */

/* inputs at least this long are checksummed with the GIL released */
#define CRC32_NOGIL_LEN (64 * 1024)

FERRY_DOC(crc32_doc,
"crc32(data, value=0, /) -> int\n\n"
"zlib.crc32: the CRC-32 of the C-contiguous bytes-like data continued from value (taken modulo 2**32), an\n"
"unsigned 32-bit int. Carry-less multiplication folding when the CPU has PCLMULQDQ and SSE4.1, else zlib.");

FERRY_INTERNAL PyObject *crc32_py(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
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

FERRY_DOC(crc32_constants_doc,
"_crc32_constants() -> (K575, K511, K191, K127, K95, K63, MU, POLY)\n\n"
"The CRC-32 folding constants as compiled (the table in the CRC-32 section of _speedups_crc.c); for tests.");

FERRY_INTERNAL PyObject *crc32_constants(PyObject *self, PyObject *unused)
{
    return Py_BuildValue("(KKKKKKKK)", FERRY_CRC32_K575, FERRY_CRC32_K511, FERRY_CRC32_K191, FERRY_CRC32_K127,
                         FERRY_CRC32_K95, FERRY_CRC32_K63, FERRY_CRC32_MU, FERRY_CRC32_POLY);
}

FERRY_DOC(crc32_force_fallback_doc,
"_crc32_force_fallback(force) -> bool\n\n"
"force true: every CRC-32 of this module (crc32, put_batch, put_one BODYCRC) goes through zlib; false: the\n"
"carry-less multiplication path again where the CPU has it. Returns whether that path is now in use. For\n"
"tests (process-wide, not thread-safe against concurrent CRCs).");

FERRY_INTERNAL PyObject *crc32_force_fallback(PyObject *self, PyObject *arg)
{
    int force = PyObject_IsTrue(arg);
    if (force < 0)
        return NULL;
    ferry_crc32_forced_fallback = force;
    ferry_crc32_use_fold = ferry_crc32_fold_ok && !ferry_crc32_forced_fallback;
    return PyBool_FromLong(ferry_crc32_use_fold);
}
