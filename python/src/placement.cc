// Runs of a placement map (deltacast/engine.py, Placement): where the checkpoint values that one
// parameter of an engine's rank holds come from, compressed into arithmetic runs.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <utility>
#include <vector>

namespace py = pybind11;

namespace {

using Int64Array = py::array_t<std::int64_t, py::array::c_style | py::array::forcecast>;

// One run: elements [src, src + length) of checkpoint tensor `tensor` land at dst, dst + stride, ...
struct Run {
  std::int64_t tensor, src, length, dst, stride;
};

std::vector<Run> runs_of(const std::int64_t* source, std::int64_t elements, const std::int64_t* starts, std::int64_t tensors) {
  std::vector<std::pair<std::int64_t, std::int64_t>> pairs;  // (global source index, destination)
  for (std::int64_t d = 0; d < elements; ++d)
    if (source[d] >= 0) pairs.emplace_back(source[d], d);
  std::sort(pairs.begin(), pairs.end());
  std::vector<Run> runs;
  const std::int64_t* starts_end = starts + tensors;
  for (std::size_t i = 0; i < pairs.size();) {
    const std::int64_t g = pairs[i].first;
    // The tensor holding global index g: the last start at or before it.
    const std::int64_t t = std::upper_bound(starts, starts_end, g) - starts - 1;
    const std::int64_t tensor_end = t + 1 < tensors ? starts[t + 1] : INT64_MAX;
    Run r{t, g - starts[t], 1, pairs[i].second, 1};
    std::size_t j = i + 1;
    for (; j < pairs.size(); ++j) {
      const std::int64_t gj = pairs[j].first, dj = pairs[j].second, step = dj - pairs[j - 1].second;
      if (gj != pairs[j - 1].first + 1 || gj >= tensor_end || (r.length > 1 && step != r.stride)) break;
      if (r.length == 1) r.stride = step;
      r.length++;
    }
    runs.push_back(r);
    i = j;
  }
  return runs;
}

// For changed elements `idx` (ascending) of one checkpoint tensor and one layer of its runs
// (ascending, not overlapping): the positions in idx that land in a run, where they land, and in
// which parameter. A merge of the two sorted lists.
struct Hits {
  std::vector<std::int64_t> at, dst, owner;
};

Hits hits_of(const std::int64_t* idx, std::int64_t n, const std::int64_t* src, const std::int64_t* end, const std::int64_t* dst,
             const std::int64_t* stride, const std::int64_t* param, std::int64_t runs) {
  Hits h;
  h.at.reserve(static_cast<std::size_t>(n));
  h.dst.reserve(static_cast<std::size_t>(n));
  h.owner.reserve(static_cast<std::size_t>(n));
  std::int64_t r = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int64_t e = idx[i];
    while (r < runs && end[r] <= e) ++r;
    if (r == runs) break;
    if (e < src[r]) continue;
    h.at.push_back(i);
    h.dst.push_back(dst[r] + (e - src[r]) * stride[r]);
    h.owner.push_back(param[r]);
  }
  return h;
}

template <typename T>
py::array_t<T> to_array(std::vector<T>&& v) {
  auto* owned = new std::vector<T>(std::move(v));
  py::capsule free_when_done(owned, [](void* p) { delete static_cast<std::vector<T>*>(p); });
  return py::array_t<T>({static_cast<py::ssize_t>(owned->size())}, {sizeof(T)}, owned->data(), free_when_done);
}

}  // namespace

void bind_placement(py::module_& m) {
  m.def(
      "placement_hits",
      [](Int64Array idx, Int64Array src, Int64Array end, Int64Array dst, Int64Array stride, Int64Array param) {
        const py::ssize_t runs = src.size();
        if (idx.ndim() != 1 || src.ndim() != 1 || end.size() != runs || dst.size() != runs || stride.size() != runs || param.size() != runs)
          throw py::value_error("placement_hits takes flat arrays, the runs' all of one length");
        for (py::ssize_t i = 1; i < idx.size(); ++i)
          if (idx.data()[i] < idx.data()[i - 1]) throw py::value_error("changed elements must ascend");
        for (py::ssize_t r = 0; r < runs; ++r)
          if (end.data()[r] < src.data()[r] || (r > 0 && src.data()[r] < end.data()[r - 1])) throw py::value_error("runs must ascend without overlap");
        Hits h;
        {
          py::gil_scoped_release release;
          h = hits_of(idx.data(), idx.size(), src.data(), end.data(), dst.data(), stride.data(), param.data(), runs);
        }
        return py::make_tuple(to_array(std::move(h.at)), to_array(std::move(h.dst)), to_array(std::move(h.owner)));
      },
      py::arg("idx"), py::arg("src"), py::arg("end"), py::arg("dst"), py::arg("stride"), py::arg("param"),
      "(positions in idx that land, where each lands, in which parameter) for changed elements `idx` of a checkpoint tensor "
      "and one layer of its runs (Placement).");
  m.def(
      "placement_runs",
      [](Int64Array source, Int64Array starts) {
        if (source.ndim() != 1 || starts.ndim() != 1) throw py::value_error("placement_runs takes flat arrays");
        if (starts.size() == 0 || starts.data()[0] != 0) throw py::value_error("tensor starts begin at 0");
        for (py::ssize_t i = 1; i < starts.size(); ++i)
          if (starts.data()[i] < starts.data()[i - 1]) throw py::value_error("tensor starts must ascend");
        std::vector<Run> runs;
        {
          py::gil_scoped_release release;
          runs = runs_of(source.data(), source.size(), starts.data(), starts.size());
        }
        const auto n = static_cast<py::ssize_t>(runs.size());
        Int64Array tensor(n), src(n), length(n), dst(n), stride(n);
        for (py::ssize_t i = 0; i < n; ++i) {
          tensor.mutable_data()[i] = runs[i].tensor;
          src.mutable_data()[i] = runs[i].src;
          length.mutable_data()[i] = runs[i].length;
          dst.mutable_data()[i] = runs[i].dst;
          stride.mutable_data()[i] = runs[i].stride;
        }
        return py::make_tuple(tensor, src, length, dst, stride);
      },
      py::arg("source"), py::arg("tensor_starts"),
      "Runs (tensor, src, length, dst, stride), sorted by (tensor, src): element dst + k * stride of the parameter "
      "holds element src + k of checkpoint tensor `tensor`. `source`: per element of the parameter, the global index "
      "(tensor_starts[t] + element) of the checkpoint value it holds, or -1.");
}
