/* ferrymq.remoting._codec: the per-request pieces of the remoting codec in C (optional; sans-IO).
 *
 * Loaded only by ferrymq/remoting/codec.py (EXTENSION / NATIVE). The Python code there and in
 * broker/headers.py is the reference and the fallback: every function below either returns exactly what
 * the Python path returns for the same input, or declines (returns None, or stops early) and the Python
 * path decides, with its own checks and error messages. Written for ferrymq from the layouts below.
 *
 * Remoting frame (all integers big-endian; see the table at the top of codec.py):
 *
 * | offset | size | field            | handled here                                              |
 * |--------|------|------------------|-----------------------------------------------------------|
 * | 0      | 4    | length (int32)   | 4 <= length <= max_frame_bytes, whole frame present        |
 * | 4      | 4    | headerLenAndType | high byte 0 (JSON) only; H <= length - 4, H <= max header  |
 * | 8      | H    | JSON header      | orjson.loads; the usual header only (see decode_frames)   |
 * | 8+H    | rest | body             | copied into a bytes object                                |
 *
 * Functions:
 *
 * | function                         | Python reference                                               |
 * |----------------------------------|----------------------------------------------------------------|
 * | set_class(kind, cls, fields)     | registers RemotingCommand ("command") / SendHeader ("send_header"): |
 * |                                  | a slots class whose fields are filled in place (no __init__ frame)  |
 * | set_json_loads(loads)            | the JSON parser (orjson.loads)                                  |
 * | set_send_ok_template(parts)      | the 5 literal parts of codec._SEND_OK_HEADER around its 4 fields |
 * | decode_frames(buf, pos, max_frame, max_header) -> (commands, pos) | FrameDecoder.feed's loop over whole |
 * |                                  | JSON frames with the usual header (decode_json_header's first branch); |
 * |                                  | stops at the first frame it does not take                       |
 * | encode_send_ok(opaque, msg_id, queue_id, queue_offset) -> bytes | encode_send_ok_response (JSON) |
 * | send_header_v2(ext, is_batch)    | SendHeader._parse_v2 for V2 letters (None: use it)              |
 * | encode_json(cmd) -> bytes | None | codec.encode of a JSON command: the header as orjson writes it  |
 * |                                  | (keys code, extFields, flag, language, opaque,                 |
 * |                                  | serializeTypeCurrentRPC, version[, remark]); exact str/int/dict |
 * |                                  | fields only (None: the Python encoder)                          |
 *
 * JSON strings are written as orjson writes them: UTF-8, '"' and '\\' escaped, \b \t \n \f \r, other
 * control characters as \u00xx (lowercase hex), everything else (DEL and non-ASCII included) as it is.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#include <stdint.h>
#include <string.h>

#define MAX_SLOTS 16
/* msg ids longer than this take the Python encoder */
#define MAX_MSG_ID_CHARS 128
/* decimal digits of a 64-bit integer with its sign */
#define MAX_INT_TEXT 24
/* int header fields of up to this many characters are inside the Java int range (long: 18) */
#define INT_FIELD_MAX_CHARS 9
#define LONG_FIELD_MAX_CHARS 18

typedef struct {
    PyTypeObject *cls;
    Py_ssize_t n;
    Py_ssize_t offsets[MAX_SLOTS];
} SlotClass;

#define COMMAND_FIELDS 9   /* code, ext_fields, body, opaque, flag, remark, language, version, serialize_type */
#define SEND_HEADER_FIELDS 13

static SlotClass command_class;
static SlotClass send_header_class;
static PyObject *json_loads;
static PyObject *send_ok_parts[5];

/* interned keys */
static PyObject *k_code, *k_opaque, *k_flag, *k_version, *k_language, *k_ext_fields, *k_remark, *k_topic;
static PyObject *k_letters[14]; /* "a" .. "n" */
static PyObject *s_default_topic; /* "TBW102" */
static PyObject *s_empty;         /* "" */

static int
set_slot_class(SlotClass *sc, PyObject *cls, PyObject *fields, Py_ssize_t expected)
{
    if (!PyType_Check(cls)) {
        PyErr_SetString(PyExc_TypeError, "set_class: not a class");
        return -1;
    }
    if (!PyTuple_Check(fields) || PyTuple_GET_SIZE(fields) != expected) {
        PyErr_Format(PyExc_ValueError, "set_class: expected a tuple of %zd field names", expected);
        return -1;
    }
    PyTypeObject *t = (PyTypeObject *)cls;
    if (t->tp_itemsize != 0 || t->tp_dictoffset != 0) {
        PyErr_SetString(PyExc_TypeError, "set_class: the class must be a slots class without __dict__");
        return -1;
    }
    Py_ssize_t offsets[MAX_SLOTS];
    for (Py_ssize_t i = 0; i < expected; i++) {
        PyObject *name = PyTuple_GET_ITEM(fields, i);
        PyObject *d = PyDict_GetItemWithError(t->tp_dict, name);
        if (d == NULL) {
            if (!PyErr_Occurred()) {
                PyErr_Format(PyExc_TypeError, "set_class: %R is not a slot of the class", name);
            }
            return -1;
        }
        if (Py_TYPE(d) != &PyMemberDescr_Type) {
            PyErr_Format(PyExc_TypeError, "set_class: %R is not a slot of the class", name);
            return -1;
        }
        PyMemberDef *m = ((PyMemberDescrObject *)d)->d_member;
        if (m->type != T_OBJECT_EX || (m->flags & READONLY)) {
            PyErr_Format(PyExc_TypeError, "set_class: %R is not a writable object slot", name);
            return -1;
        }
        offsets[i] = m->offset;
    }
    Py_INCREF(cls);
    Py_XSETREF(sc->cls, t);
    sc->n = expected;
    memcpy(sc->offsets, offsets, sizeof(Py_ssize_t) * (size_t)expected);
    return 0;
}

/* A new instance with every slot set from vals (references stolen, also on failure). */
static PyObject *
new_filled(SlotClass *sc, PyObject **vals)
{
    PyObject *obj = sc->cls->tp_alloc(sc->cls, 0);
    if (obj == NULL) {
        for (Py_ssize_t i = 0; i < sc->n; i++) {
            Py_DECREF(vals[i]);
        }
        return NULL;
    }
    for (Py_ssize_t i = 0; i < sc->n; i++) {
        *(PyObject **)((char *)obj + sc->offsets[i]) = vals[i];
    }
    return obj;
}

static PyObject *
codec_set_class(PyObject *self, PyObject *args)
{
    const char *kind;
    PyObject *cls, *fields;
    if (!PyArg_ParseTuple(args, "sOO:set_class", &kind, &cls, &fields)) {
        return NULL;
    }
    int rc;
    if (strcmp(kind, "command") == 0) {
        rc = set_slot_class(&command_class, cls, fields, COMMAND_FIELDS);
    } else if (strcmp(kind, "send_header") == 0) {
        rc = set_slot_class(&send_header_class, cls, fields, SEND_HEADER_FIELDS);
    } else {
        PyErr_Format(PyExc_ValueError, "set_class: unknown kind %s", kind);
        return NULL;
    }
    if (rc < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *
codec_set_json_loads(PyObject *self, PyObject *loads)
{
    if (!PyCallable_Check(loads)) {
        PyErr_SetString(PyExc_TypeError, "set_json_loads: not callable");
        return NULL;
    }
    Py_INCREF(loads);
    Py_XSETREF(json_loads, loads);
    Py_RETURN_NONE;
}

static PyObject *
codec_set_send_ok_template(PyObject *self, PyObject *parts)
{
    if (!PyTuple_Check(parts) || PyTuple_GET_SIZE(parts) != 5) {
        PyErr_SetString(PyExc_ValueError, "set_send_ok_template: expected a tuple of 5 bytes");
        return NULL;
    }
    for (int i = 0; i < 5; i++) {
        if (!PyBytes_CheckExact(PyTuple_GET_ITEM(parts, i))) {
            PyErr_SetString(PyExc_TypeError, "set_send_ok_template: expected bytes");
            return NULL;
        }
    }
    for (int i = 0; i < 5; i++) {
        PyObject *p = PyTuple_GET_ITEM(parts, i);
        Py_INCREF(p);
        Py_XSETREF(send_ok_parts[i], p);
    }
    Py_RETURN_NONE;
}

static inline int32_t
be_i32(const unsigned char *p)
{
    return (int32_t)(((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | (uint32_t)p[3]);
}

static inline uint32_t
be_u32(const unsigned char *p)
{
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | (uint32_t)p[3];
}

static inline void
put_be32(char *p, uint32_t v)
{
    p[0] = (char)(v >> 24);
    p[1] = (char)(v >> 16);
    p[2] = (char)(v >> 8);
    p[3] = (char)v;
}

/* decode_json_header's first branch. Returns a new command, Py_None (new reference: not the usual header or
 * not JSON; the Python path decodes it and answers), or NULL with an exception (memory). */
static PyObject *
usual_command(PyObject *header, PyObject *body)
{
    PyObject *obj = PyObject_CallOneArg(json_loads, header);
    if (obj == NULL) {
        if (PyErr_ExceptionMatches(PyExc_ValueError)) { /* orjson.JSONDecodeError */
            PyErr_Clear();
            Py_RETURN_NONE;
        }
        return NULL;
    }
    if (!PyDict_CheckExact(obj)) {
        Py_DECREF(obj);
        Py_RETURN_NONE;
    }
    PyObject *code = PyDict_GetItemWithError(obj, k_code);
    PyObject *opaque = code ? PyDict_GetItemWithError(obj, k_opaque) : NULL;
    PyObject *flag = opaque ? PyDict_GetItemWithError(obj, k_flag) : NULL;
    PyObject *version = flag ? PyDict_GetItemWithError(obj, k_version) : NULL;
    PyObject *language = version ? PyDict_GetItemWithError(obj, k_language) : NULL;
    PyObject *ext = language ? PyDict_GetItemWithError(obj, k_ext_fields) : NULL;
    if (ext == NULL || !PyLong_CheckExact(code) || !PyLong_CheckExact(opaque) || !PyLong_CheckExact(flag)
            || !PyLong_CheckExact(version) || !PyUnicode_CheckExact(language) || !PyDict_CheckExact(ext)) {
        Py_DECREF(obj);
        if (PyErr_Occurred()) {
            return NULL;
        }
        Py_RETURN_NONE;
    }
    int overflow = 0;
    long long op = PyLong_AsLongLongAndOverflow(opaque, &overflow);
    if (overflow || op < INT32_MIN || op > INT32_MAX) {
        Py_DECREF(obj);
        Py_RETURN_NONE;
    }
    Py_ssize_t i = 0;
    PyObject *key, *value;
    while (PyDict_Next(ext, &i, &key, &value)) {
        if (!PyUnicode_Check(value)) {
            Py_DECREF(obj);
            Py_RETURN_NONE;
        }
    }
    PyObject *remark = PyDict_GetItemWithError(obj, k_remark);
    if (remark == NULL && PyErr_Occurred()) {
        Py_DECREF(obj);
        return NULL;
    }
    if (remark == NULL || !PyUnicode_CheckExact(remark)) {
        remark = Py_None;
    }
    PyObject *stype = PyLong_FromLong(0);
    if (stype == NULL) {
        Py_DECREF(obj);
        return NULL;
    }
    PyObject *vals[COMMAND_FIELDS] = {code, ext, body, opaque, flag, remark, language, version, stype};
    for (int j = 0; j < COMMAND_FIELDS - 1; j++) {
        Py_INCREF(vals[j]);
    }
    Py_DECREF(obj);
    return new_filled(&command_class, vals);
}

static PyObject *
codec_decode_frames(PyObject *self, PyObject *args)
{
    PyObject *data;
    Py_ssize_t pos, max_frame, max_header;
    if (!PyArg_ParseTuple(args, "Onnn:decode_frames", &data, &pos, &max_frame, &max_header)) {
        return NULL;
    }
    if (command_class.cls == NULL || json_loads == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "decode_frames: set_class('command') and set_json_loads first");
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(data, &view, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    const unsigned char *p = (const unsigned char *)view.buf;
    Py_ssize_t n = view.len;
    if (pos < 0 || pos > n) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "decode_frames: position out of range");
        return NULL;
    }
    PyObject *out = PyList_New(0);
    if (out == NULL) {
        PyBuffer_Release(&view);
        return NULL;
    }
    while (n - pos >= 8) {
        int32_t length = be_i32(p + pos);
        if (length < 4 || (Py_ssize_t)length > max_frame || n - pos - 4 < (Py_ssize_t)length) {
            break; /* bad length (the Python path raises) or an incomplete frame (kept) */
        }
        uint32_t word = be_u32(p + pos + 4);
        Py_ssize_t hlen = (Py_ssize_t)(word & 0xFFFFFF);
        if ((word >> 24) != 0 || hlen > (Py_ssize_t)length - 4 || hlen > max_header) {
            break;
        }
        const char *hp = (const char *)p + pos + 8;
        PyObject *header = PyBytes_FromStringAndSize(hp, hlen);
        if (header == NULL) {
            goto fail;
        }
        PyObject *body = PyBytes_FromStringAndSize(hp + hlen, (Py_ssize_t)length - 4 - hlen);
        if (body == NULL) {
            Py_DECREF(header);
            goto fail;
        }
        PyObject *cmd = usual_command(header, body);
        Py_DECREF(header);
        Py_DECREF(body);
        if (cmd == NULL) {
            goto fail;
        }
        if (cmd == Py_None) {
            Py_DECREF(cmd);
            break;
        }
        int rc = PyList_Append(out, cmd);
        Py_DECREF(cmd);
        if (rc < 0) {
            goto fail;
        }
        pos += 4 + (Py_ssize_t)length;
    }
    PyBuffer_Release(&view);
    return Py_BuildValue("(Nn)", out, pos);
fail:
    PyBuffer_Release(&view);
    Py_DECREF(out);
    return NULL;
}

/* Appends the decimal text of v; returns the new end. */
static char *
put_decimal(char *w, long long v)
{
    char tmp[MAX_INT_TEXT];
    int k = 0;
    unsigned long long u = v < 0 ? 0ULL - (unsigned long long)v : (unsigned long long)v;
    do {
        tmp[k++] = (char)('0' + (int)(u % 10));
        u /= 10;
    } while (u);
    if (v < 0) {
        *w++ = '-';
    }
    while (k) {
        *w++ = tmp[--k];
    }
    return w;
}

static int
exact_long(PyObject *o, long long *out)
{
    if (!PyLong_CheckExact(o)) {
        return 0;
    }
    int overflow = 0;
    *out = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (overflow || (*out == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return 0;
    }
    return 1;
}

static PyObject *
codec_encode_send_ok(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "encode_send_ok(opaque, msg_id, queue_id, queue_offset)");
        return NULL;
    }
    if (send_ok_parts[0] == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "encode_send_ok: set_send_ok_template first");
        return NULL;
    }
    long long opaque, queue_id, queue_offset;
    PyObject *msg_id = args[1];
    if (!exact_long(args[0], &opaque) || !exact_long(args[2], &queue_id) || !exact_long(args[3], &queue_offset)
            || !PyUnicode_Check(msg_id)) {
        Py_RETURN_NONE;
    }
    if (PyUnicode_READY(msg_id) < 0) {
        return NULL;
    }
    if (!PyUnicode_IS_ASCII(msg_id)) {
        Py_RETURN_NONE;
    }
    Py_ssize_t id_len = PyUnicode_GET_LENGTH(msg_id);
    if (id_len == 0 || id_len > MAX_MSG_ID_CHARS) {
        Py_RETURN_NONE;
    }
    const Py_UCS1 *id = PyUnicode_1BYTE_DATA(msg_id);
    for (Py_ssize_t i = 0; i < id_len; i++) {
        Py_UCS1 c = id[i];
        if (!((c >= '0' && c <= '9') || (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z'))) {
            Py_RETURN_NONE;
        }
    }
    Py_ssize_t fixed = 0;
    for (int i = 0; i < 5; i++) {
        fixed += PyBytes_GET_SIZE(send_ok_parts[i]);
    }
    Py_ssize_t cap = 8 + fixed + id_len + 3 * MAX_INT_TEXT;
    PyObject *frame = PyBytes_FromStringAndSize(NULL, cap);
    if (frame == NULL) {
        return NULL;
    }
    char *base = PyBytes_AS_STRING(frame);
    char *w = base + 8;
#define PART(i) do { Py_ssize_t len_ = PyBytes_GET_SIZE(send_ok_parts[i]); \
        memcpy(w, PyBytes_AS_STRING(send_ok_parts[i]), (size_t)len_); w += len_; } while (0)
    PART(0);
    memcpy(w, id, (size_t)id_len);
    w += id_len;
    PART(1);
    w = put_decimal(w, queue_id);
    PART(2);
    w = put_decimal(w, queue_offset);
    PART(3);
    w = put_decimal(w, opaque);
    PART(4);
#undef PART
    Py_ssize_t hlen = (Py_ssize_t)(w - base) - 8;
    put_be32(base, (uint32_t)(4 + hlen));
    put_be32(base + 4, (uint32_t)hlen);
    if (_PyBytes_Resize(&frame, 8 + hlen) < 0) {
        return NULL;
    }
    return frame;
}

/* A header integer of the V2 letters: 1 parsed into *out, 0 absent or empty (the default), -1 anything the
 * C path does not take (sign other than a leading '-', spaces, underscores, non-ASCII digits, too long),
 * -2 error. */
static int
header_int(PyObject *ext, PyObject *key, Py_ssize_t max_chars, long long *out)
{
    PyObject *v = PyDict_GetItemWithError(ext, key);
    if (v == NULL) {
        return PyErr_Occurred() ? -2 : 0;
    }
    if (!PyUnicode_Check(v)) {
        return -1;
    }
    if (PyUnicode_READY(v) < 0) {
        return -2;
    }
    Py_ssize_t len = PyUnicode_GET_LENGTH(v);
    if (len == 0) {
        return 0;
    }
    if (!PyUnicode_IS_ASCII(v) || len > max_chars) {
        return -1;
    }
    const Py_UCS1 *s = PyUnicode_1BYTE_DATA(v);
    Py_ssize_t i = 0;
    int neg = s[0] == '-';
    if (neg) {
        i = 1;
        if (len == 1) {
            return -1;
        }
    }
    long long acc = 0;
    for (; i < len; i++) {
        if (s[i] < '0' || s[i] > '9') {
            return -1;
        }
        acc = acc * 10 + (s[i] - '0');
    }
    *out = neg ? -acc : acc;
    return 1;
}

/* "false" or absent: 0, "true": 1, anything else: -1 (the Python path parses it), -2 error (lookup) */
static int
header_flag(PyObject *ext, PyObject *key)
{
    PyObject *v = PyDict_GetItemWithError(ext, key);
    if (v == NULL) {
        return PyErr_Occurred() ? -2 : 0;
    }
    if (!PyUnicode_Check(v)) {
        return -1;
    }
    if (PyUnicode_CompareWithASCIIString(v, "false") == 0) {
        return 0;
    }
    return PyUnicode_CompareWithASCIIString(v, "true") == 0 ? 1 : -1;
}

static PyObject *
codec_send_header_v2(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "send_header_v2(ext_fields, is_batch)");
        return NULL;
    }
    PyObject *ext = args[0];
    int is_batch = PyObject_IsTrue(args[1]);
    if (is_batch < 0) {
        return NULL;
    }
    if (send_header_class.cls == NULL || !PyDict_CheckExact(ext)) {
        Py_RETURN_NONE;
    }
    int has_topic = PyDict_Contains(ext, k_topic);
    if (has_topic < 0) {
        return NULL;
    }
    if (has_topic) {
        Py_RETURN_NONE; /* V1 names present: the general parser */
    }
    /* letters: a=0 b=1 c=2 d=3 e=4 f=5 g=6 h=7 i=8 j=9 k=10 l=11 m=12 n=13 */
    PyObject *topic = PyDict_GetItemWithError(ext, k_letters[1]);
    if (topic == NULL) {
        if (PyErr_Occurred()) {
            return NULL;
        }
        Py_RETURN_NONE;
    }
    if (!PyUnicode_Check(topic) || PyUnicode_READY(topic) < 0 || PyUnicode_GET_LENGTH(topic) == 0) {
        if (PyErr_Occurred()) {
            return NULL;
        }
        Py_RETURN_NONE;
    }
    long long queue_nums = 4, queue_id = -1, sys_flag = 0, born = 0, flag = 0, reconsume = 0, max_rt = 0;
    static const int int_letters[7] = {3, 4, 5, 6, 7, 9, 11};
    long long *targets[7] = {&queue_nums, &queue_id, &sys_flag, &born, &flag, &reconsume, &max_rt};
    int have_max_rt = 0;
    for (int i = 0; i < 7; i++) {
        int letter = int_letters[i];
        int rc = header_int(ext, k_letters[letter], letter == 6 ? LONG_FIELD_MAX_CHARS : INT_FIELD_MAX_CHARS,
                            targets[i]);
        if (rc == -2) {
            return NULL;
        }
        if (rc == -1) {
            Py_RETURN_NONE;
        }
        if (letter == 11) {
            have_max_rt = rc == 1;
        }
    }
    int unit_mode = header_flag(ext, k_letters[10]);
    int batch = is_batch ? 1 : header_flag(ext, k_letters[12]);
    if (unit_mode == -2 || batch == -2) {
        return NULL;
    }
    if (unit_mode < 0 || batch < 0) {
        Py_RETURN_NONE;
    }
    PyObject *group = PyDict_GetItemWithError(ext, k_letters[0]);
    if (group == NULL && PyErr_Occurred()) {
        return NULL;
    }
    PyObject *default_topic = PyDict_GetItemWithError(ext, k_letters[2]);
    if (default_topic == NULL && PyErr_Occurred()) {
        return NULL;
    }
    if (default_topic != NULL && !PyUnicode_Check(default_topic)) {
        Py_RETURN_NONE;
    }
    if (default_topic != NULL && PyUnicode_READY(default_topic) < 0) {
        return NULL;
    }
    if (default_topic == NULL || PyUnicode_GET_LENGTH(default_topic) == 0) {
        default_topic = s_default_topic;
    }
    PyObject *properties = PyDict_GetItemWithError(ext, k_letters[8]);
    if (properties == NULL && PyErr_Occurred()) {
        return NULL;
    }
    PyObject *vals[SEND_HEADER_FIELDS];
    vals[0] = group ? group : s_empty;
    vals[1] = topic;
    vals[2] = default_topic;
    vals[8] = properties ? properties : s_empty;
    vals[10] = unit_mode ? Py_True : Py_False;
    vals[12] = batch ? Py_True : Py_False;
    vals[11] = Py_None;
    static const int borrowed[7] = {0, 1, 2, 8, 10, 11, 12};
    for (int i = 0; i < 7; i++) {
        Py_INCREF(vals[borrowed[i]]);
    }
    long long ints[6] = {queue_nums, queue_id, sys_flag, born, flag, reconsume};
    static const int int_slots[6] = {3, 4, 5, 6, 7, 9};
    int made = 0;
    for (; made < 6; made++) {
        vals[int_slots[made]] = PyLong_FromLongLong(ints[made]);
        if (vals[int_slots[made]] == NULL) {
            break;
        }
    }
    if (made < 6) {
        goto fail_ints;
    }
    if (have_max_rt) {
        PyObject *m = PyLong_FromLongLong(max_rt);
        if (m == NULL) {
            goto fail_ints;
        }
        Py_SETREF(vals[11], m);
    }
    return new_filled(&send_header_class, vals);
fail_ints:
    for (int i = 0; i < 7; i++) {
        Py_DECREF(vals[borrowed[i]]);
    }
    for (int i = 0; i < made && i < 6; i++) {
        Py_DECREF(vals[int_slots[i]]);
    }
    return NULL;
}

/* Escaped JSON length of a UTF-8 string (without the quotes). */
static Py_ssize_t
json_escaped_len(const unsigned char *p, Py_ssize_t n)
{
    Py_ssize_t out = n;
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned char c = p[i];
        if (c == '"' || c == '\\' || c == '\b' || c == '\t' || c == '\n' || c == '\f' || c == '\r') {
            out += 1;
        } else if (c < 0x20) {
            out += 5;
        }
    }
    return out;
}

static char *
json_write_string(char *w, const unsigned char *p, Py_ssize_t n)
{
    static const char hex[] = "0123456789abcdef";
    *w++ = '"';
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned char c = p[i];
        if (c >= 0x20 && c != '"' && c != '\\') {
            *w++ = (char)c;
            continue;
        }
        *w++ = '\\';
        switch (c) {
        case '"': *w++ = '"'; break;
        case '\\': *w++ = '\\'; break;
        case '\b': *w++ = 'b'; break;
        case '\t': *w++ = 't'; break;
        case '\n': *w++ = 'n'; break;
        case '\f': *w++ = 'f'; break;
        case '\r': *w++ = 'r'; break;
        default:
            *w++ = 'u';
            *w++ = '0';
            *w++ = '0';
            *w++ = hex[c >> 4];
            *w++ = hex[c & 15];
        }
    }
    *w++ = '"';
    return w;
}

/* UTF-8 of an exact str; 0 = decline (not an exact str, or not encodable: surrogates), -1 = error */
static int
utf8_of(PyObject *o, const char **p, Py_ssize_t *n)
{
    if (!PyUnicode_CheckExact(o)) {
        return 0;
    }
    *p = PyUnicode_AsUTF8AndSize(o, n);
    if (*p == NULL) {
        if (PyErr_ExceptionMatches(PyExc_UnicodeError)) {
            PyErr_Clear();
            return 0;
        }
        return -1;
    }
    return 1;
}

#define MAX_EXT_FIELDS 256

static PyObject *
codec_encode_json(PyObject *self, PyObject *cmd)
{
    SlotClass *sc = &command_class;
    if (sc->cls == NULL || Py_TYPE(cmd) != sc->cls) {
        Py_RETURN_NONE;
    }
#define SLOT(i) (*(PyObject **)((char *)cmd + sc->offsets[i]))
    /* code, ext_fields, body, opaque, flag, remark, language, version, serialize_type */
    PyObject *ext = SLOT(1), *body = SLOT(2), *remark = SLOT(5), *language = SLOT(6), *stype = SLOT(8);
    long long code, opaque, flag, version, st;
    if (SLOT(0) == NULL || SLOT(3) == NULL || SLOT(4) == NULL || SLOT(7) == NULL || ext == NULL || body == NULL
            || remark == NULL || language == NULL || stype == NULL
            || !exact_long(SLOT(0), &code) || !exact_long(SLOT(3), &opaque) || !exact_long(SLOT(4), &flag)
            || !exact_long(SLOT(7), &version) || !exact_long(stype, &st) || st != 0
            || !PyDict_CheckExact(ext) || !PyBytes_CheckExact(body)) {
        Py_RETURN_NONE;
    }
#undef SLOT
    Py_ssize_t n_ext = PyDict_GET_SIZE(ext);
    if (n_ext > MAX_EXT_FIELDS) {
        Py_RETURN_NONE;
    }
    const char *kp[MAX_EXT_FIELDS], *vp[MAX_EXT_FIELDS];
    Py_ssize_t kn[MAX_EXT_FIELDS], vn[MAX_EXT_FIELDS];
    const char *lang_p, *remark_p = NULL;
    Py_ssize_t lang_n, remark_n = 0;
    int rc = utf8_of(language, &lang_p, &lang_n);
    if (rc <= 0) {
        return rc < 0 ? NULL : Py_NewRef(Py_None);
    }
    if (remark != Py_None) {
        rc = utf8_of(remark, &remark_p, &remark_n);
        if (rc <= 0) {
            return rc < 0 ? NULL : Py_NewRef(Py_None);
        }
    }
    /* the header's length: fixed text, numbers (at most 20 characters each), escaped strings */
    Py_ssize_t hlen = (Py_ssize_t)strlen("{\"code\":,\"extFields\":{},\"flag\":,\"language\":,\"opaque\":,"
                                         "\"serializeTypeCurrentRPC\":\"JSON\",\"version\":}") + 4 * MAX_INT_TEXT;
    hlen += json_escaped_len((const unsigned char *)lang_p, lang_n) + 2;
    if (remark_p != NULL) {
        hlen += (Py_ssize_t)strlen(",\"remark\":") + json_escaped_len((const unsigned char *)remark_p, remark_n) + 2;
    }
    Py_ssize_t pos = 0, i = 0;
    PyObject *key, *value;
    while (PyDict_Next(ext, &pos, &key, &value)) {
        if ((rc = utf8_of(key, &kp[i], &kn[i])) <= 0 || (rc = utf8_of(value, &vp[i], &vn[i])) <= 0) {
            return rc < 0 ? NULL : Py_NewRef(Py_None);
        }
        hlen += json_escaped_len((const unsigned char *)kp[i], kn[i])
                + json_escaped_len((const unsigned char *)vp[i], vn[i]) + 6; /* quotes, ':' and ',' */
        i++;
    }
    if (i != n_ext) {
        Py_RETURN_NONE; /* changed while read (cannot happen without other threads holding the GIL) */
    }
    Py_ssize_t body_n = PyBytes_GET_SIZE(body);
    if (hlen > 0xFFFFFF || body_n > INT32_MAX - 4 - hlen) {
        Py_RETURN_NONE; /* the Python encoder writes what it writes */
    }
    PyObject *frame = PyBytes_FromStringAndSize(NULL, 8 + hlen + body_n);
    if (frame == NULL) {
        return NULL;
    }
    char *base = PyBytes_AS_STRING(frame);
    char *w = base + 8;
#define LIT(s) do { memcpy(w, s, sizeof(s) - 1); w += sizeof(s) - 1; } while (0)
    LIT("{\"code\":");
    w = put_decimal(w, code);
    LIT(",\"extFields\":{");
    for (Py_ssize_t j = 0; j < n_ext; j++) {
        if (j) {
            *w++ = ',';
        }
        w = json_write_string(w, (const unsigned char *)kp[j], kn[j]);
        *w++ = ':';
        w = json_write_string(w, (const unsigned char *)vp[j], vn[j]);
    }
    LIT("},\"flag\":");
    w = put_decimal(w, flag);
    LIT(",\"language\":");
    w = json_write_string(w, (const unsigned char *)lang_p, lang_n);
    LIT(",\"opaque\":");
    w = put_decimal(w, opaque);
    LIT(",\"serializeTypeCurrentRPC\":\"JSON\",\"version\":");
    w = put_decimal(w, version);
    if (remark_p != NULL) {
        LIT(",\"remark\":");
        w = json_write_string(w, (const unsigned char *)remark_p, remark_n);
    }
    *w++ = '}';
#undef LIT
    Py_ssize_t header_n = (Py_ssize_t)(w - base) - 8;
    if (body_n) {
        memcpy(w, PyBytes_AS_STRING(body), (size_t)body_n);
    }
    put_be32(base, (uint32_t)(4 + header_n + body_n));
    put_be32(base + 4, (uint32_t)header_n);
    if (header_n != hlen && _PyBytes_Resize(&frame, 8 + header_n + body_n) < 0) {
        return NULL;
    }
    return frame;
}

static PyMethodDef codec_methods[] = {
    {"set_class", codec_set_class, METH_VARARGS,
     "set_class(kind, cls, fields): register the slots class built by decode_frames ('command') or "
     "send_header_v2 ('send_header'), with its field names in constructor order"},
    {"set_json_loads", codec_set_json_loads, METH_O, "set_json_loads(loads): the JSON parser of headers"},
    {"set_send_ok_template", codec_set_send_ok_template, METH_O,
     "set_send_ok_template(parts): the 5 literal parts of the SEND_OK header around msgId, queueId, "
     "queueOffset and opaque"},
    {"decode_frames", codec_decode_frames, METH_VARARGS,
     "decode_frames(buf, pos, max_frame_bytes, max_header_bytes) -> (commands, pos): the whole JSON frames "
     "with the usual header from pos on; stops at the first frame it does not take"},
    {"encode_send_ok", (PyCFunction)(void (*)(void))codec_encode_send_ok, METH_FASTCALL,
     "encode_send_ok(opaque, msg_id, queue_id, queue_offset) -> bytes | None"},
    {"encode_json", codec_encode_json, METH_O,
     "encode_json(cmd) -> bytes | None: the whole frame of a JSON command as codec.encode writes it (None: "
     "leave it to codec.encode)"},
    {"send_header_v2", (PyCFunction)(void (*)(void))codec_send_header_v2, METH_FASTCALL,
     "send_header_v2(ext_fields, is_batch) -> SendHeader | None (None: the Python parser decides)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef codec_module = {
    PyModuleDef_HEAD_INIT, "_codec", "Per-request pieces of the remoting codec in C (see remoting/codec.py).", -1,
    codec_methods, NULL, NULL, NULL, NULL,
};

static PyObject *
intern(const char *s)
{
    return PyUnicode_InternFromString(s);
}

PyMODINIT_FUNC
PyInit__codec(void)
{
    k_code = intern("code");
    k_opaque = intern("opaque");
    k_flag = intern("flag");
    k_version = intern("version");
    k_language = intern("language");
    k_ext_fields = intern("extFields");
    k_remark = intern("remark");
    k_topic = intern("topic");
    s_default_topic = intern("TBW102");
    s_empty = intern("");
    if (!k_code || !k_opaque || !k_flag || !k_version || !k_language || !k_ext_fields || !k_remark || !k_topic
            || !s_default_topic || !s_empty) {
        return NULL;
    }
    for (int i = 0; i < 14; i++) {
        char name[2] = {(char)('a' + i), 0};
        k_letters[i] = intern(name);
        if (k_letters[i] == NULL) {
            return NULL;
        }
    }
    return PyModule_Create(&codec_module);
}
