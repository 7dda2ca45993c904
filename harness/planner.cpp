#include "harness/planner.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>

#include "core/device.h"
#include "core/weights.h"
#include "harness/memory.h"

namespace dflash::harness {
namespace {

int64_t elem(DType d) { return d == DType::kBFloat16 ? 2 : d == DType::kFloat32 ? 4 : 8; }
int64_t acc(DType d) { return d == DType::kFloat64 ? 8 : 4; }
int64_t master(DType d) { return d == DType::kFloat64 ? 8 : 4; }
int64_t full_q(const Config& c) { return c.data.max_anchors * c.data.block_size; }
const char* kGB = "GB";

}  // namespace

PlanVariant configured_variant(const Config& c) {
  PlanVariant v;
  v.name = "configured";
  v.loss = c.optimized.chunked_loss ? LossMode::kFused : LossMode::kUnchunked;
  v.dense_attention = !c.optimized.sparse_attention;
  v.checkpoint = c.optimized.checkpoint_layers;
  const bool cpu = c.topology.device == "cpu";
  v.kernels = optimized::resolve_kernels(c.optimized.kernels,
                                         cpu ? c10::Device(c10::kCPU) : c10::Device(c10::kCUDA));
  v.cuda_allocator = !cpu;
  return v;
}

std::vector<PlanVariant> standard_variants(const Config& c) {
  const PlanVariant base = configured_variant(c);
  PlanVariant dense = base, unchunked = base, no_recompute = base;
  dense.name = "dense attention fallback", dense.dense_attention = true;
  unchunked.name = "unchunked loss (full logits)", unchunked.loss = LossMode::kUnchunked;
  no_recompute.name = "chunked loss without recompute",
  no_recompute.loss = LossMode::kChunkedNoRecompute;
  return {base, dense, unchunked, no_recompute};
}

std::vector<PlanItem> drafter_items(const Config& c, const PlanVariant& v, int64_t Q,
                                    bool with_optimizer) {
  const int64_t e = elem(c.run.dtype), a = acc(c.run.dtype), m = master(c.run.dtype);
  const int64_t B = c.data.batch_size, S = c.data.seq_len, H = c.drafter.shape.hidden_size;
  const int64_t V = c.target.vocab_size, L = c.num_taps(), Nd = c.drafter.num_hidden_layers;
  const LayerShape& s = c.drafter.shape;
  const double P = double(drafter_param_count(c));
  using K = PlanItem::Kind;
  std::vector<PlanItem> it;
  it.push_back(
      {"drafter master weights", P * m, K::kPersistent, fmt::format("{} params x {} B", P, m)});
  it.push_back({"drafter gradients", P * m, K::kGradients, "params x master size"});
  if (with_optimizer)
    it.push_back({"AdamW moments", 2 * P * m, K::kPersistent, "2 x params x master size"});
  if (e != m)
    it.push_back({"compute copies of the weights", P * e, K::kSaved, "params x compute size"});
  it.push_back({"frozen embedding + LM head",
                double((c.target.tie_word_embeddings ? 1 : 2) * V * H * e), K::kPersistent,
                "(1 if tied else 2) V H e"});
  it.push_back({"target features + hidden (received)", double(B * S * ((L + 1) * H * e + 9)),
                K::kPersistent, "B S ((L+1) H e + 9)"});
  if (c.topology.world_size > 1)
    it.push_back({"collective buffers", 2 * 25e6 + double(B * S * (L + 1) * H * e), K::kPersistent,
                  "2 all-reduce buckets of 25 MB + one feature receive buffer"});
  const Formula ctx = context_bytes(B, S, H, e);
  it.push_back({"context projection (saved)", ctx.bytes, K::kSaved, ctx.text});
  const Formula layer = layer_activation_bytes(B, Q, S, s, e);
  const AttentionSizes z = AttentionSizes::of(s, B, Q, S);
  const Formula dense = dense_attention_saved_bytes(z, e);
  const Formula sparse = sparse_attention_bytes(z, c.optimized.attention_tile, e, a, v.kernels);
  // The attention backward runs after the layer's MLP backward has freed
  // the MLP's activations.
  const double mlp = mlp_share_bytes(B, Q, H, s.intermediate_size, e).bytes;
  const double attention_bwd =
      std::max(0.0, (v.dense_attention ? dense.bytes : sparse.bytes) - mlp);
  if (v.checkpoint) {
    const Formula ck = checkpointed_saved_bytes(Nd, z, H, e);
    it.push_back({"layer inputs (checkpointed)", ck.bytes, K::kSaved, ck.text});
    it.push_back({"recompute of one layer + its attention backward", layer.bytes + attention_bwd,
                  K::kBackwardTransient,
                  layer.text + " + max(0, attention working set - e(2.2BQI + 2BQH))"});
  } else {
    it.push_back({fmt::format("activations of {} layers (not checkpointed)", Nd),
                  double(Nd) * layer.bytes, K::kLayerSaved, "layers x (" + layer.text + ")"});
    it.push_back({"embeddings, final norm input, RoPE tables (saved)",
                  double((3 * B * Q * H + 2 * B * (S + Q) * s.head_dim) * e), K::kSaved,
                  "3BQHe + 2B(S+Q) hd e"});
    if (v.dense_attention)
      it.push_back({fmt::format("dense attention scores of {} layers (saved)", Nd),
                    double(Nd) * dense.bytes, K::kLayerSaved, dense.text});
    it.push_back(
        {v.dense_attention ? "attention backward (dense, one layer)"
                           : "attention backward (sparse, one layer)",
         attention_bwd, K::kBackwardTransient,
         "max(0, " + (v.dense_attention ? dense.text : sparse.text) + " - e(2.2BQI + 2BQH))"});
  }
  const int64_t C = c.loss.chunk_size > 0 ? std::min(c.loss.chunk_size, B * Q) : B * Q;
  const LossTerms kl = LossTerms::of(c.loss);
  LossSizes ls;  // every row of the B x Q drafted positions
  ls.M = ls.Ns = B * Q, ls.H = H, ls.V = V, ls.C = C;
  Formula loss;
  if (v.loss == LossMode::kFused)
    loss = chunked_loss_bytes(ls, kl, e, v.kernels);
  else if (v.loss == LossMode::kChunkedNoRecompute)
    loss = chunked_no_recompute_loss_bytes(B * Q, V, C, kl, e);
  else
    loss = unchunked_loss_bytes(B * Q, V, kl, e);
  const char* lname = v.loss == LossMode::kFused ? "loss working set (fused chunked)"
                      : v.loss == LossMode::kChunkedNoRecompute
                          ? "loss working set (chunked, no recompute)"
                          : "loss working set (unchunked)";
  it.push_back({lname, loss.bytes, K::kForwardTransient, loss.text});
  return it;
}

// The attention part of one target layer's forward working set.
struct TargetAttentionBytes {
  double bytes;
  std::string what, formula;
};
TargetAttentionBytes target_attention_of(const Config& c, TargetAttention a) {
  const int64_t e = elem(c.run.dtype), B = c.data.batch_size, S = c.data.seq_len;
  const LayerShape& t = c.target.shape;
  const int64_t nh = t.num_attention_heads, chunk = c.optimized.target_query_chunk;
  if (a == TargetAttention::kTiled)  // one (B, nh, S) statistic
    return {double(4 * B * nh * S), "tiled attention", "4 B nh S"};
  const bool chunked = a == TargetAttention::kQueryChunked && chunk > 0 && chunk < S;
  const int64_t q = chunked ? chunk : S;
  const Formula f = target_attention_bytes(AttentionSizes::of(t, B, q, S), e);
  return {f.bytes, chunked ? fmt::format("query-chunked attention, {} rows", q) : "dense attention",
          f.text};
}

std::vector<PlanItem> target_items(const Config& c, TargetAttention attention) {
  const int64_t e = elem(c.run.dtype), B = c.data.batch_size, S = c.data.seq_len;
  const LayerShape& t = c.target.shape;
  const int64_t H = t.hidden_size, L = c.num_taps(), nh = t.num_attention_heads;
  const double layer =
      double(B * S *
             (3 * H + (nh + 2 * t.num_key_value_heads) * t.head_dim + 3 * t.intermediate_size) * e);
  const TargetAttentionBytes a = target_attention_of(c, attention);
  using K = PlanItem::Kind;
  return {
      {"target weights", double(target_param_count(c) * e), K::kPersistent,
       fmt::format("{} params x {} B", target_param_count(c), e)},
      {"target forward working set (no grad, one layer, " + a.what + ")", layer + a.bytes,
       K::kForwardTransient, "B S (3H + (nh+2nkv) hd + 3I) e + " + a.formula},
      {"tapped features + final hidden (send queue of 2)", double(2 * B * S * (L + 1) * H * e),
       K::kPersistent, "2 B S (L+1) H e"},
  };
}

double peak_of(const std::vector<PlanItem>& items, int64_t layers, std::string* largest) {
  using K = PlanItem::Kind;
  double persistent = 0, grads = 0, saved = 0, layer_saved = 0, fwd = 0, bwd = 0, big = -1;
  for (const auto& i : items) {
    switch (i.kind) {
      case K::kPersistent:
        persistent += i.bytes;
        break;
      case K::kGradients:
        grads += i.bytes;
        break;
      case K::kSaved:
        saved += i.bytes;
        break;
      case K::kLayerSaved:
        layer_saved += i.bytes;
        break;
      case K::kForwardTransient:
        fwd = std::max(fwd, i.bytes);
        break;
      case K::kBackwardTransient:
        bwd = std::max(bwd, i.bytes);
        break;
    }
    if (largest && i.bytes > big) big = i.bytes, *largest = i.name;
  }
  const double forward_end = persistent + saved + layer_saved + fwd;
  const double backward =
      persistent + grads + saved + layer_saved / double(std::max<int64_t>(layers, 1)) + bwd;
  return std::max(forward_end, backward);
}

namespace {

// What the CUDA caching allocator holds beyond the live tensors: blocks over
// 1 MiB are rounded up to 2 MiB multiples (~1 MiB per live large tensor:
// 5 per drafter parameter tensor for the compute copy, master, gradient and
// the two AdamW moments, plus ~64 for activations and buffers), and freed blocks of
// the working sets stay cached for reuse (planned as 10% of the largest
// transient). A model, not yet calibrated on a GPU (docs/GPU.md).
PlanItem cuda_allocator_item(const Config& c, const std::vector<PlanItem>& items, bool drafter) {
  double transient = 0;
  for (const auto& i : items)
    if (i.kind == PlanItem::kForwardTransient || i.kind == PlanItem::kBackwardTransient)
      transient = std::max(transient, i.bytes);
  const double tensors = (drafter ? 5.0 * double(drafter_specs(c).size()) : 0.0) + 64;
  const double mib = 1024.0 * 1024.0;
  return {"CUDA caching allocator (2 MiB rounding, cached free blocks)",
          tensors * mib + 0.1 * transient, PlanItem::kPersistent,
          fmt::format("1 MiB x {:.0f} live tensors + 10% of the largest transient", tensors)};
}

}  // namespace

std::string human_bytes(double bytes, bool sign) {
  const bool gb = std::abs(bytes) >= 1e8;
  const double v = gb ? bytes / 1e9 : bytes / 1e6;
  const char* unit = gb ? "GB" : "MB";
  if (sign) return gb ? fmt::format("{:+.2f} {}", v, unit) : fmt::format("{:+.1f} {}", v, unit);
  return gb ? fmt::format("{:.2f} {}", v, unit) : fmt::format("{:.1f} {}", v, unit);
}

double machine_memory_bytes() {
  return double(sysconf(_SC_PHYS_PAGES)) * double(sysconf(_SC_PAGE_SIZE));
}

Plan plan_memory(const Config& c, const PlanVariant& v, TargetAttention target_attention) {
  Plan p;
  p.variant = v;
  const auto& tp = c.topology;
  const int64_t Q = full_q(c);
  for (int64_t r = 0; r < tp.world_size; ++r) {
    RankPlan rp;
    rp.rank = r;
    // Training from features never loads the target (docs/TRAINING.md).
    const bool is_target = c.data.source != "features" &&
                           std::count(tp.target_ranks.begin(), tp.target_ranks.end(), r) > 0;
    const bool is_drafter = std::count(tp.drafter_ranks.begin(), tp.drafter_ranks.end(), r) > 0;
    rp.role = is_target && is_drafter ? "target+drafter" : is_target ? "target" : "drafter";
    if (is_target) rp.items = target_items(c, target_attention);
    if (is_drafter) {
      auto d = drafter_items(c, v, Q, true);
      rp.items.insert(rp.items.end(), d.begin(), d.end());
    }
    rp.capacity =
        tp.device_memory_gb.empty() ? machine_memory_bytes() : tp.device_memory_gb[size_t(r)] * 1e9;
    rp.reserve = tp.memory_reserve_gb * 1e9;
    rp.peak = peak_of(rp.items, c.drafter.num_hidden_layers, &rp.largest);
    if (v.cuda_allocator) {
      const PlanItem cached = cuda_allocator_item(c, rp.items, is_drafter);
      rp.items.push_back(cached);
      rp.peak += cached.bytes;
    }
    rp.headroom = rp.capacity - rp.reserve - rp.peak;
    rp.fits = rp.headroom >= 0;
    p.ranks.push_back(rp);
  }
  return p;
}

bool Plan::fits() const {
  for (const auto& r : ranks)
    if (!r.fits) return false;
  return true;
}

std::string Plan::format(bool breakdown) const {
  std::string s = fmt::format("plan: {} -> {} ({} kernels{})\n", variant.name,
                              fits() ? "fits" : "OOM", optimized::kernels_name(variant.kernels),
                              variant.cuda_allocator ? ", CUDA caching allocator" : "");
  // Consecutive ranks with the same role and items print once.
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i + 1;
    while (j < ranks.size() && ranks[j].role == ranks[i].role && ranks[j].peak == ranks[i].peak &&
           ranks[j].capacity == ranks[i].capacity)
      ++j;
    const RankPlan& r = ranks[i];
    const std::string who = j - i > 1 ? fmt::format("ranks {}-{}", r.rank, ranks[j - 1].rank)
                                      : fmt::format("rank {}", r.rank);
    s += fmt::format(
        "  {} ({}): peak {:.2f} {} of {:.1f} {} (reserve {:.1f}), headroom {:+.2f} {}: "
        "{}; largest: {}\n",
        who, r.role, r.peak / 1e9, kGB, r.capacity / 1e9, kGB, r.reserve / 1e9, r.headroom / 1e9,
        kGB, r.fits ? "fits" : "OOM", r.largest);
    if (breakdown)
      for (const auto& it : r.items)
        s += fmt::format(
            "      {:<66} {:>9.3f} {} {}\n", it.name, it.bytes / 1e9, kGB,
            it.kind == PlanItem::kForwardTransient || it.kind == PlanItem::kBackwardTransient
                ? "(transient)"
            : it.kind == PlanItem::kGradients  ? "(backward)"
            : it.kind == PlanItem::kPersistent ? ""
                                               : "(saved)");
    i = j;
  }
  return s;
}

std::vector<Figure> spec_figures(const Config& c) {
  const int64_t e = elem(c.run.dtype), Q = full_q(c) * c.data.batch_size, V = c.target.vocab_size;
  const int64_t C = c.loss.chunk_size > 0 ? c.loss.chunk_size : Q;
  const Formula dense = dense_scores_one_copy(
      c.data.batch_size, c.drafter.shape.num_attention_heads, full_q(c), c.data.seq_len);
  return {
      {"one loss chunk of logits", double(C) * double(V) * double(e),
       fmt::format("C V e = {} x {} x {}", C, V, e)},
      {"unchunked fp32 logits", 4.0 * double(Q) * double(V),
       fmt::format("4 Q V = 4 x {} x {}", Q, V)},
      {"dense attention scores (fp32, one copy)", dense.bytes, dense.text},
      {"every chunk's logits kept (no recompute)", double(Q) * double(V) * double(e),
       fmt::format("Q V e = {} x {} x {}", Q, V, e)},
  };
}

}  // namespace dflash::harness

// ---- One memory story: estimates by workload, in labelled parts ----------

namespace dflash::harness {
namespace {

// The part of the story a plan item belongs to, by the item's name (an
// empty label keeps the item's own name).
std::string part_of(const std::string& name) {
  static const std::pair<const char*, const char*> kParts[] = {
      {"target weights", "target weights"},
      {"target forward working set", "target forward working set"},
      {"tapped features", "target send queue"},
      {"drafter master weights", "drafter weights, grads, AdamW state"},
      {"drafter gradients", "drafter weights, grads, AdamW state"},
      {"AdamW moments", "drafter weights, grads, AdamW state"},
      {"compute copies", "drafter weights, grads, AdamW state"},
      {"frozen embedding", "frozen embedding and LM head"},
      {"target features", "received features, collective buffers"},
      {"collective buffers", "received features, collective buffers"},
      {"loss working set", ""},
      {"recompute of one layer", "layer recompute and attention working set"},
      {"attention backward", "attention working set"},
      {"CUDA caching allocator", "CUDA caching allocator"},
  };
  for (const auto& [prefix, label] : kParts)
    if (name.rfind(prefix, 0) == 0) return *label ? label : name;
  return "saved activations";
}

std::string variant_text(const PlanVariant& v) {
  const char* loss = v.loss == LossMode::kFused                ? "fused chunked loss"
                     : v.loss == LossMode::kChunkedNoRecompute ? "chunked loss without recompute"
                                                               : "full fp32 logits";
  return fmt::format("{}, {} attention, {}", loss, v.dense_attention ? "dense" : "sparse",
                     v.checkpoint ? "checkpointed" : "not checkpointed");
}

PlanVariant workload_variant(const Config& c, Workload w) {
  PlanVariant v = configured_variant(c);
  if (w == Workload::kReferenceStep)
    v.name = "reference", v.loss = LossMode::kUnchunked, v.dense_attention = true,
    v.checkpoint = false;
  return v;
}

}  // namespace

std::string workload_label(const Config& c, Workload w) {
  const std::string v = variant_text(workload_variant(c, w));
  switch (w) {
    case Workload::kPlannedRun:
      return fmt::format(
          "the training run (optimized step: {}; AdamW state; tiled target attention)", v);
    case Workload::kTrain:
      return fmt::format(
          "dflash train (optimized step: {}; AdamW state; query-chunked target attention)", v);
    case Workload::kStep:
      return fmt::format("one optimized step ({}; AdamW state; dense target attention)", v);
    case Workload::kReferenceStep:
      return fmt::format("one reference step ({}; AdamW state; dense target attention)", v);
    case Workload::kFeatures:
      return "the target forward alone (query-chunked target attention)";
  }
  return "";
}

Where configured_where(const Config& c) {
  const bool cpu = c.topology.device == "cpu";
  return {cpu ? "cpu" : "cuda", cpu ? "cpu" : c.topology.device};
}

Where where_it_runs(const Config& c) {
  if (c.topology.device == "cpu") return {"cpu", "cpu"};
  const std::string why = cuda_unavailable();
  if (why.empty()) return configured_where(c);
  return {"cpu", fmt::format("cpu (topology.device = \"{}\", but {})", c.topology.device, why)};
}

std::string Estimate::line() const {
  std::string s =
      fmt::format("{}, {} on {}: {:.2f} GB at {} =", workload, who, where, peak / 1e9, moment);
  for (size_t i = 0; i < parts.size(); ++i)
    s += fmt::format("{} {:.2f} GB {}", i ? " +" : "", parts[i].bytes / 1e9, parts[i].label);
  return s;
}

Estimate estimate_of(const RankPlan& r, int64_t layers, const std::string& workload,
                     const std::string& who, const std::string& where) {
  using K = PlanItem::Kind;
  double persistent = 0, grads = 0, saved = 0, layer_saved = 0;
  const PlanItem *fwd = nullptr, *bwd = nullptr;
  for (const PlanItem& i : r.items) {
    if (i.kind == K::kPersistent) persistent += i.bytes;
    if (i.kind == K::kGradients) grads += i.bytes;
    if (i.kind == K::kSaved) saved += i.bytes;
    if (i.kind == K::kLayerSaved) layer_saved += i.bytes;
    if (i.kind == K::kForwardTransient && (!fwd || i.bytes > fwd->bytes)) fwd = &i;
    if (i.kind == K::kBackwardTransient && (!bwd || i.bytes > bwd->bytes)) bwd = &i;
  }
  const double per_layer = 1.0 / double(std::max<int64_t>(layers, 1));
  const double forward_end = persistent + saved + layer_saved + (fwd ? fwd->bytes : 0);
  const double backward =
      persistent + grads + saved + layer_saved * per_layer + (bwd ? bwd->bytes : 0);
  const bool in_backward = backward >= forward_end;
  Estimate e{workload, who, where, in_backward ? "backward" : "forward end", 0, {}};
  for (const PlanItem& i : r.items) {
    double counted = i.bytes;
    if (i.kind == K::kGradients && !in_backward) counted = 0;
    if (i.kind == K::kLayerSaved && in_backward) counted *= per_layer;
    if (i.kind == K::kForwardTransient && (in_backward || &i != fwd)) counted = 0;
    if (i.kind == K::kBackwardTransient && (!in_backward || &i != bwd)) counted = 0;
    if (counted <= 0) continue;
    const std::string label = part_of(i.name);
    auto it = std::find_if(e.parts.begin(), e.parts.end(),
                           [&](const EstimatePart& p) { return p.label == label; });
    if (it == e.parts.end()) it = e.parts.insert(e.parts.end(), {label, 0});
    it->bytes += counted;
    e.peak += counted;
  }
  return e;
}

std::vector<Estimate> estimate_memory(const Config& c, Workload w, const Where& where) {
  Config local = c;
  if (where.device == "cpu") local.topology.device = "cpu", local.topology.device_memory_gb = {};
  const std::string label = workload_label(c, w);
  if (w == Workload::kFeatures) {
    RankPlan r;
    r.items = target_items(local, TargetAttention::kQueryChunked);
    return {estimate_of(r, 1, label, "one process (target)", where.label)};
  }
  const bool run = w == Workload::kPlannedRun || w == Workload::kTrain;
  if (!run) {
    TopologyConfig one;
    one.device = local.topology.device;
    one.memory_reserve_gb = c.topology.memory_reserve_gb;
    local.topology = one;
  }
  const TargetAttention a = w == Workload::kPlannedRun ? TargetAttention::kTiled
                            : w == Workload::kTrain    ? TargetAttention::kQueryChunked
                                                       : TargetAttention::kDense;
  const Plan p = plan_memory(local, workload_variant(local, w), a);
  std::vector<Estimate> out;
  for (const RankPlan& r : p.ranks) {
    const std::string who =
        run ? fmt::format("rank {} ({})", r.rank, r.role) : fmt::format("one process ({})", r.role);
    out.push_back(estimate_of(r, c.drafter.num_hidden_layers, label, who, where.label));
  }
  return out;
}

}  // namespace dflash::harness
