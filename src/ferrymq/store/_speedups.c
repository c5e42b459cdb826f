/* ferrymq.store._speedups: the per-record work of reput (dispatch), of batch puts, of plain single puts,
 * of the slave's verification and of the pull scan in C. This file is the module (method table, init);
 * the work is in the files listed in _speedups.h, each with the layout tables it reads and writes at its top.
 */
#include "_speedups.h"

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
