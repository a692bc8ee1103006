/*
 * snaprows.c (capturer._fastrows): a snapshot chunk's rows, from the tuples the reader gives to the
 * RowChanges a chunk's transaction carries, without a Python step per row (capturer/regions/mysql/
 * snapshot.py make_rows, capturer/regions/snaphost.py emit_chunk; the Python paths there are the
 * specification and the fallback, and tests/unit/test_snaprows.py compares both).
 */
#include "fastrows.h"

/* dict_rows(names, raw) -> [dict]: each row of raw (a tuple or list of at least len(names) values; more are
   ignored) as {names[i]: row[i]}, in column order (dict(zip(names, row)) for each). */
PyObject *dict_rows(PyObject *self, PyObject *args) {
    PyObject *names, *raw;
    if (!PyArg_ParseTuple(args, "O!O!", &PyTuple_Type, &names, &PyList_Type, &raw)) return NULL;
    Py_ssize_t nc = PyTuple_GET_SIZE(names), n = PyList_GET_SIZE(raw);
    for (Py_ssize_t j = 0; j < nc; j++) {
        PyObject *k = PyTuple_GET_ITEM(names, j);
        if (!PyUnicode_CheckExact(k)) {
            PyErr_SetString(PyExc_TypeError, "dict_rows: the names must be str");
            return NULL;
        }
        if (PyObject_Hash(k) == -1) return NULL;  /* (cached from here on) */
    }
    PyObject *out = PyList_New(n);
    if (!out) return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *r = PyList_GET_ITEM(raw, i);
        if (!(PyTuple_Check(r) || PyList_Check(r)) || PySequence_Fast_GET_SIZE(r) < nc) {
            PyErr_SetString(PyExc_ValueError, "dict_rows: a row is not a tuple (or list) of at least the named columns");
            Py_DECREF(out);
            return NULL;
        }
        PyObject *d = _PyDict_NewPresized(nc);
        if (!d) {
            Py_DECREF(out);
            return NULL;
        }
        for (Py_ssize_t j = 0; j < nc; j++) {
            if (PyDict_SetItem(d, PyTuple_GET_ITEM(names, j), PySequence_Fast_GET_ITEM(r, j)) < 0) {
                Py_DECREF(d);
                Py_DECREF(out);
                return NULL;
            }
        }
        PyList_SET_ITEM(out, i, d);
    }
    return out;
}

/* read_changes(rows, schema, row_change, op) -> (RowChange, ...): RowChange(schema, op, None, row) for each
   row of the list rows, without running the dataclass's __init__ (it only assigns its four slots).
   A change whose row is a dict the cyclic collector does not track (every value atomic: str, int, Decimal,
   datetime, ... as a chunk's rows are) is not tracked either: it cannot be part of a cycle (its schema,
   op and None do not lead back to it, and a RowChange is treated as immutable), and a chunk's 20,000
   tracked changes would otherwise be walked by each young collection while they wait to be sent (and
   then again as they are promoted): about 4 ms a young collection here. */
PyObject *read_changes(PyObject *self, PyObject *args) {
    PyObject *rows, *schema, *row_change, *op;
    if (!PyArg_ParseTuple(args, "O!OO!O!", &PyList_Type, &rows, &schema, &PyType_Type, &row_change,
                          &PyUnicode_Type, &op))
        return NULL;
    PyTypeObject *rt = (PyTypeObject *)row_change;
    Py_ssize_t n = PyList_GET_SIZE(rows);
    PyObject *out = PyTuple_New(n);
    if (!out) return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *ch = rt->tp_alloc(rt, 0);
        if (!ch || PyObject_GenericSetAttr(ch, S_schema, schema) < 0 || PyObject_GenericSetAttr(ch, S_op, op) < 0
            || PyObject_GenericSetAttr(ch, S_before, Py_None) < 0
            || PyObject_GenericSetAttr(ch, S_after, PyList_GET_ITEM(rows, i)) < 0) {
            Py_XDECREF(ch);
            Py_DECREF(out);
            return NULL;
        }
        if (PyObject_IS_GC(ch) && PyObject_GC_IsTracked(ch) && PyDict_CheckExact(PyList_GET_ITEM(rows, i))
            && !PyObject_GC_IsTracked(PyList_GET_ITEM(rows, i)))
            PyObject_GC_UnTrack(ch);
        PyTuple_SET_ITEM(out, i, ch);
    }
    return out;
}
