/*
 * arrowcols.c (capturer._fastrows): the Spark sender's Arrow columns in C (senders/spark/sender.py
 * lake_table): per column, in one pass over the rows, the buffers Arrow's format has (a validity bitmap, the
 * values; offsets + bytes for strings and binaries), as bytes objects the sender wraps with
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
    PyObject *s = PyObject_Str(v);
    if (!s) return -1;
    Py_ssize_t n;
    const char *p = PyUnicode_AsUTF8AndSize(s, &n);
    if (!p) {
        Py_DECREF(s);
        return -1;
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
    Py_DECREF(s);
    return ok;
}

/* the buffers of one column, built from values[i] (key == NULL) or values[i].get(key) */
static PyObject *build(PyObject *values, PyObject *key, int kind, int scale) {
    Py_ssize_t n = PyList_GET_SIZE(values);
    Py_ssize_t width = kind == K_INT64 || kind == K_DOUBLE || kind == K_TS_US ? 8
                     : kind == K_INT32 || kind == K_DATE32 ? 4
                     : kind == K_DECIMAL ? 16 : 0;
    int var = kind == K_STRING || kind == K_BINARY;
    if (!width && !var) {
        PyErr_SetString(PyExc_ValueError, "arrow_columns: unknown column kind");
        return NULL;
    }
    PyObject *validity = PyBytes_FromStringAndSize(NULL, (n + 7) / 8);
    PyObject *data = var ? NULL : PyBytes_FromStringAndSize(NULL, n * width);
    PyObject *offsets = var ? PyBytes_FromStringAndSize(NULL, (n + 1) * 4) : NULL;
    Buf b = {NULL, 0, 0};
    PyObject *res = NULL;
    Py_ssize_t nulls = 0;
    if (!validity || (var ? !offsets : !data)) goto fail;
    unsigned char *bits = (unsigned char *)PyBytes_AS_STRING(validity);
    memset(bits, 0, (n + 7) / 8);
    char *d = var ? NULL : PyBytes_AS_STRING(data);
    int32_t *offs = var ? (int32_t *)PyBytes_AS_STRING(offsets) : NULL;
    if (var) offs[0] = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *v = PyList_GET_ITEM(values, i);
        if (key) {
            if (!PyDict_Check(v)) goto fallback;
            v = PyDict_GetItemWithError(v, key);
            if (!v) {
                if (PyErr_Occurred()) goto fail;
                v = Py_None;
            }
        }
        if (v == Py_None) {
            nulls++;
            if (var) offs[i + 1] = (int32_t)b.n;
            else memset(d + i * width, 0, width);
            continue;
        }
        bits[i >> 3] |= (unsigned char)(1u << (i & 7));
        switch (kind) {
        case K_INT64:
        case K_INT32: {
            if (!PyLong_CheckExact(v)) goto fallback;
            int overflow;
            long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
            if (x == -1 && PyErr_Occurred()) goto fail;
            if (overflow) goto fallback;
            if (kind == K_INT64) {
                int64_t y = x;
                memcpy(d + i * 8, &y, 8);
            } else {
                if (x < INT32_MIN || x > INT32_MAX) goto fallback;
                int32_t y = (int32_t)x;
                memcpy(d + i * 4, &y, 4);
            }
            break;
        }
        case K_DOUBLE: {
            if (!PyFloat_CheckExact(v)) goto fallback;
            double x = PyFloat_AS_DOUBLE(v);
            memcpy(d + i * 8, &x, 8);
            break;
        }
        case K_STRING:
        case K_BINARY: {
            const char *s;
            Py_ssize_t len;
            if (kind == K_STRING) {
                if (!PyUnicode_CheckExact(v)) goto fallback;
                if (PyUnicode_IS_COMPACT_ASCII(v)) {
                    s = (const char *)PyUnicode_DATA(v);
                    len = PyUnicode_GET_LENGTH(v);
                } else {
                    s = PyUnicode_AsUTF8AndSize(v, &len);
                    if (!s) { /* lone surrogates: the Python path (and its error) */
                        PyErr_Clear();
                        goto fallback;
                    }
                }
            } else {
                if (!PyBytes_CheckExact(v)) goto fallback;
                s = PyBytes_AS_STRING(v);
                len = PyBytes_GET_SIZE(v);
            }
            if (b.n + len > INT32_MAX) goto fallback; /* (pyarrow would chunk the column) */
            if (buf_put(&b, s, len) < 0) goto fail;
            offs[i + 1] = (int32_t)b.n;
            break;
        }
        case K_DATE32: {
            if (!PyDate_CheckExact(v)) goto fallback;
            int32_t days = (int32_t)days_from_civil(PyDateTime_GET_YEAR(v), PyDateTime_GET_MONTH(v),
                                                    PyDateTime_GET_DAY(v));
            memcpy(d + i * 4, &days, 4);
            break;
        }
        case K_TS_US: {
            if (!PyDateTime_CheckExact(v) || _PyDateTime_HAS_TZINFO(v)) goto fallback;
            int64_t us = days_from_civil(PyDateTime_GET_YEAR(v), PyDateTime_GET_MONTH(v), PyDateTime_GET_DAY(v))
                             * 86400LL * 1000000LL
                         + ((PyDateTime_DATE_GET_HOUR(v) * 60LL + PyDateTime_DATE_GET_MINUTE(v)) * 60LL
                            + PyDateTime_DATE_GET_SECOND(v)) * 1000000LL
                         + PyDateTime_DATE_GET_MICROSECOND(v);
            memcpy(d + i * 8, &us, 8);
            break;
        }
        case K_DECIMAL: {
            if (Py_TYPE(v) != (PyTypeObject *)Decimal) goto fallback;
            __int128 x;
            int r = decimal_unscaled(v, scale, &x);
            if (r < 0) goto fail;
            if (!r) goto fallback;
            memcpy(d + i * 16, &x, 16); /* little-endian two's complement, as Arrow's decimal128 */
            break;
        }
        }
    }
    if (var) {
        data = PyBytes_FromStringAndSize(b.p ? b.p : "", b.n);
        if (!data) goto fail;
    }
    if (nulls == 0) {
        Py_SETREF(validity, Py_NewRef(Py_None));
    }
    res = Py_BuildValue("(nNNN)", nulls, validity, data, var ? offsets : Py_NewRef(Py_None));
    PyMem_Free(b.p);
    return res;
fallback:
    Py_XDECREF(validity);
    Py_XDECREF(data);
    Py_XDECREF(offsets);
    PyMem_Free(b.p);
    Py_RETURN_NONE;
fail:
    Py_XDECREF(validity);
    Py_XDECREF(data);
    Py_XDECREF(offsets);
    PyMem_Free(b.p);
    return NULL;
}

/* arrow_columns(rows, cols) -> [(null_count, validity or None, data, offsets or None) or None]: for each
   (key, kind, scale) of cols, the Arrow buffers of the column: of row.get(key) for each dict of the list
   rows, or (key None) of the items of rows themselves; None where the column takes the Python path. */
PyObject *arrow_columns(PyObject *self, PyObject *args) {
    PyObject *rows, *cols;
    if (!PyArg_ParseTuple(args, "O!O!", &PyList_Type, &rows, &PyList_Type, &cols)) return NULL;
    Py_ssize_t nc = PyList_GET_SIZE(cols);
    PyObject *out = PyList_New(nc);
    if (!out) return NULL;
    for (Py_ssize_t j = 0; j < nc; j++) {
        PyObject *spec = PyList_GET_ITEM(cols, j), *key;
        int kind, scale;
        if (!PyTuple_Check(spec) || !PyArg_ParseTuple(spec, "Oii", &key, &kind, &scale)) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "arrow_columns: cols are (key, kind, scale)");
            Py_DECREF(out);
            return NULL;
        }
        if (key != Py_None && PyObject_Hash(key) == -1) { /* (cached from here on, for str) */
            Py_DECREF(out);
            return NULL;
        }
        /* a decimal(38, s) with s outside 0..38: pyarrow's own precision rules (it refuses values this path
           would take, e.g. 0 at scale 39), so its Python path */
        PyObject *c = kind == K_DECIMAL && (scale < 0 || scale > 38) ? Py_NewRef(Py_None)
                                                                    : build(rows, key == Py_None ? NULL : key, kind, scale);
        if (!c) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, j, c);
    }
    return out;
}
