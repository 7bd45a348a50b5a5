// A verified version handed from deltacast._native to deltacast._torch_views: a Python capsule
// that owns one reference to the version. Both modules are built from this tree together, so
// they agree on ModelVersion's layout; the capsule's name checks that it is one.
#pragma once

#include <Python.h>

#include <memory>
#include <stdexcept>

#include "deltacast/runtime/node_types.h"

namespace deltacast::python {

inline constexpr const char* kVersionCapsuleName = "deltacast.ModelVersion";
using VersionRef = std::shared_ptr<const runtime::ModelVersion>;

// A new reference to a capsule holding `v` (nullptr with a Python error set on failure).
inline PyObject* version_capsule(VersionRef v) {
  auto* held = new VersionRef(std::move(v));
  PyObject* capsule = PyCapsule_New(held, kVersionCapsuleName, [](PyObject* c) {
    delete static_cast<VersionRef*>(PyCapsule_GetPointer(c, kVersionCapsuleName));
  });
  if (capsule == nullptr) delete held;
  return capsule;
}

// The version a capsule holds; throws std::invalid_argument for any other object.
inline VersionRef version_from_capsule(PyObject* capsule) {
  void* held = PyCapsule_IsValid(capsule, kVersionCapsuleName) ? PyCapsule_GetPointer(capsule, kVersionCapsuleName) : nullptr;
  if (held == nullptr) throw std::invalid_argument("not a deltacast version capsule");
  return *static_cast<const VersionRef*>(held);
}

}  // namespace deltacast::python
