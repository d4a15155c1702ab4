// The attention form's autograd node in C++ (launcher.py builds and loads this file; docs/kernels.md).
//
// At short t the attention form is host-bound: a Python autograd node plus five Triton launches through Triton's
// Python launcher cost ~600-800 us of host time a fwd+bwd on an H100 host, against ~400 us of GPU time. Here
// the node, its buffers and the launches are C++: the launches go straight to cuLaunchKernel with the CUfunction
// handles Triton compiled (a "plan", registered once per specialization by launcher.py from the compiled kernels'
// signatures), so the kernels, their tiles and their arguments are exactly the Python path's.
//
// No CUDA headers: the few driver entry points are looked up in libcuda at first use. A dry-run mode records the
// launches instead of making them, so the CPU tests can check grids and arguments against the Python side.
#include <torch/library.h>
#include <torch/csrc/autograd/custom_function.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <dlfcn.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <vector>

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using at::Tensor;

// ---------------------------------------------------------------------------------------------------------------
// libcuda, looked up at first use
// ---------------------------------------------------------------------------------------------------------------
using CUresult = int;
using CUfunction = void*;
using CUstream = void*;
using CUcontext = void*;
using CUdevice = int;

struct Driver {
  CUresult (*launch)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream,
                     void**, void**) = nullptr;
  CUresult (*ctx_get_current)(CUcontext*) = nullptr;
  CUresult (*ctx_set_current)(CUcontext) = nullptr;
  CUresult (*device_get)(CUdevice*, int) = nullptr;
  CUresult (*primary_ctx_retain)(CUcontext*, CUdevice) = nullptr;
  CUresult (*error_string)(CUresult, const char**) = nullptr;
};

const Driver& driver() {
  static Driver d = [] {
    Driver d;
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    TORCH_CHECK(lib != nullptr, "longctx native launcher: cannot open libcuda.so.1");
    auto sym = [lib](const char* name) {
      void* f = dlsym(lib, name);
      TORCH_CHECK(f != nullptr, "longctx native launcher: libcuda has no ", name);
      return f;
    };
    d.launch = reinterpret_cast<decltype(d.launch)>(sym("cuLaunchKernel"));
    d.ctx_get_current = reinterpret_cast<decltype(d.ctx_get_current)>(sym("cuCtxGetCurrent"));
    d.ctx_set_current = reinterpret_cast<decltype(d.ctx_set_current)>(sym("cuCtxSetCurrent"));
    d.device_get = reinterpret_cast<decltype(d.device_get)>(sym("cuDeviceGet"));
    d.primary_ctx_retain = reinterpret_cast<decltype(d.primary_ctx_retain)>(sym("cuDevicePrimaryCtxRetain"));
    d.error_string = reinterpret_cast<decltype(d.error_string)>(sym("cuGetErrorString"));
    return d;
  }();
  return d;
}

void check(CUresult r, const char* what) {
  if (r == 0) return;
  const char* msg = "unknown error";
  driver().error_string(r, &msg);
  TORCH_CHECK(false, "longctx native launcher: ", what, " failed: ", msg, " (CUresult ", r, ")");
}

// The autograd engine runs a CUDA node's backward on its own device thread: make sure a context is current there
// (Triton's launcher does the same before each launch).
void ensure_context(int device_index) {
  const Driver& d = driver();
  CUcontext ctx = nullptr;
  check(d.ctx_get_current(&ctx), "cuCtxGetCurrent");
  if (ctx != nullptr) return;
  CUdevice dev = 0;
  check(d.device_get(&dev, device_index), "cuDeviceGet");
  check(d.primary_ctx_retain(&ctx, dev), "cuDevicePrimaryCtxRetain");
  check(d.ctx_set_current(ctx), "cuCtxSetCurrent");
}

// ---------------------------------------------------------------------------------------------------------------
// plans: what launcher.py registers per specialization
// ---------------------------------------------------------------------------------------------------------------
// Tensor slots and scalar slots a kernel parameter can name (launcher.py's SLOTS mirrors these numbers).
enum TensorSlot : int64_t { S_Q, S_K, S_V, S_LG, S_G, S_O, S_LSE, S_DO, S_DELTA, S_DQ, S_DK, S_DV, S_DGQ, S_DGK, S_DLG,
                            S_DQA, NUM_TENSOR_SLOTS };
enum ScalarSlot : int64_t { T_INT, SCALE, SCALE_P, NUM_SCALAR_SLOTS };
// Parameter kinds (launcher.py's KIND_*): a tensor's data pointer, an int32 or fp32 scalar slot, an int32 or fp32
// constant (fp32 constants as their bits).
enum ParamKind : int64_t { P_TENSOR, P_INT, P_FLOAT, P_CONST_INT, P_CONST_FLOAT };
// Kernels of a plan, in launch order; grids: (cdiv(t, rows), b * heads). A backward runs K_DQ then K_DKDV, or (the
// one-kernel backward) K_PREP, K_DKDV with dq by atomics into an fp32 scratch (S_DQA), K_FINISH.
enum KernelIndex : int { K_FWD_SCAN, K_FWD, K_DQ, K_PREP, K_DKDV, K_FINISH, K_BWD_SCAN, NUM_KERNELS };

struct Param {
  ParamKind kind;
  int64_t value;
};

struct KernelSpec {
  bool present = false;
  uint64_t function = 0;
  int64_t num_warps = 0, shared = 0, rows = 0, heads = 0;   // grid: (cdiv(t, rows) or 1 if rows <= 0, b * heads)
  int64_t scratch = 0;   // Triton's global scratch bytes per program (the tensor descriptors a kernel makes), or 0
  std::vector<Param> params;
};

struct Plan {
  int64_t hq = 0, hk = 0, d = 0, device = 0;
  bool norm = false, gated = false;
  std::array<KernelSpec, NUM_KERNELS> kernels;
};

constexpr int64_t kMaxPlans = 4096;
std::array<std::unique_ptr<Plan>, kMaxPlans> g_plans;   // appended under g_mutex, read without it (never moved)
std::atomic<int64_t> g_num_plans{0};
std::mutex g_mutex;

// Dry run (CPU tests): launches are appended to g_log instead of made.
std::atomic<bool> g_dry_run{false};
std::vector<int64_t> g_log;
std::mutex g_log_mutex;

// spec: [hq, hk, d, device, norm, gated, then per kernel: present, function, num_warps, shared, rows, heads,
//        scratch, n_params, (kind, value) * n_params]
int64_t register_plan(at::IntArrayRef spec) {
  auto plan = std::make_unique<Plan>();
  size_t i = 0;
  auto next = [&]() {
    TORCH_CHECK(i < spec.size(), "longctx native launcher: plan spec too short (", spec.size(), " values)");
    return spec[i++];
  };
  plan->hq = next(); plan->hk = next(); plan->d = next(); plan->device = next();
  plan->norm = next() != 0; plan->gated = next() != 0;
  for (auto& k : plan->kernels) {
    k.present = next() != 0;
    k.function = static_cast<uint64_t>(next());
    k.num_warps = next(); k.shared = next(); k.rows = next(); k.heads = next(); k.scratch = next();
    TORCH_CHECK(k.scratch >= 0 && k.scratch <= (1 << 16), "longctx native launcher: bad scratch size ", k.scratch);
    int64_t n = next();
    TORCH_CHECK(n >= 0 && n < 64, "longctx native launcher: bad parameter count ", n);
    for (int64_t j = 0; j < n; ++j) {
      int64_t kind = next(), value = next();
      TORCH_CHECK(kind >= P_TENSOR && kind <= P_CONST_FLOAT, "longctx native launcher: bad parameter kind ", kind);
      if (kind == P_TENSOR) TORCH_CHECK(value >= 0 && value < NUM_TENSOR_SLOTS, "bad tensor slot ", value);
      if (kind == P_INT || kind == P_FLOAT) TORCH_CHECK(value >= 0 && value < NUM_SCALAR_SLOTS, "bad scalar slot ", value);
      k.params.push_back({static_cast<ParamKind>(kind), value});
    }
  }
  TORCH_CHECK(i == spec.size(), "longctx native launcher: plan spec has ", spec.size() - i, " values too many");
  // A forward-only plan (launcher.py registers one from a call without gradients) has no backward kernels.
  const bool fused = plan->kernels[K_PREP].present, backward = plan->kernels[K_DQ].present || fused;
  TORCH_CHECK(plan->kernels[K_FWD].present && plan->kernels[K_DKDV].present == backward,
              "longctx native launcher: a plan needs the forward kernel, and dq with dk/dv or neither");
  TORCH_CHECK(plan->kernels[K_FINISH].present == fused && !(fused && plan->kernels[K_DQ].present),
              "longctx native launcher: a one-kernel backward needs its prep and finish passes and no dq kernel");
  TORCH_CHECK(!plan->gated || (plan->kernels[K_FWD_SCAN].present &&
                               plan->kernels[K_BWD_SCAN].present == backward),
              "longctx native launcher: a gated plan needs its gate scans");
  std::lock_guard<std::mutex> lock(g_mutex);
  int64_t id = g_num_plans.load();
  TORCH_CHECK(id < kMaxPlans, "longctx native launcher: more than ", kMaxPlans, " plans");
  g_plans[id] = std::move(plan);
  g_num_plans.store(id + 1);
  return id;
}

const Plan& get_plan(int64_t id) {
  TORCH_CHECK(id >= 0 && id < g_num_plans.load(), "longctx native launcher: no plan ", id);
  return *g_plans[id];
}

void set_dry_run(bool on) { g_dry_run.store(on); }

std::vector<int64_t> take_log() {
  std::lock_guard<std::mutex> lock(g_log_mutex);
  std::vector<int64_t> out;
  out.swap(g_log);
  return out;
}

// ---------------------------------------------------------------------------------------------------------------
// one launch
// ---------------------------------------------------------------------------------------------------------------
struct Args {
  std::array<uint64_t, NUM_TENSOR_SLOTS> ptr{};
  int32_t t = 0;
  float scale = 0.f, scale_p = 0.f;
};

uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

void launch(const Plan& plan, KernelIndex which, const Args& a, int64_t b, int64_t t, void* stream) {
  const KernelSpec& k = plan.kernels[which];
  // rows <= 0: one program along x (the gate scans: one segment of t steps)
  const int64_t grid_x = k.rows > 0 ? (t + k.rows - 1) / k.rows : 1, grid_y = b * k.heads;
  // Every parameter in an 8-byte cell; cuLaunchKernel reads each at its own size.
  std::array<uint64_t, 66> cells{};
  std::array<void*, 66> params{};
  size_t n = 0;
  for (const Param& p : k.params) {
    uint64_t cell = 0;
    switch (p.kind) {
      case P_TENSOR: cell = a.ptr[p.value]; break;
      case P_INT: { int32_t v = a.t; std::memcpy(&cell, &v, sizeof v); break; }
      case P_FLOAT: { uint32_t v = float_bits(p.value == SCALE ? a.scale : a.scale_p); std::memcpy(&cell, &v, sizeof v); break; }
      case P_CONST_INT: { int32_t v = static_cast<int32_t>(p.value); std::memcpy(&cell, &v, sizeof v); break; }
      case P_CONST_FLOAT: { uint32_t v = static_cast<uint32_t>(p.value); std::memcpy(&cell, &v, sizeof v); break; }
    }
    cells[n] = cell;
    params[n] = &cells[n];
    ++n;
  }
  // Triton's two trailing scratch pointers: the global scratch, grid x scratch bytes from torch's caching allocator on
  // the current stream (stream-ordered, so freed at once), where the kernel makes tensor descriptors; the profile
  // scratch (launcher.py registers no kernel that uses it) null. A dry run logs the global scratch's byte count.
  Tensor scratch;
  const int64_t scratch_bytes = grid_x * grid_y * k.scratch;
  if (scratch_bytes > 0 && !g_dry_run.load())
    scratch = at::empty({scratch_bytes}, at::TensorOptions().dtype(at::kByte).device(at::kCUDA, plan.device));
  cells[n] = scratch.defined() ? reinterpret_cast<uint64_t>(scratch.data_ptr()) : static_cast<uint64_t>(scratch_bytes);
  params[n] = &cells[n];
  cells[n + 1] = 0;
  params[n + 1] = &cells[n + 1];
  n += 2;
  if (g_dry_run.load()) {
    std::lock_guard<std::mutex> lock(g_log_mutex);
    g_log.insert(g_log.end(), {static_cast<int64_t>(which), static_cast<int64_t>(k.function), grid_x, grid_y,
                               32 * k.num_warps, k.shared, static_cast<int64_t>(n)});
    for (size_t j = 0; j < n; ++j) g_log.push_back(static_cast<int64_t>(cells[j]));
    return;
  }
  if (grid_x == 0 || grid_y == 0) return;
  ensure_context(static_cast<int>(plan.device));
  check(driver().launch(reinterpret_cast<CUfunction>(k.function), static_cast<unsigned>(grid_x),
                        static_cast<unsigned>(grid_y), 1, static_cast<unsigned>(32 * k.num_warps), 1, 1,
                        static_cast<unsigned>(k.shared), stream, params.data(), nullptr),
        "cuLaunchKernel");
}

void* current_stream(const Tensor& x) {
  if (g_dry_run.load() || !x.is_cuda()) return nullptr;
  const auto* impl = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA);
  return impl->getStream(x.device()).native_handle();
}

uint64_t ptr(const Tensor& x) { return reinterpret_cast<uint64_t>(x.data_ptr()); }

// Contiguous and 16-byte aligned: the plans' kernels were compiled for aligned pointers (Triton specializes on it),
// and an offset view (a narrow of a larger buffer) may not be.
Tensor dense(const Tensor& x) {
  Tensor y = x.contiguous();
  return ptr(y) % 16 ? y.clone() : y;
}

// ---------------------------------------------------------------------------------------------------------------
// the autograd node
// ---------------------------------------------------------------------------------------------------------------
struct AttentionFormNative : public torch::autograd::Function<AttentionFormNative> {
  static Tensor forward(AutogradContext* ctx, Tensor q, Tensor k, Tensor v, std::optional<Tensor> log_g,
                        int64_t plan_id, double scale, double scale_p) {
    const Plan& plan = get_plan(plan_id);
    const c10::DeviceGuard guard(q.device());      // the plan's kernels were loaded on q's device
    q = dense(q); k = dense(k); v = dense(v);
    const int64_t b = q.size(0), t = q.size(1);
    TORCH_CHECK(q.size(2) == plan.hq && k.size(2) == plan.hk && q.size(3) == plan.d,
                "longctx native launcher: inputs do not match plan ", plan_id);
    TORCH_CHECK(plan.gated == log_g.has_value(), "longctx native launcher: gating does not match plan ", plan_id);
    TORCH_CHECK(!q.is_cuda() || q.device().index() == plan.device, "longctx native launcher: q is on ", q.device(),
                ", plan ", plan_id, " was compiled for cuda:", plan.device);
    const auto f32 = q.options().dtype(at::kFloat);
    Tensor lg = plan.gated ? dense(*log_g) : Tensor();
    Tensor G = plan.gated ? at::empty({b, t, plan.hk}, f32) : at::empty({1}, f32);   // unread when ungated
    Tensor o = at::empty_like(q);
    Tensor lse = plan.norm ? at::empty({b, t, plan.hq}, f32) : at::empty({1}, f32);  // unread when not norm
    Args a;
    a.ptr[S_Q] = ptr(q); a.ptr[S_K] = ptr(k); a.ptr[S_V] = ptr(v); a.ptr[S_G] = ptr(G); a.ptr[S_O] = ptr(o);
    a.ptr[S_LSE] = ptr(lse);
    if (plan.gated) a.ptr[S_LG] = ptr(lg);
    a.t = static_cast<int32_t>(t);
    a.scale = static_cast<float>(scale);
    a.scale_p = static_cast<float>(scale_p);
    void* stream = current_stream(q);
    if (plan.gated) launch(plan, K_FWD_SCAN, a, b, t, stream);
    launch(plan, K_FWD, a, b, t, stream);
    ctx->save_for_backward({q, k, v, G, o, lse});
    ctx->saved_data["plan"] = plan_id;
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["scale_p"] = scale_p;
    return o;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const Plan& plan = get_plan(ctx->saved_data["plan"].toInt());
    const bool fused = plan.kernels[K_PREP].present;
    TORCH_CHECK(plan.kernels[K_DQ].present || fused, "longctx native launcher: plan ", ctx->saved_data["plan"].toInt(),
                " is forward-only (launcher.py uses it only without gradients)");
    auto saved = ctx->get_saved_variables();
    const Tensor &q = saved[0], &k = saved[1], &v = saved[2], &G = saved[3], &o = saved[4], &lse = saved[5];
    const c10::DeviceGuard guard(q.device());
    Tensor dout = dense(grads[0]);
    const int64_t b = q.size(0), t = q.size(1);
    const auto f32 = q.options().dtype(at::kFloat);
    // Delta = dy . y is formed by the kernel that runs first, dq or prep (as attention_backward in Python)
    Tensor delta = plan.norm ? at::empty({b, t, plan.hq}, f32) : lse;
    Tensor dq = at::empty_like(q), dk = at::empty_like(k), dv = at::empty_like(v);
    Tensor dgq = plan.gated ? at::empty({b, t, plan.hq}, f32) : lse;
    Tensor dgk = plan.gated ? at::empty({b, t, plan.hk}, f32) : lse;
    Tensor dlg = plan.gated ? at::empty({b, t, plan.hk}, f32) : Tensor();
    Args a;
    a.ptr[S_Q] = ptr(q); a.ptr[S_K] = ptr(k); a.ptr[S_V] = ptr(v); a.ptr[S_G] = ptr(G); a.ptr[S_O] = ptr(o);
    a.ptr[S_LSE] = ptr(lse); a.ptr[S_DO] = ptr(dout); a.ptr[S_DELTA] = ptr(delta); a.ptr[S_DQ] = ptr(dq);
    a.ptr[S_DK] = ptr(dk); a.ptr[S_DV] = ptr(dv); a.ptr[S_DGQ] = ptr(dgq); a.ptr[S_DGK] = ptr(dgk);
    if (plan.gated) a.ptr[S_DLG] = ptr(dlg);
    Tensor dqa = fused ? at::empty({b, t, plan.hq, plan.d}, f32) : Tensor();   // zeroed by prep
    if (fused) a.ptr[S_DQA] = ptr(dqa);
    a.t = static_cast<int32_t>(t);
    a.scale = static_cast<float>(ctx->saved_data["scale"].toDouble());
    a.scale_p = static_cast<float>(ctx->saved_data["scale_p"].toDouble());
    void* stream = current_stream(q);
    launch(plan, fused ? K_PREP : K_DQ, a, b, t, stream);
    launch(plan, K_DKDV, a, b, t, stream);
    if (fused) launch(plan, K_FINISH, a, b, t, stream);
    if (plan.gated) launch(plan, K_BWD_SCAN, a, b, t, stream);
    return {dq, dk, dv, dlg, Tensor(), Tensor(), Tensor()};
  }
};

Tensor attention_form(const Tensor& q, const Tensor& k, const Tensor& v, const std::optional<Tensor>& log_g,
                      int64_t plan, double scale, double scale_p) {
  return AttentionFormNative::apply(q, k, v, log_g, plan, scale, scale_p);
}

}  // namespace

TORCH_LIBRARY(longctx_native, m) {
  m.def("register_plan(int[] spec) -> int", &register_plan);
  m.def("set_dry_run(bool on) -> ()", &set_dry_run);
  m.def("take_log() -> int[]", &take_log);
  m.def("attention_form(Tensor q, Tensor k, Tensor v, Tensor? log_g, int plan, float scale, float scale_p) -> Tensor",
        &attention_form);
}
