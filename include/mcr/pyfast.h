/* Direct calls to C-level methods and attributes of extension types.
 *
 * Reading a torch tensor's data pointer, size and dtype through ordinary
 * attribute access costs ~70 ns each (lookup, binding, call). Calling the
 * method descriptor or getset descriptor taken once from the type skips the
 * lookup and the bound-method object.
 */
#ifndef MCR_PYFAST_H
#define MCR_PYFAST_H

#include <Python.h>

/* descr(self) for a method descriptor taken from the type. */
static inline PyObject *mcr_call0(PyObject *descr, PyObject *self)
{
  return PyObject_Vectorcall(descr, &self, 1, NULL);
}

/* self.<attr> for a getset descriptor taken from the type. */
static inline PyObject *mcr_getattr(PyObject *descr, PyObject *self)
{
  return Py_TYPE(descr)->tp_descr_get(descr, self, (PyObject *)Py_TYPE(self));
}

#endif /* MCR_PYFAST_H */
