// TACO's side of `python -m bench taco`: one kernel, built through TACO's C++ API (libtaco),
// timed in this process on inputs packed beforehand. bench/taco.py builds it and talks to
// it one line at a time on stdin; every reply is one line on stdout.
//
//   load NAME FORMAT PATH     read a .sct file (bench/taco_data.py) into a TACO tensor of
//                             FORMAT (one letter a mode: d dense, s compressed), packed
//                             by TACO's own insert + pack                    -> "OK NAME"
//   compile FORMAT TYPE ORDER FUSED EXPR
//                             parse EXPR with TACO's parser (its result gets FORMAT and
//                             TYPE f4|f8), apply TACO's default schedule, the steps of
//                             TensorBase::compile() (concrete notation, topological loop
//                             order, temporaries, outer loop in parallel, concretize, scalar
//                             promotion), with ORDER ("-" or "i,j,k") as an explicit
//                             reorder before the parallel loop; lower "assemble" and
//                             "compute" into one module and compile it with TACO's cc
//                             flags, as TensorBase::compile() does. With FUSED "fused" and a
//                             sparse result, also a second module of one function,
//                             "evaluate", that assembles while it computes (FUSED "-": not)
//                                      -> "COMPILED lower_ms=.. cc_ms=.. fused_lower_ms=.."
//   source PATH               write the modules' C (one file)                -> "SOURCE"
//   native LIB                dlopen LIB, the same C built by bench/taco.py with other
//                             flags; variant "native" calls its functions      -> "NATIVE"
//   time VARIANT MODE THREADS WARMUP REPS SECONDS MOST
//                             WARMUP untimed calls, then timed ones (each alone, steady
//                             clock) until REPS calls and SECONDS of calls, at most MOST
//                                                                   -> "SAMPLES ms ms .."
//   dump VARIANT MODE THREADS PATH
//                             one call, its result written to PATH as a .sct file (a dense
//                             result is filled with NaN first, so every element must be
//                             written by the call)                            -> "DUMPED"
//   quit
//
// VARIANT: "taco" calls the module TACO compiled (Module::callFuncPacked, as
// TensorBase::compute() does, without its once-only guard); "native" the library of
// `native`, on the same tensors. MODE: "compute" (a dense result: its storage is allocated
// once by "assemble", then only compute runs), "ac" (a sparse result: assemble then compute,
// TACO's default path) or "fused" (a sparse result: evaluate). A sparse result's arrays,
// allocated by each call, are freed after it, outside the timing. Errors: one line
// "ERROR ..." and exit status 2.
#include "taco.h"
#include "taco/codegen/module.h"
#include "taco/index_notation/index_notation.h"
#include "taco/index_notation/transformations.h"
#include "taco/lower/lower.h"
#include "taco/parser/parser.h"
#include "taco/taco_tensor_t.h"

#include <dlfcn.h>
#include <omp.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

using namespace taco;
using std::string;
using std::vector;

[[noreturn]] static void fail(const string& why) {
  std::cout << "ERROR " << why << std::endl;
  std::exit(2);
}

static double nowMs() {
  using namespace std::chrono;
  return duration<double, std::milli>(steady_clock::now().time_since_epoch()).count();
}

// ---------------------------------------------------------------- .sct files

struct SctHeader {
  bool coo = false;
  int valueBytes = 8;
  int64_t nnz = 0;
  vector<int> dims;
};

static SctHeader readHeader(std::istream& in, const string& path) {
  string line;
  if (!std::getline(in, line)) fail("empty file " + path);
  std::istringstream words(line);
  string magic, kind, type;
  words >> magic >> kind >> type;
  if (magic != "sctensor" || (kind != "dense" && kind != "coo") || (type != "f4" && type != "f8"))
    fail("not a sctensor file: " + path);
  SctHeader h;
  h.coo = kind == "coo";
  h.valueBytes = type == "f4" ? 4 : 8;
  if (h.coo) words >> h.nnz;
  int64_t d;
  while (words >> d) h.dims.push_back((int)d);
  return h;
}

template <typename T>
static void fill(TensorBase& t, std::istream& in, const SctHeader& h, const string& path) {
  size_t order = h.dims.size();
  vector<int> coord(order);
  if (h.coo) {
    vector<vector<int32_t>> crd(order, vector<int32_t>(h.nnz));
    for (auto& c : crd) in.read(reinterpret_cast<char*>(c.data()), 4 * h.nnz);
    vector<T> vals(h.nnz);
    in.read(reinterpret_cast<char*>(vals.data()), sizeof(T) * h.nnz);
    if (!in) fail("short file " + path);
    for (int64_t p = 0; p < h.nnz; p++) {
      for (size_t m = 0; m < order; m++) coord[m] = crd[m][p];
      t.insert(coord, vals[p]);
    }
  } else {
    size_t n = 1;
    for (int d : h.dims) n *= (size_t)d;
    vector<T> vals(n);
    in.read(reinterpret_cast<char*>(vals.data()), sizeof(T) * n);
    if (!in) fail("short file " + path);
    for (size_t p = 0; p < n; p++) {
      for (size_t m = order, rest = p; m-- > 0; rest /= h.dims[m]) coord[m] = (int)(rest % h.dims[m]);
      t.insert(coord, vals[p]);
    }
  }
  t.pack();
}

static Format parseFormat(const string& letters) {
  vector<ModeFormatPack> modes;
  for (char c : letters) {
    if (c == 'd')
      modes.push_back(ModeFormat::Dense);
    else if (c == 's')
      modes.push_back(ModeFormat::Sparse);
    else
      fail("format letters are d and s, not " + letters);
  }
  return Format(modes);
}

static TensorBase load(const string& name, const string& fmt, const string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot open " + path);
  SctHeader h = readHeader(in, path);
  Format format = parseFormat(fmt);
  if ((size_t)format.getOrder() != h.dims.size()) fail("format " + fmt + " does not fit " + path);
  TensorBase t(name, h.valueBytes == 4 ? Float32 : Float64, h.dims, format);
  if (h.valueBytes == 4)
    fill<float>(t, in, h, path);
  else
    fill<double>(t, in, h, path);
  return t;
}

// ---------------------------------------------------------------- the kernel

// The arrays a call of a sparse result allocates, against those there before.
struct Saved {
  uint8_t* vals;
  vector<std::pair<uint8_t*, uint8_t*>> levels;
};

static Saved save(const taco_tensor_t* t) {
  Saved s{t->vals, {}};
  for (int m = 0; m < t->order; m++) {
    bool sparse = t->mode_types[m] == taco_mode_sparse;
    s.levels.push_back(sparse ? std::make_pair(t->indices[m][0], t->indices[m][1])
                              : std::make_pair((uint8_t*)nullptr, (uint8_t*)nullptr));
  }
  return s;
}

static void restore(taco_tensor_t* t, const Saved& s) {
  if (t->vals != s.vals) free(t->vals);
  t->vals = s.vals;
  for (int m = 0; m < t->order; m++) {
    if (t->mode_types[m] != taco_mode_sparse) continue;
    for (int a = 0; a < 2; a++) {
      uint8_t* before = a == 0 ? s.levels[m].first : s.levels[m].second;
      if (t->indices[m][a] != before) free(t->indices[m][a]);
      t->indices[m][a] = before;
    }
  }
}

struct Kernel {
  TensorBase result;
  std::map<string, TensorBase> loaded;
  std::shared_ptr<ir::Module> module;
  std::shared_ptr<ir::Module> fused;  // "evaluate", when asked for
  bool sparse = false;
  bool dense = false;  // every mode of the result dense
  bool allocated = false;  // a dense result's storage, allocated once
  vector<void*> args;  // the result, then the operands in the lowered functions' order
  Saved pristine;
  void* library = nullptr;  // the native build

  int callTaco(const string& fn) {
    if (fn != "evaluate") return module->callFuncPacked(fn, args.data());
    if (!fused) fail("no fused function: compile with FUSED \"fused\"");
    return fused->callFuncPacked(fn, args.data());
  }

  int callNative(const string& fn) {
    void* f = dlsym(library, fn.c_str());
    if (!f) fail("no function " + fn + " in the native library");
    void** a = args.data();
    switch (args.size()) {
      case 2: return ((int (*)(void*, void*))f)(a[0], a[1]);
      case 3: return ((int (*)(void*, void*, void*))f)(a[0], a[1], a[2]);
      case 4: return ((int (*)(void*, void*, void*, void*))f)(a[0], a[1], a[2], a[3]);
      case 5: return ((int (*)(void*, void*, void*, void*, void*))f)(a[0], a[1], a[2], a[3], a[4]);
    }
    fail("kernels of 1 to 4 operands only");
  }

  int call(const string& variant, const string& fn) {
    if (variant == "taco") return callTaco(fn);
    if (variant != "native") fail("variant is taco or native, not " + variant);
    if (!library) fail("no native library loaded");
    return callNative(fn);
  }

  // One call of MODE; the ms of the timed part. A sparse result is freed after unless kept.
  double once(const string& variant, const string& mode, bool keep) {
    taco_tensor_t* out = (taco_tensor_t*)args[0];
    if (mode == "compute") {
      if (!dense) fail("mode compute is for a dense result");
      if (!allocated) callTaco("assemble");
      allocated = true;
      double a = nowMs();
      call(variant, "compute");
      return nowMs() - a;
    }
    if (!sparse) fail("modes ac and fused are for a sparse result");
    double a = nowMs();
    if (mode == "ac") {
      call(variant, "assemble");
      call(variant, "compute");
    } else if (mode == "fused") {
      call(variant, "evaluate");
    } else {
      fail("mode is compute, ac or fused, not " + mode);
    }
    double took = nowMs() - a;
    if (!keep) restore(out, pristine);
    return took;
  }
};

static void threads(int n) {
  // callFuncPacked sets OpenMP's thread count and schedule from these around each call;
  // the native calls get the same settings here, outside their timing
  taco_set_num_threads(n);
  omp_set_num_threads(n);
  ParallelSchedule sched;
  int chunk;
  taco_get_parallel_schedule(&sched, &chunk);
  omp_set_schedule(sched == ParallelSchedule::Dynamic ? omp_sched_dynamic : omp_sched_static,
                   chunk);
}

static void compile(Kernel& k, const string& fmt, const string& type, const string& order,
                    bool withFused, const string& expr) {
  double t0 = nowMs();
  string name = expr.substr(0, expr.find('('));
  name.erase(name.find_last_not_of(' ') + 1);
  name.erase(0, name.find_first_not_of(' '));
  std::map<string, Format> formats = {{name, parseFormat(fmt)}};
  std::map<string, Datatype> types = {{name, type == "f4" ? Float32 : Float64}};
  parser::Parser parser(expr, formats, types, {}, k.loaded);
  try {
    parser.parse();
  } catch (parser::ParseError& e) {
    fail("TACO cannot parse " + expr + ": " + e.getMessage());
  }
  k.result = parser.getResultTensor();
  IndexStmt stmt = makeConcreteNotation(makeReductionNotation(k.result.getAssignment()));
  stmt = reorderLoopsTopologically(stmt);
  stmt = insertTemporaries(stmt);
  if (order != "-") {
    vector<IndexVar> vars;
    std::istringstream names(order);
    for (string v; std::getline(names, v, ',');) vars.push_back(parser.getIndexVar(v));
    stmt = stmt.reorder(vars);
  }
  stmt = parallelizeOuterLoop(stmt);
  IndexStmt concrete = scalarPromote(stmt.concretize());
  k.sparse = !isDense(k.result.getFormat());
  k.dense = !k.sparse;
  k.module = std::make_shared<ir::Module>();
  k.module->addFunction(lower(concrete, "assemble", true, false));
  k.module->addFunction(lower(concrete, "compute", false, true));
  double t1 = nowMs();
  k.module->compile();
  double t2 = nowMs(), t3 = t2;
  if (k.sparse && withFused) {
    k.fused = std::make_shared<ir::Module>();
    k.fused->addFunction(lower(concrete, "evaluate", true, true));
    t3 = nowMs();
    k.fused->compile();
  }
  double t4 = nowMs();
  taco_tensor_t* out = k.result.getTacoTensorT();
  k.args = {out};
  for (const TensorVar& var : getArguments(concrete)) {
    auto it = k.loaded.find(var.getName());
    if (it == k.loaded.end()) fail("no tensor loaded for " + var.getName());
    k.args.push_back(it->second.getTacoTensorT());
  }
  k.pristine = save(out);
  std::cout << "COMPILED lower_ms=" << (t1 - t0) << " cc_ms=" << (t2 - t1)
            << " fused_lower_ms=" << (t3 - t2) << " fused_cc_ms=" << (t4 - t3)
            << " sparse=" << k.sparse << " args=" << k.args.size() << " concrete=" << concrete
            << std::endl;
}

template <typename T>
static void poison(taco_tensor_t* t, size_t n) {
  T* v = (T*)t->vals;
  for (size_t p = 0; p < n; p++) v[p] = std::nan("");
}

static void dump(const taco_tensor_t* t, const string& path) {
  std::ofstream out(path, std::ios::binary);
  if (!out) fail("cannot write " + path);
  int bytes = t->csize / 8;  // TACO's storage gives the value size in bits
  const char* type = bytes == 4 ? "f4" : "f8";
  vector<int> dims(t->dimensions, t->dimensions + t->order);
  bool csr = t->order == 2 && t->mode_types[0] == taco_mode_dense &&
             t->mode_types[1] == taco_mode_sparse;
  if (!csr) {
    for (int m = 0; m < t->order; m++)
      if (t->mode_types[m] != taco_mode_dense) fail("dump writes dense or CSR results only");
    size_t n = 1;
    out << "sctensor dense " << type;
    for (int d : dims) out << " " << d, n *= (size_t)d;
    out << "\n";
    out.write((const char*)t->vals, n * bytes);
    return;
  }
  const int32_t* pos = (const int32_t*)t->indices[1][0];
  const int32_t* crd = (const int32_t*)t->indices[1][1];
  int64_t nnz = pos[dims[0]];
  out << "sctensor coo " << type << " " << nnz << " " << dims[0] << " " << dims[1] << "\n";
  vector<int32_t> rows(nnz);
  for (int i = 0; i < dims[0]; i++)
    for (int32_t p = pos[i]; p < pos[i + 1]; p++) rows[p] = i;
  out.write((const char*)rows.data(), 4 * nnz);
  out.write((const char*)crd, 4 * nnz);
  out.write((const char*)t->vals, nnz * bytes);
}

static void serve();

int main() {
  try {
    serve();
  } catch (std::exception& e) {  // TACO reports user errors as exceptions of many lines
    string why = e.what();
    for (char& c : why)
      if (c == '\n') c = ' ';
    fail(why);
  }
  return 0;
}

static void serve() {
  Kernel k;
  string line;
  while (std::getline(std::cin, line)) {
    std::istringstream in(line);
    string cmd;
    in >> cmd;
    if (cmd.empty()) continue;
    if (cmd == "quit") break;
    if (cmd == "load") {
      string name, fmt, path;
      in >> name >> fmt >> path;
      k.loaded.emplace(name, load(name, fmt, path));
      std::cout << "OK " << name << std::endl;
    } else if (cmd == "compile") {
      string fmt, type, order, fused, expr;
      in >> fmt >> type >> order >> fused;
      std::getline(in, expr);
      compile(k, fmt, type, order, fused == "fused", expr);
    } else if (cmd == "source") {
      string path;
      in >> path;
      std::ofstream source(path);
      source << k.module->getSource();
      // the second module's copy of TACO's helpers is skipped by their include guard
      if (k.fused) source << "\n" << k.fused->getSource();
      std::cout << "SOURCE" << std::endl;
    } else if (cmd == "native") {
      string path;
      in >> path;
      k.library = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (!k.library) fail(string("cannot load ") + dlerror());
      std::cout << "NATIVE" << std::endl;
    } else if (cmd == "time") {
      string variant, mode;
      int n, warmup, reps, most;
      double seconds;
      in >> variant >> mode >> n >> warmup >> reps >> seconds >> most;
      threads(n);
      for (int w = 0; w < warmup; w++) k.once(variant, mode, false);
      vector<double> samples;
      double spent = 0;
      while ((int)samples.size() < reps || (spent < seconds * 1e3 && (int)samples.size() < most)) {
        samples.push_back(k.once(variant, mode, false));
        spent += samples.back();
      }
      std::cout << "SAMPLES";
      for (double ms : samples) std::cout << " " << ms;
      std::cout << std::endl;
    } else if (cmd == "dump") {
      string variant, mode, path;
      int n;
      in >> variant >> mode >> n >> path;
      threads(n);
      taco_tensor_t* out = (taco_tensor_t*)k.args[0];
      if (mode == "compute") {
        if (!k.allocated) k.callTaco("assemble");
        k.allocated = true;
        size_t count = 1;
        for (int m = 0; m < out->order; m++) count *= (size_t)out->dimensions[m];
        if (out->csize == 32)
          poison<float>(out, count);
        else
          poison<double>(out, count);
      }
      k.once(variant, mode, true);
      dump(out, path);
      if (mode != "compute") restore(out, k.pristine);
      std::cout << "DUMPED" << std::endl;
    } else {
      fail("unknown command " + cmd);
    }
  }
}
