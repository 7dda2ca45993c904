// The memory planner: per-rank peak memory of a run, by component, from the
// formula library (harness/memory.h) that the calibration test holds to
// measurement. A rank's peak is the larger of two moments:
//   forward end  = persistent + saved activations + the loss working set;
//   backward     = persistent + gradients + what stays saved while the first
//                  layer's backward runs (checkpointed: the layer inputs plus
//                  that layer's recomputation; otherwise one layer's
//                  activations) + the attention's backward working set.
// OOM when the peak exceeds the rank's capacity minus memory_reserve_gb.
#pragma once

#include <string>
#include <vector>

#include "core/config.h"
#include "optimized/kernels.h"

namespace dflash::harness {

enum class LossMode { kFused, kChunkedNoRecompute, kUnchunked };

// Which implementation of each trick a plan assumes.
struct PlanVariant {
  std::string name;
  LossMode loss = LossMode::kFused;
  bool dense_attention = false;
  bool checkpoint = false;
  // The kernels the loss and attention working sets assume (the config's
  // choice on its device), and whether the rank's memory comes from the
  // CUDA caching allocator (rounding and cached blocks are then planned).
  optimized::Kernels kernels = optimized::Kernels::kHost;
  bool cuda_allocator = false;
};
PlanVariant configured_variant(const Config& c);  // from [optimized]
// The configured plan and the fallbacks SPEC.md warns about.
std::vector<PlanVariant> standard_variants(const Config& c);

struct PlanItem {
  // kPersistent: the whole step. kGradients: from backward on. kSaved: from
  // forward to the end of backward. kLayerSaved: per-layer activations,
  // released layer by layer in backward (one layer's share remains).
  // kForwardTransient / kBackwardTransient: working sets of one moment.
  enum Kind { kPersistent, kGradients, kSaved, kLayerSaved, kForwardTransient, kBackwardTransient };
  std::string name;
  double bytes;
  Kind kind;
  std::string formula;
};

struct RankPlan {
  int64_t rank = 0;
  std::string role;                  // "target", "drafter", or "target+drafter"
  double capacity = 0, reserve = 0;  // bytes
  std::vector<PlanItem> items;
  double peak = 0;
  std::string largest;  // the largest item
  double headroom = 0;  // capacity - reserve - peak (negative: OOM)
  bool fits = false;
};

struct Plan {
  PlanVariant variant;
  std::vector<RankPlan> ranks;
  bool fits() const;
  std::string format(bool breakdown) const;
};

// Items of one drafter step on one device (Q draft positions), the optimizer
// state included or not. Also used by the calibration test.
std::vector<PlanItem> drafter_items(const Config& c, const PlanVariant& v, int64_t Q,
                                    bool with_optimizer);
// How the target's causal attention is counted. A production target runs a
// tiled (flash-style) attention (kTiled: O(S) statistics). dflash's own
// target forward comes in two: optimized::target_forward, what `dflash
// train`, `features` and served decoding run, takes queries in chunks of
// optimized.target_query_chunk rows (kQueryChunked: (B, nh, chunk, S) fp32
// scores at a time; 0 rows = dense); reference::target_forward, what the
// fixture batches of `step`, `dump`, `audit` and preflight's real step run,
// is dense (kDense: (B, nh, S, S)).
enum class TargetAttention { kTiled, kQueryChunked, kDense };
std::vector<PlanItem> target_items(const Config& c,
                                   TargetAttention attention = TargetAttention::kTiled);
// layers: how many layers share the kLayerSaved items (one layer's share
// remains during the first layer's backward).
double peak_of(const std::vector<PlanItem>& items, int64_t layers = 1,
               std::string* largest = nullptr);

Plan plan_memory(const Config& c, const PlanVariant& v,
                 TargetAttention target_attention = TargetAttention::kTiled);

// The single-tensor figures of SPEC.md, at the config's sizes.
struct Figure {
  std::string name;
  double bytes;
  std::string formula;
};
std::vector<Figure> spec_figures(const Config& c);

// Physical memory of this machine (bytes).
double machine_memory_bytes();

// Bytes for a person: "1.23 GB" from 0.1 GB up, "45.6 MB" below; with
// `sign`, "+1.23 GB" / "-45.6 MB" (a headroom). What the memory guard and
// preflight print (the planner's tables and labelled lines keep GB columns).
std::string human_bytes(double bytes, bool sign = false);

// One memory story (issue 36): `dflash plan`, preflight and the memory guard
// all print their figures from estimate_memory, each labelled with the
// workload it counts and the device it is counted for.
enum class Workload {
  kPlannedRun,     // every rank of the run, a production (tiled-attention) target (plan)
  kTrain,          // every rank of `dflash train`: dflash's query-chunked target forward
  kStep,           // one target forward + one optimized drafter step, one process
  kReferenceStep,  // the same through the reference build (full logits, dense attention)
  kFeatures,       // the target forward alone (dflash features)
};
std::string workload_label(const Config& c, Workload w);

// The device a workload is counted for: "cpu" or "cuda", and its label.
struct Where {
  std::string device = "cpu";
  std::string label = "cpu";
};
// As configured (topology.device), not probed: the machine the config plans for.
Where configured_where(const Config& c);
// Where this process would run it: cpu when topology.device is cpu or when
// no CUDA device is usable here (the label then says so).
Where where_it_runs(const Config& c);

struct EstimatePart {
  std::string label;  // "target weights", "activations", ...
  double bytes = 0;
};
struct Estimate {
  std::string workload;  // workload_label
  std::string who;       // "rank 0 (target+drafter)" or "one process (target+drafter)"
  std::string where;     // Where::label
  std::string moment;    // the moment of the peak: "backward" or "forward end"
  double peak = 0;       // bytes; the parts sum to it
  std::vector<EstimatePart> parts;
  // "<workload>, <who> on <where>: 41.91 GB at backward = 16.38 GB target weights + ..."
  std::string line() const;
};
// One estimate per rank for the run workloads, one for the others.
std::vector<Estimate> estimate_memory(const Config& c, Workload w, const Where& where);
// The rank plan an estimate is made from, broken into labelled parts.
Estimate estimate_of(const RankPlan& r, int64_t layers, const std::string& workload,
                     const std::string& who, const std::string& where);

}  // namespace dflash::harness
