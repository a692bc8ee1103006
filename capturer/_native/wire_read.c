/*
 * wire_read.c (capturer._fastrows): the wire format (capturer/model/wire.py) read back from msgpack, and
 * RowChange objects made in C: for the agents' streams, the sender processes' pipes and the backlog (what
 * Decoder.rows + unpackb's ext_hook do in Python), and for the regions' decoders (row_changes, row_change).
 * wire.c writes what this file reads. Python-visible: wire_unrows, wire_ext, wire_unpack, wire_unpack_item,
 * row_changes, row_change.
 */
#include "fastrows.h"
#include <datetime.h>

FR_DATETIME_IMPORT(fr_wire_read_datetime)

/* --- decoding --- */
static int parse_digits(const char *s, Py_ssize_t n, Py_ssize_t at, int count, int *out) {
    if (at + count > n) return -1;
    int v = 0;
    for (int i = 0; i < count; i++) {
        char c = s[at + i];
        if (c < '0' || c > '9') return -1;
        v = v * 10 + (c - '0');
    }
    *out = v;
    return 0;
}

/* HH:MM:SS[.ffffff] at s[at..n) exactly; -1 if it is not that */
static int parse_hms(const char *s, Py_ssize_t n, Py_ssize_t at, int *h, int *m, int *sec, int *us) {
    if (parse_digits(s, n, at, 2, h) || at + 2 >= n || s[at + 2] != ':' || parse_digits(s, n, at + 3, 2, m)
        || at + 5 >= n || s[at + 5] != ':' || parse_digits(s, n, at + 6, 2, sec))
        return -1;
    *us = 0;
    if (at + 8 == n) return 0;
    if (s[at + 8] != '.' || at + 15 != n || parse_digits(s, n, at + 9, 6, us)) return -1;
    return 0;
}

/* wire_ext(code, data): what wire._ext_hook gives; the common naive forms parsed here,
   anything else by the Python hook (slow) */

static PyObject *ext_make(int code, const char *s, Py_ssize_t n) {
    if (code == 1) {
        PyObject *dv = dec_from_text(s, n); /* (decimal.c: Decimal(text) without a str parsed) */
        if (dv || PyErr_Occurred()) return dv;
        PyObject *str = PyUnicode_DecodeUTF8(s, n, "strict");
        if (!str) return NULL;
        PyObject *d = PyObject_CallOneArg(Decimal, str);
        Py_DECREF(str);
        return d;
    }
    int y, mo, d, h, mi, sec, us;
    if (code == 2 && n >= 19 && s[10] == 'T' && !parse_digits(s, n, 0, 4, &y) && s[4] == '-'
        && !parse_digits(s, n, 5, 2, &mo) && s[7] == '-' && !parse_digits(s, n, 8, 2, &d)
        && !parse_hms(s, n, 11, &h, &mi, &sec, &us))
        return PyDateTime_FromDateAndTime(y, mo, d, h, mi, sec, us);
    if (code == 3 && n == 10 && !parse_digits(s, n, 0, 4, &y) && s[4] == '-' && !parse_digits(s, n, 5, 2, &mo)
        && s[7] == '-' && !parse_digits(s, n, 8, 2, &d))
        return PyDate_FromDate(y, mo, d);
    if (code == 4 && !parse_hms(s, n, 0, &h, &mi, &sec, &us))
        return PyTime_FromTime(h, mi, sec, us);
    if (!WireSlowHook) {
        PyErr_SetString(PyExc_RuntimeError, "wire_setup was not called");
        return NULL;
    }
    return PyObject_CallFunction(WireSlowHook, "iy#", code, s, n);
}

PyObject *wire_ext(PyObject *self, PyObject *args) {
    int code;
    const char *s;
    Py_ssize_t n;
    if (!PyArg_ParseTuple(args, "iy#", &code, &s, &n)) return NULL;
    return ext_make(code, s, n);
}

/* wire_unrows(rows, schemas, row_change, ops) -> list of RowChange: Decoder.rows; schemas
   a dict sid -> (schema, columns), ops a tuple of op names. ValueError for a bad row. */
static PyObject *image_of(PyObject *v, PyObject *cols) {
    if (v == Py_None || !PyList_CheckExact(v)) return Py_NewRef(v);
    Py_ssize_t n = PyList_GET_SIZE(v);
    if (n != PyTuple_GET_SIZE(cols)) {
        PyErr_SetString(PyExc_ValueError, "a row image does not match its schema's columns");
        return NULL;
    }
    PyObject *d = _PyDict_NewPresized(n);
    if (!d) return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (PyDict_SetItem(d, PyTuple_GET_ITEM(cols, i), PyList_GET_ITEM(v, i)) < 0) {
            Py_DECREF(d);
            return NULL;
        }
    }
    return d;
}

/* a RowChange without running the dataclass's __init__ (it only assigns its four slots); b and a are taken */
static PyObject *new_change(PyTypeObject *rt, PyObject *schema, PyObject *op, PyObject *b, PyObject *a) {
    PyObject *ch = rt->tp_alloc(rt, 0);
    if (ch && (PyObject_GenericSetAttr(ch, S_schema, schema) < 0 || PyObject_GenericSetAttr(ch, S_op, op) < 0
               || PyObject_GenericSetAttr(ch, S_before, b) < 0 || PyObject_GenericSetAttr(ch, S_after, a) < 0))
        Py_CLEAR(ch);
    Py_DECREF(b);
    Py_DECREF(a);
    return ch;
}

/* an image the collector need not track: None, or a dict holding only values it does not track */
static int untracked_image(PyObject *img) {
    return img == Py_None || (PyDict_CheckExact(img) && !PyObject_GC_IsTracked(img));
}

/* leaves the change ch (images b and a) untracked by the collector when both images are (row_changes, row_change) */
static void untrack_if_atomic(PyObject *ch, PyObject *b, PyObject *a) {
    if (PyObject_IS_GC(ch) && PyObject_GC_IsTracked(ch) && untracked_image(b) && untracked_image(a))
        PyObject_GC_UnTrack(ch);
}

/* row_changes(RowChange, schema, op, rows, kind) -> [RowChange]: a rows event's changes from the fast decoder's
   (image, after_or_None) pairs (for an insert or a delete also bare images: dicts); kind 0: update (before,
   after), 1: insert (None, image), 2: delete (image, None).
   A change whose images hold only atomic values is left untracked by the collector (it cannot be in a cycle:
   a region makes one per row, and each young collection would walk it and its values for nothing). */
PyObject *row_changes(PyObject *self, PyObject *args) {
    PyObject *row_change, *schema, *op, *rows;
    int kind;
    if (!PyArg_ParseTuple(args, "O!OOO!i", &PyType_Type, &row_change, &schema, &op, &PyList_Type, &rows, &kind))
        return NULL;
    if (kind < 0 || kind > 2) {
        PyErr_SetString(PyExc_ValueError, "row_changes: kind is 0, 1 or 2");
        return NULL;
    }
    PyTypeObject *rt = (PyTypeObject *)row_change;
    Py_ssize_t n = PyList_GET_SIZE(rows);
    PyObject *out = PyList_New(n);
    if (!out) return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *r = PyList_GET_ITEM(rows, i), *img, *b, *a;
        int pair = PyTuple_Check(r) && PyTuple_GET_SIZE(r) == 2;
        if (!pair && (kind == 0 || !PyDict_Check(r))) {
            PyErr_SetString(PyExc_ValueError, "row_changes: a row is an (image, after_or_None) pair, or an "
                                              "image (a dict) for an insert or a delete");
            Py_DECREF(out);
            return NULL;
        }
        img = pair ? PyTuple_GET_ITEM(r, 0) : r;
        if (kind == 0) {
            b = img;
            a = PyTuple_GET_ITEM(r, 1);
        } else if (kind == 1) {
            b = Py_None;
            a = img;
        } else {
            b = img;
            a = Py_None;
        }
        PyObject *ch = new_change(rt, schema, op, Py_NewRef(b), Py_NewRef(a));
        if (!ch) {
            Py_DECREF(out);
            return NULL;
        }
        untrack_if_atomic(ch, b, a);
        PyList_SET_ITEM(out, i, ch);
    }
    return out;
}

/* row_change(RowChange, schema, op, before, after) -> RowChange: one change, as RowChange(...) makes it, left
   untracked by the collector when its images hold only atomic values (a PostgreSQL region's per-message path) */
PyObject *row_change(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5 || !PyType_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "row_change(RowChange, schema, op, before, after)");
        return NULL;
    }
    PyObject *b = args[3], *a = args[4];
    PyObject *ch = new_change((PyTypeObject *)args[0], args[1], args[2], Py_NewRef(b), Py_NewRef(a));
    if (ch) untrack_if_atomic(ch, b, a);
    return ch;
}

PyObject *wire_unrows(PyObject *self, PyObject *args) {
    PyObject *rows, *schemas, *row_change, *ops;
    if (!PyArg_ParseTuple(args, "O!O!O!O!", &PyList_Type, &rows, &PyDict_Type, &schemas, &PyType_Type, &row_change,
                          &PyTuple_Type, &ops))
        return NULL;
    PyTypeObject *rt = (PyTypeObject *)row_change;
    Py_ssize_t n = PyList_GET_SIZE(rows);
    PyObject *out = PyList_New(n);
    if (!out) return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *r = PyList_GET_ITEM(rows, i);
        if (!PyList_CheckExact(r) || PyList_GET_SIZE(r) != 4) goto bad;
        PyObject *ent = PyDict_GetItemWithError(schemas, PyList_GET_ITEM(r, 0));
        if (!ent) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "a row of an unknown schema");
            goto fail;
        }
        if (!PyTuple_Check(ent) || PyTuple_GET_SIZE(ent) != 2) goto bad;
        PyObject *schema = PyTuple_GET_ITEM(ent, 0), *cols = PyTuple_GET_ITEM(ent, 1);
        long op = PyLong_AsLong(PyList_GET_ITEM(r, 1));
        if (op == -1 && PyErr_Occurred()) goto fail;
        if (op < 0 || op >= PyTuple_GET_SIZE(ops) || !PyTuple_Check(cols)) goto bad;
        PyObject *b = image_of(PyList_GET_ITEM(r, 2), cols);
        if (!b) goto fail;
        PyObject *a = image_of(PyList_GET_ITEM(r, 3), cols);
        if (!a) { Py_DECREF(b); goto fail; }
        PyObject *ch = new_change(rt, schema, PyTuple_GET_ITEM(ops, op), b, a);
        if (!ch) goto fail;
        PyList_SET_ITEM(out, i, ch);
    }
    return out;
bad:
    PyErr_SetString(PyExc_ValueError, "a bad row change");
fail:
    Py_DECREF(out);
    return NULL;
}


/* wire_unpack(data) -> the value: msgpack.unpackb(data, ext_hook=wire._ext_hook,
   unicode_errors="surrogatepass", raw=False, strict_map_key=False) for the values the
   wire format holds, with its extension types 1-4 made here (5-7 by the Python hook).
   Every read is bounds-checked; malformed data raises ValueError. */
typedef struct {
    const unsigned char *p, *end;
} Rd;

static int rd_need(Rd *r, Py_ssize_t n) {
    if (r->end - r->p < n) {
        PyErr_SetString(PyExc_ValueError, "truncated msgpack data");
        return -1;
    }
    return 0;
}

static uint64_t rd_be(Rd *r, int n) {
    uint64_t v = 0;
    for (int i = 0; i < n; i++) v = (v << 8) | r->p[i];
    r->p += n;
    return v;
}

static PyObject *rd_value(Rd *r, int depth);

static PyObject *rd_str(Rd *r, Py_ssize_t n) {
    if (rd_need(r, n) < 0) return NULL;
    PyObject *o = PyUnicode_DecodeUTF8((const char *)r->p, n, "surrogatepass");
    r->p += n;
    return o;
}

static PyObject *rd_bin(Rd *r, Py_ssize_t n) {
    if (rd_need(r, n) < 0) return NULL;
    PyObject *o = PyBytes_FromStringAndSize((const char *)r->p, n);
    r->p += n;
    return o;
}

static PyObject *rd_array(Rd *r, Py_ssize_t n, int depth) {
    if (n > r->end - r->p) {  /* every element takes at least one byte */
        PyErr_SetString(PyExc_ValueError, "truncated msgpack data");
        return NULL;
    }
    PyObject *l = PyList_New(n);
    if (!l) return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *v = rd_value(r, depth + 1);
        if (!v) {
            Py_DECREF(l);
            return NULL;
        }
        PyList_SET_ITEM(l, i, v);
    }
    return l;
}

static PyObject *rd_map(Rd *r, Py_ssize_t n, int depth) {
    if (n > (r->end - r->p) / 2) {
        PyErr_SetString(PyExc_ValueError, "truncated msgpack data");
        return NULL;
    }
    PyObject *d = PyDict_New();
    if (!d) return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *k = rd_value(r, depth + 1);
        if (!k) goto fail;
        PyObject *v = rd_value(r, depth + 1);
        if (!v) {
            Py_DECREF(k);
            goto fail;
        }
        int rc = PyDict_SetItem(d, k, v);  /* an unhashable key: TypeError, as msgpack gives */
        Py_DECREF(k);
        Py_DECREF(v);
        if (rc < 0) goto fail;
    }
    return d;
fail:
    Py_DECREF(d);
    return NULL;
}

static PyObject *rd_ext(Rd *r, int code, Py_ssize_t n) {
    if (rd_need(r, n) < 0) return NULL;
    const char *s = (const char *)r->p;
    r->p += n;
    return ext_make(code, s, n);
}

static PyObject *rd_value(Rd *r, int depth) {
    if (depth > 512) {
        PyErr_SetString(PyExc_ValueError, "msgpack data nested too deeply");
        return NULL;
    }
    if (rd_need(r, 1) < 0) return NULL;
    unsigned char t = *r->p++;
    if (t <= 0x7f) return PyLong_FromLong(t);
    if (t >= 0xe0) return PyLong_FromLong((signed char)t);
    if ((t & 0xe0) == 0xa0) return rd_str(r, t & 0x1f);
    if ((t & 0xf0) == 0x90) return rd_array(r, t & 0x0f, depth);
    if ((t & 0xf0) == 0x80) return rd_map(r, t & 0x0f, depth);
    int n;
    switch (t) {
    case 0xc0: Py_RETURN_NONE;
    case 0xc2: Py_RETURN_FALSE;
    case 0xc3: Py_RETURN_TRUE;
    case 0xc4: case 0xc5: case 0xc6:
        n = t == 0xc4 ? 1 : t == 0xc5 ? 2 : 4;
        if (rd_need(r, n) < 0) return NULL;
        return rd_bin(r, (Py_ssize_t)rd_be(r, n));
    case 0xc7: case 0xc8: case 0xc9: {
        n = t == 0xc7 ? 1 : t == 0xc8 ? 2 : 4;
        if (rd_need(r, n + 1) < 0) return NULL;
        Py_ssize_t len = (Py_ssize_t)rd_be(r, n);
        int code = (signed char)*r->p++;
        return rd_ext(r, code, len);
    }
    case 0xca: {
        if (rd_need(r, 4) < 0) return NULL;
        union { uint32_t u; float f; } x;
        x.u = (uint32_t)rd_be(r, 4);
        return PyFloat_FromDouble(x.f);
    }
    case 0xcb: {
        if (rd_need(r, 8) < 0) return NULL;
        union { uint64_t u; double d; } x;
        x.u = rd_be(r, 8);
        return PyFloat_FromDouble(x.d);
    }
    case 0xcc: case 0xcd: case 0xce: case 0xcf:
        n = 1 << (t - 0xcc);
        if (rd_need(r, n) < 0) return NULL;
        return PyLong_FromUnsignedLongLong(rd_be(r, n));
    case 0xd0: if (rd_need(r, 1) < 0) return NULL; return PyLong_FromLong((int8_t)rd_be(r, 1));
    case 0xd1: if (rd_need(r, 2) < 0) return NULL; return PyLong_FromLong((int16_t)rd_be(r, 2));
    case 0xd2: if (rd_need(r, 4) < 0) return NULL; return PyLong_FromLong((int32_t)rd_be(r, 4));
    case 0xd3: if (rd_need(r, 8) < 0) return NULL; return PyLong_FromLongLong((int64_t)rd_be(r, 8));
    case 0xd4: case 0xd5: case 0xd6: case 0xd7: case 0xd8: {
        if (rd_need(r, 1) < 0) return NULL;
        int code = (signed char)*r->p++;
        return rd_ext(r, code, (Py_ssize_t)1 << (t - 0xd4));
    }
    case 0xd9: case 0xda: case 0xdb:
        n = t == 0xd9 ? 1 : t == 0xda ? 2 : 4;
        if (rd_need(r, n) < 0) return NULL;
        return rd_str(r, (Py_ssize_t)rd_be(r, n));
    case 0xdc: case 0xdd:
        n = t == 0xdc ? 2 : 4;
        if (rd_need(r, n) < 0) return NULL;
        return rd_array(r, (Py_ssize_t)rd_be(r, n), depth);
    case 0xde: case 0xdf:
        n = t == 0xde ? 2 : 4;
        if (rd_need(r, n) < 0) return NULL;
        return rd_map(r, (Py_ssize_t)rd_be(r, n), depth);
    default:  /* 0xc1: never used */
        PyErr_Format(PyExc_ValueError, "bad msgpack type byte 0x%02x", t);
        return NULL;
    }
}

PyObject *wire_unpack(PyObject *self, PyObject *arg) {
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) return NULL;
    Rd r = {(const unsigned char *)view.buf, (const unsigned char *)view.buf + view.len};
    PyObject *v = rd_value(&r, 0);
    if (v && r.p != r.end) {
        Py_DECREF(v);
        v = NULL;
        PyErr_SetString(PyExc_ValueError, "extra data after a msgpack value");
    }
    PyBuffer_Release(&view);
    return v;
}


/* wire_unpack_item(data, schemas, RowChange, ops, max_rows) -> list or None: a backlog record's payload (one
   msgpack array of values, capturer/pipeline/segments.py), as wire_unpack reads it, except that the rows of its
   "t" and "c" values are read straight into RowChange objects, as Decoder.rows makes them (schemas: sid ->
   (schema, columns)): no list per row and per image in between. None when a "t" value holds more than max_rows
   rows (> 0; the caller's reference path spills such a transaction as it reads it). ValueError (or KeyError,
   TypeError) for data that is not that; the caller then reads the record with the reference path, which says
   what is wrong. */
typedef struct {
    PyObject *schemas, *ops;
    PyTypeObject *rt;
    PyObject *sid;   /* the last row's sid and its (schema, columns) (strong references) */
    PyObject *ent;
} RowsCtx;

static int rd_array_len(Rd *r, Py_ssize_t *n) {
    if (rd_need(r, 1) < 0) return -1;
    unsigned char t = *r->p;
    if ((t & 0xf0) == 0x90) { r->p++; *n = t & 0x0f; return 0; }
    if (t == 0xdc || t == 0xdd) {
        int k = t == 0xdc ? 2 : 4;
        if (rd_need(r, 1 + k) < 0) return -1;
        r->p++;
        *n = (Py_ssize_t)rd_be(r, k);
        return 0;
    }
    PyErr_SetString(PyExc_ValueError, "an array was expected");
    return -1;
}

/* an image: nil, its values in the schema's column order (made a dict), or anything else as it is */
static PyObject *rd_image(Rd *r, PyObject *cols, int depth) {
    if (rd_need(r, 1) < 0) return NULL;
    unsigned char t = *r->p;
    if (t == 0xc0) { r->p++; Py_RETURN_NONE; }
    if ((t & 0xf0) != 0x90 && t != 0xdc && t != 0xdd) return rd_value(r, depth);
    Py_ssize_t n;
    if (rd_array_len(r, &n) < 0) return NULL;
    if (n != PyTuple_GET_SIZE(cols)) {
        PyErr_SetString(PyExc_ValueError, "a row image does not match its schema's columns");
        return NULL;
    }
    PyObject *d = _PyDict_NewPresized(n);
    if (!d) return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *v = rd_value(r, depth + 1);
        if (!v || PyDict_SetItem(d, PyTuple_GET_ITEM(cols, i), v) < 0) {
            Py_XDECREF(v);
            Py_DECREF(d);
            return NULL;
        }
        Py_DECREF(v);
    }
    return d;
}

static PyObject *rd_rows(Rd *r, RowsCtx *c, int depth) {
    Py_ssize_t n;
    if (rd_array_len(r, &n) < 0) return NULL;
    if (n > r->end - r->p) {
        PyErr_SetString(PyExc_ValueError, "truncated msgpack data");
        return NULL;
    }
    PyObject *out = PyList_New(n);
    if (!out) return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t k;
        if (rd_array_len(r, &k) < 0) goto fail;
        if (k != 4) goto bad;
        PyObject *sid = rd_value(r, depth + 2);
        if (!sid) goto fail;
        if (c->sid == NULL || PyObject_RichCompareBool(sid, c->sid, Py_EQ) != 1) {
            if (PyErr_Occurred()) { Py_DECREF(sid); goto fail; }
            PyObject *ent = PyDict_GetItemWithError(c->schemas, sid);
            if (!ent) {
                Py_DECREF(sid);
                if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "a row of an unknown schema");
                goto fail;
            }
            if (!PyTuple_Check(ent) || PyTuple_GET_SIZE(ent) != 2 || !PyTuple_Check(PyTuple_GET_ITEM(ent, 1))) {
                Py_DECREF(sid);
                goto bad;
            }
            Py_XSETREF(c->ent, Py_NewRef(ent));
            Py_XSETREF(c->sid, sid);
        } else {
            Py_DECREF(sid);
        }
        PyObject *schema = PyTuple_GET_ITEM(c->ent, 0), *cols = PyTuple_GET_ITEM(c->ent, 1);
        PyObject *opv = rd_value(r, depth + 2);
        if (!opv) goto fail;
        long op = PyLong_Check(opv) ? PyLong_AsLong(opv) : -1;
        Py_DECREF(opv);
        if (op == -1 && PyErr_Occurred()) goto fail;
        if (op < 0 || op >= PyTuple_GET_SIZE(c->ops)) goto bad;
        PyObject *b = rd_image(r, cols, depth + 2);
        if (!b) goto fail;
        PyObject *a = rd_image(r, cols, depth + 2);
        if (!a) { Py_DECREF(b); goto fail; }
        PyObject *ch = new_change(c->rt, schema, PyTuple_GET_ITEM(c->ops, op), b, a);
        if (!ch) goto fail;
        /* out of the cyclic collector's sight: a change refers to its schema, two images of plain values and
           an op name, never back to itself (no cycle to find), and the items read back live long enough (a
           sender's batch, the shared decoded cache) for young collections to go over each of them again and
           again: measured, 12-22 % of a read. Reference counting frees it as before. */
        if (PyObject_IS_GC(ch)) PyObject_GC_UnTrack(ch);
        PyList_SET_ITEM(out, i, ch);
    }
    return out;
bad:
    PyErr_SetString(PyExc_ValueError, "a bad row change");
fail:
    Py_DECREF(out);
    return NULL;
}

/* a "t" (9 elements) or "c" (2 elements) value at r, its rows made RowChange objects; *big = 1 (and NULL)
   when a "t" value holds more than max_rows rows */
static PyObject *rd_txn_value(Rd *r, RowsCtx *c, Py_ssize_t max_rows, int *big) {
    int is_t = r->p[0] == 0x99;
    Py_ssize_t n = is_t ? 9 : 2;
    r->p += 3;  /* the array header and the one-letter tag */
    PyObject *l = PyList_New(n);
    if (!l) return NULL;
    PyList_SET_ITEM(l, 0, PyUnicode_FromOrdinal(is_t ? 't' : 'c'));
    if (!PyList_GET_ITEM(l, 0)) goto fail;
    for (Py_ssize_t i = 1; i < n - 1; i++) {
        PyObject *v = rd_value(r, 2);
        if (!v) goto fail;
        PyList_SET_ITEM(l, i, v);
    }
    if (is_t && max_rows > 0) {
        PyObject *nrows = PyList_GET_ITEM(l, 7);
        if (PyLong_Check(nrows)) {
            int overflow = 0;
            long long v = PyLong_AsLongLongAndOverflow(nrows, &overflow);
            if (v == -1 && PyErr_Occurred()) goto fail;
            if (overflow > 0 || v > max_rows) {
                *big = 1;
                Py_DECREF(l);
                return NULL;
            }
        }
    }
    PyObject *rows = rd_rows(r, c, 2);
    if (!rows) goto fail;
    PyList_SET_ITEM(l, n - 1, rows);
    return l;
fail:
    Py_DECREF(l);
    return NULL;
}

PyObject *wire_unpack_item(PyObject *self, PyObject *args) {
    Py_buffer view;
    PyObject *schemas, *row_change, *ops;
    Py_ssize_t max_rows;
    if (!PyArg_ParseTuple(args, "y*O!O!O!n", &view, &PyDict_Type, &schemas, &PyType_Type, &row_change,
                          &PyTuple_Type, &ops, &max_rows))
        return NULL;
    RowsCtx c = {schemas, ops, (PyTypeObject *)row_change, NULL, NULL};
    Rd r = {(const unsigned char *)view.buf, (const unsigned char *)view.buf + view.len};
    PyObject *out = NULL;
    Py_ssize_t n;
    int big = 0;
    if (rd_array_len(&r, &n) < 0) goto done;
    if (n > r.end - r.p) {
        PyErr_SetString(PyExc_ValueError, "truncated msgpack data");
        goto done;
    }
    out = PyList_New(n);
    if (!out) goto done;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *v;
        if (r.end - r.p >= 3 && r.p[1] == 0xa1
            && ((r.p[0] == 0x99 && r.p[2] == 't') || (r.p[0] == 0x92 && r.p[2] == 'c')))
            v = rd_txn_value(&r, &c, max_rows, &big);
        else {
            v = rd_value(&r, 1);
            /* a "t" or "c" value written some other way: its rows would be lists, not changes */
            if (v && PyList_CheckExact(v) && PyList_GET_SIZE(v) && PyUnicode_Check(PyList_GET_ITEM(v, 0))
                && (PyUnicode_CompareWithASCIIString(PyList_GET_ITEM(v, 0), "t") == 0
                    || PyUnicode_CompareWithASCIIString(PyList_GET_ITEM(v, 0), "c") == 0)) {
                Py_SETREF(v, NULL);
                PyErr_SetString(PyExc_ValueError, "a transaction value of another shape");
            }
        }
        if (!v) {
            Py_CLEAR(out);
            goto done;
        }
        PyList_SET_ITEM(out, i, v);
    }
    if (r.p != r.end) {
        Py_CLEAR(out);
        PyErr_SetString(PyExc_ValueError, "extra data after a msgpack value");
    }
done:
    Py_XDECREF(c.sid);
    Py_XDECREF(c.ent);
    PyBuffer_Release(&view);
    if (big) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    return out;
}
