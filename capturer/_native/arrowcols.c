/*
 * arrowcols.c (capturer._fastrows): the Spark sender's batch in C. lake_rows: a transaction's changes as the
 * rows of their tables (senders/spark/sender.py group_rows). arrow_columns: the Arrow columns of those rows
 * (sender.py lake_table): in one pass over the rows, per column the buffers Arrow's format has (a validity
 * bitmap, the values; offsets + bytes for strings and binaries), as bytes objects the sender wraps with
 * pa.Array.from_buffers (no Python list per column, no conversion of Python objects by pyarrow).
 *
 * A column is built only from values of exactly the Python types the Python path hands to Arrow unchanged
 * (sender._AS_IS: int for bigint/int, float for double, str, bytes, datetime.date, naive datetime.datetime,
 * decimal.Decimal) and only where the result is certain to be the one pyarrow makes of them; any other
 * value (another type, a subclass, an int out of range, a string with lone surrogates, a tz-aware
 * datetime, a Decimal that does not fit exactly) answers None for that column, and the sender takes its
 * Python path (lake.lake_value, pa.Table.from_pydict), which is the specification
 * (tests/unit/test_arrowcols.py compares both).
 */
#include "fastrows.h"
#include <datetime.h>

FR_DATETIME_IMPORT(fr_arrowcols_datetime)

/* the column kinds (senders/spark/sender.py _KINDS) */
enum { K_INT64 = 0, K_INT32 = 1, K_DOUBLE = 2, K_STRING = 3, K_BINARY = 4, K_DATE32 = 5, K_TS_US = 6,
       K_DECIMAL = 7 };

/* days from 1970-01-01 to y-m-d (proleptic Gregorian; H. Hinnant's days_from_civil) */
static int64_t days_from_civil(int64_t y, unsigned m, unsigned d) {
    y -= m <= 2;
    const int64_t era = (y >= 0 ? y : y - 399) / 400;
    const unsigned yoe = (unsigned)(y - era * 400);
    const unsigned doy = (153 * (m > 2 ? m - 3 : m + 9) + 2) / 5 + d - 1;
    const unsigned doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + (int64_t)doe - 719468;
}

typedef unsigned __int128 u128;

/* 10**38: the bound of a decimal128(38, s) value's unscaled magnitude */
static u128 pow10_u128(int k) {
    u128 r = 1;
    while (k-- > 0) r *= 10;
    return r;
}

/* a Decimal as the unscaled 128-bit value of a decimal(38, scale): 1 and *out set when str(v) is a finite
   number that scale holds exactly in 38 digits, 0 when it is not (the Python path then decides), -1 on error */
static int decimal_unscaled(PyObject *v, int scale, __int128 *out) {
    char t[DEC_TEXT_CAP];
    PyObject *s = NULL;
    Py_ssize_t n = dec_chars(v, DEC_STR, t, sizeof(t)); /* str(v)'s text, without the str (decimal.c) */
    const char *p = t;
    if (n <= 0) {
        if (!(s = PyObject_Str(v))) return -1;
        if (!(p = PyUnicode_AsUTF8AndSize(s, &n))) {
            Py_DECREF(s);
            return -1;
        }
    }
    const char *e = p + n;
    int neg = 0, ok = 0;
    if (p < e && (*p == '-' || *p == '+')) neg = *p++ == '-';
    u128 coef = 0;
    int digits = 0, frac = 0, seen_dot = 0, any = 0;
    long exp = 0;
    for (; p < e; p++) {
        char c = *p;
        if (c >= '0' && c <= '9') {
            any = 1;
            if (digits || c != '0') {
                if (++digits > 38) goto done;
                coef = coef * 10 + (u128)(c - '0');
            }
            if (seen_dot) frac++;
        } else if (c == '.' && !seen_dot) {
            seen_dot = 1;
        } else {
            break;
        }
    }
    if (!any) goto done; /* NaN, Infinity, sNaN */
    if (p < e && (*p == 'E' || *p == 'e')) {
        p++;
        int eneg = 0, edig = 0;
        if (p < e && (*p == '-' || *p == '+')) eneg = *p++ == '-';
        for (; p < e && *p >= '0' && *p <= '9'; p++) {
            if (++edig > 6) goto done;
            exp = exp * 10 + (*p - '0');
        }
        if (!edig) goto done;
        if (eneg) exp = -exp;
    }
    if (p != e) goto done;
    {
        long k = exp - frac + scale; /* unscaled = coef * 10**k */
        const u128 bound = pow10_u128(38);
        if (coef == 0) {
            ok = exp <= 0; /* (pyarrow's precision rules for a zero with a positive exponent: its path) */
        } else if (k >= 0) {
            if (k > 38) goto done;
            u128 m = pow10_u128((int)k);
            if (coef >= bound / m + (bound % m != 0)) goto done; /* coef * m >= 10**38 */
            coef *= m;
            ok = coef < bound;
        } else {
            if (-k > 38) goto done;
            u128 m = pow10_u128((int)-k);
            if (coef % m) goto done; /* not exact at this scale: pyarrow's error, in the Python path */
            coef /= m;
            ok = 1;
        }
        if (ok) *out = neg ? -(__int128)coef : (__int128)coef;
    }
done:
    Py_XDECREF(s);
    return ok;
}

/* one column being built: its buffers so far, or dead (it takes the Python path) */
typedef struct {
    PyObject *key; /* borrowed; NULL: the row is the value */
    int kind, scale, var, dead;
    Py_ssize_t width, nulls;
    PyObject *validity, *data, *offsets;
    unsigned char *bits;
    char *d;
    int32_t *offs;
    Buf b;
} Col;

static void col_free(Col *c) {
    Py_CLEAR(c->validity);
    Py_CLEAR(c->data);
    Py_CLEAR(c->offsets);
    PyMem_Free(c->b.p);
    c->b.p = NULL;
    c->dead = 1;
}

static int col_init(Col *c, Py_ssize_t n) {
    c->width = c->kind == K_INT64 || c->kind == K_DOUBLE || c->kind == K_TS_US ? 8
             : c->kind == K_INT32 || c->kind == K_DATE32 ? 4
             : c->kind == K_DECIMAL ? 16 : 0;
    c->var = c->kind == K_STRING || c->kind == K_BINARY;
    if (!c->width && !c->var) {
        PyErr_SetString(PyExc_ValueError, "arrow_columns: unknown column kind");
        return -1;
    }
    c->validity = PyBytes_FromStringAndSize(NULL, (n + 7) / 8);
    if (c->var) c->offsets = PyBytes_FromStringAndSize(NULL, (n + 1) * 4);
    else c->data = PyBytes_FromStringAndSize(NULL, n * c->width);
    if (!c->validity || (c->var ? !c->offsets : !c->data)) return -1;
    c->bits = (unsigned char *)PyBytes_AS_STRING(c->validity);
    memset(c->bits, 0, (n + 7) / 8);
    if (c->var) {
        c->offs = (int32_t *)PyBytes_AS_STRING(c->offsets);
        c->offs[0] = 0;
    } else {
        c->d = PyBytes_AS_STRING(c->data);
    }
    return 0;
}

/* value i of the column: 0, 1 when the column takes the Python path, -1 on error */
static int col_put(Col *c, Py_ssize_t i, PyObject *v) {
    if (v == Py_None) {
        c->nulls++;
        if (c->var) c->offs[i + 1] = (int32_t)c->b.n;
        else memset(c->d + i * c->width, 0, c->width);
        return 0;
    }
    c->bits[i >> 3] |= (unsigned char)(1u << (i & 7));
    char *d = c->d;
    switch (c->kind) {
    case K_INT64:
    case K_INT32: {
        if (!PyLong_CheckExact(v)) return 1;
        int overflow;
        long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
        if (x == -1 && PyErr_Occurred()) return -1;
        if (overflow) return 1;
        if (c->kind == K_INT64) {
            int64_t y = x;
            memcpy(d + i * 8, &y, 8);
        } else {
            if (x < INT32_MIN || x > INT32_MAX) return 1;
            int32_t y = (int32_t)x;
            memcpy(d + i * 4, &y, 4);
        }
        return 0;
    }
    case K_DOUBLE: {
        if (!PyFloat_CheckExact(v)) return 1;
        double x = PyFloat_AS_DOUBLE(v);
        memcpy(d + i * 8, &x, 8);
        return 0;
    }
    case K_STRING:
    case K_BINARY: {
        const char *s;
        Py_ssize_t len;
        if (c->kind == K_STRING) {
            if (!PyUnicode_CheckExact(v)) return 1;
            if (PyUnicode_IS_COMPACT_ASCII(v)) {
                s = (const char *)PyUnicode_DATA(v);
                len = PyUnicode_GET_LENGTH(v);
            } else {
                s = PyUnicode_AsUTF8AndSize(v, &len);
                if (!s) { /* lone surrogates: the Python path (and its error) */
                    PyErr_Clear();
                    return 1;
                }
            }
        } else {
            if (!PyBytes_CheckExact(v)) return 1;
            s = PyBytes_AS_STRING(v);
            len = PyBytes_GET_SIZE(v);
        }
        if (c->b.n + len > INT32_MAX) return 1; /* (pyarrow would chunk the column) */
        if (buf_put(&c->b, s, len) < 0) return -1;
        c->offs[i + 1] = (int32_t)c->b.n;
        return 0;
    }
    case K_DATE32: {
        if (!PyDate_CheckExact(v)) return 1;
        int32_t days = (int32_t)days_from_civil(PyDateTime_GET_YEAR(v), PyDateTime_GET_MONTH(v),
                                                PyDateTime_GET_DAY(v));
        memcpy(d + i * 4, &days, 4);
        return 0;
    }
    case K_TS_US: {
        if (!PyDateTime_CheckExact(v) || _PyDateTime_HAS_TZINFO(v)) return 1;
        int64_t us = days_from_civil(PyDateTime_GET_YEAR(v), PyDateTime_GET_MONTH(v), PyDateTime_GET_DAY(v))
                         * 86400LL * 1000000LL
                     + ((PyDateTime_DATE_GET_HOUR(v) * 60LL + PyDateTime_DATE_GET_MINUTE(v)) * 60LL
                        + PyDateTime_DATE_GET_SECOND(v)) * 1000000LL
                     + PyDateTime_DATE_GET_MICROSECOND(v);
        memcpy(d + i * 8, &us, 8);
        return 0;
    }
    case K_DECIMAL: {
        if (Py_TYPE(v) != (PyTypeObject *)Decimal) return 1;
        __int128 x;
        int r = decimal_unscaled(v, c->scale, &x);
        if (r <= 0) return r < 0 ? -1 : 1;
        memcpy(d + i * 16, &x, 16); /* little-endian two's complement, as Arrow's decimal128 */
        return 0;
    }
    }
    return 1;
}

/* the column's (null_count, validity or None, data, offsets or None), or None if it is dead */
static PyObject *col_finish(Col *c) {
    if (c->dead) Py_RETURN_NONE;
    if (c->var) {
        c->data = PyBytes_FromStringAndSize(c->b.p ? c->b.p : "", c->b.n);
        if (!c->data) return NULL;
    }
    PyObject *validity = c->nulls ? c->validity : Py_None, *offsets = c->var ? c->offsets : Py_None;
    return Py_BuildValue("(nOOO)", c->nulls, validity, c->data, offsets);
}

/* arrow_columns(rows, cols) -> [(null_count, validity or None, data, offsets or None) or None]: for each
   (key, kind, scale) of cols, the Arrow buffers of the column: of row.get(key) for each dict of the list
   rows, or (key None) of the items of rows themselves; None where the column takes the Python path. One
   pass over the rows, each row's values of every column in turn (each image read once). */
PyObject *arrow_columns(PyObject *self, PyObject *args) {
    PyObject *rows, *cols;
    if (!PyArg_ParseTuple(args, "O!O!", &PyList_Type, &rows, &PyList_Type, &cols)) return NULL;
    Py_ssize_t nc = PyList_GET_SIZE(cols), n = PyList_GET_SIZE(rows), live = nc;
    PyObject *out = NULL;
    Col *cs = PyMem_Calloc(nc ? nc : 1, sizeof(Col));
    if (!cs) return PyErr_NoMemory();
    for (Py_ssize_t j = 0; j < nc; j++) {
        PyObject *spec = PyList_GET_ITEM(cols, j), *key;
        Col *c = &cs[j];
        if (!PyTuple_Check(spec) || !PyArg_ParseTuple(spec, "Oii", &key, &c->kind, &c->scale)) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "arrow_columns: cols are (key, kind, scale)");
            goto out;
        }
        c->key = key == Py_None ? NULL : key;
        if (c->key && PyObject_Hash(c->key) == -1) goto out; /* (cached from here on, for str) */
        /* a decimal(38, s) with s outside 0..38: pyarrow's own precision rules (it refuses values this path
           would take, e.g. 0 at scale 39), so its Python path */
        if (c->kind == K_DECIMAL && (c->scale < 0 || c->scale > 38)) {
            c->dead = 1;
            live--;
            continue;
        }
        if (col_init(c, n) < 0) goto out;
    }
    for (Py_ssize_t i = 0; i < n && live; i++) {
        PyObject *row = PyList_GET_ITEM(rows, i);
        int is_dict = PyDict_Check(row);
        for (Py_ssize_t j = 0; j < nc; j++) {
            Col *c = &cs[j];
            if (c->dead) continue;
            PyObject *v = row;
            if (c->key) {
                if (!is_dict) {
                    col_free(c);
                    live--;
                    continue;
                }
                v = PyDict_GetItemWithError(row, c->key);
                if (!v) {
                    if (PyErr_Occurred()) goto out;
                    v = Py_None;
                }
            }
            int r = col_put(c, i, v);
            if (r < 0) goto out;
            if (r) {
                col_free(c);
                live--;
            }
        }
    }
    out = PyList_New(nc);
    if (!out) goto out;
    for (Py_ssize_t j = 0; j < nc; j++) {
        PyObject *r = col_finish(&cs[j]);
        if (!r) {
            Py_CLEAR(out);
            goto out;
        }
        PyList_SET_ITEM(out, j, r);
    }
out:
    for (Py_ssize_t j = 0; j < nc; j++) col_free(&cs[j]);
    PyMem_Free(cs);
    return out;
}

/* --- lake_rows: a transaction's changes into the batch's per-table _Rows ------------------------------- */

static PyObject *S_db, *S_table, *S_pk, *S_insert, *S_read, *S_delete, *S_get;
static PyObject *R_attr[7]; /* _Rows' lists: ops, ts, regions, seqs, subs, schemas, imgs */

static int lake_names(void) {
    if (S_db) return 0;
    static const char *rn[7] = {"ops", "ts", "regions", "seqs", "subs", "schemas", "imgs"};
    for (int k = 0; k < 7; k++)
        if (!(R_attr[k] = PyUnicode_InternFromString(rn[k]))) return -1;
    S_pk = PyUnicode_InternFromString("pk");
    S_insert = PyUnicode_InternFromString("insert");
    S_read = PyUnicode_InternFromString("read");
    S_delete = PyUnicode_InternFromString("delete");
    S_table = PyUnicode_InternFromString("table");
    S_get = PyUnicode_InternFromString("get");
    S_db = PyUnicode_InternFromString("db"); /* (last: the flag that all are set) */
    return S_pk && S_insert && S_read && S_delete && S_table && S_get && S_db ? 0 : -1;
}

/* one row appended to the 7 lists (borrowed: the lists hold their own references) */
static int rows_add(PyObject **l, PyObject *op, PyObject *ts, PyObject *region, PyObject *seq, PyObject *sub,
                    PyObject *schema, PyObject *img) {
    return PyList_Append(l[0], op) < 0 || PyList_Append(l[1], ts) < 0 || PyList_Append(l[2], region) < 0
        || PyList_Append(l[3], seq) < 0 || PyList_Append(l[4], sub) < 0 || PyList_Append(l[5], schema) < 0
        || PyList_Append(l[6], img) < 0 ? -1 : 0;
}

/* `x or {}`: a new reference */
static PyObject *or_empty(PyObject *x) {
    int t = x ? PyObject_IsTrue(x) : 0;
    if (t < 0) return NULL;
    if (t) return Py_NewRef(x);
    return PyDict_New();
}

/* img.get(c): a new reference */
static PyObject *img_get(PyObject *img, PyObject *c) {
    if (PyDict_CheckExact(img)) {
        PyObject *v = PyDict_GetItemWithError(img, c);
        return v ? Py_NewRef(v) : PyErr_Occurred() ? NULL : Py_NewRef(Py_None);
    }
    return PyObject_CallMethodOneArg(img, S_get, c);
}

static int op_is(PyObject *op, PyObject *name) {
    if (op == name) return 1;
    return PyUnicode_Check(op) && PyUnicode_Compare(op, name) == 0;
}

/* lake_rows(changes, ts, region, by_table, Rows, (i, u, d)) -> None: each change of a transaction (seq = its
   index) appended to by_table[(schema.db, schema.table)] (a Rows() made where there is none), as
   senders/spark/sender.py group_rows does it (its specification: an insert or read as 'i' of the new image,
   a delete as 'd' of the old one, an update as 'u' of the new one, or, without a primary key or when the key
   changed, as 'd' of the old one and 'i' (sub 1) of the new one). */
PyObject *lake_rows(PyObject *self, PyObject *args) {
    PyObject *changes, *ts, *region, *by_table, *rows_type, *ops;
    if (!PyArg_ParseTuple(args, "OOOO!OO!", &changes, &ts, &region, &PyDict_Type, &by_table, &rows_type,
                          &PyTuple_Type, &ops))
        return NULL;
    if (PyTuple_GET_SIZE(ops) != 3) {
        PyErr_SetString(PyExc_ValueError, "lake_rows: ops is ('i', 'u', 'd')");
        return NULL;
    }
    if (lake_names() < 0) return NULL;
    PyObject *o_i = PyTuple_GET_ITEM(ops, 0), *o_u = PyTuple_GET_ITEM(ops, 1), *o_d = PyTuple_GET_ITEM(ops, 2);
    PyObject *seq_ch = PySequence_Fast(changes, "lake_rows: changes is a sequence");
    if (!seq_ch) return NULL;
    PyObject *zero = PyLong_FromLong(0), *one = PyLong_FromLong(1);
    PyObject *last_schema = NULL, *lists[7] = {NULL};
    PyObject *ch = NULL, *schema = NULL, *op = NULL, *before = NULL, *after = NULL, *seq = NULL;
    PyObject *ret = NULL;
    if (!zero || !one) goto out;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq_ch);
    for (Py_ssize_t i = 0; i < n; i++) {
        ch = PySequence_Fast_GET_ITEM(seq_ch, i);
        if (!(schema = PyObject_GetAttr(ch, S_schema))) goto out;
        if (schema != last_schema) { /* another table (or schema version): its Rows */
            PyObject *db = PyObject_GetAttr(schema, S_db), *tb = db ? PyObject_GetAttr(schema, S_table) : NULL;
            PyObject *key = tb ? PyTuple_Pack(2, db, tb) : NULL;
            Py_XDECREF(db);
            Py_XDECREF(tb);
            if (!key) goto out;
            PyObject *rows = PyDict_GetItemWithError(by_table, key); /* borrowed */
            if (!rows) {
                if (PyErr_Occurred() || !(rows = PyObject_CallNoArgs(rows_type))) {
                    Py_DECREF(key);
                    goto out;
                }
                int r = PyDict_SetItem(by_table, key, rows);
                Py_DECREF(rows); /* (by_table holds it) */
                if (r < 0) {
                    Py_DECREF(key);
                    goto out;
                }
            }
            Py_DECREF(key);
            for (int k = 0; k < 7; k++) {
                Py_CLEAR(lists[k]);
                lists[k] = PyObject_GetAttr(rows, R_attr[k]);
                if (!lists[k]) goto out;
                if (!PyList_Check(lists[k])) {
                    PyErr_SetString(PyExc_TypeError, "lake_rows: Rows' columns are lists");
                    goto out;
                }
            }
            Py_XSETREF(last_schema, Py_NewRef(schema));
        }
        if (!(op = PyObject_GetAttr(ch, S_op)) || !(seq = PyLong_FromSsize_t(i))) goto out;
        int r;
        if (op_is(op, S_insert) || op_is(op, S_read)) {
            PyObject *a = PyObject_GetAttr(ch, S_after), *img = a ? or_empty(a) : NULL;
            Py_XDECREF(a);
            if (!img) goto out;
            r = rows_add(lists, o_i, ts, region, seq, zero, schema, img);
            Py_DECREF(img);
        } else if (op_is(op, S_delete)) {
            PyObject *b = PyObject_GetAttr(ch, S_before), *img = b ? or_empty(b) : NULL;
            Py_XDECREF(b);
            if (!img) goto out;
            r = rows_add(lists, o_d, ts, region, seq, zero, schema, img);
            Py_DECREF(img);
        } else {
            PyObject *pk = PyObject_GetAttr(schema, S_pk);
            if (!pk) goto out;
            PyObject *b = PyObject_GetAttr(ch, S_before);
            before = b ? or_empty(b) : NULL;
            Py_XDECREF(b);
            PyObject *a = before ? PyObject_GetAttr(ch, S_after) : NULL;
            after = a ? or_empty(a) : NULL;
            Py_XDECREF(a);
            int changed = after ? PyObject_IsTrue(pk) : -1;
            if (changed == 1) { /* any(before.get(c) != after.get(c) for c in pk) */
                changed = 0;
                PyObject *it = PyObject_GetIter(pk), *c;
                if (!it) changed = -1;
                while (it && !changed && (c = PyIter_Next(it))) {
                    PyObject *x = img_get(before, c), *y = x ? img_get(after, c) : NULL;
                    /* (x != y itself: RichCompareBool would take one object for equal to itself, a NaN
                       too, where the specification's != says changed) */
                    PyObject *ne = y ? PyObject_RichCompare(x, y, Py_NE) : NULL;
                    changed = ne ? PyObject_IsTrue(ne) : -1;
                    Py_XDECREF(ne);
                    Py_XDECREF(x);
                    Py_XDECREF(y);
                    Py_DECREF(c);
                }
                if (it && !changed && PyErr_Occurred()) changed = -1;
                Py_XDECREF(it);
            } else if (changed == 0) {
                changed = 1; /* no key: a delete and an insert */
            }
            Py_DECREF(pk);
            if (changed < 0) goto out;
            if (changed)
                r = rows_add(lists, o_d, ts, region, seq, zero, schema, before) < 0
                    || rows_add(lists, o_i, ts, region, seq, one, schema, after) < 0 ? -1 : 0;
            else
                r = rows_add(lists, o_u, ts, region, seq, zero, schema, after);
            Py_CLEAR(before);
            Py_CLEAR(after);
        }
        Py_CLEAR(op);
        Py_CLEAR(seq);
        Py_CLEAR(schema);
        if (r < 0) goto out;
    }
    ret = Py_NewRef(Py_None);
out:
    Py_XDECREF(op);
    Py_XDECREF(seq);
    Py_XDECREF(schema);
    Py_XDECREF(before);
    Py_XDECREF(after);
    Py_XDECREF(last_schema);
    for (int k = 0; k < 7; k++) Py_XDECREF(lists[k]);
    Py_XDECREF(zero);
    Py_XDECREF(one);
    Py_DECREF(seq_ch);
    return ret;
}
