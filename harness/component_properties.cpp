// Component-level parity properties: the loss, the attention and the
// checkpoint against their reference twins on generated shapes.
#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>
#include <rapidcheck.h>
#include <toml++/toml.h>

#include <optional>
#include <sstream>

#include "harness/generators.h"
#include "harness/parity.h"
#include "harness/properties.h"
#include "reference/layers.h"
#include "reference/step.h"

namespace dflash::harness {
namespace {

at::Tensor randn(at::IntArrayRef shape, uint64_t seed) {
  at::Generator g = at::make_generator<at::CPUGeneratorImpl>(seed);
  return at::randn(shape, g, at::kDouble);
}

at::Tensor leaf(const at::Tensor& t, at::ScalarType dt) {
  return t.detach().to(dt).clone().requires_grad_(true);
}

at::Tensor gen_mask(int64_t B, int64_t S) {
  at::Tensor m = at::zeros({B, S}, at::kBool);
  for (int64_t b = 0; b < B; ++b) {
    const int pattern = *rc::gen::inRange(0, 4);
    for (int64_t s = 0; s < S; ++s)
      m[b][s] = pattern == 2 || (pattern == 0 && *rc::gen::inRange(0, 10) < 7) ||
                (pattern == 3 && (s <= 1 || s >= S - 2));
  }
  return m;
}

struct LossCase {
  Config cfg;
  int64_t B, S, H, V;
  at::Tensor mask, ids;
  uint64_t seed;
  double upstream;
  bool near_agreement = false;  // student hidden = teacher's + 1e-3 noise (p_s ~ p_t)
};

rc::Gen<LossCase> gen_loss_case(const LossCaseOverride& fixed) {
  return rc::gen::exec([fixed] {
    LossCase c;
    c.B = *rc::gen::inRange<int64_t>(1, 4);
    c.S = *rc::gen::inRange<int64_t>(2, 17);
    c.H = *rc::gen::element<int64_t>(4, 8, 12);
    c.V = *rc::gen::inRange<int64_t>(2, 41);
    c.cfg.data.block_size = *rc::gen::inRange<int64_t>(2, 6);
    c.cfg.data.max_anchors = *rc::gen::inRange<int64_t>(1, 6);
    const int64_t Qmax = c.cfg.data.block_size * c.cfg.data.max_anchors;
    c.cfg.loss.chunk_size =
        *rc::gen::oneOf(rc::gen::just<int64_t>(0), rc::gen::just<int64_t>(1),
                        // 2 or 3: a few counted rows leave a ragged last chunk
                        rc::gen::inRange<int64_t>(2, 4), rc::gen::inRange<int64_t>(2, Qmax + 1),
                        rc::gen::just<int64_t>(Qmax + 5));
    gen_objectives(c.cfg.loss);
    if (fixed.objective) fixed.objective(c.cfg.loss);
    c.cfg.run.dtype = fixed.dtype
                          ? *fixed.dtype
                          : *rc::gen::element(DType::kFloat64, DType::kFloat32, DType::kBFloat16);
    c.cfg.optimized.kernels = *rc::gen::element<std::string>("host", "aten");
    // Near agreement in float64 only unless fixed: in float32 the terms'
    // gradients there carry the inputs' rounding over a tiny difference (and
    // TV's sign of it), measured per objective instead (docs/HARNESS.md).
    c.near_agreement = fixed.near_agreement ? *fixed.near_agreement
                       : c.cfg.run.dtype == DType::kFloat64
                           ? *rc::gen::element(false, false, false, true)
                           : false;
    c.mask = gen_mask(c.B, c.S);
    c.seed = *rc::gen::inRange<uint64_t>(0, 1u << 30);
    c.ids =
        at::randint(c.V, {c.B, c.S}, at::make_generator<at::CPUGeneratorImpl>(c.seed), at::kLong);
    c.upstream = *rc::gen::element(0.37, -1.9, 3.0);
    return c;
  });
}

// A (B, S) bool or int64 tensor as a TOML array of rows.
std::string rows_toml(const at::Tensor& t) {
  const at::Tensor x = t.to(at::kLong).contiguous();
  std::string s = "[";
  for (int64_t b = 0; b < x.size(0); ++b) {
    s += b ? ", [" : "[";
    for (int64_t j = 0; j < x.size(1); ++j)
      s += fmt::format("{}{}", j ? ", " : "", x[b][j].item<int64_t>());
    s += "]";
  }
  return s + "]";
}

// What the replay needs: reads `key` of the [case] table, naming the file
// and key when it is missing or of the wrong type.
struct CaseReader {
  const toml::table& t;
  std::string label;
  // Integers must be TOML integers (value_exact): toml++'s converting
  // value<int64_t>() casts an out-of-range float such as 1e41 with undefined
  // behaviour (found by fuzz_counterexample under UBSan).
  template <typename T>
  T get(const char* key) const {
    std::optional<T> v;
    if constexpr (std::is_integral_v<T>)
      v = t[key].template value_exact<T>();
    else
      v = t[key].template value<T>();
    if (!v)
      throw std::runtime_error(fmt::format(
          "{}: case.{} is missing or not {}", label, key,
          std::is_same_v<T, std::string> ? "a string"
                                         : (std::is_integral_v<T> ? "an integer" : "a number")));
    return *v;
  }
  // An integer held to [lo, hi]: a replay file is input, and its sizes are
  // checked before anything is allocated by them.
  int64_t dim(const char* key, int64_t lo, int64_t hi) const {
    const int64_t v = get<int64_t>(key);
    if (v < lo || v > hi)
      throw std::runtime_error(fmt::format("{}: case.{}: expected an integer in [{}, {}], found {}",
                                           label, key, lo, hi, v));
    return v;
  }
  double real(const char* key, double lo, double hi) const {
    const double v = get<double>(key);
    if (!(v >= lo && v <= hi))
      throw std::runtime_error(fmt::format("{}: case.{}: expected a number in [{}, {}], found {}",
                                           label, key, lo, hi, v));
    return v;
  }
  // The largest tensor a case builds stays below 2^24 elements.
  void cap(const char* what, long double elements) const {
    if (elements > (1 << 24))
      throw std::runtime_error(
          fmt::format("{}: case: {} would hold {:.3g} elements; a replayed case holds at most 2^24",
                      label, what, double(elements)));
  }
  // A (rows, cols) table of integers in [lo, hi] as a tensor of `dt`.
  at::Tensor rows(const char* key, int64_t rows, int64_t cols, at::ScalarType dt, int64_t lo,
                  int64_t hi) const {
    const toml::array* a = t[key].as_array();
    if (!a || int64_t(a->size()) != rows)
      throw std::runtime_error(fmt::format("{}: case.{} must be {} rows", label, key, rows));
    at::Tensor out = at::zeros({rows, cols}, at::kLong);
    for (int64_t b = 0; b < rows; ++b) {
      const toml::array* r = (*a)[size_t(b)].as_array();
      if (!r || int64_t(r->size()) != cols)
        throw std::runtime_error(
            fmt::format("{}: case.{}[{}] must hold {} integers", label, key, b, cols));
      for (int64_t j = 0; j < cols; ++j) {
        const auto v = (*r)[size_t(j)].value_exact<int64_t>();
        if (!v || *v < lo || *v > hi)
          throw std::runtime_error(fmt::format(
              "{}: case.{}[{}][{}]: expected an integer in [{}, {}]", label, key, b, j, lo, hi));
        out[b][j] = *v;
      }
    }
    return out.to(dt);
  }
  // Optional (cases written before both implementations existed: host).
  optimized::Kernels kernels() const {
    if (!t.contains("kernels")) return optimized::Kernels::kHost;
    const std::string k = get<std::string>("kernels");
    if (k == "host" || k == "aten")
      return k == "host" ? optimized::Kernels::kHost : optimized::Kernels::kAten;
    throw std::runtime_error(
        fmt::format("{}: case.kernels: expected \"host\" or \"aten\", found \"{}\"", label, k));
  }
  DType dtype() const {
    const std::string d = get<std::string>("dtype");
    for (DType x : {DType::kFloat64, DType::kFloat32, DType::kBFloat16})
      if (d == dtype_name(x)) return x;
    throw std::runtime_error(fmt::format("{}: case.dtype \"{}\" is not a dtype", label, d));
  }
};

// The objectives beyond CE + KL (optional: cases written before them hold
// neither, and mean weight 0 with the decay), checked as the config is.
void read_objectives(const CaseReader& r, LossConfig& l) {
  auto opt = [&](const char* key, double def, double lo, double hi) {
    return r.t.contains(key) ? r.real(key, lo, hi) : def;
  };
  l.reverse_kl_weight = opt("reverse_kl_weight", 0, 0, 1e6);
  l.jsd_weight = opt("jsd_weight", 0, 0, 1e6);
  l.jsd_beta = opt("jsd_beta", 0.5, 0, 1);
  l.tv_weight = opt("tv_weight", 0, 0, 1e6);
  l.dpace_alpha = opt("dpace_alpha", 0.5, 1e-9, 1);
  l.weighting = Weighting::kDecay;
  if (r.t.contains("weighting")) {
    const std::string w = r.get<std::string>("weighting");
    bool known = false;
    for (Weighting x : {Weighting::kDecay, Weighting::kDpace, Weighting::kUniform})
      if (w == weighting_name(x)) l.weighting = x, known = true;
    if (!known)
      throw std::runtime_error(fmt::format(
          "{}: case.weighting: expected \"decay\", \"dpace\" or \"uniform\", found \"{}\"", r.label,
          w));
  }
}

std::string loss_case_toml(const LossCase& c) {
  return fmt::format(
      "# one case of the parity.loss property; replay: dflash parity --reproduce FILE\n"
      "[case]\ncomponent = \"loss\"\nB = {}\nS = {}\nH = {}\nV = {}\nblock_size = {}\n"
      "max_anchors = {}\nchunk_size = {}\nce_weight = {}\nkl_weight = {}\ntemperature = {}\n"
      "gamma = {}\nreverse_kl_weight = {}\njsd_weight = {}\njsd_beta = {}\ntv_weight = {}\n"
      "weighting = \"{}\"\ndpace_alpha = {}\n"
      "dtype = \"{}\"\nkernels = \"{}\"\nseed = {}\nupstream = {}\nnear_agreement = {}\n"
      "loss_mask = {}\n",
      c.B, c.S, c.H, c.V, c.cfg.data.block_size, c.cfg.data.max_anchors, c.cfg.loss.chunk_size,
      c.cfg.loss.ce_weight, c.cfg.loss.kl_weight, c.cfg.loss.temperature, c.cfg.loss.gamma,
      c.cfg.loss.reverse_kl_weight, c.cfg.loss.jsd_weight, c.cfg.loss.jsd_beta,
      c.cfg.loss.tv_weight, weighting_name(c.cfg.loss.weighting), c.cfg.loss.dpace_alpha,
      dtype_name(c.cfg.run.dtype), c.cfg.optimized.kernels, c.seed, c.upstream, c.near_agreement,
      rows_toml(c.mask));
}

LossCase loss_case_from(const CaseReader& r) {
  LossCase c;
  c.B = r.dim("B", 1, 256);
  c.S = r.dim("S", 2, 4096);
  c.H = r.dim("H", 1, 4096);
  c.V = r.dim("V", 2, 65536);
  c.cfg.data.block_size = r.dim("block_size", 2, 256);
  c.cfg.data.max_anchors = r.dim("max_anchors", 1, 1024);
  c.cfg.loss.chunk_size = r.dim("chunk_size", 0, 4096);
  c.cfg.loss.ce_weight = r.real("ce_weight", 0, 1e6);
  c.cfg.loss.kl_weight = r.real("kl_weight", 0, 1e6);
  c.cfg.loss.temperature = r.real("temperature", 1e-6, 1e4);
  c.cfg.loss.gamma = r.real("gamma", 0, 1e6);
  read_objectives(r, c.cfg.loss);
  c.cfg.run.dtype = r.dtype();
  c.cfg.optimized.kernels = optimized::kernels_name(r.kernels());
  c.seed = uint64_t(r.dim("seed", 0, INT64_MAX));
  c.upstream = r.real("upstream", -1e6, 1e6);
  if (r.t.contains("near_agreement")) {
    const std::optional<bool> near = r.t["near_agreement"].value<bool>();
    if (!near)
      throw std::runtime_error(
          fmt::format("{}: case.near_agreement: expected true or false", r.label));
    c.near_agreement = *near;
  }
  const long double Q = (long double)c.cfg.data.max_anchors * c.cfg.data.block_size;
  r.cap("the hidden states and logits (B*S*max(H, V))",
        (long double)c.B * c.S * std::max(c.H, c.V));
  r.cap("the draft logits (B*Q*max(H, V))", c.B * Q * std::max(c.H, c.V));
  c.mask = r.rows("loss_mask", c.B, c.S, at::kBool, 0, 1);
  c.ids = at::randint(c.V, {c.B, c.S}, at::make_generator<at::CPUGeneratorImpl>(c.seed), at::kLong);
  return c;
}

struct LossRun {
  StepOutputs out;
  at::Tensor grad;
};

NamedOutputs outputs(const LossRun& r) {
  NamedOutputs o = loss_terms(r.out);
  o.emplace_back("grad.student_hidden", r.grad);
  return o;
}

std::string check_loss_case(const LossFn& candidate, const LossCase& c, std::string* size) {
  Rng rng(c.seed);
  const Anchors a = sample_anchors(c.mask, c.cfg.data.max_anchors, rng);
  const DraftLayout l =
      make_draft_layout(c.ids, c.mask, a, c.cfg.data.block_size, c.V - 1, c.cfg.loss.gamma);
  const int64_t Q = l.noise_ids.size(1);
  *size = fmt::format("B={} S={} Q={} H={} V={} chunk={} {} {} kernels", c.B, c.S, Q, c.H, c.V,
                      c.cfg.loss.chunk_size, dtype_name(c.cfg.run.dtype), c.cfg.optimized.kernels);
  const at::Tensor Ht = randn({c.B, c.S, c.H}, c.seed + 2);  // (B, S, H)
  // (B, Q, H): random, or near agreement: the teacher's row of each slot
  // plus 1e-3 noise, so the student's logits differ from the teacher's by
  // ~1e-3 and every divergence is a difference of nearly equal terms.
  const at::Tensor D = c.near_agreement
                           ? Ht.gather(1, l.teacher_index.unsqueeze(-1).expand({c.B, Q, c.H})) +
                                 1e-3 * randn({c.B, Q, c.H}, c.seed + 1)
                           : randn({c.B, Q, c.H}, c.seed + 1);
  const at::Tensor W = randn({c.V, c.H}, c.seed + 3);
  const DtypeRule& rule = dtype_rule(c.cfg.run.dtype);
  auto run = [&](const LossFn& fn, at::ScalarType dt, uint64_t jitter) {
    // jitter > 0: inputs perturbed at the rounding level (harness/parity.h).
    auto j = [&](const at::Tensor& t, uint64_t k) {
      return jitter ? t * (1 + rule.rounding * randn(t.sizes(), c.seed + 97 * jitter + k)) : t;
    };
    const at::Tensor x = leaf(j(D, 1), dt);
    LossRun r{fn(c.cfg, x * 1.0, j(Ht, 2).to(dt), j(W, 3).to(dt), l, a), {}};
    (r.out.loss * c.upstream).backward();
    r.grad = x.grad();
    return r;
  };
  const at::ScalarType dt = scalar_type(c.cfg.run.dtype);
  const LossRun ref = run(reference::loss_and_metrics, at::kDouble, 0);
  const NamedOutputs r64 = outputs(ref);
  const std::vector<NamedOutputs> same = same_precision_runs(
      [&](uint64_t k) { return outputs(run(reference::loss_and_metrics, dt, k)); }, r64,
      dt == at::kDouble);
  const LossRun cand = run(candidate, dt, 0);
  ComparisonReport rep;
  compare_outputs(rep, outputs(cand), same, r64, [&](const std::string& name) {
    return name == "grad.student_hidden" ? rule.tol : loss_tolerance(rule.tol);
  });
  // Argmax metrics: exact in float64; float32 may flip near ties only.
  const at::Tensor logits = reference::project(D, W);
  const at::Tensor top2 = std::get<0>(logits.topk(std::min<int64_t>(2, c.V), -1));
  const double scale = 1.0 + (logits.numel() ? logits.abs().max().item<double>() : 0.0);
  const at::Tensor near =
      c.V < 2 ? at::zeros_like(l.counted)
              : (top2.select(-1, 0) - top2.select(-1, 1)) < rule.logit_noise * scale;
  const int64_t ties = (near & l.counted).sum().item<int64_t>();
  const bool metrics_ok =
      (cand.out.correct - ref.out.correct).abs().sum().item<int64_t>() <= ties &&
      at::equal(cand.out.counted, ref.out.counted);
  if (!metrics_ok) {
    Comparison m;
    m.name = "metric.correct_per_slot";
    m.message = fmt::format("{} hits differ with {} near ties",
                            (cand.out.correct - ref.out.correct).abs().sum().item<int64_t>(), ties);
    rep.rows.push_back(m);
  }
  return rep.ok() ? "" : rep.format(*size);
}

struct AttnCase {
  int64_t B, S, N, bs, nkv, G, hd, tile;
  DType dtype;
  optimized::Kernels kernels = optimized::Kernels::kHost;
  Anchors a;
  uint64_t seed;
};

rc::Gen<AttnCase> gen_attention_case() {
  return rc::gen::exec([] {
    AttnCase c;
    c.B = *rc::gen::inRange<int64_t>(1, 4);
    c.S = *rc::gen::inRange<int64_t>(2, 21);
    c.N = *rc::gen::inRange<int64_t>(0, 6);
    c.bs = *rc::gen::inRange<int64_t>(2, 6);
    c.nkv = *rc::gen::inRange<int64_t>(1, 4);
    c.G = *rc::gen::inRange<int64_t>(1, 4);
    c.hd = *rc::gen::element<int64_t>(2, 4, 8);
    c.tile = *rc::gen::inRange<int64_t>(1, c.S + 3);
    c.dtype = *rc::gen::element(DType::kFloat64, DType::kFloat32, DType::kBFloat16);
    c.kernels = *rc::gen::element(optimized::Kernels::kHost, optimized::Kernels::kAten);
    // As in the step generator: bf16 cases use real-model head dims (a per-head
    // problem over 2 or 4 elements is too ill-conditioned for bf16's rounding).
    if (c.dtype == DType::kBFloat16) c.hd = *rc::gen::element<int64_t>(8, 16);
    c.a.anchors = at::zeros({c.B, c.N}, at::kLong);
    c.a.keep = at::zeros({c.B, c.N}, at::kBool);
    for (int64_t b = 0; b < c.B; ++b)
      for (int64_t n = 0; n < c.N; ++n) {
        c.a.anchors[b][n] =
            *rc::gen::oneOf(rc::gen::just<int64_t>(0), rc::gen::just<int64_t>(c.S - 2),
                            rc::gen::inRange<int64_t>(0, c.S - 1));
        c.a.keep[b][n] = *rc::gen::weightedElement<bool>({{4, true}, {1, false}});
      }
    c.seed = *rc::gen::inRange<uint64_t>(0, 1u << 30);
    return c;
  });
}

std::string attention_case_toml(const AttnCase& c) {
  return fmt::format(
      "# one case of the parity.attention property; replay: dflash parity --reproduce FILE\n"
      "[case]\ncomponent = \"attention\"\nB = {}\nS = {}\nN = {}\nblock_size = {}\nnkv = {}\n"
      "group = {}\nhead_dim = {}\ntile = {}\ndtype = \"{}\"\nkernels = \"{}\"\nseed = {}\n"
      "anchors = {}\nkeep = {}\n",
      c.B, c.S, c.N, c.bs, c.nkv, c.G, c.hd, c.tile, dtype_name(c.dtype),
      optimized::kernels_name(c.kernels), c.seed, c.N ? rows_toml(c.a.anchors) : std::string("[]"),
      c.N ? rows_toml(c.a.keep) : std::string("[]"));
}

AttnCase attention_case_from(const CaseReader& r) {
  AttnCase c;
  c.B = r.dim("B", 1, 256);
  c.S = r.dim("S", 2, 4096);
  c.N = r.dim("N", 0, 1024);
  c.bs = r.dim("block_size", 2, 256);
  c.nkv = r.dim("nkv", 1, 64);
  c.G = r.dim("group", 1, 64);
  c.hd = r.dim("head_dim", 2, 512);
  c.tile = r.dim("tile", 1, 4096);
  c.dtype = r.dtype();
  c.kernels = r.kernels();
  c.seed = uint64_t(r.dim("seed", 0, INT64_MAX));
  r.cap("the queries and keys (B*nh*(S+Q)*head_dim)",
        (long double)c.B * c.nkv * c.G * (c.S + c.N * c.bs) * c.hd);
  r.cap("the scores (B*nh*Q*(S+Q))",
        (long double)c.B * c.nkv * c.G * c.N * c.bs * (c.S + c.N * c.bs));
  // Anchors in [0, S-2] (SPEC.md's candidates): out of range one would index
  // past the context keys.
  c.a.anchors =
      c.N ? r.rows("anchors", c.B, c.N, at::kLong, 0, c.S - 2) : at::zeros({c.B, 0}, at::kLong);
  c.a.keep = c.N ? r.rows("keep", c.B, c.N, at::kBool, 0, 1) : at::zeros({c.B, 0}, at::kBool);
  return c;
}

std::string check_attention_case(const AttentionFn& candidate, const AttnCase& c,
                                 std::string* size) {
  const int64_t Q = c.N * c.bs, nh = c.nkv * c.G;
  *size = fmt::format("B={} S={} N={} bs={} nh={} nkv={} hd={} tile={} {} {} kernels", c.B, c.S,
                      c.N, c.bs, nh, c.nkv, c.hd, c.tile, dtype_name(c.dtype),
                      optimized::kernels_name(c.kernels));
  const at::Tensor q = randn({c.B, nh, Q, c.hd}, c.seed),
                   k = randn({c.B, c.nkv, c.S + Q, c.hd}, c.seed + 1);
  const at::Tensor v = randn({c.B, c.nkv, c.S + Q, c.hd}, c.seed + 2);
  const at::Tensor dout = randn({c.B, nh, Q, c.hd}, c.seed + 3);  // per-element upstream
  const DtypeRule& rule = dtype_rule(c.dtype);
  auto run = [&](const AttentionFn& fn, at::ScalarType dt, uint64_t jitter) {
    // jitter > 0: inputs perturbed at the rounding level (harness/parity.h),
    // as the loss and step properties do: one same-precision run alone can
    // round luckily well on a small case (a few dozen elements) and set a
    // bound below the dtype's real noise.
    auto j = [&](const at::Tensor& t, uint64_t i) {
      return jitter ? t * (1 + rule.rounding * randn(t.sizes(), c.seed + 97 * jitter + i)) : t;
    };
    const at::Tensor ql = leaf(j(q, 1), dt), kl = leaf(j(k, 2), dt), vl = leaf(j(v, 3), dt);
    const at::Tensor out = fn(ql, kl, vl, c.a, c.S, c.bs, c.tile, c.kernels);
    (out * j(dout, 4).to(dt)).sum().backward();
    return NamedOutputs{
        {"out", out}, {"grad.q", ql.grad()}, {"grad.k", kl.grad()}, {"grad.v", vl.grad()}};
  };
  const AttentionFn dense = [](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                               const Anchors& a, int64_t S, int64_t bs, int64_t,
                               optimized::Kernels) {
    return reference::draft_attention(q, k, v, a, S, bs);
  };
  const at::ScalarType dt = scalar_type(c.dtype);
  const NamedOutputs r64 = run(dense, at::kDouble, 0);
  const std::vector<NamedOutputs> same =
      same_precision_runs([&](uint64_t k) { return run(dense, dt, k); }, r64, dt == at::kDouble);
  ComparisonReport rep;
  compare_outputs(rep, run(candidate, dt, 0), same, r64,
                  [&](const std::string&) { return rule.tol; });
  return rep.ok() ? "" : rep.format(*size);
}

struct CkptCase {
  int64_t rows, width;
  bool noise;  // dropout inside the region: the RNG must be replayed in recompute
  uint64_t seed;
};

rc::Gen<CkptCase> gen_checkpoint_case() {
  return rc::gen::exec([] {
    CkptCase c;
    c.rows = *rc::gen::inRange<int64_t>(1, 7);
    c.width = *rc::gen::inRange<int64_t>(1, 9);
    c.noise = *rc::gen::arbitrary<bool>();
    c.seed = *rc::gen::inRange<uint64_t>(0, 1u << 30);
    return c;
  });
}

std::string checkpoint_case_toml(const CkptCase& c) {
  return fmt::format(
      "# one case of the parity.checkpoint property; replay: dflash parity --reproduce FILE\n"
      "[case]\ncomponent = \"checkpoint\"\nrows = {}\nwidth = {}\ndropout = {}\nseed = {}\n",
      c.rows, c.width, c.noise ? 1 : 0, c.seed);
}

CkptCase checkpoint_case_from(const CaseReader& r) {
  const int64_t rows = r.dim("rows", 1, 4096), width = r.dim("width", 1, 4096);
  r.cap("the region (rows*width, width*width)", (long double)std::max(rows, width) * width);
  return {rows, width, r.dim("dropout", 0, 1) != 0, uint64_t(r.dim("seed", 0, INT64_MAX))};
}

std::string check_checkpoint_case(const CheckpointImpl& candidate, const CkptCase& c,
                                  std::string* size) {
  const int64_t rows = c.rows, width = c.width;
  const bool noise = c.noise;
  const uint64_t seed = c.seed;
  *size = fmt::format("rows={} width={}{}", rows, width, noise ? " with dropout" : "");
  const at::Tensor w1 = randn({width, width}, seed).requires_grad_(),
                   w2 = randn({width, 3}, seed + 1).requires_grad_();
  auto region = [&](const at::Tensor& x, const at::Tensor& ctx) {
    at::Tensor h = at::tanh(at::matmul(x, w1)) + ctx;
    if (noise) h = h * (at::rand_like(h) > 0.3);  // needs the RNG replayed in recompute
    return at::matmul(h * h, w2);
  };
  auto grads = [&](bool use_candidate) {
    const at::Tensor x0 = randn({rows, width}, seed + 2).requires_grad_(),
                     c0 = randn({rows, width}, seed + 3).requires_grad_();
    const at::Tensor x = x0 * 2, ctx = c0 * 1.5;
    at::manual_seed(int64_t(seed));
    at::Tensor out;
    if (use_candidate)
      out = candidate({"region", {{"x", x}, {"ctx", ctx}}, {}, {{"w1", w1}, {"w2", w2}}},
                      [&](const std::vector<at::Tensor>& g, const std::vector<at::Tensor>&) {
                        return region(g[0], g[1]);
                      });
    else
      out = region(x, ctx);
    w1.mutable_grad().reset();
    w2.mutable_grad().reset();
    (out * randn(out.sizes(), seed + 4)).sum().backward();
    return NamedOutputs{{"grad.x", x0.grad()},
                        {"grad.ctx", c0.grad()},
                        {"grad.w1", w1.grad()},
                        {"grad.w2", w2.grad()}};
  };
  NamedOutputs plain, cand;
  try {
    plain = grads(false);
    cand = grads(true);
  } catch (const std::exception& e) {
    return fmt::format("{}: {}", *size, e.what());
  }
  const ComparisonReport rep = compare_outputs(cand, plain, plain, dtype_rule(DType::kFloat64).tol);
  return rep.ok() ? "" : rep.format(*size);
}

}  // namespace

PropertyOutcome check_loss_parity(const LossFn& candidate, const PropertyRun& run,
                                  const std::string& name, const LossCaseOverride& fixed) {
  return run_property_public(name, run, [&](std::string* size, std::string* replay) {
    const LossCase c = *gen_loss_case(fixed);
    *replay = loss_case_toml(c);
    return check_loss_case(candidate, c, size);
  });
}

PropertyOutcome check_attention_parity(const AttentionFn& candidate, const PropertyRun& run,
                                       const std::string& name) {
  return run_property_public(name, run, [&](std::string* size, std::string* replay) {
    const AttnCase c = *gen_attention_case();
    *replay = attention_case_toml(c);
    return check_attention_case(candidate, c, size);
  });
}

PropertyOutcome check_checkpoint_parity(const CheckpointImpl& candidate, const PropertyRun& run,
                                        const std::string& name) {
  return run_property_public(name, run, [&](std::string* size, std::string* replay) {
    const CkptCase c = *gen_checkpoint_case();
    *replay = checkpoint_case_toml(c);
    return check_checkpoint_case(candidate, c, size);
  });
}

std::string case_component(const std::string& toml_text) {
  try {
    const toml::table t = toml::parse(toml_text);
    return t["case"]["component"].value_or(std::string());
  } catch (const std::exception&) {
    return "";
  }
}

namespace {

// The file's [case] table (root kept alive by the caller).
const toml::table& case_table(const toml::table& root, const std::string& label) {
  const toml::table* c = root["case"].as_table();
  if (!c) throw std::runtime_error(fmt::format("{}: no [case] table", label));
  return *c;
}

toml::table parse_case_file(const std::string& toml_text, const std::string& label) {
  try {
    return toml::parse(toml_text, label);
  } catch (const toml::parse_error& e) {
    throw std::runtime_error(fmt::format("{}: not valid TOML: {}", label, e.description()));
  }
}

[[noreturn]] void unknown_component(const std::string& label, const std::string& component) {
  throw std::runtime_error(fmt::format(
      "{}: case.component \"{}\" is not loss, attention or checkpoint", label, component));
}

}  // namespace

std::string validate_component_case(const std::string& toml_text, const std::string& label) {
  const toml::table root = parse_case_file(toml_text, label);
  const CaseReader r{case_table(root, label), label};
  const std::string component = r.get<std::string>("component");
  if (component == "loss")
    loss_case_from(r);
  else if (component == "attention")
    attention_case_from(r);
  else if (component == "checkpoint")
    checkpoint_case_from(r);
  else
    unknown_component(label, component);
  return component;
}

std::string replay_component_case(const std::string& toml_text, const std::string& label,
                                  const ComponentImpls& impls, std::string* size) {
  const toml::table root = parse_case_file(toml_text, label);
  const CaseReader r{case_table(root, label), label};
  const std::string component = r.get<std::string>("component");
  if (component == "loss") return check_loss_case(impls.loss, loss_case_from(r), size);
  if (component == "attention")
    return check_attention_case(impls.attention, attention_case_from(r), size);
  if (component == "checkpoint")
    return check_checkpoint_case(impls.checkpoint, checkpoint_case_from(r), size);
  unknown_component(label, component);
}

}  // namespace dflash::harness
