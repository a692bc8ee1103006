/*
 * baikaldb_rows.c (capturer._fastrows): BaikalDB binlog rows, protobuf messages whose field numbers are
 * field ids, decoded into row images by a plan made once per table version.
 * Python-visible: baikal_plan(...) -> a BaikalPlan (its row(data) method).
 */
#include "fastrows.h"
#include <datetime.h>

FR_DATETIME_IMPORT(fr_baikaldb_rows_datetime)

/* BaikalDB rows: protobuf messages whose field numbers are field ids          */
/* (capturer/regions/baikaldb/rows.py RowPlan.decode_py is the specification) */

enum {
    BK_SINT32 = 1, BK_SINT64, BK_UINT, BK_BOOL, BK_FLOAT, BK_DOUBLE,
    BK_TEXT, BK_BYTES, BK_DATETIME, BK_DATE, BK_TIME, BK_TIMESTAMP
};
static const int BK_WIRE[13] = {-1, 0, 0, 0, 0, 5, 1, 2, 2, 1, 5, 5, 5};

typedef struct {
    PyObject_HEAD
    Py_ssize_t n;
    PyObject *names;     /* tuple of str, live columns in order */
    int maxid;           /* largest field id in slot/known */
    int *slot;           /* field id -> index into names, -1 = not live */
    int *kinds;          /* per index */
    unsigned char *known;/* field id -> known to this version (dropped ones too) */
    int utf8;
    PyObject *enc;       /* bytes: codec name */
} BPlan;

static void bplan_dealloc(BPlan *self) {
    PyMem_Free(self->slot);
    PyMem_Free(self->kinds);
    PyMem_Free(self->known);
    Py_XDECREF(self->names);
    Py_XDECREF(self->enc);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* baikal_plan(((field_id, name, kind), ...), (known ids...), encoding) */
PyObject *baikal_plan(PyObject *mod, PyObject *args) {
    PyObject *spec, *known;
    const char *enc;
    if (!PyArg_ParseTuple(args, "O!O!s", &PyTuple_Type, &spec, &PyTuple_Type, &known, &enc)) return NULL;
    extern PyTypeObject BPlanType;
    BPlan *p = PyObject_New(BPlan, &BPlanType);
    if (!p) return NULL;
    p->slot = NULL; p->kinds = NULL; p->known = NULL; p->names = NULL; p->enc = NULL;
    p->n = PyTuple_GET_SIZE(spec);
    int maxid = 0;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(known); i++) {
        long v = PyLong_AsLong(PyTuple_GET_ITEM(known, i));
        if (v == -1 && PyErr_Occurred()) goto fail;
        if (v < 1 || v > (1 << 22)) { PyErr_SetString(PyExc_ValueError, "field id out of range"); goto fail; }
        if (v > maxid) maxid = (int)v;
    }
    for (Py_ssize_t i = 0; i < p->n; i++) {
        PyObject *t = PyTuple_GET_ITEM(spec, i);
        if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != 3) { PyErr_SetString(PyExc_ValueError, "bad spec"); goto fail; }
        long v = PyLong_AsLong(PyTuple_GET_ITEM(t, 0));
        if (v == -1 && PyErr_Occurred()) goto fail;
        if (v < 1 || v > (1 << 22)) { PyErr_SetString(PyExc_ValueError, "field id out of range"); goto fail; }
        if (v > maxid) maxid = (int)v;
    }
    p->maxid = maxid;
    p->slot = PyMem_Malloc(sizeof(int) * (maxid + 1));
    p->known = PyMem_Calloc(maxid + 1, 1);
    p->kinds = PyMem_Malloc(sizeof(int) * (p->n ? p->n : 1));
    p->names = PyTuple_New(p->n);
    if (!p->slot || !p->known || !p->kinds || !p->names) { PyErr_NoMemory(); goto fail; }
    for (int i = 0; i <= maxid; i++) p->slot[i] = -1;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(known); i++)
        p->known[PyLong_AsLong(PyTuple_GET_ITEM(known, i))] = 1;
    for (Py_ssize_t i = 0; i < p->n; i++) {
        PyObject *t = PyTuple_GET_ITEM(spec, i);
        long fid = PyLong_AsLong(PyTuple_GET_ITEM(t, 0));
        PyObject *name = PyTuple_GET_ITEM(t, 1);
        long kind = PyLong_AsLong(PyTuple_GET_ITEM(t, 2));
        if (kind < BK_SINT32 || kind > BK_TIMESTAMP || !PyUnicode_Check(name)) {
            PyErr_SetString(PyExc_ValueError, "bad field spec");
            goto fail;
        }
        p->slot[fid] = (int)i;
        p->known[fid] = 1;
        p->kinds[i] = (int)kind;
        Py_INCREF(name);
        PyTuple_SET_ITEM(p->names, i, name);
    }
    p->utf8 = strcmp(enc, "utf-8") == 0 || strcmp(enc, "utf8") == 0;
    p->enc = PyBytes_FromString(enc);
    if (!p->enc) goto fail;
    return (PyObject *)p;
fail:
    Py_DECREF(p);
    return NULL;
}

static int bk_varint(const unsigned char *d, Py_ssize_t *po, Py_ssize_t end, uint64_t *out) {
    uint64_t r = 0;
    int shift = 0;
    Py_ssize_t o = *po;
    for (;;) {
        if (o >= end) { PyErr_SetString(PyExc_ValueError, "truncated varint"); return -1; }
        unsigned char b = d[o++];
        if (shift < 64) r |= (uint64_t)(b & 0x7F) << shift;
        if (b < 0x80) break;
        shift += 7;
        if (shift > 63) { PyErr_SetString(PyExc_ValueError, "varint longer than 10 bytes"); return -1; }
    }
    *po = o;
    *out = r;
    return 0;
}

static PyObject *bk_text(BPlan *p, const unsigned char *s, Py_ssize_t n) {
    PyObject *v = p->utf8 ? PyUnicode_DecodeUTF8((const char *)s, n, "strict")
                          : PyUnicode_Decode((const char *)s, n, PyBytes_AS_STRING(p->enc), "strict");
    if (!v && PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) {
        PyErr_Clear();
        v = PyBytes_FromStringAndSize((const char *)s, n);
    }
    return v;
}

static PyObject *bk_none_on_value_error(void) {
    if (PyErr_ExceptionMatches(PyExc_ValueError)) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    return NULL;
}

static PyObject *bk_value(BPlan *p, int kind, int wt, uint64_t u, const unsigned char *s, Py_ssize_t n) {
    switch (kind) {
    case BK_SINT32: case BK_SINT64:
        return PyLong_FromLongLong((int64_t)(u >> 1) ^ -(int64_t)(u & 1));
    case BK_UINT:
        return PyLong_FromUnsignedLongLong(u);
    case BK_BOOL:
        return PyLong_FromLong(u ? 1 : 0);
    case BK_TEXT:
        return bk_text(p, s, n);
    case BK_BYTES:
        return PyBytes_FromStringAndSize((const char *)s, n);
    case BK_DOUBLE: {
        double x;
        memcpy(&x, &u, 8);
        return PyFloat_FromDouble(x);
    }
    case BK_FLOAT: {
        uint32_t w = (uint32_t)u;
        float x;
        memcpy(&x, &w, 4);
        return PyFloat_FromDouble((double)x);
    }
    case BK_DATETIME: {
        int ym = (int)((u >> 46) & 0x1FFFF);
        PyObject *v = PyDateTime_FromDateAndTime(ym / 13, ym % 13, (int)((u >> 41) & 0x1F), (int)((u >> 36) & 0x1F),
                                                 (int)((u >> 30) & 0x3F), (int)((u >> 24) & 0x3F), (int)(u & 0xFFFFFF));
        return v ? v : bk_none_on_value_error();
    }
    case BK_DATE: {
        int ym = (int)((u >> 5) & 0x1FFFF);
        PyObject *v = PyDate_FromDate(ym / 13, ym % 13, (int)(u & 0x1F));
        return v ? v : bk_none_on_value_error();
    }
    case BK_TIME: {
        int32_t v = (int32_t)(uint32_t)u;
        int neg = v < 0;
        int64_t a = neg ? -(int64_t)v : (int64_t)v;
        int64_t secs = ((a >> 12) & 0x3FF) * 3600 + ((a >> 6) & 0x3F) * 60 + (a & 0x3F);
        return PyDelta_FromDSU(0, (int)(neg ? -secs : secs), 0);
    }
    case BK_TIMESTAMP: {
        uint32_t v = (uint32_t)u;
        if (v == 0) Py_RETURN_NONE;
        PyObject *delta = PyDelta_FromDSU((int)(v / 86400), (int)(v % 86400), 0);
        if (!delta) return NULL;
        PyObject *r = PyNumber_Add(Epoch, delta);
        Py_DECREF(delta);
        return r;
    }
    }
    (void)wt;
    PyErr_SetString(PyExc_SystemError, "bad kind");
    return NULL;
}

/* a value whose wire type does not match its column's type: as the wire gives it */
static PyObject *bk_by_wire(BPlan *p, int wt, uint64_t u, const unsigned char *s, Py_ssize_t n) {
    if (wt == 2) return bk_text(p, s, n);
    if (wt == 5) return PyLong_FromUnsignedLongLong((uint32_t)u);
    return PyLong_FromUnsignedLongLong(u);
}

static PyObject *bplan_row(BPlan *self, PyObject *arg) {
    Py_buffer buf;
    if (PyObject_GetBuffer(arg, &buf, PyBUF_SIMPLE) < 0) return NULL;
    const unsigned char *d = buf.buf;
    Py_ssize_t o = 0, end = buf.len;
    PyObject *row = NULL, *unknown = NULL;
    long mism = 0;
    row = _PyDict_NewPresized(self->n);
    unknown = PyList_New(0);
    if (!row || !unknown) goto fail;
    for (Py_ssize_t i = 0; i < self->n; i++)
        if (PyDict_SetItem(row, PyTuple_GET_ITEM(self->names, i), Py_None) < 0) goto fail;
    while (o < end) {
        uint64_t tag, u = 0;
        const unsigned char *s = NULL;
        Py_ssize_t n = 0;
        if (bk_varint(d, &o, end, &tag) < 0) goto fail;
        uint64_t fno = tag >> 3;
        int wt = (int)(tag & 7);
        if (fno == 0) { PyErr_SetString(PyExc_ValueError, "field number 0"); goto fail; }
        if (wt == 0) {
            if (bk_varint(d, &o, end, &u) < 0) goto fail;
        } else if (wt == 2) {
            uint64_t ln;
            if (bk_varint(d, &o, end, &ln) < 0) goto fail;
            if (ln > (uint64_t)(end - o)) { PyErr_SetString(PyExc_ValueError, "truncated length-delimited field"); goto fail; }
            s = d + o;
            n = (Py_ssize_t)ln;
            o += n;
        } else if (wt == 1) {
            if (end - o < 8) { PyErr_SetString(PyExc_ValueError, "truncated 64-bit field"); goto fail; }
            u = le_unsigned(d + o, 8);
            o += 8;
        } else if (wt == 5) {
            if (end - o < 4) { PyErr_SetString(PyExc_ValueError, "truncated 32-bit field"); goto fail; }
            u = le_unsigned(d + o, 4);
            o += 4;
        } else {
            PyErr_Format(PyExc_ValueError, "unsupported wire type %d (field %llu)", wt, (unsigned long long)fno);
            goto fail;
        }
        int idx = fno <= (uint64_t)self->maxid ? self->slot[fno] : -1;
        if (idx < 0) {
            if (fno > (uint64_t)self->maxid || !self->known[fno]) {
                PyObject *f = PyLong_FromUnsignedLongLong(fno);
                if (!f) goto fail;
                int r = PyList_Append(unknown, f);
                Py_DECREF(f);
                if (r < 0) goto fail;
            }
            continue;
        }
        int kind = self->kinds[idx];
        PyObject *v;
        if (wt != BK_WIRE[kind]) {
            mism++;
            v = bk_by_wire(self, wt, u, s, n);
        } else {
            v = bk_value(self, kind, wt, u, s, n);
        }
        if (!v) goto fail;
        int r = PyDict_SetItem(row, PyTuple_GET_ITEM(self->names, idx), v);
        Py_DECREF(v);
        if (r < 0) goto fail;
    }
    PyBuffer_Release(&buf);
    PyObject *ut = PyList_AsTuple(unknown);
    Py_DECREF(unknown);
    if (!ut) { Py_DECREF(row); return NULL; }
    PyObject *res = Py_BuildValue("(NNl)", row, ut, mism);
    return res;
fail:
    Py_XDECREF(row);
    Py_XDECREF(unknown);
    PyBuffer_Release(&buf);
    return NULL;
}

static PyMethodDef bplan_methods[] = {
    {"row", (PyCFunction)bplan_row, METH_O,
     "row(data) -> (column -> value for every live column, unknown field numbers, wire-type mismatches)"},
    {NULL, NULL, 0, NULL},
};

PyTypeObject BPlanType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "capturer._fastrows.BaikalPlan",
    .tp_basicsize = sizeof(BPlan),
    .tp_dealloc = (destructor)bplan_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "a decoder for the rows of one BaikalDB table version (baikal_plan(...))",
    .tp_methods = bplan_methods,
};
